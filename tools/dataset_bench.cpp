#include "tools/dataset_bench.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "tools/plan_command.h"
#include "tools/progress.h"
#include "tools/scoped_fd.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr double kMegabyte = 1e6;
constexpr double kNanosecondsPerMillisecond = 1e6;
constexpr size_t kSummaryEpochLines = 20;

void fill_epoch_order(std::vector<uint32_t>& order, BenchPattern pattern, uint64_t seed,
                      uint64_t epoch) {
  std::iota(order.begin(), order.end(), 0u);
  if (pattern == BenchPattern::kSequential) return;
  std::mt19937_64 random(pattern == BenchPattern::kShuffle ? seed : seed + epoch);
  std::shuffle(order.begin(), order.end(), random);
}

std::string format_block_size(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} B", bytes);
}

std::string format_megabytes(uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / kMegabyte);
}

// One run: reader threads pull the next index of the epoch's order from a shared cursor (as a
// DataLoader's workers do) and meet at a barrier after each epoch, whose completion step sums
// the epoch up and prepares the next.
class BenchRun {
 public:
  BenchRun(const BenchOptions& options, const std::vector<BenchFile>& files,
           std::optional<fs::path> mount_root, std::vector<std::string> plan_lines)
      : options_(options),
        files_(files),
        mount_root_(std::move(mount_root)),
        plan_lines_(std::move(plan_lines)),
        order_(files.size()),
        workers_(options.jobs),
        barrier_(static_cast<std::ptrdiff_t>(options.jobs), EpochEnd{this}) {
    fill_epoch_order(order_, options_.pattern, options_.seed, 0);
    for (Worker& worker : workers_) worker.buffer.resize(options_.block_size);
  }

  BenchResult run() {
    start_ = Clock::now();
    epoch_start_ = start_;
    if (options_.duration) deadline_ = start_ + *options_.duration;
    write_plan();
    {
      std::vector<std::jthread> threads;
      threads.reserve(workers_.size());
      size_t started = 0;
      try {
        for (; started < workers_.size(); ++started) {
          threads.emplace_back([this, started] { work(workers_[started]); });
        }
      } catch (...) {
        // The threads that did start must not wait forever for those that did not: stop, and
        // take the missing ones out of the barrier.
        stopping_ = true;
        failure_ = std::current_exception();
        for (size_t missing = started; missing < workers_.size(); ++missing) {
          barrier_.arrive_and_drop();
        }
      }
    }  // joins
    if (failure_) std::rethrow_exception(failure_);
    result_.totals.seconds = std::chrono::duration<double>(end_ - start_).count();
    result_.totals.latency = summarize_latency(total_latency_);
    for (const Worker& worker : workers_) {
      if (worker.timeline.size() > result_.timeline.size()) {
        result_.timeline.resize(worker.timeline.size());
      }
      for (size_t second = 0; second < worker.timeline.size(); ++second) {
        result_.timeline[second].files += worker.timeline[second].files;
        result_.timeline[second].bytes += worker.timeline[second].bytes;
      }
    }
    return std::move(result_);
  }

 private:
  // alignas: each reader updates its own counters on every file; keep them off shared lines.
  struct alignas(64) Worker {
    std::vector<std::byte> buffer;
    LatencyHistogram epoch_latency;
    uint64_t epoch_files = 0;
    uint64_t epoch_bytes = 0;
    uint64_t epoch_errors = 0;
    std::vector<BenchSecond> timeline;
  };

  struct EpochEnd {
    BenchRun* run;
    void operator()() noexcept { run->finish_epoch(); }
  };

  void work(Worker& worker) {
    for (;;) {
      read_epoch_part(worker);
      barrier_.arrive_and_wait();
      if (done_) return;  // written by finish_epoch, which the barrier orders before this read
    }
  }

