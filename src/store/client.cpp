#include "src/store/client.h"

#include <fmt/core.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include "src/store/errors.h"
#include "src/store/log_text.h"
#include "src/store/value_buffer.h"

namespace dsfs::store {
namespace {

using Clock = std::chrono::steady_clock;
// A get_values() round to one node that takes longer is logged (debug).
constexpr std::chrono::milliseconds kSlowGets{500};

// The most nodes one client keeps: nodes_ is reserved to it so that a node's slot never moves
// while another thread reads it. Far above any real cluster's size.
constexpr size_t kMaxNodes = 1024;
// A command that bounces more often than this between nodes is given up (a cluster whose nodes
// disagree for longer than the retry budget could otherwise loop).
constexpr int kMaxRedirects = 16;
// A MOVED reply patches its slot at once; the whole map is reloaded at most this often.
constexpr std::chrono::milliseconds kRefreshInterval{200};
// Reads reload a map older than this.
constexpr std::chrono::milliseconds kStaleTopology{10000};
// ... or this, while the map lists fewer replicas than it did (a failover took one away, or a
// node restarts), when reads may go to replicas: a shard read from its primary for want of a
// listed replica stalls if that primary fails too. For at most kReplicaWait; after that the
// smaller set is taken as the cluster's shape.
constexpr std::chrono::milliseconds kStaleTopologyMissingReplica{1000};
constexpr std::chrono::milliseconds kReplicaWait{60000};
// A node that failed a caller is passed over for reads this long (Client::mark_down): long
// enough that readers do not each pay a failed connect per read while a primary waits for its
// promotion (seconds), short enough that a node back is read again soon.
constexpr std::chrono::milliseconds kNodeDownFor{1000};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && ::strncasecmp(a.data(), b.data(), a.size()) == 0;
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}

std::string node_address(const RedisEndpoint& endpoint) {
  return endpoint.transport == RedisEndpoint::Transport::kUnix
             ? endpoint.socket_path
             : fmt::format("{}:{}", endpoint.host, endpoint.port);
}

}  // namespace

ReadFrom parse_read_from(std::string_view text) {
  if (text == "primary") return ReadFrom::kPrimary;
  if (text == "replica") return ReadFrom::kReplica;
  if (text == "any") return ReadFrom::kAny;
  throw std::invalid_argument(
      fmt::format("--read-from '{}' is not one of primary, replica, any", log_text(text)));
}

std::string_view to_string(ReadFrom read_from) {
  switch (read_from) {
    case ReadFrom::kPrimary:
      return "primary";
    case ReadFrom::kReplica:
      return "replica";
    case ReadFrom::kAny:
      return "any";
  }
  return "?";
}

Backoff::Backoff(std::chrono::milliseconds budget) : deadline_(Clock::now() + budget) {}

bool Backoff::expired() const {
  return Clock::now() >= deadline_;
}

bool Backoff::wait() {
  const auto now = Clock::now();
  if (now >= deadline_) return false;
  std::this_thread::sleep_for(std::min<Clock::duration>(step_, deadline_ - now));
  step_ = std::min(step_ * 2, std::chrono::milliseconds{1000});
  return true;
}

void Backoff::reset() {
  step_ = std::chrono::milliseconds{50};
}

std::string_view command_key(std::span<const std::string_view> argv) {
  if (argv.size() < 2) return {};
  const std::string_view name = argv[0];
  static constexpr std::string_view kKeyless[] = {
      "PING",    "TIME",     "INFO",    "SCAN",     "KEYS",     "MULTI",   "EXEC",
      "DISCARD", "UNWATCH",  "CLUSTER", "READONLY", "ASKING",   "AUTH",    "SELECT",
      "DBSIZE",  "FLUSHALL", "FLUSHDB", "CONFIG",   "CLIENT",   "COMMAND", "SCRIPT",
      "DEBUG",   "SHUTDOWN", "SAVE",    "BGSAVE",   "LASTSAVE", "WAIT",    "ROLE",
      "ECHO",    "HELLO",    "ACL",     "MEMORY",   "OBJECT",   "LATENCY", "SLOWLOG"};
  for (const std::string_view keyless : kKeyless) {
    if (iequals(name, keyless)) return {};
  }
  if (iequals(name, "EVAL") || iequals(name, "EVALSHA")) {
    if (argv.size() < 4 || argv[2] == "0") return {};
    return argv[3];
  }
  return argv[1];
}

struct Client::Node {
  RedisEndpoint endpoint;
  bool replica = false;
  std::unique_ptr<ConnectionPool> pool;
};

struct Client::Topology {
  static constexpr uint16_t kUnserved = 0xFFFF;
  struct Range {
    size_t primary = kNoNode;
    std::vector<size_t> replicas;
    uint32_t slots = 0;
  };
  std::vector<uint16_t> slot_range = std::vector<uint16_t>(kClusterSlots, kUnserved);
  std::vector<Range> ranges;
  std::vector<size_t> primaries;  // distinct, in slot order

  const Range* range_of(uint32_t slot) const {
    const uint16_t index = slot_range[slot];
    return index == kUnserved ? nullptr : &ranges[index];
  }
};

Client::Client(std::vector<RedisEndpoint> seeds, ClientOptions options)
    : seeds_(std::move(seeds)),
      options_(options),
      down_until_ms_(std::make_unique<std::atomic<int64_t>[]>(kMaxNodes)),
      unanswered_(std::make_unique<std::atomic<bool>[]>(kMaxNodes)) {
  if (seeds_.empty()) throw std::invalid_argument("no Redis server named (an empty seed list)");
  nodes_.reserve(kMaxNodes);
}

void Client::connect() {
  topology();
}

bool Client::is_cluster() {
  topology();
  return cluster_;
}

