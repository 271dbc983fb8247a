#pragma once
// What the CUDA backend measured and which device it runs on, for benchmarks and stats. Declared
// in every build; without CUDA (or for another backend) there is nothing to report.
#include <cstdint>
#include <optional>
#include <string>

#include "cuda/backend.h"

namespace dsfs::view {

// Totals since the backend was made. Host times are summed over calling threads and GPU times
// over streams, so with concurrent callers they can add up to more than the wall time.
struct CudaStageTimes {
  std::uint64_t calls = 0;     // transform() calls
  std::uint64_t launches = 0;  // batches sent to the GPU (large calls are split)
  std::uint64_t images = 0;
  double plan_seconds = 0;      // host: plan_transform for each image
  double wait_seconds = 0;      // host: waiting for a free stream
  double pack_seconds = 0;      // host: layout and copy into pinned memory
  double upload_seconds = 0;    // GPU: host-to-device copy (CUDA events)
  double kernel_seconds = 0;    // GPU: both resampling passes, normalize, cast, layout
  double download_seconds = 0;  // GPU: device-to-host copy
  double unpack_seconds = 0;    // host: pinned output to the callers' buffers
  std::uint64_t upload_bytes = 0;
  std::uint64_t download_bytes = 0;
};

struct CudaBackendInfo {
  std::string device;  // "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs, 79.1 GiB)"
  CudaStageTimes times;
};

// The CUDA backend's device and times; nullopt when `backend` is not the CUDA backend.
std::optional<CudaBackendInfo> cuda_backend_info(const Backend& backend);

}  // namespace dsfs::view
