// dsfs synth: determinism, layout, decodable JPEGs of the planned shapes, ImageNet-like sizes.
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/unit/support/files.h"
#include "tools/synth.h"

namespace fs = std::filesystem;
using dsfs::tools::ImageShape;
using dsfs::tools::Pixels;
using dsfs::tools::SynthOptions;
using dsfs::tools::SynthSummary;

namespace {

using dsfs::test::TempDir;

std::vector<unsigned char> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Relative path -> contents of every regular file under `root`.
std::map<std::string, std::vector<unsigned char>> read_tree(const fs::path& root) {
  std::map<std::string, std::vector<unsigned char>> files;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    if (entry.is_regular_file()) {
      files[fs::relative(entry.path(), root).string()] = read_bytes(entry.path());
    }
  }
  return files;
}

struct Decoded {
  int width = 0;
  int height = 0;
  bool grayscale = false;
  std::vector<unsigned char> rgb;
};

Decoded decode(const std::vector<unsigned char>& jpeg) {
  std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitDecompress(), tjDestroy);
  if (!handle) throw std::runtime_error("tjInitDecompress failed");
  Decoded decoded;
  int subsampling = 0, colorspace = 0;
  if (tjDecompressHeader3(handle.get(), jpeg.data(), jpeg.size(), &decoded.width, &decoded.height,
                          &subsampling, &colorspace) != 0) {
    throw std::runtime_error(tjGetErrorStr2(handle.get()));
  }
  decoded.grayscale = colorspace == TJCS_GRAY;
  decoded.rgb.resize(static_cast<std::size_t>(decoded.width) * decoded.height * 3);
  if (tjDecompress2(handle.get(), jpeg.data(), jpeg.size(), decoded.rgb.data(), decoded.width, 0,
                    decoded.height, TJPF_RGB, 0) != 0) {
    throw std::runtime_error(tjGetErrorStr2(handle.get()));
  }
  return decoded;
}

double mean_channel(const Decoded& image, int channel) {
  double sum = 0;
  for (std::size_t i = channel; i < image.rgb.size(); i += 3) sum += image.rgb[i];
  return sum / (image.rgb.size() / 3);
}

SynthOptions small_options(const fs::path& dir, std::uint64_t seed = 7) {
  SynthOptions options;
  options.dir = dir;
  options.classes = 3;
  options.per_class = 4;
  options.seed = seed;
  options.jobs = 2;
  return options;
}

}  // namespace

TEST(SynthNames, ClassAndImageNamesArePadded) {
  EXPECT_EQ(dsfs::tools::synth_class_dir_name(7), "class_0007");
  EXPECT_EQ(dsfs::tools::synth_class_dir_name(12345), "class_12345");
  EXPECT_EQ(dsfs::tools::synth_image_file_name(42), "img_000042.JPEG");
}

TEST(Synth, WritesImageFolderLayoutWithDecodableJpegsOfPlannedShape) {
  TempDir temp;
  const fs::path dir = temp.path() / "new" / "tree";  // missing parents are created
  const SynthOptions options = small_options(dir);
  const SynthSummary summary = dsfs::tools::synthesize(options);

  EXPECT_EQ(summary.files, 12u);
  const auto files = read_tree(dir);
  ASSERT_EQ(files.size(), 12u);
  std::uint64_t bytes = 0, grayscale = 0;
  for (int c = 0; c < options.classes; ++c) {
    for (int i = 0; i < options.per_class; ++i) {
      const std::string relative =
          (fs::path(dsfs::tools::synth_class_dir_name(c)) / dsfs::tools::synth_image_file_name(i))
              .string();
      ASSERT_TRUE(files.contains(relative)) << relative;
      const auto& jpeg = files.at(relative);
      bytes += jpeg.size();
      const ImageShape shape = dsfs::tools::synth_image_shape(options.seed, c, i);
      const Decoded decoded = decode(jpeg);
      EXPECT_EQ(decoded.width, shape.width) << relative;
      EXPECT_EQ(decoded.height, shape.height) << relative;
      EXPECT_EQ(decoded.grayscale, shape.grayscale) << relative;
      grayscale += shape.grayscale;
    }
  }
  EXPECT_EQ(summary.total_bytes, bytes);
  EXPECT_EQ(summary.grayscale_files, grayscale);
  std::size_t class_dirs = 0;
  for (const auto& entry : fs::directory_iterator(dir)) class_dirs += entry.is_directory();
  EXPECT_EQ(class_dirs, 3u);
}

