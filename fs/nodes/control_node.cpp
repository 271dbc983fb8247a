#include "fs/nodes/control_node.h"

#include <spdlog/spdlog.h>

#include <ctime>
#include <stdexcept>

#include "src/catalog/names.h"

namespace dsfs::fs {

std::optional<Attributes> ControlNode::stat(const InodeRef& ref) {
  const int64_t now = std::time(nullptr);
  switch (ref.kind) {
    case InodeRef::Kind::kControlDir:
      return tree_.generated(kControlDirInode, S_IFDIR | 0555, 2, kDirectorySize,
                             tree_.mounted_unix());
    case InodeRef::Kind::kPlan: {
      // Write-only for the owner, and its size changes with every write.
      Attributes a = tree_.generated(kPlanInode, S_IFREG | 0200, 1, plan_.size(), now);
      a.timeout = 0;
      return a;
    }
    case InodeRef::Kind::kRefresh: {
      Attributes a = tree_.generated(kRefreshInode, S_IFREG | 0200, 1, 0, now);
      a.timeout = 0;
      return a;
    }
    case InodeRef::Kind::kStats: {
      // Only a name: lookups answer with a snapshot inode, so nothing reads this one.
      Attributes a = tree_.generated(kStatsInode, S_IFREG | 0444, 1, 0, now);
      a.timeout = 0;
      return a;
    }
    default: {
      const Snapshot text = snapshot(ref.ino);
      if (!text) return std::nullopt;
      return tree_.generated(ref.ino, S_IFREG | 0444, 1, text->size(), now);
    }
  }
}

Found ControlNode::lookup(const InodeRef& dir, std::string_view name) {
  if (dir.kind != InodeRef::Kind::kControlDir) return {};
  if (name == kPlanFileName) return {kPlanInode};
  if (name == kRefreshFileName) return {kRefreshInode};
  if (name != kStatsFileName) return {};
  auto text = std::make_shared<const std::string>(render_stats_());
  MutexLock lock(snapshots_mutex_);
  const uint64_t ino = ++last_snapshot_;
  snapshots_.emplace(ino, CountedSnapshot{std::move(text), 1});
  return {ino, /*cacheable=*/false};
}

int ControlNode::list(const InodeRef& dir, uint64_t from, DirectorySink& out) {
  if (dir.kind != InodeRef::Kind::kControlDir) return ENOTDIR;
  // A stats.json entry must not be cached: only a lookup hands out its snapshot inode.
  if (from <= 0 && !out.add(kStatsFileName, kStatsInode, 0, /*cacheable=*/false)) return 0;
  if (from <= 1 && !out.add(kPlanFileName, kPlanInode, 1)) return 0;
  if (from <= 2) out.add(kRefreshFileName, kRefreshInode, 2);
  return 0;
}

int ControlNode::open(const InodeRef& ref) {
  switch (ref.kind) {
    case InodeRef::Kind::kControlDir:
      return EISDIR;
    case InodeRef::Kind::kPlan:
    case InodeRef::Kind::kRefresh:
      return 0;
    case InodeRef::Kind::kStatsSnapshot:
      return snapshot(ref.ino) ? 0 : ENOENT;
    default:
      return ENOENT;
  }
}

int ControlNode::read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) {
  switch (ref.kind) {
    case InodeRef::Kind::kPlan:
    case InodeRef::Kind::kRefresh:
      return 0;
    case InodeRef::Kind::kStatsSnapshot: {
      // The reply holds its own reference: FORGET may drop the snapshot on another thread as
      // soon as the reader has the bytes, while this one is still sending them.
      Snapshot text = snapshot(ref.ino);
      if (!text) return ESTALE;
      const std::string_view bytes = *text;
      out.add_range(bytes, offset, size, std::move(text));
      return 0;
    }
    case InodeRef::Kind::kControlDir:
      return EISDIR;
    default:
      return ENOENT;
  }
}

int ControlNode::write(const InodeRef& ref, uint64_t offset, std::string_view data,
                       const WriteContext& context) {
  if (ref.kind == InodeRef::Kind::kRefresh) return refresh(data);
  if (ref.kind != InodeRef::Kind::kPlan) return EROFS;
  return plan_.write(context, offset, data);
}

int ControlNode::truncate(const InodeRef& ref, uint64_t size, const WriteContext& context) {
  if (ref.kind == InodeRef::Kind::kRefresh) return 0;  // O_TRUNC: each write stands alone
  if (ref.kind != InodeRef::Kind::kPlan) return EROFS;
  return plan_.truncate(context.writer, size);
}

int ControlNode::refresh(std::string_view data) {
  if (!refresh_) return EROFS;
  std::vector<std::string> names;
  size_t at = 0;
  while (at < data.size()) {
    const size_t start = data.find_first_not_of(" \t\r\n", at);
    if (start == std::string_view::npos) break;
    const size_t end = std::min(data.find_first_of(" \t\r\n", start), data.size());
    std::string name(data.substr(start, end - start));
    try {
      catalog::validate_dataset_name(name);
    } catch (const std::invalid_argument& e) {
      spdlog::warn("{}/{}: {} (EINVAL)", kControlDirName, kRefreshFileName, e.what());
      return EINVAL;
    }
    names.push_back(std::move(name));
    at = end;
  }
  return refresh_(names);
}

void ControlNode::forget(uint64_t ino, uint64_t lookups) {
  MutexLock lock(snapshots_mutex_);
  const auto it = snapshots_.find(ino);
  if (it == snapshots_.end()) return;
  if (it->second.lookups <= lookups) {
    snapshots_.erase(it);
  } else {
    it->second.lookups -= lookups;
  }
}

size_t ControlNode::snapshot_count() const {
  MutexLock lock(snapshots_mutex_);
  return snapshots_.size();
}

ControlNode::Snapshot ControlNode::snapshot(uint64_t ino) const {
  MutexLock lock(snapshots_mutex_);
  const auto it = snapshots_.find(ino);
  return it == snapshots_.end() ? nullptr : it->second.text;
}

}  // namespace dsfs::fs