void Client::discover(std::chrono::milliseconds budget) {
  Backoff backoff(budget);
  std::string last_error;
  for (;;) {
    for (size_t seed_index = 0; seed_index < seeds_.size(); ++seed_index) {
      const RedisEndpoint& seed = seeds_[seed_index];
      std::optional<Connection> conn;
      try {
        conn.emplace(seed, options_.connect);
      } catch (const ConnectionError& e) {
        last_error = e.what();
        continue;
      }
      const Reply info = conn->command({"INFO", "cluster"});
      const bool cluster =
          info.is_string() && info.str().find("cluster_enabled:1") != std::string::npos;
      if (!cluster && seeds_.size() > 1) {
        // Several URLs name the nodes of one cluster; of two single servers, each command
        // would go to whichever answers (an audit's datasets ended up split between two).
        throw std::invalid_argument(fmt::format(
            "Redis at {} is a single server (not in cluster mode), but {} URLs were given: "
            "several URLs name nodes of one Redis Cluster; give only this server's URL",
            seed.describe(), seeds_.size()));
      }
      if (!cluster) {
        // One server: node 0, every slot.
        auto topology = std::make_shared<Topology>();
        topology->ranges.push_back({0, {}, kClusterSlots});
        std::fill(topology->slot_range.begin(), topology->slot_range.end(), 0);
        topology->primaries = {0};
        std::lock_guard lock(mutex_);
        if (nodes_.empty()) {
          nodes_.push_back(std::make_unique<Node>(
              Node{seed, false,
                   std::make_unique<ConnectionPool>(seed, options_.connections_per_node,
                                                    options_.connect)}));
        }
        topology_ = std::move(topology);
        answered_seed_ = seed_index;
        return;
      }
      if (seed.db != 0) {
        throw std::invalid_argument(fmt::format(
            "Redis at {} is a cluster node, and a cluster has only database 0: drop the /{} "
            "from the URL",
            seed.describe(), seed.db));
      }
      cluster_ = true;
      try {
        load_topology(*conn,
                      seed.transport == RedisEndpoint::Transport::kTcp ? seed.host : "127.0.0.1");
        answered_seed_ = seed_index;
        return;
      } catch (const ConnectionError& e) {
        last_error = e.what();
      }
    }
    if (!backoff.wait()) break;
  }
  throw ConnectionError(fmt::format("no Redis server answers at {}: {}", describe(), last_error));
}

Client::~Client() = default;

std::string Client::describe() const {
  if (seeds_.size() == 1) return seeds_.front().describe();
  if (const size_t answered = answered_seed_; answered != kNoNode) {
    return fmt::format("{} (one of {} seed nodes)", seeds_[answered].describe(), seeds_.size());
  }
  // None answered yet: naming only the first would blame it alone.
  constexpr size_t kNamed = 3;
  std::string text;
  for (size_t i = 0; i < std::min(seeds_.size(), kNamed); ++i) {
    text += (i == 0 ? "" : ", ") + seeds_[i].describe();
  }
  if (seeds_.size() > kNamed) {
    text += fmt::format(" and {} more seed nodes", seeds_.size() - kNamed);
  }
  return text;
}

std::shared_ptr<const Client::Topology> Client::topology(
    std::optional<std::chrono::milliseconds> budget) {
  {
    std::lock_guard lock(mutex_);
    if (topology_) return topology_;
  }
  std::lock_guard discovering(discover_mutex_);
  {
    std::lock_guard lock(mutex_);
    if (topology_) return topology_;  // another thread found it meanwhile
  }
  discover(budget.value_or(options_.retry_budget));
  std::lock_guard lock(mutex_);
  return topology_;
}

Client::Node& Client::node(size_t index) const {
  std::lock_guard lock(mutex_);
  return *nodes_.at(index);
}

size_t Client::node_index(const ClusterNode& cluster_node, bool replica) {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const RedisEndpoint& e = nodes_[i]->endpoint;
    // A node is known once per role: its connections as a replica send READONLY, as a
    // primary they do not, so one promoted or demoted by a failover gets the index of its new
    // role (reads sent there as to a replica would otherwise be redirected, every one).
    if (e.transport == RedisEndpoint::Transport::kTcp && e.host == cluster_node.host &&
        e.port == cluster_node.port && nodes_[i]->replica == replica) {
      return i;
    }
  }
  if (nodes_.size() == kMaxNodes) {
    throw ConnectionError(
        fmt::format("the cluster at {} names more than {} nodes", describe(), kMaxNodes));
  }
  RedisEndpoint endpoint = seeds_.front();
  endpoint.transport = RedisEndpoint::Transport::kTcp;
  endpoint.host = cluster_node.host;
  endpoint.port = cluster_node.port;
  endpoint.socket_path.clear();
  endpoint.db = 0;
  ConnectOptions connect = options_.connect;
  connect.readonly = replica;
  nodes_.push_back(std::make_unique<Node>(
      Node{endpoint, replica,
           std::make_unique<ConnectionPool>(endpoint, options_.connections_per_node, connect)}));
  return nodes_.size() - 1;
}

