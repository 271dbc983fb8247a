// The CUDA backend: plans on the host, packs each batch into pinned memory, copies it up on a
// stream, runs both resampling passes and the tensor conversion as two kernels over the whole
// batch, and copies the tensors back. A small pool of streams, each with its own buffers, lets
// concurrent callers overlap copies and kernels. Compiled into every build; the body only when
// CMake found nvcc (DSFS_HAVE_CUDA).
#include "cuda/cuda_info.h"

#ifdef DSFS_HAVE_CUDA

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_batch_layout.h"
#include "cuda/cuda_kernels.h"
#include "cuda/resample.h"

namespace dsfs::view {
namespace {

using cuda_detail::BatchLayout;
using cuda_detail::ImageDescriptor;
using cuda_detail::IndexRange;

// A launch's packed input plus its tensors stay under this unless one image alone is larger,
// which bounds the pinned and device memory each stream keeps (an ImageNet batch of 64 at
// float32 is about 65 MiB: 0.4 MiB of used pixels and 0.6 MiB of tensor per image).
constexpr std::uint64_t kMaxBytesPerLaunch = std::uint64_t{128} << 20;
// Concurrent transform() calls beyond this wait for a stream; more would add memory, not speed.
constexpr std::size_t kMaxStreams = 4;

std::string describe_error(cudaError_t error) {
  return fmt::format("{} ({})", cudaGetErrorString(error), cudaGetErrorName(error));
}

void check(cudaError_t error, const char* call) {
  if (error != cudaSuccess) {
    throw std::runtime_error(
        fmt::format("CUDA view backend: {} failed: {}", call, describe_error(error)));
  }
}
#define DSFS_CUDA_CHECK(call) check((call), #call)

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Device (cudaMalloc) or pinned host (cudaMallocHost) memory that grows and is reused.
class CudaBuffer {
 public:
  enum class Kind { kDevice, kPinnedHost };
  explicit CudaBuffer(Kind kind) : kind_(kind) {}
  ~CudaBuffer() { release(); }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  // Makes room for `bytes`, discarding the contents when it has to grow.
  void reserve(std::uint64_t bytes) {
    if (bytes <= capacity_) return;
    release();
    // Grow by half again and round to 1 MiB, so a slowly growing batch reallocates rarely.
    const std::uint64_t wanted = std::max(bytes, capacity_ + capacity_ / 2);
    const std::uint64_t rounded = (wanted + (1U << 20) - 1) & ~std::uint64_t{(1U << 20) - 1};
    void* data = nullptr;
    if (kind_ == Kind::kDevice) {
      DSFS_CUDA_CHECK(cudaMalloc(&data, rounded));
    } else {
      DSFS_CUDA_CHECK(cudaMallocHost(&data, rounded));
    }
    data_ = static_cast<std::uint8_t*>(data);
    capacity_ = rounded;
  }
  std::uint8_t* data() const { return data_; }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    // Errors here (a failed context, the runtime unloading at exit) leave nothing to do.
    if (kind_ == Kind::kDevice) {
      cudaFree(data_);
    } else {
      cudaFreeHost(data_);
    }
    data_ = nullptr;
    capacity_ = 0;
  }

