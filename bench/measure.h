#pragma once
// What the C++ benchmarks measure with: the process's and the machine's CPU time and the median
// of a few runs.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

namespace dsfs::bench {

// User + system CPU seconds of the whole process (every thread) so far.
inline double cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

// Busy CPU seconds of the whole machine so far (every CPU, from /proc/stat: user, nice, system,
// irq, softirq, steal; not idle or iowait): work done for the process outside it too (disk
// interrupts, kernel workers). Meaningful only on a machine doing nothing else.
inline double machine_busy_seconds() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return (user + nice + system + irq + softirq + steal) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// The middle value (the upper one of an even count); `values` must not be empty.
inline double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace dsfs::bench
