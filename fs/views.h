#pragma once
// MOUNT/.views/SPEC/NAME/<path of an image>.npy: which SPEC directories exist (the registry),
// how view names map to catalogue entries, and rendering a view file once into a byte-bounded
// cache. What a view file contains is cuda/'s business (view::ViewService); this only routes.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_info.h"
#include "cuda/view_service.h"
#include "cuda/view_spec.h"
#include "fs/inodes.h"
#include "prefetch/dataset_snapshot.h"
#include "prefetch/engine.h"
#include "prefetch/file_reader.h"
#include "prefetch/object_cache.h"
#include "src/store/thread_annotations.h"

namespace dsfs::fs {

// Source files a view shows: JPEG and PNG by extension, any case (.jpg, .jpeg, .png).
bool is_image_name(std::string_view name);
inline constexpr std::string_view kViewSuffix = ".npy";
// "x.JPEG" -> "x.JPEG.npy".
std::string view_file_name(std::string_view source_name);
// "x.JPEG.npy" -> "x.JPEG" when that names an image; nullopt for anything else.
std::optional<std::string_view> view_source_name(std::string_view view_name);

// The SPEC directories of a mount. Each spelling a user enters gets its own slot (its directory
// inode: the kernel does not allow two names for one directory), and every slot points at the
// canonical slot of its spec, whose number the .npy files and the render cache use, so
// `imagenet-eval` and `resize=256,crop=224,...` share files. The presets take slots 0..P-1.
// Slots are never freed (the kernel may hold their inodes), so their number is bounded.
// Thread safety: internally synchronized; mutex_ serializes additions, and a slot once added
// never changes, so lookups of existing slots read it without contention.
class ViewRegistry {
 public:
  static constexpr uint32_t kMaxSlots = kMaxViewSlots;

  struct Slot {
    std::string name;  // the directory name as entered
    uint32_t canonical = 0;
    view::ViewSpec spec;
    std::string header;  // view::npy_header(spec)
    uint64_t file_size = 0;
  };

  // What looking up a SPEC name gave: a slot, or why there is none.
  struct Found {
    std::optional<uint32_t> slot;
    std::string error;  // when !slot: the parse error, or the registry is full
  };

  // A SPEC whose .npy files would be larger than `max_file_bytes` is refused (its directory does
  // not exist, and the lookup says why): such a file could not stay in the view cache, so every
  // READ would render it again. Presets over the limit are refused the same way.
  explicit ViewRegistry(uint32_t max_slots = kMaxSlots, uint64_t max_file_bytes = UINT64_MAX);
  ViewRegistry(const ViewRegistry&) = delete;
  ViewRegistry& operator=(const ViewRegistry&) = delete;

  // The slot of SPEC directory `name`, registering it on first sight.
  Found find_or_add(std::string_view name);
  // A registered slot, or nullptr; lock-free (slots are published once and never change).
  const Slot* slot(uint32_t index) const;
  uint32_t size() const { return size_.load(std::memory_order_acquire); }
  uint32_t preset_count() const { return preset_count_; }
  uint32_t max_slots() const { return max_slots_; }
  uint64_t max_file_bytes() const { return max_file_bytes_; }
  // Why a view file of `file_size` bytes is refused under SPEC `name`; empty when it is not.
  std::string file_size_refusal(std::string_view name, uint64_t file_size) const;

 private:
  uint32_t add_locked(std::string name, view::ViewSpec spec);