TEST(Synth, SameSeedGivesIdenticalBytesWhateverTheThreadCount) {
  TempDir temp;
  SynthOptions first = small_options(temp.path() / "a");
  first.jobs = 1;
  SynthOptions second = small_options(temp.path() / "b");
  second.jobs = 3;
  dsfs::tools::synthesize(first);
  dsfs::tools::synthesize(second);
  const auto a = read_tree(first.dir);
  EXPECT_EQ(a.size(), 12u);
  EXPECT_EQ(a, read_tree(second.dir));
}

TEST(Synth, DifferentSeedsGiveDifferentImages) {
  TempDir temp;
  dsfs::tools::synthesize(small_options(temp.path() / "a", 1));
  dsfs::tools::synthesize(small_options(temp.path() / "b", 2));
  const auto a = read_tree(temp.path() / "a");
  const auto b = read_tree(temp.path() / "b");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [path, bytes] : a) EXPECT_NE(bytes, b.at(path)) << path;
}

TEST(Synth, ClassesLookDifferentWhenDecoded) {
  // The class palette drives the mean colour: compare the per-class average of the mean RGB.
  constexpr int kClasses = 4, kPerClass = 6;
  std::vector<std::array<double, 3>> class_means;
  for (int c = 0; c < kClasses; ++c) {
    std::array<double, 3> sum{};
    int colour_images = 0;
    for (int i = 0; i < kPerClass; ++i) {
      const Decoded image = decode(dsfs::tools::synth_jpeg(3, c, i));
      if (image.grayscale) continue;
      ++colour_images;
      for (int ch = 0; ch < 3; ++ch) sum[ch] += mean_channel(image, ch);
    }
    ASSERT_GT(colour_images, 0);
    for (auto& s : sum) s /= colour_images;
    class_means.push_back(sum);
  }
  for (int a = 0; a < kClasses; ++a) {
    for (int b = a + 1; b < kClasses; ++b) {
      double distance = 0;
      for (int ch = 0; ch < 3; ++ch) distance += std::abs(class_means[a][ch] - class_means[b][ch]);
      EXPECT_GT(distance, 1.0) << "classes " << a << " and " << b << " have the same colours";
    }
  }
}

TEST(SynthShapes, ResembleImageNet) {
  // Over many images: widths in 200..800, typical 500-pixel side, several aspect ratios,
  // a small share of grayscale (expected 2%: 1..60 of 1000 is far outside chance).
  int grayscale = 0, five_hundred = 0, portrait = 0, landscape = 0, square = 0;
  for (int i = 0; i < 1000; ++i) {
    const ImageShape shape = dsfs::tools::synth_image_shape(11, i % 50, i);
    EXPECT_GE(shape.width, 200);
    EXPECT_LE(shape.width, 800);
    EXPECT_GE(shape.height, 120);
    EXPECT_LE(shape.height, 800);
    grayscale += shape.grayscale;
    five_hundred += std::max(shape.width, shape.height) == 500;
    portrait += shape.height > shape.width;
    landscape += shape.width > shape.height;
    square += shape.width == shape.height;
  }
  EXPECT_GE(grayscale, 1);
  EXPECT_LE(grayscale, 60);
  EXPECT_GT(five_hundred, 400);
  EXPECT_GT(portrait, 100);
  EXPECT_GT(landscape, 500);
  EXPECT_GT(square, 0);
}

