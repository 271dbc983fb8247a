// store::Client, the one way dsfs reaches Redis: the same calls on one server and on a real
// local cluster (3 primaries + 3 replicas, LocalCluster in a temp DSFS_HOME): routing by slot,
// GETs grouped per node and given back in order, MOVED and ASK while a slot moves, reads from
// replicas (a replica's nil asked of the primary), and a primary that dies mid-read.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "src/store/client.h"
#include "src/store/errors.h"
#include "src/store/local_cluster.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::store {
namespace {

using namespace std::chrono_literals;

std::string value_of(const std::string& key) {
  return "value of " + key + std::string(key.size() * 37 % 300, 'x');
}

std::vector<std::string> keys_over_slots(size_t count) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < count; ++i) keys.push_back("t:obj:" + std::to_string(i));
  return keys;
}

std::string text(const ValueReply& reply) {
  EXPECT_EQ(reply.kind, ValueReply::Kind::kValue) << reply.error;
  return reply.kind == ValueReply::Kind::kValue ? std::string(reply.bytes.get(), reply.size) : "";
}

// One field of INFO's text, e.g. "cmdstat_get" -> "calls=12,...": the calls count.
uint64_t get_calls(Connection& conn) {
  const Reply info = conn.command({"INFO", "commandstats"});
  const std::string_view s = info.str();
  const size_t at = s.find("cmdstat_get:calls=");
  if (at == std::string_view::npos) return 0;
  return std::stoull(std::string(s.substr(at + 18, 20)));
}

RedisEndpoint tcp(int port) {
  RedisEndpoint e;
  e.host = "127.0.0.1";
  e.port = port;
  return e;
}

TEST(ClientSingleServer, RoutesEverythingToTheOneServerAndKeepsTheOrder) {
  test::TestRedisServer server;
  Client client({server.endpoint()});
  EXPECT_FALSE(client.is_cluster());
  const std::vector<std::string> keys = keys_over_slots(100);
  std::vector<std::vector<std::string>> sets;
  for (const std::string& k : keys) sets.push_back({"SET", k, value_of(k)});
  size_t acknowledged = 0;
  client.pipeline(sets, 16, [&](size_t, const Reply& reply) {
    EXPECT_FALSE(reply.is_error()) << reply.str();
    ++acknowledged;
  });
  EXPECT_EQ(acknowledged, keys.size());
  const std::vector<ValueReply> got = client.get_values(keys, 8, 1s);
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  EXPECT_EQ(client.command({"GET", "t:absent"}).is_nil(), true);
  const std::vector<NodeReport> nodes = client.nodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_EQ(nodes[0].slots, kClusterSlots);
  // Reads go to the one server, whatever --read-from says.
  ASSERT_EQ(client.read_nodes_known().size(), 1u);
  EXPECT_EQ(client.read_nodes_known()[0], client.route_read(keys[0]).node);
}

TEST(ClientSingleServer, ADownServerFailsWithinTheBudgetNamingIt) {
  test::TestRedisServer server;
  Client client({server.endpoint()}, ClientOptions{.retry_budget = 300ms});
  server.stop();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<std::string> keys = {"a"};
  try {
    client.get_values(keys, 1, 300ms);
    FAIL() << "a stopped server answered";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(server.port())), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // a hang guard, not a timing
  EXPECT_THROW(client.get_values(keys, 1, 0ms), ConnectionError);
}

// get_one retries within the caller's budget, not the client's (10 s by default): a read that
// asked for 300 ms or one try does not wait the client's budget on a server that is gone.
TEST(ClientSingleServer, GetOneKeepsToTheCallersBudget) {
  test::TestRedisServer server;
  Client client({server.endpoint()});
  ASSERT_EQ(client.options().retry_budget, 10s);
  ASSERT_FALSE(client.command({"SET", "k", "v"}).is_error());
  EXPECT_EQ(text(client.get_one("k", 0ms)), "v");
  server.stop();
  for (const std::chrono::milliseconds budget : {0ms, 300ms}) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(client.get_one("k", budget), ConnectionError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, budget + 3s) << budget.count() << " ms";
  }
}

// Errors name the seed that answered, not a dead first seed; before any answered, every seed.
// Several URLs name nodes of one cluster: when a single server answers, the client refuses
// rather than sending each command to whichever answers (found by an audit: two single servers
// given together, one stopped, and datasets ended up split between them).
TEST(ClientSingleServer, SeveralSeedsThatLeadToASingleServerAreRefused) {
  test::TestRedisServer server;
  const int dead = test::free_tcp_port();
  // Whether `text` names 127.0.0.1:port (not a longer port that starts with the same digits).
  const auto names = [](const std::string& text, int port) {
    const std::string address = "127.0.0.1:" + std::to_string(port);
    const size_t at = text.find(address);
    return at != std::string::npos &&
           (at + address.size() == text.size() || !std::isdigit(text[at + address.size()]));
  };
  Client client({tcp(dead), tcp(server.port())});
  const std::string before = client.describe();
  EXPECT_TRUE(names(before, dead)) << before;
  EXPECT_TRUE(names(before, server.port())) << before;
  try {
    client.connect();
    FAIL() << "two URLs of which one is a single server were taken";
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(names(e.what(), server.port())) << e.what();
    EXPECT_NE(std::string(e.what()).find("single server"), std::string::npos) << e.what();
  }
  Client alone({tcp(server.port())});
  alone.connect();
  EXPECT_TRUE(names(alone.describe(), server.port())) << alone.describe();
}

