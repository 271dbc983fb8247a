// LocalCluster with a temporary DSFS_HOME: a real 3-shard cluster with replicas, its data across
// stop and start, the shapes and states it refuses, concurrency, and `dsfs server --shards`.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/cli/common.h"
#include "src/cli/server_command.h"
#include "src/store/cluster_slots.h"
#include "src/store/connection.h"
#include "src/store/embedded_server.h"
#include "src/store/local_cluster.h"
#include "tests/unit/support/files.h"

namespace dsfs::store {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

// True while pid exists and has not exited (a zombie waiting for its reaper has exited).
bool is_running_process(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return false;
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z';
}

// Every redis-server a test started under `home` is gone once this is destroyed, whether the
// test passed or failed part way: stop() first, then SIGKILL for any pid a node's pid file
// still names (a stop that failed, a node of a creation that did not finish).
class RedisReaper {
 public:
  explicit RedisReaper(fs::path home) : home_(std::move(home)) {}
  RedisReaper(const RedisReaper&) = delete;
  RedisReaper& operator=(const RedisReaper&) = delete;
  ~RedisReaper() {
    std::set<int> pids;
    try {
      for (const auto& node : LocalCluster(home_).status().nodes) {
        if (node.pid > 0) pids.insert(node.pid);
      }
      LocalCluster(home_).stop();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "stopping the cluster failed: " << e.what();
    }
    try {
      EmbeddedServer(home_).stop();
    } catch (const std::exception& e) {
      ADD_FAILURE() << "stopping the embedded server failed: " << e.what();
    }
    std::error_code ignored;
    for (fs::directory_iterator it(home_ / "cluster", ignored), end; it != end; ++it) {
      std::ifstream pid_file(it->path() / "redis.pid");
      if (int pid = 0; pid_file >> pid) pids.insert(pid);
    }
    for (const int pid : pids) {
      if (pid > 0 && is_running_process(pid)) {
        ADD_FAILURE() << "redis-server pid " << pid << " outlived the test; killing it";
        ::kill(pid, SIGKILL);
      }
    }
  }

