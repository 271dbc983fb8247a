// Reading a disk tier's objects back (issue 13): does io_uring pay against a pool of threads?
// Fills DIR (a tier on the disk to measure, not tmpfs) with N objects of S bytes if it holds
// fewer, then reads all of them, in a shuffled order, with the page cache dropped first (cold)
// and again without dropping it (warm), by:
//   tier.get   K threads calling DiskTier::get(): what the disk stagers and the FUSE read
//              threads do (open, one read of the whole file, close, header and XXH64 checks;
//              O_DIRECT unless the page cache holds the file, or through it with --page-cache)
//   pread      K threads: open, read to EOF, close; no check (the I/O alone)
//   io_uring   one thread keeping Q files in flight, each an openat (direct descriptor) -> read
//              -> close chain; no check (the I/O alone, as pread)
// Reports objects/s, MB/s, the CPU seconds the process used (io_uring's kernel workers are
// threads of the process and count too) and the machine's busy CPU (disk interrupts land outside
// the process), the median of --rounds. Writes JSON.
#include <fcntl.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench/measure.h"
#include "prefetch/disk_tier.h"
#include "tools/dataset_bench.h"

using dsfs::bench::cpu_seconds;
using dsfs::bench::machine_busy_seconds;
using dsfs::bench::median_of;
using dsfs::prefetch::DiskTier;
using dsfs::prefetch::DiskTierKey;
using dsfs::prefetch::DiskTierOptions;

namespace {

constexpr std::string_view kDataset = "bench";

DiskTierKey key_of(uint64_t id) {
  return DiskTierKey{.dataset = kDataset, .generation = 1, .object_id = id};
}

struct Outcome {
  uint64_t objects = 0;
  uint64_t bytes = 0;
  uint64_t failures = 0;
};

// K threads take the next object in `order` and read it with `read_one`.
template <typename ReadOne>
Outcome with_threads(unsigned threads, const std::vector<uint64_t>& order, ReadOne read_one) {
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> bytes{0}, failures{0};
  std::vector<std::jthread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      std::vector<char> buffer;
      for (size_t i = next++; i < order.size(); i = next++) {
        const int64_t got = read_one(order[i], buffer);
        if (got <= 0) {
          ++failures;
        } else {
          bytes += static_cast<uint64_t>(got);
        }
      }
    });
  }
  pool.clear();  // joins
  return Outcome{order.size(), bytes.load(), failures.load()};
}

// The whole file at `path` into `buffer` (sized for it): open, read to EOF, close.
int64_t pread_file(const std::string& path, std::vector<char>& buffer) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buffer.data() + total, buffer.size() - static_cast<size_t>(total));
    if (n <= 0) {
      if (n < 0) total = -1;
      break;
    }
    total += n;
    if (static_cast<size_t>(total) == buffer.size()) break;
  }
  ::close(fd);
  return total;
}

