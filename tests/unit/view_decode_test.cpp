#include "cuda/image_decode.h"

#include <gtest/gtest.h>
#include <png.h>
#include <turbojpeg.h>

#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace dsfs::view {
namespace {

std::vector<std::byte> to_bytes(const void* data, std::size_t size) {
  std::vector<std::byte> bytes(size);
  if (size != 0) std::memcpy(bytes.data(), data, size);
  return bytes;
}

// A smooth test picture: JPEG keeps it within a few levels at quality 100.
std::vector<std::uint8_t> gradient(int width, int height, int channels) {
  std::vector<std::uint8_t> pixels(static_cast<std::size_t>(width) * height * channels);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      for (int c = 0; c < channels; ++c) {
        pixels[(static_cast<std::size_t>(y) * width + x) * channels + c] =
            static_cast<std::uint8_t>((x * 255 / width + y * 64 / height + c * 40) % 256);
      }
    }
  }
  return pixels;
}

std::vector<std::byte> encode_jpeg(const std::vector<std::uint8_t>& pixels, int width, int height,
                                   int pixel_format, int subsampling, int quality = 100) {
  tjhandle compressor = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long jpeg_size = 0;
  const int status = tjCompress2(compressor, pixels.data(), width, 0, height, pixel_format, &jpeg,
                                 &jpeg_size, subsampling, quality, TJFLAG_ACCURATEDCT);
  EXPECT_EQ(status, 0) << tjGetErrorStr2(compressor);
  std::vector<std::byte> bytes = to_bytes(jpeg, jpeg_size);
  tjFree(jpeg);
  tjDestroy(compressor);
  return bytes;
}

// ---- a PNG writer (libpng's classic API) for every color type and depth ----

struct PngPicture {
  int width = 0;
  int height = 0;
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  bool interlaced = false;
  std::vector<png_color> palette;
  std::vector<png_byte> transparency;  // palette alpha entries (tRNS)
  std::vector<std::uint8_t> rows;      // packed PNG rows, big-endian 16-bit samples
};

PngPicture png_picture(int width, int height, int color_type = PNG_COLOR_TYPE_RGB,
                       int bit_depth = 8, bool interlaced = false) {
  PngPicture picture;
  picture.width = width;
  picture.height = height;
  picture.color_type = color_type;
  picture.bit_depth = bit_depth;
  picture.interlaced = interlaced;
  return picture;
}

void append_to_vector(png_structp png, png_bytep data, png_size_t length) {
  auto* out = static_cast<std::vector<std::byte>*>(png_get_io_ptr(png));
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  out->insert(out->end(), bytes, bytes + length);
}

std::size_t png_row_bytes(const PngPicture& picture) {
  const int channels = picture.color_type == PNG_COLOR_TYPE_RGB          ? 3
                       : picture.color_type == PNG_COLOR_TYPE_RGB_ALPHA  ? 4
                       : picture.color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                                                                         : 1;
  return (static_cast<std::size_t>(picture.width) * channels * picture.bit_depth + 7) / 8;
}

// Nothing to destroy in this frame: libpng longjmps here on error.
bool write_png(png_structp png, png_infop info, const PngPicture& picture, png_bytepp rows) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_IHDR(png, info, static_cast<png_uint_32>(picture.width),
               static_cast<png_uint_32>(picture.height), picture.bit_depth, picture.color_type,
               picture.interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!picture.palette.empty()) {
    png_set_PLTE(png, info, picture.palette.data(), static_cast<int>(picture.palette.size()));
  }
  if (!picture.transparency.empty()) {
    png_set_tRNS(png, info, picture.transparency.data(),
                 static_cast<int>(picture.transparency.size()), nullptr);
  }
  png_write_info(png, info);
  png_write_image(png, rows);
  png_write_end(png, nullptr);
  return true;
}