 private:
  fs::path home_;
};

class LocalClusterTest : public ::testing::Test {
 protected:
  test::TempDir home_dir_{"dsfs-cluster-home"};  // removed after the reaper has run
  const fs::path home_ = home_dir_.path();
  RedisReaper reaper_{home_};
};

Connection connect_to(int port) {
  RedisEndpoint endpoint;
  endpoint.host = "127.0.0.1";
  endpoint.port = port;
  return Connection(endpoint);
}

std::vector<int> ports_of(const LocalClusterStatus& status) {
  std::vector<int> ports;
  for (const auto& node : status.nodes) ports.push_back(node.port);
  return ports;
}

// The slot map as `port` reports it.
SlotMap slot_map(int port) {
  Connection conn = connect_to(port);
  const Reply slots = conn.command({"CLUSTER", "SLOTS"});
  return SlotMap::from_cluster_slots(slots.raw(), "127.0.0.1");
}

TEST_F(LocalClusterTest, NothingExistsBeforeStart) {
  LocalCluster cluster(home_);
  const LocalClusterStatus status = cluster.status();
  EXPECT_FALSE(status.exists);
  EXPECT_TRUE(status.nodes.empty());
  EXPECT_FALSE(status.any_running());
  EXPECT_EQ(status.url(), "");
  EXPECT_EQ(cluster.dir(), home_ / "cluster");
  EXPECT_FALSE(cluster.stop());
}

TEST_F(LocalClusterTest, ThreeShardsWithReplicasServeKeepTheirDataAndPortsAcrossStopAndStart) {
  LocalCluster cluster(home_);
  ASSERT_TRUE(cluster.start(3, 1));
  const LocalClusterStatus status = cluster.status();
  ASSERT_TRUE(status.exists);
  EXPECT_TRUE(status.complete);
  EXPECT_EQ(status.shards, 3);
  EXPECT_EQ(status.replicas, 1);
  ASSERT_EQ(status.nodes.size(), 6u);
  EXPECT_TRUE(status.all_running());
  EXPECT_EQ(status.state, "ok");

  // Every node answers, is bound to loopback only, and says the cluster is ok; three primaries
  // hold slots, and each has one replica.
  std::set<int> primaries;
  std::map<int, int> replicas_of;
  for (const auto& node : status.nodes) {
    EXPECT_GT(node.pid, 0);
    EXPECT_TRUE(is_running_process(node.pid));
    EXPECT_EQ(node.dir, home_ / "cluster" / ("node-" + std::to_string(node.port)));
    EXPECT_TRUE(fs::exists(node.dir / "nodes.conf"));
    EXPECT_NE(node.bus_port, node.port);
    Connection conn = connect_to(node.port);
    EXPECT_EQ(conn.command({"PING"}).str(), "PONG");
    EXPECT_THAT(std::string(conn.command({"CLUSTER", "INFO"}).str()),
                HasSubstr("cluster_state:ok"));
    EXPECT_EQ(Reply::element_str(conn.command({"CONFIG", "GET", "bind"}).element(1)), "127.0.0.1");
    EXPECT_EQ(Reply::element_str(conn.command({"CONFIG", "GET", "appendonly"}).element(1)), "yes");
    if (node.role == "primary") {
      primaries.insert(node.port);
      EXPECT_FALSE(node.slots.empty()) << node.port;
    } else {
      EXPECT_EQ(node.role, "replica") << node.port;
      ++replicas_of[node.primary_port];
    }
  }
  EXPECT_EQ(primaries.size(), 3u);
  EXPECT_EQ(replicas_of.size(), 3u);
  for (const auto& [primary_port, count] : replicas_of) {
    EXPECT_TRUE(primaries.contains(primary_port)) << primary_port;
    EXPECT_EQ(count, 1);
  }
  EXPECT_EQ(status.url(), "redis://127.0.0.1:" + std::to_string(status.nodes[0].port));

  // Keys over every shard, each written on the primary that owns its slot.
  const SlotMap map = slot_map(status.nodes[0].port);
  EXPECT_EQ(map.uncovered_slots(), 0u);
  ASSERT_EQ(map.primaries().size(), 3u);
  std::map<std::string, std::string> written;
  std::set<int> owners;
  for (int k = 0; k < 60; ++k) {
    const std::string key = "dsfs:cluster-test:o:" + std::to_string(k);
    const std::string value = test::pattern_bytes(100 + k, k);
    const SlotMap::Range* owner = map.find(key_slot(key));
    ASSERT_NE(owner, nullptr);
    Connection conn = connect_to(owner->primary.port);
    conn.command({"SET", key, value}).expect_ok("SET");
    owners.insert(owner->primary.port);
    written[key] = value;
  }
  EXPECT_EQ(owners.size(), 3u) << "the keys should land on every shard";
  // The replicas have them too: WAIT until one replica acknowledged each primary's writes,
  // then read one back from a replica (READONLY lets a replica serve its primary's slots).
  for (const int port : primaries) {
    Connection conn = connect_to(port);
    EXPECT_EQ(conn.command({"WAIT", "1", "5000"}).integer(), 1) << port;
  }
  {
    const auto& [key, value] = *written.begin();
    const int owner_port = map.find(key_slot(key))->primary.port;
    // The status, not CLUSTER SLOTS: that lists a replica only once it has replicated bytes.
    const auto replica_node =
        std::find_if(status.nodes.begin(), status.nodes.end(),
                     [&](const auto& n) { return n.primary_port == owner_port; });
    ASSERT_NE(replica_node, status.nodes.end());
    Connection replica = connect_to(replica_node->port);
    replica.command({"READONLY"}).expect_ok("READONLY");
    EXPECT_EQ(replica.command({"GET", key}).str(), value);
  }

  EXPECT_FALSE(cluster.start(3, 1)) << "a second start should find every node running";

  ASSERT_TRUE(cluster.stop());
  const LocalClusterStatus stopped = cluster.status();
  EXPECT_TRUE(stopped.exists);
  EXPECT_FALSE(stopped.any_running());
  EXPECT_EQ(stopped.state, "");
  for (const auto& node : status.nodes) {
    EXPECT_FALSE(is_running_process(node.pid)) << "node " << node.port << " outlived stop";
  }
  // Stopped, the nodes' roles come from their nodes.conf.
  EXPECT_EQ(std::count_if(stopped.nodes.begin(), stopped.nodes.end(),
                          [](const auto& node) { return node.role == "primary"; }),
            3);
  EXPECT_FALSE(cluster.stop());

  ASSERT_TRUE(cluster.start(3, 1));
  const LocalClusterStatus restarted = cluster.status();
  EXPECT_EQ(ports_of(restarted), ports_of(status)) << "a restart must reuse the same ports";
  EXPECT_TRUE(restarted.all_running());
  EXPECT_EQ(restarted.state, "ok");
  const SlotMap map_after = slot_map(restarted.nodes[0].port);
  EXPECT_EQ(map_after.uncovered_slots(), 0u);
  for (const auto& [key, value] : written) {
    const SlotMap::Range* owner = map_after.find(key_slot(key));
    ASSERT_NE(owner, nullptr);
    EXPECT_EQ(connect_to(owner->primary.port).command({"GET", key}).str(), value) << key;
  }
}

TEST_F(LocalClusterTest, AnExistingClusterKeepsItsShape) {
  LocalCluster cluster(home_);
  ASSERT_TRUE(cluster.start(1, 0));
  for (const bool running : {true, false}) {
    try {
      cluster.start(2, 0);
      ADD_FAILURE() << "another shape should be refused (running: " << running << ")";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("1 shard with 0 replicas"));
      EXPECT_THAT(e.what(), HasSubstr("--shards 1 --replicas 0"));
      EXPECT_THAT(e.what(), HasSubstr("dsfs server stop"));
      EXPECT_THAT(e.what(), HasSubstr("delete " + cluster.dir().string()));
    }
    EXPECT_THROW(cluster.start(1, 1), std::runtime_error);
    EXPECT_EQ(cluster.status().nodes.size(), 1u);
    EXPECT_EQ(cluster.status().any_running(), running);
    if (running) {
      ASSERT_TRUE(cluster.stop());
    }
  }
}

