#pragma once
// The one way dsfs reaches Redis: a single server or a Redis Cluster, the same to every caller
// (the read path, the prefetch engine, ingest, rm/GC, leases). Routing, a connection pool per
// node, redirections and the retry of transient failures live here and nowhere else.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "src/store/cluster_slots.h"
#include "src/store/connection.h"
#include "src/store/pool.h"

namespace dsfs::store {

// Which copies GETs of objects read (`--read-from`). Objects are immutable once published, so
// any copy is right; a replica that has not yet seen a key answers nil and the GET is asked of
// the primary. Whichever is chosen, a copy that does not answer is passed over for the others
// of its shard while it stays down (a primary's replica serves reads until its promotion).
enum class ReadFrom { kPrimary, kReplica, kAny };
// "primary", "replica" or "any"; throws std::invalid_argument naming the value otherwise.
ReadFrom parse_read_from(std::string_view text);
std::string_view to_string(ReadFrom read_from);

struct ClientOptions {
  ConnectOptions connect{};
  size_t connections_per_node = 8;  // each node's pool
  ReadFrom read_from = ReadFrom::kPrimary;
  // How long one command keeps retrying a node that does not answer and the replies that say
  // "not now" (LOADING, BUSY, MASTERDOWN, TRYAGAIN, CLUSTERDOWN) before it fails with
  // ConnectionError. 0: one try (plus redirections).
  std::chrono::milliseconds retry_budget{10000};
};

// Exponential backoff, 50 ms doubling to 1 s, within a deadline: the one schedule every retry
// loop of dsfs follows. Not synchronized (one per retry loop).
class Backoff {
 public:
  explicit Backoff(std::chrono::milliseconds budget);
  // Sleeps the next step (never past the deadline); false, without sleeping, once it has passed.
  bool wait();
  bool expired() const;
  void reset();  // a success: the next failure waits 50 ms again