std::vector<std::byte> encode_png(const PngPicture& picture) {
  std::vector<std::byte> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(png, &out, append_to_vector, nullptr);
  const std::size_t row_bytes = png_row_bytes(picture);
  EXPECT_EQ(picture.rows.size(), row_bytes * picture.height);
  std::vector<png_bytep> rows(static_cast<std::size_t>(picture.height));
  auto* base = const_cast<std::uint8_t*>(picture.rows.data());
  for (int y = 0; y < picture.height; ++y) rows[y] = base + y * row_bytes;
  EXPECT_TRUE(write_png(png, info, picture, rows.data()));
  png_destroy_write_struct(&png, &info);
  return out;
}

// PNG's CRC-32 (ISO 3309), bit by bit: tests patch a chunk and fix its checksum.
std::uint32_t png_crc(const std::byte* data, std::size_t size) {
  std::uint32_t crc = 0xFFFFFFFFU;
  for (std::size_t i = 0; i < size; ++i) {
    crc ^= std::to_integer<std::uint32_t>(data[i]);
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320U & (0U - (crc & 1U)));
  }
  return crc ^ 0xFFFFFFFFU;
}

std::array<int, 3> pixel(const RgbImage& image, int x, int y) {
  const std::uint8_t* p = image.pixels.data() + (static_cast<std::size_t>(y) * image.width + x) * 3;
  return {p[0], p[1], p[2]};
}

// ---- JPEG ----

TEST(DecodeJpeg, RgbComesBackCloseToTheSource) {
  const int width = 37, height = 23;  // not multiples of the 8x8 blocks
  const auto source = gradient(width, height, 3);
  const RgbImage image = decode_image(encode_jpeg(source, width, height, TJPF_RGB, TJSAMP_444));
  ASSERT_EQ(image.width, width);
  ASSERT_EQ(image.height, height);
  ASSERT_EQ(image.pixels.size(), source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    ASSERT_LE(std::abs(image.pixels[i] - source[i]), 6) << "byte " << i;
  }
}

TEST(DecodeJpeg, SubsampledRgbDecodes) {
  const auto source = gradient(64, 48, 3);
  const RgbImage image =
      decode_image(encode_jpeg(source, 64, 48, TJPF_RGB, TJSAMP_420, /*quality=*/75));
  EXPECT_EQ(image.width, 64);
  EXPECT_EQ(image.height, 48);
  EXPECT_EQ(image.pixels.size(), 64U * 48 * 3);
}

TEST(DecodeJpeg, GrayscaleIsReplicatedToRgb) {
  const int width = 20, height = 10;
  const auto source = gradient(width, height, 1);
  const RgbImage image = decode_image(encode_jpeg(source, width, height, TJPF_GRAY, TJSAMP_GRAY));
  ASSERT_EQ(image.width, width);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const auto [r, g, b] = pixel(image, x, y);
      ASSERT_EQ(r, g);
      ASSERT_EQ(g, b);
      ASSERT_LE(std::abs(r - source[static_cast<std::size_t>(y) * width + x]), 4);
    }
  }
}

TEST(DecodeJpeg, CmykConvertsLikePil) {
  // What PIL writes for Image.new('CMYK', size, (10, 200, 30, 40)): Adobe-inverted samples.
  // PIL 9.4 reads that back and converts it to RGB (207, 46, 190) (measured).
  const int width = 16, height = 16;
  std::vector<std::uint8_t> cmyk;
  for (int i = 0; i < width * height; ++i) cmyk.insert(cmyk.end(), {245, 55, 225, 215});
  const RgbImage image = decode_image(encode_jpeg(cmyk, width, height, TJPF_CMYK, TJSAMP_444));
  ASSERT_EQ(image.width, width);
  ASSERT_EQ(image.height, height);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const auto [r, g, b] = pixel(image, x, y);
      EXPECT_NEAR(r, 207, 1);
      EXPECT_NEAR(g, 46, 1);
      EXPECT_NEAR(b, 190, 1);
    }
  }
}

