// The CUDA backend's host side, which needs no GPU: batch layout, packing, splitting, and the
// kernels' per-thread arithmetic (cuda_pixel_math.h) run on the CPU over a packed batch and
// compared bit for bit with the CPU backend.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <numeric>

#include "cuda/backend.h"
#include "cuda/cuda_batch_layout.h"
#include "cuda/cuda_pixel_math.h"
#include "cuda/resample.h"
#include "tests/unit/view_cuda_test_util.h"

namespace dsfs::view::cuda_detail {
namespace {

using test_images::synthetic_image;
using test_images::test_image_sizes;
using test_images::test_spec_texts;

// Exactly `size` bytes (operator new[] aligns to 16), so ASan flags any read past the layout.
struct ExactBuffer {
  explicit ExactBuffer(std::uint64_t size)
      : bytes(new std::byte[std::max<std::uint64_t>(size, 1)]()), size(size) {}
  std::span<std::byte> span() const { return {bytes.get(), size}; }
  std::uint8_t* data() const { return reinterpret_cast<std::uint8_t*>(bytes.get()); }
  std::unique_ptr<std::byte[]> bytes;
  std::uint64_t size;
};

std::uint16_t host_half_bits(float value) {
  const auto half = static_cast<_Float16>(value);  // round to nearest even, as __float2half_rn
  std::uint16_t bits;
  std::memcpy(&bits, &half, sizeof(bits));
  return bits;
}

// Every thread of both kernels, on the CPU, reading the descriptors from the packed buffer as
// the kernels do.
std::vector<std::byte> emulate_kernels(const BatchLayout& layout, const ExactBuffer& upload) {
  const BatchParams& params = layout.params;
  ExactBuffer scratch(layout.scratch_bytes);
  ExactBuffer output(layout.output_bytes);
  for (std::int32_t index = 0; index < params.image_count; ++index) {
    ImageDescriptor image;
    std::memcpy(&image,
                upload.data() + params.descriptors_offset +
                    static_cast<std::size_t>(index) * sizeof(ImageDescriptor),
                sizeof(image));
    for (std::int32_t row = 0; row < image.rows; ++row) {
      for (std::int32_t x = 0; x < params.out_width; ++x) {
        horizontal_pixel(upload.data(), scratch.data(), image, params.out_width, row, x);
      }
    }
    std::uint8_t* tensor = output.data() + static_cast<std::uint64_t>(index) * params.tensor_bytes;
    for (std::int32_t y = 0; y < params.out_height; ++y) {
      for (std::int32_t x = 0; x < params.out_width; ++x) {
        std::uint8_t rgb[3];
        vertical_pixel(upload.data(), scratch.data(), image, params.out_width, y, x, rgb);
        store_pixel(params, tensor, y, x, rgb, host_half_bits);
      }
    }
  }
  return {output.bytes.get(), output.bytes.get() + output.size};
}

std::vector<TransformPlan> plans_for(const ViewSpec& spec, const std::vector<RgbImage>& images) {
  std::vector<TransformPlan> plans;
  for (const RgbImage& image : images) {
    plans.push_back(plan_transform(spec, image.width, image.height));
  }
  return plans;
}

std::vector<const RgbImage*> pointers(const std::vector<RgbImage>& images) {
  std::vector<const RgbImage*> result;
  for (const RgbImage& image : images) result.push_back(&image);
  return result;
}

std::vector<RgbImage> all_test_images() {
  std::vector<RgbImage> images;
  std::uint32_t seed = 1;
  for (const auto& [width, height] : test_image_sizes()) {
    images.push_back(synthetic_image(width, height, seed++));
  }
  return images;
}

AxisPlan make_axis(std::vector<std::int32_t> first, std::vector<std::int32_t> count, int taps) {
  AxisPlan axis;
  axis.out_size = static_cast<int>(first.size());
  axis.taps = taps;
  axis.first = std::move(first);
  axis.count = std::move(count);
  axis.weights.assign(axis.first.size() * static_cast<std::size_t>(taps), 1);
  return axis;
}

TEST(CudaLayout, UsedInputRangeSpansEveryTapAndSkipsPadding) {
  EXPECT_EQ(used_input_range(make_axis({0, 5, 3, 9}, {0, 3, 2, 0}, 3)), (InputRange{3, 8}));
  EXPECT_EQ(used_input_range(make_axis({2, 2}, {1, 2}, 2)), (InputRange{2, 4}));
  const InputRange padding_only = used_input_range(make_axis({4, 7}, {0, 0}, 0));
  EXPECT_EQ(padding_only, (InputRange{0, 0}));
  EXPECT_EQ(padding_only.size(), 0);
}

TEST(CudaLayout, BatchParamsFollowTheSpec) {
  const ViewSpec spec =
      parse_view_spec("resize=64,crop=80x48,dtype=float16,layout=hwc,norm=imagenet");
  const BatchParams params = make_batch_params(spec, 5);
  EXPECT_EQ(params.image_count, 5);
  EXPECT_EQ(params.out_width, 80);
  EXPECT_EQ(params.out_height, 48);
  EXPECT_EQ(params.dtype, kOutFloat16);
  EXPECT_EQ(params.layout, kOutHWC);
  EXPECT_EQ(params.normalize, 1);
  EXPECT_FLOAT_EQ(params.mean[1], spec.mean[1]);
  EXPECT_FLOAT_EQ(params.std[2], spec.std[2]);
  EXPECT_EQ(params.tensor_bytes, spec.tensor_bytes());
}

TEST(CudaLayout, SectionsAreAlignedDisjointAndInsideTheBuffers) {
  const ViewSpec spec = parse_view_spec("imagenet-eval");
  const std::vector<RgbImage> images = all_test_images();
  const std::vector<TransformPlan> plans = plans_for(spec, images);
  const BatchLayout layout = plan_batch_layout(spec, plans);
  ASSERT_EQ(layout.images.size(), images.size());
  EXPECT_EQ(layout.output_bytes, images.size() * spec.tensor_bytes());

  // [begin, end) of every section of the upload buffer, then checked pairwise.
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sections{
      {0, images.size() * sizeof(ImageDescriptor)}};
  std::vector<std::pair<std::uint64_t, std::uint64_t>> scratch_sections;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const ImageDescriptor& image = layout.images[i];
    SCOPED_TRACE(::testing::Message() << images[i].width << "x" << images[i].height);
    EXPECT_EQ(image.rows, layout.rows[i].size());
    EXPECT_EQ(image.cols, layout.columns[i].size());
    EXPECT_LE(layout.rows[i].end, images[i].height);
    EXPECT_LE(layout.columns[i].end, images[i].width);
    for (const auto& [axis, plan] : {std::pair{&image.horizontal, &plans[i].horizontal},
                                     std::pair{&image.vertical, &plans[i].vertical}}) {
      EXPECT_EQ(axis->taps, plan->taps);
      EXPECT_EQ(axis->size, plan->out_size);
      const std::uint64_t per_pixel = static_cast<std::uint64_t>(plan->out_size) * 4;
      sections.push_back({axis->first_offset, axis->first_offset + per_pixel});
      sections.push_back({axis->count_offset, axis->count_offset + per_pixel});
      sections.push_back({axis->weights_offset,
                          axis->weights_offset + plan->weights.size() * sizeof(std::int32_t)});
    }
    sections.push_back(
        {image.pixels_offset,
         image.pixels_offset + static_cast<std::uint64_t>(image.rows) * image.cols * 3});
    scratch_sections.push_back(
        {image.scratch_offset,
         image.scratch_offset + static_cast<std::uint64_t>(image.rows) * spec.out_width() * 3});
  }
  for (auto* list : {&sections, &scratch_sections}) {
    std::sort(list->begin(), list->end());
    for (std::size_t i = 0; i < list->size(); ++i) {
      EXPECT_EQ((*list)[i].first % kSectionAlignment, 0U) << "section " << i;
      if (i > 0) {
        EXPECT_LE((*list)[i - 1].second, (*list)[i].first) << "sections overlap";
      }
    }
  }
  EXPECT_LE(sections.back().second, layout.upload_bytes);
  EXPECT_LE(scratch_sections.back().second, layout.scratch_bytes);
}

TEST(CudaLayout, PackedTablesAreRebasedAndPixelsAreTheUsedRectangle) {
  const ViewSpec spec = parse_view_spec("resize=64,crop=80x48,dtype=uint8,layout=hwc");
  std::vector<RgbImage> images{synthetic_image(300, 200, 3), synthetic_image(40, 90, 4),
                               synthetic_image(5, 5, 5)};
  const std::vector<TransformPlan> plans = plans_for(spec, images);
  const BatchLayout layout = plan_batch_layout(spec, plans);
  ExactBuffer upload(layout.upload_bytes);
  const std::vector<const RgbImage*> inputs = pointers(images);
  pack_batch(layout, plans, inputs, upload.span());

  for (std::size_t i = 0; i < images.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "image " << i);
    ImageDescriptor packed;
    std::memcpy(&packed, upload.data() + i * sizeof(ImageDescriptor), sizeof(packed));
    EXPECT_EQ(packed.pixels_offset, layout.images[i].pixels_offset);
    EXPECT_EQ(packed.rows, layout.images[i].rows);
    for (const auto& [table, plan, range, limit] :
         {std::tuple{packed.horizontal, &plans[i].horizontal, layout.columns[i], packed.cols},
          std::tuple{packed.vertical, &plans[i].vertical, layout.rows[i], packed.rows}}) {
      const auto* first = table_at<std::int32_t>(upload.data(), table.first_offset);
      const auto* count = table_at<std::int32_t>(upload.data(), table.count_offset);
      const auto* weights = table_at<std::int32_t>(upload.data(), table.weights_offset);
      for (int out = 0; out < plan->out_size; ++out) {
        ASSERT_EQ(count[out], plan->count[out]);
        if (count[out] == 0) continue;
        EXPECT_EQ(first[out], plan->first[out] - range.begin);
        EXPECT_GE(first[out], 0);
        EXPECT_LE(first[out] + count[out], limit);
      }
      EXPECT_TRUE(std::equal(plan->weights.begin(), plan->weights.end(), weights));
    }
    const RgbImage& image = images[i];
    for (int row = 0; row < packed.rows; ++row) {
      const std::uint8_t* packed_row =
          upload.data() + packed.pixels_offset + static_cast<std::size_t>(row) * packed.cols * 3;
      const std::uint8_t* source_row =
          image.pixels.data() +
          (static_cast<std::size_t>(row + layout.rows[i].begin) * image.width +
           layout.columns[i].begin) *
              3;
      ASSERT_EQ(std::memcmp(packed_row, source_row, static_cast<std::size_t>(packed.cols) * 3), 0)
          << "row " << row;
    }
  }
}

