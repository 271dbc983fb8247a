// The raw Redis limit for a dataset: every object of it fetched straight from Redis (no FUSE, no
// cache), by N threads with a connection each and a sliding window of W pipelined GETs, in the
// epoch orders `dsfs bench` uses. Reports files/s, MB/s and per-file latency (first GET sent to
// last reply) under the same JSON field names as `dsfs bench --json`, so a script can put the
// two side by side. Every reply's length is checked against the manifest.
#include <fmt/core.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <exception>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "src/catalog/dataset.h"
#include "src/cli/common.h"
#include "src/store/connection.h"
#include "tools/dataset_bench.h"
#include "tools/progress.h"

namespace {

using dsfs::catalog::Catalog;
using dsfs::tools::BenchPattern;
using dsfs::tools::LatencyHistogram;
using dsfs::tools::ThroughputFigures;
using Clock = std::chrono::steady_clock;

constexpr size_t kReportedErrors = 10;

struct RawOptions {
  std::string dataset;
  std::string pattern = "epochs";
  unsigned jobs = 4;
  unsigned pipeline = 16;
  uint64_t epochs = 1;
  uint64_t seed = 0;
  uint64_t max_files = 0;
  std::string json_file;
};

struct RawError {
  std::string path;
  std::string key;
  std::string problem;
};

// What one thread saw in one epoch.
struct ReaderTally {
  LatencyHistogram latency;
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
};

// One epoch: threads share a cursor over the epoch's order, each keeping up to `pipeline` GETs
// outstanding on its own connection. Replies come back in request order, and a file's GETs are
// sent consecutively, so files complete first in, first out.
class RawEpoch {
 public:
  RawEpoch(const Catalog& catalog, const dsfs::catalog::KeySchema& keys,
           const dsfs::catalog::DatasetInfo& info, const std::vector<uint32_t>& entries,
           const std::vector<uint32_t>& order, unsigned pipeline)
      : catalog_(catalog),
        keys_(keys),
        info_(info),
        entries_(entries),
        order_(order),
        pipeline_(pipeline) {}

  void read(dsfs::store::Connection& conn, ReaderTally& tally) {
    try {
      read_pieces(conn, tally);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!failure_) failure_ = std::current_exception();
      stop_ = true;
    }
  }

  std::exception_ptr failure() const { return failure_; }
  std::vector<RawError> take_errors() { return std::move(errors_); }

 private:
  struct PendingFile {
    uint32_t entry = 0;
    uint64_t pieces = 0;
    uint64_t sent = 0;
    uint64_t received = 0;
    uint64_t bytes = 0;
    bool failed = false;
    Clock::time_point first_sent{};
  };

  // The file whose pieces are being sent, taking the next one from the cursor when the last is
  // all sent; nullptr when the epoch has nothing left to send.
  PendingFile* file_to_send(std::deque<PendingFile>& files) {
    if (!files.empty() && files.back().sent < files.back().pieces) return &files.back();
    if (stop_.load(std::memory_order_relaxed)) return nullptr;
    const size_t position = cursor_.fetch_add(1, std::memory_order_relaxed);
    if (position >= order_.size()) return nullptr;
    const uint32_t entry = entries_[order_[position]];
    files.push_back({.entry = entry, .pieces = catalog_.chunk_count(entry)});
    return &files.back();
  }

  std::string piece_key(const PendingFile& file, uint64_t piece) const {
    return keys_.object_piece(info_.name, info_.generation, catalog_.entry(file.entry).object_id,
                              piece, file.pieces > 1);
  }

  uint64_t piece_length(const PendingFile& file, uint64_t piece) const {
    const uint64_t size = catalog_.entry(file.entry).size;
    if (file.pieces == 1) return size;
    return std::min(catalog_.chunk_size(), size - piece * catalog_.chunk_size());
  }