 private:
  std::chrono::steady_clock::time_point deadline_;
  std::chrono::milliseconds step_{50};
};

// The key a command acts on (argv[1] for the commands dsfs sends; EVAL/EVALSHA's first key);
// empty for keyless commands (PING, TIME, INFO, SCAN, MULTI, EXEC...), which go to any primary.
std::string_view command_key(std::span<const std::string_view> argv);

// One node of the topology, for stats and `dsfs info`.
struct NodeReport {
  std::string address;  // host:port, or the unix socket of a single server
  bool primary = true;
  uint32_t slots = 0;  // slots it serves as primary (16384 for a single server)
  uint64_t connects = 0;
};

// Thread safety: internally synchronized: every method may be called from any thread at once.
// The topology is an immutable snapshot swapped under a mutex when a redirection or a lost node
// says it changed; pools are per node and synchronized themselves.
class Client {
 public:
  // Opens no connection: the first call that needs Redis (or connect()) finds the topology by
  // connecting to the first of `seeds` that answers and asking it whether it is a cluster node
  // (INFO cluster); for a cluster it loads the slot map (CLUSTER SLOTS) and reaches every node
  // with the seed's user and password. Throws std::invalid_argument for an empty seed list.
  explicit Client(std::vector<RedisEndpoint> seeds, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Finds the topology now unless known: throws ConnectionError when no seed answers within the
  // retry budget, ReplyError when AUTH is refused, std::invalid_argument for a cluster with
  // db != 0. Every other call does the same on first use.
  void connect();
  bool is_cluster();
  // What errors name as "Redis at ...", passwords hidden: the seed that answered when the
  // topology was found (with how many seeds there are); before any seed answered, the seeds.
  std::string describe() const;
  const RedisEndpoint& seed() const { return seeds_.front(); }
  const ClientOptions& options() const { return options_; }

  // Runs one command on the primary that owns its key (command_key). MOVED refreshes the map and
  // goes where it says; ASK asks the named node once (after ASKING); a node that does not answer
  // and the "not now" replies are retried with Backoff within the retry budget, then thrown as
  // ConnectionError naming the node. Other error replies are returned, not thrown.
  Reply command(std::span<const std::string_view> argv);
  Reply command(std::initializer_list<std::string_view> argv);

  // Runs `commands` (each a range of string-likes, key per command_key) grouped by node, at most
  // `window` outstanding on each, calling on_reply(index, reply) once per command: in order
  // within one node, in no particular order across nodes. A reply that redirects or says "not
  // now" is run again alone through command(), so on_reply sees the final answer. Throws
  // ConnectionError as command() does.
  template <typename Commands, typename OnReply>
  void pipeline(const Commands& commands, size_t window, OnReply&& on_reply);

  // GETs `keys` from the copies options().read_from allows, grouped by node, each group
  // pipelined (at most `window` outstanding), and returns the replies in the order of `keys`.
  // A nil from a replica is asked of the primary; redirections are followed; connection
  // failures and "not now" replies are retried within `retry_budget` (the caller's, e.g. 0 to
  // try once), then thrown as ConnectionError. Error replies that are none of these are
  // returned as kError. A node that failed a whole retry budget here is "unanswered" until a
  // reply from it: a later call whose keys go there tries once (a loader walking many files
  // would otherwise wait a whole budget per file for a node that is gone), while calls whose
  // keys go elsewhere wait as usual.
  // `retries`, when given, counts the tries after the first.
  std::vector<ValueReply> get_values(std::span<const std::string> keys, size_t window,
                                     std::chrono::milliseconds retry_budget,
                                     uint64_t* retries = nullptr);

  // A pooled connection to the primary of `key`'s slot, for a sequence that must stay on one
  // connection (WATCH ... MULTI/EXEC). It follows nothing: a MOVED reply is returned as such.
  ConnectionPool::Lease lease_for_key(std::string_view key);

  // Calls fn(connection) on every primary in turn, each on a pooled connection (SCAN walks one
  // node's keys; a single server is one primary). Connection failures are retried within the
  // retry budget, the topology reloaded between tries.
  void for_each_primary(const std::function<void(Connection&)>& fn);

  // True when some node answers PING within `limit` (a fresh connection, no retry).
  bool answers_within(std::chrono::milliseconds limit);

  std::vector<NodeReport> nodes();
  // host:port of the primary that serves `key` now (the socket of a single server); empty when
  // no node serves its slot.
  std::string primary_address(std::string_view key);
  uint64_t connects() const;
  uint64_t redirects() const { return redirects_.load(std::memory_order_relaxed); }
  uint64_t topology_refreshes() const { return refreshes_.load(std::memory_order_relaxed); }

  // GET of one key from its primary, as command() runs it (redirections followed) but retrying
  // within the caller's `retry_budget` (0: one try): for the rare replies a pipeline cannot
  // settle (a redirection, a replica's nil). Throws ConnectionError as command() does.
  ValueReply get_one(const std::string& key, std::chrono::milliseconds retry_budget);

  // Where reads of `key` go: the node's index (stable for the client's life; nodes that leave
  // keep theirs) and whether it is a replica. Used by GetRouter. A copy marked down (below) is
  // passed over while another copy of the shard is not.
  static constexpr size_t kNoNode = ~size_t{0};
  struct Route {
    size_t node = kNoNode;     // kNoNode: no node serves the slot now
    size_t primary = kNoNode;  // the slot's primary (== node unless reading from a replica)
  };
  Route route_read(std::string_view key);
  // As route_read(), but never finds the topology (no I/O, for a caller holding a lock of its
  // own): {} while it is unknown.
  Route route_read_known(std::string_view key);
  size_t route_primary(std::string_view key);
  // The nodes reads go to (the copies options().read_from allows, of every slot range), as
  // far as the topology is known: empty while it is not. Never finds it (no I/O).
  std::vector<size_t> read_nodes_known();
  // A new connection of the caller's own to node `index` (READONLY on a replica).
  std::unique_ptr<Connection> connect_node(size_t index);
  std::string describe_node(size_t index) const;
  // host:port of node `index` (the socket's path for a single server over a unix socket), as
  // nodes() names it.
  std::string address_of(size_t index) const;
  bool is_replica(size_t index) const;  // reached as a replica (its connections send READONLY)
  // A connection to node `index` failed: reads pass it over for its shard's other copies for
  // the next second (then one read tries it again). Newly marked, the map is reloaded first,
  // so routing around it trusts a map asked for after the failure. A reply clears the mark.
  void mark_down(size_t index);
  void mark_up(size_t index);  // also clears "unanswered" (get_values), logging it once
  // Whether some node has failed a whole retry budget of get_values() and not answered since.
  bool some_node_unanswered() const {
    return unanswered_count_.load(std::memory_order_relaxed) != 0;
  }

  // Reloads the slot map from any node that answers (a no-op for a single server). Throws
  // ConnectionError when none does. One reload at a time: a caller that waited for another
  // takes its map if that one was asked for after this call began (or its error, if it
  // failed), so many readers stalled on one dead node load the map once.
  void refresh_topology();
  // refresh_topology() when the map is older than 10 s (one caller does it; errors ignored):
  // replicas that joined (Redis lists a replica only once it has replicated something),
  // slots that moved without anyone being redirected yet. Older than 1 s while it lists fewer
  // replicas than it did and reads may go to replicas (for at most a minute).
  void refresh_if_stale();

 private:
  struct Node;
  struct Topology;
  // Discovers it on first use, retrying within `budget` (the client's retry budget if none).
  std::shared_ptr<const Topology> topology(
      std::optional<std::chrono::milliseconds> budget = std::nullopt);
  void discover(std::chrono::milliseconds budget);
  size_t node_index(const ClusterNode& node, bool replica);  // adds it if new
  Node& node(size_t index) const;
  void load_topology(Connection& conn, std::string_view asked_host);
  // One command to a known node, following redirections; the one retry loop of command() and
  // get_one(), within `budget`.
  Reply run(std::span<const std::string_view> argv, std::string_view key,
            std::chrono::milliseconds budget);
  void pipeline_views(std::span<const std::vector<std::string_view>> commands, size_t window,
                      const std::function<void(size_t, Reply&)>& on_reply);
  void patch_slot(uint32_t slot, size_t node);
  // Reloads the map unless the one in use was asked for at or after `asked_since_ms` (steady
  // clock), checked again after waiting for the reload in progress; a reload begun since then
  // that failed is not tried again, its error is thrown. One at a time (refresh_mutex_).
  void reload_topology(int64_t asked_since_ms);
  // The retry loops' reload: reload_topology() of a map asked for in the last 200 ms (as new as
  // one more would be while a node is down); errors logged, not thrown.
  void refresh_topology_in_retry();
  // route_read(), passing over `failed` (nodes that failed this caller) and nodes marked down
  // while another copy of the shard is neither; when every copy is, the one route_read() would
  // pick without them.
  Route route_read_avoiding(std::string_view key, std::span<const size_t> failed);
  bool down(size_t index, int64_t now_ms) const;

  std::vector<RedisEndpoint> seeds_;
  ClientOptions options_;
  std::atomic<bool> cluster_{false};
  std::atomic<size_t> answered_seed_{kNoNode};  // index in seeds_ of the seed that answered
  std::mutex discover_mutex_;                   // one discovery at a time
  mutable std::mutex mutex_;                    // guards nodes_ growth and topology_
  std::vector<std::unique_ptr<Node>> nodes_;
  std::shared_ptr<const Topology> topology_;
  std::atomic<uint64_t> redirects_{0};
  std::atomic<uint64_t> refreshes_{0};
  std::atomic<uint64_t> replica_turn_{0};
  std::atomic<int64_t> last_refresh_ms_{0};
  // When the map in use was asked for (ms, steady clock); when the last reload that failed began
  // and its error (refresh_mutex_).
  std::mutex refresh_mutex_;
  std::atomic<int64_t> map_asked_ms_{0};
  int64_t failed_reload_began_ms_ = 0;
  std::string failed_reload_error_;
  // Per node index (sized kMaxNodes, never moves): until when (ms, steady clock) it is passed
  // over for reads; 0 when it is not.
  std::unique_ptr<std::atomic<int64_t>[]> down_until_ms_;
  // Per node index (sized kMaxNodes): failed a whole retry budget of get_values(), no reply
  // since; and how many are. Set by mark_unanswered(), cleared by mark_up().
  std::unique_ptr<std::atomic<bool>[]> unanswered_;
  std::atomic<size_t> unanswered_count_{0};
  void mark_unanswered(std::span<const size_t> nodes, std::chrono::milliseconds budget);
  // The most replicas a map listed (mutex_), and since when the current one lists fewer (0:
  // it does not): refresh_if_stale() then reloads it sooner.
  size_t most_replicas_listed_ = 0;
  std::atomic<int64_t> replica_missing_since_ms_{0};
};

// Commands on one thread's own connections, one per node, replies read in the order sent: for
// a writer that keeps many commands in flight (ingest). A reply that redirects or says "not now"
// is answered by running that command again through the Client, so read_reply() returns the
// final answer. A ConnectionError leaves the pipeline empty and usable: the caller resends what
// it still needs. Thread safety: one thread at a time.
class RoutedPipeline {
 public:
  explicit RoutedPipeline(Client& client);
  ~RoutedPipeline();
  // Queues a command on its key's primary (connecting on first use). The bytes argv points to
  // must stay valid until its reply is read: a redirected command is sent again from them.
  void append(std::span<const std::string_view> argv);
  void append(std::initializer_list<std::string_view> argv);
  Reply read_reply();  // the reply to the oldest command appended
  size_t pending() const { return order_.size(); }
  // Drops every connection and every pending command (after a failure).
  void reset();