  bool should_stop() {
    if (stopping_.load(std::memory_order_relaxed)) return true;
    if ((options_.stop && options_.stop->load(std::memory_order_relaxed)) ||
        (deadline_ && Clock::now() >= *deadline_)) {
      stopping_ = true;
      return true;
    }
    return false;
  }

  void read_epoch_part(Worker& worker) {
    while (!should_stop()) {
      const size_t position = cursor_.fetch_add(1, std::memory_order_relaxed);
      if (position >= order_.size()) return;
      read_file(worker, order_[position]);
    }
  }

  void read_file(Worker& worker, uint32_t index) {
    const fs::path& path = files_[index].path;
    const Clock::time_point opened = Clock::now();
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return fail(worker, index, "open", errno);
    uint64_t bytes = 0;
    for (;;) {
      const ssize_t n = ::read(fd.get(), worker.buffer.data(), worker.buffer.size());
      if (n > 0) {
        bytes += static_cast<uint64_t>(n);
      } else if (n == 0) {
        break;
      } else if (errno != EINTR) {
        return fail(worker, index, "read", errno);
      }
    }
    if (const int error = fd.close(); error != 0) return fail(worker, index, "close", error);
    const Clock::time_point closed = Clock::now();

    worker.epoch_latency.record(static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(closed - opened).count()));
    ++worker.epoch_files;
    worker.epoch_bytes += bytes;
    const auto second = static_cast<size_t>(
        std::chrono::duration_cast<std::chrono::seconds>(closed - start_).count());
    if (second >= worker.timeline.size()) worker.timeline.resize(second + 1);
    ++worker.timeline[second].files;
    worker.timeline[second].bytes += bytes;
    if (options_.progress) options_.progress->add(1, bytes);
    if (options_.on_file_done) options_.on_file_done(epoch_, index, true);
  }

  void fail(Worker& worker, uint32_t index, const char* operation, int error_number) {
    ++worker.epoch_errors;
    {
      std::lock_guard lock(errors_mutex_);
      if (result_.first_errors.size() < kReportedBenchErrors) {
        result_.first_errors.push_back({files_[index].path, operation, error_number});
      }
    }
    if (options_.on_file_done) options_.on_file_done(epoch_, index, false);
  }

  // Runs on one thread while every reader waits at the barrier.
  void finish_epoch() noexcept {
    try {
      const Clock::time_point now = Clock::now();
      BenchEpoch epoch;
      epoch.epoch = epoch_;
      LatencyHistogram latency;
      for (Worker& worker : workers_) {
        epoch.figures.files += worker.epoch_files;
        epoch.figures.bytes += worker.epoch_bytes;
        epoch.figures.errors += worker.epoch_errors;
        latency.merge(worker.epoch_latency);
        worker.epoch_latency.clear();
        worker.epoch_files = worker.epoch_bytes = worker.epoch_errors = 0;
      }
      epoch.figures.seconds = std::chrono::duration<double>(now - epoch_start_).count();
      epoch.plan_seconds = plan_seconds_;
      epoch.figures.latency = summarize_latency(latency);
      epoch.complete = epoch.figures.files + epoch.figures.errors == order_.size();
      end_ = now;
      // A stop that came before the epoch read anything leaves no trace of it.
      if (epoch.complete || epoch.figures.files + epoch.figures.errors > 0) {
        total_latency_.merge(latency);
        result_.totals.files += epoch.figures.files;
        result_.totals.bytes += epoch.figures.bytes;
        result_.totals.errors += epoch.figures.errors;
        result_.epochs.push_back(std::move(epoch));
      }

      ++epoch_;
      const bool all_epochs_read =
          options_.epochs ? epoch_ >= *options_.epochs : !options_.duration;  // default: one epoch
      if (all_epochs_read || should_stop()) {
        done_ = true;
        return;
      }
      if (options_.pattern == BenchPattern::kEpochs) {
        fill_epoch_order(order_, options_.pattern, options_.seed, epoch_);
      }
      cursor_ = 0;
      if (options_.drop_caches) {
        // Each epoch starts cold, so later epochs measure the mount, not the page cache. The
        // run's clock (totals, timeline, --duration) stands still while the cache drops.
        const Clock::time_point drop_start = Clock::now();
        drop_page_cache(options_.drop_caches_file);
        const Clock::duration dropping = Clock::now() - drop_start;
        start_ += dropping;
        if (deadline_) *deadline_ += dropping;
      }
      epoch_start_ = Clock::now();
      write_plan();
    } catch (...) {
      failure_ = std::current_exception();
      done_ = true;
    }
  }

  // The epoch's order as paths relative to the mount, in one write that replaces the plan.
  void write_plan() {
    if (!mount_root_) return;
    const Clock::time_point begin = Clock::now();
    plan_text_.clear();
    for (const uint32_t index : order_) {
      plan_text_ += plan_lines_[index];
      plan_text_ += '\n';
    }
    write_plan_file(*mount_root_, plan_text_, /*append=*/false);
    plan_seconds_ = std::chrono::duration<double>(Clock::now() - begin).count();
  }

  const BenchOptions& options_;
  const std::vector<BenchFile>& files_;
  const std::optional<fs::path> mount_root_;  // set with --plan
  const std::vector<std::string> plan_lines_;
  std::string plan_text_;
  double plan_seconds_ = 0;      // writing the plan of the epoch under way
  std::vector<uint32_t> order_;  // of the epoch under way
  std::vector<Worker> workers_;
  std::barrier<EpochEnd> barrier_;
  std::atomic<size_t> cursor_{0};
  std::atomic<bool> stopping_{false};
  // Written only by finish_epoch (or before the readers start), read by readers after the
  // barrier.
  uint64_t epoch_ = 0;
  bool done_ = false;
  Clock::time_point start_;  // moved later by the time spent dropping caches between epochs
  Clock::time_point epoch_start_;
  Clock::time_point end_;
  std::optional<Clock::time_point> deadline_;
  LatencyHistogram total_latency_;
  std::exception_ptr failure_;
  std::mutex errors_mutex_;
  BenchResult result_;
};

}  // namespace

