// Images/s of the view pipeline (decode on CPU threads, then transform: resize, crop, normalize,
// cast, layout) with the CPU backend and the CUDA backend on the same JPEGs, and where the time
// goes: decode versus transform per thread, and for CUDA the host packing, copies and kernels
// (CUDA events). Without a GPU the CUDA side is reported unavailable, with the reason.
//
//   dsfs_bench_view_backend DIR [--threads N] [--batch B] [--spec imagenet-eval] [--json FILE]
#include <fmt/core.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cuda/backend.h"
#include "cuda/cuda_info.h"
#include "cuda/image_decode.h"
#include "cuda/view_spec.h"
#ifdef DSFS_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace {

using dsfs::view::Backend;
using dsfs::view::RgbImage;
using dsfs::view::ViewSpec;
using Clock = std::chrono::steady_clock;

struct Options {
  std::filesystem::path dir;
  int threads = 0;
  int batch = 32;
  std::string spec = "imagenet-eval";
  std::vector<std::string> backends{"cpu", "cuda"};
  int rounds = 3;
  std::size_t limit = 0;
  std::size_t transform_only_images = 256;
  int transform_only_passes = 4;
  std::filesystem::path json;
};

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

bool is_image_file(const std::filesystem::path& path) {
  std::string extension = path.extension().string();
  std::transform(extension.begin(), extension.end(), extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return extension == ".jpeg" || extension == ".jpg" || extension == ".png";
}

std::vector<std::vector<std::byte>> read_images(const Options& options) {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(options.dir)) {
    if (entry.is_regular_file() && is_image_file(entry.path())) paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  if (options.limit != 0 && paths.size() > options.limit) paths.resize(options.limit);
  if (paths.empty()) {
    throw std::runtime_error(
        fmt::format("no .JPEG/.jpg/.png files under {}; make some with `dsfs synth DIR`",
                    options.dir.string()));
  }
  std::vector<std::vector<std::byte>> files;
  files.reserve(paths.size());
  for (const auto& path : paths) {
    std::ifstream in(path, std::ios::binary);
    std::vector<std::byte> bytes(std::filesystem::file_size(path));
    in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    if (!in) throw std::runtime_error(fmt::format("cannot read {}", path.string()));
    files.push_back(std::move(bytes));
  }
  return files;
}

// Per-thread sums of one round, added up.
struct RoundResult {
  double wall_seconds = 0;
  double decode_seconds = 0;
  double transform_seconds = 0;
  std::uint64_t images = 0;
  std::uint64_t decode_failures = 0;
};

// Every thread takes the next `batch` files, decodes them, then transforms the batch.
RoundResult decode_and_transform(Backend& backend, const ViewSpec& spec,
                                 std::span<const std::vector<std::byte>> files, int threads,
                                 int batch) {
  std::atomic<std::size_t> next{0};
  std::vector<RoundResult> per_thread(static_cast<std::size_t>(threads));
  const auto started = Clock::now();
  std::vector<std::jthread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      RoundResult& mine = per_thread[static_cast<std::size_t>(t)];
      std::vector<RgbImage> decoded;
      std::vector<std::byte> tensors;
      while (true) {
        const std::size_t begin = next.fetch_add(static_cast<std::size_t>(batch));
        if (begin >= files.size()) break;
        const std::size_t end = std::min(files.size(), begin + static_cast<std::size_t>(batch));
        auto phase = Clock::now();
        decoded.clear();
        for (std::size_t i = begin; i < end; ++i) {
          try {
            decoded.push_back(dsfs::view::decode_image(files[i]));
          } catch (const dsfs::view::DecodeError&) {
            ++mine.decode_failures;
          }
        }
        mine.decode_seconds += seconds_since(phase);
        phase = Clock::now();
        tensors.resize(decoded.size() * spec.tensor_bytes());
        std::vector<const RgbImage*> inputs;
        std::vector<std::span<std::byte>> outputs;
        for (std::size_t i = 0; i < decoded.size(); ++i) {
          inputs.push_back(&decoded[i]);
          outputs.emplace_back(tensors.data() + i * spec.tensor_bytes(), spec.tensor_bytes());
        }
        backend.transform(spec, inputs, outputs);
        mine.transform_seconds += seconds_since(phase);
        mine.images += decoded.size();
      }
    });
  }
  workers.clear();  // joins
  RoundResult total;
  total.wall_seconds = seconds_since(started);
  for (const RoundResult& part : per_thread) {
    total.decode_seconds += part.decode_seconds;
    total.transform_seconds += part.transform_seconds;
    total.images += part.images;
    total.decode_failures += part.decode_failures;
  }
  return total;
}