void Client::load_topology(Connection& conn, std::string_view asked_host) {
  const int64_t asked_ms = now_ms();
  const Reply slots = conn.command({"CLUSTER", "SLOTS"});
  if (slots.is_error()) {
    throw ConnectionError(
        fmt::format("CLUSTER SLOTS on {} failed: {}", conn.endpoint().describe(), slots.str()));
  }
  SlotMap map;
  try {
    map = SlotMap::from_cluster_slots(slots.raw(), asked_host);
  } catch (const std::invalid_argument& e) {
    throw ConnectionError(
        fmt::format("CLUSTER SLOTS on {}: {}", conn.endpoint().describe(), e.what()));
  }
  auto topology = std::make_shared<Topology>();
  for (const SlotMap::Range& range : map.ranges()) {
    Topology::Range nodes;
    nodes.primary = node_index(range.primary, false);
    for (const ClusterNode& replica : range.replicas) {
      nodes.replicas.push_back(node_index(replica, true));
    }
    nodes.slots = range.last - range.first + 1;
    const auto index = static_cast<uint16_t>(topology->ranges.size());
    topology->ranges.push_back(std::move(nodes));
    for (uint32_t slot = range.first; slot <= range.last; ++slot) {
      topology->slot_range[slot] = index;
    }
    if (std::find(topology->primaries.begin(), topology->primaries.end(),
                  topology->ranges.back().primary) == topology->primaries.end()) {
      topology->primaries.push_back(topology->ranges.back().primary);
    }
  }
  if (topology->primaries.empty()) {
    throw ConnectionError(
        fmt::format("the cluster at {} serves no slot yet", conn.endpoint().describe()));
  }
  size_t listed_replicas = 0;
  std::vector<ConnectionPool*> unnamed;  // nodes (in a role) the new map does not name
  {
    std::lock_guard lock(mutex_);
    std::vector<bool> named(nodes_.size());  // every index in the map is below it
    for (const Topology::Range& range : topology->ranges) {
      named[range.primary] = true;
      for (const size_t index : range.replicas) named[index] = true;
      listed_replicas += range.replicas.size();
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (!named[i]) unnamed.push_back(nodes_[i]->pool.get());
    }
    topology_ = std::move(topology);
    if (options_.read_from != ReadFrom::kPrimary) {
      const int64_t now = now_ms();
      const int64_t since = replica_missing_since_ms_.load(std::memory_order_relaxed);
      if (listed_replicas >= most_replicas_listed_ ||
          (since != 0 && now - since >= kReplicaWait.count())) {
        most_replicas_listed_ = listed_replicas;
        replica_missing_since_ms_.store(0, std::memory_order_relaxed);
      } else if (since == 0) {
        replica_missing_since_ms_.store(now, std::memory_order_relaxed);
      }
    }
  }
  // Their idle connections would stay open for nothing.
  for (ConnectionPool* pool : unnamed) pool->close_idle();
  spdlog::debug("cluster map from {}: {} slot range(s), {} replica(s) listed",
                conn.endpoint().describe(), map.ranges().size(), listed_replicas);
  // Counted last: a GetRouter that sees the count change finds the new map in place.
  map_asked_ms_.store(asked_ms);
  refreshes_.fetch_add(1, std::memory_order_relaxed);
  last_refresh_ms_.store(now_ms(), std::memory_order_relaxed);
}

void Client::refresh_topology() {
  reload_topology(now_ms());
}

void Client::reload_topology(int64_t asked_since_ms) {
  topology();  // found first, if it was not yet
  if (!cluster_) return;
  std::lock_guard reloading(refresh_mutex_);
  // Checked after waiting, so callers that stalled together load the map once.
  if (map_asked_ms_.load() >= asked_since_ms) return;
  if (failed_reload_began_ms_ >= asked_since_ms) throw ConnectionError(failed_reload_error_);
  const int64_t began_ms = now_ms();
  // Every node known, primaries first, then the seeds: any one that answers will do. Nodes
  // marked down go last (a host that is gone can take a whole connect timeout to fail).
  std::vector<RedisEndpoint> candidates;
  std::vector<RedisEndpoint> marked_down;
  {
    const auto current = topology();
    const int64_t now = now_ms();
    std::lock_guard lock(mutex_);
    const auto add = [&](size_t index) {
      (down(index, now) ? marked_down : candidates).push_back(nodes_[index]->endpoint);
    };
    for (const size_t p : current->primaries) add(p);
    for (size_t i = 0; i < nodes_.size(); ++i) add(i);
  }
  candidates.insert(candidates.end(), seeds_.begin(), seeds_.end());
  candidates.insert(candidates.end(), marked_down.begin(), marked_down.end());
  std::string last_error = "no node known";
  for (const RedisEndpoint& endpoint : candidates) {
    try {
      Connection conn(endpoint, options_.connect);
      load_topology(
          conn, endpoint.transport == RedisEndpoint::Transport::kTcp ? endpoint.host : "127.0.0.1");
      return;
    } catch (const ConnectionError& e) {
      last_error = e.what();
    } catch (const ReplyError& e) {
      last_error = e.what();
    }
  }
  failed_reload_began_ms_ = began_ms;
  failed_reload_error_ =
      fmt::format("no node of the cluster at {} answers: {}", describe(), last_error);
  throw ConnectionError(failed_reload_error_);
}

void Client::refresh_topology_in_retry() {
  if (!cluster_) return;
  const int64_t asked_since = now_ms() - kRefreshInterval.count();
  if (map_asked_ms_.load() >= asked_since) return;
  try {
    reload_topology(asked_since);
  } catch (const ConnectionError& e) {
    spdlog::debug("{}", e.what());
  }
}

bool Client::down(size_t index, int64_t now) const {
  return down_until_ms_[index].load(std::memory_order_relaxed) > now;
}

void Client::mark_down(size_t index) {
  if (index >= kMaxNodes) return;
  const int64_t failed_ms = now_ms();
  const bool was_down = down(index, failed_ms);
  // Marked before the map is reloaded, so that the reload asks it last: a node that hangs
  // (accepts, never answers) would cost a second I/O timeout, every reader waiting behind it.
  down_until_ms_[index].store(failed_ms + kNodeDownFor.count(), std::memory_order_relaxed);
  if (!was_down) {
    // Reads routed around it go by the map's word on the shard's other copies, and a map asked
    // for before the failure may have their roles wrong: a failover since then left a "primary"
    // that is a replica now and answers MOVED to the node that just failed (every read of the
    // shard then waited for the next promotion, in bench/cluster_soak.py). One asked for after
    // it is loaded first (once, however many callers saw the failure).
    try {
      reload_topology(failed_ms);
    } catch (const ConnectionError& e) {
      spdlog::debug("{}", e.what());
    }
    spdlog::debug("{} does not answer: reads of its shard go to its other copies for {} ms",
                  describe_node(index), kNodeDownFor.count());
  }
  down_until_ms_[index].store(now_ms() + kNodeDownFor.count(), std::memory_order_relaxed);
}

