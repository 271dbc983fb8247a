#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace dsfs::fs {

// Gives the memory the daemon freed back to the system once reads pause. Objects come and go
// by the hundred megabytes through glibc's arenas, which keep what is freed for the next
// allocation: after an epoch (or while training validates) a mount held 63-106 MiB more than its
// 266 MiB cache, and 24-28 MiB once trimmed (docs/benchmarks.md, "Memory given back when reads
// pause"). So once `activity` (a count that grows with reads) has not moved for `idle`, and moved
// since the last trim, the trimmer's thread frees the object buffers kept for reuse
// (store::release_reusable_value_buffers) and calls malloc_trim(0) once; never while reads go on,
// where the freed memory is about to be used again and trimming would hold an arena's lock.
//
// Thread safety: stats() may be called from any thread; start() and the destructor from one.
class MemoryTrimmer {
 public:
  struct Stats {
    uint64_t trims = 0;
    uint64_t released_bytes = 0;  // the RSS each trim took away, summed
  };

  MemoryTrimmer(std::function<uint64_t()> activity, std::chrono::milliseconds idle);
  ~MemoryTrimmer();  // stops the thread
  MemoryTrimmer(const MemoryTrimmer&) = delete;
  MemoryTrimmer& operator=(const MemoryTrimmer&) = delete;

  // Starts the thread; once, after any fork. A second call does nothing.
  void start();
  Stats stats() const;

 private:
  void run(std::stop_token stop);

  std::function<uint64_t()> activity_;
  std::chrono::milliseconds idle_;
  mutable std::mutex mutex_;
  std::condition_variable_any wake_;  // the thread's wait, cut short by a stop request
  Stats stats_;                       // guarded by mutex_
  std::jthread thread_;
};

// Reads pause this long before the daemon gives freed memory back: longer than the gaps
// between a loader's batches, shorter than a validation pass.
inline constexpr std::chrono::milliseconds kDefaultTrimIdle{2000};

// The process's resident set now (/proc/self/statm), in bytes; 0 if it cannot be read.
uint64_t resident_bytes();

}  // namespace dsfs::fs
