#pragma once
// MOUNT/.views/SPEC/NAME/<path of an image>.npy: which SPEC directories exist (the registry),
// how view names map to catalogue entries, and rendering a view file once into a byte-bounded
// cache. What a view file contains is cuda/'s business (view::ViewService); this only routes.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cuda/cuda_info.h"
#include "cuda/view_service.h"
#include "cuda/view_spec.h"
#include "fs/inodes.h"
#include "prefetch/dataset_snapshot.h"
#include "prefetch/file_reader.h"
#include "prefetch/object_cache.h"

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

  explicit ViewRegistry(uint32_t max_slots = kMaxSlots);
  ViewRegistry(const ViewRegistry&) = delete;
  ViewRegistry& operator=(const ViewRegistry&) = delete;

  // The slot of SPEC directory `name`, registering it on first sight.
  Found find_or_add(std::string_view name);
  // A registered slot, or nullptr; lock-free (slots are published once and never change).
  const Slot* slot(uint32_t index) const;
  uint32_t size() const { return size_.load(std::memory_order_acquire); }
  uint32_t preset_count() const { return preset_count_; }
  uint32_t max_slots() const { return max_slots_; }

 private:
  uint32_t add_locked(std::string name, view::ViewSpec spec);

  const uint32_t max_slots_;
  uint32_t preset_count_ = 0;
  std::vector<std::unique_ptr<const Slot>> slots_;  // max_slots_ long, filled in order
  std::atomic<uint32_t> size_{0};
  std::mutex mutex_;  // serializes additions
  std::unordered_map<std::string, uint32_t> by_name_;
  std::unordered_map<std::string, uint32_t> by_canonical_;
  bool full_logged_ = false;
};

// An image that cannot be decoded: the read fails with EIO, never with a partial tensor.
class ViewRenderError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
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
  view::ViewServiceStats service;
  std::optional<view::CudaBackendInfo> cuda;  // with the CUDA backend: device and stage times
  prefetch::CacheStats cache;
};

// Rendered view files of a mount: the render path and its cache.
class ViewFiles {
 public:
  ViewFiles(prefetch::FileReader& reader, uint64_t cache_bytes);
  ~ViewFiles();
  ViewFiles(const ViewFiles&) = delete;
  ViewFiles& operator=(const ViewFiles&) = delete;

  // Installs the renderer. Call once, after the daemon has forked (CUDA does not survive a fork)
  // and before any read.
  void start(std::unique_ptr<view::ViewService> service);
  bool started() const { return service_ != nullptr; }

  ViewRegistry& registry() { return registry_; }
  const ViewRegistry& registry() const { return registry_; }

  // The whole rendered file (header then tensor) of image `entry` of `dataset` under registered
  // slot `canonical_slot` (a canonical one): from the cache, or fetched and rendered once however
  // many readers ask at the same time. Throws ViewRenderError for an undecodable image (logged and
  // counted once per file, and remembered, so later reads fail at once), and what FileReader
  // throws.
  prefetch::ObjectBuffer rendered(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                  uint32_t canonical_slot);
  // A READ of a view file answered with `bytes`; `header_only`: without rendering.
  void count_read(uint64_t bytes, bool header_only) {
    bytes_read_.fetch_add(bytes, std::memory_order_relaxed);
    if (header_only) header_reads_.fetch_add(1, std::memory_order_relaxed);
  }

  ViewStats stats() const;

 private:
  prefetch::ObjectBuffer render(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                const ViewRegistry::Slot& slot, const prefetch::ObjectKey& key);

  prefetch::FileReader& reader_;
  ViewRegistry registry_;
  prefetch::ObjectCache cache_;  // key: {dataset, chunk = canonical slot, generation, entry}
  std::unique_ptr<view::ViewService> service_;
  // Undecodable files by cache key, with the reason: the bytes are immutable, so they stay so.
  mutable std::mutex failed_mutex_;
  std::unordered_map<prefetch::ObjectKey, std::string, prefetch::ObjectKeyHash> failed_;
  std::atomic<uint64_t> render_errors_{0};
  std::atomic<uint64_t> header_reads_{0};
  std::atomic<uint64_t> bytes_read_{0};
  std::atomic<uint64_t> render_ns_{0};
  std::atomic<uint64_t> fetch_ns_{0};
};

}  // namespace dsfs::fs