TEST(ClientSingleServer, NoSeedAnsweringIsAClearError) {
  const int port = test::free_tcp_port();
  try {
    Client client({tcp(port)}, ClientOptions{.retry_budget = 100ms});
    client.connect();
    FAIL() << "connected to nothing";
  } catch (const ConnectionError& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(port)), std::string::npos) << e.what();
  }
  EXPECT_THROW(Client({}), std::invalid_argument);
}

TEST(ClientCommandKey, FindsTheKeyOfEachCommandDsfsSends) {
  auto key = [](std::initializer_list<std::string_view> argv) {
    return std::string(command_key(std::span<const std::string_view>(argv.begin(), argv.size())));
  };
  EXPECT_EQ(key({"GET", "k"}), "k");
  EXPECT_EQ(key({"hset", "h", "f", "v"}), "h");
  EXPECT_EQ(key({"EVALSHA", "sha", "1", "k", "arg"}), "k");
  EXPECT_EQ(key({"EVAL", "return 1", "0"}), "");
  EXPECT_EQ(key({"SCAN", "0", "MATCH", "x*"}), "");
  EXPECT_EQ(key({"info", "cluster"}), "");
  EXPECT_EQ(key({"PING"}), "");
  EXPECT_EQ(parse_read_from("replica"), ReadFrom::kReplica);
  EXPECT_THROW(parse_read_from("secondary"), std::invalid_argument);
}

// "Not now" replies, the cluster's own included, are the ones every caller retries with
// Backoff; the rest are answers.
TEST(ClientTransientReplies, ClusterDownIsRetriedLikeLoadingAndTryAgain) {
  for (const std::string_view message :
       {"LOADING Redis is loading the dataset in memory", "BUSY Redis is busy running a script",
        "MASTERDOWN Link with MASTER is down", "TRYAGAIN Multiple keys request during rehashing",
        "CLUSTERDOWN The cluster is down", "CLUSTERDOWN Hash slot not served"}) {
    EXPECT_TRUE(is_transient_reply(message)) << message;
  }
  for (const std::string_view message :
       {"ERR unknown command", "WRONGTYPE Operation against a key", "NOAUTH Authentication",
        "MOVED 3999 127.0.0.1:6381", "ASK 3999 127.0.0.1:6381", "OOM command not allowed"}) {
    EXPECT_FALSE(is_transient_reply(message)) << message;
  }
}

// The port of the replica that replicates `primary`, by asking the replicas.
int replica_of(const std::vector<int>& replicas, int primary) {
  for (const int port : replicas) {
    Connection conn(tcp(port));
    const std::string info(conn.command({"INFO", "replication"}).str());
    if (info.find("master_port:" + std::to_string(primary) + "\r") != std::string::npos) {
      return port;
    }
  }
  ADD_FAILURE() << "no replica of " << primary;
  return 0;
}

// Waits (bounded) until every node's CLUSTER SLOTS says `primary` serves `slot` with `replica`
// listed as its replica.
void wait_until_every_node_says(const std::vector<int>& nodes, uint32_t slot, int primary,
                                int replica) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    bool all = true;
    for (const int port : nodes) {
      Connection conn(tcp(port));
      const SlotMap map =
          SlotMap::from_cluster_slots(conn.command({"CLUSTER", "SLOTS"}).raw(), "127.0.0.1");
      const SlotMap::Range* range = map.find(slot);
      all = all && range && range->primary.port == primary &&
            std::any_of(range->replicas.begin(), range->replicas.end(),
                        [&](const ClusterNode& n) { return n.port == replica; });
    }
    if (all) return;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "the nodes never agreed that " << primary << " serves slot " << slot << " with "
        << replica << " as its replica";
    std::this_thread::sleep_for(50ms);
  }
}

// 3 primaries with a replica each (LocalCluster in a temp DSFS_HOME), stopped (SHUTDOWN) on
// destruction. `spoiled`: a test altered it (killed a node, changed a timeout) or failed on it,
// so the next test needs a new one.
struct SharedCluster {
  SharedCluster() : cluster(home.path()) { cluster.start(3, 1); }
  ~SharedCluster() {
    try {
      cluster.stop();  // a node a test killed is skipped: it does not run
    } catch (const std::exception& e) {
      ADD_FAILURE() << "stopping the cluster: " << e.what();
    }
  }
  SharedCluster(const SharedCluster&) = delete;
  SharedCluster& operator=(const SharedCluster&) = delete;

  test::TempDir home;
  LocalCluster cluster;
  bool spoiled = false;
};

// One cluster for the whole suite (starting one takes seconds): SetUp empties it (FLUSHALL on
// every primary, and waits until each replica has flushed too). Tests that alter the cluster
// come last in this file and call spoil(); after one of them, or after any failure, the next
// test starts a new cluster, so no test depends on the order they run in. Not thread-safe
// (gtest runs one test at a time).
class ClusterTest : public ::testing::Test {
 protected:
  static void TearDownTestSuite() { shared_.reset(); }