void Client::mark_up(size_t index) {
  if (index >= kMaxNodes) return;
  // Read first: every reply clears them, and most find nothing to clear (no shared write).
  if (down_until_ms_[index].load(std::memory_order_relaxed) != 0) {
    down_until_ms_[index].store(0, std::memory_order_relaxed);
  }
  if (unanswered_[index].load(std::memory_order_relaxed) &&
      unanswered_[index].exchange(false, std::memory_order_relaxed)) {
    unanswered_count_.fetch_sub(1, std::memory_order_relaxed);
    spdlog::info("{} answers again", describe_node(index));
  }
}

void Client::mark_unanswered(std::span<const size_t> nodes, std::chrono::milliseconds budget) {
  for (const size_t index : nodes) {
    if (index >= kMaxNodes || unanswered_[index].exchange(true, std::memory_order_relaxed)) {
      continue;
    }
    unanswered_count_.fetch_add(1, std::memory_order_relaxed);
    spdlog::error(
        "{} did not answer within {} ms; reads from it are tried once until it answers "
        "again",
        describe_node(index), budget.count());
  }
}

void Client::refresh_if_stale() {
  if (!cluster_) return;
  int64_t last = last_refresh_ms_.load(std::memory_order_relaxed);
  const int64_t now = now_ms();
  const bool replica_missing = replica_missing_since_ms_.load(std::memory_order_relaxed) != 0;
  if (now - last < (replica_missing ? kStaleTopologyMissingReplica : kStaleTopology).count()) {
    return;
  }
  if (!last_refresh_ms_.compare_exchange_strong(last, now)) return;  // another caller does it
  try {
    refresh_topology();
  } catch (const ConnectionError& e) {
    spdlog::debug("{}", e.what());
  }
}

void Client::patch_slot(uint32_t slot, size_t node) {
  std::lock_guard lock(mutex_);
  auto patched = std::make_shared<Topology>(*topology_);
  const auto index = static_cast<uint16_t>(patched->ranges.size());
  patched->ranges.push_back({node, {}, 1});
  patched->slot_range[slot] = index;
  if (std::find(patched->primaries.begin(), patched->primaries.end(), node) ==
      patched->primaries.end()) {
    patched->primaries.push_back(node);
  }
  topology_ = std::move(patched);
}

size_t Client::route_primary(std::string_view key) {
  const auto current = topology();
  if (key.empty()) return current->primaries.front();
  const Topology::Range* range = current->range_of(key_slot(key));
  return range ? range->primary : kNoNode;
}

Client::Route Client::route_read_known(std::string_view key) {
  {
    std::lock_guard lock(mutex_);
    if (!topology_) return {};
  }
  return route_read(key);
}

Client::Route Client::route_read(std::string_view key) {
  return route_read_avoiding(key, {});
}

Client::Route Client::route_read_avoiding(std::string_view key, std::span<const size_t> failed) {
  const auto current = topology();
  const Topology::Range* range = current->range_of(key_slot(key));
  if (!range) return {};
  Route route{range->primary, range->primary};
  const size_t copies = range->replicas.size();
  if (copies == 0) return route;
  const int64_t now = now_ms();
  const auto usable = [&](size_t index) {
    return !down(index, now) && std::find(failed.begin(), failed.end(), index) == failed.end();
  };
  // The copies in the order tried: k < copies is a replica, k == copies the primary.
  const auto copy = [&](size_t k) { return k < copies ? range->replicas[k] : range->primary; };
  if (options_.read_from == ReadFrom::kPrimary) {
    if (usable(range->primary)) return route;
    // Its replicas, in turn (the primary's readers spread over them), while it is down.
    const uint64_t turn = replica_turn_.fetch_add(1, std::memory_order_relaxed);
    for (size_t k = 0; k < copies; ++k) {
      if (usable(copy((turn + k) % copies))) {
        route.node = copy((turn + k) % copies);
        break;
      }
    }
    return route;
  }
  const uint64_t turn = replica_turn_.fetch_add(1, std::memory_order_relaxed);
  // kReplica: the replicas in turn, then the primary; kAny: every copy in turn.
  const size_t cycle = options_.read_from == ReadFrom::kReplica ? copies : copies + 1;
  const size_t first = turn % cycle;
  route.node = copy(first);
  for (size_t k = 0; k <= copies; ++k) {
    const size_t candidate = k < cycle ? copy((first + k) % cycle) : range->primary;
    if (usable(candidate)) {
      route.node = candidate;
      break;
    }
  }
  return route;
}

std::vector<size_t> Client::read_nodes_known() {
  std::shared_ptr<const Topology> current;
  {
    std::lock_guard lock(mutex_);
    current = topology_;
  }
  std::vector<size_t> nodes;
  if (!current) return nodes;
  for (const Topology::Range& range : current->ranges) {
    // As route_read() picks: the primary unless only replicas are read and the range has one.
    if (options_.read_from != ReadFrom::kReplica || range.replicas.empty()) {
      nodes.push_back(range.primary);
    }
    if (options_.read_from != ReadFrom::kPrimary) {
      nodes.insert(nodes.end(), range.replicas.begin(), range.replicas.end());
    }
  }
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  return nodes;
}

std::unique_ptr<Connection> Client::connect_node(size_t index) {
  const Node& n = node(index);
  ConnectOptions connect = options_.connect;
  connect.readonly = n.replica;
  return std::make_unique<Connection>(n.endpoint, connect);
}

std::string Client::address_of(size_t index) const {
  return node_address(node(index).endpoint);
}

std::string Client::describe_node(size_t index) const {
  return node(index).endpoint.describe();
}

bool Client::is_replica(size_t index) const {
  return node(index).replica;
}

