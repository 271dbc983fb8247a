#include "cuda/resample.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>

#include "cuda/image_decode.h"

namespace dsfs::view {
namespace {

// A resized side beyond this (a 1-pixel-wide sliver resized to a 256 short side) is refused
// rather than planned: torchvision would need gigabytes for it.
constexpr double kMaxResizedSide = 1 << 24;

// PIL's bilinear (triangle) filter, support 1.
double bilinear_filter(double x) {
  if (x < 0.0) x = -x;
  if (x < 1.0) return 1.0 - x;
  return 0.0;
}

// The taps of one output pixel of a PIL resize: input indices [first, first + count) and their
// fixed-point weights.
struct Taps {
  int first = 0;
  int count = 0;
  std::vector<std::int32_t> weights;
};

// Pillow 9.4's precompute_coeffs (Resample.c) for output pixel `out_index` of an axis resized
// from in_size to out_size with the bilinear filter and no box, followed by
// normalize_coeffs_8bpc's conversion to PRECISION_BITS fixed point. The double arithmetic is
// kept operation for operation so that the weights, and with them the pixels, are PIL's.
Taps pil_taps(int in_size, int out_size, int out_index) {
  const auto in0 = 0.0F;
  const auto in1 = static_cast<float>(in_size);
  const double scale = static_cast<double>(in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;  // BILINEAR's support is 1.0

  const double center = in0 + (out_index + 0.5) * scale;
  const double ss = 1.0 / filterscale;
  int xmin = static_cast<int>(center - support + 0.5);
  if (xmin < 0) xmin = 0;
  int xmax = static_cast<int>(center + support + 0.5);
  if (xmax > in_size) xmax = in_size;
  xmax -= xmin;

  std::vector<double> k(static_cast<std::size_t>(std::max(xmax, 0)));
  double ww = 0.0;
  for (int x = 0; x < xmax; ++x) {
    const double w = bilinear_filter((x + xmin - center + 0.5) * ss);
    k[static_cast<std::size_t>(x)] = w;
    ww += w;
  }
  Taps taps;
  taps.first = xmin;
  taps.count = std::max(xmax, 0);
  taps.weights.resize(k.size());
  for (std::size_t x = 0; x < k.size(); ++x) {
    double w = k[x];
    if (ww != 0.0) w /= ww;
    taps.weights[x] = w < 0 ? static_cast<std::int32_t>(-0.5 + w * (1 << kResamplePrecisionBits))
                            : static_cast<std::int32_t>(0.5 + w * (1 << kResamplePrecisionBits));
  }
  return taps;
}

// torchvision 0.14's Resize on a PIL image: (width, height) after the resize.
std::pair<int, int> resized_size(const ResizeRule& rule, int width, int height) {
  switch (rule.mode) {
    case ResizeRule::Mode::kNone:
      return {width, height};
    case ResizeRule::Mode::kExact:
      return {rule.width, rule.height};
    case ResizeRule::Mode::kShorterSide: {
      // _compute_resized_output_size: int(size * long / short), Python's true division.
      const bool width_shorter = width <= height;
      const int shorter = width_shorter ? width : height;
      const int longer = width_shorter ? height : width;
      const double new_long = std::trunc(static_cast<double>(rule.shorter_side) * longer / shorter);
      if (new_long > kMaxResizedSide) {
        throw DecodeError(
            fmt::format("a {}x{} image resized to a shorter side of {} would be {} "
                        "pixels long; such a sliver is not served",
                        width, height, rule.shorter_side, new_long));
      }
      const int new_longer = static_cast<int>(new_long);
      return width_shorter ? std::pair{rule.shorter_side, new_longer}
                           : std::pair{new_longer, rule.shorter_side};
    }
  }
  return {width, height};
}

// torchvision's CenterCrop of `crop` pixels from `size`: the index into the resized axis of
// the first output pixel (negative where zero padding comes first).
int crop_start(int size, int crop) {
  if (crop > size) {
    // Pads (crop - size) // 2 before, the rest after, then crops all of the padded axis.
    return -((crop - size) / 2);
  }
  // int(round((size - crop) / 2.0)): Python rounds halves to even, as nearbyint does by default.
  return static_cast<int>(std::nearbyint((size - crop) / 2.0));
}

// The plan of one axis: in_size input pixels resized to resized_size, cropped to out_size.
AxisPlan plan_axis(int in_size, int resized, int out_size) {
  AxisPlan plan;
  plan.out_size = out_size;
  plan.first.assign(static_cast<std::size_t>(out_size), 0);
  plan.count.assign(static_cast<std::size_t>(out_size), 0);
  std::vector<Taps> kept(static_cast<std::size_t>(out_size));

  const int start = crop_start(resized, out_size);
  for (int i = 0; i < out_size; ++i) {
    const int resized_index = start + i;
    auto& taps = kept[static_cast<std::size_t>(i)];
    if (resized_index < 0 || resized_index >= resized) continue;  // padding: no taps, value 0
    if (resized == in_size) {
      // PIL skips a pass that keeps the size; one tap of weight 1.0 gives the same pixels.
      taps.first = resized_index;
      taps.count = 1;
      taps.weights = {1 << kResamplePrecisionBits};
    } else {
      taps = pil_taps(in_size, resized, resized_index);
    }
    plan.taps = std::max(plan.taps, taps.count);
  }

  plan.weights.assign(static_cast<std::size_t>(out_size) * static_cast<std::size_t>(plan.taps), 0);
  for (int i = 0; i < out_size; ++i) {
    const auto& taps = kept[static_cast<std::size_t>(i)];
    plan.first[static_cast<std::size_t>(i)] = taps.first;
    plan.count[static_cast<std::size_t>(i)] = taps.count;
    std::copy(taps.weights.begin(), taps.weights.end(),
              plan.weights.begin() + static_cast<std::ptrdiff_t>(i) * plan.taps);
  }
  return plan;
}

}  // namespace

TransformPlan plan_transform(const ViewSpec& spec, int image_width, int image_height) {
  if (image_width < 1 || image_height < 1) {
    throw std::invalid_argument(
        fmt::format("cannot plan a view of a {}x{} image", image_width, image_height));
  }
  TransformPlan plan;
  plan.image_width = image_width;
  plan.image_height = image_height;
  std::tie(plan.resized_width, plan.resized_height) =
      resized_size(spec.resize, image_width, image_height);
  plan.horizontal = plan_axis(image_width, plan.resized_width, spec.out_width());
  plan.vertical = plan_axis(image_height, plan.resized_height, spec.out_height());
  return plan;
}

}  // namespace dsfs::view
