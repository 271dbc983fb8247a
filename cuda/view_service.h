#pragma once
// Renders view files: encoded image in, whole .npy file (header then tensor) out. Decoding runs
// on the calling thread (the mount has many request threads); the transform runs inline on the
// CPU backend, while for the CUDA backend a few batcher threads gather concurrent callers'
// images for up to a short window (or a full batch) and hand them to the GPU together.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/backend.h"
#include "cuda/image_decode.h"
#include "cuda/view_spec.h"

namespace dsfs::view {

// The memory all renders in flight may hold at once by default (decoded pixels, the transform's
// working rows, the rendered file); `dsfs mount --view-render-memory`.
inline constexpr std::uint64_t kDefaultRenderMemoryBytes = std::uint64_t{1} << 30;
// How long a render waits for its share of that memory before its READ fails (EIO).
inline constexpr std::chrono::milliseconds kDefaultRenderMemoryWait{30000};

// A render that waited longer than its limit for room in the render memory budget: the image
// is fine, the mount was busy; the READ fails (EIO) and a later one may succeed.
class RenderBusyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A byte budget shared by every render in flight. A render reserves all it will need at once,
// from the image's header, before allocating any of it, and holds nothing else while waiting,
// so reservations cannot deadlock; one larger than the whole budget is refused at once.
// Thread-safe.
class RenderMemoryBudget {
 public:
  explicit RenderMemoryBudget(std::uint64_t capacity_bytes) : capacity_(capacity_bytes) {}
  RenderMemoryBudget(const RenderMemoryBudget&) = delete;
  RenderMemoryBudget& operator=(const RenderMemoryBudget&) = delete;

  // Bytes reserved from a budget, given back when destroyed. Move-only.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept
        : budget_(std::exchange(other.budget_, nullptr)), bytes_(other.bytes_) {}
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation() { release(); }
    std::uint64_t bytes() const { return budget_ ? bytes_ : 0; }

   private:
    friend class RenderMemoryBudget;
    Reservation(RenderMemoryBudget* budget, std::uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    void release();
    RenderMemoryBudget* budget_ = nullptr;
    std::uint64_t bytes_ = 0;
  };

  // Waits up to `wait` for `bytes` to fit. Throws DecodeError when `bytes` exceeds the whole
  // budget (it never will fit: the file is refused for good), RenderBusyError on timeout.
  Reservation reserve(std::uint64_t bytes, std::chrono::milliseconds wait);

  std::uint64_t capacity() const { return capacity_; }
  std::uint64_t in_use() const;
  std::uint64_t peak() const;       // the most in use at once since the start
  std::uint64_t refused() const;    // reservations larger than the budget
  std::uint64_t timed_out() const;  // reservations that waited too long

 private:
  const std::uint64_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  std::uint64_t in_use_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t refused_ = 0;
  std::uint64_t timed_out_ = 0;
};

struct ViewServiceOptions {
  // Batch the transforms of concurrent callers; default (nullopt): only for the CUDA backend,
  // where a launch per image would waste the GPU. The CPU backend gains nothing from it.
  std::optional<bool> batched;
  std::size_t max_batch = 32;                    // images per transform() call at most
  std::chrono::microseconds batch_window{1000};  // how long a batch waits for more images
  unsigned batch_threads = 2;                    // batches in flight (copies overlap kernels)
  std::uint64_t max_pixels = kDefaultMaxPixels;  // larger images are refused by their header
  std::uint64_t render_memory_bytes = kDefaultRenderMemoryBytes;  // shared by renders in flight
  std::chrono::milliseconds render_memory_wait = kDefaultRenderMemoryWait;
};

// Totals since the service started; seconds are summed over calling threads.
struct ViewServiceStats {
  std::uint64_t rendered = 0;       // files rendered
  std::uint64_t decode_errors = 0;  // images that could not be decoded (DecodeError)
  std::uint64_t transform_errors = 0;
  std::uint64_t batches = 0;         // transform() calls of the batchers
  std::uint64_t batched_images = 0;  // images they carried
  double decode_seconds = 0;
  double transform_seconds = 0;  // including the wait for a batch to form
  // The render memory budget: its size, the most reserved at once, renders refused because
  // they alone exceed it, and renders that waited too long for room (both EIO).
  std::uint64_t memory_capacity = 0;
  std::uint64_t memory_peak = 0;
  std::uint64_t memory_refused = 0;
  std::uint64_t memory_timed_out = 0;
};

class ViewService {
 public:
  explicit ViewService(std::unique_ptr<Backend> backend, ViewServiceOptions options = {});
  // Finishes the batches already queued, then stops the batchers. No render() may be running.
  ~ViewService();
  ViewService(const ViewService&) = delete;
  ViewService& operator=(const ViewService&) = delete;

  // The whole .npy file of `encoded` under `spec`: npy_header(spec) then the tensor. Throws
  // DecodeError for bytes that are not a decodable JPEG/PNG (never a partial file), for an image
  // of more than options.max_pixels pixels, or one whose render needs more than the whole render
  // memory budget; RenderBusyError when room in that budget did not come in time; and what the
  // backend throws for a failed transform. Safe to call from many threads at once.
  std::string render(const ViewSpec& spec, std::span<const std::byte> encoded);

  // The memory a render of an image with `header` under `spec` holds at its peak: the decoded
  // image and the decoder's scratch, the transform's working rows and pixels, the .npy file.
  static std::uint64_t render_memory_bytes(const ViewSpec& spec, const ImageHeader& header);

  // The tensor of an already decoded image into `output` (spec.tensor_bytes() bytes), batched
  // with other callers' images when the service batches.
  void transform(const ViewSpec& spec, const RgbImage& image, std::span<std::byte> output);

  std::string_view backend_name() const { return backend_->name(); }
  const Backend& backend() const { return *backend_; }
  bool batched() const { return batched_; }
  ViewServiceStats stats() const;

 private:
  struct Request {
    const ViewSpec* spec = nullptr;
    const RgbImage* image = nullptr;
    std::span<std::byte> output;
    bool done = false;
    std::exception_ptr failure;
  };

  void transform_batched(Request& request);
  void batch_loop();
  // Takes up to max_batch queued requests with the first one's spec (others wait their turn).
  std::vector<Request*> take_batch_locked();

  std::unique_ptr<Backend> backend_;
  ViewServiceOptions options_;
  bool batched_ = false;
  RenderMemoryBudget memory_;

  std::mutex mutex_;
  std::condition_variable queued_;    // a request arrived, or stopping_
  std::condition_variable finished_;  // a batch completed
  std::deque<Request*> queue_;
  bool collecting_ = false;  // one batcher at a time gathers a batch; the others transform
  bool stopping_ = false;
  std::vector<std::thread> batchers_;

  std::atomic<std::uint64_t> rendered_{0};
  std::atomic<std::uint64_t> decode_errors_{0};
  std::atomic<std::uint64_t> transform_errors_{0};
  std::atomic<std::uint64_t> batches_{0};
  std::atomic<std::uint64_t> batched_images_{0};
  std::atomic<std::uint64_t> decode_ns_{0};
  std::atomic<std::uint64_t> transform_ns_{0};
};

}  // namespace dsfs::view