Reply Client::command(std::initializer_list<std::string_view> argv) {
  return command(std::span<const std::string_view>(argv.begin(), argv.size()));
}

Reply Client::command(std::span<const std::string_view> argv) {
  return run(argv, command_key(argv), options_.retry_budget);
}

Reply Client::run(std::span<const std::string_view> argv, std::string_view key,
                  std::chrono::milliseconds budget) {
  Backoff backoff(budget);
  size_t ask_node = kNoNode;    // set by ASK: the next try goes there, after ASKING
  size_t moved_node = kNoNode;  // set by MOVED when the map could not be reloaded
  int redirects = 0;
  std::string last_error;
  const uint32_t slot = key.empty() ? 0 : key_slot(key);
  for (;;) {
    size_t target = ask_node != kNoNode     ? ask_node
                    : moved_node != kNoNode ? moved_node
                                            : route_primary(key);
    const bool asking = ask_node != kNoNode;
    ask_node = kNoNode;
    moved_node = kNoNode;
    if (target == kNoNode) {
      last_error = fmt::format("no node serves slot {} now", slot);
      refresh_topology_in_retry();
      if (!backoff.wait()) break;
      continue;
    }
    Reply reply;
    try {
      ConnectionPool::Lease lease = node(target).pool->acquire();
      if (asking) {
        lease->append({"ASKING"});
        lease->append(argv);
        const Reply asked = lease->read_reply();
        reply = lease->read_reply();
      } else {
        reply = lease->command(argv);
      }
    } catch (const ConnectionError& e) {
      last_error = e.what();
      mark_down(target);
      refresh_topology_in_retry();
      if (!backoff.wait()) break;
      continue;
    }
    mark_up(target);
    if (!reply.is_error()) return reply;
    const std::string_view message = reply.str();
    if (const std::optional<Redirect> redirect = parse_redirect(message)) {
      redirects_.fetch_add(1, std::memory_order_relaxed);
      if (++redirects > kMaxRedirects) {
        throw ConnectionError(fmt::format(
            "Redis at {}: more than {} redirections for one command (last: {}); the cluster's "
            "nodes disagree about slot {}",
            describe(), kMaxRedirects, log_text(message), redirect->slot));
      }
      const size_t to = node_index(redirect->node, false);
      if (redirect->kind == Redirect::Kind::kAsk) {
        ask_node = to;
        continue;
      }
      patch_slot(redirect->slot, to);
      if (now_ms() - last_refresh_ms_.load(std::memory_order_relaxed) >= kRefreshInterval.count()) {
        try {
          refresh_topology();
        } catch (const ConnectionError&) {
          moved_node = to;
        }
      }
      continue;
    }
    if (is_transient_reply(message)) {
      last_error = fmt::format("Redis at {} is not ready: {}", describe_node(target), message);
      if (message.starts_with("CLUSTERDOWN")) refresh_topology_in_retry();
      if (!backoff.wait()) break;
      continue;
    }
    return reply;
  }
  throw ConnectionError(last_error);
}

ConnectionPool::Lease Client::lease_for_key(std::string_view key) {
  size_t target = route_primary(key);
  if (target == kNoNode) {
    refresh_topology();
    target = route_primary(key);
    if (target == kNoNode) {
      throw ConnectionError(
          fmt::format("Redis at {}: no node serves slot {} now", describe(), key_slot(key)));
    }
  }
  return node(target).pool->acquire();
}

void Client::for_each_primary(const std::function<void(Connection&)>& fn) {
  Backoff backoff(options_.retry_budget);
  for (;;) {
    try {
      const auto current = topology();
      for (const size_t primary : current->primaries) {
        ConnectionPool::Lease lease = node(primary).pool->acquire();
        fn(*lease);
      }
      return;
    } catch (const ConnectionError& e) {
      if (backoff.expired()) throw;
      spdlog::debug("{}; trying every primary again", e.what());
      refresh_topology_in_retry();
      if (!backoff.wait()) throw;
    }
  }
}

void Client::pipeline_views(std::span<const std::vector<std::string_view>> commands, size_t window,
                            const std::function<void(size_t, Reply&)>& on_reply) {
  std::unordered_map<size_t, std::vector<size_t>> by_node;
  std::vector<size_t> again;  // run alone through command()
  for (size_t i = 0; i < commands.size(); ++i) {
    const size_t target = route_primary(command_key(commands[i]));
    if (target == kNoNode) {
      again.push_back(i);
    } else {
      by_node[target].push_back(i);
    }
  }
  for (auto& [target, indices] : by_node) {
    size_t delivered = 0;
    try {
      ConnectionPool::Lease lease = node(target).pool->acquire();
      window = std::max<size_t>(window, 1);
      size_t sent = 0;
      while (delivered < indices.size()) {
        while (sent < indices.size() && sent - delivered < window) {
          lease->append(std::span<const std::string_view>(commands[indices[sent]]));
          ++sent;
        }
        Reply reply = lease->read_reply();
        const size_t index = indices[delivered++];
        if (reply.is_error() && must_retry_reply(reply.str())) {
          again.push_back(index);
        } else {
          on_reply(index, reply);
        }
      }
    } catch (const ConnectionError& e) {
      if (!cluster_ && options_.retry_budget.count() == 0) throw;
      spdlog::debug("pipeline to {} broke ({}); running the rest one by one", describe_node(target),
                    e.what());
      again.insert(again.end(), indices.begin() + static_cast<ptrdiff_t>(delivered), indices.end());
    }
  }
  for (const size_t index : again) {
    Reply reply = command(std::span<const std::string_view>(commands[index]));
    on_reply(index, reply);
  }
}

