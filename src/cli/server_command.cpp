#include "src/cli/server_command.h"

#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <exception>
#include <memory>
#include <stdexcept>

#include "src/store/embedded_server.h"
#include "src/store/local_cluster.h"

namespace dsfs::cli {
namespace {

// `dsfs server start` options; 0 shards: the single embedded server.
struct StartOptions {
  int shards = 0;
  int replicas = 0;
};

std::string describe_shape(int shards, int replicas) {
  return fmt::format("{} shard{} with {} replica{} each", shards, shards == 1 ? "" : "s", replicas,
                     replicas == 1 ? "" : "s");
}

void print_status(const store::EmbeddedServerStatus& status) {
  fmt::print("running: {}\n", status.running ? "yes" : "no");
  if (status.running) fmt::print("pid: {}\n", status.pid);
  fmt::print("socket: {}\n", status.socket.string());
  fmt::print("url: unix://{}\n", status.socket.string());
  fmt::print("data: {}\n", status.data_dir.string());
  fmt::print("log: {}\n", status.log_file.string());
}

void print_cluster_status(const store::LocalClusterStatus& status) {
  size_t running = 0;
  for (const auto& node : status.nodes) running += node.running ? 1 : 0;
  fmt::print("local cluster: {}\n", describe_shape(status.shards, status.replicas));
  if (!status.complete) {
    fmt::print("created: no, its creation did not finish (the next start creates it anew)\n");
  }
  fmt::print("running: {} ({} of {} nodes)\n",
             running == status.nodes.size() ? "yes"
             : running == 0                 ? "no"
                                            : "partly",
             running, status.nodes.size());
  if (!status.state.empty()) fmt::print("state: {}\n", status.state);
  if (const std::string url = status.url(); !url.empty()) fmt::print("url: {}\n", url);
  fmt::print("dir: {}\n", status.dir.string());
  fmt::print("logs: {}\n", (status.dir / "node-PORT" / "redis.log").string());
  fmt::print("{:<8} {:<16} {:<8} {:<24} {:<7} {}\n", "ROLE", "ADDRESS", "BUS", "SLOTS", "RUNNING",
             "PID");
  for (const auto& node : status.nodes) {
    std::string slots = node.slots;
    if (node.role == "replica") {
      slots = node.primary_port > 0 ? fmt::format("of 127.0.0.1:{}", node.primary_port) : "of ?";
    }
    fmt::print("{:<8} {:<16} {:<8} {:<24} {:<7} {}\n", node.role,
               fmt::format("127.0.0.1:{}", node.port), node.bus_port, slots.empty() ? "-" : slots,
               node.running ? "yes" : "no", node.running ? std::to_string(node.pid) : "-");
  }
}

void start_cluster(const StartOptions& options) {
  store::LocalCluster cluster;
  const bool started = cluster.start(options.shards, options.replicas);
  const store::LocalClusterStatus status = cluster.status();
  if (started) {
    fmt::print("started the local Redis Cluster; pass --redis {} to dsfs\n", status.url());
  } else {
    fmt::print("the local Redis Cluster is already running; pass --redis {} to dsfs\n",
               status.url());
  }
  print_cluster_status(status);
}

void start_embedded() {
  // One kind at a time: the single server does not start beside a running cluster. A cluster
  // whose state file is damaged says so, but does not keep the single server from starting.
  store::LocalClusterStatus cluster;
  try {
    cluster = store::LocalCluster().status();
  } catch (const std::runtime_error& e) {
    fmt::print(stderr, "dsfs: warning: {}\n", e.what());
  }
  if (cluster.any_running()) {
    throw std::runtime_error(fmt::format(
        "a local Redis Cluster ({}) is running in {}, and dsfs runs the single embedded server "
        "only in its place: use the cluster (`dsfs server status` prints its --redis URL), or "
        "stop it with `dsfs server stop` first",
        describe_shape(cluster.shards, cluster.replicas), cluster.dir.string()));
  }
  if (cluster.exists && cluster.complete) {
    fmt::print(stderr,
               "dsfs: note: the local Redis Cluster in {} is stopped and stays so; `dsfs server "
               "start --shards {} --replicas {}` starts it again\n",
               cluster.dir.string(), cluster.shards, cluster.replicas);
  }
  store::EmbeddedServer embedded;
  const bool started = embedded.start();
  const auto status = embedded.status();
  if (started) {
    fmt::print("started the embedded redis-server (pid {})\n", status.pid);
  } else {
    fmt::print("the embedded redis-server is already running (pid {})\n", status.pid);
  }
  print_status(status);
}

}  // namespace

void register_server_command(CLI::App& app, GlobalOptions& global) {
  CLI::App* server = app.add_subcommand(
      "server",
      "Manage the redis-server that dsfs runs itself. By default that is the single embedded "
      "server, used when no --redis URL (or DSFS_REDIS) is given: it listens only on a unix "
      "socket in $DSFS_HOME/redis (default ~/.local/share/dsfs/redis; mode 700, so only you can "
      "connect), has no password, and keeps its data there (append-only file plus snapshots), "
      "so datasets survive stop and start. Other commands start it on demand. In its place, "
      "`start --shards N` runs a local Redis Cluster (see `dsfs server start --help`).");
  server->require_subcommand(1);

  const auto start_options = std::make_shared<StartOptions>();
  CLI::App* start = server->add_subcommand(
      "start",
      "Start the embedded redis-server and wait until it answers. Does nothing (exit 0) when it "
      "is already running. Needs Debian's redis-server package. With --shards N, start a local "
      "Redis Cluster instead: N primaries that split the 16384 slots evenly, each with R "
      "replicas (--replicas), every node a redis-server bound to 127.0.0.1 only, on free TCP "
      "ports, in $DSFS_HOME/cluster/node-PORT (redis.conf, redis.log, nodes.conf, data/). The "
      "first start creates it; later ones start the nodes that are not running, on the same "
      "ports with the same nodes.conf and data, so it comes back as it was (pass the same N and "
      "R). Both wait until every node says cluster_state:ok, and print the URL to pass to "
      "--redis. No password: loopback only, but any local user can connect to these ports. "
      "Only one of the two runs at a time: stop the other first.");
  start
      ->add_option("--shards", start_options->shards,
                   "Start a local Redis Cluster of N primaries in place of the single server "
                   "(N*(1+R) redis-server processes)")
      ->check(CLI::Range(1, store::LocalCluster::kMaxShards));
  start
      ->add_option("--replicas", start_options->replicas,
                   "Replicas of each primary in the local cluster (with --shards; default 0)")
      ->check(CLI::Range(0, store::LocalCluster::kMaxReplicas))
      ->needs("--shards");
  add_log_level_option(*start, global);
  start->callback([&global, start_options] {
    apply_log_level(global);
    if (start_options->shards > 0) {
      start_cluster(*start_options);
    } else {
      start_embedded();
    }
  });

  CLI::App* stop = server->add_subcommand(
      "stop",
      "Stop the embedded redis-server, and every node of the local cluster if one exists, after "
      "saving their data (SHUTDOWN SAVE). The data stays in $DSFS_HOME/redis/data and "
      "$DSFS_HOME/cluster for the next start. Exit 0 also when nothing was running. To remove "
      "the local cluster for good, stop it, then delete $DSFS_HOME/cluster.");
  add_log_level_option(*stop, global);
  stop->callback([&global] {
    apply_log_level(global);
    store::LocalCluster cluster;
    bool cluster_exists = false;
    std::exception_ptr cluster_error;  // thrown after the single server has stopped too
    try {
      cluster_exists = cluster.status().exists;
      if (cluster_exists) {
        if (cluster.stop()) {
          fmt::print("stopped the local Redis Cluster; data kept in {}\n", cluster.dir().string());
        } else {
          fmt::print("the local Redis Cluster is not running\n");
        }
      }
    } catch (const std::exception&) {
      cluster_exists = true;
      cluster_error = std::current_exception();
    }
    store::EmbeddedServer embedded;
    if (embedded.stop()) {
      fmt::print("stopped the embedded redis-server; data kept in {}\n",
                 embedded.status().data_dir.string());
    } else if (!cluster_exists) {
      fmt::print("the embedded redis-server is not running\n");
    }
    if (cluster_error) std::rethrow_exception(cluster_error);
  });

  CLI::App* status = server->add_subcommand(
      "status",
      "Show whether the embedded redis-server is running, its pid, socket, data directory and "
      "log; when a local cluster exists, its nodes instead (role, address, bus port, slots, "
      "running, pid) and the URL to pass to --redis. Exit status: 0 when running (every node "
      "of a cluster), 3 when not.");
  add_log_level_option(*status, global);
  status->callback([&global] {
    apply_log_level(global);
    const store::LocalClusterStatus cluster = store::LocalCluster().status();
    const store::EmbeddedServerStatus embedded = store::EmbeddedServer().status();
    if (!cluster.exists) {
      print_status(embedded);
      if (!embedded.running) throw ExitCode{3};
      return;
    }
    print_cluster_status(cluster);
    if (embedded.running) {
      fmt::print("\nthe single embedded redis-server runs too:\n");
      print_status(embedded);
    }
    if (!cluster.all_running() && !embedded.running) throw ExitCode{3};
  });
}

}  // namespace dsfs::cli