  const uint32_t max_slots_;
  const uint64_t max_file_bytes_;
  uint32_t preset_count_ = 0;
  std::vector<std::unique_ptr<const Slot>> slots_;  // max_slots_ long, filled in order
  std::atomic<uint32_t> size_{0};
  std::mutex mutex_;  // serializes additions
  std::unordered_map<std::string, uint32_t> by_name_;
  std::unordered_map<std::string, uint32_t> by_canonical_;
  bool full_logged_ = false;
};

// An image that cannot be decoded: the read fails with EIO, never with a partial tensor.
// A rendered view file: image `entry` of generation `generation` of dataset `dataset`, rendered
// for the canonical SPEC slot `slot`. The view cache is keyed by it, apart from the cache of
// Redis objects.
struct ViewFileKey {
  uint32_t dataset = 0;
  uint32_t slot = 0;
  uint64_t generation = 0;
  uint32_t entry = 0;
  bool operator==(const ViewFileKey&) const = default;
};
struct ViewFileKeyHash {
  size_t operator()(const ViewFileKey& key) const;
};
using ViewCache = prefetch::BasicObjectCache<ViewFileKey, ViewFileKeyHash>;

class ViewRenderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Rendering ahead: the prefetch engine offers each predicted source image once its bytes are
// cached; while a SPEC of that dataset is being read, it is rendered into the view cache.
struct RenderAheadStats {
  unsigned threads = 0;    // 0: off
  uint64_t queued = 0;     // offered, waiting for a thread (or for room in the view cache)
  uint64_t offered = 0;    // predicted sources offered while a view of theirs was read
  uint64_t rendered = 0;   // view files rendered ahead
  uint64_t already = 0;    // offered when already rendered or being rendered (kept for use)
  uint64_t dropped = 0;    // offered while the queue was full, or stale when their turn came
  uint64_t unordered = 0;  // offered without a known order (shuffled, no plan): not rendered
  uint64_t errors = 0;     // undecodable sources met ahead (counted in render_errors too)
  double seconds = 0;      // decode + transform ahead, summed over threads
};

struct ViewStats {
  std::string backend;  // "cpu", "cuda", or "" before start()
  uint32_t specs = 0;   // registered SPEC directories
  uint64_t rendered = 0;
  uint64_t render_errors = 0;  // files that could not be decoded (each counted once)
  uint64_t header_reads = 0;   // reads answered from the header alone, without rendering
  uint64_t bytes_read = 0;     // bytes of view files returned to readers
  double render_seconds = 0;   // fetch + decode + transform, summed over threads
  double fetch_seconds = 0;    // reading the source image through the mount's cache
  // How each view file's first READ past the header found it: rendered already, being rendered
  // (ahead, or by another reader), or rendered by this READ.
  uint64_t reads_ready = 0;
  uint64_t reads_joined = 0;
  uint64_t reads_miss = 0;
  RenderAheadStats ahead;
  view::ViewServiceStats service;
  std::optional<view::CudaBackendInfo> cuda;  // with the CUDA backend: device and stage times
  prefetch::CacheStats cache;
};

// Rendered view files of a mount: the render path, its cache, and rendering ahead.
// Thread safety: internally synchronized; FUSE workers, the engine's source listener and the
// render-ahead threads call it at once. registry_, cache_ and service_ synchronize themselves;
// failed_mutex_ guards failed_; ahead_mutex_ guards the render-ahead state (ahead_queue_,
// active_, ahead_stopping_, ahead_reads_, ahead_no_room_, ahead_room_serial_), with ahead_work_
// waiting on it; counters are atomics.
class ViewFiles {
 public:
  // `source_cache`: where `reader` keeps source images (a source rendered ahead is marked read).
  // A view file may take at most half of `cache_bytes` (kMaxViewFileShare): larger SPECs are
  // refused, so a file is rendered once and then served from the cache, never per READ.
  ViewFiles(prefetch::FileReader& reader, prefetch::ObjectCache& source_cache,
            uint64_t cache_bytes);
  static constexpr uint64_t kMaxViewFileShare = 2;  // a view file <= cache_bytes / this
  ~ViewFiles();
  ViewFiles(const ViewFiles&) = delete;
  ViewFiles& operator=(const ViewFiles&) = delete;

  // Installs the renderer. Call once, after the daemon has forked (CUDA does not survive a fork)
  // and before any read. With an engine and render_ahead_threads > 0, that many threads render
  // the view files of predicted images ahead (the engine must not be started yet, and must be
  // stopped before this object is destroyed).
  void start(std::unique_ptr<view::ViewService> service, prefetch::PrefetchEngine* engine = nullptr,
             unsigned render_ahead_threads = 0);
  bool started() const { return service_ != nullptr; }
  // Stops rendering ahead (waiting for the renders under way). Idempotent.
  void stop();

  // A READ of [offset, offset + length) of the view file of image `entry` under canonical slot
  // `canonical_slot`: counts it, reports a read from offset 0 to the prefetch engine (as a read
  // of the source image: the order is the same) and returns the rendered file, or nullptr when
  // the range lies within the header. A READ reaching the end marks the file read in the cache.
  // Throws ViewRenderError for an undecodable image (logged and counted once per file, and
  // remembered, so later reads fail at once), and what FileReader throws.
  prefetch::ObjectBuffer read(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                              uint32_t canonical_slot, uint64_t offset, uint64_t length);

