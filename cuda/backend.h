#pragma once
// The one interface both preprocessing backends implement: decoded RGB images in, the SPEC's
// tensors out (resize, crop, ToTensor, normalize, cast, layout). Decoding stays on CPU threads.
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "cuda/image_decode.h"
#include "cuda/view_spec.h"

namespace dsfs::view {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;  // "cpu" or "cuda"
  // Writes the tensor of images[i] (spec.tensor_bytes() bytes, no .npy header) to outputs[i].
  // Safe to call from several threads at once.
  virtual void transform(const ViewSpec& spec, std::span<const RgbImage* const> images,
                         std::span<const std::span<std::byte>> outputs) = 0;
};

enum class BackendKind { kAuto, kCuda, kCpu };

// "auto" | "cuda" | "cpu"; throws std::invalid_argument naming the accepted values.
BackendKind parse_backend_kind(std::string_view text);

// kAuto: CUDA when built with it and a device is usable, else the CPU backend (logging why).
// kCuda: throws std::runtime_error saying why when CUDA is not built in or no device is usable.
std::unique_ptr<Backend> make_backend(BackendKind kind);

std::unique_ptr<Backend> make_cpu_backend();

}  // namespace dsfs::view
