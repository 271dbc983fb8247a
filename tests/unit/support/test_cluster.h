#pragma once
// A real, throwaway Redis Cluster for the unit tests: cluster-enabled redis-servers (primaries
// only) that share the 16384 slots evenly and have met.
#include <cstddef>
#include <memory>
#include <vector>

#include "src/store/redis_url.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::test {

// Started by the constructor and ready when it returns (every node says cluster_state:ok);
// throws std::runtime_error if it does not get there within 30 s. The destructor stops the
// nodes. Each node lives in its own TestRedisServer (temp directory, loopback port).
class TestCluster {
 public:
  explicit TestCluster(size_t primaries = 3);
  TestCluster(const TestCluster&) = delete;
  TestCluster& operator=(const TestCluster&) = delete;

  size_t size() const { return nodes_.size(); }
  TestRedisServer& node(size_t index) const { return *nodes_.at(index); }
  int bus_port(size_t index) const { return bus_ports_.at(index); }
  // Every node's endpoint: the seeds a store::Client starts from.
  std::vector<store::RedisEndpoint> endpoints() const;

  // DBSIZE of one node (keys it holds: each key lives on its slot's primary only).
  long long key_count(size_t index) const;
  // FLUSHALL on every node.
  void flush_all() const;

 private:
  // A cluster-enabled node. Its bus port is named: by default it is the client port + 10000,
  // and a free client port above 55535 (the kernel hands those out too) has none, so the node
  // refused to start. Another process may take the bus port before the node binds it: retried.
  void start_node();
  void assign_slots_and_meet();
  void wait_until_ok() const;

  std::vector<std::unique_ptr<TestRedisServer>> nodes_;
  std::vector<int> bus_ports_;
};

}  // namespace dsfs::test