  void SetUp() override {
    if (shared_ && shared_->spoiled) shared_.reset();
    if (!shared_) shared_ = std::make_unique<SharedCluster>();
    const LocalClusterStatus status = shared_->cluster.status();
    for (const LocalClusterNodeStatus& node : status.nodes) {
      (node.role == "primary" ? primaries_ : replicas_).push_back(node.port);
    }
    ASSERT_EQ(primaries_.size(), 3u);
    ASSERT_EQ(replicas_.size(), 3u);
    for (const int port : primaries_) {
      Connection conn(tcp(port));
      conn.command({"FLUSHALL"}).expect_ok("FLUSHALL");
      ASSERT_EQ(conn.command({"WAIT", "1", "5000"}).integer(), 1)
          << "the replica of " << port << " did not flush";
    }
  }
  void TearDown() override {
    if (HasFailure()) spoil();  // whatever broke may still be broken: later tests start anew
  }

  static void spoil() { shared_->spoiled = true; }

  // Writes keys through a client (routed by slot) and waits until every replica has them.
  void write_keys(Client& client, const std::vector<std::string>& keys) {
    std::vector<std::vector<std::string>> sets;
    for (const std::string& k : keys) sets.push_back({"SET", k, value_of(k)});
    client.pipeline(sets, 32, [&](size_t i, const Reply& reply) {
      ASSERT_FALSE(reply.is_error()) << keys[i] << ": " << reply.str();
    });
    for (const int port : primaries_) {
      Connection conn(tcp(port));
      const Reply waited = conn.command({"WAIT", "1", "5000"});
      ASSERT_EQ(waited.integer(), 1) << "replica of " << port << " did not catch up";
    }
  }

  // write_keys() through a client of its own, then wait_until_replicas_listed().
  void write_keys_listed(const std::vector<std::string>& keys) {
    {
      Client writer({tcp(primaries_[0])});
      write_keys(writer, keys);
    }
    wait_until_replicas_listed();
  }

  // Redis lists a replica in CLUSTER SLOTS only once it has replicated something: waits
  // (bounded) until every range names one, as a client started later would see them.
  void wait_until_replicas_listed() {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    for (;;) {
      bool all = true;  // in every node's own view
      for (size_t i = 0; i < primaries_.size(); ++i) {
        for (const int asked : {primaries_[i], replicas_[i]}) {
          Connection conn(tcp(asked));
          const Reply slots = conn.command({"CLUSTER", "SLOTS"});
          const SlotMap map = SlotMap::from_cluster_slots(slots.raw(), "127.0.0.1");
          all = all && !map.ranges().empty();
          for (const SlotMap::Range& range : map.ranges()) all = all && !range.replicas.empty();
        }
      }
      if (all) return;
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "replicas never listed";
      std::this_thread::sleep_for(50ms);
    }
  }

  // The primary port serving `slot`, by asking a node.
  int owner_of(uint32_t slot) {
    Connection conn(tcp(primaries_[0]));
    const Reply slots = conn.command({"CLUSTER", "SLOTS"});
    const SlotMap map = SlotMap::from_cluster_slots(slots.raw(), "127.0.0.1");
    return map.find(slot)->primary.port;
  }

  std::string node_id(int port) {
    Connection conn(tcp(port));
    return std::string(conn.command({"CLUSTER", "MYID"}).str());
  }

  std::vector<int> every_node() const {
    std::vector<int> all = primaries_;
    all.insert(all.end(), replicas_.begin(), replicas_.end());
    return all;
  }

  // A 1 s node timeout on every node: a dead node is marked failed within seconds.
  void shorten_node_timeouts() {
    for (const int port : every_node()) {
      Connection conn(tcp(port));
      conn.command({"CONFIG", "SET", "cluster-node-timeout", "1000"}).expect_ok("CONFIG SET");
    }
  }

  // Writes `keys`, and a client reading from replicas reads them all (learning the map); then
  // slot 0's replica takes over (CLUSTER FAILOVER), the demoted node may not fail over again,
  // and the promoted node is shut down. The client's map is behind: it takes the dead node for
  // a replica and the demoted one, a live replica now, for the primary.
  std::unique_ptr<Client> client_behind_a_failover(const std::vector<std::string>& keys) {
    write_keys_listed(keys);
    const int demoted = owner_of(0);
    const int promoted = replica_of(replicas_, demoted);
    const int seed = demoted == primaries_[0] ? primaries_[1] : primaries_[0];
    auto client = std::make_unique<Client>(
        std::vector<RedisEndpoint>{tcp(seed)},
        ClientOptions{.connect = {.connect_timeout = 500ms, .io_timeout = 2000ms},
                      .read_from = ReadFrom::kReplica});
    std::vector<ValueReply> got = client->get_values(keys, 8, 5s);  // the map before
    for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
    {
      Connection conn(tcp(promoted));
      conn.command({"CLUSTER", "FAILOVER"}).expect_ok("CLUSTER FAILOVER");
    }
    wait_until_every_node_says(every_node(), 0, promoted, demoted);
    {
      Connection conn(tcp(demoted));
      conn.command({"CONFIG", "SET", "cluster-replica-no-failover", "yes"}).expect_ok("CONFIG SET");
    }
    shut_down(promoted);
    return client;
  }

  static void shut_down(int port) {
    try {
      Connection conn(tcp(port));
      conn.command({"SHUTDOWN", "NOSAVE"});
    } catch (const ConnectionError&) {  // the server closes the connection as it goes
    }
  }

  static inline std::unique_ptr<SharedCluster> shared_;
  std::vector<int> primaries_;
  std::vector<int> replicas_;
};

