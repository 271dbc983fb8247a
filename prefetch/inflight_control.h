#pragma once
// The in-flight budget of one path to Redis: how many prefetches may be outstanding on it.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace dsfs::prefetch {

// The in-flight budget: a bandwidth-delay product from the measured round trip and the rate
// files are read, reached by slow start and never above max. Pure logic; times are passed in.
// Not synchronized: its owner's lock guards it (the engine's, through NodeWindows).
class InflightControl {
 public:
  using Clock = std::chrono::steady_clock;
  InflightControl(size_t floor, size_t max) : floor_(floor), max_(max), window_(floor) {}

  void on_access(Clock::time_point now);
  void on_rtt_sample(std::chrono::nanoseconds sample, Clock::time_point now);
  // A prefetch completed: slow start (one more in flight), and a sample of the fetch rate.
  void on_fetched(Clock::time_point now);
  void on_idle() {
    window_ = floor_;
    measure_base_again();
  }
  // Forgets the base round trip: the next kBurstSample replies measure it afresh (near() and the
  // plan's opening are false until then). It only falls otherwise, so a path that grew far
  // without a pause in the reads would stay near.
  void measure_base_again() {
    base_rtt_ = std::chrono::nanoseconds{0};
    base_samples_ = 0;
  }
  // Whether a plan leads with files still ahead of the readers. A planned order is no guess:
  // on a far link (round trip >= kFarRtt) the window opens at once to twice the path's
  // bandwidth-delay product, the rate taken from the spacing of the first replies that arrived
  // back to back (burst_per_s), instead of doubling from the floor every round trip.
  void set_plan_leads(bool leads) { plan_leads_ = leads; }
  // Whether limit() is the planned opening now.
  bool opened_for_plan() const;
  // The window: `share` is the part of the reads this path serves (one node of a cluster), by
  // which the readers' rate is taken for the bandwidth-delay product they need.
  size_t limit(double share = 1.0) const;
  // Takes `other`'s measure of the readers' rate (a node's control created after reads began).
  void adopt_read_rate(const InflightControl& other) {
    rate_ = other.rate_;
    rate_since_ = other.rate_since_;
    rate_count_ = other.rate_count_;
  }

  // Beyond this round trip slow start would take several costly round trips to reach the
  // bandwidth-delay product; below it the floor is about the product already, and a local
  // server's replies on a loaded machine can take a few ms (measured: 2-5 ms at 0 ms here).
  static constexpr std::chrono::milliseconds kFarRtt{10};
  // Below this round trip a reader's miss costs it less than FUSE and the reader spend on each
  // file anyway, and a guess of a shuffled order saves it nothing it would notice: measured on
  // the unix socket, guesses among the unread files read no faster than none, and with draws
  // with replacement they cost 12-21% (docs/benchmarks.md, "The first epoch with draws with
  // replacement"); 1 ms away those break even and shuffled orders gain 16-29%.
  static constexpr std::chrono::microseconds kNearRtt{1000};
  // Completions a burst needs to be measured, and replies the base round trip is trusted from.
  static constexpr uint64_t kBurstSample = 8;
  // Whether the path's own round trip is below `bound` (kNearRtt unless a test says otherwise),
  // trusted from kBurstSample replies on (until then, and after a pause, false).
  bool near(std::chrono::nanoseconds bound) const { return base_trusted() && base_rtt_ < bound; }

  double rtt_ms() const { return rtt_.count() / 1e6; }
  double base_rtt_ms() const { return base_rtt_.count() / 1e6; }
  double files_per_s() const { return rate_; }
  double fetched_per_s() const { return fetch_rate_; }
  double burst_per_s() const { return std::max(period_burst_, last_period_burst_); }
  size_t max() const { return max_; }

 private:
  size_t floor_;
  size_t max_;
  size_t window_;
  bool plan_leads_ = false;
  double rate_ = 0;  // files read per second, smoothed
  Clock::time_point rate_since_{};
  uint64_t rate_count_ = 0;
  // Prefetches completed per second, the best recent sample: what the path to Redis carries.
  // Slow start stops at four times this per round trip: past it, more in flight only queues at
  // the server, where demand reads then wait behind guesses.
  double fetch_rate_ = 0;
  Clock::time_point fetched_since_{};
  uint64_t fetched_count_ = 0;
  // Completions closer together than a quarter of the round trip are one burst: replies that
  // queued behind one another on the way, so their spacing is what the path (server, link and
  // this daemon) carries when the window does not limit it. The best burst of the current and
  // the last 2-second period: a lull between rounds (a window that drained, its last replies
  // trickling in) says nothing of the path and leaves the rate alone, while a path that slowed
  // down shows it within two periods.
  double period_burst_ = 0;
  double last_period_burst_ = 0;
  Clock::time_point burst_period_start_{};
  Clock::time_point burst_start_{};
  Clock::time_point last_fetched_{};
  uint64_t burst_count_ = 0;
  // Round trip: the smallest GET latency seen in the current and the last 2-second period
  // (later replies of a pipeline also wait behind earlier ones).
  std::chrono::nanoseconds rtt_{0};
  std::chrono::nanoseconds period_min_{0};
  std::chrono::nanoseconds last_period_min_{0};
  // The smallest GET latency since the start or the last pause: the link's own delay. The plan's
  // opening uses it, not rtt_: with the window open, replies wait behind one another for longer
  // than a period, and a round trip taken from them would open the window further still.
  std::chrono::nanoseconds base_rtt_{0};
  // Samples base_rtt_ is the least of: the opening trusts it from kBurstSample on (the first
  // round trip's replies), not from one slow reply of a near server on a loaded machine.
  uint64_t base_samples_ = 0;
  bool base_trusted() const { return base_samples_ >= kBurstSample; }
  Clock::time_point period_start_{};
};

}  // namespace dsfs::prefetch
