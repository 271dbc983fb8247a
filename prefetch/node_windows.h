#pragma once
// Per-node in-flight windows: each Redis node the prefetches go to (one for a single server,
// every copy that serves reads on a cluster) has its own InflightControl, measured on its own
// replies, so a far or slow shard gets a window sized to its own bandwidth-delay product and
// one shard whose window is full does not stop fetches to the others.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <utility>
#include <vector>

#include "prefetch/inflight_control.h"

namespace dsfs::prefetch {

// What one node's window shows in stats.json.
struct NodeWindowReport {
  size_t node = 0;               // the store::Client's node index
  uint64_t inflight = 0;         // sent, not answered
  uint64_t held = 0;             // routed here while its window was full, not sent yet
  uint64_t limit = 0;            // its window now
  uint64_t peak = 0;             // the most in flight at once
  uint64_t sent = 0;             // fetches sent to it
  uint64_t opened_for_plan = 0;  // sent while its window was open for a plan at once
  double rtt_ms = 0;
  double base_rtt_ms = 0;
  double burst_per_s = 0;
};

// Admission of fetches routed to nodes. A fetch for a node under its own limit (and the whole
// under max_total) is sent; one for a node whose window is full waits in that node's queue,
// oldest first, and is released when a reply from that node frees room. Queues are bounded by
// their node's window, so a reader that joins a held fetch waits at most about one more round
// trip of that node; a full queue stops proposing (propose_more() false) until it drains. With
// one node (a single server) there is no other node to go on with: one held item stops it.
// Pure logic on the caller's clock. Not synchronized: the engine's mutex guards it.
template <typename Item>
class NodeWindows {
 public:
  using Clock = InflightControl::Clock;
  enum class Admit {
    kSend,  // counted in flight on its node: send it now
    kHeld,  // moved into its node's queue: take_released() hands it back when room frees
  };

  // `floor`: each node's smallest window; `max_total`: the most in flight and held together,
  // and each node's largest window.
  NodeWindows(size_t floor, size_t max_total) : floor_(floor), max_total_(max_total) {}

  // A file was read, the reads paused, a plan leads or not: the same for every node. Reads are
  // counted here too, so a node first used later starts from the readers' rate.
  void on_access(Clock::time_point now) {
    reads_.on_access(now);
    for (auto& n : nodes_) {
      if (n) n->control.on_access(now);
    }
  }
  void on_idle() {
    reads_.on_idle();
    for (auto& n : nodes_) {
      if (n) n->control.on_idle();
    }
  }
  // Every node's base round trip is measured afresh (InflightControl::measure_base_again).
  void measure_base_again() {
    for (auto& n : nodes_) {
      if (n) n->control.measure_base_again();
    }
  }
  void set_plan_leads(bool leads) {
    plan_leads_ = leads;
    for (auto& n : nodes_) {
      if (n) n->control.set_plan_leads(leads);
    }
  }

  // Whether the caller may propose another file: under max_total, and no node's queue full.
  bool propose_more() const {
    if (inflight_ + held_ >= max_total_) return false;
    for (const auto& n : nodes_) {
      if (n && n->held.size() >= queue_bound(*n)) return false;
    }
    return true;
  }

  // Sends `item` to `node` if its window has room (kSend: `item` is left alone), else moves it
  // into that node's queue (kHeld).
  Admit offer(size_t node, Item& item) {
    State& n = state(node);
    if (n.held.empty() && room(n)) {
      charge(n);
      return Admit::kSend;
    }
    n.held.push_back(std::move(item));
    ++held_;
    return Admit::kHeld;
  }

  // Up to `most` queued items whose nodes now have room, oldest first per node, each counted in
  // flight on its node; appended to `out` with the node each goes to.
  void take_released(size_t most, std::vector<std::pair<size_t, Item>>& out) {
    for (size_t node = 0; node < nodes_.size() && most > 0; ++node) {
      if (!nodes_[node]) continue;
      State& n = *nodes_[node];
      while (!n.held.empty() && most > 0 && room(n)) {
        out.emplace_back(node, std::move(n.held.front()));
        n.held.pop_front();
        --held_;
        charge(n);
        --most;
      }
    }
  }

  // Whether some queue has an item its node has room for now.
  bool has_released() const {
    for (const auto& n : nodes_) {
      if (n && !n->held.empty() && room(*n)) return true;
    }
    return false;
  }

  // Every queued item, for the caller to give up (the engine stopping).
  std::vector<Item> drain() {
    std::vector<Item> out;
    for (auto& n : nodes_) {
      if (!n) continue;
      for (Item& item : n->held) out.push_back(std::move(item));
      n->held.clear();
    }
    held_ = 0;
    return out;
  }

  // A fetch sent to `node` was answered after `rtt` (its round trip, queueing included).
  void on_answered(size_t node, std::chrono::nanoseconds rtt, Clock::time_point now) {
    State& n = state(node);
    n.control.on_rtt_sample(rtt, now);
    n.control.on_fetched(now);
    release(n);
  }
  // A fetch sent to `node` ended without a sample (failed, or staged from the disk tier).
  void on_ended(size_t node) { release(state(node)); }

