#pragma once
// What one CUDA thread computes, shared by the kernels (nvcc, C++17) and by the host emulation
// that tests them without a GPU (g++, C++20): so the index arithmetic the kernels run is the
// arithmetic the unit tests check. C++17 and no CUDA headers: both compilers read this file.
//
// A batch travels to the GPU as one "upload" buffer: an ImageDescriptor per image, then per image
// its two axis tables (first/count/weights, int32) and the input pixels it needs (only the rows
// and columns its crop reads, packed, RGB). Every offset below is in bytes from the start of the
// buffer it names. Plan `first` values are rebased to the packed rectangle by the host.
#include <cstdint>

#if defined(__CUDACC__)
#define DSFS_HOST_DEVICE __host__ __device__
#else
#define DSFS_HOST_DEVICE
#endif

namespace dsfs::view::cuda_detail {

inline constexpr int kFixedPointBits = 22;  // PIL's PRECISION_BITS; equals kResamplePrecisionBits

// DType / Layout as plain integers, so this header needs nothing from view_spec.h.
enum : std::int32_t { kOutUint8 = 0, kOutFloat16 = 1, kOutFloat32 = 2 };
enum : std::int32_t { kOutCHW = 0, kOutHWC = 1 };

struct AxisTable {
  std::uint64_t first_offset = 0;    // upload: int32[size], first input index (packed)
  std::uint64_t count_offset = 0;    // upload: int32[size], taps used (0 = padding)
  std::uint64_t weights_offset = 0;  // upload: int32[size * taps], fixed point
  std::int32_t taps = 0;
  std::int32_t size = 0;  // output pixels along this axis
};

struct ImageDescriptor {
  std::uint64_t pixels_offset = 0;   // upload: rows * cols * 3 bytes
  std::uint64_t scratch_offset = 0;  // scratch: rows * out_width * 3 bytes (horizontal pass)
  std::int32_t rows = 0;             // input rows packed = intermediate rows
  std::int32_t cols = 0;             // input columns packed
  AxisTable horizontal;              // output column -> packed input columns
  AxisTable vertical;                // output row -> intermediate rows
};

// What every image of a batch shares (from the ViewSpec); passed to the kernels by value.
struct BatchParams {
  std::int32_t image_count = 0;
  std::int32_t out_width = 0;
  std::int32_t out_height = 0;
  std::int32_t dtype = kOutFloat32;
  std::int32_t layout = kOutCHW;
  std::int32_t normalize = 0;
  float mean[3] = {0.0F, 0.0F, 0.0F};
  float std[3] = {1.0F, 1.0F, 1.0F};
  std::uint64_t tensor_bytes = 0;        // one image's output
  std::uint64_t descriptors_offset = 0;  // upload: ImageDescriptor[image_count]
};

template <typename T>
DSFS_HOST_DEVICE inline const T* table_at(const std::uint8_t* base, std::uint64_t offset) {
  return reinterpret_cast<const T*>(base + offset);
}

// PIL's clip8: the rounded fixed-point sum back to 0..255.
DSFS_HOST_DEVICE inline std::uint8_t clip_fixed_point(std::int32_t sum) {
  const std::int32_t value = sum >> kFixedPointBits;
  return static_cast<std::uint8_t>(value < 0 ? 0 : (value > 255 ? 255 : value));
}

// Horizontal pass: intermediate pixel (row, x) of `image` into `scratch` (3 channels).
DSFS_HOST_DEVICE inline void horizontal_pixel(const std::uint8_t* upload, std::uint8_t* scratch,
                                              const ImageDescriptor& image, std::int32_t out_width,
                                              std::int32_t row, std::int32_t x) {
  const AxisTable& axis = image.horizontal;
  const std::int32_t count = table_at<std::int32_t>(upload, axis.count_offset)[x];
  std::uint8_t* out =
      scratch + image.scratch_offset +
      (static_cast<std::uint64_t>(row) * static_cast<std::uint64_t>(out_width) + x) * 3;
  if (count == 0) {
    out[0] = out[1] = out[2] = 0;
    return;
  }
  const std::int32_t first = table_at<std::int32_t>(upload, axis.first_offset)[x];
  const std::int32_t* weights = table_at<std::int32_t>(upload, axis.weights_offset) +
                                static_cast<std::uint64_t>(x) * axis.taps;
  const std::uint8_t* in =
      upload + image.pixels_offset +
      (static_cast<std::uint64_t>(row) * static_cast<std::uint64_t>(image.cols) + first) * 3;
  std::int32_t sum[3] = {1 << (kFixedPointBits - 1), 1 << (kFixedPointBits - 1),
                         1 << (kFixedPointBits - 1)};
  for (std::int32_t tap = 0; tap < count; ++tap) {
    const std::int32_t weight = weights[tap];
    sum[0] += in[tap * 3 + 0] * weight;
    sum[1] += in[tap * 3 + 1] * weight;
    sum[2] += in[tap * 3 + 2] * weight;
  }
  out[0] = clip_fixed_point(sum[0]);
  out[1] = clip_fixed_point(sum[1]);
  out[2] = clip_fixed_point(sum[2]);
}

// Vertical pass: output pixel (y, x) of `image` from the intermediate rows in `scratch`.
DSFS_HOST_DEVICE inline void vertical_pixel(const std::uint8_t* upload, const std::uint8_t* scratch,
                                            const ImageDescriptor& image, std::int32_t out_width,
                                            std::int32_t y, std::int32_t x, std::uint8_t rgb[3]) {
  const AxisTable& axis = image.vertical;
  const std::int32_t count = table_at<std::int32_t>(upload, axis.count_offset)[y];
  if (count == 0) {
    rgb[0] = rgb[1] = rgb[2] = 0;
    return;
  }
  const std::int32_t first = table_at<std::int32_t>(upload, axis.first_offset)[y];
  const std::int32_t* weights = table_at<std::int32_t>(upload, axis.weights_offset) +
                                static_cast<std::uint64_t>(y) * axis.taps;
  const std::uint64_t row_stride = static_cast<std::uint64_t>(out_width) * 3;
  const std::uint8_t* in = scratch + image.scratch_offset +
                           static_cast<std::uint64_t>(first) * row_stride +
                           static_cast<std::uint64_t>(x) * 3;
  std::int32_t sum[3] = {1 << (kFixedPointBits - 1), 1 << (kFixedPointBits - 1),
                         1 << (kFixedPointBits - 1)};
  for (std::int32_t tap = 0; tap < count; ++tap) {
    const std::int32_t weight = weights[tap];
    const std::uint8_t* pixel = in + static_cast<std::uint64_t>(tap) * row_stride;
    sum[0] += pixel[0] * weight;
    sum[1] += pixel[1] * weight;
    sum[2] += pixel[2] * weight;
  }
  rgb[0] = clip_fixed_point(sum[0]);
  rgb[1] = clip_fixed_point(sum[1]);
  rgb[2] = clip_fixed_point(sum[2]);
}

// ToTensor then Normalize, in float32 with plain IEEE operations (no multiply, so nothing a
// compiler could fuse into an FMA): value/255, then (x - mean) / std.
DSFS_HOST_DEVICE inline float float_value(const BatchParams& params, std::uint8_t value,
                                          std::int32_t channel) {
  float scaled = static_cast<float>(value) / 255.0F;
  if (params.normalize != 0) scaled = (scaled - params.mean[channel]) / params.std[channel];
  return scaled;
}

// Element index (not bytes) of (channel, y, x) in one image's output tensor.
DSFS_HOST_DEVICE inline std::uint64_t output_element(const BatchParams& params, std::int32_t y,
                                                     std::int32_t x, std::int32_t channel) {
  const std::uint64_t width = static_cast<std::uint64_t>(params.out_width);
  const std::uint64_t height = static_cast<std::uint64_t>(params.out_height);
  if (params.layout == kOutCHW) return (channel * height + y) * width + x;
  return (y * width + x) * 3 + channel;
}

// Writes output pixel (y, x) into one image's tensor in the batch's dtype and layout. ToHalfBits
// maps a float to IEEE binary16 bits, round to nearest even (__float2half_rn on the device).
template <typename ToHalfBits>
DSFS_HOST_DEVICE inline void store_pixel(const BatchParams& params, std::uint8_t* tensor,
                                         std::int32_t y, std::int32_t x, const std::uint8_t rgb[3],
                                         ToHalfBits to_half_bits) {
  for (std::int32_t channel = 0; channel < 3; ++channel) {
    const std::uint64_t element = output_element(params, y, x, channel);
    if (params.dtype == kOutUint8) {
      tensor[element] = rgb[channel];
    } else if (params.dtype == kOutFloat16) {
      reinterpret_cast<std::uint16_t*>(tensor)[element] =
          to_half_bits(float_value(params, rgb[channel], channel));
    } else {
      reinterpret_cast<float*>(tensor)[element] = float_value(params, rgb[channel], channel);
    }
  }
}

}  // namespace dsfs::view::cuda_detail