// ---- Patterns and order --------------------------------------------------------------------

BenchPattern parse_bench_pattern(std::string_view text) {
  if (text == "seq") return BenchPattern::kSequential;
  if (text == "shuffle") return BenchPattern::kShuffle;
  if (text == "epochs") return BenchPattern::kEpochs;
  throw std::invalid_argument(
      fmt::format("unknown pattern '{}': use seq, shuffle or epochs", text));
}

std::string_view bench_pattern_name(BenchPattern pattern) {
  switch (pattern) {
    case BenchPattern::kSequential:
      return "seq";
    case BenchPattern::kShuffle:
      return "shuffle";
    case BenchPattern::kEpochs:
      return "epochs";
  }
  return "?";
}

std::vector<uint32_t> epoch_order(BenchPattern pattern, size_t file_count, uint64_t seed,
                                  uint64_t epoch) {
  if (file_count > UINT32_MAX) {
    throw std::invalid_argument(fmt::format("{} files is more than a bench can index", file_count));
  }
  std::vector<uint32_t> order(file_count);
  fill_epoch_order(order, pattern, seed, epoch);
  return order;
}

// ---- Listing ---------------------------------------------------------------------------------

std::vector<BenchFile> list_bench_files(const fs::path& root, uint64_t max_files) {
  std::error_code error;
  const fs::file_status root_status = fs::status(root, error);
  if (error || !fs::exists(root_status)) {
    throw BenchSetupError(fmt::format("{}: {}; give the directory whose files to read",
                                      root.string(),
                                      error ? error.message() : "no such file or directory"));
  }
  if (!fs::is_directory(root_status)) {
    throw BenchSetupError(fmt::format(
        "{} is not a directory: dsfs bench reads every file under a directory", root.string()));
  }

  std::vector<BenchFile> files;
  std::vector<fs::path> directories{root};
  while (!directories.empty()) {
    const fs::path directory = std::move(directories.back());
    directories.pop_back();
    fs::directory_iterator it(directory, error);
    for (const fs::directory_iterator end; !error && it != end; it.increment(error)) {
      const fs::directory_entry& entry = *it;
      std::error_code entry_error;
      const fs::file_status link_status = entry.symlink_status(entry_error);
      if (entry_error) continue;  // gone since it was listed
      if (fs::is_directory(link_status)) {
        directories.push_back(entry.path());
      } else if (fs::is_regular_file(link_status)) {
        const uint64_t size = entry.file_size(entry_error);
        files.push_back({entry.path(), entry_error ? 0 : size});
      } else if (fs::is_symlink(link_status)) {
        const fs::file_status target = fs::status(entry.path(), entry_error);
        if (fs::is_regular_file(target)) {
          const uint64_t size = fs::file_size(entry.path(), entry_error);
          files.push_back({entry.path(), entry_error ? 0 : size});
        } else if (entry_error || !fs::exists(target)) {
          files.push_back({entry.path(), 0});  // dangling: reading it is an error
        }
      }
    }
    if (error) {
      throw BenchSetupError(fmt::format("cannot list {}: {}", directory.string(), error.message()));
    }
  }
  if (files.empty()) {
    throw BenchSetupError(fmt::format("no files to read under {}", root.string()));
  }
  std::sort(files.begin(), files.end(), [](const BenchFile& a, const BenchFile& b) {
    return a.path.native() < b.path.native();  // bytewise, as `LC_ALL=C sort`
  });
  if (max_files > 0 && files.size() > max_files) files.resize(max_files);
  return files;
}