TEST_F(LocalClusterTest, RefusedWhileTheSingleEmbeddedServerRuns) {
  EmbeddedServer embedded(home_);
  ASSERT_TRUE(embedded.start());
  try {
    LocalCluster(home_).start(1, 0);
    ADD_FAILURE() << "a cluster should not start beside the running embedded server";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("embedded redis-server"));
    EXPECT_THAT(e.what(), HasSubstr("dsfs server stop"));
  }
  EXPECT_FALSE(LocalCluster(home_).status().exists);
  EXPECT_TRUE(embedded.status().running);
  ASSERT_TRUE(embedded.stop());
  EXPECT_TRUE(LocalCluster(home_).start(1, 0));
}

TEST_F(LocalClusterTest, BadShapesAreRefusedBeforeAnythingStarts) {
  LocalCluster cluster(home_);
  EXPECT_THROW(cluster.start(0, 0), std::invalid_argument);
  EXPECT_THROW(cluster.start(LocalCluster::kMaxShards + 1, 0), std::invalid_argument);
  EXPECT_THROW(cluster.start(1, -1), std::invalid_argument);
  EXPECT_THROW(cluster.start(1, LocalCluster::kMaxReplicas + 1), std::invalid_argument);
  EXPECT_FALSE(cluster.status().exists);
  EXPECT_FALSE(fs::exists(cluster.dir()));
}

