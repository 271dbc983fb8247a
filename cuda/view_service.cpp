#include "cuda/view_service.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "cuda/npy.h"
#include "src/store/thread_name.h"

namespace dsfs::view {
namespace {

std::uint64_t nanoseconds_since(std::chrono::steady_clock::time_point start) {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
}

double to_seconds(std::uint64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

constexpr std::uint64_t kMiB = 1 << 20;

}  // namespace

// ---- RenderMemoryBudget -------------------------------------------------------------------------

RenderMemoryBudget::Reservation& RenderMemoryBudget::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    release();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = other.bytes_;
  }
  return *this;
}

void RenderMemoryBudget::Reservation::release() {
  if (!budget_) return;
  {
    std::lock_guard lock(budget_->mutex_);
    budget_->in_use_ -= bytes_;
  }
  budget_->released_.notify_all();
  budget_ = nullptr;
}

RenderMemoryBudget::Reservation RenderMemoryBudget::reserve(std::uint64_t bytes,
                                                            std::chrono::milliseconds wait) {
  std::unique_lock lock(mutex_);
  if (bytes > capacity_) {
    ++refused_;
    throw DecodeError(
        fmt::format("rendering it needs {} MiB, more than the {} MiB all renders may hold at once "
                    "(--view-render-memory); use a smaller resize/crop, or remount with a larger "
                    "--view-render-memory or a smaller --view-max-pixels",
                    (bytes + kMiB - 1) / kMiB, capacity_ / kMiB));
  }
  if (!released_.wait_for(lock, wait, [&] { return capacity_ - in_use_ >= bytes; })) {
    ++timed_out_;
    throw RenderBusyError(fmt::format(
        "waited {} ms for {} MiB of the render memory budget ({} MiB, --view-render-memory, "
        "{} MiB in use by other renders); try again, or read fewer large views at once",
        wait.count(), (bytes + kMiB - 1) / kMiB, capacity_ / kMiB, in_use_ / kMiB));
  }
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  return Reservation(this, bytes);
}

std::uint64_t RenderMemoryBudget::in_use() const {
  std::lock_guard lock(mutex_);
  return in_use_;
}

std::uint64_t RenderMemoryBudget::peak() const {
  std::lock_guard lock(mutex_);
  return peak_;
}

std::uint64_t RenderMemoryBudget::refused() const {
  std::lock_guard lock(mutex_);
  return refused_;
}

std::uint64_t RenderMemoryBudget::timed_out() const {
  std::lock_guard lock(mutex_);
  return timed_out_;
}

// ---- ViewService --------------------------------------------------------------------------------

std::uint64_t ViewService::render_memory_bytes(const ViewSpec& spec, const ImageHeader& header) {
  const auto out_width = static_cast<std::uint64_t>(spec.out_width());
  const auto out_height = static_cast<std::uint64_t>(spec.out_height());
  // The CPU transform's horizontal pass keeps at most every input row at the output width, and
  // its vertical pass the output pixels (the CUDA backend stages no more than that on the host).
  const std::uint64_t transform =
      static_cast<std::uint64_t>(header.height) * out_width * 3 + out_width * out_height * 3;
  return header.decode_bytes() + transform + npy_file_size(spec);
}

ViewService::ViewService(std::unique_ptr<Backend> backend, ViewServiceOptions options)
    : backend_(std::move(backend)), options_(options), memory_(options.render_memory_bytes) {
  if (!backend_) throw std::invalid_argument("ViewService needs a backend");
  if (options_.max_batch == 0) throw std::invalid_argument("ViewService: max_batch must be >= 1");
  batched_ = options_.batched.value_or(backend_->name() == "cuda");
  if (!batched_) return;
  const unsigned threads = std::max(options_.batch_threads, 1u);
  batchers_.reserve(threads);
  try {
    for (unsigned i = 0; i < threads; ++i) {
      batchers_.emplace_back([this] {
        name_this_thread("view-batch");
        batch_loop();
      });
    }
  } catch (...) {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    queued_.notify_all();
    for (std::thread& batcher : batchers_) batcher.join();
    throw;
  }
}

ViewService::~ViewService() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  for (std::thread& batcher : batchers_) batcher.join();
}