// ---- Latency ---------------------------------------------------------------------------------

namespace {

// Values below 2^7 have a bucket each; above, each power of two is split into 64 buckets.
constexpr unsigned kExactBits = 7;
constexpr uint64_t kExactCount = 1u << kExactBits;
constexpr uint64_t kSubBuckets = kExactCount / 2;
constexpr size_t kBucketCount = kExactCount + (64 - kExactBits) * kSubBuckets;

size_t bucket_of(uint64_t value) {
  if (value < kExactCount) return value;
  const unsigned shift = static_cast<unsigned>(std::bit_width(value)) - kExactBits;
  const uint64_t top = value >> shift;  // in [kSubBuckets, kExactCount)
  return kExactCount + (shift - 1) * kSubBuckets + (top - kSubBuckets);
}

// The middle of the values bucket `index` holds.
uint64_t bucket_middle(size_t index) {
  if (index < kExactCount) return index;
  const uint64_t offset = index - kExactCount;
  const unsigned shift = static_cast<unsigned>(offset / kSubBuckets) + 1;
  const uint64_t lowest = (offset % kSubBuckets + kSubBuckets) << shift;
  return lowest + ((uint64_t{1} << shift) - 1) / 2;
}

}  // namespace

LatencyHistogram::LatencyHistogram() : buckets_(kBucketCount, 0) {}

void LatencyHistogram::record(uint64_t nanoseconds) {
  ++buckets_[bucket_of(nanoseconds)];
  ++count_;
  sum_ += nanoseconds;
  min_ = std::min(min_, nanoseconds);
  max_ = std::max(max_, nanoseconds);
}

void LatencyHistogram::merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < kBucketCount; ++i) buckets_[i] += other.buckets_[i];
  count_ += other.count_;
  sum_ += other.sum_;
  min_ = std::min(min_, other.min_);
  max_ = std::max(max_, other.max_);
}

void LatencyHistogram::clear() {
  std::fill(buckets_.begin(), buckets_.end(), 0);
  count_ = sum_ = max_ = 0;
  min_ = UINT64_MAX;
}

double LatencyHistogram::mean() const {
  return count_ ? static_cast<double>(sum_) / static_cast<double>(count_) : 0;
}

