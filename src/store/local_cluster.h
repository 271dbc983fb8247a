#pragma once
// A local Redis Cluster that dsfs starts itself (`dsfs server start --shards N`): N primaries,
// each with R replicas, on loopback TCP ports, under DSFS_HOME. For trying dsfs against a
// sharded Redis on one machine; the single embedded server (embedded_server.h) stays the
// default.
#include <filesystem>
#include <string>
#include <vector>

#include "src/store/embedded_server.h"

namespace dsfs::store {

// One redis-server of the cluster, as its own view (or its nodes.conf when it is stopped) says.
struct LocalClusterNodeStatus {
  int port = 0;          // client port, on 127.0.0.1
  int bus_port = 0;      // cluster bus port, on 127.0.0.1
  std::string role;      // "primary", "replica", or "unknown" (no cluster view yet)
  std::string id;        // the node's cluster id; empty when unknown
  int primary_port = 0;  // a replica's primary; 0 for a primary or when unknown
  std::string slots;     // a primary's slots, e.g. "0-5460" or "0-10,20"; empty for a replica
  bool running = false;
  int pid = 0;  // 0 when not running (or running without a pid file and not answering)
  std::filesystem::path dir;
  std::filesystem::path log_file;
};

struct LocalClusterStatus {
  bool exists = false;    // a cluster was created (or its creation began) under dir
  bool complete = false;  // its creation finished; an unfinished one is recreated by start()
  int shards = 0;
  int replicas = 0;  // per primary
  std::filesystem::path dir;
  // cluster_state from CLUSTER INFO of the first running node ("ok", "fail"); empty when no
  // node runs.
  std::string state;
  std::vector<LocalClusterNodeStatus> nodes;  // in creation order: primaries, then replicas

  bool all_running() const;
  bool any_running() const;
  // What a user passes to --redis: redis://127.0.0.1:PORT of the first primary; empty when no
  // node is known to be a primary.
  std::string url() const;
};

// Thread safety: not synchronized (the CLI uses it from one thread). Processes are serialized
// by a lock file instead: concurrent starts and stops of one DSFS_HOME's cluster, from threads
// or processes, run one after the other, so concurrent starts create one cluster.
class LocalCluster {
 public:
  static constexpr int kMaxShards = 64;
  static constexpr int kMaxReplicas = 8;

  // home: $DSFS_HOME, else $HOME/.local/share/dsfs. Layout: home/cluster/{cluster.state,
  // start.lock, node-PORT/{redis.conf, redis.pid, redis.log, nodes.conf, data/}}.
  explicit LocalCluster(std::filesystem::path home = EmbeddedServer::default_home());

  std::filesystem::path dir() const;
  LocalClusterStatus status() const;

  // The first time: creates a cluster of `shards` primaries that split the 16384 slots evenly,
  // with `replicas` replicas each, every node a daemonized redis-server bound to 127.0.0.1 only
  // (no password) on free ports, with AOF+RDB persistence; a creation that fails stops what it
  // started and removes its directories. Later: starts every node that is not running, on the
  // same ports, with the same nodes.conf, so the cluster comes back as it was with its data.
  // Either way waits until every node answers and says cluster_state:ok (30 s, longer while a
  // node loads its data). Returns true if it started any node, false if all were running.
  // Throws std::invalid_argument for shards outside 1..kMaxShards or replicas outside
  // 0..kMaxReplicas, and std::runtime_error (saying what exists and how to remove it) when the
  // single embedded server of this home is running, when the existing cluster has another
  // shape, or when a node cannot start or the cluster does not become ok (naming the log file).
  bool start(int shards, int replicas);

  // SHUTDOWN SAVE on every running node (replicas first, so none takes over a primary that is
  // stopping) and waits for each to exit. Data and nodes.conf stay for the next start. Returns
  // false if no node was running (or no cluster exists).
  bool stop();

 private:
  std::filesystem::path home_;
};

}  // namespace dsfs::store
