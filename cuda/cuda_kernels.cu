// The CUDA view kernels: one thread per output column and a grid-stride loop over rows, one
// launch per pass for a whole batch (blockIdx.z = image). What a thread computes lives in
// cuda_pixel_math.h, where the host tests run the same code.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/cuda_kernels.h"

namespace dsfs::view::cuda_detail {
namespace {

constexpr unsigned kBlockColumns = 32;  // a warp along a row: coalesced reads and writes
constexpr unsigned kBlockRows = 8;
constexpr unsigned kMaxGridRows = 65535;  // gridDim.y limit; rows beyond loop

struct DeviceHalfBits {
  __host__ __device__ std::uint16_t operator()(float value) const {
    return __half_as_ushort(__float2half_rn(value));
  }
};

__device__ ImageDescriptor load_descriptor(const BatchParams& params, const std::uint8_t* upload) {
  return table_at<ImageDescriptor>(upload, params.descriptors_offset)[blockIdx.z];
}

__global__ void horizontal_kernel(BatchParams params, const std::uint8_t* upload,
                                  std::uint8_t* scratch) {
  const ImageDescriptor image = load_descriptor(params, upload);
  const std::int32_t x = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (x >= params.out_width) return;
  const std::int32_t row_step = static_cast<std::int32_t>(gridDim.y * blockDim.y);
  for (std::int32_t row = static_cast<std::int32_t>(blockIdx.y * blockDim.y + threadIdx.y);
       row < image.rows; row += row_step) {
    horizontal_pixel(upload, scratch, image, params.out_width, row, x);
  }
}

__global__ void vertical_kernel(BatchParams params, const std::uint8_t* upload,
                                const std::uint8_t* scratch, std::uint8_t* output) {
  const ImageDescriptor image = load_descriptor(params, upload);
  const std::int32_t x = static_cast<std::int32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (x >= params.out_width) return;
  std::uint8_t* tensor = output + static_cast<std::uint64_t>(blockIdx.z) * params.tensor_bytes;
  const std::int32_t row_step = static_cast<std::int32_t>(gridDim.y * blockDim.y);
  for (std::int32_t y = static_cast<std::int32_t>(blockIdx.y * blockDim.y + threadIdx.y);
       y < params.out_height; y += row_step) {
    std::uint8_t rgb[3];
    vertical_pixel(upload, scratch, image, params.out_width, y, x, rgb);
    store_pixel(params, tensor, y, x, rgb, DeviceHalfBits{});
  }
}

unsigned blocks_for(std::int64_t count, unsigned block, unsigned limit) {
  const std::int64_t blocks = (count + block - 1) / block;
  return static_cast<unsigned>(std::clamp<std::int64_t>(blocks, 1, limit));
}

}  // namespace

cudaError_t launch_transform(const BatchParams& params, std::int32_t max_rows,
                             const std::uint8_t* upload, std::uint8_t* scratch,
                             std::uint8_t* output, cudaStream_t stream) {
  if (params.image_count <= 0 || params.image_count > kMaxImagesPerLaunch ||
      params.out_width <= 0 || params.out_height <= 0) {
    return cudaErrorInvalidValue;
  }
  const dim3 block(kBlockColumns, kBlockRows);
  const unsigned column_blocks = blocks_for(params.out_width, kBlockColumns, 0x7fffffffU);
  const auto images = static_cast<unsigned>(params.image_count);
  if (max_rows > 0) {
    const dim3 grid(column_blocks, blocks_for(max_rows, kBlockRows, kMaxGridRows), images);
    horizontal_kernel<<<grid, block, 0, stream>>>(params, upload, scratch);
    const cudaError_t error = cudaGetLastError();
    if (error != cudaSuccess) return error;
  }
  const dim3 grid(column_blocks, blocks_for(params.out_height, kBlockRows, kMaxGridRows), images);
  vertical_kernel<<<grid, block, 0, stream>>>(params, upload, scratch, output);
  return cudaGetLastError();
}

cudaError_t check_kernels_loadable() {
  cudaFuncAttributes attributes{};
  cudaError_t error = cudaFuncGetAttributes(&attributes, horizontal_kernel);
  if (error != cudaSuccess) return error;
  return cudaFuncGetAttributes(&attributes, vertical_kernel);
}

}  // namespace dsfs::view::cuda_detail