TEST_F(ClusterTest, DetectsTheClusterAndSpreadsKeysOverEveryPrimary) {
  const std::vector<std::string> keys = keys_over_slots(300);
  {
    Client writer({tcp(primaries_[2])});
    write_keys(writer, keys);
  }
  wait_until_replicas_listed();
  Client client({tcp(replicas_[0])});  // any node is a seed, even a replica
  ASSERT_TRUE(client.is_cluster());
  const std::vector<NodeReport> nodes = client.nodes();
  uint32_t slots = 0;
  size_t primaries = 0;
  for (const NodeReport& node : nodes) {
    slots += node.slots;
    primaries += node.primary ? 1 : 0;
  }
  EXPECT_EQ(slots, kClusterSlots);
  EXPECT_EQ(primaries, 3u);
  EXPECT_EQ(nodes.size(), 6u);
  for (const int port : primaries_) {
    Connection conn(tcp(port));
    EXPECT_GT(conn.command({"DBSIZE"}).integer(), 50) << "primary " << port << " holds too few";
  }
  const std::vector<ValueReply> got = client.get_values(keys, 8, 5s);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  // Keyed commands and {tag} keys go to one slot; a keyless one to some primary.
  EXPECT_FALSE(client.command({"HSET", "{ds}:info", "a", "1"}).is_error());
  EXPECT_FALSE(client.command({"SADD", "{ds}:gens", "1"}).is_error());
  EXPECT_EQ(client.command({"EXISTS", "{ds}:info", "{ds}:gens"}).integer(), 2);
  EXPECT_TRUE(client.command({"TIME"}).is_array());
  // Every primary is visited once.
  std::set<int> visited;
  client.for_each_primary([&](Connection& conn) { visited.insert(conn.endpoint().port); });
  EXPECT_EQ(visited, std::set<int>(primaries_.begin(), primaries_.end()));
}