uint64_t LatencyHistogram::percentile(double q) const {
  if (count_ == 0) return 0;
  if (q <= 0) return min_;
  if (q >= 1) return max_;
  const auto rank =
      std::max<uint64_t>(1, static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_))));
  uint64_t seen = 0;
  for (size_t i = 0; i < kBucketCount; ++i) {
    seen += buckets_[i];
    if (seen >= rank) return std::clamp(bucket_middle(i), min_, max_);
  }
  return max_;
}

LatencySummary summarize_latency(const LatencyHistogram& histogram) {
  const auto ms = [](double ns) { return ns / kNanosecondsPerMillisecond; };
  const auto at = [&](double q) { return ms(static_cast<double>(histogram.percentile(q))); };
  return {.count = histogram.count(),
          .min_ms = ms(static_cast<double>(histogram.min())),
          .mean_ms = ms(histogram.mean()),
          .p50_ms = at(0.50),
          .p90_ms = at(0.90),
          .p99_ms = at(0.99),
          .p999_ms = at(0.999),
          .max_ms = ms(static_cast<double>(histogram.max()))};
}

// ---- Figures ---------------------------------------------------------------------------------

double ThroughputFigures::files_per_second() const {
  return seconds > 0 ? static_cast<double>(files) / seconds : 0;
}

double ThroughputFigures::megabytes_per_second() const {
  return seconds > 0 ? static_cast<double>(bytes) / kMegabyte / seconds : 0;
}

nlohmann::json throughput_json(const ThroughputFigures& f) {
  const LatencySummary& l = f.latency;
  return {{"files", f.files},
          {"bytes", f.bytes},
          {"errors", f.errors},
          {"seconds", f.seconds},
          {"files_per_s", f.files_per_second()},
          {"mb_per_s", f.megabytes_per_second()},
          {"latency_ms",
           {{"count", l.count},
            {"min", l.min_ms},
            {"mean", l.mean_ms},
            {"p50", l.p50_ms},
            {"p90", l.p90_ms},
            {"p99", l.p99_ms},
            {"p999", l.p999_ms},
            {"max", l.max_ms}}}};
}

std::string format_throughput(const ThroughputFigures& f) {
  const LatencySummary& l = f.latency;
  return fmt::format(
      "files/s={:.1f}, MB/s={:.1f}, lat (ms): p50={:.3f}, p90={:.3f}, p99={:.3f}, max={:.3f}",
      f.files_per_second(), f.megabytes_per_second(), l.p50_ms, l.p90_ms, l.p99_ms, l.max_ms);
}

// ---- The plan --------------------------------------------------------------------------------

fs::path find_dsfs_mount_root(const fs::path& path) {
  std::error_code error;
  std::vector<fs::path> starts{fs::absolute(path, error).lexically_normal()};
  const fs::path real = fs::weakly_canonical(path, error);
  if (!error && real != starts.front()) starts.push_back(real);
  for (fs::path directory : starts) {
    while (true) {
      if (fs::is_regular_file(directory / kStatsFile, error)) return directory;
      if (!directory.has_relative_path()) break;  // the filesystem root
      directory = directory.parent_path();
    }
  }
  throw BenchSetupError(
      fmt::format("--plan: {} is not inside a dsfs mount (no directory above it holds {}); give a "
                  "directory under a mount (MOUNT/NAME), or leave out --plan",
                  path.string(), kStatsFile));
}

