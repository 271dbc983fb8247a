// Redis Cluster's key space as a client routes it: slots of keys (the spec's test vectors), the
// redirections nodes answer with, and the slot map of a real three-node cluster.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "src/store/cluster_slots.h"
#include "src/store/connection.h"
#include "tests/unit/support/test_cluster.h"

namespace dsfs::store {
namespace {

TEST(ClusterSlots, Crc16IsXmodem) {
  EXPECT_EQ(crc16("123456789"), 0x31C3);  // the check value the cluster spec gives
  EXPECT_EQ(crc16(""), 0);
}

TEST(ClusterSlots, KeySlotsAndHashTagsFollowTheSpec) {
  EXPECT_EQ(key_slot("foo"), 12182u);
  EXPECT_EQ(key_slot("bar"), 5061u);
  EXPECT_EQ(hash_tag("{user1000}.following"), "user1000");
  EXPECT_EQ(key_slot("{user1000}.following"), key_slot("{user1000}.followers"));
  EXPECT_EQ(hash_tag("foo{}{bar}"), "foo{}{bar}");  // an empty tag: the whole key
  EXPECT_EQ(hash_tag("foo{{bar}}zap"), "{bar");     // from the first '{' to the first '}'
  EXPECT_EQ(hash_tag("foo{bar}{zap}"), "bar");
  EXPECT_EQ(hash_tag("no tag}{"), "no tag}{");
  for (const std::string key : {"", "a", "dsfs:imagenet:3:o:123456", "\xff\x00\x80"}) {
    EXPECT_LT(key_slot(key), kClusterSlots);
  }
}

TEST(ClusterSlots, RedirectionsAreParsedAndAnythingElseIsNot) {
  const auto moved = parse_redirect("MOVED 3999 127.0.0.1:6381");
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->kind, Redirect::Kind::kMoved);
  EXPECT_EQ(moved->slot, 3999u);
  EXPECT_EQ(moved->node, (ClusterNode{"127.0.0.1", 6381, ""}));
  const auto ask = parse_redirect("ASK 0 redis-7.example:7000");
  ASSERT_TRUE(ask);
  EXPECT_EQ(ask->kind, Redirect::Kind::kAsk);
  EXPECT_EQ(ask->node.host, "redis-7.example");
  const auto v6 = parse_redirect("MOVED 16383 ::1:30001");
  ASSERT_TRUE(v6);
  EXPECT_EQ(v6->node, (ClusterNode{"::1", 30001, ""}));
  EXPECT_EQ(parse_redirect("MOVED 1 [::1]:30001")->node.host, "::1");
  for (const std::string bad :
       {"ERR unknown command", "MOVED", "MOVED 16384 h:1", "MOVED x h:1", "MOVED 1 h",
        "MOVED 1 h:0", "MOVED 1 h:65536", "MOVED 1 :80", "ASK 1 h:1x", "moved 1 h:1"}) {
    EXPECT_FALSE(parse_redirect(bad)) << bad;
  }
}

// Hand-built hiredis replies, for shapes a live server does not readily produce.
struct FakeReply {
  redisReply reply{};
  std::vector<std::unique_ptr<FakeReply>> children;
  std::vector<redisReply*> pointers;
  std::string text;