TEST_F(LocalClusterTest, ConcurrentStartsCreateOneCluster) {
  std::atomic<int> started{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&] {
      try {
        if (LocalCluster(home_).start(2, 0)) ++started;
      } catch (const std::exception& e) {
        ++failed;
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(started.load(), 1);
  EXPECT_EQ(failed.load(), 0);
  const LocalClusterStatus status = LocalCluster(home_).status();
  EXPECT_EQ(status.nodes.size(), 2u);
  EXPECT_TRUE(status.all_running());
  size_t node_dirs = 0;
  for (const auto& entry : fs::directory_iterator(home_ / "cluster")) {
    node_dirs += entry.path().filename().string().starts_with("node-") ? 1 : 0;
  }
  EXPECT_EQ(node_dirs, 2u);
}

TEST_F(LocalClusterTest, AKilledNodeComesBackOnItsPortWithItsData) {
  LocalCluster cluster(home_);
  ASSERT_TRUE(cluster.start(1, 0));
  const LocalClusterNodeStatus node = cluster.status().nodes.at(0);
  // Redis writes the AOF before it replies, so the key survives the kill (the OS keeps it).
  connect_to(node.port).command({"SET", "kept", "yes"}).expect_ok("SET");
  ::kill(node.pid, SIGKILL);
  const auto exit_deadline = std::chrono::steady_clock::now() + 10s;
  while (cluster.status().any_running()) {
    ASSERT_LT(std::chrono::steady_clock::now(), exit_deadline) << "the killed node still runs";
    std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(cluster.start(1, 0));
  const LocalClusterStatus status = cluster.status();
  EXPECT_EQ(status.nodes.at(0).port, node.port);
  EXPECT_NE(status.nodes.at(0).pid, node.pid);
  EXPECT_EQ(status.state, "ok");
  EXPECT_EQ(connect_to(node.port).command({"GET", "kept"}).str(), "yes");
}

TEST_F(LocalClusterTest, APortTakenWhileStoppedIsAClearErrorAndTheNodeKeepsIt) {
  LocalCluster cluster(home_);
  ASSERT_TRUE(cluster.start(1, 0));
  const int port = cluster.status().nodes.at(0).port;
  ASSERT_TRUE(cluster.stop());
  {
    // Another process listens on the node's port meanwhile.
    const int squatter = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(squatter, 0);
    const int yes = 1;  // the node's closed connections may leave the port in TIME_WAIT
    ::setsockopt(squatter, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(::bind(squatter, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ASSERT_EQ(::listen(squatter, 1), 0);
    try {
      cluster.start(1, 0);
      ADD_FAILURE() << "a node should not start while its port is taken";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(port)));
      EXPECT_THAT(e.what(), HasSubstr("another process holds"));
      EXPECT_THAT(e.what(), HasSubstr("redis.log"));
    }
    ::close(squatter);
  }
  EXPECT_FALSE(cluster.status().any_running());
  EXPECT_TRUE(cluster.start(1, 0));
  EXPECT_EQ(cluster.status().nodes.at(0).port, port);
  EXPECT_EQ(cluster.status().state, "ok");
}

TEST_F(LocalClusterTest, AnUnfinishedCreationIsReplaced) {
  // What a `dsfs server start --shards` killed part way leaves: a state file that says so.
  const fs::path dir = home_ / "cluster";
  test::write_file(dir / "cluster.state",
                   "complete no\nshards 1\nreplicas 0\nnode 1 2 primary 0\n");
  test::write_file(dir / "node-1" / "redis.log", "half made\n");
  LocalCluster cluster(home_);
  EXPECT_TRUE(cluster.status().exists);
  EXPECT_FALSE(cluster.status().complete);
  ASSERT_TRUE(cluster.start(1, 0));
  EXPECT_FALSE(fs::exists(dir / "node-1"));
  const LocalClusterStatus status = cluster.status();
  EXPECT_TRUE(status.complete);
  EXPECT_TRUE(status.all_running());
  EXPECT_NE(status.nodes.at(0).port, 1);
}

TEST_F(LocalClusterTest, ADamagedStateFileIsAClearError) {
  test::write_file(home_ / "cluster" / "cluster.state", "shards many\n");
  try {
    LocalCluster(home_).status();
    ADD_FAILURE() << "a damaged state file should be refused";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cluster.state"));
    EXPECT_THAT(e.what(), HasSubstr("delete"));
  }
  fs::remove(home_ / "cluster" / "cluster.state");  // so that the reaper finds nothing to stop
}

// Sets an environment variable for one test and restores the previous value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (previous_) {
      ::setenv(name_, previous_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

// Runs `dsfs server ARGS...`; returns the exit code ExitCode carried (0 if none was thrown).
int run_server_command(std::vector<std::string> args, std::string* out = nullptr) {
  CLI::App app;
  cli::GlobalOptions global;
  cli::register_server_command(app, global);
  args.insert(args.begin(), "server");
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  testing::internal::CaptureStdout();
  int code = 0;
  try {
    app.parse(args);
  } catch (const cli::ExitCode& e) {
    code = e.code;
  } catch (...) {
    testing::internal::GetCapturedStdout();
    throw;
  }
  const std::string printed = testing::internal::GetCapturedStdout();
  if (out) *out = printed;
  return code;
}

TEST_F(LocalClusterTest, ServerCommandWithShards) {
  const ScopedEnv home_env("DSFS_HOME", home_.string());
  std::string out;
  EXPECT_THROW(run_server_command({"start", "--replicas", "1"}), CLI::RequiresError);
  EXPECT_THROW(run_server_command({"start", "--shards", "0"}), CLI::ValidationError);

  EXPECT_EQ(run_server_command({"start", "--shards", "2"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("started the local Redis Cluster"));
  const LocalClusterStatus status = LocalCluster(home_).status();
  ASSERT_EQ(status.nodes.size(), 2u);
  EXPECT_THAT(out, HasSubstr("url: " + status.url()));

  EXPECT_EQ(run_server_command({"start", "--shards", "2"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("already running"));

  EXPECT_EQ(run_server_command({"status"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("running: yes (2 of 2 nodes)"));
  EXPECT_THAT(out, HasSubstr("state: ok"));
  EXPECT_THAT(out, HasSubstr("primary"));
  EXPECT_THAT(out, HasSubstr("127.0.0.1:" + std::to_string(status.nodes[1].port)));
  EXPECT_THAT(out, HasSubstr(std::to_string(status.nodes[0].pid)));

  // One kind at a time: the single server does not start beside the cluster.
  try {
    run_server_command({"start"});
    ADD_FAILURE() << "the single server should not start beside a running cluster";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("local Redis Cluster"));
    EXPECT_THAT(e.what(), HasSubstr("dsfs server stop"));
  }
  EXPECT_FALSE(EmbeddedServer(home_).status().running);

  EXPECT_EQ(run_server_command({"stop"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("stopped the local Redis Cluster"));
  EXPECT_EQ(run_server_command({"status"}, &out), 3);
  EXPECT_THAT(out, HasSubstr("running: no (0 of 2 nodes)"));
  EXPECT_EQ(run_server_command({"stop"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("not running"));

  // With the cluster stopped, the single server starts as before; the cluster then refuses.
  EXPECT_EQ(run_server_command({"start"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("started the embedded redis-server"));
  EXPECT_THROW(run_server_command({"start", "--shards", "2"}), std::runtime_error);
  EXPECT_EQ(run_server_command({"stop"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("stopped the embedded redis-server"));
  EXPECT_EQ(run_server_command({"start", "--shards", "2"}, &out), 0);
  EXPECT_EQ(ports_of(LocalCluster(home_).status()), ports_of(status));
}

TEST_F(LocalClusterTest, ADamagedClusterLeavesTheSingleServerWorking) {
  const ScopedEnv home_env("DSFS_HOME", home_.string());
  test::write_file(home_ / "cluster" / "cluster.state", "complete maybe\n");
  std::string out;
  EXPECT_EQ(run_server_command({"start"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("started the embedded redis-server"));
  // stop stops the single server, then reports the damaged cluster.
  EXPECT_THROW(run_server_command({"stop"}), std::runtime_error);
  EXPECT_FALSE(EmbeddedServer(home_).status().running);
  fs::remove(home_ / "cluster" / "cluster.state");  // so that the reaper finds nothing to stop
}

}  // namespace
}  // namespace dsfs::store
