#include "tests/unit/support/test_cluster.h"

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "src/store/cluster_slots.h"
#include "src/store/connection.h"

namespace dsfs::test {

using namespace std::chrono_literals;

TestCluster::TestCluster(size_t primaries) {
  if (primaries == 0) throw std::invalid_argument("a test cluster needs at least one node");
  for (size_t i = 0; i < primaries; ++i) start_node();
  assign_slots_and_meet();
  wait_until_ok();
}

void TestCluster::start_node() {
  for (int attempt = 1;; ++attempt) {
    const int bus_port = free_tcp_port();
    try {
      nodes_.push_back(std::make_unique<TestRedisServer>(
          TestRedisOptions{.extra_args = {"--cluster-enabled", "yes", "--cluster-config-file",
                                          "nodes.conf", "--cluster-node-timeout", "5000",
                                          "--cluster-port", std::to_string(bus_port)}}));
      bus_ports_.push_back(bus_port);
      return;
    } catch (const std::exception&) {
      if (attempt == 5) throw;
    }
  }
}

void TestCluster::assign_slots_and_meet() {
  const uint32_t per_node = store::kClusterSlots / static_cast<uint32_t>(nodes_.size());
  for (size_t i = 0; i < nodes_.size(); ++i) {
    store::Connection conn(nodes_[i]->endpoint());
    const uint32_t first = static_cast<uint32_t>(i) * per_node;
    const uint32_t last = i + 1 == nodes_.size() ? store::kClusterSlots - 1 : first + per_node - 1;
    conn.command({"CLUSTER", "ADDSLOTSRANGE", std::to_string(first), std::to_string(last)})
        .expect_ok("CLUSTER ADDSLOTSRANGE");
    if (i > 0) {
      conn.command({"CLUSTER", "MEET", "127.0.0.1", std::to_string(nodes_[0]->port()),
                    std::to_string(bus_ports_[0])})
          .expect_ok("CLUSTER MEET");
    }
  }
}

// Gossip takes a moment: waits (bounded) until every node sees the whole cluster served.
void TestCluster::wait_until_ok() const {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    bool ok = true;
    for (const auto& node : nodes_) {
      store::Connection conn(node->endpoint());
      const store::Reply info = conn.command({"CLUSTER", "INFO"});
      ok = ok && info.str().find("cluster_state:ok") != std::string_view::npos;
    }
    if (ok) return;
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("the test cluster never reached cluster_state:ok within 30 s");
    }
    std::this_thread::sleep_for(50ms);
  }
}

std::vector<store::RedisEndpoint> TestCluster::endpoints() const {
  std::vector<store::RedisEndpoint> seeds;
  for (const auto& node : nodes_) seeds.push_back(node->endpoint());
  return seeds;
}

long long TestCluster::key_count(size_t index) const {
  return store::Connection(node(index).endpoint())
      .command({"DBSIZE"})
      .expect_ok("DBSIZE")
      .integer();
}

void TestCluster::flush_all() const {
  for (const auto& node : nodes_) {
    store::Connection(node->endpoint()).command({"FLUSHALL"}).expect_ok("FLUSHALL");
  }
}

}  // namespace dsfs::test
