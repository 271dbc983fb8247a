#include "cuda/resample.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "cuda/image_decode.h"

namespace dsfs::view {
namespace {

constexpr std::int32_t kOne = 1 << kResamplePrecisionBits;

std::vector<std::int32_t> weights_of(const AxisPlan& axis, int index) {
  const auto begin = axis.weights.begin() + static_cast<std::ptrdiff_t>(index) * axis.taps;
  return {begin, begin + axis.count[index]};
}

// Invariants every axis plan keeps, whatever the sizes.
void expect_well_formed(const AxisPlan& axis, int in_size) {
  ASSERT_EQ(axis.first.size(), static_cast<std::size_t>(axis.out_size));
  ASSERT_EQ(axis.count.size(), static_cast<std::size_t>(axis.out_size));
  ASSERT_EQ(axis.weights.size(), static_cast<std::size_t>(axis.out_size) * axis.taps);
  int largest = 0;
  for (int i = 0; i < axis.out_size; ++i) {
    SCOPED_TRACE(i);
    const int count = axis.count[i];
    largest = std::max(largest, count);
    ASSERT_GE(count, 0);
    ASSERT_LE(count, axis.taps);
    for (int t = count; t < axis.taps; ++t) {
      EXPECT_EQ(axis.weights[static_cast<std::size_t>(i) * axis.taps + t], 0) << "unused tap";
    }
    if (count == 0) continue;
    EXPECT_GE(axis.first[i], 0);
    EXPECT_LE(axis.first[i] + count, in_size);
    const auto weights = weights_of(axis, i);
    // Bilinear weights are never negative; normalized, they sum to 1.0 up to the rounding of
    // each tap to fixed point (half a unit each).
    EXPECT_TRUE(std::all_of(weights.begin(), weights.end(), [](auto w) { return w >= 0; }));
    const std::int64_t sum = std::accumulate(weights.begin(), weights.end(), std::int64_t{0});
    EXPECT_LE(std::abs(sum - kOne), (count + 1) / 2) << "sum " << sum;
  }
  EXPECT_EQ(axis.taps, largest);
}

TEST(ResamplePlan, SameSizeIsOneTapOfWeightOne) {
  const TransformPlan plan = plan_transform(parse_view_spec("crop=30x20"), 30, 20);
  EXPECT_EQ(plan.resized_width, 30);
  EXPECT_EQ(plan.resized_height, 20);
  for (const AxisPlan* axis : {&plan.horizontal, &plan.vertical}) {
    EXPECT_EQ(axis->taps, 1);
    for (int i = 0; i < axis->out_size; ++i) {
      EXPECT_EQ(axis->first[i], i);
      EXPECT_EQ(axis->count[i], 1);
      EXPECT_EQ(axis->weights[i], kOne);
    }
  }
}

TEST(ResamplePlan, ExactResizeToTheSameSizeIsIdentityToo) {
  const TransformPlan plan = plan_transform(parse_view_spec("resize=40x10"), 40, 10);
  EXPECT_EQ(plan.horizontal.taps, 1);
  EXPECT_EQ(plan.vertical.taps, 1);
  EXPECT_EQ(plan.horizontal.out_size, 40);
}

TEST(ResamplePlan, DownscaleByTwoHasPilsWeights) {
  // Pillow: 4 -> 2, scale 2, support 2; pixel 0 centred at 1.0 takes inputs 0..2 with filter
  // values 0.75, 0.75, 0.25 -> 3/7, 3/7, 1/7 -> (int)(0.5 + w * 2^22).
  const TransformPlan plan = plan_transform(parse_view_spec("resize=2x1"), 4, 1);
  const AxisPlan& h = plan.horizontal;
  ASSERT_EQ(h.out_size, 2);
  EXPECT_EQ(h.first[0], 0);
  EXPECT_EQ(weights_of(h, 0), (std::vector<std::int32_t>{1797559, 1797559, 599186}));
  EXPECT_EQ(h.first[1], 1);
  EXPECT_EQ(weights_of(h, 1), (std::vector<std::int32_t>{599186, 1797559, 1797559}));
  EXPECT_EQ(h.taps, 3);
  // The vertical axis keeps its size.
  EXPECT_EQ(plan.vertical.taps, 1);
}

TEST(ResamplePlan, UpscaleByTwoHasPilsWeights) {
  // Pillow: 2 -> 4, support 1; pixel 0 centred at 0.25 sees only input 0; pixel 1 (0.75) sees
  // inputs 0 and 1 with 0.75 and 0.25.
  const TransformPlan plan = plan_transform(parse_view_spec("resize=4x2"), 2, 2);
  const AxisPlan& h = plan.horizontal;
  EXPECT_EQ(h.first[0], 0);
  EXPECT_EQ(weights_of(h, 0), (std::vector<std::int32_t>{kOne}));
  EXPECT_EQ(h.first[1], 0);
  EXPECT_EQ(weights_of(h, 1), (std::vector<std::int32_t>{3145728, 1048576}));
  EXPECT_EQ(h.first[2], 0);
  EXPECT_EQ(weights_of(h, 2), (std::vector<std::int32_t>{1048576, 3145728}));
  EXPECT_EQ(h.first[3], 1);
  EXPECT_EQ(weights_of(h, 3), (std::vector<std::int32_t>{kOne}));
}

TEST(ResamplePlan, ShorterSideFollowsTorchvision) {
  const ViewSpec spec = parse_view_spec("resize=256,crop=224");
  // int(256 * 500 / 375) = 341; the crop starts at round(117 / 2) = round(58.5) = 58 (even).
  TransformPlan plan = plan_transform(spec, 500, 375);
  EXPECT_EQ(plan.resized_width, 341);
  EXPECT_EQ(plan.resized_height, 256);
  plan = plan_transform(spec, 375, 500);
  EXPECT_EQ(plan.resized_width, 256);
  EXPECT_EQ(plan.resized_height, 341);
  plan = plan_transform(spec, 333, 500);  // int(256 * 500 / 333) = int(384.38...) = 384
  EXPECT_EQ(plan.resized_height, 384);
  plan = plan_transform(spec, 3, 1000);  // int(85333.33)
  EXPECT_EQ(plan.resized_height, 85333);
  plan = plan_transform(spec, 300, 300);
  EXPECT_EQ(plan.resized_width, 256);
  EXPECT_EQ(plan.resized_height, 256);
}

TEST(ResamplePlan, CenterCropRoundsHalvesToEven) {
  // No resize: the crop offset alone is visible as the first input of each output.
  const ViewSpec spec = parse_view_spec("crop=224");
  // (257 - 224) / 2 = 16.5 -> 16; (259 - 224) / 2 = 17.5 -> 18; (260 - 224) / 2 = 18.
  EXPECT_EQ(plan_transform(spec, 257, 259).horizontal.first[0], 16);
  EXPECT_EQ(plan_transform(spec, 257, 259).vertical.first[0], 18);
  EXPECT_EQ(plan_transform(spec, 260, 224).horizontal.first[0], 18);
  EXPECT_EQ(plan_transform(spec, 260, 224).vertical.first[0], 0);
}

TEST(ResamplePlan, SmallerThanTheCropIsPaddedWithCountZero) {
  // torchvision pads (224 - 101) // 2 = 61 before and 62 after, (224 - 80) // 2 = 72 each side.
  const TransformPlan plan = plan_transform(parse_view_spec("crop=224"), 101, 80);
  const AxisPlan& h = plan.horizontal;
  for (int i = 0; i < 224; ++i) {
    const bool inside = i >= 61 && i < 61 + 101;
    EXPECT_EQ(h.count[i], inside ? 1 : 0) << i;
    if (inside) {
      EXPECT_EQ(h.first[i], i - 61);
    }
  }
  const AxisPlan& v = plan.vertical;
  for (int i = 0; i < 224; ++i) EXPECT_EQ(v.count[i], i >= 72 && i < 152 ? 1 : 0) << i;
  expect_well_formed(h, 101);
  expect_well_formed(v, 80);
}

TEST(ResamplePlan, PaddingAfterAResize) {
  // resize=100 makes 100x125 of 160x200; the 224 crop pads both axes around resampled pixels.
  const TransformPlan plan = plan_transform(parse_view_spec("resize=100,crop=224"), 160, 200);
  EXPECT_EQ(plan.resized_width, 100);
  EXPECT_EQ(plan.resized_height, 125);
  EXPECT_EQ(plan.horizontal.count[61], 0);
  EXPECT_GT(plan.horizontal.count[62], 1);
  EXPECT_EQ(plan.horizontal.first[62], 0);
  EXPECT_EQ(plan.horizontal.count[162], 0);
  EXPECT_EQ(plan.vertical.count[48], 0);
  EXPECT_GT(plan.vertical.count[49], 1);
  EXPECT_EQ(plan.vertical.count[49 + 125], 0);
  expect_well_formed(plan.horizontal, 160);
  expect_well_formed(plan.vertical, 200);
}

TEST(ResamplePlan, WellFormedForASpreadOfSizes) {
  const char* specs[] = {"imagenet-eval", "resize=64x48", "resize=300x17,crop=5x9",
                         "resize=1,crop=1", "resize=8192,crop=3"};
  const std::pair<int, int> sizes[] = {{500, 375},  {375, 500},  {1, 1},     {3000, 2000},
                                       {1000, 200}, {200, 1000}, {224, 224}, {7, 3000}};
  for (const char* text : specs) {
    for (const auto& [width, height] : sizes) {
      SCOPED_TRACE(testing::Message() << text << " on " << width << "x" << height);
      const ViewSpec spec = parse_view_spec(text);
      const TransformPlan plan = plan_transform(spec, width, height);
      EXPECT_EQ(plan.image_width, width);
      EXPECT_EQ(plan.image_height, height);
      EXPECT_EQ(plan.horizontal.out_size, spec.out_width());
      EXPECT_EQ(plan.vertical.out_size, spec.out_height());
      expect_well_formed(plan.horizontal, width);
      expect_well_formed(plan.vertical, height);
    }
  }
}

TEST(ResamplePlan, DownscaleTapsGrowWithTheFactor) {
  // 3000 -> 256 wide: support 1 * 3000/256 = 11.7 input pixels each side.
  const TransformPlan plan = plan_transform(parse_view_spec("resize=256x256"), 3000, 3000);
  EXPECT_GE(plan.horizontal.taps, 23);
  EXPECT_LE(plan.horizontal.taps, 25);
}

TEST(ResamplePlan, AbsurdSliversAndEmptyImagesAreRefused) {
  // 1 x 100000 to a shorter side of 8192 would be 819.2 M pixels long.
  EXPECT_THROW(plan_transform(parse_view_spec("resize=8192,crop=8"), 1, 100000), DecodeError);
  EXPECT_THROW(plan_transform(parse_view_spec("crop=8"), 0, 10), std::invalid_argument);
  EXPECT_THROW(plan_transform(parse_view_spec("crop=8"), 10, -1), std::invalid_argument);
}

}  // namespace
}  // namespace dsfs::view
