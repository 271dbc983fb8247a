#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "cuda/backend.h"

namespace dsfs::view {
namespace {

RgbImage random_image(int width, int height, unsigned seed) {
  std::mt19937 random(seed);
  RgbImage image{width, height,
                 std::vector<std::uint8_t>(static_cast<std::size_t>(width) * height * 3)};
  for (auto& value : image.pixels) value = static_cast<std::uint8_t>(random() & 0xFF);
  return image;
}

RgbImage constant_image(int width, int height, std::uint8_t r, std::uint8_t g, std::uint8_t b) {
  RgbImage image{width, height,
                 std::vector<std::uint8_t>(static_cast<std::size_t>(width) * height * 3)};
  // Filled by index: inserting {r, g, b} trips GCC 12's false -Wstringop-overflow and
  // -Warray-bounds at -O3.
  for (std::size_t i = 0; i < image.pixels.size(); i += 3) {
    image.pixels[i] = r;
    image.pixels[i + 1] = g;
    image.pixels[i + 2] = b;
  }
  return image;
}

std::vector<std::byte> render(Backend& backend, const ViewSpec& spec, const RgbImage& image) {
  std::vector<std::byte> tensor(spec.tensor_bytes());
  const RgbImage* images[] = {&image};
  const std::span<std::byte> outputs[] = {tensor};
  backend.transform(spec, images, outputs);
  return tensor;
}

std::vector<std::uint8_t> as_u8(const std::vector<std::byte>& bytes) {
  std::vector<std::uint8_t> values(bytes.size());
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

template <typename T>
T element(const std::vector<std::byte>& bytes, std::size_t index) {
  T value;
  std::memcpy(&value, bytes.data() + index * sizeof(T), sizeof(T));
  return value;
}

// ---- an independent, unoptimized PIL + torchvision model: the full resized image, then the
// crop, as Pillow 9.4 and torchvision 0.14 do it ----

std::vector<std::uint8_t> pil_resize_axis(const std::vector<std::uint8_t>& in, int width,
                                          int height, int new_size, bool horizontal) {
  const int in_size = horizontal ? width : height;
  const double scale = static_cast<double>(in_size) / new_size;
  const double filterscale = std::max(scale, 1.0);
  const int out_width = horizontal ? new_size : width;
  const int out_height = horizontal ? height : new_size;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(out_width) * out_height * 3);
  for (int o = 0; o < new_size; ++o) {
    const double center = (o + 0.5) * scale;
    const int lo = std::max(0, static_cast<int>(center - filterscale + 0.5));
    const int hi = std::min(in_size, static_cast<int>(center + filterscale + 0.5));
    std::vector<double> w;
    double total = 0;
    for (int i = lo; i < hi; ++i) {
      const double x = std::abs((i - center + 0.5) / filterscale);
      w.push_back(x < 1.0 ? 1.0 - x : 0.0);
      total += w.back();
    }
    std::vector<int> fixed;
    for (double v : w)
      fixed.push_back(static_cast<int>(0.5 + (total != 0 ? v / total : v) * (1 << 22)));
    const int lines = horizontal ? height : width;
    for (int line = 0; line < lines; ++line) {
      for (int c = 0; c < 3; ++c) {
        int sum = 1 << 21;
        for (int i = lo; i < hi; ++i) {
          const int x = horizontal ? i : line, y = horizontal ? line : i;
          sum += in[(static_cast<std::size_t>(y) * width + x) * 3 + c] * fixed[i - lo];
        }
        const int x = horizontal ? o : line, y = horizontal ? line : o;
        out[(static_cast<std::size_t>(y) * out_width + x) * 3 + c] =
            static_cast<std::uint8_t>(std::clamp(sum >> 22, 0, 255));
      }
    }
  }
  return out;
}

// HWC uint8 of Resize(shorter side) + CenterCrop(crop) on `image`.
std::vector<std::uint8_t> reference_view(const RgbImage& image, int shorter, int crop) {
  const int w = image.width, h = image.height;
  const int new_w = w <= h ? shorter : static_cast<int>(static_cast<double>(shorter) * w / h);
  const int new_h = w <= h ? static_cast<int>(static_cast<double>(shorter) * h / w) : shorter;
  std::vector<std::uint8_t> pixels = image.pixels;
  if (new_w != w) pixels = pil_resize_axis(pixels, w, h, new_w, true);
  if (new_h != h) pixels = pil_resize_axis(pixels, new_w, h, new_h, false);
  // CenterCrop: pad to at least the crop, then crop at round((size - crop) / 2).
  auto start = [crop](int size) {
    return crop > size ? -((crop - size) / 2)
                       : static_cast<int>(std::nearbyint((size - crop) / 2.0));
  };
  const int left = start(new_w), top = start(new_h);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(crop) * crop * 3, 0);
  for (int y = 0; y < crop; ++y) {
    for (int x = 0; x < crop; ++x) {
      const int sx = left + x, sy = top + y;
      if (sx < 0 || sy < 0 || sx >= new_w || sy >= new_h) continue;
      std::memcpy(&out[(static_cast<std::size_t>(y) * crop + x) * 3],
                  &pixels[(static_cast<std::size_t>(sy) * new_w + sx) * 3], 3);
    }
  }
  return out;
}

TEST(CpuBackend, MatchesAFullResizeThenCropModel) {
  auto backend = make_cpu_backend();
  const std::pair<int, int> sizes[] = {{500, 375}, {375, 500}, {256, 256}, {1000, 200}, {200, 1000},
                                       {100, 80},  {224, 224}, {257, 300}, {60, 300},   {1, 1}};
  for (const auto& [width, height] : sizes) {
    SCOPED_TRACE(testing::Message() << width << "x" << height);
    const RgbImage image = random_image(width, height, static_cast<unsigned>(width * 31 + height));
    for (const auto& [shorter, crop] : {std::pair{256, 224}, std::pair{64, 80}}) {
      const ViewSpec spec =
          parse_view_spec(fmt::format("resize={},crop={},dtype=uint8,layout=hwc", shorter, crop));
      EXPECT_EQ(as_u8(render(*backend, spec, image)), reference_view(image, shorter, crop));
    }
  }
}

TEST(CpuBackend, ConstantImagesStayConstant) {
  auto backend = make_cpu_backend();
  const ViewSpec spec = parse_view_spec("resize=256,crop=224,dtype=uint8,layout=hwc");
  for (const auto& [width, height] :
       {std::pair{500, 375}, std::pair{3000, 2000}, std::pair{300, 7}}) {
    const auto out = as_u8(render(*backend, spec, constant_image(width, height, 0, 128, 255)));
    for (std::size_t i = 0; i < out.size(); i += 3) {
      ASSERT_EQ(out[i], 0);
      ASSERT_EQ(out[i + 1], 128);
      ASSERT_EQ(out[i + 2], 255);
    }
  }
}

TEST(CpuBackend, IdentityCropCopiesAndLayoutsTranspose) {
  auto backend = make_cpu_backend();
  const RgbImage image = random_image(7, 5, 1);
  const auto hwc =
      as_u8(render(*backend, parse_view_spec("crop=7x5,dtype=uint8,layout=hwc"), image));
  EXPECT_EQ(hwc, image.pixels);
  const auto chw =
      as_u8(render(*backend, parse_view_spec("crop=7x5,dtype=uint8,layout=chw"), image));
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 5; ++y) {
      for (int x = 0; x < 7; ++x) {
        ASSERT_EQ(chw[(c * 5 + y) * 7 + x], image.pixels[(y * 7 + x) * 3 + c]);
      }
    }
  }
}

