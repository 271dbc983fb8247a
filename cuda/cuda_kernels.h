#pragma once
// The CUDA kernels' launch functions (defined in cuda_kernels.cu). C++17 and CUDA's C API only,
// so both nvcc and the C++20 backend read it.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/cuda_pixel_math.h"

namespace dsfs::view::cuda_detail {

// Enqueues the horizontal pass (packed input rows -> scratch) and then the vertical pass
// (scratch -> tensors: normalize, cast, layout) for a whole batch on `stream`. `upload` holds the
// packed batch (cuda_batch_layout.h), `scratch` the layout's scratch_bytes, `output`
// params.image_count * params.tensor_bytes. max_rows is the largest ImageDescriptor::rows.
// Returns the first launch error, cudaSuccess when both kernels were enqueued.
cudaError_t launch_transform(const BatchParams& params, std::int32_t max_rows,
                             const std::uint8_t* upload, std::uint8_t* scratch,
                             std::uint8_t* output, cudaStream_t stream);

// Largest image count one launch takes (the grid's z dimension).
inline constexpr std::int32_t kMaxImagesPerLaunch = 1024;

// Checks that the kernels have code for the current device (cudaErrorNoKernelImageForDevice
// otherwise: the build's CUDA architectures do not include this GPU's).
cudaError_t check_kernels_loadable();

}  // namespace dsfs::view::cuda_detail
