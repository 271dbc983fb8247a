// The CUDA backend against the CPU backend on the same inputs: per-pixel difference at most 2/255
// before normalization (in practice both apply the same integer plan, so 0). These tests need a
// GPU and report themselves skipped, with the reason, where there is none. The factory tests
// below them check the fallback where there is no GPU.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/backend.h"
#include "cuda/cuda_info.h"
#include "cuda/view_service.h"
#include "tests/unit/view_cuda_test_util.h"
#ifdef DSFS_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace dsfs::view {
namespace {

using test_images::max_pixel_difference;
using test_images::synthetic_image;
using test_images::test_image_sizes;
using test_images::test_spec_texts;

constexpr double kTolerance = 2.0;  // in 1/255 units before normalization

// The CUDA backend, or null with the reason it cannot be had here.
std::unique_ptr<Backend> try_cuda_backend(std::string& why) {
#ifdef DSFS_HAVE_CUDA
  return make_cuda_backend(why);
#else
  why = "this build has no CUDA (nvcc not found, or DSFS_CUDA=OFF, at configure time)";
  return nullptr;
#endif
}

// The tensors one backend makes of a batch, contiguous.
std::vector<std::byte> run_backend(Backend& backend, const ViewSpec& spec,
                                   const std::vector<const RgbImage*>& images) {
  std::vector<std::byte> tensors(images.size() * spec.tensor_bytes());
  std::vector<std::span<std::byte>> outputs;
  for (std::size_t i = 0; i < images.size(); ++i) {
    outputs.emplace_back(tensors.data() + i * spec.tensor_bytes(), spec.tensor_bytes());
  }
  backend.transform(spec, images, outputs);
  return tensors;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    cuda_ = try_cuda_backend(why);
    if (!cuda_) GTEST_SKIP() << "no CUDA backend here: " << why;
    cpu_ = make_cpu_backend();
  }

  static void TearDownTestSuite() {
    if (worst_seen_ >= 0) {
      std::printf("CUDA vs CPU: max per-pixel difference %.6f/255 over %llu images\n", worst_seen_,
                  static_cast<unsigned long long>(images_compared_));
      ::testing::Test::RecordProperty("max_difference_over_255", std::to_string(worst_seen_));
    }
  }

  // Runs both backends on `images` and checks every tensor; returns the worst difference.
  double compare(const ViewSpec& spec, const std::vector<const RgbImage*>& images) {
    const std::vector<std::byte> on_gpu = run_backend(*cuda_, spec, images);
    const std::vector<std::byte> on_cpu = run_backend(*cpu_, spec, images);
    double worst = 0;
    const std::size_t bytes = spec.tensor_bytes();
    for (std::size_t i = 0; i < images.size(); ++i) {
      const double difference =
          max_pixel_difference(spec, std::span(on_gpu).subspan(i * bytes, bytes),
                               std::span(on_cpu).subspan(i * bytes, bytes));
      EXPECT_LE(difference, kTolerance) << spec.canonical() << ": image " << i << " ("
                                        << images[i]->width << "x" << images[i]->height << ")";
      worst = std::max(worst, difference);
    }
    record(worst, images.size());
    return worst;
  }

  static void record(double worst, std::size_t images) {
    static std::mutex mutex;
    std::lock_guard lock(mutex);
    worst_seen_ = std::max(worst_seen_, worst);
    images_compared_ += images;
  }

  std::unique_ptr<Backend> cuda_;
  std::unique_ptr<Backend> cpu_;
  static inline double worst_seen_ = -1;
  static inline std::uint64_t images_compared_ = 0;
};

std::vector<RgbImage> sized_images(std::uint32_t seed) {
  std::vector<RgbImage> images;
  for (const auto& [width, height] : test_image_sizes()) {
    images.push_back(synthetic_image(width, height, seed++));
  }
  return images;
}

std::vector<const RgbImage*> pointers(const std::vector<RgbImage>& images, std::size_t count) {
  std::vector<const RgbImage*> result;
  for (std::size_t i = 0; i < count; ++i) result.push_back(&images[i % images.size()]);
  return result;
}

TEST_F(CudaBackendTest, EverySpecAndSizeMatchesTheCpuBackend) {
  const std::vector<RgbImage> images = sized_images(11);
  for (const std::string& text : test_spec_texts()) {
    SCOPED_TRACE(text);
    compare(parse_view_spec(text), pointers(images, images.size()));
  }
}