std::vector<std::string> plan_lines_for(const std::vector<BenchFile>& files, const fs::path& root,
                                        const fs::path& mount_root) {
  const auto inside = [&](const fs::path& spelling) -> std::optional<fs::path> {
    const fs::path relative = spelling.lexically_relative(mount_root);
    if (relative.empty() || *relative.begin() == "..") return std::nullopt;
    return relative;
  };
  std::error_code error;
  std::optional<fs::path> prefix = inside(fs::absolute(root, error).lexically_normal());
  if (!prefix) prefix = inside(fs::weakly_canonical(root, error));
  if (!prefix) {
    throw BenchSetupError(fmt::format("--plan: {} is not under the dsfs mount {}", root.string(),
                                      mount_root.string()));
  }
  std::vector<std::string> lines;
  lines.reserve(files.size());
  for (const BenchFile& file : files) {
    lines.push_back((*prefix / file.path.lexically_relative(root)).lexically_normal().string());
  }
  return lines;
}

// ---- The run ---------------------------------------------------------------------------------

void validate_bench_options(const BenchOptions& options) {
  if (options.root.empty()) throw std::invalid_argument("give the directory whose files to read");
  if (options.jobs < 1) throw std::invalid_argument("--jobs must be at least 1");
  if (options.block_size < 1) throw std::invalid_argument("--bs must be at least 1 byte");
  if (options.epochs && *options.epochs < 1) {
    throw std::invalid_argument("--epochs must be at least 1");
  }
  if (options.duration && options.duration->count() <= 0) {
    throw std::invalid_argument("--duration must be positive");
  }
}

BenchResult run_dataset_bench(const BenchOptions& options) {
  validate_bench_options(options);
  std::vector<BenchFile> files = list_bench_files(options.root, options.max_files);
  if (files.size() > UINT32_MAX) {
    throw BenchSetupError(fmt::format("{} files under {}: more than a bench can index; use --files",
                                      files.size(), options.root.string()));
  }
  std::optional<fs::path> mount_root;
  std::vector<std::string> plan_lines;
  if (options.plan) {
    mount_root = find_dsfs_mount_root(options.root);
    plan_lines = plan_lines_for(files, options.root, *mount_root);
  }
  if (options.after_listing) options.after_listing(files);
  if (options.drop_caches) drop_page_cache(options.drop_caches_file);

  BenchResult result = BenchRun(options, files, std::move(mount_root), std::move(plan_lines)).run();
  result.listed_files = files.size();
  for (const BenchFile& file : files) result.listed_bytes += file.size;
  return result;
}

nlohmann::json bench_result_json(const BenchOptions& options, const BenchResult& result) {
  nlohmann::json epochs = nlohmann::json::array();
  for (const BenchEpoch& epoch : result.epochs) {
    nlohmann::json entry = throughput_json(epoch.figures);
    entry["epoch"] = epoch.epoch;
    entry["complete"] = epoch.complete;
    if (options.plan) entry["plan_seconds"] = epoch.plan_seconds;
    epochs.push_back(std::move(entry));
  }
  nlohmann::json first_errors = nlohmann::json::array();
  for (const BenchReadError& error : result.first_errors) {
    first_errors.push_back({{"path", error.path.string()},
                            {"operation", error.operation},
                            {"errno", error.error_number},
                            {"message", std::strerror(error.error_number)}});
  }
  nlohmann::json timeline = nlohmann::json::array();
  for (size_t second = 0; second < result.timeline.size(); ++second) {
    timeline.push_back({{"second", second},
                        {"files", result.timeline[second].files},
                        {"bytes", result.timeline[second].bytes}});
  }
  const nlohmann::json null;  // for settings not given
  const nlohmann::json epochs_requested = options.epochs ? nlohmann::json(*options.epochs) : null;
  const nlohmann::json max_files = options.max_files ? nlohmann::json(options.max_files) : null;
  const nlohmann::json duration_s =
      options.duration ? nlohmann::json(std::chrono::duration<double>(*options.duration).count())
                       : null;
  return {{"tool", "dsfs bench"},
          {"config",
           {{"path", options.root.string()},
            {"pattern", bench_pattern_name(options.pattern)},
            {"epochs", epochs_requested},
            {"jobs", options.jobs},
            {"max_files", max_files},
            {"block_size", options.block_size},
            {"duration_s", duration_s},
            {"seed", options.seed},
            {"drop_caches", options.drop_caches},
            {"plan", options.plan},
            {"listed_files", result.listed_files},
            {"listed_bytes", result.listed_bytes}}},
          {"totals", throughput_json(result.totals)},
          {"epochs", std::move(epochs)},
          {"errors", {{"count", result.totals.errors}, {"first", std::move(first_errors)}}},
          {"timeline", std::move(timeline)}};
}

