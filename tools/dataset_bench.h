#pragma once
// The engine behind `dsfs bench PATH`: a fio-style reader of every file under a directory (tmpfs,
// ext4, a dsfs mount alike), in directory order or a seeded shuffle, by several reader threads,
// measuring files/s, MB/s and per-file latency (open to close), per epoch and over time.
// Also the pieces bench/redis_raw.cpp shares so its figures compare field for field: the epoch
// order, the latency histogram and the JSON of a throughput figure.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dsfs::tools {

class Progress;

// What the bench cannot start on: a missing PATH, not a directory, no regular file under it.
// `dsfs bench` exits 2 on it.
class BenchSetupError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// seq: directory order every epoch. shuffle: one seeded permutation, the same every epoch.
// epochs: a fresh permutation each epoch (epoch e uses seed + e), like a shuffling sampler.
enum class BenchPattern { kSequential, kShuffle, kEpochs };
// "seq", "shuffle", "epochs"; throws std::invalid_argument otherwise.
BenchPattern parse_bench_pattern(std::string_view text);
std::string_view bench_pattern_name(BenchPattern pattern);

// The order in which epoch `epoch` (0-based) reads files 0..file_count-1.
std::vector<uint32_t> epoch_order(BenchPattern pattern, size_t file_count, uint64_t seed,
                                  uint64_t epoch);

struct BenchFile {
  std::filesystem::path path;
  uint64_t size = 0;  // at listing time; a dangling symlink lists as 0
};

// Every file under `root`, ordered by path bytewise (`find ROOT -type f | LC_ALL=C sort`), then
// the first `max_files` of them (0: all). Regular files and symlinks to regular files are listed,
// and dangling symlinks too (reading them is an error, as a loader would meet it); directories
// reached through symlinks are not walked into, and FIFOs, sockets and devices are skipped.
// Throws BenchSetupError if root is missing or not a directory, a directory under it cannot be
// read, or nothing is listed.
std::vector<BenchFile> list_bench_files(const std::filesystem::path& root, uint64_t max_files = 0);

// Latencies in nanoseconds in log-linear buckets (64 per power of two, so a percentile is within
// 0.8% of the true value) plus the exact count, sum, min and max. Fixed size (about 30 KB), so a
// run of any length costs the same memory; merge() combines per-thread histograms.
class LatencyHistogram {
 public:
  LatencyHistogram();
  void record(uint64_t nanoseconds);
  void merge(const LatencyHistogram& other);
  void clear();

  uint64_t count() const { return count_; }
  uint64_t min() const { return count_ ? min_ : 0; }
  uint64_t max() const { return max_; }
  double mean() const;
  // The smallest recorded value v such that at least q (0..1) of all values are <= v, to the
  // bucket's precision (clamped to [min, max]; exactly min for q = 0 and max for q = 1).
  // 0 when empty.
  uint64_t percentile(double q) const;

 private:
  std::vector<uint64_t> buckets_;
  uint64_t count_ = 0;
  uint64_t sum_ = 0;
  uint64_t min_ = UINT64_MAX;
  uint64_t max_ = 0;
};

// The latency figures reported everywhere, in milliseconds.
struct LatencySummary {
  uint64_t count = 0;
  double min_ms = 0;
  double mean_ms = 0;
  double p50_ms = 0;
  double p90_ms = 0;
  double p99_ms = 0;
  double p999_ms = 0;
  double max_ms = 0;
};
LatencySummary summarize_latency(const LatencyHistogram& histogram);

// Files and bytes completed, over some seconds: the "totals" object of both benches' JSON.
struct ThroughputFigures {
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t errors = 0;
  double seconds = 0;
  LatencySummary latency{};

  double files_per_second() const;
  double megabytes_per_second() const;  // MB = 10^6 bytes
};
// {"files","bytes","errors","seconds","files_per_s","mb_per_s","latency_ms":{"min","mean","p50",
// "p90","p99","p999","max","count"}}.
nlohmann::json throughput_json(const ThroughputFigures& figures);
// "files/s=1923.1, MB/s=212.0, lat (ms): p50=3.102, p90=4.200, p99=9.801, max=12.403".
std::string format_throughput(const ThroughputFigures& figures);