  // Forgets the windows of nodes not in `serving` (the copies reads go to now) that have
  // nothing in flight or held: a node a failover demoted or removed would otherwise count in
  // limit() and in every node's share for good. One used again starts from the floor.
  void retire_idle_except(const std::vector<size_t>& serving) {
    for (size_t node = 0; node < nodes_.size(); ++node) {
      const std::unique_ptr<State>& n = nodes_[node];
      if (!n || n->inflight > 0 || !n->held.empty() ||
          std::find(serving.begin(), serving.end(), node) != serving.end()) {
        continue;
      }
      sent_ -= n->sent;
      --used_nodes_;
      nodes_[node].reset();
    }
  }

  // Whether every node fetched from is near (InflightControl::near, under `bound`); false before
  // any has been measured.
  bool all_near(std::chrono::nanoseconds bound) const {
    bool any = false;
    for (const auto& n : nodes_) {
      if (!n) continue;
      if (!n->control.near(bound)) return false;
      any = true;
    }
    return any;
  }

  uint64_t inflight() const { return inflight_; }
  uint64_t held() const { return held_; }
  size_t max_total() const { return max_total_; }
  // The readers' rate (files/s), the same for every node.
  double files_per_s() const { return reads_.files_per_s(); }
  // Every node's window together, never above max_total.
  uint64_t limit() const {
    uint64_t sum = 0;
    for (const auto& n : nodes_) {
      if (n) sum += window(*n);
    }
    return std::min<uint64_t>(std::max<uint64_t>(sum, floor_), max_total_);
  }
  std::vector<NodeWindowReport> report() const {
    std::vector<NodeWindowReport> out;
    for (size_t node = 0; node < nodes_.size(); ++node) {
      if (!nodes_[node]) continue;
      const State& n = *nodes_[node];
      out.push_back(NodeWindowReport{.node = node,
                                     .inflight = n.inflight,
                                     .held = n.held.size(),
                                     .limit = window(n),
                                     .peak = n.peak,
                                     .sent = n.sent,
                                     .opened_for_plan = n.opened_for_plan,
                                     .rtt_ms = n.control.rtt_ms(),
                                     .base_rtt_ms = n.control.base_rtt_ms(),
                                     .burst_per_s = n.control.burst_per_s()});
    }
    return out;
  }
  uint64_t opened_for_plan() const {
    uint64_t sum = 0;
    for (const auto& n : nodes_) {
      if (n) sum += n->opened_for_plan;
    }
    return sum;
  }
  const InflightControl* control(size_t node) const {
    return node < nodes_.size() && nodes_[node] ? &nodes_[node]->control : nullptr;
  }

 private:
  struct State {
    State(size_t floor, size_t max) : control(floor, max) {}
    InflightControl control;
    uint64_t inflight = 0;
    uint64_t peak = 0;
    uint64_t sent = 0;
    uint64_t opened_for_plan = 0;
    std::deque<Item> held;
  };

  State& state(size_t node) {
    if (node >= nodes_.size()) nodes_.resize(node + 1);
    if (!nodes_[node]) {
      nodes_[node] = std::make_unique<State>(floor_, max_total_);
      ++used_nodes_;
      nodes_[node]->control.adopt_read_rate(reads_);
      nodes_[node]->control.set_plan_leads(plan_leads_);
    }
    return *nodes_[node];
  }
  // The node's window: its own control's, the readers' rate taken at the node's share of the
  // fetches (what it serves of the reads).
  size_t window(const State& n) const {
    const double share =
        sent_ == 0 ? 1.0 : static_cast<double>(std::max<uint64_t>(n.sent, 1)) / sent_;
    return n.control.limit(share);
  }
  bool room(const State& n) const { return n.inflight < window(n) && inflight_ < max_total_; }
  size_t queue_bound(const State& n) const {
    return used_nodes_ > 1 ? std::max(window(n), floor_) : 1;
  }
  void charge(State& n) {
    ++n.inflight;
    ++n.sent;
    ++sent_;
    ++inflight_;
    if (n.control.opened_for_plan()) ++n.opened_for_plan;
    n.peak = std::max(n.peak, n.inflight);
  }
  void release(State& n) {
    if (n.inflight > 0) --n.inflight;
    if (inflight_ > 0) --inflight_;
  }

  size_t floor_;
  size_t max_total_;
  InflightControl reads_{1, 1};  // only its read rate is used
  bool plan_leads_ = false;
  std::vector<std::unique_ptr<State>> nodes_;  // by node index; null: never routed to
  uint64_t inflight_ = 0;
  uint64_t held_ = 0;
  uint64_t sent_ = 0;
  size_t used_nodes_ = 0;
};

}  // namespace dsfs::prefetch