  Kind kind_;
  std::uint8_t* data_ = nullptr;
  std::uint64_t capacity_ = 0;
};

class CudaStream {
 public:
  CudaStream() { DSFS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~CudaStream() { cudaStreamDestroy(stream_); }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class CudaEvent {
 public:
  // Blocking sync: a waiting caller sleeps instead of spinning on a core decoders need.
  CudaEvent() { DSFS_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventBlockingSync)); }
  ~CudaEvent() { cudaEventDestroy(event_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

double elapsed_seconds(const CudaEvent& from, const CudaEvent& to) {
  float milliseconds = 0;
  DSFS_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, from.get(), to.get()));
  return milliseconds / 1000.0;
}

// One stream and everything a batch needs on it; used by one transform() at a time.
struct StreamContext {
  CudaStream stream;
  CudaEvent started, uploaded, computed, downloaded;
  CudaBuffer upload_host{CudaBuffer::Kind::kPinnedHost};
  CudaBuffer upload_device{CudaBuffer::Kind::kDevice};
  CudaBuffer scratch_device{CudaBuffer::Kind::kDevice};
  CudaBuffer output_device{CudaBuffer::Kind::kDevice};
  CudaBuffer output_host{CudaBuffer::Kind::kPinnedHost};
};

// Hands out stream contexts, creating up to kMaxStreams on demand.
class ContextPool {
 public:
  class Lease {
   public:
    Lease(ContextPool& pool, std::unique_ptr<StreamContext> context)
        : pool_(pool), context_(std::move(context)) {}
    ~Lease() { pool_.give_back(std::move(context_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    StreamContext& operator*() const { return *context_; }

   private:
    ContextPool& pool_;
    std::unique_ptr<StreamContext> context_;
  };

  Lease acquire() {
    std::unique_lock lock(mutex_);
    available_.wait(lock, [&] { return !idle_.empty() || created_ < kMaxStreams; });
    if (!idle_.empty()) {
      auto context = std::move(idle_.back());
      idle_.pop_back();
      return Lease(*this, std::move(context));
    }
    auto context = std::make_unique<StreamContext>();  // may throw: nothing counted yet
    ++created_;
    return Lease(*this, std::move(context));
  }

 private:
  void give_back(std::unique_ptr<StreamContext> context) {
    // A call that threw may have left copies in flight; the next one must not overwrite their
    // buffers. Quick when the stream is idle, as after every call that succeeded.
    cudaStreamSynchronize(context->stream.get());
    {
      std::lock_guard lock(mutex_);
      idle_.push_back(std::move(context));
    }
    available_.notify_one();
  }

  std::mutex mutex_;
  std::condition_variable available_;
  std::vector<std::unique_ptr<StreamContext>> idle_;
  std::size_t created_ = 0;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, std::string description)
      : device_(device), description_(std::move(description)) {}

  std::string_view name() const override { return "cuda"; }

  void transform(const ViewSpec& spec, std::span<const RgbImage* const> images,
                 std::span<const std::span<std::byte>> outputs) override {
    validate(spec, images, outputs);
    if (images.empty()) return;
    DSFS_CUDA_CHECK(cudaSetDevice(device_));  // the runtime's current device is per thread

    CudaStageTimes times;
    times.calls = 1;
    auto started = std::chrono::steady_clock::now();
    std::vector<TransformPlan> plans;
    plans.reserve(images.size());
    std::vector<std::uint64_t> launch_bytes;
    launch_bytes.reserve(images.size());
    for (const RgbImage* image : images) {
      plans.push_back(plan_transform(spec, image->width, image->height));
      launch_bytes.push_back(cuda_detail::image_upload_bytes(plans.back()) + spec.tensor_bytes());
    }
    times.plan_seconds = seconds_since(started);

    started = std::chrono::steady_clock::now();
    const ContextPool::Lease lease = contexts_.acquire();
    times.wait_seconds = seconds_since(started);

    const std::span<const TransformPlan> all_plans(plans);
    for (const IndexRange& range :
         cuda_detail::split_batch(launch_bytes, kMaxBytesPerLaunch,
                                  static_cast<std::size_t>(cuda_detail::kMaxImagesPerLaunch))) {
      const std::size_t count = range.end - range.begin;
      run_launch(*lease, spec, all_plans.subspan(range.begin, count),
                 images.subspan(range.begin, count), outputs.subspan(range.begin, count), times);
    }
    add_times(times);
  }

  CudaBackendInfo info() const {
    std::lock_guard lock(times_mutex_);
    return CudaBackendInfo{description_, times_};
  }

 private:
  static void validate(const ViewSpec& spec, std::span<const RgbImage* const> images,
                       std::span<const std::span<std::byte>> outputs) {
    if (images.size() != outputs.size()) {
      throw std::invalid_argument(
          fmt::format("view transform: {} images but {} outputs", images.size(), outputs.size()));
    }
    for (std::size_t i = 0; i < images.size(); ++i) {
      const RgbImage& image = *images[i];
      if (outputs[i].size() != spec.tensor_bytes()) {
        throw std::invalid_argument(
            fmt::format("view transform: output {} holds {} bytes, the spec's tensor needs {}", i,
                        outputs[i].size(), spec.tensor_bytes()));
      }
      if (image.width < 1 || image.height < 1 ||
          image.pixels.size() !=
              static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3) {
        throw std::invalid_argument(
            fmt::format("view transform: image {} is {}x{} with {} bytes of pixels", i, image.width,
                        image.height, image.pixels.size()));
      }
    }
  }

  // One launch: pack, upload, both kernels, download, unpack; returns when the tensors are in
  // `outputs`.
  static void run_launch(StreamContext& context, const ViewSpec& spec,
                         std::span<const TransformPlan> plans,
                         std::span<const RgbImage* const> images,
                         std::span<const std::span<std::byte>> outputs, CudaStageTimes& times) {
    auto started = std::chrono::steady_clock::now();
    const BatchLayout layout = cuda_detail::plan_batch_layout(spec, plans);
    // The previous launch on this stream has finished (its download was waited for), so the
    // buffers may be regrown and overwritten.
    context.upload_host.reserve(layout.upload_bytes);
    context.upload_device.reserve(layout.upload_bytes);
    context.scratch_device.reserve(std::max<std::uint64_t>(layout.scratch_bytes, 1));
    context.output_device.reserve(layout.output_bytes);
    context.output_host.reserve(layout.output_bytes);
    cuda_detail::pack_batch(
        layout, plans, images,
        std::span(reinterpret_cast<std::byte*>(context.upload_host.data()), layout.upload_bytes));
    std::int32_t max_rows = 0;
    for (const ImageDescriptor& image : layout.images) max_rows = std::max(max_rows, image.rows);
    times.pack_seconds += seconds_since(started);

    const cudaStream_t stream = context.stream.get();
    DSFS_CUDA_CHECK(cudaEventRecord(context.started.get(), stream));
    DSFS_CUDA_CHECK(cudaMemcpyAsync(context.upload_device.data(), context.upload_host.data(),
                                    layout.upload_bytes, cudaMemcpyHostToDevice, stream));
    DSFS_CUDA_CHECK(cudaEventRecord(context.uploaded.get(), stream));
    DSFS_CUDA_CHECK(cuda_detail::launch_transform(
        layout.params, max_rows, context.upload_device.data(), context.scratch_device.data(),
        context.output_device.data(), stream));
    DSFS_CUDA_CHECK(cudaEventRecord(context.computed.get(), stream));
    DSFS_CUDA_CHECK(cudaMemcpyAsync(context.output_host.data(), context.output_device.data(),
                                    layout.output_bytes, cudaMemcpyDeviceToHost, stream));
    DSFS_CUDA_CHECK(cudaEventRecord(context.downloaded.get(), stream));
    // Also reports a kernel that failed while running.
    DSFS_CUDA_CHECK(cudaEventSynchronize(context.downloaded.get()));
    times.upload_seconds += elapsed_seconds(context.started, context.uploaded);
    times.kernel_seconds += elapsed_seconds(context.uploaded, context.computed);
    times.download_seconds += elapsed_seconds(context.computed, context.downloaded);
    times.upload_bytes += layout.upload_bytes;
    times.download_bytes += layout.output_bytes;

    started = std::chrono::steady_clock::now();
    const std::uint64_t tensor_bytes = layout.params.tensor_bytes;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      std::memcpy(outputs[i].data(), context.output_host.data() + i * tensor_bytes, tensor_bytes);
    }
    times.unpack_seconds += seconds_since(started);
    times.launches += 1;
    times.images += images.size();
  }