struct BenchOptions {
  std::filesystem::path root;
  BenchPattern pattern = BenchPattern::kSequential;
  // Epochs to run; unset: 1, or as many as fit in `duration` when that is set.
  std::optional<uint64_t> epochs;
  unsigned jobs = 1;       // reader threads
  uint64_t max_files = 0;  // the first N files in directory order (0: all)
  size_t block_size = 1u << 20;
  // Stop reading once this has passed (the epoch under way is reported as incomplete).
  std::optional<std::chrono::nanoseconds> duration;
  uint64_t seed = 0;
  // Before every epoch (untimed): sync, then write "3" here to drop the page cache.
  bool drop_caches = false;
  std::filesystem::path drop_caches_file = "/proc/sys/vm/drop_caches";
  // Before each epoch, write its whole order to the dsfs mount's .dsfs/plan (replacing the
  // plan), so the prefetch engine follows it exactly; the write is timed as part of the epoch,
  // as a loader's sampler pays for it. The mount is found above `root` (find_dsfs_mount_root).
  bool plan = false;
  // Shown while running, if set: files and bytes completed.
  Progress* progress = nullptr;
  // Polled before each file; when it becomes true the run stops as when `duration` ends (SIGINT).
  const std::atomic<bool>* stop = nullptr;

  // Test hooks. after_listing: called once the listing is built, before timing starts.
  // on_file_done: called from a reader thread after each file (ok: read to EOF without error),
  // with the index into the listing.
  std::function<void(const std::vector<BenchFile>& files)> after_listing;
  std::function<void(uint64_t epoch, uint32_t file_index, bool ok)> on_file_done;
};

// The root of the dsfs mount holding `path`: the nearest directory at or above it that holds
// .dsfs/stats.json, walking up the path as given (made absolute), then up its real path (a
// symlink into a mount). Throws BenchSetupError when there is none.
std::filesystem::path find_dsfs_mount_root(const std::filesystem::path& path);

// The plan line of every listed file: its path relative to `mount_root`, where the listing was
// made under `root` and `root` lies in the mount (spelt as given, or through its real path).
std::vector<std::string> plan_lines_for(const std::vector<BenchFile>& files,
                                        const std::filesystem::path& root,
                                        const std::filesystem::path& mount_root);

// Checks the options that need no I/O; throws std::invalid_argument naming the bad one.
void validate_bench_options(const BenchOptions& options);

// Writes dirty pages out, then drops the page, dentry and inode caches (3 > control_file, which
// needs root). Throws std::runtime_error naming the file and what to do when that fails.
void drop_page_cache(const std::filesystem::path& control_file = "/proc/sys/vm/drop_caches");

struct BenchReadError {
  std::filesystem::path path;
  std::string operation;  // "open", "read" or "close"
  int error_number = 0;
};

struct BenchEpoch {
  uint64_t epoch = 0;
  bool complete = false;  // every file of the epoch was attempted (not cut short by a stop)
  ThroughputFigures figures{};
  double plan_seconds = 0;  // spent writing the plan (with --plan; included in figures.seconds)
};

// Files and bytes completed in one second of the run (second i: [i, i+1) s after the start).
struct BenchSecond {
  uint64_t files = 0;
  uint64_t bytes = 0;
};

struct BenchResult {
  uint64_t listed_files = 0;
  uint64_t listed_bytes = 0;
  ThroughputFigures totals{};  // over the whole run; errors: files that failed
  std::vector<BenchEpoch> epochs;
  std::vector<BenchReadError> first_errors;  // the first kReportedBenchErrors, in no set order
  std::vector<BenchSecond> timeline;
  bool stopped_early = false;  // by `duration` or `stop` before the epochs requested were read
};

inline constexpr size_t kReportedBenchErrors = 10;

// Lists, optionally finds the mount for --plan and drops caches, then reads. A file that fails to
// open, read or close is counted as an error (not in files or bytes), and reading goes on. Throws
// BenchSetupError or std::invalid_argument (bad options) before anything is read,
// std::runtime_error if the page cache cannot be dropped or the plan cannot be written.
BenchResult run_dataset_bench(const BenchOptions& options);

// {"config":..., "totals":..., "epochs":[...], "errors":{"count","first":[...]},
//  "timeline":[{"second","files","bytes"}...]}.
nlohmann::json bench_result_json(const BenchOptions& options, const BenchResult& result);
// The fio-like text summary, a few lines (at most 20 epoch lines; the rest are in the JSON).
std::string format_bench_summary(const BenchOptions& options, const BenchResult& result);

}  // namespace dsfs::tools