TEST_F(ClusterTest, RoutedPipelineAndGetRouterReachEveryNode) {
  Client client({tcp(primaries_[1])});
  const std::vector<std::string> keys = keys_over_slots(200);
  std::vector<std::string> values;
  for (const std::string& k : keys) values.push_back(value_of(k));
  RoutedPipeline pipeline(client);
  for (size_t i = 0; i < keys.size(); ++i) {
    pipeline.append({"SET", keys[i], values[i]});
    if (pipeline.pending() > 16) {
      EXPECT_FALSE(pipeline.read_reply().is_error());
    }
  }
  while (pipeline.pending() > 0) EXPECT_FALSE(pipeline.read_reply().is_error());

  GetRouter router(client);
  std::vector<uint64_t> tags;
  for (size_t i = 0; i < keys.size(); ++i) tags.push_back(1000 + i);
  router.send(keys, tags);
  std::map<uint64_t, std::string> received;
  while (router.outstanding() > 0) {
    GetRouter::Received r = router.receive();
    received[r.tag] = text(r.reply);
  }
  ASSERT_EQ(received.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(received[1000 + i], values[i]);
}

// The prefetch engine's workers connect ahead to every node reads go to (issue 17): the nodes
// are exactly the copies --read-from allows, and a router's connect() opens a connection there.
TEST_F(ClusterTest, ReadNodesAreTheCopiesReadsGoToAndARouterConnectsToThemAhead) {
  const std::vector<std::string> keys = keys_over_slots(200);
  write_keys_listed(keys);
  const auto named = [](const std::vector<int>& ports) {
    std::set<std::string> out;
    for (const int port : ports) out.insert("127.0.0.1:" + std::to_string(port));
    return out;
  };
  std::vector<int> every = primaries_;
  every.insert(every.end(), replicas_.begin(), replicas_.end());
  const std::map<ReadFrom, std::set<std::string>> expected = {
      {ReadFrom::kPrimary, named(primaries_)},
      {ReadFrom::kReplica, named(replicas_)},
      {ReadFrom::kAny, named(every)}};
  for (const auto& [read_from, addresses] : expected) {
    SCOPED_TRACE(std::string(to_string(read_from)));
    ClientOptions options;
    options.read_from = read_from;
    Client client({tcp(primaries_[1])}, options);
    EXPECT_TRUE(client.read_nodes_known().empty());  // never finds the topology itself
    ASSERT_TRUE(client.is_cluster());
    const std::vector<size_t> nodes = client.read_nodes_known();
    std::set<std::string> found;
    for (const size_t node : nodes) found.insert(client.address_of(node));
    EXPECT_EQ(found, addresses);
    for (const std::string& key : keys) {
      const size_t node = client.route_read(key).node;
      EXPECT_NE(std::find(nodes.begin(), nodes.end(), node), nodes.end()) << key;
    }
  }
  // connect() opens one connection to each node, before any GET.
  const auto clients_of = [](int port) {
    Connection conn(tcp(port));
    const std::string info(conn.command({"INFO", "clients"}).str());
    const size_t at = info.find("connected_clients:");
    return std::stoi(info.substr(at + std::string("connected_clients:").size()));
  };
  std::map<int, int> before;
  for (const int port : every) before[port] = clients_of(port);
  ClientOptions options;
  options.read_from = ReadFrom::kAny;
  Client client({tcp(primaries_[2])}, options);
  ASSERT_TRUE(client.is_cluster());
  GetRouter router(client);
  for (const size_t node : client.read_nodes_known()) router.connect(node);
  EXPECT_EQ(router.outstanding(), 0u);
  for (const int port : every) {
    // + this router's connection; the client's own discovery may add one on its seed
    EXPECT_GE(clients_of(port), before[port] + 1) << "node " << port;
  }
}

TEST_F(ClusterTest, ReplicaReadsLeaveThePrimariesAloneAndANilIsAskedOfThePrimary) {
  {
    Client writer({tcp(primaries_[0])});
    write_keys(writer, keys_over_slots(300));
  }
  wait_until_replicas_listed();
  std::map<int, uint64_t> calls_before;
  for (const int port : primaries_) {
    Connection conn(tcp(port));
    calls_before[port] = get_calls(conn);
  }
  Client client({tcp(primaries_[0])}, ClientOptions{.read_from = ReadFrom::kReplica});
  const std::vector<std::string> keys = keys_over_slots(300);
  std::vector<ValueReply> got = client.get_values(keys, 8, 5s);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  GetRouter router(client);
  std::vector<uint64_t> tags(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) tags[i] = i;
  router.send(keys, tags);
  while (router.outstanding() > 0) {
    GetRouter::Received r = router.receive();
    EXPECT_EQ(text(r.reply), value_of(keys[r.tag]));
  }
  uint64_t replica_gets = 0;
  for (const int port : replicas_) {
    Connection conn(tcp(port));
    replica_gets += get_calls(conn);
  }
  EXPECT_GE(replica_gets, 2 * keys.size());
  for (const int port : primaries_) {
    Connection conn(tcp(port));
    EXPECT_EQ(get_calls(conn), calls_before[port]) << "primary " << port << " served GETs";
  }

  // A replica behind its primary answers nil for a key just published: the GET is asked of the
  // primary, never reported missing at once. A key that exists nowhere shows the path: the
  // primary is asked too, and nil is the answer.
  const std::string missing = "t:not-there";
  const int primary = owner_of(key_slot(missing));
  Connection primary_conn(tcp(primary));
  const uint64_t before = get_calls(primary_conn);
  const std::vector<std::string> one = {missing};
  EXPECT_EQ(client.get_values(one, 1, 5s)[0].kind, ValueReply::Kind::kNil);
  EXPECT_EQ(get_calls(primary_conn), before + 1);
}

// Runs on the shared cluster and leaves one slot on another primary, stable again: a state
// any cluster may be in, so the tests after it need no new one.
TEST_F(ClusterTest, ASlotMovingAnswersAskThenMovedAndReadsStayRight) {
  Client client({tcp(primaries_[0])});
  // Keys of one slot, so the migration moves them together.
  std::vector<std::string> keys;
  for (int i = 0; i < 6; ++i) keys.push_back("{moving}:k" + std::to_string(i));
  write_keys(client, keys);
  const uint32_t slot = key_slot(keys[0]);
  const int source = owner_of(slot);
  const int target = source == primaries_[0] ? primaries_[1] : primaries_[0];
  Connection src(tcp(source));
  Connection dst(tcp(target));
  const std::string slot_text = std::to_string(slot);
  ASSERT_FALSE(
      dst.command({"CLUSTER", "SETSLOT", slot_text, "IMPORTING", node_id(source)}).is_error());
  ASSERT_FALSE(
      src.command({"CLUSTER", "SETSLOT", slot_text, "MIGRATING", node_id(target)}).is_error());
  // Half the keys moved: the source answers ASK for those.
  for (int i = 0; i < 3; ++i) {
    const Reply migrated =
        src.command({"MIGRATE", "127.0.0.1", std::to_string(target), keys[i], "0", "5000"});
    ASSERT_FALSE(migrated.is_error()) << migrated.str();
  }
  const uint64_t before = client.redirects();
  std::vector<ValueReply> got = client.get_values(keys, 4, 5s);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  EXPECT_GT(client.redirects(), before);  // the moved ones were asked elsewhere
  EXPECT_EQ(std::string(client.command({"GET", keys[0]}).str()), value_of(keys[0]));

  // The rest moves and the slot is given to the target: MOVED, then the map is right again.
  for (int i = 3; i < 6; ++i) {
    ASSERT_FALSE(src.command({"MIGRATE", "127.0.0.1", std::to_string(target), keys[i], "0", "5000"})
                     .is_error());
  }
  const std::string target_id = node_id(target);
  for (const int port : primaries_) {
    Connection conn(tcp(port));
    ASSERT_FALSE(conn.command({"CLUSTER", "SETSLOT", slot_text, "NODE", target_id}).is_error());
  }
  got = client.get_values(keys, 4, 5s);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  const uint64_t after_moved = client.redirects();
  got = client.get_values(keys, 4, 5s);  // the map knows now: no more redirections
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  EXPECT_EQ(client.redirects(), after_moved);
}

TEST_F(ClusterTest, APrimaryThatDiesIsReplacedAndReadsGoOn) {
  spoil();  // a primary killed, node timeouts shortened
  for (const int port : primaries_) {
    Connection conn(tcp(port));
    conn.command({"CONFIG", "SET", "cluster-node-timeout", "1000"});
  }
  for (const int port : replicas_) {
    Connection conn(tcp(port));
    conn.command({"CONFIG", "SET", "cluster-node-timeout", "1000"});
  }
  Client client({tcp(primaries_[0]), tcp(primaries_[1])},
                ClientOptions{.connect = {.connect_timeout = 500ms, .io_timeout = 2000ms},
                              .retry_budget = 30s});
  Client from_replicas({tcp(primaries_[0])},
                       ClientOptions{.connect = {.connect_timeout = 500ms, .io_timeout = 2000ms},
                                     .read_from = ReadFrom::kReplica,
                                     .retry_budget = 0ms});
  const std::vector<std::string> keys = keys_over_slots(300);
  write_keys(client, keys);
  wait_until_replicas_listed();
  from_replicas.refresh_topology();
  // Kill the primary of the slots from 0 (not the seed of from_replicas).
  const int victim = owner_of(0);
  shut_down(victim);
  // With replica reads, nothing fails even before the failover (budget 0: one try).
  std::vector<ValueReply> got = from_replicas.get_values(keys, 8, 0ms);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  // Reads from primaries go on too (from the replica until it is promoted).
  got = client.get_values(keys, 8, 30s);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  // The replica is promoted: a map loaded then names it, and not the dead node, as a primary.
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  const auto dead_primary_named = [&] {
    const std::vector<NodeReport> nodes = client.nodes();
    return std::any_of(nodes.begin(), nodes.end(), [&](const NodeReport& node) {
      return node.primary && node.address == "127.0.0.1:" + std::to_string(victim);
    });
  };
  while (dead_primary_named()) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the dead primary still serves slots";
    std::this_thread::sleep_for(100ms);
    client.refresh_topology();
  }
  got = client.get_values(keys, 8, 0ms);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
}