TEST(CpuBackend, PaddingIsBlack) {
  auto backend = make_cpu_backend();
  const RgbImage image = constant_image(4, 2, 9, 99, 199);
  const auto out =
      as_u8(render(*backend, parse_view_spec("crop=8x6,dtype=uint8,layout=hwc"), image));
  for (int y = 0; y < 6; ++y) {
    for (int x = 0; x < 8; ++x) {
      const bool inside = x >= 2 && x < 6 && y >= 2 && y < 4;
      const std::uint8_t* p = &out[(static_cast<std::size_t>(y) * 8 + x) * 3];
      EXPECT_EQ(p[0], inside ? 9 : 0) << x << "," << y;
      EXPECT_EQ(p[2], inside ? 199 : 0) << x << "," << y;
    }
  }
}

TEST(CpuBackend, Float32IsToTensorThenNormalizeInFloat32) {
  auto backend = make_cpu_backend();
  const RgbImage image = random_image(16, 16, 7);
  const ViewSpec spec = parse_view_spec("crop=16,norm=imagenet");
  const auto out = render(*backend, spec, image);
  const ViewSpec plain = parse_view_spec("crop=16,layout=hwc");
  const auto unnormalized = render(*backend, plain, image);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 256; ++i) {
      const std::uint8_t v = image.pixels[static_cast<std::size_t>(i) * 3 + c];
      const float x = static_cast<float>(v) / 255.0F;
      ASSERT_EQ(element<float>(out, static_cast<std::size_t>(c) * 256 + i),
                (x - spec.mean[c]) / spec.std[c]);
      ASSERT_EQ(element<float>(unnormalized, static_cast<std::size_t>(i) * 3 + c), x);
    }
  }
}