// Transform alone, on images decoded beforehand: `passes` times over them, all threads.
double transform_only_images_per_second(Backend& backend, const ViewSpec& spec,
                                        const std::vector<RgbImage>& images, int threads, int batch,
                                        int passes) {
  const std::size_t total = images.size() * static_cast<std::size_t>(passes);
  std::atomic<std::size_t> next{0};
  const auto started = Clock::now();
  {
    std::vector<std::jthread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        std::vector<std::byte> tensors(static_cast<std::size_t>(batch) * spec.tensor_bytes());
        while (true) {
          const std::size_t begin = next.fetch_add(static_cast<std::size_t>(batch));
          if (begin >= total) break;
          const std::size_t end = std::min(total, begin + static_cast<std::size_t>(batch));
          std::vector<const RgbImage*> inputs;
          std::vector<std::span<std::byte>> outputs;
          for (std::size_t i = begin; i < end; ++i) {
            inputs.push_back(&images[i % images.size()]);
            outputs.emplace_back(tensors.data() + (i - begin) * spec.tensor_bytes(),
                                 spec.tensor_bytes());
          }
          backend.transform(spec, inputs, outputs);
        }
      });
    }
  }
  return static_cast<double>(total) / seconds_since(started);
}

nlohmann::json stage_times_json(const dsfs::view::CudaStageTimes& times) {
  const double images = static_cast<double>(std::max<std::uint64_t>(times.images, 1));
  auto per_image_us = [&](double seconds) { return seconds / images * 1e6; };
  return {
      {"images", times.images},
      {"calls", times.calls},
      {"launches", times.launches},
      {"seconds",
       {{"plan", times.plan_seconds},
        {"wait_for_stream", times.wait_seconds},
        {"pack", times.pack_seconds},
        {"upload", times.upload_seconds},
        {"kernels", times.kernel_seconds},
        {"download", times.download_seconds},
        {"unpack", times.unpack_seconds}}},
      {"us_per_image",
       {{"plan", per_image_us(times.plan_seconds)},
        {"wait_for_stream", per_image_us(times.wait_seconds)},
        {"pack", per_image_us(times.pack_seconds)},
        {"upload", per_image_us(times.upload_seconds)},
        {"kernels", per_image_us(times.kernel_seconds)},
        {"download", per_image_us(times.download_seconds)},
        {"unpack", per_image_us(times.unpack_seconds)}}},
      {"upload_bytes_per_image", static_cast<double>(times.upload_bytes) / images},
      {"download_bytes_per_image", static_cast<double>(times.download_bytes) / images},
      {"upload_GB_per_s", times.upload_seconds > 0
                              ? static_cast<double>(times.upload_bytes) / times.upload_seconds / 1e9
                              : 0.0},
  };
}

dsfs::view::CudaStageTimes difference(const dsfs::view::CudaStageTimes& after,
                                      const dsfs::view::CudaStageTimes& before) {
  dsfs::view::CudaStageTimes d;
  d.calls = after.calls - before.calls;
  d.launches = after.launches - before.launches;
  d.images = after.images - before.images;
  d.plan_seconds = after.plan_seconds - before.plan_seconds;
  d.wait_seconds = after.wait_seconds - before.wait_seconds;
  d.pack_seconds = after.pack_seconds - before.pack_seconds;
  d.upload_seconds = after.upload_seconds - before.upload_seconds;
  d.kernel_seconds = after.kernel_seconds - before.kernel_seconds;
  d.download_seconds = after.download_seconds - before.download_seconds;
  d.unpack_seconds = after.unpack_seconds - before.unpack_seconds;
  d.upload_bytes = after.upload_bytes - before.upload_bytes;
  d.download_bytes = after.download_bytes - before.download_bytes;
  return d;
}

std::unique_ptr<Backend> make_named_backend(const std::string& name, std::string& why) {
  if (name == "cpu") return dsfs::view::make_cpu_backend();
#ifdef DSFS_HAVE_CUDA
  return dsfs::view::make_cuda_backend(why);
#else
  why = "this build has no CUDA (nvcc not found, or DSFS_CUDA=OFF, at configure time)";
  return nullptr;
#endif
}