  ViewRegistry& registry() { return registry_; }
  const ViewRegistry& registry() const { return registry_; }

  // Plan lines naming view files (.views/SPEC/NAME/path.npy) stand for their source images
  // (NAME/path); the SPEC becomes the one rendered ahead for NAME. nullopt for other lines.
  std::optional<std::string> plan_source_path(
      std::string_view line, const std::vector<const prefetch::DatasetSnapshot*>& listed);

  ViewStats stats() const;

 private:
  struct AheadItem {
    const prefetch::DatasetSnapshot* dataset = nullptr;
    uint32_t entry = 0;
    uint32_t slot = 0;  // canonical
    uint64_t rank = 0;
    uint64_t offered_at = 0;  // ahead_reads_ when offered
    prefetch::ObjectBuffer source;
  };
  // The SPEC of a dataset read most recently, and when: what its predicted images are rendered as.
  struct ActiveView {
    uint32_t slot = 0;
    std::chrono::steady_clock::time_point last_read{};
    std::vector<uint64_t> read_at;  // by entry: ahead_reads_ when its view was last opened
  };

  ViewFileKey key_of(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                     uint32_t canonical_slot) const;
  // The whole file (header then tensor) under `key` from the cache, or fetched and rendered once
  // however many readers ask at the same time; `outcome` receives how the cache found it.
  prefetch::ObjectBuffer rendered(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                  const ViewRegistry::Slot& slot, const ViewFileKey& key,
                                  prefetch::ReadOutcome& outcome);
  prefetch::ObjectBuffer render(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                const ViewRegistry::Slot& slot, const ViewFileKey& key);
  // Decodes and transforms `encoded`; throws ViewRenderError (logged, counted and remembered).
  prefetch::ObjectBuffer render_bytes(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                      const ViewRegistry::Slot& slot, const ViewFileKey& key,
                                      std::span<const std::byte> encoded);
  // `entry`: the view file opened (a plan names no file yet).
  void set_active(const prefetch::DatasetSnapshot& dataset, uint32_t canonical_slot,
                  std::optional<uint32_t> entry);
  void offer(const prefetch::DatasetSnapshot& dataset, uint32_t entry, uint64_t rank,
             prefetch::ObjectBuffer source);
  // Queues `item` by rank (the queue is kept sorted). Needs ahead_mutex_.
  void enqueue_locked(AheadItem item);
  void render_ahead_loop();
  // Renders one offered source; false when the view cache has no room for it yet.
  bool render_ahead(AheadItem& item);

  prefetch::FileReader& reader_;
  prefetch::ObjectCache& source_cache_;
  ViewRegistry registry_;
  ViewCache cache_;
  std::unique_ptr<view::ViewService> service_;
  // Undecodable files by cache key, with the reason: the bytes are immutable, so they stay so.
  mutable Mutex failed_mutex_;
  std::unordered_map<ViewFileKey, std::string, ViewFileKeyHash> failed_
      DSFS_GUARDED_BY(failed_mutex_);
  std::atomic<uint64_t> render_errors_{0};
  std::atomic<uint64_t> header_reads_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> render_ns_{0};
  std::atomic<uint64_t> fetch_ns_{0};
  std::atomic<uint64_t> reads_ready_{0};
  std::atomic<uint64_t> reads_joined_{0};
  std::atomic<uint64_t> reads_miss_{0};

  // Rendering ahead.
  mutable std::mutex ahead_mutex_;
  std::condition_variable ahead_work_;  // an offer, room in the view cache, or stopping
  std::deque<AheadItem> ahead_queue_;
  std::vector<ActiveView> active_;  // by dataset index; slot 0 with no last_read: none
  bool ahead_stopping_ = false;
  uint64_t ahead_reads_ = 0;        // view files opened (of active datasets), a clock for read_at
  bool ahead_no_room_ = false;      // the view cache had no room for the next one
  uint64_t ahead_room_serial_ = 0;  // view files read to their end, which frees room
  std::vector<std::thread> ahead_threads_;
  std::atomic<uint64_t> ahead_offered_{0};
  std::atomic<uint64_t> ahead_rendered_{0};
  std::atomic<uint64_t> ahead_already_{0};
  std::atomic<uint64_t> ahead_dropped_{0};
  std::atomic<uint64_t> ahead_unordered_{0};
  std::atomic<uint64_t> ahead_errors_{0};
  std::atomic<uint64_t> ahead_ns_{0};
};

}  // namespace dsfs::fs