// A failover swaps two nodes' roles: the client knows each node once per role, so reads meant
// for replicas go to the demoted node with READONLY, and not one is redirected to the promoted
// one (before, the demoted node kept its primary's connections and redirected every read).
TEST_F(ClusterTest, RolesSwappedByAFailoverAreFollowedByReplicaReads) {
  spoil();  // roles swapped
  const std::vector<std::string> keys = keys_over_slots(300);
  write_keys_listed(keys);
  Client client({tcp(primaries_[0])}, ClientOptions{.read_from = ReadFrom::kReplica});
  std::vector<ValueReply> got = client.get_values(keys, 8, 5s);  // every node known, in its role
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(text(got[i]), value_of(keys[i]));
  const int demoted = owner_of(0);
  const int promoted = replica_of(replicas_, demoted);
  {
    Connection conn(tcp(promoted));
    conn.command({"CLUSTER", "FAILOVER"}).expect_ok("CLUSTER FAILOVER");
  }
  wait_until_every_node_says(every_node(), 0, promoted, demoted);
  client.refresh_topology();

  Connection promoted_conn(tcp(promoted));
  Connection demoted_conn(tcp(demoted));
  const uint64_t promoted_before = get_calls(promoted_conn);
  const uint64_t demoted_before = get_calls(demoted_conn);
  const uint64_t redirects_before = client.redirects();
  got = client.get_values(keys, 8, 5s);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  GetRouter router(client);
  std::vector<uint64_t> tags(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) tags[i] = i;
  router.send(keys, tags);
  while (router.outstanding() > 0) {
    GetRouter::Received r = router.receive();
    EXPECT_EQ(text(r.reply), value_of(keys[r.tag]));
  }
  EXPECT_EQ(client.redirects(), redirects_before) << "reads redirected after the failover";
  EXPECT_EQ(get_calls(promoted_conn), promoted_before)
      << "the promoted node served GETs meant for replicas";
  EXPECT_GT(get_calls(demoted_conn), demoted_before) << "the demoted node served no reads";
}

// A shard whose primary died and is not replaced (its replica may not fail over): the local
// cluster's nodes are configured so that its replica still serves reads and the other shards
// still serve everything, one try each (before, every node answered CLUSTERDOWN once the dead
// primary was marked failed, until a promotion: seconds without a read).
TEST_F(ClusterTest, AShardWithoutAPrimaryLeavesReplicaReadsAndTheOtherShardsServing) {
  spoil();  // a primary killed, timeouts shortened
  shorten_node_timeouts();
  const std::vector<std::string> keys = keys_over_slots(300);
  write_keys_listed(keys);
  const int victim = owner_of(0);
  const int survivor = victim == primaries_[0] ? primaries_[1] : primaries_[0];
  const ClientOptions one_try{.connect = {.connect_timeout = 500ms, .io_timeout = 2000ms},
                              .retry_budget = 0ms};
  ClientOptions replica_one_try = one_try;
  replica_one_try.read_from = ReadFrom::kReplica;
  Client from_replicas({tcp(survivor)}, replica_one_try);
  Client from_primaries({tcp(survivor)}, one_try);
  from_replicas.refresh_topology();
  from_primaries.refresh_topology();
  std::vector<std::string> elsewhere;  // keys the victim does not serve
  for (const std::string& key : keys) {
    if (from_primaries.primary_address(key) != "127.0.0.1:" + std::to_string(victim)) {
      elsewhere.push_back(key);
    }
  }
  ASSERT_FALSE(elsewhere.empty());
  {
    Connection conn(tcp(replica_of(replicas_, victim)));
    conn.command({"CONFIG", "SET", "cluster-replica-no-failover", "yes"}).expect_ok("CONFIG SET");
  }
  shut_down(victim);
  // Until the survivor marks it failed (the state in which reads stopped before).
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    Connection conn(tcp(survivor));
    const std::string nodes(conn.command({"CLUSTER", "NODES"}).str());
    const size_t at = nodes.find("127.0.0.1:" + std::to_string(victim) + "@");
    ASSERT_NE(at, std::string::npos);
    const std::string line = nodes.substr(at, nodes.find('\n', at) - at);
    if (line.find(",fail") != std::string::npos && line.find("fail?") == std::string::npos) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "never marked failed: " << line;
    std::this_thread::sleep_for(50ms);
  }
  std::vector<ValueReply> got = from_replicas.get_values(keys, 8, 0ms);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  got = from_primaries.get_values(elsewhere, 8, 0ms);
  for (size_t i = 0; i < elsewhere.size(); ++i) EXPECT_EQ(text(got[i]), value_of(elsewhere[i]));
}

