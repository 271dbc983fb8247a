#pragma once
// Synthetic ImageNet-like ImageFolder trees of real JPEGs, deterministic for a seed.
//
// Layout: DIR/class_XXXX/img_XXXXXX.JPEG. Every image depends only on (seed, class index,
// index within the class), never on thread count or on how many images are written, so two
// runs with the same seed give byte-identical trees and a larger --per-class extends a
// smaller one.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace dsfs::tools {

struct SynthOptions {
  std::filesystem::path dir;
  int classes = 10;
  int per_class = 100;
  std::uint64_t seed = 0;
  int jobs = 0;        // writer threads; 0 means one per hardware thread
  int quality = 90;    // JPEG quality, 1..100
  bool force = false;  // write into a DIR that already has entries
};

struct SynthSummary {
  std::uint64_t files = 0;
  std::uint64_t grayscale_files = 0;
  std::uint64_t total_bytes = 0;
  double seconds = 0;
};

// Size and colour model of one synthetic image.
struct ImageShape {
  int width = 0;
  int height = 0;
  bool grayscale = false;
};

// Raw pixels, rows packed without padding: 3 bytes per pixel (RGB) or 1 (gray).
struct Pixels {
  ImageShape shape;
  std::vector<unsigned char> data;
};

// The shape of image `image_index` of class `class_index`: ImageNet-like resolutions
// (around 500x375, varied aspect ratios, width 200..800) and about 2% grayscale.
ImageShape synth_image_shape(std::uint64_t seed, int class_index, std::uint64_t image_index);

// Renders that image: a class-coloured gradient, shapes and noisy texture, so that it
// compresses like a photograph and images of different classes decode differently.
Pixels synth_image_pixels(std::uint64_t seed, int class_index, std::uint64_t image_index);

// One TurboJPEG compressor, reusable across images by one thread at a time.
class JpegEncoder {
 public:
  JpegEncoder();
  ~JpegEncoder();
  JpegEncoder(const JpegEncoder&) = delete;
  JpegEncoder& operator=(const JpegEncoder&) = delete;

  // Baseline JPEG of `pixels` (4:2:0 for colour, one component for gray).
  std::vector<unsigned char> encode(const Pixels& pixels, int quality);

 private:
  struct HandleDeleter {
    void operator()(void* handle) const;
  };
  std::unique_ptr<void, HandleDeleter> handle_;
};

// Convenience: encodes packed pixels with a one-off encoder. Throws std::invalid_argument
// when the buffer does not match the shape or quality is out of 1..100.
std::vector<unsigned char> encode_jpeg(const Pixels& pixels, int quality = 90);

// Renders and encodes one synthetic image; byte-identical for the same arguments.
std::vector<unsigned char> synth_jpeg(std::uint64_t seed, int class_index,
                                      std::uint64_t image_index, int quality = 90);

std::string synth_class_dir_name(int class_index);             // "class_0007"
std::string synth_image_file_name(std::uint64_t image_index);  // "img_000042.JPEG"

// Writes the whole tree with `jobs` threads, creating DIR if missing. Throws
// std::invalid_argument for bad options (counts, quality, non-empty DIR without force) and
// std::runtime_error when DIR or a file cannot be written.
SynthSummary synthesize(const SynthOptions& options);

// "wrote 30 files (3 classes x 10) to DIR: 3.3 MB, mean 110.2 KB, 1 grayscale, 0.42 s"
std::string format_synth_summary(const SynthOptions& options, const SynthSummary& summary);

}  // namespace dsfs::tools
