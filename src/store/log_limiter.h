#pragma once
// A bound on how often one kind of log line is written: an error that every read meets (a
// dataset removed under a mount, a password changed) wrote thousands of lines a second.
#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "src/store/thread_annotations.h"

namespace dsfs::store {

// Thread safety: internally synchronized (a mutex, taken only on the paths that log).
class LogLimiter {
 public:
  // At most `burst` lines per `window`.
  explicit LogLimiter(unsigned burst = 5,
                      std::chrono::milliseconds window = std::chrono::seconds(10))
      : burst_(burst), window_(window) {}

  // Whether to write this line: nullopt to hold it back (counted), otherwise how many were
  // held back since the last one written, for the line to say so.
  std::optional<uint64_t> admit() {
    MutexLock lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    if (now - window_start_ >= window_) {
      window_start_ = now;
      written_in_window_ = 0;
    }
    if (written_in_window_ >= burst_) {
      ++held_back_;
      return std::nullopt;
    }
    ++written_in_window_;
    const uint64_t held_back = held_back_;
    held_back_ = 0;
    return held_back;
  }

  // Writes `message` at `level` unless held back, saying how many like it were held back since.
  void log(spdlog::level::level_enum level, const std::string& message) {
    if (const std::optional<uint64_t> held_back = admit()) {
      if (*held_back == 0) {
        spdlog::log(level, "{}", message);
      } else {
        spdlog::log(level, "{} ({} more like it not logged)", message, *held_back);
      }
    }
  }

 private:
  const unsigned burst_;
  const std::chrono::milliseconds window_;
  Mutex mutex_;
  std::chrono::steady_clock::time_point window_start_ DSFS_GUARDED_BY(mutex_){};
  unsigned written_in_window_ DSFS_GUARDED_BY(mutex_) = 0;
  uint64_t held_back_ DSFS_GUARDED_BY(mutex_) = 0;
};

}  // namespace dsfs::store