  void read_pieces(dsfs::store::Connection& conn, ReaderTally& tally) {
    std::deque<PendingFile> files;  // front: oldest with replies to come; back: being sent
    size_t outstanding = 0;
    for (;;) {
      while (outstanding < pipeline_) {
        PendingFile* file = file_to_send(files);
        if (!file) break;
        if (file->sent == 0) file->first_sent = Clock::now();
        const std::string key = piece_key(*file, file->sent);
        conn.append({"GET", key});
        ++file->sent;
        ++outstanding;
      }
      if (outstanding == 0) return;
      const dsfs::store::Reply reply = conn.read_reply();
      --outstanding;
      PendingFile& file = files.front();
      const uint64_t expected = piece_length(file, file.received);
      if (!reply.is_string() || reply.is_error() || reply.str().size() != expected) {
        const std::string problem =
            reply.is_nil() ? "missing"
            : reply.is_error()
                ? fmt::format("error reply: {}", reply.str())
                : fmt::format("{} bytes, the manifest says {}", reply.str().size(), expected);
        record_error(file, piece_key(file, file.received), problem);
        file.failed = true;
      } else {
        file.bytes += reply.str().size();
      }
      if (++file.received < file.pieces) continue;
      if (file.failed) {
        ++tally.errors;
      } else {
        tally.latency.record(static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - file.first_sent)
                .count()));
        ++tally.files;
        tally.bytes += file.bytes;
      }
      files.pop_front();
    }
  }

  void record_error(const PendingFile& file, std::string key, std::string problem) {
    std::lock_guard lock(mutex_);
    if (errors_.size() < kReportedErrors) {
      errors_.push_back({catalog_.path(file.entry), std::move(key), std::move(problem)});
    }
  }

  const Catalog& catalog_;
  const dsfs::catalog::KeySchema& keys_;
  const dsfs::catalog::DatasetInfo& info_;
  const std::vector<uint32_t>& entries_;
  const std::vector<uint32_t>& order_;
  const size_t pipeline_;
  std::atomic<size_t> cursor_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::exception_ptr failure_;
  std::vector<RawError> errors_;
};

