// NodeWindows, pure logic: each Redis node's prefetches are admitted against that node's own
// window, so a node whose window is full (a slow or far shard) holds only its own fetches while
// the other nodes' go on, and each node's window follows its own round trip.
#include <gtest/gtest.h>

#include <chrono>
#include <utility>
#include <vector>

#include "prefetch/node_windows.h"

namespace dsfs::prefetch {
namespace {

using namespace std::chrono_literals;
using Clock = InflightControl::Clock;
using Windows = NodeWindows<int>;

const Clock::time_point kStart{std::chrono::hours(1)};

Windows::Admit offer(Windows& windows, size_t node, int item) {
  return windows.offer(node, item);
}

TEST(NodeWindows, AFullNodeHoldsOnlyItsOwnFetchesWhileTheOthersGoOn) {
  Windows windows(4, 1000);
  // Node 0 fills its window of 4; node 1 has room.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(offer(windows, 0, i), Windows::Admit::kSend);
  EXPECT_EQ(offer(windows, 1, 100), Windows::Admit::kSend);
  // Node 0's next fetches wait in its queue; node 1's are still sent.
  EXPECT_EQ(offer(windows, 0, 4), Windows::Admit::kHeld);
  EXPECT_EQ(offer(windows, 1, 101), Windows::Admit::kSend);
  EXPECT_EQ(offer(windows, 0, 5), Windows::Admit::kHeld);
  EXPECT_EQ(offer(windows, 1, 102), Windows::Admit::kSend);
  EXPECT_TRUE(windows.propose_more());
  EXPECT_EQ(windows.held(), 2u);
  EXPECT_EQ(windows.inflight(), 7u);
  // Nothing is released while node 0 has no room.
  std::vector<std::pair<size_t, int>> released;
  windows.take_released(10, released);
  EXPECT_TRUE(released.empty());
  EXPECT_FALSE(windows.has_released());
  // A reply from node 1 frees room on node 1, not on node 0.
  windows.on_answered(1, 1ms, kStart);
  EXPECT_FALSE(windows.has_released());
  // A reply from node 0 frees a place there and slow start adds one: node 0's two held
  // fetches are released, oldest first, to node 0.
  windows.on_answered(0, 1ms, kStart);
  EXPECT_TRUE(windows.has_released());
  windows.take_released(10, released);
  EXPECT_EQ(released, (std::vector<std::pair<size_t, int>>{{0, 4}, {0, 5}}));
  EXPECT_EQ(windows.held(), 0u);
  EXPECT_EQ(windows.report()[0].limit, 5u);
  // A node's queue is bounded by its window: once node 0 holds a window's worth, proposing
  // stops (a reader joining a held fetch waits about one more round trip of its node, no more).
  for (int i = 6; i < 10; ++i) EXPECT_EQ(offer(windows, 0, i), Windows::Admit::kHeld);
  EXPECT_TRUE(windows.propose_more());
  EXPECT_EQ(offer(windows, 0, 10), Windows::Admit::kHeld);
  EXPECT_FALSE(windows.propose_more());
  // drain() gives back every held fetch, oldest first.
  EXPECT_EQ(windows.drain(), (std::vector<int>{6, 7, 8, 9, 10}));
  EXPECT_EQ(windows.held(), 0u);
  EXPECT_TRUE(windows.propose_more());
}

TEST(NodeWindows, OneServerStopsProposingAtTheFirstHeldFetch) {
  // With one node there is no other to go on with: proposing stops at once, as before nodes.
  Windows windows(4, 1000);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(offer(windows, 0, i), Windows::Admit::kSend);
  EXPECT_TRUE(windows.propose_more());
  EXPECT_EQ(offer(windows, 0, 4), Windows::Admit::kHeld);
  EXPECT_FALSE(windows.propose_more());
  windows.on_ended(0);  // a fetch given up frees room too
  std::vector<std::pair<size_t, int>> released;
  windows.take_released(10, released);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_EQ(released[0].second, 4);
  EXPECT_TRUE(windows.propose_more());
}

TEST(NodeWindows, NeverMoreThanMaxInFlightAndHeldTogether) {
  Windows windows(8, 10);
  size_t sent = 0;
  int item = 0;
  for (size_t node = 0; node < 3 && windows.propose_more(); ++node) {
    for (int k = 0; k < 8 && windows.propose_more(); ++k) {
      sent += offer(windows, node, item++) == Windows::Admit::kSend ? 1 : 0;
    }
  }
  EXPECT_LE(windows.inflight() + windows.held(), 10u);
  EXPECT_LE(sent, 10u);
  EXPECT_FALSE(windows.propose_more());
}

uint64_t sum_of_limits(const Windows& windows) {
  uint64_t sum = 0;
  for (const NodeWindowReport& node : windows.report()) sum += node.limit;
  return sum;
}

std::vector<size_t> nodes_reported(const Windows& windows) {
  std::vector<size_t> nodes;
  for (const NodeWindowReport& node : windows.report()) nodes.push_back(node.node);
  return nodes;
}

// A failover or a node gone leaves node indices reads no longer go to: their windows leave the
// total limit once nothing of theirs is in flight or held (before, they counted for good).
TEST(NodeWindows, NodesNoLongerServingLeaveTheLimitOnceIdle) {
  Windows windows(4, 1000);
  int item = 0;
  for (size_t node = 0; node < 3; ++node) {
    for (int i = 0; i < 4; ++i) ASSERT_EQ(offer(windows, node, item++), Windows::Admit::kSend);
    for (int i = 0; i < 4; ++i) windows.on_answered(node, 1ms, kStart);
  }
  const uint64_t all = windows.limit();
  EXPECT_EQ(all, sum_of_limits(windows));
  EXPECT_EQ(nodes_reported(windows), (std::vector<size_t>{0, 1, 2}));
  // Only node 0 serves now; node 1 still has a fetch in flight, so it stays until that ends.
  ASSERT_EQ(offer(windows, 1, item++), Windows::Admit::kSend);
  windows.retire_idle_except({0});
  EXPECT_EQ(nodes_reported(windows), (std::vector<size_t>{0, 1}));
  EXPECT_LT(windows.limit(), all);
  EXPECT_EQ(windows.limit(), sum_of_limits(windows));
  windows.on_ended(1);
  windows.retire_idle_except({0});
  EXPECT_EQ(nodes_reported(windows), (std::vector<size_t>{0}));
  EXPECT_EQ(windows.limit(), sum_of_limits(windows));
  // A retired node used again starts from the floor.
  ASSERT_EQ(offer(windows, 2, item++), Windows::Admit::kSend);
  EXPECT_EQ(windows.report().back().limit, 4u);
}

// The first replies of a planned epoch, back `rtt` after they were sent, 200 us apart: the
// path carries 5,000 objects/s.
void first_replies(Windows& windows, size_t node, std::chrono::nanoseconds rtt, int& item) {
  Clock::time_point now = kStart;
  for (int i = 0; i < 16; ++i) {
    offer(windows, node, item++);
    now += 200us;
    windows.on_answered(node, rtt, now);
  }
}

TEST(NodeWindows, EachNodesWindowFollowsItsOwnRoundTrip) {
  // A planned epoch on a cluster where node 1 is 100 ms away and nodes 0 and 2 are 1 ms away:
  // node 1's window opens to its own bandwidth-delay product (2 x 5,000/s x 100 ms); the near
  // nodes' stay small, and none waits for the others' round trip.
  Windows windows(16, 8192);
  windows.set_plan_leads(true);
  int item = 0;
  first_replies(windows, 0, 1ms, item);
  first_replies(windows, 1, 100ms, item);
  first_replies(windows, 2, 1ms, item);
  const InflightControl* near = windows.control(0);
  const InflightControl* far = windows.control(1);
  ASSERT_NE(near, nullptr);
  ASSERT_NE(far, nullptr);
  EXPECT_NEAR(far->base_rtt_ms(), 100, 1);
  EXPECT_NEAR(near->base_rtt_ms(), 1, 0.1);
  EXPECT_TRUE(far->opened_for_plan());
  EXPECT_FALSE(near->opened_for_plan());
  std::vector<NodeWindowReport> report = windows.report();
  ASSERT_EQ(report.size(), 3u);
  EXPECT_GE(report[1].limit, 1000u);
  EXPECT_LE(report[0].limit, 64u);
  EXPECT_LE(report[2].limit, 64u);
  // The far node takes a thousand fetches in flight while the near ones keep their own room.
  size_t far_sent = 0;
  for (int i = 0; i < 1000; ++i) {
    far_sent += offer(windows, 1, item++) == Windows::Admit::kSend ? 1 : 0;
  }
  EXPECT_EQ(far_sent, 1000u);
  EXPECT_EQ(offer(windows, 0, item++), Windows::Admit::kSend);
  EXPECT_EQ(offer(windows, 2, item++), Windows::Admit::kSend);
  report = windows.report();
  EXPECT_GE(report[1].opened_for_plan, 1000u);
  EXPECT_EQ(report[0].opened_for_plan, 0u);
  EXPECT_EQ(windows.opened_for_plan(), report[1].opened_for_plan);
  // Every node's window together, for stats.json's inflight target.
  EXPECT_EQ(windows.limit(), report[0].limit + report[1].limit + report[2].limit);
}

TEST(NodeWindows, ANodesShareOfTheReadsSizesItsWindowFromTheReadersRate) {
  // Readers at 1,000 files/s, 100 ms from two nodes that each serve half of the fetches: each
  // needs about 2 x 500/s x 100 ms in flight, not 2 x 1,000/s x 100 ms.
  Windows windows(4, 8192);
  Clock::time_point now = kStart;
  for (int i = 0; i <= 1000; ++i) {
    windows.on_access(now);
    now += 1ms;
  }
  EXPECT_NEAR(windows.files_per_s(), 1000, 50);
  int item = 0;
  for (int i = 0; i < 4; ++i) {
    for (size_t node = 0; node < 2; ++node) {
      offer(windows, node, item++);
      windows.on_answered(node, 100ms, now);
      now += 10ms;  // too far apart to be a burst
    }
  }
  for (const NodeWindowReport& n : windows.report()) {
    EXPECT_GE(n.limit, 100u) << n.node;
    EXPECT_LE(n.limit, 100u + 4 + 20) << n.node;
  }
}

}  // namespace
}  // namespace dsfs::prefetch
