#pragma once
// Host side of the CUDA backend that needs no GPU: where each image's tables and pixels go in a
// batch's upload buffer, packing them there, splitting large batches. Built with or without
// CUDA, so the unit tests check it (and, with cuda_pixel_math.h, the kernels' arithmetic) anywhere.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/cuda_pixel_math.h"
#include "cuda/image_decode.h"
#include "cuda/resample.h"
#include "cuda/view_spec.h"

namespace dsfs::view::cuda_detail {

// Input indices [begin, end) an axis plan reads; empty (begin == end == 0) when all is padding.
struct InputRange {
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
  bool operator==(const InputRange&) const = default;
};
InputRange used_input_range(const AxisPlan& axis);

BatchParams make_batch_params(const ViewSpec& spec, int image_count);

struct BatchLayout {
  BatchParams params;
  std::vector<ImageDescriptor> images;
  std::vector<InputRange> rows;     // input rows packed, per image
  std::vector<InputRange> columns;  // input columns packed, per image
  std::uint64_t upload_bytes = 0;   // descriptors + tables + pixels
  std::uint64_t scratch_bytes = 0;  // device-only intermediate rows of the horizontal pass
  std::uint64_t output_bytes = 0;   // image_count * tensor_bytes
};

// Offsets of every section; each section starts on a kSectionAlignment boundary.
inline constexpr std::uint64_t kSectionAlignment = 16;
// Throws std::invalid_argument when a plan's output size does not match the spec.
BatchLayout plan_batch_layout(const ViewSpec& spec, std::span<const TransformPlan> plans);

// Writes descriptors, rebased tables and the used pixels of every image into `upload`
// (at least layout.upload_bytes). Throws std::invalid_argument when an image does not match its
// plan (size, pixel buffer length) or `upload` is too small.
void pack_batch(const BatchLayout& layout, std::span<const TransformPlan> plans,
                std::span<const RgbImage* const> images, std::span<std::byte> upload);

// Upload bytes one image takes (its tables and used pixels, without alignment slack).
std::uint64_t image_upload_bytes(const TransformPlan& plan);

// Consecutive [begin, end) index ranges covering all images, each at most max_images long and,
// unless a single image alone is larger, at most max_bytes of bytes_per_image (what a launch
// keeps in pinned and device memory: upload plus output).
struct IndexRange {
  std::size_t begin = 0;
  std::size_t end = 0;
  bool operator==(const IndexRange&) const = default;
};
std::vector<IndexRange> split_batch(std::span<const std::uint64_t> bytes_per_image,
                                    std::uint64_t max_bytes, std::size_t max_images);

}  // namespace dsfs::view::cuda_detail