nlohmann::json run_backend(const std::string& name, const Options& options, const ViewSpec& spec,
                           const std::vector<std::vector<std::byte>>& files,
                           const std::vector<RgbImage>& predecoded) {
  std::string why;
  const std::unique_ptr<Backend> backend = make_named_backend(name, why);
  if (!backend) {
    fmt::print("{}: unavailable: {}\n", name, why);
    return {{"available", false}, {"reason", why}};
  }
  // Warm-up (CUDA context, buffers, plan caches); not counted.
  const std::span<const std::vector<std::byte>> all_files(files);
  decode_and_transform(
      *backend, spec,
      all_files.first(
          std::min(files.size(), static_cast<std::size_t>(options.batch * options.threads))),
      options.threads, options.batch);

  const auto info_before = dsfs::view::cuda_backend_info(*backend);
  std::vector<double> rates;
  nlohmann::json rounds = nlohmann::json::array();
  RoundResult sums;
  for (int round = 0; round < options.rounds; ++round) {
    const RoundResult result =
        decode_and_transform(*backend, spec, files, options.threads, options.batch);
    const double rate = static_cast<double>(result.images) / result.wall_seconds;
    rates.push_back(rate);
    rounds.push_back({{"images", result.images},
                      {"wall_seconds", result.wall_seconds},
                      {"images_per_s", rate},
                      {"decode_thread_seconds", result.decode_seconds},
                      {"transform_thread_seconds", result.transform_seconds},
                      {"decode_failures", result.decode_failures}});
    sums.decode_seconds += result.decode_seconds;
    sums.transform_seconds += result.transform_seconds;
    sums.images += result.images;
    fmt::print("{}: round {}: {:.0f} images/s ({} images, {:.2f} s)\n", name, round + 1, rate,
               result.images, result.wall_seconds);
  }
  const auto info_after = dsfs::view::cuda_backend_info(*backend);

  const double images = static_cast<double>(std::max<std::uint64_t>(sums.images, 1));
  nlohmann::json report{
      {"available", true},
      {"images_per_s_median", median(rates)},
      {"rounds", rounds},
      {"thread_ms_per_image",
       {{"decode", sums.decode_seconds / images * 1e3},
        {"transform", sums.transform_seconds / images * 1e3}}},
      {"decode_share", sums.decode_seconds / (sums.decode_seconds + sums.transform_seconds)},
  };
  if (info_before && info_after) {
    report["device"] = info_after->device;
    report["cuda_stages"] = stage_times_json(difference(info_after->times, info_before->times));
  }

  if (!predecoded.empty()) {
    const auto before = dsfs::view::cuda_backend_info(*backend);
    const double rate = transform_only_images_per_second(
        *backend, spec, predecoded, options.threads, options.batch, options.transform_only_passes);
    report["transform_only_images_per_s"] = rate;
    if (const auto after = dsfs::view::cuda_backend_info(*backend); before && after) {
      report["transform_only_cuda_stages"] =
          stage_times_json(difference(after->times, before->times));
    }
    fmt::print("{}: transform only (pre-decoded): {:.0f} images/s\n", name, rate);
  }
  fmt::print(
      "{}: median {:.0f} images/s; per image, thread time: decode {:.2f} ms, transform "
      "{:.2f} ms\n",
      name, median(rates), sums.decode_seconds / images * 1e3,
      sums.transform_seconds / images * 1e3);
  return report;
}

// CUDA against CPU on the same decoded images, tensor by tensor: how many are byte-identical and
// the largest element difference (in the output's units). Null when either backend is missing.
nlohmann::json compare_backends(const ViewSpec& spec, const std::vector<RgbImage>& images) {
  std::string why;
  const auto cpu = make_named_backend("cpu", why);
  const auto cuda = make_named_backend("cuda", why);
  if (!cpu || !cuda || images.empty()) return nullptr;
  const std::size_t bytes = spec.tensor_bytes();
  auto tensors_of = [&](Backend& backend) {
    std::vector<std::byte> tensors(images.size() * bytes);
    std::vector<const RgbImage*> inputs;
    std::vector<std::span<std::byte>> outputs;
    for (std::size_t i = 0; i < images.size(); ++i) {
      inputs.push_back(&images[i]);
      outputs.emplace_back(tensors.data() + i * bytes, bytes);
    }
    backend.transform(spec, inputs, outputs);
    return tensors;
  };
  const std::vector<std::byte> on_cpu = tensors_of(*cpu);
  const std::vector<std::byte> on_gpu = tensors_of(*cuda);
  std::size_t identical = 0;
  double worst = 0;
  for (std::size_t i = 0; i < images.size(); ++i) {
    const std::byte* a = on_cpu.data() + i * bytes;
    const std::byte* b = on_gpu.data() + i * bytes;
    if (std::memcmp(a, b, bytes) == 0) {
      ++identical;
      continue;
    }
    if (spec.dtype == dsfs::view::DType::kFloat32) {
      for (std::size_t k = 0; k + 4 <= bytes; k += 4) {
        float x, y;
        std::memcpy(&x, a + k, 4);
        std::memcpy(&y, b + k, 4);
        worst = std::max(worst, static_cast<double>(std::fabs(x - y)));
      }
    } else if (spec.dtype == dsfs::view::DType::kUint8) {
      for (std::size_t k = 0; k < bytes; ++k) {
        worst = std::max(worst, std::fabs(static_cast<double>(a[k]) - static_cast<double>(b[k])));
      }
    } else {
      worst = -1;  // fp16: counted as differing, no magnitude
    }
  }
  fmt::print("cuda vs cpu, {}: {} of {} tensors byte-identical, max element difference {:g}\n",
             spec.canonical(), identical, images.size(), worst);
  return {{"spec", spec.canonical()},
          {"images", images.size()},
          {"byte_identical", identical},
          {"max_element_difference", worst}};
}

