#pragma once
// The read-only filesystem behind a mount: FUSE low-level request handlers over the mounted
// datasets' catalogues, the generated files and the read path.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cuda/backend.h"
#include "fs/inodes.h"
#include "fs/stats.h"
#include "fs/views.h"
#include "prefetch/dataset_snapshot.h"
#include "prefetch/engine.h"
#include "prefetch/file_reader.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "src/store/pool.h"
#include "src/store/thread_annotations.h"

struct fuse_lowlevel_ops;

namespace dsfs::fs {

inline constexpr uint64_t kDefaultConnections = 8;
// Rendered view files kept for readers still reading them (the page cache keeps them after).
inline constexpr uint64_t kDefaultViewCacheBytes = uint64_t{256} << 20;

// A cache that fits comfortably: 1 GiB, or an eighth of physical memory when that is less
// (but at least 64 MiB).
uint64_t default_cache_bytes();

struct FilesystemOptions {
  std::string ns = "dsfs";
  uint64_t cache_bytes = default_cache_bytes();
  std::chrono::milliseconds timeout{30000};  // a read's retry budget while Redis is away
  bool verify = false;                       // check every file's checksum on fetch
  size_t connections = kDefaultConnections;
  view::BackendKind view_backend = view::BackendKind::kAuto;  // renders MOUNT/.views files
  uint64_t view_cache_bytes = kDefaultViewCacheBytes;
  // Threads rendering predicted view files ahead (needs prefetching); 0: render only when read.
  unsigned view_render_ahead_threads = 0;
  uint64_t view_max_pixels = view::kDefaultMaxPixels;  // larger images are refused (EIO)
  // Memory all view renders in flight share (decoded pixels, working rows, the file).
  uint64_t view_render_memory_bytes = view::kDefaultRenderMemoryBytes;
  prefetch::PrefetchMode prefetch = prefetch::PrefetchMode::kAuto;
  size_t max_inflight = 0;  // 0: derived from the cache size
};

// Thread safety: the FUSE session calls its handlers from many worker threads at once; every
// member it reaches synchronizes itself (pool, cache, fetcher, reader, engine, views: see their
// headers; counters_ are atomics; datasets_, dataset_by_name_ and meta_ are immutable after
// construction). stats_snapshots_mutex_ guards stats_snapshots_ and last_stats_snapshot_.
// no_open_ and no_opendir_ are written once by init, before any other request.
class Filesystem {
 public:
  // Connections are made on the first read, never here, so a Filesystem can be built before
  // the mount daemonizes.
  Filesystem(store::RedisEndpoint endpoint, std::vector<prefetch::DatasetSnapshot> datasets,
             FilesystemOptions options);
  ~Filesystem();
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // The request handlers; the session's userdata must be this Filesystem.
  static const fuse_lowlevel_ops& operations();

  // The session's max_read mount option; libfuse insists that init() repeats it.
  void set_max_read(uint32_t bytes) { max_read_ = bytes; }

  // Makes the view backend (options().view_backend) and starts rendering MOUNT/.views files.
  // Call once before serving, after any fork: CUDA state does not survive one. Throws (naming
  // the reason) when the backend asked for cannot be used, e.g. cuda without a GPU.
  void start_views();
  // Starts fetching ahead (options().prefetch). Like start_views, after any fork.
  void start_prefetch() { engine_.start(); }

  const std::vector<prefetch::DatasetSnapshot>& datasets() const { return datasets_; }
  const FilesystemOptions& options() const { return options_; }
  std::string stats_json() const;
  const FsCounters& counters() const { return counters_; }
  const prefetch::ObjectCache& cache() const { return cache_; }
  const ViewFiles& views() const { return views_; }
  prefetch::PrefetchEngine& engine() { return engine_; }

 private:
  friend struct Handlers;
  // Text of a generated .meta file, rendered on first use.
  const std::string& meta_content(uint32_t dataset, MetaFile file);

  // .dsfs/stats.json: every lookup renders a snapshot under a new inode (entry timeout 0). A
  // snapshot never changes, so it is served like any immutable file, page cache included, which
  // is what lets the mount skip OPEN (no per-open direct_io). FORGET frees a snapshot; any left
  // when the kernel unmounts without forgetting are freed with the Filesystem.
  using StatsSnapshot = std::shared_ptr<const std::string>;
  uint64_t new_stats_snapshot();                     // its inode, with one lookup
  StatsSnapshot stats_snapshot(uint64_t ino) const;  // nullptr for an unknown inode
  void forget_stats_snapshot(uint64_t ino, uint64_t lookups);

  struct MetaContents {
    std::array<std::once_flag, 5> once;
    std::array<std::string, 5> text;
  };

  FilesystemOptions options_;
  std::vector<prefetch::DatasetSnapshot> datasets_;
  std::unordered_map<std::string, uint32_t> dataset_by_name_;
  std::vector<std::unique_ptr<MetaContents>> meta_;
  store::ConnectionPool pool_;
  prefetch::ObjectCache cache_;
  prefetch::ObjectFetcher fetcher_;
  prefetch::FileReader reader_;
  prefetch::PrefetchEngine engine_;
  ViewFiles views_;
  FsCounters counters_;
  struct CountedSnapshot {
    StatsSnapshot text;
    uint64_t lookups = 0;
  };
  mutable Mutex stats_snapshots_mutex_;
  std::unordered_map<uint64_t, CountedSnapshot> stats_snapshots_
      DSFS_GUARDED_BY(stats_snapshots_mutex_);
  uint64_t last_stats_snapshot_ DSFS_GUARDED_BY(stats_snapshots_mutex_) = kStatsSnapshotBase;
  // The kernel skips OPEN and RELEASE for files (FUSE_CAP_NO_OPEN_SUPPORT): set by init.
  bool no_open_ = false;
  // Nor OPENDIR and RELEASEDIR for directories (FUSE_CAP_NO_OPENDIR_SUPPORT): set by init.
  bool no_opendir_ = false;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  const int64_t mounted_unix_;
  const uint32_t owner_uid_;
  const uint32_t owner_gid_;
  uint32_t max_read_ = 0;
};

}  // namespace dsfs::fs