std::string format_bench_summary(const BenchOptions& options, const BenchResult& result) {
  std::string epochs_requested =
      options.epochs ? fmt::format("{} epoch(s)", *options.epochs) : std::string("epochs");
  if (options.duration) {
    epochs_requested += fmt::format(" for up to {:.1f} s",
                                    std::chrono::duration<double>(*options.duration).count());
  } else if (!options.epochs) {
    epochs_requested = "1 epoch";
  }
  std::string text = fmt::format(
      "dsfs bench: {}: {} files ({}), pattern={} seed={}, {}, jobs={}, bs={}{}{}\n",
      options.root.string(), format_count(result.listed_files),
      format_megabytes(result.listed_bytes), bench_pattern_name(options.pattern), options.seed,
      epochs_requested, options.jobs, format_block_size(options.block_size),
      options.drop_caches ? ", page cache dropped before each epoch" : "",
      options.plan ? ", order written to the mount's plan before each epoch" : "");
  // Many short epochs (a small tree under --duration): the first and last ones tell the story.
  const size_t epoch_count = result.epochs.size();
  const size_t skip_from = epoch_count > kSummaryEpochLines ? kSummaryEpochLines / 2 : epoch_count;
  const size_t skip_to =
      epoch_count > kSummaryEpochLines ? epoch_count - kSummaryEpochLines / 2 : epoch_count;
  for (size_t i = 0; i < epoch_count; ++i) {
    if (i == skip_from && skip_to > skip_from) {
      text += fmt::format("  ... {} more epochs (see --json)\n", skip_to - skip_from);
      i = skip_to;
    }
    const BenchEpoch& epoch = result.epochs[i];
    text += fmt::format("  epoch {}: {} files, {} in {:.2f} s{}: {}\n", epoch.epoch,
                        format_count(epoch.figures.files), format_megabytes(epoch.figures.bytes),
                        epoch.figures.seconds, epoch.complete ? "" : " (cut short)",
                        format_throughput(epoch.figures));
  }
  text += fmt::format("  read: {}\n", format_throughput(result.totals));
  text +=
      fmt::format("  total: {} files, {} in {:.2f} s over {} epoch(s), {} error(s)\n",
                  format_count(result.totals.files), format_megabytes(result.totals.bytes),
                  result.totals.seconds, result.epochs.size(), format_count(result.totals.errors));
  for (const BenchReadError& error : result.first_errors) {
    text += fmt::format("  error: {}: {}: {}\n", error.path.string(), error.operation,
                        std::strerror(error.error_number));
  }
  if (result.totals.errors > result.first_errors.size()) {
    text += fmt::format("  ... and {} more error(s)\n",
                        result.totals.errors - result.first_errors.size());
  }
  return text;
}

void drop_page_cache(const std::filesystem::path& control_file) {
  ::sync();  // dirty pages are not dropped, so write them out first
  ScopedFd fd(::open(control_file.c_str(), O_WRONLY | O_CLOEXEC));
  int error = fd.get() < 0 ? errno : 0;
  if (error == 0 && ::write(fd.get(), "3", 1) != 1) error = errno;
  if (error == 0) error = fd.close();
  if (error != 0) {
    throw std::runtime_error(fmt::format(
        "--drop-caches: cannot write 3 to {}: {}; it needs root and a writable /proc/sys "
        "(run as root, or leave out --drop-caches)",
        control_file.string(), std::strerror(error)));
  }
}

}  // namespace dsfs::tools
