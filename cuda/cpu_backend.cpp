// The CPU backend: applies a TransformPlan with PIL's integer arithmetic (so its pixels are
// PIL's), then ToTensor/Normalize/cast through per-channel lookup tables computed with
// torchvision's float32 operations.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "cuda/backend.h"
#include "cuda/resample.h"

namespace dsfs::view {
namespace {

constexpr int kRoundingHalf = 1 << (kResamplePrecisionBits - 1);

std::uint8_t clip8(std::int32_t accumulated) {
  return static_cast<std::uint8_t>(std::clamp(accumulated >> kResamplePrecisionBits, 0, 255));
}

// IEEE binary16 bits of `value`, rounded to nearest even like torch's Tensor.half().
std::uint16_t float_to_half(float value) {
  const auto bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000U);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFU;
  if (magnitude >= 0x7F800000U) {  // inf stays inf, NaN stays a quiet NaN
    return sign | 0x7C00U | (magnitude > 0x7F800000U ? 0x200U : 0U);
  }
  if (magnitude >= 0x477FF000U) return sign | 0x7C00U;  // from 65520 up rounds to inf
  if (magnitude < 0x38800000U) {
    // Below the smallest normal half: count units of 2^-24 (exact scaling, RNE rounding).
    const float scaled = std::bit_cast<float>(magnitude) * 16777216.0F;
    return sign | static_cast<std::uint16_t>(std::nearbyint(scaled));
  }
  const std::uint32_t rounded = magnitude + 0xFFFU + ((magnitude >> 13) & 1U);
  return sign | static_cast<std::uint16_t>((rounded - 0x38000000U) >> 13);
}

// What each 8-bit value of each channel becomes in the tensor.
struct ValueTables {
  std::array<std::array<float, 256>, 3> float32{};
  std::array<std::array<std::uint16_t, 256>, 3> float16{};
};

ValueTables make_value_tables(const ViewSpec& spec) {
  ValueTables tables;
  for (int channel = 0; channel < 3; ++channel) {
    for (int value = 0; value < 256; ++value) {
      // ToTensor: byte.float().div(255); Normalize: sub_(mean).div_(std), each in float32.
      float x = static_cast<float>(value) / 255.0F;
      if (spec.normalize) x = (x - spec.mean[channel]) / spec.std[channel];
      tables.float32[channel][value] = x;
      tables.float16[channel][value] = float_to_half(x);
    }
  }
  return tables;
}

// Per-thread working memory, grown once and reused, so a transform allocates nothing.
struct Scratch {
  std::vector<std::uint8_t> rows;             // horizontal pass output: needed rows x out_width x 3
  std::vector<const std::uint8_t*> tap_rows;  // the rows one vertical output pixel reads
  std::vector<std::uint8_t> pixels;           // resized and cropped image, HWC
};

Scratch& thread_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

// Scratch above this is given back after the transform: one huge view must not stay allocated
// in every thread that once rendered it, outside the render memory budget.
constexpr std::size_t kKeptScratchBytes = std::size_t{16} << 20;

// Frees the thread's scratch when it grew past kKeptScratchBytes, however the transform ends.
struct ScratchTrim {
  Scratch& scratch;
  ~ScratchTrim() {
    if (scratch.rows.capacity() + scratch.pixels.capacity() > kKeptScratchBytes) scratch = {};
  }
};

// The vertical pass over `size` bytes of a row at `offset`. A fixed size lets the compiler keep
// the sums in SIMD registers at -O2 (its cheap vectorizer needs a known trip count).
template <std::size_t size>
void vertical_block(const std::uint8_t* const* rows, const std::int32_t* weights, int count,
                    std::size_t offset, std::uint8_t* out) {
  std::array<std::int32_t, size> sums;
  sums.fill(kRoundingHalf);
  for (int t = 0; t < count; ++t) {
    const std::uint8_t* row = rows[t] + offset;
    const std::int32_t weight = weights[t];
    for (std::size_t k = 0; k < size; ++k) sums[k] += row[k] * weight;
  }
  for (std::size_t k = 0; k < size; ++k) out[k] = clip8(sums[k]);
}

constexpr std::size_t kBlock = 32;

// Resize + crop to 8-bit HWC pixels exactly as PIL's ImagingResample (horizontal pass, 8-bit
// clip, vertical pass) followed by torchvision's CenterCrop, computing only what the crop keeps.
void resample(const TransformPlan& plan, const RgbImage& image, Scratch& scratch) {
  const AxisPlan& across = plan.horizontal;
  const AxisPlan& down = plan.vertical;
  const std::size_t out_row_bytes = static_cast<std::size_t>(across.out_size) * 3;

  // The input rows the vertical pass reads.
  int row_begin = image.height, row_end = 0;
  for (int j = 0; j < down.out_size; ++j) {
    if (down.count[j] == 0) continue;
    row_begin = std::min(row_begin, down.first[j]);
    row_end = std::max(row_end, down.first[j] + down.count[j]);
  }
  row_end = std::max(row_end, row_begin);

  scratch.rows.resize(static_cast<std::size_t>(row_end - row_begin) * out_row_bytes);
  const std::size_t in_row_bytes = static_cast<std::size_t>(image.width) * 3;
  for (int y = row_begin; y < row_end; ++y) {
    const std::uint8_t* in = image.pixels.data() + static_cast<std::size_t>(y) * in_row_bytes;
    std::uint8_t* out =
        scratch.rows.data() + static_cast<std::size_t>(y - row_begin) * out_row_bytes;
    for (int x = 0; x < across.out_size; ++x, out += 3) {
      const int count = across.count[x];
      const std::int32_t* weights =
          across.weights.data() + static_cast<std::size_t>(x) * across.taps;
      const std::uint8_t* source = in + static_cast<std::size_t>(across.first[x]) * 3;
      std::int32_t r = kRoundingHalf, g = kRoundingHalf, b = kRoundingHalf;
      for (int t = 0; t < count; ++t, source += 3) {
        r += source[0] * weights[t];
        g += source[1] * weights[t];
        b += source[2] * weights[t];
      }
      // A padding column (count 0) is black, as torchvision's zero padding.
      out[0] = count != 0 ? clip8(r) : 0;
      out[1] = count != 0 ? clip8(g) : 0;
      out[2] = count != 0 ? clip8(b) : 0;
    }
  }

  scratch.pixels.resize(static_cast<std::size_t>(down.out_size) * out_row_bytes);
  scratch.tap_rows.resize(static_cast<std::size_t>(down.taps));
  for (int j = 0; j < down.out_size; ++j) {
    std::uint8_t* out = scratch.pixels.data() + static_cast<std::size_t>(j) * out_row_bytes;
    const int count = down.count[j];
    if (count == 0) {
      std::fill_n(out, out_row_bytes, std::uint8_t{0});
      continue;
    }
    for (int t = 0; t < count; ++t) {
      scratch.tap_rows[static_cast<std::size_t>(t)] =
          scratch.rows.data() +
          static_cast<std::size_t>(down.first[j] + t - row_begin) * out_row_bytes;
    }
    const std::int32_t* weights = down.weights.data() + static_cast<std::size_t>(j) * down.taps;
    std::size_t offset = 0;
    for (; offset + kBlock <= out_row_bytes; offset += kBlock) {
      vertical_block<kBlock>(scratch.tap_rows.data(), weights, count, offset, out + offset);
    }
    for (; offset < out_row_bytes; ++offset) {
      vertical_block<1>(scratch.tap_rows.data(), weights, count, offset, out + offset);
    }
  }
}

// Writes the HWC pixels as the spec's tensor (dtype, layout) into `output`.
template <typename Element, typename Convert>
void write_tensor(const ViewSpec& spec, const std::uint8_t* pixels, std::span<std::byte> output,
                  Convert convert) {
  const std::size_t plane = static_cast<std::size_t>(spec.out_width()) * spec.out_height();
  std::byte* out = output.data();
  if (spec.layout == Layout::kHWC) {
    for (std::size_t i = 0; i < plane * 3; ++i) {
      const Element value = convert(static_cast<int>(i % 3), pixels[i]);
      std::memcpy(out + i * sizeof(Element), &value, sizeof(Element));
    }
    return;
  }
  for (int channel = 0; channel < 3; ++channel) {
    std::byte* channel_out = out + static_cast<std::size_t>(channel) * plane * sizeof(Element);
    for (std::size_t i = 0; i < plane; ++i) {
      const Element value = convert(channel, pixels[i * 3 + static_cast<std::size_t>(channel)]);
      std::memcpy(channel_out + i * sizeof(Element), &value, sizeof(Element));
    }
  }
}

void write_output(const ViewSpec& spec, const ValueTables& tables, const std::uint8_t* pixels,
                  std::span<std::byte> output) {
  switch (spec.dtype) {
    case DType::kUint8:
      write_tensor<std::uint8_t>(spec, pixels, output, [](int, std::uint8_t v) { return v; });
      break;
    case DType::kFloat16:
      write_tensor<std::uint16_t>(spec, pixels, output, [&](int channel, std::uint8_t v) {
        return tables.float16[channel][v];
      });
      break;
    case DType::kFloat32:
      write_tensor<float>(spec, pixels, output,
                          [&](int channel, std::uint8_t v) { return tables.float32[channel][v]; });
      break;
  }
}

// Plans keyed by what they depend on: the resize rule, the crop and the image size. Shared
// pointers let one thread use a plan while another evicts it.
class PlanCache {
 public:
  std::shared_ptr<const TransformPlan> get(const ViewSpec& spec, int width, int height) {
    const Key key{static_cast<int>(spec.resize.mode),
                  spec.resize.shorter_side,
                  spec.resize.width,
                  spec.resize.height,
                  spec.crop_width,
                  spec.crop_height,
                  width,
                  height};
    {
      std::lock_guard lock(mutex_);
      if (const auto found = plans_.find(key); found != plans_.end()) return found->second;
    }
    auto plan = std::make_shared<const TransformPlan>(plan_transform(spec, width, height));
    std::lock_guard lock(mutex_);
    if (plans_.emplace(key, plan).second) {
      order_.push_back(key);
      if (order_.size() > kCapacity) {
        plans_.erase(order_.front());
        order_.pop_front();
      }
    }
    return plan;
  }