  static std::unique_ptr<FakeReply> integer(long long value) {
    auto r = std::make_unique<FakeReply>();
    r->reply.type = REDIS_REPLY_INTEGER;
    r->reply.integer = value;
    return r;
  }
  static std::unique_ptr<FakeReply> string(std::string value) {
    auto r = std::make_unique<FakeReply>();
    r->text = std::move(value);
    r->reply.type = REDIS_REPLY_STRING;
    r->reply.str = r->text.data();
    r->reply.len = r->text.size();
    return r;
  }
  static std::unique_ptr<FakeReply> array(std::vector<std::unique_ptr<FakeReply>> items) {
    auto r = std::make_unique<FakeReply>();
    r->children = std::move(items);
    for (auto& c : r->children) r->pointers.push_back(&c->reply);
    r->reply.type = REDIS_REPLY_ARRAY;
    r->reply.elements = r->pointers.size();
    r->reply.element = r->pointers.data();
    return r;
  }
};

std::unique_ptr<FakeReply> node(std::string host, int port, std::string id) {
  std::vector<std::unique_ptr<FakeReply>> items;
  items.push_back(FakeReply::string(std::move(host)));
  items.push_back(FakeReply::integer(port));
  items.push_back(FakeReply::string(std::move(id)));
  return FakeReply::array(std::move(items));
}

std::unique_ptr<FakeReply> range(long long first, long long last,
                                 std::vector<std::unique_ptr<FakeReply>> nodes) {
  std::vector<std::unique_ptr<FakeReply>> items;
  items.push_back(FakeReply::integer(first));
  items.push_back(FakeReply::integer(last));
  for (auto& n : nodes) items.push_back(std::move(n));
  return FakeReply::array(std::move(items));
}

template <typename... Nodes>
std::vector<std::unique_ptr<FakeReply>> list(Nodes... nodes) {
  std::vector<std::unique_ptr<FakeReply>> items;
  (items.push_back(std::move(nodes)), ...);
  return items;
}

TEST(SlotMap, ParsesRangesReplicasAndEndpointsTheNodeDoesNotKnow) {
  auto reply = FakeReply::array(
      list(range(8192, 16383, list(node("10.0.0.2", 7001, "b"), node("", 7004, "e"))),
           range(0, 8191, list(node("?", 7000, "a"), node("10.0.0.3", 7003, "d")))));
  const SlotMap map = SlotMap::from_cluster_slots(&reply->reply, "seed.example");
  ASSERT_EQ(map.ranges().size(), 2u);
  EXPECT_EQ(map.ranges()[0].first, 0u);  // sorted by slot
  EXPECT_EQ(map.find(0)->primary, (ClusterNode{"seed.example", 7000, "a"}));
  EXPECT_EQ(map.find(8191)->replicas.at(0).host, "10.0.0.3");
  EXPECT_EQ(map.find(8192)->primary.port, 7001);
  EXPECT_EQ(map.find(16383)->replicas.at(0), (ClusterNode{"seed.example", 7004, "e"}));
  EXPECT_EQ(map.uncovered_slots(), 0u);
  EXPECT_EQ(map.primaries().size(), 2u);
}

TEST(SlotMap, AGapIsUncoveredAndBadShapesAreRefused) {
  auto gap = FakeReply::array(
      list(range(0, 99, list(node("h", 1, "a"))), range(200, 16383, list(node("h", 2, "b")))));
  const SlotMap map = SlotMap::from_cluster_slots(&gap->reply, "h");
  EXPECT_EQ(map.find(150), nullptr);
  EXPECT_EQ(map.find(99)->primary.port, 1);
  EXPECT_EQ(map.uncovered_slots(), 100u);

  auto overlap = FakeReply::array(
      list(range(0, 100, list(node("h", 1, "a"))), range(100, 16383, list(node("h", 2, "b")))));
  EXPECT_THROW(SlotMap::from_cluster_slots(&overlap->reply, "h"), std::invalid_argument);
  auto out_of_range = FakeReply::array(list(range(0, 16384, list(node("h", 1, "a")))));
  EXPECT_THROW(SlotMap::from_cluster_slots(&out_of_range->reply, "h"), std::invalid_argument);
  auto no_primary = FakeReply::array(list(range(0, 10, {})));
  EXPECT_THROW(SlotMap::from_cluster_slots(&no_primary->reply, "h"), std::invalid_argument);
  auto bad_port = FakeReply::array(list(range(0, 10, list(node("h", 0, "a")))));
  EXPECT_THROW(SlotMap::from_cluster_slots(&bad_port->reply, "h"), std::invalid_argument);
  auto not_array = FakeReply::integer(3);
  EXPECT_THROW(SlotMap::from_cluster_slots(&not_array->reply, "h"), std::invalid_argument);
}

// Three cluster-enabled redis-servers that share the slots and have met.
class RealCluster : public ::testing::Test {
 protected:
  test::TestCluster cluster_;
};

TEST_F(RealCluster, TheSlotMapRoutesEveryKeyAndAWrongNodeRedirectsToTheMapsOwner) {
  Connection seed(cluster_.node(0).endpoint());
  const Reply slots = seed.command({"CLUSTER", "SLOTS"});
  const SlotMap map = SlotMap::from_cluster_slots(slots.raw(), "127.0.0.1");
  EXPECT_EQ(map.uncovered_slots(), 0u);
  ASSERT_EQ(map.primaries().size(), 3u);
  int redirected = 0;
  for (int k = 0; k < 30; ++k) {
    const std::string key = "dsfs:ds:1:o:" + std::to_string(k);
    const SlotMap::Range* owner = map.find(key_slot(key));
    ASSERT_NE(owner, nullptr);
    // The owner takes the key; every other node answers MOVED to the owner.
    for (size_t n = 0; n < cluster_.size(); ++n) {
      Connection conn(cluster_.node(n).endpoint());
      const Reply reply = conn.command({"SET", key, "v"});
      if (cluster_.node(n).port() == owner->primary.port) {
        EXPECT_FALSE(reply.is_error()) << reply.str();
        continue;
      }
      ASSERT_TRUE(reply.is_error());
      const std::optional<Redirect> redirect = parse_redirect(reply.str());
      ASSERT_TRUE(redirect) << reply.str();
      EXPECT_EQ(redirect->kind, Redirect::Kind::kMoved);
      EXPECT_EQ(redirect->slot, key_slot(key));
      EXPECT_EQ(redirect->node.port, owner->primary.port);
      ++redirected;
    }
  }
  EXPECT_EQ(redirected, 60);
}

}  // namespace
}  // namespace dsfs::store
