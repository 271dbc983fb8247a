#include "tools/synth.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <turbojpeg.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <fstream>
#include <mutex>
#include <numbers>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace dsfs::tools {
namespace {

// Our own generators (not <random> distributions) so the bytes are the same on every
// standard library.
std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// xoshiro256**: fast enough to draw noise for every pixel.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) {
    for (auto& word : state_) word = splitmix64(seed);
  }

  std::uint64_t next() {
    const std::uint64_t result = std::rotl(state_[1] * 5, 7) * 9;
    const std::uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = std::rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * unit(); }
  // Uniform integer in [lo, hi].
  int integer(int lo, int hi) {
    return lo + static_cast<int>(next() % static_cast<std::uint64_t>(hi - lo + 1));
  }
  bool chance(double probability) { return unit() < probability; }

 private:
  std::array<std::uint64_t, 4> state_{};
};

// Independent streams per (seed, class, image, purpose): hash the tuple through splitmix64.
std::uint64_t stream_key(std::uint64_t seed, std::uint64_t class_index, std::uint64_t image_index,
                         std::uint64_t purpose) {
  std::uint64_t state = seed;
  std::uint64_t key = splitmix64(state);
  for (std::uint64_t part : {class_index, image_index, purpose}) {
    state = key ^ (part * 0xd1b54a32d192ed03ULL);
    key = splitmix64(state);
  }
  return key;
}

constexpr std::uint64_t kShapeStream = 1;
constexpr std::uint64_t kContentStream = 2;
constexpr std::uint64_t kPaletteStream = 3;
constexpr std::uint64_t kNoClass = ~0ULL;

struct Color {
  double r = 0, g = 0, b = 0;
};

Color lerp(const Color& a, const Color& b, double t) {
  return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t};
}

// HSV in [0,1] to RGB in [0,255].
Color from_hsv(double hue, double saturation, double value) {
  hue = (hue - std::floor(hue)) * 6.0;
  const int sector = static_cast<int>(hue) % 6;
  const double f = hue - std::floor(hue);
  const double p = value * (1 - saturation);
  const double q = value * (1 - saturation * f);
  const double t = value * (1 - saturation * (1 - f));
  Color c;
  switch (sector) {
    case 0:
      c = {value, t, p};
      break;
    case 1:
      c = {q, value, p};
      break;
    case 2:
      c = {p, value, t};
      break;
    case 3:
      c = {p, q, value};
      break;
    case 4:
      c = {t, p, value};
      break;
    default:
      c = {value, p, q};
      break;
  }
  return {c.r * 255, c.g * 255, c.b * 255};
}

// A class's look: its dominant hue (golden-ratio spaced so neighbours differ) and a few
// related colours every image of the class draws from.
struct Palette {
  std::array<Color, 4> colors;
};

Palette class_palette(std::uint64_t seed, int class_index) {
  Rng rng(stream_key(seed, static_cast<std::uint64_t>(class_index), kNoClass, kPaletteStream));
  const double base_hue = rng.unit() * 0.1 + class_index * std::numbers::phi;
  Palette palette;
  palette.colors[0] = from_hsv(base_hue, rng.uniform(0.5, 0.9), rng.uniform(0.55, 0.95));
  palette.colors[1] = from_hsv(base_hue + 0.06, rng.uniform(0.3, 0.8), rng.uniform(0.25, 0.6));
  palette.colors[2] = from_hsv(base_hue + 0.5, rng.uniform(0.2, 0.6), rng.uniform(0.4, 0.9));
  palette.colors[3] = from_hsv(base_hue - 0.1, rng.uniform(0.1, 0.4), rng.uniform(0.7, 1.0));
  return palette;
}

Color jitter(const Color& c, Rng& rng, double amount) {
  return {c.r + rng.uniform(-amount, amount), c.g + rng.uniform(-amount, amount),
          c.b + rng.uniform(-amount, amount)};
}

unsigned char to_byte(double value) {
  return static_cast<unsigned char>(std::clamp(std::lround(value), 0L, 255L));
}

// Smooth random field in [-1, 1]: bilinear interpolation of a coarse random grid. Gives
// photo-like texture at a chosen scale, which JPEG cannot squeeze away.
class ValueNoise {
 public:
  ValueNoise(Rng& rng, int width, int height, int cell)
      : cell_(cell), columns_(width / cell + 2), rows_(height / cell + 2) {
    grid_.resize(static_cast<std::size_t>(columns_) * rows_);
    for (auto& v : grid_) v = rng.uniform(-1, 1);
  }

