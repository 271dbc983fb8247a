#include "tools/progress.h"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace dsfs::tools {
namespace {

constexpr double kMegabyte = 1e6;
constexpr auto kBarInterval = std::chrono::milliseconds(200);

}  // namespace

std::string format_count(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string grouped;
  grouped.reserve(digits.size() + digits.size() / 3);
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

std::string format_duration(double seconds) {
  const auto total = static_cast<uint64_t>(std::llround(std::max(seconds, 0.0)));
  const uint64_t hours = total / 3600;
  const uint64_t minutes = total / 60 % 60;
  const uint64_t secs = total % 60;
  if (hours > 0) return fmt::format("{}:{:02}:{:02}", hours, minutes, secs);
  return fmt::format("{}:{:02}", minutes, secs);
}

double estimate_seconds_left(const ProgressSnapshot& s) {
  double fraction = -1;
  if (s.bytes_total > 0) {
    fraction = static_cast<double>(s.bytes_done) / static_cast<double>(s.bytes_total);
  } else if (s.input_total > 0) {
    fraction = static_cast<double>(s.input_done) / static_cast<double>(s.input_total);
  } else if (s.files_total > 0) {
    fraction = static_cast<double>(s.files_done) / static_cast<double>(s.files_total);
  }
  if (fraction <= 0 || s.seconds <= 0) return -1;
  fraction = std::min(fraction, 1.0);
  return s.seconds * (1 - fraction) / fraction;
}

std::string format_progress(const ProgressSnapshot& s) {
  std::string line = format_count(s.files_done);
  // fmt, not "/" + string: GCC 12 at -O3 warns falsely on that (-Wrestrict, GCC bug 105329).
  if (s.files_total > 0) line += fmt::format("/{}", format_count(s.files_total));
  line += fmt::format(" {}", s.unit);
  if (s.show_bytes) {
    line += fmt::format("  {:.1f}", static_cast<double>(s.bytes_done) / kMegabyte);
    if (s.bytes_total > 0) {
      line += fmt::format("/{:.1f}", static_cast<double>(s.bytes_total) / kMegabyte);
    }
    line += " MB";
    if (s.seconds > 0) {
      line +=
          fmt::format("  {:.1f} MB/s", static_cast<double>(s.bytes_done) / kMegabyte / s.seconds);
    }
  } else if (s.seconds > 0) {
    line += fmt::format("  {:.0f} {}/s", static_cast<double>(s.files_done) / s.seconds, s.unit);
  }
  if (const double left = estimate_seconds_left(s); left >= 0) {
    line += "  ETA " + format_duration(left);
  }
  return line;
}

ProgressStyle parse_progress_style(std::string_view text) {
  if (text == "bar") return ProgressStyle::kBar;
  if (text == "lines") return ProgressStyle::kLines;
  if (text == "none") return ProgressStyle::kQuiet;
  return ProgressStyle::kAuto;
}

Progress::Progress(std::string label, ProgressOptions options)
    : label_(std::move(label)), options_(std::move(options)) {
  if (options_.style == ProgressStyle::kAuto) {
    options_.style = ::isatty(::fileno(options_.out)) ? ProgressStyle::kBar : ProgressStyle::kLines;
  }
  if (options_.style == ProgressStyle::kBar) options_.line_interval = kBarInterval;
  if (options_.style != ProgressStyle::kQuiet) drawer_ = std::thread([this] { draw_loop(); });
}

Progress::~Progress() {
  stop();
}

void Progress::set_totals(uint64_t files, uint64_t bytes) {
  files_total_ = files;
  bytes_total_ = bytes;
}

void Progress::add(uint64_t files, uint64_t bytes) {
  files_done_ += files;
  bytes_done_ += bytes;
}

void Progress::set_input_position(uint64_t done, uint64_t total) {
  input_done_ = done;
  input_total_ = total;
}

ProgressSnapshot Progress::snapshot() const {
  ProgressSnapshot s;
  s.files_done = files_done_;
  s.files_total = files_total_;
  s.bytes_done = bytes_done_;
  s.bytes_total = bytes_total_;
  s.input_done = input_done_;
  s.input_total = input_total_;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  s.unit = options_.unit;
  s.show_bytes = options_.show_bytes;
  return s;
}

void Progress::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (drawer_.joinable()) drawer_.join();
  if (options_.style == ProgressStyle::kBar && last_width_ > 0) {
    // Clear the bar so the summary that follows starts on a clean line.
    fmt::print(options_.out, "\r{:{}}\r", "", last_width_);
    std::fflush(options_.out);
  }
}

void Progress::draw_loop() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, options_.line_interval, [this] { return stopping_; })) {
    lock.unlock();
    draw();
    lock.lock();
  }
}

void Progress::draw() {
  const std::string text = fmt::format("{}: {}", label_, format_progress(snapshot()));
  if (options_.style == ProgressStyle::kBar) {
    // Pad over what the previous, possibly longer, line left behind.
    fmt::print(options_.out, "\r{:<{}}", text, std::max(last_width_, text.size()));
    last_width_ = std::max(last_width_, text.size());
  } else {
    fmt::print(options_.out, "{}\n", text);
  }
  std::fflush(options_.out);
}

}  // namespace dsfs::tools