TEST(CudaLayout, KernelArithmeticMatchesTheCpuBackendBitForBit) {
  const std::vector<RgbImage> images = all_test_images();
  const std::vector<const RgbImage*> inputs = pointers(images);
  const auto cpu = make_cpu_backend();
  for (const std::string& text : test_spec_texts()) {
    SCOPED_TRACE(text);
    const ViewSpec spec = parse_view_spec(text);
    const std::vector<TransformPlan> plans = plans_for(spec, images);
    const BatchLayout layout = plan_batch_layout(spec, plans);
    ExactBuffer upload(layout.upload_bytes);
    pack_batch(layout, plans, inputs, upload.span());
    const std::vector<std::byte> emulated = emulate_kernels(layout, upload);

    std::vector<std::byte> expected(layout.output_bytes);
    std::vector<std::span<std::byte>> outputs;
    for (std::size_t i = 0; i < images.size(); ++i) {
      outputs.emplace_back(expected.data() + i * spec.tensor_bytes(), spec.tensor_bytes());
    }
    cpu->transform(spec, inputs, outputs);
    for (std::size_t i = 0; i < images.size(); ++i) {
      const std::size_t offset = i * spec.tensor_bytes();
      EXPECT_EQ(
          std::memcmp(emulated.data() + offset, expected.data() + offset, spec.tensor_bytes()), 0)
          << images[i].width << "x" << images[i].height << " differs; max difference "
          << test_images::max_pixel_difference(
                 spec, std::span(emulated).subspan(offset, spec.tensor_bytes()),
                 std::span(expected).subspan(offset, spec.tensor_bytes()))
          << "/255";
    }
  }
}