// One thread, `depth` files in flight: openat into a direct-descriptor slot, read through it,
// close it, linked so that each step starts when the one before it completed.
// The slot's chain is done when all three completions came back.
Outcome with_uring(unsigned depth, const std::vector<std::string>& paths,
                   const std::vector<uint64_t>& order, size_t file_bytes) {
  io_uring ring{};
  if (const int rc = io_uring_queue_init(depth * 3 + 8, &ring, 0); rc < 0) {
    throw std::runtime_error(fmt::format("io_uring_queue_init: {}", std::strerror(-rc)));
  }
  struct RingGuard {
    io_uring* ring;
    ~RingGuard() { io_uring_queue_exit(ring); }
  } guard{&ring};
  if (const int rc = io_uring_register_files_sparse(&ring, depth); rc < 0) {
    throw std::runtime_error(fmt::format("io_uring_register_files_sparse: {}", std::strerror(-rc)));
  }
  struct Slot {
    std::vector<char> buffer;
    int pending = 0;  // CQEs still to come for the chain in it
    int64_t read = 0;
    bool failed = false;
  };
  std::vector<Slot> slots(depth);
  for (Slot& s : slots) s.buffer.resize(file_bytes);
  std::vector<unsigned> free_slots(depth);
  std::iota(free_slots.begin(), free_slots.end(), 0u);
  Outcome out;
  size_t next = 0, done = 0;
  while (done < order.size()) {
    while (!free_slots.empty() && next < order.size()) {
      const unsigned s = free_slots.back();
      free_slots.pop_back();
      Slot& slot = slots[s];
      slot = Slot{std::move(slot.buffer), 3, 0, false};
      const std::string& path = paths[order[next++]];
      io_uring_sqe* open_sqe = io_uring_get_sqe(&ring);
      io_uring_prep_openat_direct(open_sqe, AT_FDCWD, path.c_str(), O_RDONLY, 0, s);
      open_sqe->flags |= IOSQE_IO_LINK;
      io_uring_sqe_set_data64(open_sqe, uint64_t{s} << 2 | 0);
      io_uring_sqe* read_sqe = io_uring_get_sqe(&ring);
      io_uring_prep_read(read_sqe, static_cast<int>(s), slot.buffer.data(),
                         static_cast<unsigned>(slot.buffer.size()), 0);
      // A hard link: the read returns less than the buffer (the file is shorter), which would
      // cancel a plain link's close and leave the slot's file open.
      read_sqe->flags |= IOSQE_FIXED_FILE | IOSQE_IO_HARDLINK;
      io_uring_sqe_set_data64(read_sqe, uint64_t{s} << 2 | 1);
      io_uring_sqe* close_sqe = io_uring_get_sqe(&ring);
      io_uring_prep_close_direct(close_sqe, s);
      io_uring_sqe_set_data64(close_sqe, uint64_t{s} << 2 | 2);
    }
    if (const int rc = io_uring_submit_and_wait(&ring, 1); rc < 0 && rc != -EINTR) {
      throw std::runtime_error(fmt::format("io_uring_submit_and_wait: {}", std::strerror(-rc)));
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0, seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      ++seen;
      const uint64_t data = io_uring_cqe_get_data64(cqe);
      const unsigned s = static_cast<unsigned>(data >> 2);
      Slot& slot = slots[s];
      if (cqe->res < 0 && !slot.failed) {
        slot.failed = true;
        if (out.failures == 0) {
          fmt::print(stderr, "io_uring: {} failed: {}\n",
                     (data & 3) == 0   ? "openat"
                     : (data & 3) == 1 ? "read"
                                       : "close",
                     std::strerror(-cqe->res));
        }
      }
      if ((data & 3) == 1 && cqe->res > 0) slot.read = cqe->res;
      if (--slot.pending == 0) {
        if (slot.failed || slot.read <= 0) {
          ++out.failures;
        } else {
          out.bytes += static_cast<uint64_t>(slot.read);
        }
        ++done;
        free_slots.push_back(s);
      }
    }
    io_uring_cq_advance(&ring, seen);
  }
  out.objects = order.size();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Read a disk tier's objects back: a pool of threads against io_uring"};
  std::string dir;
  uint64_t objects = 20000;
  uint64_t size = 111'600;  // the synthetic dataset's mean file
  unsigned rounds = 3;
  std::string json_path;
  std::vector<unsigned> threads = {1, 4, 8, 16, 32};
  std::vector<unsigned> depths = {1, 4, 8, 16, 32, 64};
  app.add_option("DIR", dir, "the tier's directory (on the disk to measure, not tmpfs)")
      ->required();
  app.add_option("--objects", objects, "objects in the tier");
  app.add_option("--size", size, "bytes per object");
  app.add_option("--rounds", rounds, "reads of every object per case; the median is reported");
  app.add_option("--threads", threads, "thread counts for tier.get and pread")->delimiter(',');
  app.add_option("--depths", depths, "files in flight for io_uring")->delimiter(',');
  app.add_option("--json", json_path, "write the results here");
  bool hold = false;
  app.add_flag("--hold", hold,
               "tier.get keeps every object until the round ends, as a cache that fills with "
               "fresh memory does in a new mount's first epoch (else each is freed at once)");
  bool page_cache = false;
  app.add_flag("--page-cache", page_cache,
               "tier.get reads through the page cache (dsfs mount --disk-cache-page-cache); "
               "else as a mount does by default: O_DIRECT unless the page cache holds the file");
  std::vector<std::string> methods = {"tier.get", "pread", "io_uring"};
  app.add_option("--methods", methods, "which readers to measure")
      ->delimiter(',')
      ->check(CLI::IsMember({"tier.get", "pread", "io_uring"}));
  CLI11_PARSE(app, argc, argv);

  const DiskTierOptions options{.dir = dir,
                                .capacity_bytes = objects * (size + 8192) + (64 << 20),
                                .queue_bytes = uint64_t{256} << 20,
                                .direct_io = !page_cache};
  auto tier = std::make_unique<DiskTier>(options);
  {
    tier->start();
    std::mt19937_64 random(7);
    std::string payload(size, '\0');
    for (uint64_t id = tier->stats().entries; id < objects; ++id) {
      for (size_t i = 0; i < payload.size(); i += 8) payload[i] = static_cast<char>(random());
      while (!tier->put(key_of(id), std::make_shared<const dsfs::prefetch::ObjectData>(payload))) {
        tier->flush();  // the queue was full: let it drain, then put again
      }
      if (id % 1000 == 0) fmt::print(stderr, "\rfilling: {} of {}", id, objects);
    }
    tier->flush();
    fmt::print(stderr, "\rfilled: {} objects{:20}\n", tier->stats().entries, "");
  }
  if (tier->stats().entries < objects) {
    fmt::print(stderr, "the tier holds {} objects, fewer than {}\n", tier->stats().entries,
               objects);
    return 1;
  }
  std::vector<std::string> paths;
  for (uint64_t id = 0; id < objects; ++id)
    paths.push_back(tier->path_of(key_of(id), size).string());
  const size_t file_bytes = std::filesystem::file_size(paths[0]) + 4096;

  nlohmann::ordered_json out{{"objects", objects},
                             {"object_bytes", size},
                             {"dir", dir},
                             {"tier_direct_io", tier->stats().direct_io},
                             {"cases", nlohmann::json::array()}};
  struct Case {
    std::string method;
    unsigned parallel;
  };
  std::vector<Case> cases;
  const auto wanted = [&](const char* method) {
    return std::find(methods.begin(), methods.end(), method) != methods.end();
  };
  if (wanted("tier.get")) {
    for (const unsigned t : threads) cases.push_back({"tier.get", t});
  }
  if (wanted("pread")) {
    for (const unsigned t : threads) cases.push_back({"pread", t});
  }
  if (wanted("io_uring")) {
    for (const unsigned q : depths) cases.push_back({"io_uring", q});
  }
  for (const bool cold : {true, false}) {
    for (const Case& c : cases) {
      std::vector<double> rates, cpu_per_object, machine_cpu_per_object;
      uint64_t failures = 0;
      for (unsigned round = 0; round < rounds; ++round) {
        std::vector<uint64_t> order(objects);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), std::mt19937_64(1000 + round));
        if (cold) dsfs::tools::drop_page_cache();
        const double cpu0 = cpu_seconds();
        const double machine0 = machine_busy_seconds();
        const auto start = std::chrono::steady_clock::now();
        Outcome o;
        std::vector<dsfs::prefetch::ObjectBuffer> held;
        if (c.method == "tier.get") {
          if (hold) held.resize(objects);
          o = with_threads(c.parallel, order, [&](uint64_t id, std::vector<char>&) -> int64_t {
            auto buffer = tier->get(key_of(id), size);
            const int64_t got = buffer ? static_cast<int64_t>(size) : -1;
            if (hold) held[id] = std::move(buffer);  // each id is read by one thread
            return got;
          });
        } else if (c.method == "pread") {
          o = with_threads(c.parallel, order, [&](uint64_t id, std::vector<char>& buffer) {
            buffer.resize(file_bytes);
            return pread_file(paths[id], buffer);
          });
        } else {
          o = with_uring(c.parallel, paths, order, file_bytes);
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        rates.push_back(static_cast<double>(o.objects) / seconds);
        cpu_per_object.push_back((cpu_seconds() - cpu0) / static_cast<double>(o.objects));
        machine_cpu_per_object.push_back((machine_busy_seconds() - machine0) /
                                         static_cast<double>(o.objects));
        held.clear();  // outside the measured part: freeing is not reading
        failures += o.failures;
      }
      const double median = median_of(rates);
      const double cpu_us = 1e6 * median_of(cpu_per_object);
      const double machine_cpu_us = 1e6 * median_of(machine_cpu_per_object);
      const std::string what = c.method == "io_uring" ? "depth" : "threads";
      fmt::print(
          "{:5} {:9} {:7} {:3}: {:8.0f} objects/s {:7.0f} MB/s  {:5.0f} us CPU/object "
          "(machine {:5.0f}){}\n",
          cold ? "cold" : "warm", c.method, what, c.parallel, median,
          median * static_cast<double>(size) / 1e6, cpu_us, machine_cpu_us,
          failures ? fmt::format("  ({} FAILED)", failures) : "");
      out["cases"].push_back({{"method", c.method},
                              {what, c.parallel},
                              {"cold", cold},
                              {"median_objects_per_s", median},
                              {"objects_per_s", rates},
                              {"cpu_us_per_object", cpu_us},
                              {"machine_cpu_us_per_object", machine_cpu_us},
                              {"failures", failures}});
      if (failures) return 1;
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
