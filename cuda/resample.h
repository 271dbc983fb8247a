#pragma once
// The geometry of a view: torchvision's Resize (on a PIL image: PIL's antialiased bilinear
// ImagingResample, separable, horizontal pass then vertical, 8-bit rounding between passes, in
// PIL's fixed point) followed by CenterCrop (zero padding when the image is smaller). Planned once
// per (spec, image size) on the host; the CPU and CUDA backends only apply the plan, so both give
// the same pixels.
#include <cstdint>
#include <vector>

#include "cuda/view_spec.h"

namespace dsfs::view {

inline constexpr int kResamplePrecisionBits = 32 - 8 - 2;  // PIL's PRECISION_BITS

// One axis, restricted to the output pixels the crop keeps (out_size of them).
struct AxisPlan {
  int out_size = 0;
  int taps = 0;                       // weights per output pixel (the largest count)
  std::vector<std::int32_t> first;    // out_size: first input index of each output pixel
  std::vector<std::int32_t> count;    // out_size: weights used (0 = padding, value 0)
  std::vector<std::int32_t> weights;  // out_size * taps, fixed point, unused taps 0
};

struct TransformPlan {
  int image_width = 0;  // decoded input
  int image_height = 0;
  int resized_width = 0;  // after Resize, before CenterCrop
  int resized_height = 0;
  AxisPlan horizontal;  // output column -> input columns (out_size = spec.out_width())
  AxisPlan vertical;    // output row -> input rows (out_size = spec.out_height())
};

TransformPlan plan_transform(const ViewSpec& spec, int image_width, int image_height);

}  // namespace dsfs::view