// A replica that fails leaves its shard to be read from the primary; until it is listed again
// a client reading from replicas reloads the map every second, not every ten, so a replica back
// is used again soon (and a second failure, of that primary, does not stall reads until a
// promotion: seen in bench/cluster_soak.py).
TEST_F(ClusterTest, AMapMissingAReplicaIsReloadedEverySecond) {
  spoil();  // a replica killed, timeouts shortened
  shorten_node_timeouts();
  const std::vector<std::string> keys = keys_over_slots(30);
  write_keys_listed(keys);
  Client client({tcp(primaries_[0])}, ClientOptions{.read_from = ReadFrom::kReplica});
  client.refresh_topology();
  const int victim = replicas_[0];
  shut_down(victim);
  // Until the map a client loads lists one replica fewer (the victim marked failed).
  const auto listed = [&] {
    size_t replicas = 0;
    for (const NodeReport& node : client.nodes()) replicas += node.primary ? 0 : 1;
    return replicas;
  };
  auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    client.refresh_topology();
    if (listed() == 2) break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the dead replica stayed listed";
    std::this_thread::sleep_for(100ms);
  }
  // Reads alone reload it now: two reloads within 5 s (every 10 s before).
  const uint64_t refreshes = client.topology_refreshes();
  deadline = std::chrono::steady_clock::now() + 5s;
  while (client.topology_refreshes() < refreshes + 2) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline)
        << "reads reloaded the map " << client.topology_refreshes() - refreshes
        << " time(s) in 5 s while it listed a replica fewer";
    std::vector<ValueReply> got = client.get_values(keys, 8, 5s);
    for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(text(got[i]), value_of(keys[i]));
    std::this_thread::sleep_for(50ms);
  }
}

// A client whose map is behind a failover (it still takes the promoted node for a replica)
// reads from it; that node then dies. Its replica (the demoted one, not allowed to fail over
// here) still serves reads: the retry goes there, after one to the dead node as the primary the
// reloaded map names. Before, a replica that failed sent every retry of the call to the
// primaries, and the dead primary was asked until the budget ran out.
TEST_F(ClusterTest, AReadWhoseReplicaDiesIsAskedOfTheCopyTheNewMapNames) {
  spoil();  // roles swapped, a node killed
  const std::vector<std::string> keys = keys_over_slots(300);
  const std::unique_ptr<Client> client = client_behind_a_failover(keys);
  std::vector<ValueReply> got;
  uint64_t retries = 0;
  got = client->get_values(keys, 8, 10s, &retries);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  EXPECT_LE(retries, 3u);
}

// A primary that dies and is not replaced (its replica may not fail over): reads from
// primaries go to its replica, each call one try (budget 0), and so do the GetRouter's once a
// failure has marked the primary down. Before, every read of its slots failed until a
// promotion, which here never comes (in bench/cluster_soak.py: stalls of up to 6 s per kill).
TEST_F(ClusterTest, ReadsFromPrimariesGoToTheReplicaWhileTheirPrimaryIsDown) {
  spoil();  // a primary killed
  const std::vector<std::string> keys = keys_over_slots(300);
  write_keys_listed(keys);
  const int victim = owner_of(0);
  const int replica = replica_of(replicas_, victim);
  const int seed = victim == primaries_[0] ? primaries_[1] : primaries_[0];
  Client client({tcp(seed)},
                ClientOptions{.connect = {.connect_timeout = 500ms, .io_timeout = 2000ms}});
  client.refresh_topology();
  {
    Connection conn(tcp(replica));
    conn.command({"CONFIG", "SET", "cluster-replica-no-failover", "yes"}).expect_ok("CONFIG SET");
  }
  shut_down(victim);
  Connection replica_conn(tcp(replica));
  const uint64_t replica_gets = get_calls(replica_conn);
  uint64_t retries = 0;
  std::vector<ValueReply> got = client.get_values(keys, 8, 0ms, &retries);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
  EXPECT_GT(get_calls(replica_conn), replica_gets) << "the replica served none of its shard";
  EXPECT_LE(retries, 1u) << "one retry: the keys of the dead primary, asked of its replica";
  // The router routes by the client: a send that meets the dead node marks it down (the
  // router is then empty, its fetches given up), and sends after it go to the replica.
  GetRouter router(client);
  std::vector<uint64_t> tags(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) tags[i] = i;
  bool read_all = false;
  for (int attempt = 0; attempt < 5 && !read_all; ++attempt) {
    try {
      router.send(keys, tags);
      size_t received = 0;
      while (router.outstanding() > 0) {
        GetRouter::Received r = router.receive();
        EXPECT_EQ(text(r.reply), value_of(keys[r.tag]));
        ++received;
      }
      read_all = received == keys.size();
    } catch (const ConnectionError&) {
    }
  }
  EXPECT_TRUE(read_all) << "the router never read past the dead primary";
}

