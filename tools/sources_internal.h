#pragma once
// Helpers shared by the source implementations (not part of the sources interface).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "tools/ingest_object.h"

namespace dsfs::tools::detail {

// Enables the archive formats ingest reads (tar in all its dialects, cpio, zip, 7-Zip, ISO 9660,
// ar, xar, cab, lha, rar) and no others: never mtree, raw or "empty", which take any text file
// (a mistyped URL list) for an archive of empty files.
void enable_archive_formats(struct archive* reader);
// The compressions libarchive decodes with a library linked into dsfs (gzip, bzip2, xz, lzma,
// lzip, zstd, lz4, compress). Never libarchive's "all": that adds lrzip, lzop and grzip, which it
// runs as programs found on PATH, and an ingest of someone else's file must not run a program.
void enable_archive_filters(struct archive* reader);

// curl_global_init, once per process (the first call's failure is rethrown by every call).
void ensure_curl_initialised();

// A modification time in nanoseconds since the epoch, which int64 holds from 1677-09-21 to
// 2262-04-11: a time outside is clamped to that range (a file dated 2300 wrapped round to 1715
// before), with one warning per process naming the first such path.
int64_t mtime_ns_from(int64_t seconds, int64_t nanoseconds, std::string_view path);
inline int64_t mtime_ns_of(const struct stat& st, std::string_view path) {
  return mtime_ns_from(st.st_mtim.tv_sec, st.st_mtim.tv_nsec, path);
}

// Calls `work(index, state, stop)` for every index in [0, count) on min(parallelism, count)
// threads (at least one), each with its own `state` from make_state(). A thread stops taking
// indexes once `stop` is set, and throws StopRequested when the sink asks to stop. The first
// exception thrown on a thread sets `stop` for the others and is rethrown after all have joined;
// a real error is preferred over the StopRequested that other threads throw while unwinding
// because of it.
template <typename MakeState, typename Work>
void run_workers(unsigned parallelism, size_t count, const SourceSink& sink, MakeState make_state,
                 Work work) {
  std::atomic<size_t> next_index{0};
  std::atomic<bool> stop{false};
  std::mutex error_mutex;
  std::exception_ptr first_error;
  bool first_is_stop = false;
  auto body = [&] {
    try {
      auto state = make_state();
      for (;;) {
        if (stop) return;
        sink.check_stop();
        const size_t index = next_index++;
        if (index >= count) return;
        work(index, state, stop);
      }
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
  const auto threads =
      static_cast<unsigned>(std::clamp<size_t>(parallelism, 1, std::max<size_t>(count, 1)));
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
