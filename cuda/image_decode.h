#pragma once
// Decodes a source image (JPEG via libjpeg-turbo; PNG via libpng, whatever its file name says)
// to 8-bit RGB the way PIL's Image.open(...).convert('RGB') does: grayscale replicated, CMYK
// (Adobe inverted) converted with PIL's formula, alpha dropped.
#include <cstddef>
#include <cstdint>
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

RgbImage decode_image(std::span<const std::byte> encoded);

}  // namespace dsfs::view