ValueReply Client::get_one(const std::string& key, std::chrono::milliseconds retry_budget) {
  const std::string_view argv[] = {"GET", key};
  const Reply reply = run(argv, key, retry_budget);
  ValueReply value;
  if (reply.is_nil()) {
    value.kind = ValueReply::Kind::kNil;
  } else if (reply.is_error()) {
    value.kind = ValueReply::Kind::kError;
    value.error = std::string(reply.str());
  } else {
    value.kind = ValueReply::Kind::kValue;
    const std::string_view bytes = reply.str();
    value.size = bytes.size();
    value.bytes = new_value_buffer(std::max<size_t>(bytes.size(), 1));
    std::memcpy(value.bytes.get(), bytes.data(), bytes.size());
  }
  return value;
}

std::vector<ValueReply> Client::get_values(std::span<const std::string> keys, size_t window,
                                           std::chrono::milliseconds retry_budget,
                                           uint64_t* retries) {
  refresh_if_stale();
  std::vector<ValueReply> replies(keys.size());
  // Ascending always (retry is sorted too), so a pending as long as keys is every key in order.
  std::vector<size_t> pending(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) pending[i] = i;
  Backoff backoff(retry_budget);
  // Nodes (in a role) that did not answer, or answered "not now", during this call: a key is
  // asked of another copy of its shard while one has not failed (route_read_avoiding). Per
  // node, not "every replica": a map loaded meanwhile may name a new copy (a replica a
  // failover left serving while its primary, the node that failed, waits to be replaced).
  std::vector<size_t> failed_nodes;
  const auto failed = [&](size_t node) {
    return std::find(failed_nodes.begin(), failed_nodes.end(), node) != failed_nodes.end();
  };
  const auto add_failed = [&](size_t node) {
    if (!failed(node)) failed_nodes.push_back(node);
  };
  std::string last_error;
  bool trying_once = retry_budget.count() == 0;
  std::vector<size_t> from_primary;  // a replica's nil, a redirection: asked alone
  std::vector<size_t> retry;
  // GETs `group` (the keys of `indices`) from node `target` and settles each reply.
  const auto fetch = [&](size_t target, std::span<const std::string> group,
                         std::span<const size_t> indices) {
    std::vector<ValueReply> got;
    const Clock::time_point asked = Clock::now();
    try {
      ConnectionPool::Lease lease = node(target).pool->acquire();
      const Clock::time_point leased = Clock::now();
      got = lease->get_values(group, window);
      // Where a slow read waited (a soak's stalls of a second left no other trace): for a
      // connection of the node's pool, or for the node's replies.
      if (const Clock::time_point now = Clock::now(); now - asked > kSlowGets) {
        spdlog::debug(
            "{} GET(s) of {} took {} ms ({} ms waiting for a connection)", group.size(),
            describe_node(target),
            std::chrono::duration_cast<std::chrono::milliseconds>(now - asked).count(),
            std::chrono::duration_cast<std::chrono::milliseconds>(leased - asked).count());
      }
    } catch (const ConnectionError& e) {
      last_error = e.what();
      add_failed(target);
      mark_down(target);
      retry.insert(retry.end(), indices.begin(), indices.end());
      return;
    }
    mark_up(target);
    const bool replica = node(target).replica;
    for (size_t k = 0; k < indices.size(); ++k) {
      ValueReply& reply = got[k];
      const size_t i = indices[k];
      if (reply.kind == ValueReply::Kind::kError && is_transient_reply(reply.error)) {
        last_error =
            fmt::format("Redis at {} is not ready: {}", describe_node(target), reply.error);
        add_failed(target);  // another copy may be ready (a replica still loading its data)
        retry.push_back(i);
      } else if ((reply.kind == ValueReply::Kind::kError && parse_redirect(reply.error)) ||
                 (reply.kind == ValueReply::Kind::kNil && replica)) {
        if (reply.kind == ValueReply::Kind::kError) {
          redirects_.fetch_add(1, std::memory_order_relaxed);
        }
        from_primary.push_back(i);
      } else {
        replies[i] = std::move(reply);
      }
    }
  };
  while (!pending.empty()) {
    try {
      topology(retry_budget);  // a client that never reached Redis finds it first
    } catch (const ConnectionError& e) {
      last_error = e.what();
      if (!backoff.wait()) throw;
      if (retries) ++*retries;
      continue;
    }
    from_primary.clear();
    retry.clear();
    // Where each pending key goes (kNoNode: no node serves its slot now), and whether one node
    // takes them all: a single server, or every key on one slot owner.
    std::vector<size_t> targets(pending.size(), kNoNode);
    size_t only = kNoNode;
    bool one_node = true;
    for (size_t k = 0; k < pending.size(); ++k) {
      const size_t i = pending[k];
      const Route route = route_read_avoiding(keys[i], failed_nodes);
      if (route.node == kNoNode) {
        retry.push_back(i);
        last_error =
            fmt::format("Redis at {}: no node serves slot {} now", describe(), key_slot(keys[i]));
        continue;
      }
      targets[k] = route.node;
      if (only == kNoNode) only = targets[k];
      one_node = one_node && targets[k] == only;
      if (!trying_once && unanswered_count_.load(std::memory_order_relaxed) != 0 &&
          route.node < kMaxNodes && unanswered_[route.node].load(std::memory_order_relaxed)) {
        trying_once = true;
        backoff = Backoff(std::chrono::milliseconds{0});
      }
    }
    if (one_node && retry.empty() && pending.size() == keys.size()) {
      fetch(only, keys, pending);  // the caller's keys as they are: no copies, no grouping
    } else {
      std::unordered_map<size_t, std::vector<size_t>> by_node;
      for (size_t k = 0; k < pending.size(); ++k) {
        if (targets[k] != kNoNode) by_node[targets[k]].push_back(pending[k]);
      }
      for (auto& [target, indices] : by_node) {
        std::vector<std::string> group;
        group.reserve(indices.size());
        for (const size_t i : indices) group.push_back(keys[i]);
        fetch(target, group, indices);
      }
    }
    if (!from_primary.empty()) {
      spdlog::debug("{} GET(s) asked of the primary alone (a replica's nil or a redirection)",
                    from_primary.size());
    }
    for (const size_t i : from_primary) replies[i] = get_one(keys[i], retry_budget);
    if (retry.empty()) break;
    refresh_topology_in_retry();
    // Asked again at once when every key has a copy that has not failed it yet (each such
    // round adds a failed node, so there are at most as many as copies); else after a wait.
    const bool elsewhere = std::all_of(retry.begin(), retry.end(), [&](size_t i) {
      const size_t to = route_read_avoiding(keys[i], failed_nodes).node;
      return to != kNoNode && !failed(to);
    });
    spdlog::debug("{} GET(s) asked again {}: {}", retry.size(),
                  elsewhere ? "at once, of other copies" : "after a wait", last_error);
    if (!elsewhere && !backoff.wait()) {
      if (!trying_once) mark_unanswered(failed_nodes, retry_budget);
      throw ConnectionError(last_error);
    }
    if (retries) ++*retries;
    std::sort(retry.begin(), retry.end());
    pending.swap(retry);  // retry is cleared at the top of the next round
  }
  return replies;
}