int run(const Options& options) {
  const ViewSpec spec = dsfs::view::parse_view_spec(options.spec);
  const std::vector<std::vector<std::byte>> files = read_images(options);
  std::uint64_t total_bytes = 0;
  for (const auto& file : files) total_bytes += file.size();
  fmt::print("{} images ({:.1f} MB) from {}, {} threads, batch {}, spec {}\n", files.size(),
             static_cast<double>(total_bytes) / 1e6, options.dir.string(), options.threads,
             options.batch, spec.canonical());

  std::vector<RgbImage> predecoded;
  for (std::size_t i = 0; i < std::min(options.transform_only_images, files.size()); ++i) {
    try {
      predecoded.push_back(dsfs::view::decode_image(files[i]));
    } catch (const dsfs::view::DecodeError&) {
    }
  }

  nlohmann::json report{
      {"benchmark", "view_backend"},
      {"spec", spec.canonical()},
      {"images", files.size()},
      {"mean_file_bytes", static_cast<double>(total_bytes) / static_cast<double>(files.size())},
      {"threads", options.threads},
      {"hardware_threads", std::thread::hardware_concurrency()},
      {"batch", options.batch},
      {"rounds", options.rounds},
      {"transform_only_images", predecoded.size()},
      {"transform_only_passes", options.transform_only_passes},
  };
  for (const std::string& name : options.backends) {
    report["backends"][name] = run_backend(name, options, spec, files, predecoded);
  }
  for (const std::string& text :
       {options.spec, std::string("imagenet-eval-fp16"), std::string("imagenet-eval-uint8")}) {
    nlohmann::json compared = compare_backends(dsfs::view::parse_view_spec(text), predecoded);
    if (!compared.is_null()) report["cuda_vs_cpu_bytes"].push_back(std::move(compared));
  }
  const auto& backends = report["backends"];
  if (backends.contains("cpu") && backends.contains("cuda") &&
      backends["cpu"]["available"].get<bool>() && backends["cuda"]["available"].get<bool>()) {
    const double end_to_end = backends["cuda"]["images_per_s_median"].get<double>() /
                              backends["cpu"]["images_per_s_median"].get<double>();
    report["cuda_over_cpu"]["decode_and_transform"] = end_to_end;
    fmt::print("cuda/cpu, decode + transform: {:.2f}x\n", end_to_end);
    if (backends["cpu"].contains("transform_only_images_per_s")) {
      const double transform_only = backends["cuda"]["transform_only_images_per_s"].get<double>() /
                                    backends["cpu"]["transform_only_images_per_s"].get<double>();
      report["cuda_over_cpu"]["transform_only"] = transform_only;
      fmt::print("cuda/cpu, transform only: {:.2f}x\n", transform_only);
    }
  }
  if (!options.json.empty()) {
    std::ofstream out(options.json);
    out << report.dump(2) << '\n';
    if (!out) throw std::runtime_error(fmt::format("cannot write {}", options.json.string()));
    fmt::print("wrote {}\n", options.json.string());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Images/s of decode + view transform with the CPU and the CUDA backend on a directory of "
      "JPEGs (make one with `dsfs synth DIR`), and where the time goes. Without a GPU the CUDA "
      "backend is reported unavailable."};
  Options options;
  app.add_option("DIR", options.dir, "Directory searched recursively for .JPEG/.jpg/.png files")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--threads,-t", options.threads,
                 "Decode threads, each transforming its own batches (0: one per hardware thread)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1024));
  app.add_option("--batch,-b", options.batch, "Images per transform call")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--spec", options.spec, "View SPEC or preset")->capture_default_str();
  app.add_option("--backends", options.backends, "Backends to measure, in order: cpu, cuda")
      ->delimiter(',')
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--rounds", options.rounds, "Timed passes over all images per backend (median)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  app.add_option("--limit", options.limit, "Use at most this many images (0: all)")
      ->capture_default_str();
  app.add_option("--transform-only-images", options.transform_only_images,
                 "Images decoded once for the transform-only measurement (0: skip it)")
      ->capture_default_str();
  app.add_option("--transform-only-passes", options.transform_only_passes,
                 "Passes over those images in the transform-only measurement")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("--json", options.json, "Write the results as JSON to this file");
  CLI11_PARSE(app, argc, argv);
  if (options.threads == 0) {
    options.threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  }
  try {
    return run(options);
  } catch (const std::exception& error) {
    std::cerr << "dsfs_bench_view_backend: " << error.what() << '\n';
    return 1;
  }
}
