#include "cuda/cuda_batch_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace dsfs::view::cuda_detail {
namespace {

static_assert(kFixedPointBits == kResamplePrecisionBits,
              "the kernels' fixed point must be the plan's");

std::uint64_t align_up(std::uint64_t value) {
  return (value + kSectionAlignment - 1) / kSectionAlignment * kSectionAlignment;
}

std::uint64_t table_bytes(const AxisPlan& axis) {
  return (2 * static_cast<std::uint64_t>(axis.out_size) + axis.weights.size()) *
         sizeof(std::int32_t);
}

std::uint64_t pixel_bytes(const InputRange& rows, const InputRange& columns) {
  return static_cast<std::uint64_t>(rows.size()) * static_cast<std::uint64_t>(columns.size()) * 3;
}

// Places one axis's three tables at `cursor`, advancing it past them.
AxisTable place_axis(const AxisPlan& axis, std::uint64_t& cursor) {
  AxisTable table;
  table.taps = axis.taps;
  table.size = axis.out_size;
  const std::uint64_t per_pixel_bytes = static_cast<std::uint64_t>(axis.out_size) * 4;
  table.first_offset = cursor;
  cursor = align_up(cursor + per_pixel_bytes);
  table.count_offset = cursor;
  cursor = align_up(cursor + per_pixel_bytes);
  table.weights_offset = cursor;
  cursor = align_up(cursor + axis.weights.size() * sizeof(std::int32_t));
  return table;
}

void check_axis(const AxisPlan& axis, int expected_size, const char* name) {
  const auto size = static_cast<std::size_t>(axis.out_size);
  if (axis.out_size != expected_size || axis.first.size() != size || axis.count.size() != size ||
      axis.taps < 0 || axis.weights.size() != size * static_cast<std::size_t>(axis.taps)) {
    throw std::invalid_argument(fmt::format(
        "CUDA batch: the {} plan has {} outputs ({} first, {} count, {} weights for {} taps) but "
        "the view needs {}",
        name, axis.out_size, axis.first.size(), axis.count.size(), axis.weights.size(), axis.taps,
        expected_size));
  }
  for (std::size_t i = 0; i < size; ++i) {
    if (axis.count[i] < 0 || axis.count[i] > axis.taps) {
      throw std::invalid_argument(
          fmt::format("CUDA batch: the {} plan's output {} uses {} taps, outside 0..{}", name, i,
                      axis.count[i], axis.taps));
    }
  }
}

// The plan's first indices, rebased to the packed range (padding keeps 0).
void write_table(const AxisPlan& axis, const AxisTable& table, const InputRange& range,
                 std::byte* upload) {
  auto* first = reinterpret_cast<std::int32_t*>(upload + table.first_offset);
  for (std::size_t i = 0; i < axis.first.size(); ++i) {
    first[i] = axis.count[i] > 0 ? axis.first[i] - range.begin : 0;
  }
  std::memcpy(upload + table.count_offset, axis.count.data(),
              axis.count.size() * sizeof(std::int32_t));
  std::memcpy(upload + table.weights_offset, axis.weights.data(),
              axis.weights.size() * sizeof(std::int32_t));
}

}  // namespace

InputRange used_input_range(const AxisPlan& axis) {
  InputRange range;
  bool any = false;
  for (std::size_t i = 0; i < axis.count.size(); ++i) {
    if (axis.count[i] <= 0) continue;
    const int begin = axis.first[i];
    const int end = axis.first[i] + axis.count[i];
    range.begin = any ? std::min(range.begin, begin) : begin;
    range.end = any ? std::max(range.end, end) : end;
    any = true;
  }
  return range;
}

BatchParams make_batch_params(const ViewSpec& spec, int image_count) {
  BatchParams params;
  params.image_count = image_count;
  params.out_width = spec.out_width();
  params.out_height = spec.out_height();
  switch (spec.dtype) {
    case DType::kUint8:
      params.dtype = kOutUint8;
      break;
    case DType::kFloat16:
      params.dtype = kOutFloat16;
      break;
    case DType::kFloat32:
      params.dtype = kOutFloat32;
      break;
  }
  params.layout = spec.layout == Layout::kCHW ? kOutCHW : kOutHWC;
  params.normalize = spec.normalize ? 1 : 0;
  for (int channel = 0; channel < 3; ++channel) {
    params.mean[channel] = spec.mean[static_cast<std::size_t>(channel)];
    params.std[channel] = spec.std[static_cast<std::size_t>(channel)];
  }
  params.tensor_bytes = spec.tensor_bytes();
  params.descriptors_offset = 0;
  return params;
}

std::uint64_t image_upload_bytes(const TransformPlan& plan) {
  return table_bytes(plan.horizontal) + table_bytes(plan.vertical) +
         pixel_bytes(used_input_range(plan.vertical), used_input_range(plan.horizontal));
}