  double at(int x, int y) const {
    const int gx = x / cell_, gy = y / cell_;
    const double fx = static_cast<double>(x % cell_) / cell_;
    const double fy = static_cast<double>(y % cell_) / cell_;
    const double top = lerp1(value(gx, gy), value(gx + 1, gy), fx);
    const double bottom = lerp1(value(gx, gy + 1), value(gx + 1, gy + 1), fx);
    return lerp1(top, bottom, fy);
  }

 private:
  static double lerp1(double a, double b, double t) { return a + (b - a) * t; }
  double value(int gx, int gy) const { return grid_[static_cast<std::size_t>(gy) * columns_ + gx]; }

  int cell_, columns_, rows_;
  std::vector<double> grid_;
};

struct Blob {
  bool ellipse;
  double cx, cy, rx, ry, cos_a, sin_a, alpha;
  Color color;

  bool covers(double x, double y) const {
    const double dx = x - cx, dy = y - cy;
    const double u = (dx * cos_a + dy * sin_a) / rx;
    const double v = (-dx * sin_a + dy * cos_a) / ry;
    return ellipse ? u * u + v * v <= 1 : std::abs(u) <= 1 && std::abs(v) <= 1;
  }
};

void check_quality(int quality) {
  if (quality < 1 || quality > 100) {
    throw std::invalid_argument(fmt::format("JPEG quality {} is out of range 1..100", quality));
  }
}

void validate(const SynthOptions& options) {
  if (options.dir.empty()) throw std::invalid_argument("synth needs an output directory");
  if (options.classes < 1) {
    throw std::invalid_argument(
        fmt::format("--classes must be at least 1 (got {})", options.classes));
  }
  if (options.per_class < 1) {
    throw std::invalid_argument(
        fmt::format("--per-class must be at least 1 (got {})", options.per_class));
  }
  if (options.jobs < 0) {
    throw std::invalid_argument(
        fmt::format("--jobs must be 0 (one per CPU) or more (got {})", options.jobs));
  }
  check_quality(options.quality);
}

// Creates DIR (and its parents) unless it exists; refuses a non-empty one without force.
void prepare_output_dir(const SynthOptions& options) {
  namespace fs = std::filesystem;
  std::error_code error;
  const auto status = fs::status(options.dir, error);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) {
      throw std::invalid_argument(
          fmt::format("{} exists and is not a directory", options.dir.string()));
    }
    const bool empty = fs::is_empty(options.dir, error);
    if (error) {
      throw std::runtime_error(
          fmt::format("cannot read directory {}: {}", options.dir.string(), error.message()));
    }
    if (!empty && !options.force) {
      throw std::invalid_argument(fmt::format(
          "{} is not empty; choose an empty or new directory, or pass --force to write into it",
          options.dir.string()));
    }
  }
  for (int c = 0; c < options.classes; ++c) {
    const auto class_dir = options.dir / synth_class_dir_name(c);
    fs::create_directories(class_dir, error);
    if (error) {
      throw std::runtime_error(
          fmt::format("cannot create directory {}: {}", class_dir.string(), error.message()));
    }
  }
}

void write_file(const std::filesystem::path& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) {
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
  }
  if (!out) {
    throw std::runtime_error(
        fmt::format("cannot write {}: {}", path.string(), std::generic_category().message(errno)));
  }
}

}  // namespace

ImageShape synth_image_shape(std::uint64_t seed, int class_index, std::uint64_t image_index) {
  Rng rng(stream_key(seed, static_cast<std::uint64_t>(class_index), image_index, kShapeStream));
  // Short side over long side, weighted roughly like ImageNet: mostly 4:3 landscape.
  struct Aspect {
    double short_over_long;
    bool portrait;
    double weight;
  };
  static constexpr std::array<Aspect, 7> kAspects{{
      {3.0 / 4, false, 0.42},
      {2.0 / 3, false, 0.15},
      {3.0 / 4, true, 0.14},
      {1.0, false, 0.10},
      {9.0 / 16, false, 0.08},
      {2.0 / 3, true, 0.06},
      {4.0 / 5, false, 0.05},
  }};
  double pick = rng.unit();
  Aspect aspect = kAspects.back();
  for (const auto& candidate : kAspects) {
    if (pick < candidate.weight) {
      aspect = candidate;
      break;
    }
    pick -= candidate.weight;
  }
  // Most ImageNet photos have a 500-pixel long side; the rest spread between ~270 and 800.
  const int long_side = rng.chance(0.65) ? 500 : rng.integer(270, 800);
  // Many photos are cropped a little off the exact ratio (500x333, 500x366, ...).
  const double crop = rng.chance(0.4) ? rng.uniform(0.94, 1.0) : 1.0;
  const int short_side = static_cast<int>(std::lround(long_side * aspect.short_over_long * crop));
  ImageShape shape;
  shape.width = std::clamp(aspect.portrait ? short_side : long_side, 200, 800);
  shape.height = std::clamp(aspect.portrait ? long_side : short_side, 120, 800);
  shape.grayscale = rng.chance(0.02);
  return shape;
}