  void add_times(const CudaStageTimes& call) {
    std::lock_guard lock(times_mutex_);
    times_.calls += call.calls;
    times_.launches += call.launches;
    times_.images += call.images;
    times_.plan_seconds += call.plan_seconds;
    times_.wait_seconds += call.wait_seconds;
    times_.pack_seconds += call.pack_seconds;
    times_.upload_seconds += call.upload_seconds;
    times_.kernel_seconds += call.kernel_seconds;
    times_.download_seconds += call.download_seconds;
    times_.unpack_seconds += call.unpack_seconds;
    times_.upload_bytes += call.upload_bytes;
    times_.download_bytes += call.download_bytes;
  }

  int device_;
  std::string description_;
  ContextPool contexts_;
  mutable std::mutex times_mutex_;
  CudaStageTimes times_;
};

std::string describe_device(int device) {
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device) != cudaSuccess) {
    return fmt::format("CUDA device {}", device);
  }
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", properties.name, properties.major,
                     properties.minor, properties.multiProcessorCount,
                     static_cast<double>(properties.totalGlobalMem) / (1U << 30));
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(std::string& why_unavailable) {
  int device_count = 0;
  cudaError_t error = cudaGetDeviceCount(&device_count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // clears the error this call left behind
    why_unavailable =
        fmt::format("no usable CUDA device: cudaGetDeviceCount failed: {}", describe_error(error));
    return nullptr;
  }
  if (device_count == 0) {
    why_unavailable = "no CUDA device found";
    return nullptr;
  }
  constexpr int kDevice = 0;
  error = cudaSetDevice(kDevice);
  if (error == cudaSuccess) error = cudaFree(nullptr);  // creates the context, or says why not
  if (error != cudaSuccess) {
    cudaGetLastError();
    why_unavailable =
        fmt::format("CUDA device {} cannot be used: {}", kDevice, describe_error(error));
    return nullptr;
  }
  const std::string description = describe_device(kDevice);
  error = cuda_detail::check_kernels_loadable();
  if (error != cudaSuccess) {
    cudaGetLastError();
    why_unavailable = fmt::format(
        "the CUDA kernels have no code for {} (rebuild with CMAKE_CUDA_ARCHITECTURES naming it): "
        "{}",
        description, describe_error(error));
    return nullptr;
  }
  return std::make_unique<CudaBackend>(kDevice, description);
}

std::optional<CudaBackendInfo> cuda_backend_info(const Backend& backend) {
  if (const auto* cuda = dynamic_cast<const CudaBackend*>(&backend)) return cuda->info();
  return std::nullopt;
}

}  // namespace dsfs::view

#else  // no CUDA in this build

namespace dsfs::view {

std::optional<CudaBackendInfo> cuda_backend_info(const Backend&) {
  return std::nullopt;
}

}  // namespace dsfs::view

#endif
