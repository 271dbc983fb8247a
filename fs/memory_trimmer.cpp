#include "fs/memory_trimmer.h"

#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "src/store/value_buffer.h"

namespace dsfs::fs {

MemoryTrimmer::MemoryTrimmer(std::function<uint64_t()> activity, std::chrono::milliseconds idle)
    : activity_(std::move(activity)), idle_(idle) {}

MemoryTrimmer::~MemoryTrimmer() {
  if (thread_.joinable()) {
    thread_.request_stop();  // wakes the wait: it is given the thread's stop token
    thread_.join();
  }
}

void MemoryTrimmer::start() {
  if (thread_.joinable()) return;
  thread_ = std::jthread([this](std::stop_token stop) { run(stop); });
}

MemoryTrimmer::Stats MemoryTrimmer::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void MemoryTrimmer::run(std::stop_token stop) {
  using Clock = std::chrono::steady_clock;
  // Looks a few times per idle period, so a trim comes at most a quarter of it late.
  const auto tick = std::max(idle_ / 4, std::chrono::milliseconds{10});
  uint64_t seen = activity_();
  Clock::time_point moved = Clock::now();
  bool trimmed_since = true;  // nothing was read yet: nothing to give back
  std::unique_lock lock(mutex_);
  while (true) {
    // Woken early only by a stop request (jthread's token wakes the wait).
    wake_.wait_for(lock, stop, tick, [] { return false; });
    if (stop.stop_requested()) return;
    const uint64_t now_seen = activity_();
    const Clock::time_point now = Clock::now();
    if (now_seen != seen) {
      seen = now_seen;
      moved = now;
      trimmed_since = false;
      continue;
    }
    if (trimmed_since || now - moved < idle_) continue;
    trimmed_since = true;
    lock.unlock();  // a trim of a large heap takes a while; stats() must not wait for it
    const uint64_t before = resident_bytes();
    store::release_reusable_value_buffers();  // the buffers kept for reuse go back first
    malloc_trim(0);
    const uint64_t after = resident_bytes();
    lock.lock();
    ++stats_.trims;
    stats_.released_bytes += before > after ? before - after : 0;
  }
}

uint64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0;
  uint64_t resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return resident_pages * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
}

}  // namespace dsfs::fs