Pixels synth_image_pixels(std::uint64_t seed, int class_index, std::uint64_t image_index) {
  const ImageShape shape = synth_image_shape(seed, class_index, image_index);
  const Palette palette = class_palette(seed, class_index);
  Rng rng(stream_key(seed, static_cast<std::uint64_t>(class_index), image_index, kContentStream));
  const int width = shape.width, height = shape.height;

  // Background: a gradient between two class colours at a random angle, plus a slow wave.
  const Color from = jitter(palette.colors[rng.integer(0, 3)], rng, 25);
  const Color to = jitter(palette.colors[rng.integer(0, 3)], rng, 25);
  const double angle = rng.uniform(0, 2 * std::numbers::pi);
  const double gx = std::cos(angle) / width, gy = std::sin(angle) / height;
  const double wave_amplitude = rng.uniform(5, 20);
  const double wave_fx = rng.uniform(0.005, 0.05), wave_fy = rng.uniform(0.005, 0.05);
  const double wave_phase = rng.uniform(0, 2 * std::numbers::pi);

  // Foreground: a handful of class-coloured ellipses and rotated rectangles.
  std::vector<Blob> blobs(static_cast<std::size_t>(rng.integer(3, 9)));
  for (auto& blob : blobs) {
    const double rotation = rng.uniform(0, std::numbers::pi);
    blob = Blob{rng.chance(0.6),
                rng.uniform(0, width),
                rng.uniform(0, height),
                rng.uniform(0.05, 0.35) * width,
                rng.uniform(0.05, 0.35) * height,
                std::cos(rotation),
                std::sin(rotation),
                rng.uniform(0.5, 1.0),
                jitter(palette.colors[rng.integer(0, 3)], rng, 40)};
  }

  // Texture at two scales and per-pixel grain; their strengths vary per image, which spreads
  // file sizes the way scene detail does in photographs.
  const ValueNoise coarse(rng, width, height, rng.integer(12, 40));
  const ValueNoise fine(rng, width, height, rng.integer(2, 4));
  const double coarse_amplitude = rng.uniform(10, 35);
  const double fine_amplitude = rng.uniform(15, 50);
  const double grain = rng.uniform(12, 29);

  Pixels pixels;
  pixels.shape = shape;
  const int channels = shape.grayscale ? 1 : 3;
  pixels.data.resize(static_cast<std::size_t>(width) * height * channels);
  unsigned char* out = pixels.data.data();
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double t = std::clamp(0.5 + (x - width / 2.0) * gx + (y - height / 2.0) * gy, 0.0, 1.0);
      Color c = lerp(from, to, t);
      for (const auto& blob : blobs) {
        if (blob.covers(x, y)) c = lerp(c, blob.color, blob.alpha);
      }
      const double texture = wave_amplitude * std::sin(wave_fx * x + wave_fy * y + wave_phase) +
                             coarse_amplitude * coarse.at(x, y) + fine_amplitude * fine.at(x, y);
      // Triangular grain from two random bytes: cheap and close enough to sensor noise.
      const std::uint64_t bits = rng.next();
      const auto triangular = [&bits](int shift) {
        return (static_cast<double>((bits >> shift) & 0xff) + ((bits >> (shift + 8)) & 0xff) -
                255.0) /
               255.0;
      };
      const double luma_noise = grain * 2.45 * triangular(0);
      if (channels == 1) {
        *out++ = to_byte(0.299 * c.r + 0.587 * c.g + 0.114 * c.b + texture + luma_noise);
      } else {
        const double shift = texture + luma_noise;
        *out++ = to_byte(c.r + shift + grain * 0.8 * triangular(16));
        *out++ = to_byte(c.g + shift + grain * 0.8 * triangular(32));
        *out++ = to_byte(c.b + shift + grain * 0.8 * triangular(48) * 0.5);
      }
    }
  }
  return pixels;
}

void JpegEncoder::HandleDeleter::operator()(void* handle) const {
  tjDestroy(handle);
}

JpegEncoder::JpegEncoder() : handle_(tjInitCompress()) {
  if (!handle_) {
    throw std::runtime_error(
        fmt::format("cannot initialize the JPEG encoder: {}", tjGetErrorStr2(nullptr)));
  }
}

JpegEncoder::~JpegEncoder() = default;