std::string ViewService::render(const ViewSpec& spec, std::span<const std::byte> encoded) {
  auto started = std::chrono::steady_clock::now();
  // Reserved from the header, before any pixel memory is allocated, and held until the file is
  // handed over (the view cache bounds it from there).
  RenderMemoryBudget::Reservation memory;
  const BeforeDecode reserve = [&](const ImageHeader& header) {
    memory = memory_.reserve(render_memory_bytes(spec, header), options_.render_memory_wait);
  };
  RgbImage image;
  try {
    image = decode_image(encoded, options_.max_pixels, reserve);
  } catch (const DecodeError&) {
    decode_errors_.fetch_add(1, std::memory_order_relaxed);
    decode_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
    throw;
  }
  decode_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);

  const std::string header = npy_header(spec);
  std::string file(header.size() + spec.tensor_bytes(), '\0');
  std::memcpy(file.data(), header.data(), header.size());
  transform(spec, image,
            std::span(reinterpret_cast<std::byte*>(file.data() + header.size()),
                      static_cast<std::size_t>(spec.tensor_bytes())));
  rendered_.fetch_add(1, std::memory_order_relaxed);
  return file;
}

void ViewService::transform(const ViewSpec& spec, const RgbImage& image,
                            std::span<std::byte> output) {
  const auto started = std::chrono::steady_clock::now();
  try {
    if (batched_) {
      Request request;
      request.spec = &spec;
      request.image = &image;
      request.output = output;
      transform_batched(request);
    } else {
      const RgbImage* images[] = {&image};
      const std::span<std::byte> outputs[] = {output};
      backend_->transform(spec, images, outputs);
    }
  } catch (...) {
    transform_errors_.fetch_add(1, std::memory_order_relaxed);
    transform_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
    throw;
  }
  transform_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
}

void ViewService::transform_batched(Request& request) {
  std::unique_lock lock(mutex_);
  if (stopping_) throw std::runtime_error("the view service is shutting down");
  queue_.push_back(&request);
  queued_.notify_all();
  finished_.wait(lock, [&] { return request.done; });
  if (request.failure) std::rethrow_exception(request.failure);
}

std::vector<ViewService::Request*> ViewService::take_batch_locked() {
  std::vector<Request*> batch;
  const ViewSpec& spec = *queue_.front()->spec;
  for (auto it = queue_.begin(); it != queue_.end() && batch.size() < options_.max_batch;) {
    if (*(*it)->spec == spec) {
      batch.push_back(*it);
      it = queue_.erase(it);
    } else {
      ++it;
    }
  }
  return batch;
}

void ViewService::batch_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    queued_.wait(
        lock, [&] { return (!queue_.empty() && !collecting_) || (stopping_ && queue_.empty()); });
    if (queue_.empty()) return;  // stopping, nothing left
    // Gather: other callers' images join until the batch is full or the window closes.
    collecting_ = true;
    const auto deadline = std::chrono::steady_clock::now() + options_.batch_window;
    queued_.wait_until(lock, deadline,
                       [&] { return stopping_ || queue_.size() >= options_.max_batch; });
    std::vector<Request*> batch = take_batch_locked();
    collecting_ = false;
    queued_.notify_all();  // the next batch may start gathering while this one runs
    lock.unlock();

    std::vector<const RgbImage*> images;
    std::vector<std::span<std::byte>> outputs;
    images.reserve(batch.size());
    outputs.reserve(batch.size());
    for (const Request* request : batch) {
      images.push_back(request->image);
      outputs.push_back(request->output);
    }
    std::exception_ptr failure;
    try {
      backend_->transform(*batch.front()->spec, images, outputs);
    } catch (...) {
      failure = std::current_exception();
    }
    batches_.fetch_add(1, std::memory_order_relaxed);
    batched_images_.fetch_add(batch.size(), std::memory_order_relaxed);

    lock.lock();
    for (Request* request : batch) {
      request->failure = failure;
      request->done = true;
    }
    finished_.notify_all();
  }
}

ViewServiceStats ViewService::stats() const {
  const auto load = [](const std::atomic<std::uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  return ViewServiceStats{
      .rendered = load(rendered_),
      .decode_errors = load(decode_errors_),
      .transform_errors = load(transform_errors_),
      .batches = load(batches_),
      .batched_images = load(batched_images_),
      .decode_seconds = to_seconds(load(decode_ns_)),
      .transform_seconds = to_seconds(load(transform_ns_)),
      .memory_capacity = memory_.capacity(),
      .memory_peak = memory_.peak(),
      .memory_refused = memory_.refused(),
      .memory_timed_out = memory_.timed_out(),
  };
}

}  // namespace dsfs::view