TEST(CpuBackend, PaddingIsNormalizedLikeZero) {
  // torchvision pads the PIL image with 0 before ToTensor and Normalize.
  auto backend = make_cpu_backend();
  const ViewSpec spec = parse_view_spec("crop=4,norm=imagenet,layout=hwc");
  const auto out = render(*backend, spec, constant_image(2, 2, 255, 255, 255));
  EXPECT_EQ(element<float>(out, 0), (0.0F - spec.mean[0]) / spec.std[0]);
  EXPECT_EQ(element<float>(out, (1 * 4 + 1) * 3 + 2), (1.0F - spec.mean[2]) / spec.std[2]);
}

TEST(CpuBackend, Float16RoundsToNearestEven) {
  auto backend = make_cpu_backend();
  RgbImage image{4, 1, {0, 255, 51, 1, 128, 254, 0, 0, 0, 0, 0, 0}};
  const auto out = render(*backend, parse_view_spec("crop=4x1,dtype=float16,layout=hwc"), image);
  EXPECT_EQ(element<std::uint16_t>(out, 0), 0x0000);  // 0
  EXPECT_EQ(element<std::uint16_t>(out, 1), 0x3C00);  // 1.0
  EXPECT_EQ(element<std::uint16_t>(out, 2), 0x3266);  // 0.2 (numpy: float16(0.2))
  EXPECT_EQ(element<std::uint16_t>(out, 3), 0x1C04);  // 1/255 = 0.0039216
  EXPECT_EQ(element<std::uint16_t>(out, 4), 0x3804);  // 128/255 = 0.50196
  EXPECT_EQ(element<std::uint16_t>(out, 5), 0x3BF8);  // 254/255 = 0.99608
  // Beyond half's range: a tiny std makes inf; a tiny value becomes subnormal.
  const auto big = render(*backend,
                          parse_view_spec("crop=4x1,dtype=float16,layout=hwc,"
                                          "norm=0:0:0:1e-6:1e-6:1e-6"),
                          image);
  EXPECT_EQ(element<std::uint16_t>(big, 1), 0x7C00);
  const auto tiny = render(*backend,
                           parse_view_spec("crop=4x1,dtype=float16,layout=hwc,"
                                           "norm=0:0:0:100000:100000:100000"),
                           image);
  EXPECT_EQ(element<std::uint16_t>(tiny, 1), 0x00A8);  // 1e-5 = 167.77 units of 2^-24
}