TEST(CudaLayout, PackRejectsImagesThatDoNotMatchTheirPlan) {
  const ViewSpec spec = parse_view_spec("imagenet-eval-uint8");
  std::vector<RgbImage> images{synthetic_image(300, 200, 1)};
  const std::vector<TransformPlan> plans = plans_for(spec, images);
  const BatchLayout layout = plan_batch_layout(spec, plans);
  ExactBuffer upload(layout.upload_bytes);

  std::vector<RgbImage> other_size{synthetic_image(200, 300, 1)};
  EXPECT_THROW(pack_batch(layout, plans, pointers(other_size), upload.span()),
               std::invalid_argument);
  std::vector<RgbImage> truncated{images[0]};
  truncated[0].pixels.resize(truncated[0].pixels.size() - 1);
  EXPECT_THROW(pack_batch(layout, plans, pointers(truncated), upload.span()),
               std::invalid_argument);
  EXPECT_THROW(pack_batch(layout, plans, pointers(images), upload.span().first(10)),
               std::invalid_argument);
  EXPECT_NO_THROW(pack_batch(layout, plans, pointers(images), upload.span()));
}

TEST(CudaLayout, LayoutRejectsPlansOfAnotherSpec) {
  const ViewSpec spec = parse_view_spec("imagenet-eval");
  const std::vector<TransformPlan> plans{
      plan_transform(parse_view_spec("resize=64,crop=32"), 100, 100)};
  EXPECT_THROW(plan_batch_layout(spec, plans), std::invalid_argument);

  std::vector<TransformPlan> corrupt{plan_transform(spec, 100, 100)};
  corrupt[0].horizontal.count[3] = corrupt[0].horizontal.taps + 1;
  EXPECT_THROW(plan_batch_layout(spec, corrupt), std::invalid_argument);
}

