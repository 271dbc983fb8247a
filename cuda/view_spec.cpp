#include "cuda/view_spec.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <system_error>

#include "src/store/log_text.h"

namespace dsfs::view {
namespace {

// Larger sides would make single .npy files of hundreds of megabytes; nobody trains on those.
constexpr int kMaxSide = 8192;

// torchvision's Normalize takes these as Python floats and turns them into float32 tensors.
constexpr std::array<double, 3> kImagenetMean{0.485, 0.456, 0.406};
constexpr std::array<double, 3> kImagenetStd{0.229, 0.224, 0.225};

std::array<float, 3> to_float32(const std::array<double, 3>& values) {
  return {static_cast<float>(values[0]), static_cast<float>(values[1]),
          static_cast<float>(values[2])};
}

[[noreturn]] void fail(std::string_view text, std::string_view reason) {
  throw SpecError(fmt::format("view spec \"{}\": {}", store::log_text(text), reason));
}

// A whole-string decimal integer; nullopt for anything else (sign, spaces, dots, overflow).
std::optional<long long> parse_integer(std::string_view digits) {
  if (digits.empty() || digits.front() == '+') return std::nullopt;
  long long value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// A whole-string finite decimal number ("0.485", "-1e-3"); nullopt for nan/inf or junk.
std::optional<double> parse_number(std::string_view digits) {
  if (digits.empty() || digits.front() == '+') return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value,
                                            std::chars_format::general);
  if (error != std::errc() || end != digits.data() + digits.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

struct Size {
  int width = 0;
  int height = 0;
  bool square = false;  // written as one number
};

// "N" (square) or "WxH", each side 1..kMaxSide.
Size parse_size(std::string_view text, std::string_view key, std::string_view value,
                std::string_view accepted) {
  auto side = [&](std::string_view digits) {
    const auto number = parse_integer(digits);
    if (!number) {
      fail(text, fmt::format("{}: \"{}\" is not a size; write {}", key, value, accepted));
    }
    if (*number < 1 || *number > kMaxSide) {
      fail(text, fmt::format("{}: {} is out of range; sizes are 1 to {}", key, *number, kMaxSide));
    }
    return static_cast<int>(*number);
  };
  const auto x = value.find('x');
  if (x == std::string_view::npos) {
    const int n = side(value);
    return {n, n, true};
  }
  return {side(value.substr(0, x)), side(value.substr(x + 1)), false};
}

DType parse_dtype(std::string_view text, std::string_view value) {
  if (value == "uint8") return DType::kUint8;
  if (value == "float16") return DType::kFloat16;
  if (value == "float32") return DType::kFloat32;
  fail(text, fmt::format("dtype: \"{}\" is not a dtype; write dtype=uint8, dtype=float16 or "
                         "dtype=float32 (default float32)",
                         value));
}

Layout parse_layout(std::string_view text, std::string_view value) {
  if (value == "chw") return Layout::kCHW;
  if (value == "hwc") return Layout::kHWC;
  fail(text,
       fmt::format("layout: \"{}\" is not a layout; write layout=chw or layout=hwc (default chw)",
                   value));
}

constexpr std::string_view kNormAccepted =
    "write norm=imagenet, norm=none (default) or norm=MR:MG:MB:SR:SG:SB (mean then std, six "
    "numbers, std > 0)";

// Sets spec.normalize/mean/std from "imagenet", "none" or six ':'-separated numbers.
void parse_norm(std::string_view text, std::string_view value, ViewSpec& spec) {
  if (value == "none") {
    spec.normalize = false;
    return;
  }
  if (value == "imagenet") {
    spec.normalize = true;
    spec.mean = to_float32(kImagenetMean);
    spec.std = to_float32(kImagenetStd);
    return;
  }
  std::array<double, 6> numbers{};
  std::size_t count = 0;
  std::string_view rest = value;
  while (true) {
    const auto colon = rest.find(':');
    const std::string_view item = rest.substr(0, colon);
    const auto number = parse_number(item);
    if (!number) {
      fail(text, fmt::format("norm: \"{}\" is not a finite number; {}", item, kNormAccepted));
    }
    if (count == numbers.size()) {
      fail(text, fmt::format("norm: more than six numbers in \"{}\"; {}", value, kNormAccepted));
    }
    numbers[count++] = *number;
    if (colon == std::string_view::npos) break;
    rest = rest.substr(colon + 1);
  }
  if (count != numbers.size()) {
    fail(text,
         fmt::format("norm: \"{}\" has {} number(s), not six; {}", value, count, kNormAccepted));
  }
  for (std::size_t channel = 0; channel < 3; ++channel) {
    spec.mean[channel] = static_cast<float>(numbers[channel]);
    spec.std[channel] = static_cast<float>(numbers[3 + channel]);
    if (!(spec.std[channel] > 0.0F) || !std::isfinite(spec.std[channel])) {
      fail(text, fmt::format("norm: std {} must be greater than 0 (and representable as float32)",
                             numbers[3 + channel]));
    }
    if (!std::isfinite(spec.mean[channel])) {
      fail(text, fmt::format("norm: mean {} does not fit a float32", numbers[channel]));
    }
  }
  // (x - 0) / 1 is x exactly in float32, so this spelling is the same view as norm=none.
  const bool identity = spec.mean == std::array<float, 3>{0.0F, 0.0F, 0.0F} &&
                        spec.std == std::array<float, 3>{1.0F, 1.0F, 1.0F};
  spec.normalize = !identity;
  if (identity) spec.mean = {0.0F, 0.0F, 0.0F};  // also folds -0 into 0
}

// The shortest text that parse_norm turns back into exactly `value` (it parses a double and
// rounds that to float32, which the float's own shortest form does not always survive).
std::string format_float(float value) {
  std::string shortest = fmt::format("{}", value);
  const auto reparsed = parse_number(shortest);
  if (reparsed && static_cast<float>(*reparsed) == value) return shortest;
  return fmt::format("{}", static_cast<double>(value));
}

std::string format_size(int width, int height) {
  return width == height ? fmt::format("{}", width) : fmt::format("{}x{}", width, height);
}

ViewSpec parse_items(std::string_view text) {
  if (text.empty()) {
    fail(text, "empty; write a preset name (imagenet-eval) or key=value items joined by commas");
  }
  if (const auto bad = std::find_if(text.begin(), text.end(),
                                    [](char c) {
                                      const auto u = static_cast<unsigned char>(c);
                                      return u <= ' ' || u >= 0x7F || c == '/';
                                    });
      bad != text.end()) {
    fail(text, fmt::format("character {:#04x} at offset {} is not allowed (no spaces, slashes or "
                           "control characters)",
                           static_cast<unsigned char>(*bad), bad - text.begin()));
  }
  ViewSpec spec;
  bool seen_resize = false, seen_crop = false, seen_dtype = false, seen_layout = false,
       seen_norm = false;
  std::string_view rest = text;
  while (true) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto equals = item.find('=');
    if (item.empty()) {
      fail(text, "an empty item (leading, trailing or doubled comma)");
    }
    if (equals == std::string_view::npos) {
      fail(text, fmt::format("\"{}\" is not key=value nor a preset name; keys are resize, crop, "
                             "dtype, layout, norm",
                             item));
    }
    const std::string_view key = item.substr(0, equals);
    const std::string_view value = item.substr(equals + 1);
    auto once = [&](bool& seen) {
      if (seen) fail(text, fmt::format("{}: given more than once", key));
      seen = true;
      if (value.empty()) fail(text, fmt::format("{}: empty value", key));
    };
    if (key == "resize") {
      once(seen_resize);
      const Size size = parse_size(text, key, value, "resize=N (shorter side) or resize=WxH");
      if (size.square) {
        spec.resize = {ResizeRule::Mode::kShorterSide, size.width, 0, 0};
      } else {
        spec.resize = {ResizeRule::Mode::kExact, 0, size.width, size.height};
      }
    } else if (key == "crop") {
      once(seen_crop);
      const Size size = parse_size(text, key, value, "crop=N or crop=WxH (center crop)");
      spec.crop_width = size.width;
      spec.crop_height = size.height;
    } else if (key == "dtype") {
      once(seen_dtype);
      spec.dtype = parse_dtype(text, value);
    } else if (key == "layout") {
      once(seen_layout);
      spec.layout = parse_layout(text, value);
    } else if (key == "norm") {
      once(seen_norm);
      parse_norm(text, value, spec);
    } else {
      fail(text,
           fmt::format("unknown key \"{}\"; keys are resize, crop, dtype, layout, norm", key));
    }
    if (comma == std::string_view::npos) break;
    rest = rest.substr(comma + 1);
  }
  if (spec.crop_width == 0 && spec.resize.mode != ResizeRule::Mode::kExact) {
    fail(text,
         "the tensor shape must follow from the spec: add crop=N (or crop=WxH), or resize=WxH");
  }
  if (spec.dtype == DType::kUint8 && spec.normalize) {
    fail(text,
         "norm: dtype=uint8 holds raw pixel values 0..255 and cannot be normalized; use "
         "norm=none or a float dtype");
  }
  return spec;
}

}  // namespace

int ViewSpec::out_width() const {
  return crop_width != 0 ? crop_width : resize.width;
}

int ViewSpec::out_height() const {
  return crop_height != 0 ? crop_height : resize.height;
}

std::uint64_t ViewSpec::tensor_bytes() const {
  const std::uint64_t element = dtype == DType::kUint8 ? 1 : dtype == DType::kFloat16 ? 2 : 4;
  return 3 * static_cast<std::uint64_t>(out_height()) * static_cast<std::uint64_t>(out_width()) *
         element;
}

std::string ViewSpec::canonical() const {
  std::string text;
  switch (resize.mode) {
    case ResizeRule::Mode::kNone:
      break;
    case ResizeRule::Mode::kShorterSide:
      text += fmt::format("resize={},", resize.shorter_side);
      break;
    case ResizeRule::Mode::kExact:
      // Always WxH: a single number would mean the shorter side.
      text += fmt::format("resize={}x{},", resize.width, resize.height);
      break;
  }
  if (crop_width != 0) text += fmt::format("crop={},", format_size(crop_width, crop_height));
  text += dtype == DType::kUint8     ? "dtype=uint8"
          : dtype == DType::kFloat16 ? "dtype=float16"
                                     : "dtype=float32";
  text += layout == Layout::kCHW ? ",layout=chw" : ",layout=hwc";
  if (!normalize) {
    text += ",norm=none";
  } else if (mean == to_float32(kImagenetMean) && std == to_float32(kImagenetStd)) {
    text += ",norm=imagenet";
  } else {
    text += fmt::format(",norm={}:{}:{}:{}:{}:{}", format_float(mean[0]), format_float(mean[1]),
                        format_float(mean[2]), format_float(std[0]), format_float(std[1]),
                        format_float(std[2]));
  }
  return text;
}

const std::vector<std::pair<std::string, std::string>>& view_presets() {
  static const std::vector<std::pair<std::string, std::string>> presets{
      // torchvision's ImageNet eval transform: Resize(256), CenterCrop(224), ToTensor, Normalize.
      {"imagenet-eval", "resize=256,crop=224,dtype=float32,layout=chw,norm=imagenet"},
      {"imagenet-eval-fp16", "resize=256,crop=224,dtype=float16,layout=chw,norm=imagenet"},
      // The resized, cropped pixels themselves, as DALI and most GPU loaders take them.
      {"imagenet-eval-uint8", "resize=256,crop=224,dtype=uint8,layout=hwc,norm=none"},
  };
  return presets;
}

ViewSpec parse_view_spec(std::string_view text) {
  for (const auto& [name, spec_text] : view_presets()) {
    if (text == name) return parse_items(spec_text);
  }
  return parse_items(text);
}

}  // namespace dsfs::view
