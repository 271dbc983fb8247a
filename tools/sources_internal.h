#pragma once
// Helpers shared by the source implementations (not part of the sources interface).
#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "tools/ingest_object.h"

namespace dsfs::tools::detail {

// curl_global_init, once per process (the first call's failure is rethrown by every call).
void ensure_curl_initialised();

inline int64_t mtime_ns_of(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// Runs `worker(stop)` on `threads` threads. The first exception thrown by a worker sets `stop`
// for the others and is rethrown after all have joined; a real error is preferred over the
// StopRequested that other workers throw while unwinding because of it.
inline void run_workers(unsigned threads,
                        const std::function<void(const std::atomic<bool>& stop)>& worker) {
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  bool first_is_stop = false;
  auto body = [&] {
    try {
      worker(stop);
    } catch (const StopRequested&) {
      std::lock_guard lock(error_mutex);
      if (!first_error) {
        first_error = std::current_exception();
        first_is_stop = true;
      }
      stop = true;
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!first_error || first_is_stop) {
        first_error = std::current_exception();
        first_is_stop = false;
      }
      stop = true;
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads);
  try {
    for (unsigned i = 0; i < threads; ++i) pool.emplace_back(body);
  } catch (...) {
    stop = true;
    for (auto& thread : pool) thread.join();
    throw;
  }
  for (auto& thread : pool) thread.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace dsfs::tools::detail