std::vector<unsigned char> JpegEncoder::encode(const Pixels& pixels, int quality) {
  check_quality(quality);
  const ImageShape& shape = pixels.shape;
  const int channels = shape.grayscale ? 1 : 3;
  if (shape.width < 1 || shape.height < 1 ||
      pixels.data.size() != static_cast<std::size_t>(shape.width) * shape.height * channels) {
    throw std::invalid_argument(
        fmt::format("pixel buffer of {} bytes does not match a {}x{} {} image", pixels.data.size(),
                    shape.width, shape.height, shape.grayscale ? "grayscale" : "RGB"));
  }
  const int subsampling = shape.grayscale ? TJSAMP_GRAY : TJSAMP_420;
  // Compress into a buffer sized for the worst case so TurboJPEG never reallocates it.
  std::vector<unsigned char> jpeg(tjBufSize(shape.width, shape.height, subsampling));
  unsigned char* destination = jpeg.data();
  unsigned long size = jpeg.size();
  if (tjCompress2(handle_.get(), pixels.data.data(), shape.width, 0, shape.height,
                  shape.grayscale ? TJPF_GRAY : TJPF_RGB, &destination, &size, subsampling, quality,
                  TJFLAG_NOREALLOC) != 0) {
    throw std::runtime_error(
        fmt::format("JPEG encoding failed: {}", tjGetErrorStr2(handle_.get())));
  }
  jpeg.resize(size);
  return jpeg;
}

std::vector<unsigned char> encode_jpeg(const Pixels& pixels, int quality) {
  JpegEncoder encoder;
  return encoder.encode(pixels, quality);
}

std::vector<unsigned char> synth_jpeg(std::uint64_t seed, int class_index,
                                      std::uint64_t image_index, int quality) {
  return encode_jpeg(synth_image_pixels(seed, class_index, image_index), quality);
}

std::string synth_class_dir_name(int class_index) {
  return fmt::format("class_{:04d}", class_index);
}

std::string synth_image_file_name(std::uint64_t image_index) {
  return fmt::format("img_{:06d}.JPEG", image_index);
}

SynthSummary synthesize(const SynthOptions& options) {
  validate(options);
  const auto started = std::chrono::steady_clock::now();
  prepare_output_dir(options);

  const std::uint64_t total =
      static_cast<std::uint64_t>(options.classes) * static_cast<std::uint64_t>(options.per_class);
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const auto jobs = static_cast<unsigned>(std::min<std::uint64_t>(
      options.jobs > 0 ? static_cast<unsigned>(options.jobs) : hardware, total));

  std::atomic<std::uint64_t> next_index{0};
  std::atomic<std::uint64_t> files{0}, grayscale_files{0}, total_bytes{0};
  std::atomic<bool> failed{false};
  std::exception_ptr first_error;
  std::mutex mutex;  // guards first_error and running
  std::condition_variable finished;
  unsigned running = jobs;

  const auto work = [&] {
    try {
      JpegEncoder encoder;
      for (std::uint64_t k = next_index++; k < total && !failed; k = next_index++) {
        const int class_index = static_cast<int>(k / options.per_class);
        const std::uint64_t image_index = k % options.per_class;
        const Pixels pixels = synth_image_pixels(options.seed, class_index, image_index);
        const auto jpeg = encoder.encode(pixels, options.quality);
        write_file(
            options.dir / synth_class_dir_name(class_index) / synth_image_file_name(image_index),
            jpeg);
        total_bytes += jpeg.size();
        if (pixels.shape.grayscale) ++grayscale_files;
        ++files;
      }
    } catch (...) {
      std::lock_guard lock(mutex);
      if (!first_error) first_error = std::current_exception();
      failed = true;
    }
    std::lock_guard lock(mutex);
    --running;
    finished.notify_all();
  };

  {
    std::vector<std::jthread> workers;
    workers.reserve(jobs);
    for (unsigned i = 0; i < jobs; ++i) workers.emplace_back(work);
    // Long runs report progress now and then; short ones stay quiet.
    std::unique_lock lock(mutex);
    while (!finished.wait_for(lock, std::chrono::seconds(5), [&] { return running == 0; })) {
      spdlog::info("synth: {}/{} files, {:.1f} MB", files.load(), total, total_bytes.load() / 1e6);
    }
  }
  if (first_error) std::rethrow_exception(first_error);

  SynthSummary summary;
  summary.files = files;
  summary.grayscale_files = grayscale_files;
  summary.total_bytes = total_bytes;
  summary.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return summary;
}

std::string format_synth_summary(const SynthOptions& options, const SynthSummary& summary) {
  const double mean_kb =
      summary.files ? static_cast<double>(summary.total_bytes) / summary.files / 1e3 : 0.0;
  return fmt::format(
      "wrote {} files ({} classes x {}) to {}: {:.1f} MB, mean {:.1f} KB, {} grayscale, {:.2f} s",
      summary.files, options.classes, options.per_class, options.dir.string(),
      summary.total_bytes / 1e6, mean_kb, summary.grayscale_files, summary.seconds);
}

}  // namespace dsfs::tools
