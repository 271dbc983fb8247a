#pragma once
// Progress of a long operation (ingest, rm): a bar redrawn in place on a terminal, a plain line
// every few seconds otherwise. Counters are updated from any thread; drawing runs on its own.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace dsfs::tools {

struct ProgressSnapshot {
  uint64_t files_done = 0;
  uint64_t files_total = 0;  // 0: unknown
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;  // 0: unknown
  // For streaming inputs whose totals are unknown: how much of the input has been consumed.
  uint64_t input_done = 0;
  uint64_t input_total = 0;
  double seconds = 0;
  std::string_view unit = "files";  // what files_done counts
  bool show_bytes = true;
};

// "12,345/50,000 files  1,320.5/5,400.0 MB  210.3 MB/s  ETA 0:19" (unknown parts left out).
std::string format_progress(const ProgressSnapshot& snapshot);
// Seconds left by the best-known fraction done, or a negative number when unknown.
double estimate_seconds_left(const ProgressSnapshot& snapshot);
// "1:02:03" / "2:03".
std::string format_duration(double seconds);
// 1234567 -> "1,234,567".
std::string format_count(uint64_t value);

enum class ProgressStyle { kAuto, kBar, kLines, kQuiet };
// A --progress value: "bar", "lines", "none"; anything else (i.e. "auto") is kAuto.
ProgressStyle parse_progress_style(std::string_view text);

struct ProgressOptions {
  ProgressStyle style = ProgressStyle::kAuto;  // kAuto: a bar on a terminal, lines otherwise
  std::string unit = "files";                  // what the count counts
  bool show_bytes = true;
  std::FILE* out = stderr;
  std::chrono::milliseconds line_interval{5000};
};

class Progress {
 public:
  explicit Progress(std::string label, ProgressOptions options = {});
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void set_totals(uint64_t files, uint64_t bytes);
  void add(uint64_t files, uint64_t bytes);
  void set_input_position(uint64_t done, uint64_t total);
  ProgressSnapshot snapshot() const;
  // Stops drawing and clears the bar; later updates are not shown. Idempotent.
  void stop();

 private:
  void draw_loop();
  void draw();

  const std::string label_;
  ProgressOptions options_;
  const std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::atomic<uint64_t> files_done_{0};
  std::atomic<uint64_t> files_total_{0};
  std::atomic<uint64_t> bytes_done_{0};
  std::atomic<uint64_t> bytes_total_{0};
  std::atomic<uint64_t> input_done_{0};
  std::atomic<uint64_t> input_total_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  size_t last_width_ = 0;
  std::thread drawer_;
};

}  // namespace dsfs::tools
