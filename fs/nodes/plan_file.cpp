#include "fs/nodes/plan_file.h"

#include <fmt/core.h>
#include <signal.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <fstream>
#include <string>

#include "src/store/log_text.h"

namespace dsfs::fs {

bool PlanFile::process_exists(Writer writer) {
  if (writer == 0) return true;                             // not known: never taken for gone
  if (writer > static_cast<Writer>(INT_MAX)) return false;  // no process has such an id
  return ::kill(static_cast<pid_t>(writer), 0) == 0 || errno != ESRCH;
}

PlanFile::Writer PlanFile::process_of_thread(Writer thread) {
  if (thread == 0) return 0;
  std::ifstream status(fmt::format("/proc/{}/status", thread));
  std::string line;
  while (std::getline(status, line)) {
    if (!line.starts_with("Tgid:")) continue;
    Writer process = 0;
    const char* begin = line.data() + line.find_first_not_of(" \t", 5);
    const auto [end, error] = std::from_chars(begin, line.data() + line.size(), process);
    return error == std::errc() && process > 0 ? process : thread;
  }
  return thread;
}

void PlanFile::set_line_mapper(LineMapper mapper) {
  MutexLock lock(mutex_);
  mapper_ = std::move(mapper);
}

void PlanFile::forget_locked(Writer writer) {
  const auto it = streams_.find(writer);
  engine_.plan_forget(it->second.plan);
  streams_.erase(it);
}

PlanFile::Stream* PlanFile::stream_locked(Writer writer, bool create) {
  if (const auto it = streams_.find(writer); it != streams_.end()) return &it->second;
  // A new writer: the writers that are gone make room (checked only now, so a long plan's
  // writes cost no system call). The plan of the one written last passes to the new writer,
  // which goes on with it as its own: one process after another writing the plan (`dsfs plan`,
  // then `dsfs plan --append`, or `: > plan`; a restarted loader) replaces, extends or clears
  // the plan the last one left. The others are forgotten.
  std::vector<Writer> gone;
  for (const auto& [known, stream] : streams_) {
    if (!alive_(known)) gone.push_back(known);
  }
  std::optional<Writer> heir;
  for (const Writer known : gone) {
    if (!heir || streams_.at(known).last_written > streams_.at(*heir).last_written) heir = known;
  }
  for (const Writer known : gone) {
    if (known != *heir) forget_locked(known);
  }
  if (heir) {
    // Its last line, unfinished when it exited (no newline at the end, or killed mid-line), is
    // a line of its own: before, the new writer's first line was glued to it.
    end_line_locked(*heir, streams_.at(*heir));
    auto node = streams_.extract(*heir);
    node.key() = writer;
    return &streams_.insert(std::move(node)).position->second;
  }
  if (!create) return nullptr;
  while (streams_.size() >= kMaxPlanWriters) {
    const auto oldest = std::min_element(
        streams_.begin(), streams_.end(),
        [](const auto& a, const auto& b) { return a.second.last_written < b.second.last_written; });
    forget_locked(oldest->first);
  }
  Stream& s = streams_[writer];
  s.plan = ++plans_;
  return &s;
}

void PlanFile::resolve_locked(Stream& s, std::string_view line,
                              std::vector<prefetch::PrefetchEngine::PlannedFile>& out) {
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  while (line.starts_with("./")) line.remove_prefix(2);
  while (line.starts_with('/')) line.remove_prefix(1);
  if (line.empty()) return;
  const std::string_view original = line;
  std::optional<std::string> mapped;
  if (mapper_) {
    mapped = mapper_(line);
    if (mapped) line = *mapped;
  }
  const size_t slash = line.find('/');
  const std::string_view rest = slash == std::string_view::npos ? "" : line.substr(slash + 1);
  if (const std::optional<uint32_t> dataset = tree_.find(line.substr(0, slash))) {
    const catalog::Catalog& catalog = *tree_.dataset(*dataset)->catalog;
    if (const std::optional<uint32_t> entry = catalog.find(rest);
        entry && !catalog.entry(*entry).is_dir) {
      // An empty file has nothing to fetch and is never READ (the kernel knows its size), so
      // the engine would never see it read: its place in the plan would hold the plan's
      // frontier, and with it the window of files fetched ahead, there for good.
      if (catalog.entry(*entry).size > 0) out.push_back({*dataset, *entry});
      return;
    }
  }
  if (s.unresolved++ == 0) s.first_unresolved = std::string(original);
}

void PlanFile::clear_locked(Stream& s) {
  engine_.plan_clear(s.plan);
  std::string().swap(s.partial);
  s.oversized = false;
  s.oversized_lines = 0;
  s.size = 0;
  s.unresolved = 0;
  s.replacing = true;
}

void PlanFile::buffer_locked(Writer writer, Stream& s, std::string_view bytes) {
  if (s.oversized) return;  // the rest of a line already refused
  if (s.partial.size() + bytes.size() <= kMaxPlanLineBytes) {
    s.partial.append(bytes);
    return;
  }
  // No path is this long: the line is refused now, its memory given back, and its bytes up to
  // the next newline dropped as they come.
  s.oversized = true;
  std::string excerpt = s.partial;
  excerpt.append(bytes.substr(0, store::kLogExcerptBytes));
  std::string().swap(s.partial);
  if (s.unresolved++ == 0) s.first_unresolved.clear();  // warned about below, not as a path
  if (s.oversized_lines++ == 0) {
    spdlog::warn(
        "plan (writer {}): a line longer than {} bytes (no path is) is skipped and counted as "
        "unresolved; it begins '{}' (logged once per plan)",
        writer, kMaxPlanLineBytes, store::log_text(excerpt, 64));
  }
}

int PlanFile::refuse(Writer writer, const std::string& what) {
  refused_log_.log(spdlog::level::warn,
                   fmt::format("plan (writer {}): {} refused with EINVAL: write at offset 0 to "
                               "replace the writer's plan, at its end or with O_APPEND to extend "
                               "it, truncate to 0 to clear it (a mount keeps {} writers' plans)",
                               writer, what, kMaxPlanWriters));
  return EINVAL;
}

void PlanFile::warn_unresolved_locked(Writer writer, const Stream& s, uint64_t before) {
  if (s.unresolved > before && before == 0 && !s.first_unresolved.empty()) {
    spdlog::warn(
        "plan (writer {}): '{}' names no file of this mount (paths are relative to the mount, "
        "starting with the dataset name); such lines are skipped",
        writer, store::log_text(s.first_unresolved));
  }
}

void PlanFile::end_line_locked(Writer writer, Stream& s) {
  if (s.partial.empty() || s.oversized) {
    s.oversized = false;
    return;
  }
  const uint64_t unresolved_before = s.unresolved;
  std::vector<prefetch::PrefetchEngine::PlannedFile> resolved;
  resolve_locked(s, s.partial, resolved);
  std::string().swap(s.partial);
  warn_unresolved_locked(writer, s, unresolved_before);
  engine_.plan_extend(s.plan, resolved, s.replacing);
  s.replacing = false;
}

int PlanFile::write(const WriteContext& context, uint64_t offset, std::string_view data) {
  const Writer writer = context.writer;
  MutexLock lock(mutex_);
  Stream* const stream = stream_locked(writer, /*create=*/context.append || offset == 0);
  if (stream == nullptr) {  // a new writer's plan is empty: 0 is its end
    return refuse(writer, fmt::format("a write at offset {}, but it has no plan yet", offset));
  }
  Stream& s = *stream;
  s.last_written = ++write_clock_;
  if (!context.append) {
    // Written over from the start without truncating first: a new plan all the same.
    if (offset == 0 && s.size != 0) clear_locked(s);
    if (offset != s.size) {  // only whole rewrites and appends mean anything
      return refuse(writer,
                    fmt::format("a write at offset {}, but its plan ends at {}", offset, s.size));
    }
  }
  if (s.size == 0) s.replacing = true;
  const uint64_t unresolved_before = s.unresolved;
  s.size += data.size();
  std::vector<prefetch::PrefetchEngine::PlannedFile> resolved;
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const std::string_view piece = data.substr(0, newline);
    if (newline == std::string_view::npos) {
      buffer_locked(writer, s, piece);
      break;
    }
    if (s.partial.empty() && !s.oversized && piece.size() <= kMaxPlanLineBytes) {
      resolve_locked(s, piece, resolved);
    } else {
      buffer_locked(writer, s, piece);
      if (!s.oversized) resolve_locked(s, s.partial, resolved);
      s.partial.clear();
      s.oversized = false;
    }
    data.remove_prefix(newline + 1);
  }
  warn_unresolved_locked(writer, s, unresolved_before);
  engine_.plan_extend(s.plan, resolved, s.replacing);
  s.replacing = false;
  return 0;
}

int PlanFile::truncate(Writer writer, uint64_t size) {
  MutexLock lock(mutex_);
  Stream* const stream = stream_locked(writer, /*create=*/false);
  // A writer not yet known, with no plan to go on with, has an empty one.
  if (stream == nullptr) {
    return size == 0 ? 0
                     : refuse(writer, fmt::format("a truncation to {}, but it has no plan", size));
  }
  Stream& s = *stream;
  s.last_written = ++write_clock_;
  if (size == s.size) return 0;
  if (size != 0) {
    return refuse(writer,
                  fmt::format("a truncation to {}, but its plan has {} bytes", size, s.size));
  }
  clear_locked(s);
  return 0;
}

uint64_t PlanFile::size() const {
  MutexLock lock(mutex_);
  uint64_t largest = 0;
  for (const auto& [writer, s] : streams_) largest = std::max(largest, s.size);
  return largest;
}

uint64_t PlanFile::unresolved() const {
  MutexLock lock(mutex_);
  uint64_t total = 0;
  for (const auto& [writer, s] : streams_) total += s.unresolved;
  return total;
}

size_t PlanFile::writers() const {
  MutexLock lock(mutex_);
  return streams_.size();
}

}  // namespace dsfs::fs