TEST(CudaLayout, SplitBatchBoundsBytesAndImages) {
  const std::vector<std::uint64_t> sizes{10, 20, 30, 100, 5, 5, 5};
  EXPECT_EQ(split_batch(sizes, 1000, 100), (std::vector<IndexRange>{{0, 7}}));
  EXPECT_EQ(split_batch(sizes, 50, 100),
            (std::vector<IndexRange>{{0, 2}, {2, 3}, {3, 4}, {4, 7}}));  // 100 alone is too big
  EXPECT_EQ(split_batch(sizes, 1000, 3), (std::vector<IndexRange>{{0, 3}, {3, 6}, {6, 7}}));
  EXPECT_TRUE(split_batch({}, 10, 1).empty());
  EXPECT_THROW(split_batch(sizes, 10, 0), std::invalid_argument);

  // Every image lands in exactly one range, in order.
  std::vector<std::uint64_t> many(1000);
  std::iota(many.begin(), many.end(), 1);
  const std::vector<IndexRange> ranges = split_batch(many, 5000, 64);
  std::size_t next = 0;
  for (const IndexRange& range : ranges) {
    EXPECT_EQ(range.begin, next);
    EXPECT_GT(range.end, range.begin);
    EXPECT_LE(range.end - range.begin, 64U);
    const std::uint64_t bytes =
        std::accumulate(many.begin() + static_cast<std::ptrdiff_t>(range.begin),
                        many.begin() + static_cast<std::ptrdiff_t>(range.end), std::uint64_t{0});
    if (range.end - range.begin > 1) {
      EXPECT_LE(bytes, 5000U);
    }
    next = range.end;
  }
  EXPECT_EQ(next, many.size());
}

TEST(CudaLayout, UploadBytesCountTablesAndUsedPixels) {
  const ViewSpec spec = parse_view_spec("imagenet-eval");
  const TransformPlan plan = plan_transform(spec, 500, 375);
  const InputRange rows = used_input_range(plan.vertical);
  const InputRange columns = used_input_range(plan.horizontal);
  const std::uint64_t tables =
      (2 * 224 + plan.horizontal.weights.size() + 2 * 224 + plan.vertical.weights.size()) * 4;
  EXPECT_EQ(image_upload_bytes(plan),
            tables + static_cast<std::uint64_t>(rows.size()) * columns.size() * 3);
  // The crop keeps 224 of 256 resized rows: fewer input rows than the image has travel.
  EXPECT_LT(rows.size(), 375);
  EXPECT_GT(rows.size(), 375 * 224 / 256);
}

}  // namespace
}  // namespace dsfs::view::cuda_detail
