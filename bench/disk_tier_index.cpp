// How long a disk tier takes to open with N objects: loading the index a clean close saved
// (DIR/index) against listing and stat'ing every object file, each with the kernel's caches
// dropped first (a mount after a reboot) and warm (a remount). Fills DIR with N tiny objects
// first if it holds fewer. Then the write-behind rate (and CPU per object) with 1 and 4 writer
// threads. Writes JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/measure.h"
#include "prefetch/disk_tier.h"
#include "tools/dataset_bench.h"

using dsfs::prefetch::DiskTier;
using dsfs::prefetch::DiskTierKey;
using dsfs::prefetch::DiskTierOptions;

using dsfs::bench::cpu_seconds;
using dsfs::bench::median_of;

int main(int argc, char** argv) {
  CLI::App app{"Time a disk tier's open with N objects: saved index vs listing the directory"};
  std::string dir;
  uint64_t objects = 1'281'167;
  unsigned rounds = 3;
  std::string json_path;
  std::vector<unsigned> scan_threads = {1, 16};
  std::vector<unsigned> writer_threads = {1, 4};
  uint64_t write_objects = 2000;
  uint64_t write_size = 110'000;
  app.add_option("DIR", dir, "the tier's directory (on the disk to measure, not tmpfs)")
      ->required();
  app.add_option("--objects", objects, "objects in the tier (ImageNet train: 1281167)");
  app.add_option("--rounds", rounds, "opens per case; the median is reported");
  app.add_option("--json", json_path, "write the results here");
  app.add_option("--scan-threads", scan_threads, "listing threads to compare (without an index)")
      ->delimiter(',');
  app.add_option("--writers", writer_threads, "write-behind threads to compare")->delimiter(',');
  app.add_option("--write-objects", write_objects, "objects written per write-behind round");
  app.add_option("--write-size", write_size, "bytes per object written (ImageNet's mean: 110 KB)");
  uint64_t write_room = 0;  // 0: room for every object written
  app.add_option("--write-room", write_room,
                 "objects the write-behind tier holds (default: all; fewer: every write past "
                 "them evicts one)");
  bool writes_only = false;
  app.add_flag("--writes-only", writes_only, "only the write-behind cases (no 1.28 M-object fill)");
  CLI11_PARSE(app, argc, argv);

  const DiskTierOptions options{.dir = dir, .capacity_bytes = objects * 8192 + (64 << 20)};
  const std::string payload(64, 'x');
  if (!writes_only) {
    auto tier = std::make_unique<DiskTier>(options);
    tier->start();
    for (uint64_t id = tier->stats().entries; id < objects; ++id) {
      // Skips ids already there (put() says so); the queue is flushed every 10,000.
      tier->put(DiskTierKey{.dataset = "bench", .generation = 1, .object_id = id},
                std::make_shared<const dsfs::prefetch::ObjectData>(payload));
      if (id % 10000 == 0) {
        tier->flush();
        fmt::print(stderr, "\rfilling: {} of {}", id, objects);
      }
    }
    tier->flush();
    fmt::print(stderr, "\rfilled: {} objects{:20}\n", tier->stats().entries, "");
  }

  nlohmann::ordered_json out{
      {"objects", objects}, {"dir", dir}, {"cases", nlohmann::json::array()}};
  // (saved index?, listing threads); the index case lists nothing.
  std::vector<std::pair<bool, unsigned>> kinds = {{true, 0}};
  for (const unsigned threads : scan_threads) kinds.emplace_back(false, threads);
  for (const bool cold : writes_only ? std::vector<bool>{} : std::vector<bool>{true, false}) {
    for (const auto& [with_index, threads] : kinds) {
      std::vector<double> seconds;
      uint64_t entries = 0;
      for (unsigned round = 0; round < rounds; ++round) {
        // Each close saves the index again; the listing cases remove it before opening.
        if (!with_index) std::filesystem::remove(std::filesystem::path(dir) / "index");
        if (cold) dsfs::tools::drop_page_cache();
        DiskTierOptions open_options = options;
        open_options.scan_threads = std::max(threads, 1u);
        const auto start = std::chrono::steady_clock::now();
        DiskTier tier(open_options);
        seconds.push_back(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
        entries = tier.stats().entries;
        if (tier.stats().index_loaded != with_index) {
          fmt::print(stderr, "the open {} the index\n", with_index ? "did not load" : "loaded");
          return 1;
        }
      }
      const double median = median_of(seconds);
      const std::string name = with_index
                                   ? fmt::format("saved index, {}", cold ? "cold" : "warm")
                                   : fmt::format("listing ({} thread{}), {}", threads,
                                                 threads == 1 ? "" : "s", cold ? "cold" : "warm");
      fmt::print("{:28} {:8.2f} s (median of {}; {} objects)\n", name, median, rounds, entries);
      out["cases"].push_back({{"case", name},
                              {"index", with_index},
                              {"scan_threads", threads},
                              {"cold", cold},
                              {"median_s", median},
                              {"seconds", seconds},
                              {"entries", entries}});
    }
  }
  // Writing behind: `write_objects` objects of `write_size` bytes queued at once (the queue
  // holds them all) into a fresh tier beside DIR, timed until every one is on disk.
  out["writes"] = nlohmann::json::array();
  const uint64_t room_objects = write_room ? write_room : write_objects;
  for (const unsigned writers : writer_threads) {
    std::vector<double> rates;
    std::vector<double> cpu_us;  // the process's CPU per object written (the writers')
    std::vector<uint64_t> evictions;
    for (unsigned round = 0; round < rounds; ++round) {
      // A new directory per round, all removed at the end: on an ext4 without a journal a file
      // created within a minute of many deletions costs several times the CPU (the inode
      // allocator checks and skips each recently deleted inode), so removing one round's files
      // before the next would measure that instead.
      const std::filesystem::path write_dir = fmt::format("{}-writes/{}-{}", dir, writers, round);
      std::filesystem::remove_all(write_dir);
      DiskTier tier(DiskTierOptions{.dir = write_dir,
                                    .capacity_bytes = room_objects * (write_size + 8192),
                                    .queue_bytes = write_objects * write_size,
                                    .writer_threads = writers});
      std::vector<dsfs::prefetch::ObjectBuffer> buffers;
      for (uint64_t id = 0; id < write_objects; ++id) {
        buffers.push_back(std::make_shared<const dsfs::prefetch::ObjectData>(
            std::string(write_size, static_cast<char>('a' + id % 26))));
      }
      dsfs::tools::drop_page_cache();
      tier.start();
      const double cpu_start = cpu_seconds();
      const auto start = std::chrono::steady_clock::now();
      for (uint64_t id = 0; id < write_objects; ++id) {
        tier.put(DiskTierKey{.dataset = "bench", .generation = 1, .object_id = id}, buffers[id]);
      }
      tier.flush();
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      evictions.push_back(tier.stats().evictions);
      if (tier.stats().writes != write_objects) {
        fmt::print(stderr, "wrote {} of {} objects\n", tier.stats().writes, write_objects);
        return 1;
      }
      rates.push_back(static_cast<double>(write_objects) / seconds);
      cpu_us.push_back((cpu_seconds() - cpu_start) * 1e6 / static_cast<double>(write_objects));
    }
    const double median = median_of(rates);
    const double median_cpu = median_of(cpu_us);
    fmt::print(
        "write-behind, {} writer{:2}   {:8.0f} objects/s ({:.0f} MB/s; {} x {} bytes), {:.0f} us "
        "CPU each\n",
        writers, writers == 1 ? "" : "s", median, median * static_cast<double>(write_size) / 1e6,
        write_objects, write_size, median_cpu);
    out["writes"].push_back({{"writers", writers},
                             {"objects", write_objects},
                             {"object_bytes", write_size},
                             {"median_objects_per_s", median},
                             {"objects_per_s", rates},
                             {"median_cpu_us_per_object", median_cpu},
                             {"cpu_us_per_object", cpu_us},
                             {"room_objects", room_objects},
                             {"evictions", evictions}});
  }
  std::filesystem::remove_all(std::filesystem::path(dir).string() + "-writes");
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