 private:
  // ImageNet's images come in a few hundred sizes; most batches hit a handful of them.
  static constexpr std::size_t kCapacity = 512;
  using Key = std::tuple<int, int, int, int, int, int, int, int>;
  std::mutex mutex_;
  std::map<Key, std::shared_ptr<const TransformPlan>> plans_;
  std::deque<Key> order_;  // insertion order, oldest evicted first
};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  void transform(const ViewSpec& spec, std::span<const RgbImage* const> images,
                 std::span<const std::span<std::byte>> outputs) override {
    if (images.size() != outputs.size()) {
      throw std::invalid_argument(
          fmt::format("view transform: {} images but {} outputs", images.size(), outputs.size()));
    }
    const ValueTables tables = make_value_tables(spec);
    Scratch& scratch = thread_scratch();
    const ScratchTrim trim{scratch};
    for (std::size_t i = 0; i < images.size(); ++i) {
      const RgbImage& image = *images[i];
      if (outputs[i].size() != spec.tensor_bytes()) {
        throw std::invalid_argument(
            fmt::format("view transform: output {} holds {} bytes, the "
                        "spec's tensor needs {}",
                        i, outputs[i].size(), spec.tensor_bytes()));
      }
      if (image.width < 1 || image.height < 1 ||
          image.pixels.size() != static_cast<std::size_t>(image.width) * image.height * 3) {
        throw std::invalid_argument(
            fmt::format("view transform: image {} is {}x{} with {} bytes "
                        "of pixels",
                        i, image.width, image.height, image.pixels.size()));
      }
      const auto plan = plans_.get(spec, image.width, image.height);
      resample(*plan, image, scratch);
      write_output(spec, tables, scratch.pixels.data(), outputs[i]);
    }
  }

 private:
  PlanCache plans_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() {
  return std::make_unique<CpuBackend>();
}

}  // namespace dsfs::view
