#pragma once
// What readers experienced: how each READ found its bytes, and how long it waited for them.
// Lock-free, so counting costs the hot path a few atomic adds.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "prefetch/object_cache.h"

namespace dsfs::prefetch {

// A log-scale histogram of durations: 8 buckets per power of two (under 9% apart) from 1 µs up.
// Thread safety: lock-free; record() and the readers may run on any threads at once.
class StallHistogram {
 public:
  void record(std::chrono::nanoseconds stall);
  // The q-quantile (0 < q <= 1) in microseconds, as its bucket's upper bound; 0 when empty.
  uint64_t quantile_us(double q) const;
  uint64_t max_us() const { return max_ns_.load(std::memory_order_relaxed) / 1000; }
  double total_s() const {
    return static_cast<double>(total_ns_.load(std::memory_order_relaxed)) / 1e9;
  }
  uint64_t count() const;
  // Observations in `bucket` (< kBuckets) so far; for exporting the histogram whole.
  uint64_t bucket_count(size_t bucket) const {
    return counts_[bucket].load(std::memory_order_relaxed);
  }

  static constexpr size_t kSubBuckets = 8;
  static constexpr size_t kBuckets = 1 + 40 * kSubBuckets;  // [0,1 µs), then up to 2^40 µs
  static size_t bucket_of(uint64_t micros);
  static uint64_t upper_bound_us(size_t bucket);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> counts_{};
  std::atomic<uint64_t> max_ns_{0};
  std::atomic<uint64_t> total_ns_{0};
};

// Thread safety: atomic counters, updated and read from any thread without a lock (relaxed:
// they are statistics, read as a snapshot that need not be consistent across counters).
struct ReadStats {
  std::atomic<uint64_t> ready{0};   // every byte was cached
  std::atomic<uint64_t> joined{0};  // waited for a fetch already in flight
  std::atomic<uint64_t> miss{0};    // fetched by the reader itself
  StallHistogram stall;

  void record(ReadOutcome outcome, std::chrono::nanoseconds waited);
};

}  // namespace dsfs::prefetch