bool Client::answers_within(std::chrono::milliseconds limit) {
  std::vector<RedisEndpoint> candidates;
  {
    std::lock_guard lock(mutex_);
    if (topology_) {
      for (const size_t p : topology_->primaries) candidates.push_back(nodes_[p]->endpoint);
    }
  }
  if (candidates.empty()) candidates = seeds_;
  for (const RedisEndpoint& endpoint : candidates) {
    try {
      Connection probe(endpoint, ConnectOptions{.connect_timeout = limit, .io_timeout = limit});
      if (!probe.command({"PING"}).is_error()) return true;
    } catch (const std::exception&) {  // ConnectionError, or an AUTH refused at connect
    }
  }
  return false;
}

std::vector<NodeReport> Client::nodes() {
  const auto current = topology();
  std::vector<NodeReport> reports;
  std::unordered_map<size_t, size_t> report_of;
  auto report = [&](size_t index, bool primary) -> NodeReport& {
    if (const auto it = report_of.find(index); it != report_of.end()) return reports[it->second];
    report_of[index] = reports.size();
    const Node& n = node(index);
    reports.push_back(NodeReport{node_address(n.endpoint), primary, 0, n.pool->connects()});
    return reports.back();
  };
  for (const Topology::Range& range : current->ranges) {
    report(range.primary, true).slots += range.slots;
    for (const size_t replica : range.replicas) report(replica, false);
  }
  return reports;
}

std::string Client::primary_address(std::string_view key) {
  const size_t index = route_primary(key);
  return index == kNoNode ? std::string() : node_address(node(index).endpoint);
}

uint64_t Client::connects() const {
  std::lock_guard lock(mutex_);
  uint64_t total = 0;
  for (const auto& n : nodes_) total += n->pool->connects();
  return total;
}

// RoutedPipeline

RoutedPipeline::RoutedPipeline(Client& client) : client_(client) {}
RoutedPipeline::~RoutedPipeline() = default;

Connection& RoutedPipeline::connection(size_t node) {
  if (connections_.size() <= node) connections_.resize(node + 1);
  if (!connections_[node] || connections_[node]->broken()) {
    connections_[node] = client_.connect_node(node);
  }
  return *connections_[node];
}

void RoutedPipeline::append(std::span<const std::string_view> argv) {
  size_t target = client_.route_primary(command_key(argv));
  if (target == Client::kNoNode) {
    client_.refresh_topology();
    target = client_.route_primary(command_key(argv));
    if (target == Client::kNoNode) {
      throw ConnectionError(fmt::format("Redis at {}: no node serves the slot of '{}' now",
                                        client_.describe(), log_text(command_key(argv))));
    }
  }
  try {
    connection(target).append(argv);
  } catch (const ConnectionError&) {
    reset();
    throw;
  }
  order_.push_back(Sent{target, std::vector<std::string_view>(argv.begin(), argv.end())});
}

void RoutedPipeline::append(std::initializer_list<std::string_view> argv) {
  append(std::span<const std::string_view>(argv.begin(), argv.size()));
}

Reply RoutedPipeline::read_reply() {
  if (order_.empty()) throw std::logic_error("RoutedPipeline::read_reply with nothing appended");
  Reply reply;
  try {
    reply = connections_.at(order_.front().node)->read_reply();
  } catch (const ConnectionError&) {
    reset();
    throw;
  }
  const Sent sent = std::move(order_.front());
  order_.pop_front();
  if (reply.is_error() && must_retry_reply(reply.str())) {
    reply = client_.command(std::span<const std::string_view>(sent.argv));
  }
  return reply;
}

void RoutedPipeline::reset() {
  connections_.clear();
  order_.clear();
}

// GetRouter

struct GetRouter::NodeStream {
  size_t node = 0;
  bool replica = false;
  std::unique_ptr<Connection> connection;
  std::unique_ptr<GetStream> stream;
  struct Sent {
    uint64_t tag;
    std::string key;
    std::chrono::steady_clock::time_point at;
  };
  std::deque<Sent> sent;  // oldest first
};

GetRouter::GetRouter(Client& client) : client_(client) {}

GetRouter::~GetRouter() {
  reset();
}

GetRouter::NodeStream& GetRouter::stream(size_t node) {
  for (auto& s : streams_) {
    if (s->node == node) return *s;
  }
  auto created = std::make_unique<NodeStream>();
  created->node = node;
  try {
    created->connection = client_.connect_node(node);
  } catch (const ConnectionError&) {
    // Fetches routed from now on go to its shard's other copies.
    if (!interrupted_) client_.mark_down(node);
    throw;
  }
  created->stream = std::make_unique<GetStream>(*created->connection);
  std::lock_guard lock(streams_mutex_);
  if (interrupted_) created->connection->interrupt();
  streams_.push_back(std::move(created));
  return *streams_.back();
}

