// The memory bounds of rendering a view: an image is refused by the pixel count its header
// claims before anything is allocated, every render reserves what it will hold from a budget
// shared by all renders in flight (waiting for room, refused when it can never fit), and the
// budget is never exceeded however many callers render at once.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cuda/backend.h"
#include "cuda/image_decode.h"
#include "cuda/npy.h"
#include "cuda/view_service.h"
#include "cuda/view_spec.h"

namespace dsfs::view {
namespace {

using namespace std::chrono_literals;

std::uint32_t crc32(const std::uint8_t* data, std::size_t size) {
  std::uint32_t crc = 0xFFFFFFFFu;
  for (std::size_t i = 0; i < size; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void put_be32(std::vector<std::byte>& out, std::uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(std::byte(value >> shift & 0xFF));
}

void put_chunk(std::vector<std::byte>& png, std::string_view type,
               const std::vector<std::uint8_t>& data) {
  put_be32(png, static_cast<std::uint32_t>(data.size()));
  const std::size_t type_at = png.size();
  for (const char c : type) png.push_back(std::byte(c));
  for (const std::uint8_t b : data) png.push_back(std::byte(b));
  put_be32(png,
           crc32(reinterpret_cast<const std::uint8_t*>(png.data() + type_at), 4 + data.size()));
}

// A valid PNG header claiming width x height 8-bit RGB pixels, then an IDAT of two bytes and
// IEND: a 59-byte "decompression bomb".
std::vector<std::byte> png_claiming(std::uint32_t width, std::uint32_t height) {
  std::vector<std::byte> png;
  for (const int b : {0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A}) png.push_back(std::byte(b));
  std::vector<std::uint8_t> ihdr;
  for (const std::uint32_t v : {width, height}) {
    for (int shift = 24; shift >= 0; shift -= 8)
      ihdr.push_back(static_cast<std::uint8_t>(v >> shift));
  }
  for (const int b : {8, 2, 0, 0, 0}) ihdr.push_back(static_cast<std::uint8_t>(b));  // 8-bit RGB
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", {0x78, 0x9C});
  put_chunk(png, "IEND", {});
  return png;
}

std::vector<std::byte> encode_jpeg(int width, int height, int flags = 0) {
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width) * height * 3);
  for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<std::uint8_t>(i * 7);
  tjhandle compressor = tjInitCompress();
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(compressor, rgb.data(), width, 0, height, TJPF_RGB, &jpeg, &size,
                        TJSAMP_420, 90, flags),
            0);
  std::vector<std::byte> out(reinterpret_cast<std::byte*>(jpeg),
                             reinterpret_cast<std::byte*>(jpeg) + size);
  tjFree(jpeg);
  tjDestroy(compressor);
  return out;
}

// A small JPEG whose frame header (SOF0) claims width x height.
std::vector<std::byte> jpeg_claiming(std::uint16_t width, std::uint16_t height) {
  std::vector<std::byte> jpeg = encode_jpeg(16, 16);
  for (std::size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == std::byte{0xFF} && jpeg[i + 1] == std::byte{0xC0}) {
      jpeg[i + 5] = std::byte(height >> 8);
      jpeg[i + 6] = std::byte(height & 0xFF);
      jpeg[i + 7] = std::byte(width >> 8);
      jpeg[i + 8] = std::byte(width & 0xFF);
      return jpeg;
    }
  }
  ADD_FAILURE() << "no SOF0 marker";
  return jpeg;
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const DecodeError& e) {
    return e.what();
  }
  return "(no DecodeError)";
}

TEST(ViewMaxPixels, APngClaimingHugeDimensionsIsRefusedByItsHeaderAlone) {
  // 13000 x 13000 = 169 M pixels: under PIL's bomb limit, far over the default.
  bool told = false;
  const std::string error = error_of([&] {
    decode_image(png_claiming(13000, 13000), kDefaultMaxPixels,
                 [&](const ImageHeader&) { told = true; });
  });
  EXPECT_NE(error.find("13000x13000"), std::string::npos) << error;
  EXPECT_NE(error.find("--view-max-pixels"), std::string::npos) << error;
  EXPECT_FALSE(told) << "refused before anything was to be allocated";
}

TEST(ViewMaxPixels, AJpegClaimingHugeDimensionsIsRefusedByItsHeaderAlone) {
  const std::string error =
      error_of([&] { decode_image(jpeg_claiming(9000, 9000), kDefaultMaxPixels); });
  EXPECT_NE(error.find("9000x9000"), std::string::npos) << error;
  EXPECT_NE(error.find("--view-max-pixels"), std::string::npos) << error;
}

