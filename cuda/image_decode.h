#pragma once
// Decodes a source image (JPEG via libjpeg-turbo; PNG via libpng, whatever its file name says)
// to 8-bit RGB the way PIL's Image.open(...).convert('RGB') does: grayscale replicated, CMYK
// (Adobe inverted) converted with PIL's formula, alpha dropped.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <stdexcept>
#include <vector>

namespace dsfs::view {

struct RgbImage {
  int width = 0;
  int height = 0;
  std::vector<std::uint8_t> pixels;  // height * width * 3, row-major, RGB interleaved
};

// An image that cannot be decoded; what() says why (truncated, unsupported format, ...).
class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What an image's header says, known before any pixel memory is allocated.
struct ImageHeader {
  int width = 0;
  int height = 0;
  // Bytes the decoder needs besides the RGB result: CMYK samples of a CMYK JPEG, the DCT
  // coefficients of a progressive JPEG, libpng's output rows of a PNG (up to 8 bytes a pixel).
  std::uint64_t decode_scratch_bytes = 0;
  std::uint64_t pixels() const {
    return static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(height);
  }
  // The RGB result plus the decoder's scratch.
  std::uint64_t decode_bytes() const { return pixels() * 3 + decode_scratch_bytes; }
};

// The most pixels an image may have by default (8192 x 8192); `dsfs mount --view-max-pixels`.
inline constexpr std::uint64_t kDefaultMaxPixels = std::uint64_t{64} << 20;
// The ceiling of any limit: twice PIL's Image.MAX_IMAGE_PIXELS, where PIL raises
// DecompressionBombError.
inline constexpr std::uint64_t kMaxPixelsCeiling = 2ULL * (1024ULL * 1024 * 1024 / 4 / 3);

// Told the header before the decoder allocates anything the size of the image; may throw to
// refuse (the exception propagates out of decode_image).
using BeforeDecode = std::function<void(const ImageHeader&)>;

// Decodes `encoded`; an image of more than `max_pixels` pixels (by its header) is refused with a
// DecodeError before any pixel memory is allocated, so a small file claiming huge dimensions
// costs nothing. Safe to call from many threads at once.
RgbImage decode_image(std::span<const std::byte> encoded,
                      std::uint64_t max_pixels = kDefaultMaxPixels,
                      const BeforeDecode& before_decode = {});

}  // namespace dsfs::view