TEST_F(CudaBackendTest, BatchSizesFromOneToSixtyFour) {
  const std::vector<RgbImage> images = sized_images(23);
  for (const std::string text : {"imagenet-eval", "imagenet-eval-fp16", "imagenet-eval-uint8"}) {
    const ViewSpec spec = parse_view_spec(text);
    for (const std::size_t batch : {1, 2, 5, 16, 17, 33, 64}) {
      SCOPED_TRACE(::testing::Message() << text << " batch " << batch);
      compare(spec, pointers(images, batch));
    }
  }
}

TEST_F(CudaBackendTest, SingleImagesOfEverySize) {
  const ViewSpec spec = parse_view_spec("resize=64,crop=80x48,dtype=float32,layout=hwc");
  const std::vector<RgbImage> images = sized_images(37);
  for (const RgbImage& image : images) compare(spec, {&image});
}

TEST_F(CudaBackendTest, ConcurrentCallersGetTheirOwnTensors) {
  const std::vector<RgbImage> images = sized_images(51);
  const std::vector<std::string> texts = test_spec_texts();
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int caller = 0; caller < 8; ++caller) {
    callers.emplace_back([&, caller] {
      // Each caller its own spec and batch size, so a mix-up between streams shows.
      const ViewSpec spec = parse_view_spec(texts[static_cast<std::size_t>(caller) % texts.size()]);
      const auto cpu = make_cpu_backend();
      for (int round = 0; round < 6; ++round) {
        std::vector<const RgbImage*> batch;
        for (int i = 0; i < 3 + caller * 4; ++i) {
          batch.push_back(&images[static_cast<std::size_t>(caller + round + i) % images.size()]);
        }
        const std::vector<std::byte> on_gpu = run_backend(*cuda_, spec, batch);
        const std::vector<std::byte> on_cpu = run_backend(*cpu, spec, batch);
        const double difference = max_pixel_difference(spec, on_gpu, on_cpu);
        record(difference, batch.size());
        if (difference > kTolerance) failures.fetch_add(1);
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST_F(CudaBackendTest, RejectsMismatchedOutputsLikeTheCpuBackend) {
  const ViewSpec spec = parse_view_spec("imagenet-eval");
  const RgbImage image = synthetic_image(300, 200, 1);
  const std::vector<const RgbImage*> images{&image};
  std::vector<std::byte> small(spec.tensor_bytes() - 1);
  const std::vector<std::span<std::byte>> outputs{small};
  EXPECT_THROW(cuda_->transform(spec, images, outputs), std::invalid_argument);
  EXPECT_THROW(cuda_->transform(spec, images, {}), std::invalid_argument);
  RgbImage broken = image;
  broken.pixels.pop_back();
  std::vector<std::byte> tensor(spec.tensor_bytes());
  const std::vector<std::span<std::byte>> good_outputs{tensor};
  EXPECT_THROW(cuda_->transform(spec, std::vector<const RgbImage*>{&broken}, good_outputs),
               std::invalid_argument);
  // And it still works afterwards.
  compare(spec, images);
}

TEST_F(CudaBackendTest, ReportsItsDeviceAndStageTimes) {
  const ViewSpec spec = parse_view_spec("imagenet-eval");
  const std::vector<RgbImage> images = sized_images(5);
  compare(spec, pointers(images, images.size()));
  const auto info = cuda_backend_info(*cuda_);
  ASSERT_TRUE(info.has_value());
  EXPECT_FALSE(info->device.empty());
  EXPECT_GE(info->times.images, images.size());
  EXPECT_GE(info->times.launches, 1U);
  EXPECT_GT(info->times.upload_bytes, 0U);
  EXPECT_GT(info->times.kernel_seconds, 0.0);
  std::printf("CUDA device: %s\n", info->device.c_str());
}

// A JPEG of `image` (quality 90, 4:2:0), as the mount reads them from Redis.
std::string encode_jpeg(const RgbImage& image) {
  tjhandle handle = tjInitCompress();
  EXPECT_NE(handle, nullptr);
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  const int result = tjCompress2(handle, image.pixels.data(), image.width, 0, image.height,
                                 TJPF_RGB, &jpeg, &size, TJSAMP_420, 90, 0);
  EXPECT_EQ(result, 0) << tjGetErrorStr2(handle);
  std::string bytes(reinterpret_cast<const char*>(jpeg), size);
  tjFree(jpeg);
  tjDestroy(handle);
  return bytes;
}

// The path a mount takes: a ViewService over the CUDA backend (batched by default) rendering
// JPEG bytes for many threads at once gives the same .npy files, byte for byte, as a service
// over the CPU backend, and its batches really carried several images.
TEST_F(CudaBackendTest, BatchedServiceRendersTheCpuServicesFiles) {
  ViewService on_gpu(std::move(cuda_));
  ASSERT_TRUE(on_gpu.batched());
  ViewService on_cpu(make_cpu_backend(), {.batched = false});
  const std::vector<RgbImage> images = sized_images(71);
  std::vector<std::string> jpegs;
  for (const RgbImage& image : images) jpegs.push_back(encode_jpeg(image));
  const std::vector<std::string> texts = {"imagenet-eval", "imagenet-eval-fp16",
                                          "imagenet-eval-uint8"};
  std::atomic<int> mismatches{0};
  std::atomic<std::uint64_t> rendered{0};
  {
    std::vector<std::jthread> callers;
    for (int caller = 0; caller < 16; ++caller) {
      callers.emplace_back([&, caller] {
        for (int round = 0; round < 8; ++round) {
          const std::size_t pick = static_cast<std::size_t>(caller * 8 + round);
          const ViewSpec spec = parse_view_spec(texts[pick % texts.size()]);
          const auto encoded = std::as_bytes(std::span(jpegs[pick % jpegs.size()]));
          if (on_gpu.render(spec, encoded) != on_cpu.render(spec, encoded)) {
            mismatches.fetch_add(1);
          }
          rendered.fetch_add(1);
        }
      });
    }
  }
  EXPECT_EQ(mismatches.load(), 0);
  const ViewServiceStats stats = on_gpu.stats();
  EXPECT_EQ(stats.rendered, rendered.load());
  EXPECT_EQ(stats.batched_images, rendered.load());
  EXPECT_GE(stats.batches, 1U);
  EXPECT_LT(stats.batches, stats.batched_images) << "no batch carried more than one image";
  std::printf("ViewService over CUDA: %llu files in %llu batches, all equal to the CPU's\n",
              static_cast<unsigned long long>(stats.batched_images),
              static_cast<unsigned long long>(stats.batches));
}

// --- The fallback where there is no GPU (these skip where there is one). ---

bool cuda_usable() {
  std::string why;
  return try_cuda_backend(why) != nullptr;
}

TEST(BackendFactory, CudaKindSaysWhyItIsUnavailable) {
  if (cuda_usable()) GTEST_SKIP() << "a CUDA device is usable here";
  try {
    make_backend(BackendKind::kCuda);
    FAIL() << "make_backend(kCuda) returned a backend without a usable GPU";
  } catch (const std::runtime_error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("cuda"), std::string::npos) << message;
    EXPECT_NE(message.find("--view-backend cpu"), std::string::npos) << message;
#ifdef DSFS_HAVE_CUDA
    std::string why;
    ASSERT_EQ(make_cuda_backend(why), nullptr);
    EXPECT_FALSE(why.empty());
    EXPECT_NE(message.find(why), std::string::npos) << message << " lacks " << why;
#endif
  }
}

TEST(BackendFactory, AutoFallsBackToTheCpuBackend) {
  if (cuda_usable()) GTEST_SKIP() << "a CUDA device is usable here";
  const auto backend = make_backend(BackendKind::kAuto);
  ASSERT_NE(backend, nullptr);
  EXPECT_EQ(backend->name(), "cpu");
  EXPECT_FALSE(cuda_backend_info(*backend).has_value());

  // And it serves: the fallback is a working backend, not a placeholder.
  const ViewSpec spec = parse_view_spec("imagenet-eval-uint8");
  const RgbImage image = synthetic_image(64, 48, 9);
  const std::vector<std::byte> tensor = run_backend(*backend, spec, {&image});
  EXPECT_TRUE(
      std::any_of(tensor.begin(), tensor.end(), [](std::byte b) { return b != std::byte{0}; }));
}

TEST(BackendFactory, CpuKindIsAlwaysTheCpuBackend) {
  const auto backend = make_backend(BackendKind::kCpu);
  EXPECT_EQ(backend->name(), "cpu");
  EXPECT_FALSE(cuda_backend_info(*backend).has_value());
}

}  // namespace
}  // namespace dsfs::view