 private:
  struct Sent {
    size_t node;
    std::vector<std::string_view> argv;  // the caller's bytes, to run it again if redirected
  };
  Connection& connection(size_t node);
  Client& client_;
  std::vector<std::unique_ptr<Connection>> connections_;  // by node index
  std::deque<Sent> order_;
};

// GETs on connections of one thread's own, one per node, replies taken as they arrive from any
// node, so a slow or far node does not hold back the others (the prefetch engine's workers).
// Each GET carries a tag the caller chooses. Redirections, "not now" replies and a replica's nil
// are settled by asking again through the Client (get_values), so receive() gives the final
// answer. Failures throw ConnectionError; the router is then empty and usable (what was
// outstanding is lost: the caller gives those up). Thread safety: one thread at a time;
// interrupt() from any thread.
class GetRouter {
 public:
  explicit GetRouter(Client& client);
  ~GetRouter();
  GetRouter(const GetRouter&) = delete;
  GetRouter& operator=(const GetRouter&) = delete;

  void send(std::span<const std::string> keys, std::span<const uint64_t> tags);
  // As send(), each key to nodes[i] (a Client node index the caller routed it to, so that what
  // it counts per node is where the GET went); Client::kNoNode: routed here.
  void send(std::span<const std::string> keys, std::span<const uint64_t> tags,
            std::span<const size_t> nodes);
  struct Received {
    uint64_t tag = 0;
    ValueReply reply;
    // When its GET was about to be written to its node's socket: after connecting to the node,
    // which a batch for several nodes does one node after another, so a round trip measured
    // around the whole send() would count other nodes' connects (or, taken after it, read
    // 0.1 ms to nodes 100 ms away).
    std::chrono::steady_clock::time_point sent_at{};
  };
  // Connects to `node` now, if not yet, so the first GETs sent there wait one round trip and
  // not a handshake's too. Throws ConnectionError as send() does.
  void connect(size_t node);
  // The next reply from whichever node answers first; blocks until one does. Needs
  // outstanding() > 0.
  Received receive();
  size_t outstanding() const { return outstanding_; }
  // Wakes a thread blocked in receive() (it then throws ConnectionError).
  void interrupt();
  void reset();

 private:
  struct NodeStream;
  NodeStream& stream(size_t node);
  bool route_is_replica(size_t node) const;
  Client& client_;
  std::mutex streams_mutex_;  // guards streams_ against interrupt()
  std::vector<std::unique_ptr<NodeStream>> streams_;
  size_t outstanding_ = 0;
  size_t next_ = 0;  // where receive() starts looking, so no node is always served last
  // Closes the streams to nodes reads no longer go to (a failover changed a node's role, a
  // node left), once per topology the client loads; those with GETs outstanding stay.
  void close_unread_streams();
  uint64_t refreshes_seen_ = 0;
  std::atomic<bool> interrupted_{false};
};

}  // namespace dsfs::store

#include "src/store/client_impl.h"