void GetRouter::connect(size_t node) {
  if (interrupted_) throw ConnectionError("the GET router was interrupted");
  try {
    stream(node);
  } catch (const ConnectionError&) {
    reset();
    throw;
  }
}

void GetRouter::send(std::span<const std::string> keys, std::span<const uint64_t> tags) {
  send(keys, tags, std::vector<size_t>(keys.size(), Client::kNoNode));
}

void GetRouter::send(std::span<const std::string> keys, std::span<const uint64_t> tags,
                     std::span<const size_t> nodes) {
  if (interrupted_) throw ConnectionError("the GET router was interrupted");
  client_.refresh_if_stale();
  close_unread_streams();
  std::unordered_map<size_t, std::vector<std::string>> by_node;
  std::unordered_map<size_t, std::vector<uint64_t>> tags_by_node;
  for (size_t i = 0; i < keys.size(); ++i) {
    Client::Route route{nodes[i], nodes[i]};
    if (route.node == Client::kNoNode) route = client_.route_read(keys[i]);
    if (route.node == Client::kNoNode) {
      client_.refresh_topology();
      route = client_.route_read(keys[i]);
      if (route.node == Client::kNoNode) {
        reset();
        throw ConnectionError(fmt::format("Redis at {}: no node serves slot {} now",
                                          client_.describe(), key_slot(keys[i])));
      }
    }
    by_node[route.node].push_back(keys[i]);
    tags_by_node[route.node].push_back(tags[i]);
  }
  try {
    for (auto& [node, group] : by_node) {
      NodeStream& s = stream(node);
      s.replica = route_is_replica(node);
      // After connecting to this node (a round trip or more when far), before writing: a thread
      // preempted around the write then lengthens its sample, which the smallest-latency
      // estimates ignore, instead of shortening it (12 ms measured through a 20 ms proxy under
      // CI's load when stamped after the write).
      const auto at = std::chrono::steady_clock::now();
      try {
        s.stream->send(group);
      } catch (const ConnectionError&) {
        if (!interrupted_) client_.mark_down(node);
        throw;
      }
      const std::vector<uint64_t>& group_tags = tags_by_node[node];
      for (size_t k = 0; k < group.size(); ++k) {
        s.sent.push_back(NodeStream::Sent{group_tags[k], std::move(group[k]), at});
      }
      outstanding_ += group.size();
    }
  } catch (const ConnectionError&) {
    reset();
    throw;
  }
}

GetRouter::Received GetRouter::receive() {
  if (outstanding_ == 0) throw std::logic_error("GetRouter::receive with no GET outstanding");
  try {
    NodeStream* ready = nullptr;
    // Bytes already read count first; then whichever socket has something.
    for (size_t k = 0; k < streams_.size() && !ready; ++k) {
      NodeStream& s = *streams_[(next_ + k) % streams_.size()];
      if (!s.sent.empty() && s.stream->buffered()) ready = &s;
    }
    if (!ready) {
      std::vector<pollfd> fds;
      std::vector<NodeStream*> owners;
      for (auto& s : streams_) {
        if (s->sent.empty()) continue;
        fds.push_back(pollfd{s->stream->fd(), POLLIN, 0});
        owners.push_back(s.get());
      }
      if (owners.size() == 1) {
        ready = owners.front();  // one node: its blocking read (with its timeout) is enough
      } else {
        const int timeout_ms = static_cast<int>(client_.options().connect.io_timeout.count());
        int n = 0;
        do {
          n = ::poll(fds.data(), fds.size(), timeout_ms);
        } while (n < 0 && errno == EINTR);
        if (n <= 0) {
          throw ConnectionError(fmt::format("no GET reply from any of {} nodes of {} within {} ms",
                                            owners.size(), client_.describe(), timeout_ms));
        }
        for (size_t k = 0; k < fds.size(); ++k) {
          const size_t at = (next_ + k) % fds.size();
          if (fds[at].revents != 0) {
            ready = owners[at];
            break;
          }
        }
      }
    }
    ++next_;
    if (interrupted_) throw ConnectionError("the GET router was interrupted");
    ValueReply reply;
    try {
      reply = ready->stream->receive();
    } catch (const ConnectionError&) {
      if (!interrupted_) client_.mark_down(ready->node);
      throw;
    }
    NodeStream::Sent sent = std::move(ready->sent.front());
    ready->sent.pop_front();
    --outstanding_;
    const bool settle = (reply.kind == ValueReply::Kind::kError && must_retry_reply(reply.error)) ||
                        (reply.kind == ValueReply::Kind::kNil && ready->replica);
    if (settle) reply = client_.get_one(sent.key, client_.options().retry_budget);
    return Received{sent.tag, std::move(reply), sent.at};
  } catch (const ConnectionError&) {
    reset();
    throw;
  }
}

void GetRouter::close_unread_streams() {
  const uint64_t refreshes = client_.topology_refreshes();
  if (refreshes == refreshes_seen_) return;
  refreshes_seen_ = refreshes;
  const std::vector<size_t> read = client_.read_nodes_known();
  std::lock_guard lock(streams_mutex_);
  std::erase_if(streams_, [&](const std::unique_ptr<NodeStream>& s) {
    if (!s->sent.empty() || std::find(read.begin(), read.end(), s->node) != read.end()) {
      return false;
    }
    s->stream.reset();  // before the connection it reads
    return true;
  });
}

bool GetRouter::route_is_replica(size_t node) const {
  return client_.is_cluster() && client_.is_replica(node);
}

void GetRouter::interrupt() {
  interrupted_ = true;
  std::lock_guard lock(streams_mutex_);
  for (auto& s : streams_) s->connection->interrupt();
}

void GetRouter::reset() {
  std::lock_guard lock(streams_mutex_);
  for (auto& s : streams_) s->stream.reset();  // before the connection it reads
  streams_.clear();
  outstanding_ = 0;
}

}  // namespace dsfs::store