TEST(DecodeJpeg, CmykFullInkIsBlackAndNoInkIsWhite) {
  std::vector<std::uint8_t> cmyk;
  for (int i = 0; i < 64; ++i) cmyk.insert(cmyk.end(), {255, 255, 255, 255});  // no ink
  for (int i = 0; i < 64; ++i) cmyk.insert(cmyk.end(), {255, 255, 255, 0});    // full black
  const RgbImage image = decode_image(encode_jpeg(cmyk, 8, 16, TJPF_CMYK, TJSAMP_444));
  EXPECT_EQ(pixel(image, 3, 2), (std::array<int, 3>{255, 255, 255}));
  EXPECT_EQ(pixel(image, 3, 13), (std::array<int, 3>{0, 0, 0}));
}

TEST(DecodeJpeg, TruncatedIsAnError) {
  const auto jpeg = encode_jpeg(gradient(64, 64, 3), 64, 64, TJPF_RGB, TJSAMP_420, 90);
  for (const std::size_t keep :
       {jpeg.size() * 2 / 3, jpeg.size() / 3, std::size_t{200}, std::size_t{20}, std::size_t{3}}) {
    SCOPED_TRACE(keep);
    const std::vector<std::byte> cut(jpeg.begin(), jpeg.begin() + static_cast<long>(keep));
    EXPECT_THROW(decode_image(cut), DecodeError);
  }
}

// The decoder is reused per thread: a file that failed part-way must not spoil the next one
// (libjpeg-turbo 2.1 leaves a handle whose header read failed mid-way; the next header then
// read 0x0 pixels, and a good image was EIO for good).
TEST(DecodeJpeg, AGoodImageDecodesAfterAFailedOneOnTheSameThread) {
  const auto source = gradient(48, 32, 3);
  const auto jpeg = encode_jpeg(source, 48, 32, TJPF_RGB, TJSAMP_420, 90);
  for (const std::size_t keep : {std::size_t{200}, jpeg.size() / 3, jpeg.size() * 2 / 3}) {
    SCOPED_TRACE(keep);
    const std::vector<std::byte> cut(jpeg.begin(), jpeg.begin() + static_cast<long>(keep));
    EXPECT_THROW(decode_image(cut), DecodeError);
    RgbImage image;
    ASSERT_NO_THROW(image = decode_image(jpeg));
    EXPECT_EQ(image.width, 48);
    EXPECT_EQ(image.height, 32);
  }
}

TEST(DecodeJpeg, GarbageAfterTheMagicIsAnError) {
  std::vector<std::byte> bytes = to_bytes("\xFF\xD8\xFF", 3);
  for (int i = 0; i < 500; ++i) bytes.push_back(static_cast<std::byte>((i * 7919) & 0xFF));
  EXPECT_THROW(decode_image(bytes), DecodeError);
}

// ---- PNG ----

TEST(DecodePng, Rgb8IsExact) {
  PngPicture picture = png_picture(5, 3);
  picture.rows = gradient(5, 3, 3);
  const RgbImage image = decode_image(encode_png(picture));
  ASSERT_EQ(image.width, 5);
  ASSERT_EQ(image.height, 3);
  EXPECT_EQ(image.pixels, picture.rows);
}

TEST(DecodePng, InterlacedRgb8IsExact) {
  PngPicture picture = png_picture(19, 11, PNG_COLOR_TYPE_RGB, 8, true);
  picture.rows = gradient(19, 11, 3);
  EXPECT_EQ(decode_image(encode_png(picture)).pixels, picture.rows);
}

TEST(DecodePng, AlphaIsDroppedNotComposited) {
  PngPicture picture = png_picture(2, 1, PNG_COLOR_TYPE_RGB_ALPHA);
  picture.rows = {10, 20, 30, 0, 200, 100, 50, 128};
  const RgbImage image = decode_image(encode_png(picture));
  EXPECT_EQ(image.pixels, (std::vector<std::uint8_t>{10, 20, 30, 200, 100, 50}));
}

