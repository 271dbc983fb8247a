// Writes a synthetic ImageNet-shaped dataset of tiny objects straight into Redis (no files on
// disk) and reports how long the catalogue takes to build, encode, publish and decode, and how
// many bytes it costs in memory. bench/catalog_scale.py then times a real mount of it.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "src/catalog/dataset.h"
#include "src/catalog/manifest.h"
#include "src/store/client.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Publish a synthetic N-file dataset of tiny objects and time its catalogue"};
  std::string redis_url;
  std::string dataset = "scale";
  uint64_t files = 1'281'167;
  uint32_t classes = 1000;
  app.add_option("--redis", redis_url, "redis:// or unix:// URL")->required();
  app.add_option("--dataset", dataset);
  app.add_option("--files", files, "number of files (ImageNet train: 1281167)");
  app.add_option("--classes", classes);
  CLI11_PARSE(app, argc, argv);

  using dsfs::catalog::CatalogBuilder;
  const dsfs::catalog::KeySchema keys("dsfs");
  dsfs::store::Client client({dsfs::store::parse_redis_url(redis_url)});
  nlohmann::json out{{"files", files}, {"classes", classes}};

  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> class_names;
  for (uint32_t c = 0; c < classes; ++c) class_names.push_back(fmt::format("n{:08d}", c));
  CatalogBuilder builder(dsfs::catalog::ChecksumKind::kXxh64, dsfs::catalog::kDefaultChunkSize);
  builder.set_classes(class_names);
  uint64_t name_bytes = 0;
  for (uint64_t i = 0; i < files; ++i) {
    const uint32_t label = static_cast<uint32_t>(i % classes);
    std::string path = fmt::format("{}/{}_{}.JPEG", class_names[label], class_names[label], i);
    name_bytes += path.size() - class_names[label].size() - 1;
    builder.add_file(path, 16, 1'600'000'000'000'000'000LL, 0644, i, label, i * 2654435761u, {});
  }
  auto catalog = std::move(builder).build();
  out["build_s"] = seconds_since(t0);
  out["name_bytes"] = name_bytes;
  out["catalog_memory_bytes"] = catalog.memory_bytes();
  out["catalog_bytes_per_file_excluding_names"] =
      static_cast<double>(catalog.memory_bytes() - name_bytes) / static_cast<double>(files);

  t0 = std::chrono::steady_clock::now();
  auto bytes = dsfs::catalog::encode_manifest(catalog);
  out["encode_s"] = seconds_since(t0);
  out["manifest_bytes"] = bytes.size();
  t0 = std::chrono::steady_clock::now();
  auto decoded = dsfs::catalog::decode_manifest(bytes);
  out["decode_s"] = seconds_since(t0);
  if (decoded.file_count() != files) {
    fmt::print(stderr, "decode returned {} files, expected {}\n", decoded.file_count(), files);
    return 1;
  }

  // Tiny objects, pipelined, so the mounted dataset is readable end to end.
  t0 = std::chrono::steady_clock::now();
  const uint64_t gen = dsfs::catalog::begin_generation(client, keys, dataset);
  const std::string payload(16, 'x');
  constexpr uint64_t kBatch = 10'000;
  for (uint64_t first = 0; first < files; first += kBatch) {
    std::vector<std::vector<std::string>> commands;
    for (uint64_t i = first; i < std::min(files, first + kBatch); ++i)
      commands.push_back({"SET", keys.object(dataset, gen, i), payload});
    client.pipeline(commands, 256,
                    [](size_t, const dsfs::store::Reply& reply) { reply.expect_ok("SET object"); });
  }
  out["write_objects_s"] = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  dsfs::catalog::DatasetInfo info;
  info.name = dataset;
  info.generation = gen;
  info.file_count = catalog.file_count();
  info.dir_count = catalog.directory_count();
  info.total_bytes = catalog.total_bytes();
  info.class_count = classes;
  info.created_unix = std::time(nullptr);
  info.source = "bench/catalog_scale";
  dsfs::catalog::publish(client, keys, info, catalog);
  out["publish_s"] = seconds_since(t0);

  t0 = std::chrono::steady_clock::now();
  auto loaded =
      dsfs::catalog::load_catalog(client, keys, dsfs::catalog::read_info(client, keys, dataset));
  out["load_from_redis_s"] = seconds_since(t0);
  out["loaded_files"] = loaded->file_count();
  std::puts(out.dump().c_str());
  return 0;
}
