#pragma once
// Live counters of a mount, served as MOUNT/.dsfs/stats.json.
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/dataset_watcher.h"
#include "fs/memory_trimmer.h"
#include "fs/views.h"
#include "prefetch/dataset_snapshot.h"
#include "prefetch/disk_tier.h"
#include "prefetch/engine.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "prefetch/read_stats.h"
#include "src/store/value_buffer.h"

namespace dsfs::fs {

enum class Op : uint8_t {
  kInit,
  kLookup,
  kGetattr,
  kOpen,
  kRead,
  kForget,
  kOpendir,
  kReaddir,
  kReaddirplus,
  kReleasedir,
  kStatfs,
  kGetxattr,
  kListxattr,
  kIoctl,  // answered ENOTTY; Python's open() asks isatty() of every file (see filesystem.cpp)
  kFlush,  // answered ENOSYS once, after which the kernel sends no more
  kWrite,  // any modifying request; always answered EROFS
  kCount,
};
std::string_view op_name(Op op);

// Why a request failed, for the errors section of stats.json.
enum class ErrorKind : uint8_t {
  kNotFound,     // ENOENT from lookup or a stale inode
  kReadOnly,     // EROFS
  kIntegrity,    // EIO: missing key, wrong length or checksum
  kUnavailable,  // EIO: Redis unreachable for the whole timeout
  kRedisError,   // EIO: Redis answered with an error
  kInternal,     // EIO: anything else
  kCount,
};
std::string_view error_kind_name(ErrorKind kind);

// Thread safety: atomic counters, bumped by every FUSE worker and read by the stats snapshot
// without a lock.
struct FsCounters {
  std::array<std::atomic<uint64_t>, static_cast<size_t>(Op::kCount)> requests{};
  std::array<std::atomic<uint64_t>, static_cast<size_t>(ErrorKind::kCount)> errors{};
  // Dataset files read from offset 0 by the kernel: page-cache misses, since OPEN is skipped.
  std::atomic<uint64_t> files_read{0};
  std::atomic<uint64_t> bytes_read{0};  // bytes of dataset files returned to readers

  void count(Op op) { requests[static_cast<size_t>(op)].fetch_add(1, std::memory_order_relaxed); }
  void count(ErrorKind kind) {
    errors[static_cast<size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
  }
};

struct StatsSources {
  const FsCounters& fs;
  const prefetch::FetcherStats& fetcher;
  prefetch::CacheStats cache;
  std::optional<prefetch::DiskTierStats> disk_tier;  // none without --disk-cache
  uint64_t redis_connects = 0;
  ViewStats views;
  const prefetch::ReadStats& reads;
  prefetch::EngineStats prefetch;
  uint64_t plan_unresolved = 0;  // plan lines that named no file of the mount
  const std::vector<const prefetch::DatasetSnapshot*>& datasets;  // those listed
  const WatchStats& watch;
  const WatchOptions& watch_options;
  std::chrono::steady_clock::time_point started;
  std::string_view redis_endpoint;  // already redacted
  std::string_view ns;
  MemoryTrimmer::Stats memory;
  store::ValueBufferReuseStats buffer_reuse;  // object buffers kept for reuse
  uint64_t resident_bytes = 0;                // the daemon's RSS (fs::resident_bytes)
};

std::string render_stats_json(const StatsSources& sources);

}  // namespace dsfs::fs
