#pragma once
// What the C++ benchmarks measure with: the process's CPU time and the median of a few runs.
#include <sys/resource.h>

#include <algorithm>
#include <vector>

namespace dsfs::bench {

// User + system CPU seconds of the whole process (every thread) so far.
inline double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// The middle value (the upper one of an even count); `values` must not be empty.
inline double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace dsfs::bench
