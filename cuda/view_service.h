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
#include <vector>

#include "cuda/backend.h"
#include "cuda/image_decode.h"
#include "cuda/view_spec.h"

namespace dsfs::view {

struct ViewServiceOptions {
  // Batch the transforms of concurrent callers; default (nullopt): only for the CUDA backend,
  // where a launch per image would waste the GPU. The CPU backend gains nothing from it.
  std::optional<bool> batched;
  std::size_t max_batch = 32;                    // images per transform() call at most
  std::chrono::microseconds batch_window{1000};  // how long a batch waits for more images
  unsigned batch_threads = 2;                    // batches in flight (copies overlap kernels)
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
};

class ViewService {
 public:
  explicit ViewService(std::unique_ptr<Backend> backend, ViewServiceOptions options = {});
  // Finishes the batches already queued, then stops the batchers. No render() may be running.
  ~ViewService();
  ViewService(const ViewService&) = delete;
  ViewService& operator=(const ViewService&) = delete;

  // The whole .npy file of `encoded` under `spec`: npy_header(spec) then the tensor. Throws
  // DecodeError for bytes that are not a decodable JPEG/PNG (never a partial file), and what the
  // backend throws for a failed transform. Safe to call from many threads at once.
  std::string render(const ViewSpec& spec, std::span<const std::byte> encoded);

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
