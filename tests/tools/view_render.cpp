// view_render SPEC OUT_DIR FILE...: writes OUT_DIR/<file name>.npy for each input, through the
// same decode and transform as MOUNT/.views, so tests can compare it with torchvision.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "cuda/backend.h"
#include "cuda/image_decode.h"
#include "cuda/npy.h"
#include "cuda/view_spec.h"

namespace {

std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(fmt::format("cannot open {}", path.string()));
  std::vector<std::byte> data(std::filesystem::file_size(path));
  in.read(reinterpret_cast<char*>(data.data()), static_cast<std::streamsize>(data.size()));
  if (!in) throw std::runtime_error(fmt::format("cannot read {}", path.string()));
  return data;
}

void write_npy(const std::filesystem::path& path, const std::string& header,
               const std::vector<std::byte>& tensor) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(tensor.data()),
            static_cast<std::streamsize>(tensor.size()));
  if (!out) throw std::runtime_error(fmt::format("cannot write {}", path.string()));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Renders images through a dsfs view spec into .npy files (a test driver)."};
  std::string spec_text;
  std::filesystem::path out_dir;
  std::vector<std::filesystem::path> inputs;
  std::string backend_text = "cpu";
  int repeat = 0;
  app.add_option("spec", spec_text, "view SPEC (e.g. resize=256,crop=224,dtype=uint8) or preset")
      ->required();
  app.add_option("out_dir", out_dir, "directory for OUT_DIR/<file name>.npy (created if missing)")
      ->required();
  app.add_option("files", inputs, "source images (JPEG or PNG)")->required();
  app.add_option("--backend", backend_text, "view backend: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--repeat", repeat,
                 "also decode+transform every file N more times on this one thread and print "
                 "images/s to stdout (0: no timing)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  dsfs::view::ViewSpec spec;
  std::unique_ptr<dsfs::view::Backend> backend;
  try {
    spec = dsfs::view::parse_view_spec(spec_text);
    backend = dsfs::view::make_backend(dsfs::view::parse_backend_kind(backend_text));
    std::filesystem::create_directories(out_dir);
  } catch (const std::exception& e) {
    fmt::print(stderr, "view_render: {}\n", e.what());
    return 2;
  }

  const std::string header = dsfs::view::npy_header(spec);
  std::vector<std::byte> tensor(spec.tensor_bytes());
  int failures = 0;
  std::vector<std::vector<std::byte>> encoded_inputs;
  for (const auto& input : inputs) {
    try {
      encoded_inputs.push_back(read_file(input));
      const auto image = dsfs::view::decode_image(encoded_inputs.back());
      const dsfs::view::RgbImage* images[] = {&image};
      const std::span<std::byte> outputs[] = {tensor};
      backend->transform(spec, images, outputs);
      write_npy(out_dir / (input.filename().string() + ".npy"), header, tensor);
    } catch (const std::exception& e) {
      fmt::print(stderr, "view_render: {}: {}\n", input.string(), e.what());
      ++failures;
    }
  }
  if (failures != 0) return 1;

  if (repeat > 0) {
    const auto start = std::chrono::steady_clock::now();
    for (int round = 0; round < repeat; ++round) {
      for (const auto& encoded : encoded_inputs) {
        const auto image = dsfs::view::decode_image(encoded);
        const dsfs::view::RgbImage* images[] = {&image};
        const std::span<std::byte> outputs[] = {tensor};
        backend->transform(spec, images, outputs);
      }
    }
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    const double count = static_cast<double>(repeat) * static_cast<double>(encoded_inputs.size());
    fmt::print("{} {:.0f} images/s ({} decode+transform in {:.3f} s, one thread)\n",
               backend->name(), count / elapsed.count(), count, elapsed.count());
  }
  return 0;
}