TEST(CpuBackend, LayoutsHoldTheSameValues) {
  auto backend = make_cpu_backend();
  const RgbImage image = random_image(333, 500, 3);
  const auto chw = render(*backend, parse_view_spec("imagenet-eval-fp16"), image);
  const auto hwc =
      render(*backend,
             parse_view_spec("resize=256,crop=224,dtype=float16,layout=hwc,norm=imagenet"), image);
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < 224 * 224; i += 97) {
      ASSERT_EQ(element<std::uint16_t>(chw, static_cast<std::size_t>(c) * 224 * 224 + i),
                element<std::uint16_t>(hwc, static_cast<std::size_t>(i) * 3 + c));
    }
  }
}

TEST(CpuBackend, BatchesAndThreadsGiveTheSameResults) {
  auto backend = make_cpu_backend();
  const ViewSpec spec = parse_view_spec("imagenet-eval");
  std::vector<RgbImage> images;
  for (unsigned i = 0; i < 6; ++i) images.push_back(random_image(200 + 37 * i, 300 - 23 * i, i));
  std::vector<std::vector<std::byte>> serial;
  for (const auto& image : images) serial.push_back(render(*backend, spec, image));

  // One batch call.
  std::vector<std::vector<std::byte>> batch(images.size(),
                                            std::vector<std::byte>(spec.tensor_bytes()));
  std::vector<const RgbImage*> pointers;
  std::vector<std::span<std::byte>> outputs;
  for (std::size_t i = 0; i < images.size(); ++i) {
    pointers.push_back(&images[i]);
    outputs.push_back(batch[i]);
  }
  backend->transform(spec, pointers, outputs);
  EXPECT_EQ(batch, serial);

  // Several threads at once on the same backend (shared plan cache, per-thread scratch).
  std::vector<std::vector<std::byte>> threaded(images.size());
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < images.size(); ++i) {
      threads.emplace_back([&, i] {
        for (int round = 0; round < 3; ++round) threaded[i] = render(*backend, spec, images[i]);
      });
    }
  }
  EXPECT_EQ(threaded, serial);
}

TEST(CpuBackend, MismatchedArgumentsAreRefused) {
  auto backend = make_cpu_backend();
  const ViewSpec spec = parse_view_spec("crop=4,dtype=uint8");
  const RgbImage image = constant_image(4, 4, 1, 2, 3);
  std::vector<std::byte> small(spec.tensor_bytes() - 1);
  const RgbImage* images[] = {&image};
  const std::span<std::byte> wrong_size[] = {small};
  EXPECT_THROW(backend->transform(spec, images, wrong_size), std::invalid_argument);
  EXPECT_THROW(backend->transform(spec, images, {}), std::invalid_argument);
  RgbImage broken{4, 4, std::vector<std::uint8_t>(10)};
  std::vector<std::byte> tensor(spec.tensor_bytes());
  const RgbImage* broken_images[] = {&broken};
  const std::span<std::byte> outputs[] = {tensor};
  EXPECT_THROW(backend->transform(spec, broken_images, outputs), std::invalid_argument);
}

TEST(BackendFactory, ParsesKinds) {
  EXPECT_EQ(parse_backend_kind("auto"), BackendKind::kAuto);
  EXPECT_EQ(parse_backend_kind("cuda"), BackendKind::kCuda);
  EXPECT_EQ(parse_backend_kind("cpu"), BackendKind::kCpu);
  EXPECT_THROW(parse_backend_kind("gpu"), std::invalid_argument);
  EXPECT_THROW(parse_backend_kind(""), std::invalid_argument);
  EXPECT_THROW(parse_backend_kind("CPU"), std::invalid_argument);
}

TEST(BackendFactory, CpuAndAutoAlwaysWork) {
  EXPECT_EQ(make_backend(BackendKind::kCpu)->name(), "cpu");
  const auto automatic = make_backend(BackendKind::kAuto);
  ASSERT_NE(automatic, nullptr);
  EXPECT_TRUE(automatic->name() == "cpu" || automatic->name() == "cuda");
#ifndef DSFS_HAVE_CUDA
  EXPECT_EQ(automatic->name(), "cpu");
  EXPECT_THROW(make_backend(BackendKind::kCuda), std::runtime_error);
#endif
}

}  // namespace
}  // namespace dsfs::view
