#include "cuda/image_decode.h"

#include <fmt/format.h>
#include <png.h>
#include <spdlog/spdlog.h>
#include <turbojpeg.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string_view>

namespace dsfs::view {
namespace {

// What decode_image was asked to respect, for the decoders below.
struct DecodeLimits {
  std::uint64_t max_pixels = kDefaultMaxPixels;
  const BeforeDecode* before_decode = nullptr;
};

// Refuses an image by its header alone: a 79-byte PNG may claim 13000x13000 pixels.
void check_pixel_count(std::string_view format, std::uint64_t width, std::uint64_t height,
                       const DecodeLimits& limits) {
  if (width == 0 || height == 0) {
    throw DecodeError(fmt::format("{} header says {}x{} pixels", format, width, height));
  }
  const std::uint64_t max_pixels = std::min(limits.max_pixels, kMaxPixelsCeiling);
  if (width * height > max_pixels) {
    throw DecodeError(fmt::format(
        "{} header says {}x{} pixels ({}), more than the {} pixels a view decodes "
        "(--view-max-pixels); refused before decoding. Remount with a larger --view-max-pixels "
        "to read it",
        format, width, height, width * height, max_pixels));
  }
}

void before_allocating(const DecodeLimits& limits, const ImageHeader& header) {
  if (limits.before_decode && *limits.before_decode) (*limits.before_decode)(header);
}

// ---- JPEG (libjpeg-turbo, the library Pillow itself decodes with) ----

struct TurboJpegDeleter {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TurboJpegHandle = std::unique_ptr<void, TurboJpegDeleter>;

// One decompressor per thread: creating one costs more than decoding a small thumbnail.
TurboJpegHandle& thread_decompressor_slot() {
  thread_local TurboJpegHandle handle;
  return handle;
}

tjhandle thread_decompressor() {
  TurboJpegHandle& handle = thread_decompressor_slot();
  if (!handle) handle.reset(tjInitDecompress());
  if (!handle)
    throw DecodeError(fmt::format("cannot create a JPEG decoder: {}", tjGetErrorStr2(nullptr)));
  return handle.get();
}

// PIL's Convert.c cmyk2rgb on data PIL has read as "CMYK;I" (Adobe inverted), so the values
// here are the raw decoder output and PIL's inversion is folded in.
void adobe_cmyk_to_rgb(const std::uint8_t* cmyk, std::uint8_t* rgb, std::size_t pixels) {
  auto muldiv255 = [](int a, int b) {
    const int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (std::size_t i = 0; i < pixels; ++i, cmyk += 4, rgb += 3) {
    const int nk = cmyk[3];  // 255 - (255 - raw k)
    for (int channel = 0; channel < 3; ++channel) {
      const int value = nk - muldiv255(255 - cmyk[channel], nk);
      rgb[channel] = static_cast<std::uint8_t>(std::clamp(value, 0, 255));
    }
  }
}

// Whether the frame header before the first scan is progressive (SOF2, SOF6, SOF10): libjpeg
// then keeps every DCT coefficient of the image (2 bytes per sample) until the last scan.
bool jpeg_is_progressive(std::span<const std::byte> encoded) {
  const auto at = [&](std::size_t i) { return std::to_integer<unsigned>(encoded[i]); };
  std::size_t i = 2;  // after SOI
  while (i + 4 <= encoded.size()) {
    if (at(i) != 0xFF) return false;  // not a marker where one must be: the decoder will say
    const unsigned marker = at(i + 1);
    if (marker == 0xFF) {  // fill byte
      ++i;
      continue;
    }
    if (marker == 0xC2 || marker == 0xC6 || marker == 0xCA) return true;
    if (marker == 0xDA || marker == 0xD9) return false;  // the first scan, or the end
    i += 2 + (at(i + 2) << 8 | at(i + 3));
  }
  return false;
}

RgbImage decode_jpeg_with(tjhandle decompressor, std::span<const std::byte> encoded,
                          const DecodeLimits& limits) {
  const auto* data = reinterpret_cast<const unsigned char*>(encoded.data());
  const auto size = static_cast<unsigned long>(encoded.size());
  int width = 0, height = 0, subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(decompressor, data, size, &width, &height, &subsampling, &colorspace) !=
      0) {
    throw DecodeError(fmt::format("JPEG header: {}", tjGetErrorStr2(decompressor)));
  }
  check_pixel_count("JPEG", static_cast<std::uint64_t>(width), static_cast<std::uint64_t>(height),
                    limits);

  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int pixel_format = cmyk ? TJPF_CMYK : TJPF_RGB;  // grayscale comes out replicated
  const int pixel_bytes = cmyk ? 4 : 3;
  const std::size_t pixels = static_cast<std::size_t>(width) * static_cast<std::size_t>(height);
  // The CMYK samples before conversion, and a progressive file's coefficients (2 bytes for each
  // sample of each component, at most; fewer when the chroma is subsampled).
  const std::uint64_t coefficients =
      jpeg_is_progressive(encoded) ? std::uint64_t{pixels} * 2 * (cmyk ? 4 : 3) : 0;
  before_allocating(limits, ImageHeader{.width = width,
                                        .height = height,
                                        .decode_scratch_bytes =
                                            (cmyk ? std::uint64_t{pixels} * 4 : 0) + coefficients});

  RgbImage image;
  image.width = width;
  image.height = height;
  image.pixels.resize(pixels * 3);
  std::vector<std::uint8_t> cmyk_pixels(cmyk ? pixels * 4 : 0);
  unsigned char* target = cmyk ? cmyk_pixels.data() : image.pixels.data();

  // Accurate (islow) IDCT and fancy upsampling: libjpeg's defaults, which Pillow keeps.
  const int flags = TJFLAG_ACCURATEDCT | TJFLAG_LIMITSCANS;
  if (tjDecompress2(decompressor, data, size, target, width, width * pixel_bytes, height,
                    pixel_format, flags) != 0) {
    const std::string message = tjGetErrorStr2(decompressor);
    // libjpeg reports a file that ends early as a warning and pads it with grey; PIL raises
    // "image file is truncated" there, and decodes through the other warnings.
    if (tjGetErrorCode(decompressor) != TJERR_WARNING ||
        message.find("Premature end of JPEG file") != std::string::npos) {
      throw DecodeError(fmt::format("JPEG data: {}", message));
    }
    spdlog::debug("JPEG decoded with a warning: {}", message);
  }
  if (cmyk) adobe_cmyk_to_rgb(cmyk_pixels.data(), image.pixels.data(), pixels);
  return image;
}

RgbImage decode_jpeg(std::span<const std::byte> encoded, const DecodeLimits& limits) {
  try {
    return decode_jpeg_with(thread_decompressor(), encoded, limits);
  } catch (...) {
    // The handle may be stuck mid-stream (libjpeg-turbo 2.1 does not reset it when a header read
    // fails) and the next image would read as 0x0 pixels: the next one starts afresh.
    thread_decompressor_slot().reset();
    throw;
  }
}

// ---- PNG (libpng) ----

// State libpng's C callbacks reach through their user pointers.
struct PngSource {
  const std::uint8_t* data = nullptr;
  std::size_t size = 0;
  std::size_t offset = 0;
  char error[256] = {};
};

void png_read_from_memory(png_structp png, png_bytep out, png_size_t length) {
  auto* source = static_cast<PngSource*>(png_get_io_ptr(png));
  if (length > source->size - source->offset) png_error(png, "truncated: the data ends early");
  std::memcpy(out, source->data + source->offset, length);
  source->offset += length;
}

[[noreturn]] void png_error_to_source(png_structp png, png_const_charp message) {
  auto* source = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(source->error, sizeof source->error, "%s", message);
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp message) {
  spdlog::debug("PNG warning: {}", message);
}

struct PngReadStructs {
  png_structp png = nullptr;
  png_infop info = nullptr;
  explicit PngReadStructs(PngSource& source) {
    png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &source, png_error_to_source,
                                 png_ignore_warning);
    if (!png) return;
    info = png_create_info_struct(png);
    png_set_read_fn(png, &source, png_read_from_memory);
  }
  ~PngReadStructs() { png_destroy_read_struct(&png, info ? &info : nullptr, nullptr); }
  PngReadStructs(const PngReadStructs&) = delete;
  PngReadStructs& operator=(const PngReadStructs&) = delete;
};

struct PngLayout {
  png_uint_32 width = 0;
  png_uint_32 height = 0;
  int channels = 0;   // after the transforms: 1 gray, 2 gray+alpha, 3 RGB, 4 RGBA
  int bit_depth = 0;  // 8 or 16
  bool gray16_without_alpha = false;
};

// libpng reports errors by longjmp to the setjmp below, so these two functions hold nothing
// that needs destroying: the jump must not skip a destructor.
bool read_png_layout(png_structp png, png_infop info, PngLayout& layout) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, info);
  const int color_type = png_get_color_type(png, info);
  // Palette to RGB (PIL's "P" -> "RGB"), 1/2/4-bit grey scaled to 8 bits like PIL's L;2/L;4
  // unpackers; no gamma, no tRNS expansion (PIL ignores both when converting to RGB).
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (color_type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(png, info) < 8) {
    png_set_expand_gray_1_2_4_to_8(png);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  layout.width = png_get_image_width(png, info);
  layout.height = png_get_image_height(png, info);
  layout.channels = png_get_channels(png, info);
  layout.bit_depth = png_get_bit_depth(png, info);
  layout.gray16_without_alpha = color_type == PNG_COLOR_TYPE_GRAY && layout.bit_depth == 16;
  return true;
}

bool read_png_rows(png_structp png, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;
}

// One row of libpng output to RGB the way PIL's PNG modes convert: 16-bit samples keep their
// high byte (RGB;16B, LA;16B, RGBA;16B), except 16-bit grey without alpha, which PIL opens as
// mode "I" and clips to 0..255 when converting.
void png_row_to_rgb(const std::uint8_t* row, std::uint8_t* rgb, const PngLayout& layout) {
  const int sample_bytes = layout.bit_depth / 8;
  const int pixel_bytes = layout.channels * sample_bytes;
  const bool gray = layout.channels <= 2;
  for (png_uint_32 x = 0; x < layout.width; ++x, row += pixel_bytes, rgb += 3) {
    for (int channel = 0; channel < 3; ++channel) {
      const std::uint8_t* sample = row + (gray ? 0 : channel * sample_bytes);
      if (sample_bytes == 1) {
        rgb[channel] = sample[0];
      } else if (layout.gray16_without_alpha) {
        rgb[channel] = static_cast<std::uint8_t>(std::min(sample[0] << 8 | sample[1], 255));
      } else {
        rgb[channel] = sample[0];
      }
    }
  }
}

RgbImage decode_png(std::span<const std::byte> encoded, const DecodeLimits& limits) {
  PngSource source;
  source.data = reinterpret_cast<const std::uint8_t*>(encoded.data());
  source.size = encoded.size();
  PngReadStructs structs(source);
  if (!structs.png || !structs.info)
    throw DecodeError("cannot create a PNG decoder (out of memory)");

  PngLayout layout;
  if (!read_png_layout(structs.png, structs.info, layout)) {
    throw DecodeError(fmt::format("PNG header: {}", source.error));
  }
  check_pixel_count("PNG", layout.width, layout.height, limits);
  if ((layout.bit_depth != 8 && layout.bit_depth != 16) || layout.channels < 1 ||
      layout.channels > 4) {
    throw DecodeError(fmt::format("PNG with {} channel(s) of {} bits is not supported",
                                  layout.channels, layout.bit_depth));
  }

  const std::size_t row_bytes = png_get_rowbytes(structs.png, structs.info);
  before_allocating(limits, ImageHeader{.width = static_cast<int>(layout.width),
                                        .height = static_cast<int>(layout.height),
                                        .decode_scratch_bytes = row_bytes * layout.height});
  std::vector<std::uint8_t> decoded(row_bytes * layout.height);
  std::vector<png_bytep> rows(layout.height);
  for (png_uint_32 y = 0; y < layout.height; ++y) rows[y] = decoded.data() + y * row_bytes;
  if (!read_png_rows(structs.png, rows.data())) {
    throw DecodeError(fmt::format("PNG data: {}", source.error));
  }

  RgbImage image;
  image.width = static_cast<int>(layout.width);
  image.height = static_cast<int>(layout.height);
  image.pixels.resize(static_cast<std::size_t>(layout.width) * layout.height * 3);
  for (png_uint_32 y = 0; y < layout.height; ++y) {
    png_row_to_rgb(rows[y], image.pixels.data() + static_cast<std::size_t>(y) * layout.width * 3,
                   layout);
  }
  return image;
}

bool starts_with(std::span<const std::byte> data, std::initializer_list<std::uint8_t> prefix) {
  if (data.size() < prefix.size()) return false;
  return std::equal(prefix.begin(), prefix.end(), data.begin(), [](std::uint8_t a, std::byte b) {
    return a == std::to_integer<std::uint8_t>(b);
  });
}

}  // namespace

RgbImage decode_image(std::span<const std::byte> encoded, std::uint64_t max_pixels,
                      const BeforeDecode& before_decode) {
  if (encoded.empty()) throw DecodeError("empty file");
  const DecodeLimits limits{.max_pixels = max_pixels, .before_decode = &before_decode};
  // Pick by content, not by name: ImageNet has a PNG called .JPEG.
  if (starts_with(encoded, {0xFF, 0xD8, 0xFF})) return decode_jpeg(encoded, limits);
  if (starts_with(encoded, {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A})) {
    return decode_png(encoded, limits);
  }
  std::string first;
  for (std::size_t i = 0; i < std::min<std::size_t>(encoded.size(), 8); ++i) {
    first += fmt::format("{:02x}", std::to_integer<unsigned>(encoded[i]));
  }
  throw DecodeError(
      fmt::format("neither JPEG nor PNG (the file starts with bytes {}, {} bytes long)", first,
                  encoded.size()));
}

}  // namespace dsfs::view