TEST(Synth, GrayscaleImagesAreSingleComponentJpegs) {
  // Find grayscale images by their planned shape, then check the encoded files agree.
  int found = 0;
  for (int i = 0; i < 400 && found < 2; ++i) {
    if (!dsfs::tools::synth_image_shape(5, 1, i).grayscale) continue;
    EXPECT_TRUE(decode(dsfs::tools::synth_jpeg(5, 1, i)).grayscale);
    ++found;
  }
  EXPECT_EQ(found, 2) << "no grayscale image among 400";
}

TEST(Synth, MeanFileSizeIsImageNetLike) {
  TempDir temp;
  SynthOptions options;
  options.dir = temp.path() / "sizes";
  options.classes = 6;
  options.per_class = 10;
  options.seed = 123;
  options.jobs = 2;
  const SynthSummary summary = dsfs::tools::synthesize(options);
  ASSERT_EQ(summary.files, 60u);
  const double mean_kb = static_cast<double>(summary.total_bytes) / summary.files / 1e3;
  EXPECT_GT(mean_kb, 60.0);
  EXPECT_LT(mean_kb, 200.0);
  const std::string line = dsfs::tools::format_synth_summary(options, summary);
  EXPECT_NE(line.find("wrote 60 files"), std::string::npos) << line;
  EXPECT_NE(line.find("mean"), std::string::npos) << line;
}

TEST(Synth, RefusesNonEmptyDirectoryUnlessForced) {
  TempDir temp;
  std::ofstream(temp.path() / "existing.txt") << "keep me";
  SynthOptions options = small_options(temp.path());
  EXPECT_THROW(dsfs::tools::synthesize(options), std::invalid_argument);
  EXPECT_FALSE(fs::exists(temp.path() / dsfs::tools::synth_class_dir_name(0)));

  options.force = true;
  EXPECT_EQ(dsfs::tools::synthesize(options).files, 12u);
  EXPECT_TRUE(fs::exists(temp.path() / "existing.txt"));
}

TEST(Synth, AcceptsAnExistingEmptyDirectory) {
  TempDir temp;
  EXPECT_EQ(dsfs::tools::synthesize(small_options(temp.path())).files, 12u);
}

TEST(Synth, RejectsBadOptions) {
  TempDir temp;
  const auto rejects = [&](auto change) {
    SynthOptions options = small_options(temp.path() / "out");
    change(options);
    EXPECT_THROW(dsfs::tools::synthesize(options), std::invalid_argument);
  };
  rejects([](SynthOptions& o) { o.classes = 0; });
  rejects([](SynthOptions& o) { o.per_class = -1; });
  rejects([](SynthOptions& o) { o.jobs = -2; });
  rejects([](SynthOptions& o) { o.quality = 0; });
  rejects([](SynthOptions& o) { o.quality = 101; });
  rejects([](SynthOptions& o) { o.dir.clear(); });
  EXPECT_FALSE(fs::exists(temp.path() / "out")) << "bad options must not create anything";
}

TEST(Synth, ReportsUnwritableDirectory) {
  TempDir temp;
  const fs::path file = temp.path() / "a-file";
  std::ofstream(file) << "not a directory";
  // Under a regular file nothing can be created, even as root.
  SynthOptions options = small_options(file / "sub");
  try {
    dsfs::tools::synthesize(options);
    FAIL() << "expected an error for a directory under a regular file";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("a-file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dsfs::tools::synthesize(small_options(file)), std::invalid_argument);
}

TEST(JpegEncoder, EncodesGivenPixelsAndRejectsMismatchedBuffers) {
  Pixels pixels;
  pixels.shape = {16, 8, false};
  pixels.data.assign(16 * 8 * 3, 200);
  const Decoded decoded = decode(dsfs::tools::encode_jpeg(pixels, 95));
  EXPECT_EQ(decoded.width, 16);
  EXPECT_EQ(decoded.height, 8);
  EXPECT_NEAR(mean_channel(decoded, 0), 200, 2);

  pixels.data.pop_back();
  EXPECT_THROW(dsfs::tools::encode_jpeg(pixels), std::invalid_argument);
  pixels.data.push_back(0);
  EXPECT_THROW(dsfs::tools::encode_jpeg(pixels, 0), std::invalid_argument);
}