TEST(ViewMaxPixels, TheLimitIsTheOneGivenAndTheHeaderIsToldFirst) {
  const std::vector<std::byte> jpeg = encode_jpeg(20, 10);  // 200 pixels
  std::vector<ImageHeader> headers;
  const RgbImage image =
      decode_image(jpeg, 200, [&](const ImageHeader& header) { headers.push_back(header); });
  EXPECT_EQ(image.width, 20);
  ASSERT_EQ(headers.size(), 1u);
  EXPECT_EQ(headers[0].width, 20);
  EXPECT_EQ(headers[0].height, 10);
  EXPECT_EQ(headers[0].decode_bytes(), 600u);
  EXPECT_NE(error_of([&] { decode_image(jpeg, 199); }).find("more than the 199 pixels"),
            std::string::npos);
  // A PNG's header also tells libpng's row memory.
  std::vector<ImageHeader> png_headers;
  error_of([&] {
    decode_image(png_claiming(100, 50), kDefaultMaxPixels,
                 [&](const ImageHeader& header) { png_headers.push_back(header); });
  });
  ASSERT_EQ(png_headers.size(), 1u);
  EXPECT_EQ(png_headers[0].decode_bytes(), 100u * 50 * 3 + 100u * 3 * 50);
}

TEST(ViewMaxPixels, AProgressiveJpegCountsItsCoefficients) {
  // libjpeg keeps a progressive image's coefficients until its last scan.
  std::vector<ImageHeader> headers;
  const RgbImage image =
      decode_image(encode_jpeg(20, 10, TJFLAG_PROGRESSIVE), kDefaultMaxPixels,
                   [&](const ImageHeader& header) { headers.push_back(header); });
  EXPECT_EQ(image.height, 10);
  ASSERT_EQ(headers.size(), 1u);
  EXPECT_EQ(headers[0].decode_bytes(), 20u * 10 * 3 + 20u * 10 * 2 * 3);
}

TEST(RenderMemoryBudget, ReservesWaitsForRoomAndRefusesWhatCanNeverFit) {
  RenderMemoryBudget budget(1000);
  EXPECT_NE(error_of([&] { budget.reserve(1001, 10ms); }).find("--view-render-memory"),
            std::string::npos);
  EXPECT_EQ(budget.refused(), 1u);
  auto first = budget.reserve(600, 10ms);
  EXPECT_EQ(budget.in_use(), 600u);
  EXPECT_THROW(budget.reserve(500, 20ms), RenderBusyError);
  EXPECT_EQ(budget.timed_out(), 1u);
  // A waiter gets its room once it is given back.
  std::atomic<bool> reserved{false};
  std::thread waiter([&] {
    auto second = budget.reserve(500, 30s);
    reserved = true;
  });
  first = {};
  waiter.join();
  EXPECT_TRUE(reserved);
  EXPECT_EQ(budget.in_use(), 0u);
  EXPECT_EQ(budget.peak(), 600u);
}

ViewSpec spec_for_tests() {
  return parse_view_spec("resize=64,crop=64,dtype=float32");
}

TEST(ViewServiceMemory, ARenderLargerThanTheWholeBudgetIsADecodeError) {
  ViewServiceOptions options;
  options.render_memory_bytes = 64 << 10;
  ViewService service(make_cpu_backend(), options);
  const ViewSpec spec = spec_for_tests();  // its file alone is 48 KiB; the decode 300x200x3 more
  const std::vector<std::byte> jpeg = encode_jpeg(300, 200);
  const std::string error = error_of([&] { service.render(spec, jpeg); });
  EXPECT_NE(error.find("--view-render-memory"), std::string::npos) << error;
  EXPECT_EQ(service.stats().memory_refused, 1u);
  EXPECT_EQ(service.stats().rendered, 0u);
}

TEST(ViewServiceMemory, ConcurrentRendersNeverHoldMoreThanTheBudget) {
  const ViewSpec spec = spec_for_tests();
  const std::vector<std::byte> jpeg = encode_jpeg(400, 300);
  const std::uint64_t one = ViewService::render_memory_bytes(
      spec, ImageHeader{.width = 400, .height = 300, .decode_scratch_bytes = 0});
  ViewServiceOptions options;
  options.render_memory_bytes = one + one / 2;  // room for one render at a time
  ViewService service(make_cpu_backend(), options);
  const std::string expected = ViewService(make_cpu_backend()).render(spec, jpeg);

  constexpr int kThreads = 6, kEach = 5;
  std::vector<std::thread> threads;
  std::atomic<int> right{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kEach; ++i) {
        if (service.render(spec, jpeg) == expected) ++right;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(right, kThreads * kEach);
  const ViewServiceStats stats = service.stats();
  EXPECT_EQ(stats.memory_peak, one) << "one render at a time, each reserving what it holds";
  EXPECT_EQ(stats.memory_timed_out, 0u);
  EXPECT_EQ(stats.memory_capacity, one + one / 2);
}

TEST(ViewServiceMemory, TheEstimateCoversDecodeTransformAndFile) {
  const ViewSpec spec = parse_view_spec("resize=256,crop=224,dtype=float32");
  const ImageHeader header{.width = 500, .height = 375, .decode_scratch_bytes = 1000};
  EXPECT_EQ(ViewService::render_memory_bytes(spec, header),
            500u * 375 * 3 + 1000 + 375u * 224 * 3 + 224u * 224 * 3 + npy_file_size(spec));
}

}  // namespace
}  // namespace dsfs::view
