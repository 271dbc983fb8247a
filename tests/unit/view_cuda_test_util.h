#pragma once
// Inputs and comparisons shared by the CUDA backend's tests (view_cuda_test.cpp on a GPU,
// view_cuda_layout_test.cpp anywhere).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/image_decode.h"
#include "cuda/view_spec.h"

namespace dsfs::view::test_images {

// A photograph-like image: smooth gradients, hard edges and per-pixel noise, so that every tap
// of the filters matters and a wrong index shows.
inline RgbImage synthetic_image(int width, int height, std::uint32_t seed) {
  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3);
  std::mt19937 noise(seed);
  std::uniform_int_distribution<int> jitter(-24, 24);
  std::size_t i = 0;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const bool stripe = ((x / 7) + (y / 5) + static_cast<int>(seed)) % 3 == 0;
      for (int channel = 0; channel < 3; ++channel) {
        const int gradient = (x * (channel + 1) * 255) / std::max(width, 1) +
                             (y * (3 - channel) * 255) / std::max(height, 1);
        const int value = (stripe ? 255 - gradient % 256 : gradient % 256) + jitter(noise);
        image.pixels[i++] = static_cast<std::uint8_t>(std::clamp(value, 0, 255));
      }
    }
  }
  return image;
}

// Sizes from a single pixel to larger than a photograph, both orientations, odd sizes, smaller
// than every crop, and slivers.
inline std::vector<std::pair<int, int>> test_image_sizes() {
  return {{1, 1},     {2, 3},     {7, 5},      {31, 17},    {100, 50},  {223, 224},
          {224, 224}, {256, 256}, {255, 257},  {500, 375},  {375, 500}, {640, 480},
          {1000, 90}, {90, 1000}, {1024, 768}, {1731, 1299}};
}

// Every dtype, both layouts, ImageNet and custom normalization, shorter-side and exact resize,
// crops larger than the resized image (padding) and no crop.
inline std::vector<std::string> test_spec_texts() {
  return {
      "imagenet-eval",
      "imagenet-eval-fp16",
      "imagenet-eval-uint8",
      "resize=256,crop=224,dtype=float32,layout=hwc,norm=none",
      "resize=256,crop=224,dtype=float16,layout=hwc,norm=0.5:0.4:0.3:0.2:0.25:0.3",
      "resize=160x96,dtype=uint8,layout=chw",
      "resize=64,crop=80x48,dtype=float32,layout=chw,norm=imagenet",
      "crop=100,dtype=uint8,layout=hwc",
      "resize=300,crop=32,dtype=float16,layout=chw,norm=none",
      "resize=33x250,crop=40x200,dtype=float32,layout=hwc,norm=imagenet",
  };
}

inline float half_bits_to_float(std::uint16_t bits) {
  _Float16 half;
  std::memcpy(&half, &bits, sizeof(half));
  return static_cast<float>(half);
}

// The largest difference between two tensors of `spec`, in 8-bit pixel units before
// normalization (1.0 = 1/255): how the CUDA/CPU tolerance of 2/255 is stated.
inline double max_pixel_difference(const ViewSpec& spec, std::span<const std::byte> a,
                                   std::span<const std::byte> b) {
  const std::size_t elements = a.size() / (spec.dtype == DType::kUint8     ? 1
                                           : spec.dtype == DType::kFloat16 ? 2
                                                                           : 4);
  const std::size_t plane = elements / 3;
  double worst = 0;
  for (std::size_t i = 0; i < elements; ++i) {
    const std::size_t channel = spec.layout == Layout::kCHW ? i / plane : i % 3;
    double difference = 0;
    if (spec.dtype == DType::kUint8) {
      difference = std::abs(static_cast<int>(a[i]) - static_cast<int>(b[i]));
    } else {
      double x = 0, y = 0;
      if (spec.dtype == DType::kFloat16) {
        std::uint16_t bits_a, bits_b;
        std::memcpy(&bits_a, a.data() + 2 * i, 2);
        std::memcpy(&bits_b, b.data() + 2 * i, 2);
        x = half_bits_to_float(bits_a);
        y = half_bits_to_float(bits_b);
      } else {
        float float_a, float_b;
        std::memcpy(&float_a, a.data() + 4 * i, 4);
        std::memcpy(&float_b, b.data() + 4 * i, 4);
        x = float_a;
        y = float_b;
      }
      const double scale = spec.normalize ? spec.std[channel] : 1.0;
      difference = std::isfinite(x) && std::isfinite(y) ? std::abs(x - y) * scale * 255.0
                                                        : (x == y ? 0.0 : 1e9);
    }
    worst = std::max(worst, difference);
  }
  return worst;
}

}  // namespace dsfs::view::test_images