BatchLayout plan_batch_layout(const ViewSpec& spec, std::span<const TransformPlan> plans) {
  BatchLayout layout;
  layout.params = make_batch_params(spec, static_cast<int>(plans.size()));
  const int out_width = layout.params.out_width;
  std::uint64_t cursor = align_up(plans.size() * sizeof(ImageDescriptor));
  std::uint64_t scratch_cursor = 0;
  for (const TransformPlan& plan : plans) {
    check_axis(plan.horizontal, out_width, "horizontal");
    check_axis(plan.vertical, layout.params.out_height, "vertical");
    const InputRange rows = used_input_range(plan.vertical);
    const InputRange columns = used_input_range(plan.horizontal);
    ImageDescriptor image;
    image.rows = rows.size();
    image.cols = columns.size();
    image.horizontal = place_axis(plan.horizontal, cursor);
    image.vertical = place_axis(plan.vertical, cursor);
    image.pixels_offset = cursor;
    cursor = align_up(cursor + pixel_bytes(rows, columns));
    image.scratch_offset = scratch_cursor;
    scratch_cursor = align_up(scratch_cursor + static_cast<std::uint64_t>(image.rows) *
                                                   static_cast<std::uint64_t>(out_width) * 3);
    layout.images.push_back(image);
    layout.rows.push_back(rows);
    layout.columns.push_back(columns);
  }
  layout.upload_bytes = cursor;
  layout.scratch_bytes = scratch_cursor;
  layout.output_bytes = plans.size() * layout.params.tensor_bytes;
  return layout;
}

void pack_batch(const BatchLayout& layout, std::span<const TransformPlan> plans,
                std::span<const RgbImage* const> images, std::span<std::byte> upload) {
  if (plans.size() != layout.images.size() || images.size() != layout.images.size()) {
    throw std::invalid_argument(fmt::format("CUDA batch: {} plans and {} images for a layout of {}",
                                            plans.size(), images.size(), layout.images.size()));
  }
  if (upload.size() < layout.upload_bytes) {
    throw std::invalid_argument(fmt::format("CUDA batch: upload buffer of {} bytes, {} needed",
                                            upload.size(), layout.upload_bytes));
  }
  std::memcpy(upload.data() + layout.params.descriptors_offset, layout.images.data(),
              layout.images.size() * sizeof(ImageDescriptor));
  for (std::size_t i = 0; i < images.size(); ++i) {
    const RgbImage& image = *images[i];
    const TransformPlan& plan = plans[i];
    const std::size_t expected_pixels =
        static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height) * 3;
    if (image.width != plan.image_width || image.height != plan.image_height ||
        image.pixels.size() != expected_pixels) {
      throw std::invalid_argument(fmt::format(
          "CUDA batch: image {} is {}x{} with {} pixel bytes but its plan is for {}x{}", i,
          image.width, image.height, image.pixels.size(), plan.image_width, plan.image_height));
    }
    const ImageDescriptor& descriptor = layout.images[i];
    const InputRange rows = layout.rows[i];
    const InputRange columns = layout.columns[i];
    if (rows.begin < 0 || rows.end > image.height || columns.begin < 0 ||
        columns.end > image.width) {
      throw std::invalid_argument(fmt::format(
          "CUDA batch: image {} ({}x{}) has a plan reading rows [{}, {}) and columns "
          "[{}, {}) outside it",
          i, image.width, image.height, rows.begin, rows.end, columns.begin, columns.end));
    }
    write_table(plan.horizontal, descriptor.horizontal, columns, upload.data());
    write_table(plan.vertical, descriptor.vertical, rows, upload.data());
    const std::size_t packed_row_bytes = static_cast<std::size_t>(columns.size()) * 3;
    const std::size_t image_row_bytes = static_cast<std::size_t>(image.width) * 3;
    std::byte* destination = upload.data() + descriptor.pixels_offset;
    for (int row = rows.begin; row < rows.end; ++row) {
      const std::uint8_t* source = image.pixels.data() +
                                   static_cast<std::size_t>(row) * image_row_bytes +
                                   static_cast<std::size_t>(columns.begin) * 3;
      std::memcpy(destination, source, packed_row_bytes);
      destination += packed_row_bytes;
    }
  }
}

std::vector<IndexRange> split_batch(std::span<const std::uint64_t> bytes_per_image,
                                    std::uint64_t max_bytes, std::size_t max_images) {
  if (max_images == 0) throw std::invalid_argument("split_batch: max_images must be at least 1");
  std::vector<IndexRange> chunks;
  std::size_t begin = 0;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < bytes_per_image.size(); ++i) {
    const bool full =
        i - begin == max_images || (i > begin && bytes + bytes_per_image[i] > max_bytes);
    if (full) {
      chunks.push_back({begin, i});
      begin = i;
      bytes = 0;
    }
    bytes += bytes_per_image[i];
  }
  if (begin < bytes_per_image.size()) chunks.push_back({begin, bytes_per_image.size()});
  return chunks;
}

}  // namespace dsfs::view::cuda_detail
