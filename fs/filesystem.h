#pragma once
// The read-only filesystem behind a mount: FUSE low-level request handlers over the mounted
// datasets' catalogues, the generated files and the read path.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "cuda/backend.h"
#include "fs/dataset_watcher.h"
#include "fs/inodes.h"
#include "fs/memory_trimmer.h"
#include "fs/node.h"
#include "fs/nodes/control_node.h"
#include "fs/nodes/dataset_node.h"
#include "fs/nodes/meta_node.h"
#include "fs/nodes/root_node.h"
#include "fs/nodes/view_node.h"
#include "fs/stats.h"
#include "fs/views.h"
#include "prefetch/dataset_snapshot.h"
#include "prefetch/engine.h"
#include "prefetch/file_reader.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "src/store/client.h"

struct fuse_lowlevel_ops;
struct fuse_session;

namespace dsfs::fs {

inline constexpr uint64_t kDefaultConnections = 8;
// Threads staging from the disk tier (--disk-cache-readers): the disk's queue depth. Cold reads
// of a tier rose with threads up to 16, the most measured on this project's VM
// (docs/benchmarks.md).
inline constexpr uint64_t kDefaultDiskStagers = 16;
// Rendered view files kept for readers still reading them (the page cache keeps them after).
inline constexpr uint64_t kDefaultViewCacheBytes = uint64_t{256} << 20;

// A cache that fits comfortably: 1 GiB, or an eighth of physical memory when that is less
// (but at least 64 MiB).
uint64_t default_cache_bytes();

// Watching without polling: only `dsfs refresh` changes the datasets.
inline WatchOptions no_polling() {
  WatchOptions options;
  options.interval = std::chrono::milliseconds{0};
  return options;
}

struct FilesystemOptions {
  std::string ns = "dsfs";
  uint64_t cache_bytes = default_cache_bytes();
  std::chrono::milliseconds timeout{30000};  // a read's retry budget while Redis is away
  bool verify = false;                       // check every file's checksum on fetch
  size_t connections = kDefaultConnections;
  // Which copies of a cluster's objects reads may use (--read-from).
  store::ReadFrom read_from = store::ReadFrom::kPrimary;
  view::BackendKind view_backend = view::BackendKind::kAuto;  // renders MOUNT/.views files
  uint64_t view_cache_bytes = kDefaultViewCacheBytes;
  // Threads rendering predicted view files ahead (needs prefetching); 0: render only when read.
  unsigned view_render_ahead_threads = 0;
  uint64_t view_max_pixels = view::kDefaultMaxPixels;  // larger images are refused (EIO)
  // Memory all view renders in flight share (decoded pixels, working rows, the file).
  uint64_t view_render_memory_bytes = view::kDefaultRenderMemoryBytes;
  prefetch::PrefetchMode prefetch = prefetch::PrefetchMode::kAuto;
  size_t max_inflight = 0;                    // 0: derived from the cache size
  size_t disk_stagers = kDefaultDiskStagers;  // with disk_tier: threads staging from it
  // Datasets appearing, going and being refreshed while mounted. No polling by default here;
  // `dsfs mount` polls every --watch-interval.
  WatchOptions watch = no_polling();
  // Pins each generation the watcher lists (and is told of those it stops serving); null: no
  // leases. Must outlive the Filesystem.
  GenerationLeases* leases = nullptr;
  // The client the watcher polls and refreshes through; null: the read path's. `dsfs mount`
  // gives the leases' client, whose short timeouts let a pass under way when Redis is down end
  // soon after an unmount (with the reads' --timeout it held the daemon's exit for 30 s).
  // Must outlive the Filesystem.
  store::Client* control_client = nullptr;
  // The local-disk tier (--disk-cache) between the object cache and Redis; null: none. Must
  // outlive the Filesystem; its writer is started by whoever opened it (after any fork).
  prefetch::DiskTier* disk_tier = nullptr;
};

// The client options a mount's reads use: a pool of options.connections per node, connect and
// I/O timeouts that break a stalled server's connection well within options.timeout (the
// retry budget), options.read_from.
store::ClientOptions client_options(const FilesystemOptions& options);

// The FUSE request handlers (filesystem.cpp) are thin glue: they decode an inode, ask the Node
// of its kind (fs/node.h, fs/nodes/) and turn the answer into a reply. This class owns the read
// path and one instance of each node kind.
//
// Thread safety: the FUSE session calls its handlers from many worker threads at once; every
// member it reaches synchronizes itself (pool, cache, fetcher, reader, engine, views and the
// nodes: see their headers; counters_ are atomics; tree_ is immutable). no_open_ and
// no_opendir_ are written once by init, before any other request.
class Filesystem {
 public:
  // Opens no connection and starts no thread, so a Filesystem can be built before the mount
  // daemonizes (connections the client already holds are the child's after the fork: the
  // parent _exits). Throws std::invalid_argument for datasets a mount cannot hold (MountTree).
  Filesystem(std::shared_ptr<store::Client> client, std::vector<prefetch::DatasetSnapshot> datasets,
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
  // Starts polling Redis for datasets that appear, go or change (options().watch). Like
  // start_views, after any fork.
  void start_watching() { watcher_.start(); }
  // Starts giving freed memory back to the system when reads pause (MemoryTrimmer). Like
  // start_views, after any fork.
  void start_memory_trimming() { trimmer_.start(); }

  // The FUSE session serving this filesystem, told of every change of the tree (the kernel's
  // cached names and listings are invalidated); nullptr while none is (Session sets it).
  void attach_session(fuse_session* session);
  DatasetWatcher& watcher() { return watcher_; }

  const MountTree& tree() const { return tree_; }
  MountTree& tree() { return tree_; }
  const FilesystemOptions& options() const { return options_; }
  std::string stats_json() const;
  // The same snapshot as stats_json, in the Prometheus text format (fs/metrics.h).
  std::string metrics_text() const;
  const FsCounters& counters() const { return counters_; }
  const prefetch::ObjectCache& cache() const { return cache_; }
  const ViewFiles& views() const { return views_; }
  prefetch::PrefetchEngine& engine() { return engine_; }

  // The node that answers for inodes of `kind`; nullptr for kInvalid.
  Node* node(InodeRef::Kind kind) const { return nodes_[static_cast<size_t>(kind)]; }

 private:
  friend struct Handlers;
  // After the watcher changed the tree: predicts for the datasets listed now and invalidates
  // what the kernel cached of `names` and of the directories listing them.
  void datasets_changed(const std::vector<std::string>& names);
  // Renders one snapshot of every counter with `render`: stats.json and /metrics share it.
  std::string render_snapshot(std::string (*render)(const StatsSources&)) const;
  // A write to a read-only file was refused: the kernel's cached pages of `inode` are dropped
  // soon, from a thread of its own (started at the first). Root may open any file O_RDWR (the
  // kernel sends no OPEN to refuse it) and map it shared and writable: its stores change the
  // page cache in place, and a refused writeback would leave the changed bytes there for every
  // reader. Dropping them from the handler could wait on pages whose writeback waits for
  // another handler's reply.
  void drop_pages_later(uint64_t inode);
  void drop_pages_loop(std::stop_token stop);

  FilesystemOptions options_;
  MountTree tree_;
  std::shared_ptr<store::Client> client_;
  prefetch::ObjectCache cache_;
  prefetch::ObjectFetcher fetcher_;
  prefetch::FileReader reader_;
  prefetch::PrefetchEngine engine_;
  ViewFiles views_;
  FsCounters counters_;
  RootNode root_node_;
  DatasetNode dataset_node_;
  MetaNode meta_node_;
  ViewNode view_node_;
  ControlNode control_node_;
  std::array<Node*, kInodeKindCount> nodes_{};
  Mutex session_mutex_;
  fuse_session* session_ DSFS_GUARDED_BY(session_mutex_) = nullptr;
  // Stopped (and destroyed) before anything its passes reach.
  DatasetWatcher watcher_;
  // Last: its thread reads counters_ and fetcher_.
  MemoryTrimmer trimmer_;
  // drop_pages_later's inodes and thread; the thread is declared last, so it stops first.
  std::mutex drop_mutex_;
  std::condition_variable_any drop_work_;
  std::set<uint64_t> drop_pending_;  // guarded by drop_mutex_
  std::atomic<bool> refused_write_logged_{false};
  std::jthread drop_thread_;  // started (under drop_mutex_) at the first refused write
  // The kernel skips OPEN and RELEASE for files (FUSE_CAP_NO_OPEN_SUPPORT): set by init.
  bool no_open_ = false;
  // Nor OPENDIR and RELEASEDIR for directories (FUSE_CAP_NO_OPENDIR_SUPPORT): set by init.
  bool no_opendir_ = false;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  uint32_t max_read_ = 0;
};

}  // namespace dsfs::fs
