#include "prefetch/read_stats.h"

#include <algorithm>
#include <bit>
#include <cmath>

namespace dsfs::prefetch {

size_t StallHistogram::bucket_of(uint64_t micros) {
  if (micros == 0) return 0;
  const auto power = static_cast<size_t>(std::bit_width(micros) - 1);  // 2^power <= micros
  // The kSubBuckets steps between 2^power and 2^(power+1), from the bits below the top one.
  const uint64_t fraction = power >= 3 ? (micros >> (power - 3)) & 7 : (micros << (3 - power)) & 7;
  return std::min(kBuckets - 1, 1 + power * kSubBuckets + static_cast<size_t>(fraction));
}

uint64_t StallHistogram::upper_bound_us(size_t bucket) {
  if (bucket == 0) return 0;
  const size_t power = (bucket - 1) / kSubBuckets;
  const size_t step = (bucket - 1) % kSubBuckets;
  // 2^power * (1 + (step + 1) / 8)
  return static_cast<uint64_t>(
      std::ldexp(1.0 + static_cast<double>(step + 1) / kSubBuckets, static_cast<int>(power)));
}

void StallHistogram::record(std::chrono::nanoseconds stall) {
  const auto ns = static_cast<uint64_t>(std::max<int64_t>(0, stall.count()));
  counts_[bucket_of(ns / 1000)].fetch_add(1, std::memory_order_relaxed);
  total_ns_.fetch_add(ns, std::memory_order_relaxed);
  uint64_t seen = max_ns_.load(std::memory_order_relaxed);
  while (ns > seen && !max_ns_.compare_exchange_weak(seen, ns, std::memory_order_relaxed)) {
  }
}

uint64_t StallHistogram::count() const {
  uint64_t n = 0;
  for (const auto& c : counts_) n += c.load(std::memory_order_relaxed);
  return n;
}

uint64_t StallHistogram::quantile_us(double q) const {
  std::array<uint64_t, kBuckets> counts;
  uint64_t total = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    counts[i] = counts_[i].load(std::memory_order_relaxed);
    total += counts[i];
  }
  if (total == 0) return 0;
  const auto rank =
      static_cast<uint64_t>(std::ceil(std::clamp(q, 0.0, 1.0) * static_cast<double>(total)));
  uint64_t seen = 0;
  for (size_t i = 0; i < kBuckets; ++i) {
    seen += counts[i];
    if (seen >= std::max<uint64_t>(rank, 1)) return std::min(upper_bound_us(i), max_us());
  }
  return max_us();
}

void ReadStats::record(ReadOutcome outcome, std::chrono::nanoseconds waited) {
  switch (outcome) {
    case ReadOutcome::kReady:
      ready.fetch_add(1, std::memory_order_relaxed);
      break;
    case ReadOutcome::kJoined:
      joined.fetch_add(1, std::memory_order_relaxed);
      break;
    case ReadOutcome::kMiss:
      miss.fetch_add(1, std::memory_order_relaxed);
      break;
  }
  stall.record(outcome == ReadOutcome::kReady ? std::chrono::nanoseconds{0} : waited);
}

}  // namespace dsfs::prefetch
