#include "fs/nodes/plan_file.h"

#include <spdlog/spdlog.h>

#include "src/store/log_text.h"

namespace dsfs::fs {

void PlanFile::set_line_mapper(LineMapper mapper) {
  MutexLock lock(mutex_);
  mapper_ = std::move(mapper);
}

void PlanFile::resolve_locked(std::string_view line,
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
  if (unresolved_++ == 0) first_unresolved_ = std::string(original);
}

void PlanFile::clear_locked() {
  engine_.plan_clear();
  std::string().swap(partial_);
  oversized_ = false;
  oversized_lines_ = 0;
  size_ = 0;
  unresolved_ = 0;
  replacing_ = true;
}

void PlanFile::buffer_locked(std::string_view bytes) {
  if (oversized_) return;  // the rest of a line already refused
  if (partial_.size() + bytes.size() <= kMaxPlanLineBytes) {
    partial_.append(bytes);
    return;
  }
  // No path is this long: the line is refused now, its memory given back, and its bytes up to
  // the next newline dropped as they come.
  oversized_ = true;
  std::string excerpt = partial_;
  excerpt.append(bytes.substr(0, store::kLogExcerptBytes));
  std::string().swap(partial_);
  if (unresolved_++ == 0) first_unresolved_.clear();  // warned about below, not as a path
  if (oversized_lines_++ == 0) {
    spdlog::warn(
        "plan: a line longer than {} bytes (no path is) is skipped and counted as unresolved; "
        "it begins '{}' (logged once per plan)",
        kMaxPlanLineBytes, store::log_text(excerpt, 64));
  }
}

int PlanFile::write(uint64_t offset, std::string_view data) {
  MutexLock lock(mutex_);
  // Written over from the start without truncating first: a new plan all the same.
  if (offset == 0 && size_ != 0) clear_locked();
  if (offset != size_) return EINVAL;  // only whole rewrites and appends mean anything
  if (size_ == 0) replacing_ = true;
  const uint64_t unresolved_before = unresolved_;
  size_ += data.size();
  std::vector<prefetch::PrefetchEngine::PlannedFile> resolved;
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const std::string_view piece = data.substr(0, newline);
    if (newline == std::string_view::npos) {
      buffer_locked(piece);
      break;
    }
    if (partial_.empty() && !oversized_ && piece.size() <= kMaxPlanLineBytes) {
      resolve_locked(piece, resolved);
    } else {
      buffer_locked(piece);
      if (!oversized_) resolve_locked(partial_, resolved);
      partial_.clear();
      oversized_ = false;
    }
    data.remove_prefix(newline + 1);
  }
  if (unresolved_ > unresolved_before && unresolved_before == 0 && !first_unresolved_.empty()) {
    spdlog::warn(
        "plan: '{}' names no file of this mount (paths are relative to the mount, "
        "starting with the dataset name); such lines are skipped",
        store::log_text(first_unresolved_));
  }
  engine_.plan_extend(resolved, replacing_);
  replacing_ = false;
  return 0;
}

int PlanFile::truncate(uint64_t size) {
  MutexLock lock(mutex_);
  if (size == size_) return 0;
  if (size != 0) return EINVAL;
  clear_locked();
  return 0;
}

uint64_t PlanFile::size() const {
  MutexLock lock(mutex_);
  return size_;
}

uint64_t PlanFile::unresolved() const {
  MutexLock lock(mutex_);
  return unresolved_;
}

}  // namespace dsfs::fs
