#include "prefetch/inflight_control.h"

#include <algorithm>

namespace dsfs::prefetch {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

void InflightControl::on_access(Clock::time_point now) {
  ++rate_count_;
  if (rate_since_ == Clock::time_point{}) {
    rate_since_ = now;
    return;
  }
  const double seconds = std::chrono::duration<double>(now - rate_since_).count();
  if (seconds > 1) {
    // A pause (between epochs, say) is not a slow reader: keep the last estimate, so a reader
    // that resumes at its old pace finds as much in flight as before, and measure afresh.
    rate_count_ = 1;
    rate_since_ = now;
    return;
  }
  if (seconds < 0.1) return;
  const double sample = static_cast<double>(rate_count_) / seconds;
  rate_ = rate_ == 0 ? sample : 0.7 * rate_ + 0.3 * sample;
  rate_count_ = 0;
  rate_since_ = now;
}

void InflightControl::on_rtt_sample(std::chrono::nanoseconds sample, Clock::time_point now) {
  if (now - period_start_ > 2s) {
    last_period_min_ = period_min_;
    period_min_ = sample;
    period_start_ = now;
  } else if (period_min_ == std::chrono::nanoseconds{0} || sample < period_min_) {
    period_min_ = sample;
  }
  rtt_ = last_period_min_ == std::chrono::nanoseconds{0} ? period_min_
                                                         : std::min(period_min_, last_period_min_);
  if (base_rtt_ == std::chrono::nanoseconds{0} || sample < base_rtt_) base_rtt_ = sample;
  ++base_samples_;
}

void InflightControl::on_fetched(Clock::time_point now) {
  if (window_ < max_) ++window_;
  if (now - burst_period_start_ > 2s) {
    last_period_burst_ = period_burst_;
    period_burst_ = 0;
    burst_period_start_ = now;
  }
  if (last_fetched_ != Clock::time_point{} && now - last_fetched_ < base_rtt_ / 4) {
    ++burst_count_;
    const double seconds = std::chrono::duration<double>(now - burst_start_).count();
    if (burst_count_ >= kBurstSample && seconds > 0) {
      period_burst_ = std::max(period_burst_, static_cast<double>(burst_count_ - 1) / seconds);
    }
  } else {
    burst_start_ = now;
    burst_count_ = 1;
  }
  last_fetched_ = now;
  ++fetched_count_;
  if (fetched_since_ == Clock::time_point{} || now - fetched_since_ > 1s) {
    // The first, or the first after a pause: nothing to measure a rate over.
    fetched_count_ = 1;
    fetched_since_ = now;
    return;
  }
  // At least a round trip: replies arrive spread over one. The first sample comes sooner
  // (5 ms) near the server: until there is one, slow start grows by one per reply without a
  // bound, and 50 ms of replies at 0 ms on 16 CPUs (750 at 15,000/s) opened the window to
  // hundreds, which a reader's miss then waited behind at the server.
  const std::chrono::nanoseconds interval = fetch_rate_ == 0 ? 5ms : 50ms;
  if (now - fetched_since_ < std::max(interval, rtt_)) return;
  const double sample = static_cast<double>(fetched_count_) /
                        std::chrono::duration<double>(now - fetched_since_).count();
  fetch_rate_ = std::max(sample, 0.8 * fetch_rate_);
  fetched_count_ = 0;
  fetched_since_ = now;
}

bool InflightControl::opened_for_plan() const {
  return plan_leads_ && base_trusted() && base_rtt_ >= kFarRtt;
}

size_t InflightControl::limit(double share) const {
  const double rtt_s = static_cast<double>(rtt_.count()) / 1e9;
  // A plan's opening: twice the path's bandwidth-delay product, replies queueing included.
  const double base_rtt_s = static_cast<double>(base_rtt_.count()) / 1e9;
  const size_t opening =
      opened_for_plan() ? static_cast<size_t>(2 * burst_per_s() * base_rtt_s) + floor_ : 0;
  // Twice the bandwidth-delay product: replies also queue behind one another.
  const auto wanted = static_cast<size_t>(2 * rate_ * share * rtt_s) + floor_;
  size_t window = window_;
  if (fetch_rate_ > 0) {
    // Four times what the path carried per round trip: twice its bandwidth-delay product, and
    // room for slow start to double it in the next round trip.
    window = std::min(window, static_cast<size_t>(4 * fetch_rate_ * rtt_s) + floor_);
  }
  return std::clamp(std::max({window, wanted, opening}), floor_, max_);
}

}  // namespace dsfs::prefetch