int run(const RawOptions& options, const dsfs::cli::GlobalOptions& global) {
  const BenchPattern pattern = dsfs::tools::parse_bench_pattern(options.pattern);
  const dsfs::store::RedisEndpoint endpoint = dsfs::cli::resolve_endpoint(global);
  const dsfs::catalog::KeySchema keys(global.ns);
  // The catalogue through a client; the reads below on connections of their own to this one
  // server (what raw Redis can do, without dsfs's routing).
  dsfs::store::Client control({endpoint});
  const dsfs::catalog::DatasetInfo info = dsfs::catalog::read_info(control, keys, options.dataset);
  const auto catalog = dsfs::catalog::load_catalog(control, keys, info);

  // The files in `dsfs bench`'s directory order (paths sorted bytewise), so --files and the seq
  // pattern pick the same files in the same order as `dsfs bench MOUNT/NAME` does.
  std::vector<std::pair<std::string, uint32_t>> files_by_path;
  for (uint32_t i = 0; i < catalog->entry_count(); ++i) {
    if (!catalog->entry(i).is_dir) files_by_path.emplace_back(catalog->path(i), i);
  }
  std::sort(files_by_path.begin(), files_by_path.end());
  if (options.max_files > 0 && files_by_path.size() > options.max_files) {
    files_by_path.resize(options.max_files);
  }
  std::vector<uint32_t> entries;  // catalogue entries of the files read, in that order
  uint64_t listed_bytes = 0;
  for (const auto& [path, entry] : files_by_path) {
    entries.push_back(entry);
    listed_bytes += catalog->entry(entry).size;
  }
  files_by_path = {};
  if (entries.empty()) {
    fmt::print(stderr, "dsfs_bench_redis_raw: dataset '{}' has no files\n", options.dataset);
    return 2;
  }
  std::vector<dsfs::store::Connection> connections;
  for (unsigned j = 0; j < options.jobs; ++j) connections.emplace_back(endpoint);

  ThroughputFigures totals;
  LatencyHistogram total_latency;
  nlohmann::json epochs_json = nlohmann::json::array();
  std::vector<RawError> errors;
  fmt::print(
      "redis_raw: {} '{}' generation {}: {} files ({:.1f} MB), pattern={} seed={}, "
      "{} epoch(s), jobs={}, pipeline={}\n",
      endpoint.describe(), info.name, info.generation, entries.size(),
      static_cast<double>(listed_bytes) / 1e6, options.pattern, options.seed, options.epochs,
      options.jobs, options.pipeline);
  const Clock::time_point start = Clock::now();
  for (uint64_t e = 0; e < options.epochs; ++e) {
    const std::vector<uint32_t> order =
        dsfs::tools::epoch_order(pattern, entries.size(), options.seed, e);
    RawEpoch epoch(*catalog, keys, info, entries, order, options.pipeline);
    std::vector<ReaderTally> tallies(options.jobs);
    const Clock::time_point epoch_start = Clock::now();
    {
      std::vector<std::jthread> readers;
      for (unsigned j = 0; j < options.jobs; ++j) {
        readers.emplace_back([&, j] { epoch.read(connections[j], tallies[j]); });
      }
    }
    if (epoch.failure()) std::rethrow_exception(epoch.failure());
    ThroughputFigures figures;
    figures.seconds = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    LatencyHistogram latency;
    for (const ReaderTally& tally : tallies) {
      figures.files += tally.files;
      figures.bytes += tally.bytes;
      figures.errors += tally.errors;
      latency.merge(tally.latency);
    }
    figures.latency = dsfs::tools::summarize_latency(latency);
    total_latency.merge(latency);
    totals.files += figures.files;
    totals.bytes += figures.bytes;
    totals.errors += figures.errors;
    for (RawError& error : epoch.take_errors()) {
      if (errors.size() < kReportedErrors) errors.push_back(std::move(error));
    }
    nlohmann::json epoch_json = dsfs::tools::throughput_json(figures);
    epoch_json["epoch"] = e;
    epoch_json["complete"] = true;
    epochs_json.push_back(std::move(epoch_json));
    fmt::print("  epoch {}: {} files, {:.1f} MB in {:.2f} s: {}\n", e,
               dsfs::tools::format_count(figures.files), static_cast<double>(figures.bytes) / 1e6,
               figures.seconds, dsfs::tools::format_throughput(figures));
  }
  totals.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  totals.latency = dsfs::tools::summarize_latency(total_latency);
  fmt::print("  read: {}\n  total: {} files, {:.1f} MB in {:.2f} s, {} error(s)\n",
             dsfs::tools::format_throughput(totals), dsfs::tools::format_count(totals.files),
             static_cast<double>(totals.bytes) / 1e6, totals.seconds, totals.errors);
  nlohmann::json errors_json = nlohmann::json::array();
  for (const RawError& error : errors) {
    fmt::print("  error: {} ({}): {}\n", error.path, error.key, error.problem);
    errors_json.push_back({{"path", error.path}, {"key", error.key}, {"message", error.problem}});
  }

  if (!options.json_file.empty()) {
    const nlohmann::json out{
        {"tool", "dsfs_bench_redis_raw"},
        {"config",
         {{"redis", endpoint.describe()},
          {"namespace", global.ns},
          {"dataset", info.name},
          {"generation", info.generation},
          {"pattern", options.pattern},
          {"epochs", options.epochs},
          {"jobs", options.jobs},
          {"pipeline", options.pipeline},
          {"seed", options.seed},
          {"listed_files", entries.size()},
          {"listed_bytes", listed_bytes}}},
        {"totals", dsfs::tools::throughput_json(totals)},
        {"epochs", std::move(epochs_json)},
        {"errors", {{"count", totals.errors}, {"first", std::move(errors_json)}}}};
    std::ofstream file(options.json_file);
    file << out.dump(2) << "\n";
    file.close();
    if (!file) {
      fmt::print(stderr, "dsfs_bench_redis_raw: cannot write {}\n", options.json_file);
      return 1;
    }
  }
  return totals.errors > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "Fetch every object of a dataset straight from Redis (no FUSE, no cache): --jobs threads, "
      "each with its own connection and a sliding window of --pipeline GETs, in the epoch orders "
      "of `dsfs bench`. Reply lengths are checked against the manifest (a mismatch is an error, "
      "exit 1). --json uses `dsfs bench --json` field names for totals and epochs.",
      "dsfs_bench_redis_raw"};
  RawOptions options;
  dsfs::cli::GlobalOptions global;
  app.add_option("--dataset,-d", options.dataset, "Dataset to read")->required();
  app.add_option("--pattern", options.pattern, "seq, shuffle or epochs, as in `dsfs bench`")
      ->check(CLI::IsMember({"seq", "shuffle", "epochs"}))
      ->capture_default_str();
  app.add_option("--jobs,-j", options.jobs, "Reader threads, one connection each")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option("--pipeline,-w", options.pipeline, "GETs outstanding per connection")
      ->check(CLI::Range(1u, 65536u))
      ->capture_default_str();
  app.add_option("--epochs", options.epochs, "Passes over the dataset")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1'000'000}))
      ->capture_default_str();
  app.add_option("--seed", options.seed, "Seed of the shuffled orders")->capture_default_str();
  app.add_option("--files", options.max_files,
                 "Read only the first N files in catalogue order (0: all)")
      ->capture_default_str();
  app.add_option("--json", options.json_file, "Write the figures as JSON to FILE");
  dsfs::cli::add_global_options(app, global);
  CLI11_PARSE(app, argc, argv);
  try {
    dsfs::cli::apply_log_level(global);
    return run(options, global);
  } catch (const std::exception& e) {
    fmt::print(stderr, "dsfs_bench_redis_raw: error: {}\n", e.what());
    return 1;
  }
}