TEST(DecodePng, GrayAndGrayAlphaAreReplicated) {
  PngPicture gray = png_picture(3, 1, PNG_COLOR_TYPE_GRAY);
  gray.rows = {0, 77, 255};
  EXPECT_EQ(decode_image(encode_png(gray)).pixels,
            (std::vector<std::uint8_t>{0, 0, 0, 77, 77, 77, 255, 255, 255}));
  PngPicture gray_alpha = png_picture(2, 1, PNG_COLOR_TYPE_GRAY_ALPHA);
  gray_alpha.rows = {9, 0, 250, 255};
  EXPECT_EQ(decode_image(encode_png(gray_alpha)).pixels,
            (std::vector<std::uint8_t>{9, 9, 9, 250, 250, 250}));
}

TEST(DecodePng, LowBitDepthGrayIsScaledLikePil) {
  // 1-bit: PIL mode "1" -> 0/255; 2-bit and 4-bit: PIL's L;2 / L;4 unpackers (x85, x17).
  PngPicture one_bit = png_picture(8, 1, PNG_COLOR_TYPE_GRAY, 1);
  one_bit.rows = {0b10100000};
  const RgbImage one = decode_image(encode_png(one_bit));
  EXPECT_EQ(pixel(one, 0, 0)[0], 255);
  EXPECT_EQ(pixel(one, 1, 0)[0], 0);
  EXPECT_EQ(pixel(one, 2, 0)[2], 255);
  PngPicture two_bit = png_picture(4, 1, PNG_COLOR_TYPE_GRAY, 2);
  two_bit.rows = {0b00011011};
  const RgbImage two = decode_image(encode_png(two_bit));
  EXPECT_EQ(two.pixels,
            (std::vector<std::uint8_t>{0, 0, 0, 85, 85, 85, 170, 170, 170, 255, 255, 255}));
  PngPicture four_bit = png_picture(2, 1, PNG_COLOR_TYPE_GRAY, 4);
  four_bit.rows = {0x3C};
  EXPECT_EQ(decode_image(encode_png(four_bit)).pixels,
            (std::vector<std::uint8_t>{51, 51, 51, 204, 204, 204}));
}

TEST(DecodePng, PaletteMapsToItsColorsIgnoringTransparency) {
  PngPicture picture = png_picture(3, 1, PNG_COLOR_TYPE_PALETTE);
  picture.palette = {{1, 2, 3}, {250, 128, 0}, {7, 8, 9}};
  picture.transparency = {0, 128};  // PIL keeps the colors of transparent entries
  picture.rows = {1, 0, 2};
  EXPECT_EQ(decode_image(encode_png(picture)).pixels,
            (std::vector<std::uint8_t>{250, 128, 0, 1, 2, 3, 7, 8, 9}));
  PngPicture four_bit = png_picture(3, 1, PNG_COLOR_TYPE_PALETTE, 4);
  four_bit.palette = picture.palette;
  four_bit.rows = {0x21, 0x00};
  EXPECT_EQ(decode_image(encode_png(four_bit)).pixels,
            (std::vector<std::uint8_t>{7, 8, 9, 250, 128, 0, 1, 2, 3}));
}

TEST(DecodePng, SixteenBitKeepsTheHighByte) {
  // PIL opens 16-bit RGB/RGBA/LA PNGs through its ;16B unpackers, which keep the high byte.
  PngPicture rgb = png_picture(2, 1, PNG_COLOR_TYPE_RGB, 16);
  rgb.rows = {0x12, 0xFF, 0x34, 0x00, 0xFF, 0x80, 0x00, 0x01, 0x80, 0x7F, 0xAB, 0xCD};
  EXPECT_EQ(decode_image(encode_png(rgb)).pixels,
            (std::vector<std::uint8_t>{0x12, 0x34, 0xFF, 0x00, 0x80, 0xAB}));
  PngPicture rgba = png_picture(1, 1, PNG_COLOR_TYPE_RGB_ALPHA, 16);
  rgba.rows = {0xA0, 0x01, 0xB0, 0x02, 0xC0, 0x03, 0x00, 0x00};
  EXPECT_EQ(decode_image(encode_png(rgba)).pixels, (std::vector<std::uint8_t>{0xA0, 0xB0, 0xC0}));
  PngPicture gray_alpha = png_picture(1, 1, PNG_COLOR_TYPE_GRAY_ALPHA, 16);
  gray_alpha.rows = {0x7E, 0xFF, 0xFF, 0xFF};
  EXPECT_EQ(decode_image(encode_png(gray_alpha)).pixels,
            (std::vector<std::uint8_t>{0x7E, 0x7E, 0x7E}));
}

