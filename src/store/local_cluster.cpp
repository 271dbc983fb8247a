#include "src/store/local_cluster.h"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <netinet/in.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

#include "src/store/cluster_slots.h"
#include "src/store/connection.h"
#include "src/store/errors.h"
#include "src/store/redis_process.h"

namespace dsfs::store {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kNodeReadyTimeout = 10s;
// A large AOF takes a while to load; a live node that says LOADING gets this long instead.
constexpr auto kLoadingTimeout = 120s;
constexpr auto kClusterOkTimeout = 30s;
constexpr auto kStopTimeout = 30s;
// Creating a cluster (or waiting for one to become ok) takes longer than starting one server,
// and a second start waits for the first to finish.
constexpr auto kLockTimeout = 180s;
constexpr std::string_view kLockRemedy = "set DSFS_HOME to a writable directory";
constexpr auto kPollInterval = 50ms;
// How often a new node moves to other ports when another process took its own first.
constexpr int kPortAttempts = 5;
// Nodes listen below the kernel's ephemeral range (ip_local_port_range), so that the source
// port of some outgoing connection cannot hold a node's port while the cluster is stopped.
constexpr int kLowestPort = 20000;
// Node timeout: how long a silent node takes to be called failed (and to be forgiven after).
constexpr int kNodeTimeoutMs = 5000;
// What redis-server logs when it cannot bind its client or bus port.
constexpr std::string_view kBindFailure = "Could not create server TCP listening socket";

enum class Role { kPrimary, kReplica };

// A node as created. Failovers may swap roles later; status() asks the nodes.
struct NodeSpec {
  int port = 0;
  int bus_port = 0;
  Role role = Role::kPrimary;
  int shard = 0;  // the primary's index; a replica's primary at creation
};

// The state file: the shape and the ports, so that stop, status and a restart find every node.
struct ClusterState {
  bool complete = false;  // the creation finished
  int shards = 0;
  int replicas = 0;
  std::vector<NodeSpec> nodes;  // primaries by shard, then the replicas
};

struct NodeLayout {
  fs::path dir;
  fs::path config;
  fs::path pid_file;
  fs::path log_file;
  fs::path nodes_conf;
  fs::path data_dir;
};

NodeLayout node_layout(const fs::path& cluster_dir, int port) {
  const fs::path dir = cluster_dir / fmt::format("node-{}", port);
  return NodeLayout{.dir = dir,
                    .config = dir / "redis.conf",
                    .pid_file = dir / "redis.pid",
                    .log_file = dir / "redis.log",
                    .nodes_conf = dir / "nodes.conf",
                    .data_dir = dir / "data"};
}

fs::path state_file_of(const fs::path& cluster_dir) {
  return cluster_dir / "cluster.state";
}

std::string plural(int count, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", count, count == 1 ? one : many);
}

std::string describe_shape(int shards, int replicas) {
  return fmt::format("{} with {} each", plural(shards, "shard", "shards"),
                     plural(replicas, "replica", "replicas"));
}

// A socket descriptor, closed on destruction.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&&) = delete;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Binds 127.0.0.1:port (0: one the kernel picks) as redis-server will (SO_REUSEADDR); returns
// the bound socket and its port, or nullopt when the port is in use.
std::optional<std::pair<UniqueFd, int>> bind_loopback(int port) {
  UniqueFd socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (socket.get() < 0) return std::nullopt;
  const int yes = 1;
  ::setsockopt(socket.get(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof address;
  if (::bind(socket.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(socket.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return std::nullopt;
  }
  return std::pair{std::move(socket), static_cast<int>(ntohs(address.sin_port))};
}

int ephemeral_port_floor() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 32768;
  range >> low;
  return low;
}

// `count` distinct loopback ports nothing is bound to right now, from a random place below the
// ephemeral range (or, when that range leaves too little room, ports the kernel picks). Another
// process may still take one before a node binds it: the caller retries with others.
std::vector<int> pick_free_ports(size_t count) {
  std::vector<UniqueFd> held;  // kept bound until all are chosen, so they differ
  std::vector<int> ports;
  const int span = ephemeral_port_floor() - kLowestPort;
  if (span >= static_cast<int>(64 * count)) {
    std::random_device seed;
    const int offset = std::uniform_int_distribution<int>(0, span - 1)(seed);
    for (int step = 0; step < span && ports.size() < count; ++step) {
      if (auto bound = bind_loopback(kLowestPort + (offset + step) % span)) {
        held.push_back(std::move(bound->first));
        ports.push_back(bound->second);
      }
    }
  }
  while (ports.size() < count) {
    auto bound = bind_loopback(0);
    if (!bound) throw std::runtime_error("cannot find a free loopback TCP port");
    held.push_back(std::move(bound->first));
    ports.push_back(bound->second);
  }
  return ports;
}

std::streamoff file_size_or_zero(const fs::path& path) {
  std::error_code error;
  const auto size = fs::file_size(path, error);
  return error ? 0 : static_cast<std::streamoff>(size);
}

// Polls `done` until it is true or the deadline passes; false on timeout.
bool wait_until(Clock::time_point deadline, const std::function<bool()>& done) {
  for (;;) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
}

RedisEndpoint node_endpoint(int port) {
  RedisEndpoint endpoint;
  endpoint.transport = RedisEndpoint::Transport::kTcp;
  endpoint.host = "127.0.0.1";
  endpoint.port = port;
  return endpoint;
}

Connection connect_node(int port, std::chrono::milliseconds io_timeout = 5000ms) {
  return Connection(node_endpoint(port),
                    ConnectOptions{.connect_timeout = 500ms, .io_timeout = io_timeout});
}

// Runs a command and throws ReplyError (naming `context`) on an error reply.
Reply command_ok(Connection& conn, std::initializer_list<std::string_view> argv,
                 std::string_view context) {
  Reply reply = conn.command(argv);
  reply.expect_ok(context);
  return reply;
}

// The value of `name` in INFO or CLUSTER INFO text ("name:value\r\n" lines); empty if absent.
std::string_view info_field(std::string_view text, std::string_view name) {
  for (size_t at = 0; at < text.size();) {
    const size_t end = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, end - at);
    if (line.ends_with('\r')) line.remove_suffix(1);
    if (line.size() > name.size() && line.starts_with(name) && line[name.size()] == ':') {
      return line.substr(name.size() + 1);
    }
    at = end + 1;
  }
  return {};
}

enum class NodeHealth { kOurs, kLoading, kForeign, kUnreachable };

// Whether our node answers on its port: a redis-server there runs with this node's config file
// (any other process on the port is kForeign). Fills *pid when it is ours.
NodeHealth probe_node(int port, const NodeLayout& layout, int* pid = nullptr) {
  try {
    Connection conn = connect_node(port, 1000ms);
    const Reply info = conn.command({"INFO", "server"});
    if (info.is_error()) return NodeHealth::kForeign;
    if (info_field(info.str(), "config_file") != layout.config.string()) {
      return NodeHealth::kForeign;
    }
    if (pid) {
      const std::string_view digits = info_field(info.str(), "process_id");
      std::from_chars(digits.data(), digits.data() + digits.size(), *pid);
    }
    return NodeHealth::kOurs;
  } catch (const ConnectionError& e) {
    return std::string_view(e.what()).find("LOADING") != std::string_view::npos
               ? NodeHealth::kLoading
               : NodeHealth::kUnreachable;
  } catch (const ReplyError&) {
    return NodeHealth::kForeign;  // e.g. a server that wants a password: not one of ours
  }
}

// The pid of the node's live redis-server; 0 when it is not running.
int running_pid(const NodeSpec& spec, const NodeLayout& layout) {
  const int pid = redis_process::read_pid_file(layout.pid_file);
  if (redis_process::is_live(pid)) return pid;
  // The pid file may be gone while the node still answers on its port.
  int answered_pid = 0;
  if (probe_node(spec.port, layout, &answered_pid) == NodeHealth::kOurs) {
    return answered_pid > 0 ? answered_pid : -1;
  }
  return 0;
}

std::optional<ClusterState> read_state(const fs::path& cluster_dir) {
  const fs::path path = state_file_of(cluster_dir);
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const auto malformed = [&](std::string_view what) {
    return std::runtime_error(fmt::format(
        "the local cluster's state file {} is damaged ({}): stop its nodes by hand if any run "
        "(their pids are in {}/node-*/redis.pid), then delete {}",
        path.string(), what, cluster_dir.string(), cluster_dir.string()));
  };
  ClusterState state;
  bool have_complete = false;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line.starts_with('#')) continue;
    std::istringstream fields(line);
    std::string key;
    fields >> key;
    if (key == "complete") {
      std::string value;
      fields >> value;
      if (value != "yes" && value != "no") throw malformed("complete is neither yes nor no");
      state.complete = value == "yes";
      have_complete = true;
    } else if (key == "shards") {
      fields >> state.shards;
    } else if (key == "replicas") {
      fields >> state.replicas;
    } else if (key == "node") {
      NodeSpec spec;
      std::string role;
      fields >> spec.port >> spec.bus_port >> role >> spec.shard;
      if (!fields || (role != "primary" && role != "replica")) throw malformed(line);
      spec.role = role == "primary" ? Role::kPrimary : Role::kReplica;
      state.nodes.push_back(spec);
    } else {
      throw malformed(fmt::format("unknown line '{}'", line));
    }
    if (!fields) throw malformed(line);
  }
  const size_t expected_nodes = static_cast<size_t>(state.shards) * (1 + state.replicas);
  if (!have_complete || state.shards < 1 || state.replicas < 0 ||
      state.nodes.size() != expected_nodes) {
    throw malformed("missing or inconsistent fields");
  }
  return state;
}

void write_state(const fs::path& cluster_dir, const ClusterState& state) {
  std::string text = fmt::format(
      "# Written by `dsfs server start --shards`; read by `dsfs server start|stop|status`.\n"
      "# Do not edit. To remove the cluster: `dsfs server stop`, then delete this directory.\n"
      "complete {}\nshards {}\nreplicas {}\n",
      state.complete ? "yes" : "no", state.shards, state.replicas);
  for (const NodeSpec& node : state.nodes) {
    text += fmt::format("node {} {} {} {}\n", node.port, node.bus_port,
                        node.role == Role::kPrimary ? "primary" : "replica", node.shard);
  }
  redis_process::write_file_atomically(state_file_of(cluster_dir), text);
}

void write_node_config(const NodeLayout& layout, const NodeSpec& spec) {
  const std::string config = fmt::format(
      "# Generated by dsfs on every `dsfs server start --shards`; edits here are overwritten.\n"
      "# Loopback TCP only, no password: any local user can connect.\n"
      "bind 127.0.0.1\n"
      "port {}\n"
      "# Named, not left at the default (port + 10000), which ports above 55535 do not have.\n"
      "cluster-port {}\n"
      "cluster-enabled yes\n"
      "cluster-config-file {}\n"
      "cluster-node-timeout {}\n"
      "dir {}\n"
      "# Append-only file plus RDB snapshots: data survives stop/start and crashes.\n"
      "appendonly yes\n"
      "appendfsync everysec\n"
      "save 3600 1 300 100 60 10000\n"
      "# While a shard has no primary (between a primary's failure and its replica's promotion)\n"
      "# the other shards go on serving, and a node the cluster deems down still serves reads:\n"
      "# dsfs's objects never change once published, so a read from any copy is right.\n"
      "cluster-require-full-coverage no\n"
      "cluster-allow-reads-when-down yes\n"
      "# A replica syncs at once instead of waiting 5 s for others to share the transfer.\n"
      "repl-diskless-sync-delay 0\n"
      "daemonize yes\n"
      "pidfile {}\n"
      "logfile {}\n"
      "loglevel notice\n"
      "# Dataset objects are large: allow big bulk strings and pipelines.\n"
      "proto-max-bulk-len 512mb\n"
      "client-query-buffer-limit 1gb\n",
      spec.port, spec.bus_port, redis_process::quote_config_value(layout.nodes_conf.string()),
      kNodeTimeoutMs, redis_process::quote_config_value(layout.data_dir.string()),
      redis_process::quote_config_value(layout.pid_file.string()),
      redis_process::quote_config_value(layout.log_file.string()));
  redis_process::write_file_atomically(layout.config, config);
}

enum class Launch { kReady, kPortTaken };

// Waits until the node just spawned answers as itself. kPortTaken when its log (from
// log_offset, where this start's lines begin) says a port was in use; throws naming the log
// when it neither answers nor fails in time.
Launch wait_for_node(const NodeSpec& spec, const NodeLayout& layout, std::streamoff log_offset) {
  const auto start_time = Clock::now();
  for (;;) {
    // The log first: probing a port that another process holds may wait for a reply that
    // never comes.
    if (redis_process::read_file(layout.log_file, log_offset).find(kBindFailure) !=
        std::string::npos) {
      return Launch::kPortTaken;
    }
    const NodeHealth health = probe_node(spec.port, layout);
    if (health == NodeHealth::kOurs) return Launch::kReady;
    const auto waited = Clock::now() - start_time;
    const bool alive = redis_process::is_live(redis_process::read_pid_file(layout.pid_file));
    const bool give_up = health == NodeHealth::kLoading && alive ? waited > kLoadingTimeout
                                                                 : waited > kNodeReadyTimeout;
    if (give_up) {
      throw std::runtime_error(fmt::format(
          "the redis-server of cluster node 127.0.0.1:{} did not answer within {} s; the end of "
          "{}:{}",
          spec.port, std::chrono::duration_cast<std::chrono::seconds>(waited).count(),
          layout.log_file.string(), redis_process::last_lines(layout.log_file, 15)));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

// Starts a node that has no cluster state yet; when another process holds one of its ports,
// moves it to other ports (recorded in the state file before its directory is made).
void launch_new_node(const fs::path& binary, const fs::path& cluster_dir, ClusterState& state,
                     size_t index) {
  for (int attempt = 1;; ++attempt) {
    const NodeSpec& spec = state.nodes[index];
    const NodeLayout layout = node_layout(cluster_dir, spec.port);
    fs::create_directories(layout.data_dir);
    write_node_config(layout, spec);
    const std::streamoff log_offset = file_size_or_zero(layout.log_file);
    redis_process::spawn_daemon(binary, layout.config, layout.log_file);
    if (wait_for_node(spec, layout, log_offset) == Launch::kReady) return;
    if (attempt == kPortAttempts) {
      throw std::runtime_error(fmt::format(
          "cannot find free ports for a cluster node after {} tries; the end of {}:{}",
          kPortAttempts, layout.log_file.string(), redis_process::last_lines(layout.log_file, 15)));
    }
    spdlog::debug("port {} or {} was taken; moving the node to others", spec.port, spec.bus_port);
    fs::remove_all(layout.dir);
    const std::vector<int> ports = pick_free_ports(2);
    state.nodes[index].port = ports[0];
    state.nodes[index].bus_port = ports[1];
    write_state(cluster_dir, state);
  }
}

// One line of CLUSTER NODES (or nodes.conf): "<id> <ip:port@cport[,host]> <flags> <primary id
// or -> <ping> <pong> <epoch> <link> <slot>...".
struct NodeLine {
  std::string id;
  int port = 0;
  bool myself = false;
  std::optional<Role> role;
  std::vector<std::string> flags;
  std::string primary_id;
  std::string slots;  // slot ranges joined by ','; migrations ("[...]") left out
};

std::vector<NodeLine> parse_cluster_nodes(std::string_view text) {
  std::vector<NodeLine> lines;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::vector<std::string> words;
    for (std::string word; fields >> word;) words.push_back(std::move(word));
    if (words.size() < 8) continue;  // e.g. nodes.conf's "vars currentEpoch ..." line
    NodeLine node;
    node.id = words[0];
    const std::string& address = words[1];
    const size_t at = address.find('@');
    const size_t colon = address.rfind(':', at);
    if (colon != std::string::npos) {
      const char* first = address.data() + colon + 1;
      std::from_chars(first, address.data() + std::min(at, address.size()), node.port);
    }
    std::istringstream flags(words[2]);
    for (std::string flag; std::getline(flags, flag, ',');) node.flags.push_back(flag);
    const auto has_flag = [&](std::string_view name) {
      return std::find(node.flags.begin(), node.flags.end(), name) != node.flags.end();
    };
    node.myself = has_flag("myself");
    if (has_flag("master")) node.role = Role::kPrimary;
    if (has_flag("slave")) node.role = Role::kReplica;
    if (words[3] != "-") node.primary_id = words[3];
    for (size_t i = 8; i < words.size(); ++i) {
      if (words[i].starts_with('[')) continue;
      if (!node.slots.empty()) node.slots += ',';
      node.slots += words[i];
    }
    lines.push_back(std::move(node));
  }
  return lines;
}

// Empty when the node answers, says cluster_state:ok and knows every node; else what is not so
// yet. With `formed`, also that it sees the created shape and, for a replica, that it has
// synced with its primary.
std::string node_not_ready(const ClusterState& state, const NodeSpec& spec, bool formed) {
  try {
    Connection conn = connect_node(spec.port);
    const Reply info = command_ok(conn, {"CLUSTER", "INFO"}, "CLUSTER INFO");
    if (const auto cluster_state = info_field(info.str(), "cluster_state"); cluster_state != "ok") {
      return fmt::format("cluster_state:{}", cluster_state);
    }
    if (info_field(info.str(), "cluster_known_nodes") != std::to_string(state.nodes.size())) {
      return fmt::format("knows {} of {} nodes", info_field(info.str(), "cluster_known_nodes"),
                         state.nodes.size());
    }
    if (!formed) return {};
    const Reply nodes = command_ok(conn, {"CLUSTER", "NODES"}, "CLUSTER NODES");
    int primaries = 0;
    int replicas = 0;
    for (const NodeLine& line : parse_cluster_nodes(nodes.str())) {
      if (line.role == Role::kPrimary && !line.slots.empty()) ++primaries;
      if (line.role == Role::kReplica) ++replicas;
    }
    if (primaries != state.shards || replicas != state.shards * state.replicas) {
      return fmt::format("sees {} primaries and {} replicas", primaries, replicas);
    }
    if (spec.role == Role::kReplica) {
      const Reply replication = command_ok(conn, {"INFO", "replication"}, "INFO");
      if (const auto link = info_field(replication.str(), "master_link_status"); link != "up") {
        return fmt::format("replication link {}", link.empty() ? "absent" : link);
      }
    }
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

// Waits (kClusterOkTimeout) until node_not_ready() is empty on every node; else throws naming
// what each node lacks and the log of the first such node.
void wait_for_cluster_ok(const fs::path& cluster_dir, const ClusterState& state, bool formed) {
  std::vector<std::string> reasons(state.nodes.size());
  const bool ok = wait_until(Clock::now() + kClusterOkTimeout, [&] {
    bool all = true;
    for (size_t i = 0; i < state.nodes.size(); ++i) {
      reasons[i] = node_not_ready(state, state.nodes[i], formed);
      all = all && reasons[i].empty();
    }
    return all;
  });
  if (ok) return;
  std::string what;
  fs::path first_log;
  for (size_t i = 0; i < state.nodes.size(); ++i) {
    if (reasons[i].empty()) continue;
    what += fmt::format("{}127.0.0.1:{}: {}", what.empty() ? "" : "; ", state.nodes[i].port,
                        reasons[i]);
    if (first_log.empty()) first_log = node_layout(cluster_dir, state.nodes[i].port).log_file;
  }
  throw std::runtime_error(fmt::format(
      "the local Redis Cluster in {} did not become ok within {} s ({}); the end of {}:{}",
      cluster_dir.string(), kClusterOkTimeout.count(), what, first_log.string(),
      redis_process::last_lines(first_log, 15)));
}

// Joins freshly started nodes into one cluster: primaries take even slot ranges, everyone meets
// the first node, replicas follow their primaries.
void form_cluster(const fs::path& cluster_dir, const ClusterState& state) {
  std::vector<Connection> conns;
  for (const NodeSpec& node : state.nodes) conns.push_back(connect_node(node.port));
  std::vector<std::string> ids;
  for (Connection& conn : conns) {
    ids.emplace_back(conn.command({"CLUSTER", "MYID"}).expect_ok("CLUSTER MYID").str());
  }
  for (int shard = 0; shard < state.shards; ++shard) {
    Connection& conn = conns[shard];
    // Distinct config epochs, as redis-cli gives them, so the primaries need not settle
    // collisions among themselves first.
    conn.command({"CLUSTER", "SET-CONFIG-EPOCH", std::to_string(shard + 1)})
        .expect_ok("CLUSTER SET-CONFIG-EPOCH");
    const uint64_t first = uint64_t{kClusterSlots} * shard / state.shards;
    const uint64_t last = uint64_t{kClusterSlots} * (shard + 1) / state.shards - 1;
    conn.command({"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)})
        .expect_ok("CLUSTER ADDSLOTSRANGE");
  }
  const NodeSpec& seed = state.nodes[0];
  for (size_t i = 1; i < conns.size(); ++i) {
    conns[i]
        .command({"CLUSTER", "MEET", "127.0.0.1", std::to_string(seed.port),
                  std::to_string(seed.bus_port)})
        .expect_ok("CLUSTER MEET");
  }
  // A replica can follow only a primary it knows: wait until gossip has told every node of
  // every other one.
  const auto deadline = Clock::now() + kClusterOkTimeout;
  const bool met = wait_until(deadline, [&] {
    for (Connection& conn : conns) {
      const Reply nodes = command_ok(conn, {"CLUSTER", "NODES"}, "CLUSTER NODES");
      const std::vector<NodeLine> lines = parse_cluster_nodes(nodes.str());
      if (lines.size() != state.nodes.size()) return false;
      for (const NodeLine& line : lines) {
        for (const std::string& flag : line.flags) {
          if (flag == "handshake" || flag == "noaddr") return false;
        }
      }
    }
    return true;
  });
  if (!met) {
    throw std::runtime_error(fmt::format(
        "the nodes of the new cluster in {} did not all meet within {} s; see the redis.log of "
        "each node in {}",
        cluster_dir.string(), kClusterOkTimeout.count(), cluster_dir.string()));
  }
  for (size_t i = 0; i < state.nodes.size(); ++i) {
    if (state.nodes[i].role != Role::kReplica) continue;
    conns[i]
        .command({"CLUSTER", "REPLICATE", ids[static_cast<size_t>(state.nodes[i].shard)]})
        .expect_ok("CLUSTER REPLICATE");
  }
  spdlog::debug("the nodes have met; waiting for the cluster to be ok");
  wait_for_cluster_ok(cluster_dir, state, /*formed=*/true);
}

// Stops the nodes of `state` at once (SIGTERM) and removes their directories and the state
// file: undoes a creation that did not finish. Never throws; what it cannot undo it logs.
void discard_nodes(const fs::path& cluster_dir, const ClusterState& state) noexcept {
  for (const NodeSpec& spec : state.nodes) {
    try {
      const NodeLayout layout = node_layout(cluster_dir, spec.port);
      if (const int pid = running_pid(spec, layout); pid > 0) {
        ::kill(pid, SIGTERM);
        if (!redis_process::wait_for_exit(pid, kStopTimeout)) {
          spdlog::warn("cluster node 127.0.0.1:{} (pid {}) did not exit", spec.port, pid);
          continue;  // its directory stays, with its log
        }
      }
      fs::remove_all(layout.dir);
    } catch (const std::exception& e) {
      spdlog::warn("cannot remove cluster node 127.0.0.1:{}: {}", spec.port, e.what());
    }
  }
  std::error_code ignored;
  fs::remove(state_file_of(cluster_dir), ignored);
}

// Undoes a creation that throws part way: a half-made cluster would otherwise be "restarted".
class CreationGuard {
 public:
  CreationGuard(const fs::path& cluster_dir, const ClusterState& state)
      : cluster_dir_(cluster_dir), state_(state) {}
  CreationGuard(const CreationGuard&) = delete;
  CreationGuard& operator=(const CreationGuard&) = delete;
  ~CreationGuard() {
    if (!dismissed_) discard_nodes(cluster_dir_, state_);
  }
  void dismiss() { dismissed_ = true; }

 private:
  const fs::path& cluster_dir_;
  const ClusterState& state_;
  bool dismissed_ = false;
};

void create_cluster(const fs::path& cluster_dir, int shards, int replicas) {
  const fs::path binary = redis_process::find_binary();
  ClusterState state{.complete = false, .shards = shards, .replicas = replicas, .nodes = {}};
  const size_t count = static_cast<size_t>(shards) * (1 + replicas);
  const std::vector<int> ports = pick_free_ports(2 * count);
  for (size_t i = 0; i < count; ++i) {
    const bool primary = i < static_cast<size_t>(shards);
    const int shard = primary ? static_cast<int>(i) : static_cast<int>(i - shards) / replicas;
    state.nodes.push_back(NodeSpec{.port = ports[2 * i],
                                   .bus_port = ports[2 * i + 1],
                                   .role = primary ? Role::kPrimary : Role::kReplica,
                                   .shard = shard});
  }
  CreationGuard guard(cluster_dir, state);
  write_state(cluster_dir, state);  // first, so that whatever is started can be found again
  for (size_t i = 0; i < count; ++i) launch_new_node(binary, cluster_dir, state, i);
  spdlog::debug("{} nodes answer; forming the cluster", count);
  form_cluster(cluster_dir, state);
  state.complete = true;
  write_state(cluster_dir, state);
  guard.dismiss();
}

// Starts every node that is not running, from its nodes.conf, and waits for the cluster.
bool restart_cluster(const fs::path& cluster_dir, const ClusterState& state) {
  std::optional<fs::path> binary;
  std::vector<std::pair<size_t, std::streamoff>> launched;  // node index, log offset
  for (size_t i = 0; i < state.nodes.size(); ++i) {
    const NodeSpec& spec = state.nodes[i];
    const NodeLayout layout = node_layout(cluster_dir, spec.port);
    if (running_pid(spec, layout) != 0) continue;
    if (!fs::exists(layout.nodes_conf)) {
      throw std::runtime_error(fmt::format(
          "cluster node 127.0.0.1:{} has lost its {}, so it would start as a stranger to the "
          "cluster: remove the cluster (`dsfs server stop`, then delete {}) and start anew",
          spec.port, layout.nodes_conf.string(), cluster_dir.string()));
    }
    if (!binary) binary = redis_process::find_binary();
    write_node_config(layout, spec);
    const std::streamoff log_offset = file_size_or_zero(layout.log_file);
    std::error_code ignored;
    fs::remove(layout.pid_file, ignored);
    spdlog::debug("starting {} {}", binary->string(), layout.config.string());
    redis_process::spawn_daemon(*binary, layout.config, layout.log_file);
    launched.emplace_back(i, log_offset);
  }
  for (const auto& [index, log_offset] : launched) {
    const NodeSpec& spec = state.nodes[index];
    const NodeLayout layout = node_layout(cluster_dir, spec.port);
    if (wait_for_node(spec, layout, log_offset) == Launch::kPortTaken) {
      throw std::runtime_error(fmt::format(
          "cluster node 127.0.0.1:{} (bus port {}) cannot start: another process holds one of "
          "its ports, and a node keeps its ports for life. Stop that process, or remove the "
          "cluster (`dsfs server stop`, then delete {}); the end of {}:{}",
          spec.port, spec.bus_port, cluster_dir.string(), layout.log_file.string(),
          redis_process::last_lines(layout.log_file, 15)));
    }
  }
  wait_for_cluster_ok(cluster_dir, state, /*formed=*/false);
  return !launched.empty();
}

// SHUTDOWN SAVE, or SIGTERM (which also saves) when the node does not answer.
void request_shutdown(const LocalClusterNodeStatus& node) {
  std::optional<Connection> conn;
  try {
    conn.emplace(connect_node(node.port, 60000ms));
  } catch (const std::exception& e) {
    spdlog::debug("cannot talk to cluster node 127.0.0.1:{} ({}); sending SIGTERM", node.port,
                  e.what());
  }
  if (!conn) {
    if (node.pid > 0) ::kill(node.pid, SIGTERM);
    return;
  }
  // A replica just started may still write its first AOF, and refuses to stop until that is
  // done ("Errors trying to SHUTDOWN"; a stop right after a start failed so, half the cluster
  // left running): asked again until it stops or kStopTimeout has passed.
  const auto deadline = Clock::now() + kStopTimeout;
  for (;;) {
    try {
      // On success the node closes the connection instead of replying.
      const Reply reply = conn->command({"SHUTDOWN", "SAVE"});
      if (!reply.is_error()) return;
      if (Clock::now() >= deadline) {
        throw std::runtime_error(
            fmt::format("cluster node 127.0.0.1:{} refused to shut down: {} (see {})", node.port,
                        reply.str(), node.log_file.string()));
      }
      std::this_thread::sleep_for(250ms);
    } catch (const ConnectionError&) {
      return;  // the expected end of a successful SHUTDOWN (or a node that hangs: waited out)
    }
  }
}

void wait_for_node_exit(const fs::path& cluster_dir, const LocalClusterNodeStatus& node) {
  const NodeLayout layout = node_layout(cluster_dir, node.port);
  const bool exited = node.pid > 0
                          ? redis_process::wait_for_exit(node.pid, kStopTimeout)
                          : wait_until(Clock::now() + kStopTimeout, [&] {
                              return probe_node(node.port, layout) == NodeHealth::kUnreachable;
                            });
  if (!exited) {
    throw std::runtime_error(
        fmt::format("cluster node 127.0.0.1:{} (pid {}) did not exit within {} s; see {}",
                    node.port, node.pid, kStopTimeout.count(), node.log_file.string()));
  }
}

}  // namespace

bool LocalClusterStatus::all_running() const {
  return !nodes.empty() &&
         std::all_of(nodes.begin(), nodes.end(), [](const auto& node) { return node.running; });
}

bool LocalClusterStatus::any_running() const {
  return std::any_of(nodes.begin(), nodes.end(), [](const auto& node) { return node.running; });
}

std::string LocalClusterStatus::url() const {
  for (const LocalClusterNodeStatus& node : nodes) {
    if (node.role == "primary") return fmt::format("redis://127.0.0.1:{}", node.port);
  }
  return {};
}

LocalCluster::LocalCluster(std::filesystem::path home) : home_(std::move(home)) {
  if (home_.empty()) throw std::invalid_argument("the dsfs home directory must not be empty");
  home_ = fs::absolute(home_);
}

std::filesystem::path LocalCluster::dir() const {
  return home_ / "cluster";
}

LocalClusterStatus LocalCluster::status() const {
  const fs::path cluster_dir = dir();
  LocalClusterStatus status;
  status.dir = cluster_dir;
  const std::optional<ClusterState> state = read_state(cluster_dir);
  if (!state) return status;
  status.exists = true;
  status.complete = state->complete;
  status.shards = state->shards;
  status.replicas = state->replicas;

  // One running node's view of the whole cluster is the freshest; a stopped node's nodes.conf
  // says what it knew when it stopped.
  std::optional<std::vector<NodeLine>> live_view;
  for (const NodeSpec& spec : state->nodes) {
    const NodeLayout layout = node_layout(cluster_dir, spec.port);
    LocalClusterNodeStatus node{.port = spec.port,
                                .bus_port = spec.bus_port,
                                .role = "unknown",
                                .id = {},
                                .primary_port = 0,
                                .slots = {},
                                .running = false,
                                .pid = 0,
                                .dir = layout.dir,
                                .log_file = layout.log_file};
    const int pid = running_pid(spec, layout);
    node.running = pid != 0;
    node.pid = std::max(pid, 0);
    if (node.running && !live_view) {
      try {
        Connection conn = connect_node(spec.port, 2000ms);
        const Reply nodes = command_ok(conn, {"CLUSTER", "NODES"}, "CLUSTER NODES");
        live_view = parse_cluster_nodes(nodes.str());
        const Reply info = command_ok(conn, {"CLUSTER", "INFO"}, "CLUSTER INFO");
        status.state = info_field(info.str(), "cluster_state");
      } catch (const std::exception& e) {
        spdlog::debug("cluster node 127.0.0.1:{} did not say how the cluster is: {}", spec.port,
                      e.what());
      }
    }
    status.nodes.push_back(std::move(node));
  }

  std::map<std::string, int> port_of_id;
  std::vector<std::string> primary_ids(status.nodes.size());
  for (size_t i = 0; i < status.nodes.size(); ++i) {
    LocalClusterNodeStatus& node = status.nodes[i];
    std::optional<NodeLine> line;
    if (live_view) {
      for (const NodeLine& candidate : *live_view) {
        if (candidate.port == node.port) line = candidate;
      }
    }
    if (!line) {
      for (const NodeLine& candidate :
           parse_cluster_nodes(redis_process::read_file(node.dir / "nodes.conf"))) {
        if (candidate.myself) line = candidate;
      }
    }
    if (!line) continue;
    node.id = line->id;
    if (line->role) node.role = *line->role == Role::kPrimary ? "primary" : "replica";
    node.slots = line->slots;
    port_of_id[node.id] = node.port;
    primary_ids[i] = line->primary_id;
  }
  for (size_t i = 0; i < status.nodes.size(); ++i) {
    if (const auto found = port_of_id.find(primary_ids[i]); found != port_of_id.end()) {
      status.nodes[i].primary_port = found->second;
    }
  }
  return status;
}

bool LocalCluster::start(int shards, int replicas) {
  if (shards < 1 || shards > kMaxShards) {
    throw std::invalid_argument(
        fmt::format("--shards must be between 1 and {}, not {}", kMaxShards, shards));
  }
  if (replicas < 0 || replicas > kMaxReplicas) {
    throw std::invalid_argument(
        fmt::format("--replicas must be between 0 and {}, not {}", kMaxReplicas, replicas));
  }
  const fs::path cluster_dir = dir();
  std::error_code error;
  fs::create_directories(cluster_dir, error);
  if (error) {
    throw std::runtime_error(
        fmt::format("cannot create {}: {} (set DSFS_HOME to a writable directory)",
                    cluster_dir.string(), error.message()));
  }
  fs::permissions(cluster_dir, fs::perms::owner_all, fs::perm_options::replace, error);

  const redis_process::StartLock lock(cluster_dir / "start.lock", kLockTimeout, kLockRemedy);
  if (const EmbeddedServerStatus embedded = EmbeddedServer(home_).status(); embedded.running) {
    throw std::runtime_error(fmt::format(
        "the single embedded redis-server of {} is running (pid {}, socket {}); dsfs runs a "
        "local cluster only in its place. Stop it with `dsfs server stop` (its data stays in "
        "{}), then start the cluster",
        home_.string(), embedded.pid, embedded.socket.string(), embedded.data_dir.string()));
  }
  std::optional<ClusterState> state = read_state(cluster_dir);
  if (state && !state->complete) {
    // Holding the lock, we know its creator is gone (it died part way).
    spdlog::warn("an earlier creation of the local cluster in {} did not finish; creating it anew",
                 cluster_dir.string());
    discard_nodes(cluster_dir, *state);
    state.reset();
  }
  if (!state) {
    spdlog::debug("creating a local Redis Cluster of {} in {}", describe_shape(shards, replicas),
                  cluster_dir.string());
    create_cluster(cluster_dir, shards, replicas);
    return true;
  }
  if (state->shards != shards || state->replicas != replicas) {
    throw std::runtime_error(fmt::format(
        "a local Redis Cluster of {} already exists in {} (first node 127.0.0.1:{}); it keeps "
        "its shape. Start it as it is with `dsfs server start --shards {} --replicas {}`, or "
        "remove it and its data: `dsfs server stop`, then delete {}",
        describe_shape(state->shards, state->replicas), cluster_dir.string(),
        state->nodes.front().port, state->shards, state->replicas, cluster_dir.string()));
  }
  return restart_cluster(cluster_dir, *state);
}

bool LocalCluster::stop() {
  const fs::path cluster_dir = dir();
  std::error_code ignored;
  if (!fs::exists(state_file_of(cluster_dir), ignored)) return false;
  const redis_process::StartLock lock(cluster_dir / "start.lock", kLockTimeout, kLockRemedy);
  const LocalClusterStatus current = status();
  bool stopped_any = false;
  std::string failures;
  // Replicas first: a replica still up while its primary stops could take the primary's place.
  for (const bool replicas_pass : {true, false}) {
    std::vector<const LocalClusterNodeStatus*> stopping;
    for (const LocalClusterNodeStatus& node : current.nodes) {
      if (node.running && (node.role == "replica") == replicas_pass) stopping.push_back(&node);
    }
    // A node that does not stop is reported at the end, after the others were stopped: one
    // that hangs left every primary running before.
    for (const auto* node : stopping) {
      try {
        request_shutdown(*node);
        wait_for_node_exit(cluster_dir, *node);
      } catch (const std::exception& e) {
        failures += fmt::format("{}{}", failures.empty() ? "" : "; ", e.what());
      }
    }
    stopped_any = stopped_any || !stopping.empty();
  }
  if (!failures.empty()) {
    throw std::runtime_error(fmt::format(
        "{}; the other nodes were stopped (`dsfs server status` shows what still runs; run "
        "`dsfs server stop` again)",
        failures));
  }
  return stopped_any;
}

}  // namespace dsfs::store
