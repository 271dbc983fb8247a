#pragma once
// A view SPEC: the comma list (or preset name) that names a directory under MOUNT/.views and
// fixes the tensor every image becomes there. The tensor's shape follows from the SPEC alone,
// so a .npy file's size is known before anything is decoded.
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dsfs::view {

enum class DType : std::uint8_t { kUint8, kFloat16, kFloat32 };
enum class Layout : std::uint8_t { kCHW, kHWC };

struct ResizeRule {
  enum class Mode : std::uint8_t { kNone, kShorterSide, kExact };
  Mode mode = Mode::kNone;
  int shorter_side = 0;  // kShorterSide: torchvision Resize(int)
  int width = 0;         // kExact: torchvision Resize((height, width))
  int height = 0;
  bool operator==(const ResizeRule&) const = default;
};

struct ViewSpec {
  ResizeRule resize;
  int crop_width = 0;  // center crop; 0 = none (then resize must be kExact)
  int crop_height = 0;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kCHW;
  // Applied to value/255 as (x - mean) / std; only with a float dtype. Identity = no norm.
  bool normalize = false;
  std::array<float, 3> mean{0.0F, 0.0F, 0.0F};
  std::array<float, 3> std{1.0F, 1.0F, 1.0F};

  int out_width() const;               // tensor width (crop, else exact resize width)
  int out_height() const;              // tensor height
  std::uint64_t tensor_bytes() const;  // 3 * out_height * out_width * sizeof(dtype)
  // Normalized text (fixed key order, defaults spelled out): two spellings of one view share it.
  std::string canonical() const;
  bool operator==(const ViewSpec&) const = default;
};

// Thrown for a SPEC that cannot be served; what() names the offending key and what to write.
class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Parses "resize=256,crop=224,dtype=float16,layout=chw,norm=imagenet" or a preset name.
ViewSpec parse_view_spec(std::string_view text);

// (name, spec text) of the named presets, listed by `ls MOUNT/.views`; at least imagenet-eval.
const std::vector<std::pair<std::string, std::string>>& view_presets();

}  // namespace dsfs::view