TEST(DecodePng, SixteenBitGrayIsClippedLikePilModeI) {
  // PIL opens 16-bit grey as mode "I" and convert('RGB') clips it to 0..255 (measured).
  PngPicture gray = png_picture(5, 1, PNG_COLOR_TYPE_GRAY, 16);
  gray.rows = {0x00, 0x00, 0x00, 0x64, 0x00, 0xFF, 0x01, 0x00, 0xFF, 0xFF};
  EXPECT_EQ(decode_image(encode_png(gray)).pixels,
            (std::vector<std::uint8_t>{0, 0, 0, 100, 100, 100, 255, 255, 255, 255, 255, 255, 255,
                                       255, 255}));
}

TEST(DecodePng, TruncatedIsAnError) {
  PngPicture picture = png_picture(64, 64);
  picture.rows = gradient(64, 64, 3);
  const auto png = encode_png(picture);
  for (const std::size_t keep :
       {png.size() - 20, png.size() / 2, std::size_t{40}, std::size_t{8}}) {
    SCOPED_TRACE(keep);
    const std::vector<std::byte> cut(png.begin(), png.begin() + static_cast<long>(keep));
    EXPECT_THROW(decode_image(cut), DecodeError);
  }
}

TEST(DecodePng, CorruptImageDataIsAnError) {
  PngPicture picture = png_picture(64, 64);
  picture.rows = gradient(64, 64, 3);
  auto png = encode_png(picture);
  png[png.size() / 2] ^= std::byte{0x5A};  // inside IDAT: the CRC no longer matches
  EXPECT_THROW(decode_image(png), DecodeError);
}

TEST(DecodePng, HugeDimensionsAreRefusedBeforeAllocating) {
  // A valid IHDR claiming 100000 x 100000 pixels (10 G pixels), and nothing else.
  PngPicture picture = png_picture(1, 1);
  picture.rows = {1, 2, 3};
  auto png = encode_png(picture);
  const unsigned char huge[8] = {0x00, 0x01, 0x86, 0xA0, 0x00, 0x01, 0x86, 0xA0};
  std::memcpy(png.data() + 16, huge, sizeof huge);
  // Fix IHDR's CRC so that only the size is wrong.
  const std::uint32_t crc = png_crc(png.data() + 12, 17);
  const unsigned char crc_bytes[4] = {
      static_cast<unsigned char>(crc >> 24), static_cast<unsigned char>(crc >> 16),
      static_cast<unsigned char>(crc >> 8), static_cast<unsigned char>(crc)};
  std::memcpy(png.data() + 29, crc_bytes, 4);
  try {
    decode_image(png);
    FAIL() << "decoded";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("100000x100000"), std::string::npos) << e.what();
  }
}

// ---- neither ----

TEST(Decode, EmptyAndGarbageAreErrors) {
  EXPECT_THROW(decode_image({}), DecodeError);
  EXPECT_THROW(decode_image(to_bytes("GIF89a....", 10)), DecodeError);
  EXPECT_THROW(decode_image(to_bytes("\xFF", 1)), DecodeError);
  EXPECT_THROW(decode_image(to_bytes("\x89PNG", 4)), DecodeError);
  try {
    decode_image(to_bytes("hello world", 11));
    FAIL() << "decoded";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("neither JPEG nor PNG"), std::string::npos);
  }
}

TEST(Decode, FormatIsChosenByContent) {
  // ImageNet has a PNG named .JPEG: the bytes decide, and decode_image never sees a name.
  PngPicture picture = png_picture(2, 2);
  picture.rows = gradient(2, 2, 3);
  EXPECT_EQ(decode_image(encode_png(picture)).pixels, picture.rows);
}

}  // namespace
}  // namespace dsfs::view