// A primary that hangs (SIGSTOP: it accepts connections and answers nothing) costs a read of its
// shard one I/O timeout, then its replica answers. Before, the failure reloaded the map asking the
// primaries first, the hung one among them, for a second I/O timeout (20 s in a mount by default,
// with every reader of the mount stalled behind it; found by an audit).
TEST_F(ClusterTest, AHungPrimaryCostsAReadOfItsShardOneIoTimeoutNotTwo) {
  spoil();  // a node paused
  const std::vector<std::string> keys = keys_over_slots(300);
  write_keys_listed(keys);
  const int victim = owner_of(0);  // the map lists it first among the primaries (slot order)
  const int seed = victim == primaries_[0] ? primaries_[1] : primaries_[0];
  constexpr auto kIoTimeout = 3000ms;
  Client client({tcp(seed)},
                ClientOptions{.connect = {.connect_timeout = 500ms, .io_timeout = kIoTimeout}});
  client.refresh_topology();
  std::vector<std::string> victim_keys;
  for (const std::string& key : keys) {
    if (client.primary_address(key) == "127.0.0.1:" + std::to_string(victim)) {
      victim_keys.push_back(key);
    }
  }
  ASSERT_FALSE(victim_keys.empty());
  int pid = 0;
  for (const LocalClusterNodeStatus& node : shared_->cluster.status().nodes) {
    if (node.port == victim) pid = node.pid;
  }
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  const auto began = std::chrono::steady_clock::now();
  std::vector<ValueReply> got;
  try {
    got = client.get_values(victim_keys, 8, 20s);
  } catch (...) {
    ::kill(pid, SIGCONT);
    throw;
  }
  const auto waited = std::chrono::steady_clock::now() - began;
  ::kill(pid, SIGCONT);
  for (size_t i = 0; i < victim_keys.size(); ++i) {
    EXPECT_EQ(text(got[i]), value_of(victim_keys[i]));
  }
  // One I/O timeout and the replica's answer; two timeouts would be 6 s.
  EXPECT_LT(waited, kIoTimeout * 5 / 3)
      << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() << " ms";
}

// Readers stalled on a shard with no copy left each retry within their budget; the map is
// loaded at most about once per 200 ms between them all, not by each reader at each retry
// (before: about 16 readers x 5 retries, each on a fresh connection).
TEST_F(ClusterTest, ReadersStalledOnADeadShardReloadTheMapTogether) {
  spoil();  // a shard killed
  const std::vector<std::string> keys = keys_over_slots(300);
  write_keys_listed(keys);
  const int victim = owner_of(0);
  const int victim_replica = replica_of(replicas_, victim);
  const int seed = victim == primaries_[0] ? primaries_[1] : primaries_[0];
  Client client({tcp(seed)},
                ClientOptions{.connect = {.connect_timeout = 500ms, .io_timeout = 2000ms}});
  std::vector<std::string> dead_keys;
  for (const std::string& key : keys) {
    if (client.primary_address(key) == "127.0.0.1:" + std::to_string(victim)) {
      dead_keys.push_back(key);
    }
  }
  ASSERT_FALSE(dead_keys.empty());
  shut_down(victim_replica);
  shut_down(victim);
  const uint64_t refreshes = client.topology_refreshes();
  constexpr int kReaders = 16;
  std::atomic<int> failed{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&] {
      try {
        client.get_values(dead_keys, 8, 1500ms);
      } catch (const ConnectionError&) {
        ++failed;
      }
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(failed.load(), kReaders) << "a read of a shard with no copy left succeeded";
  // 1.5 s of retries: about 8 reloads at one per 200 ms, with room for CI's load.
  EXPECT_LE(client.topology_refreshes() - refreshes, 16u)
      << kReaders << " readers reloaded the map " << client.topology_refreshes() - refreshes
      << " times in 1.5 s";
}

// A client whose map is behind a failover (it takes the promoted node for a replica and the
// demoted one for the primary) sees the promoted node die, through the prefetch engine's
// router. Reads routed around the dead node from then on go by a map loaded after the failure:
// the demoted node, a replica now, serves them on one try. Before, they went by the old map to
// the demoted node as a primary, which answered MOVED to the dead node, and every read of the
// shard waited for the next promotion (bench/cluster_soak.py: stalls of 4-5 s in replica
// mounts).
TEST_F(ClusterTest, ReadsRoutedAroundAFailedNodeGoByAMapLoadedAfterTheFailure) {
  spoil();  // roles swapped, a node killed
  const std::vector<std::string> keys = keys_over_slots(300);
  const std::unique_ptr<Client> client = client_behind_a_failover(keys);
  std::vector<ValueReply> got;
  // The router meets the dead node first (it routes there by the old map).
  GetRouter router(*client);
  std::vector<uint64_t> tags(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) tags[i] = i;
  EXPECT_THROW(
      {
        router.send(keys, tags);
        while (router.outstanding() > 0) router.receive();
      },
      ConnectionError);
  // Then a read, one try.
  got = client->get_values(keys, 8, 0ms);
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(text(got[i]), value_of(keys[i]));
}

}  // namespace
}  // namespace dsfs::store
