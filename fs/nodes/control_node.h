#pragma once
// MOUNT/.dsfs/: stats.json (the mount's live counters), plan (the prefetch hint) and refresh
// (writing dataset names switches them to their current generation; `dsfs refresh` writes it).
// plan and refresh are the only writable files of a mount.
//
// stats.json: every lookup renders a snapshot under a new inode (entry timeout 0). A snapshot
// never changes, so it is served like any immutable file, page cache included, which is what
// lets the mount skip OPEN (no per-open direct_io). FORGET frees a snapshot; any left when the
// kernel unmounts without forgetting are freed with the node.
#include <functional>

#include "fs/node.h"
#include "fs/nodes/plan_file.h"
#include "prefetch/engine.h"
#include "src/store/thread_annotations.h"

namespace dsfs::fs {

// Thread safety: snapshots_mutex_ guards the snapshot table; the plan file synchronizes itself.
class ControlNode final : public Node {
 public:
  // Refreshes the named datasets (empty: all), returning 0 or an errno.
  using Refresh = std::function<int(const std::vector<std::string>& names)>;

  // `render_stats` renders stats.json's text; called on lookups, from any thread. `refresh`
  // runs each write to the refresh file, on the writer's FUSE thread.
  ControlNode(const MountTree& tree, std::function<std::string()> render_stats,
              prefetch::PrefetchEngine& engine, Refresh refresh = {})
      : tree_(tree),
        render_stats_(std::move(render_stats)),
        refresh_(std::move(refresh)),
        plan_(tree, engine) {}

  std::optional<Attributes> stat(const InodeRef& ref) override;
  bool is_directory(const InodeRef& ref) override {
    return ref.kind == InodeRef::Kind::kControlDir;
  }
  // "stats.json" is a new snapshot inode with one lookup, not to be cached.
  Found lookup(const InodeRef& dir, std::string_view name) override;
  int list(const InodeRef& dir, uint64_t from, DirectorySink& out) override;
  int open(const InodeRef& ref) override;
  // A snapshot's text (ESTALE once forgotten); the plan reads as empty (it is write-only:
  // stats.json reports what it holds).
  int read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) override;
  // The plan: one per writer (PlanFile): writing at 0 replaces the writer's plan, at its end or
  // O_APPEND extends it; truncating to 0 clears it.
  // The refresh file: each write is one request, dataset names separated by white space
  // (none: every dataset); EINVAL for a name that is not a dataset name, else what the refresh
  // returned (ENOENT: not published; EIO: Redis or the dataset failed, see the log).
  int write(const InodeRef& ref, uint64_t offset, std::string_view data,
            const WriteContext& context) override;
  int truncate(const InodeRef& ref, uint64_t size, const WriteContext& context) override;
  void forget(uint64_t ino, uint64_t lookups) override;

  size_t snapshot_count() const;
  PlanFile& plan() { return plan_; }
  const PlanFile& plan() const { return plan_; }

 private:
  using Snapshot = std::shared_ptr<const std::string>;
  Snapshot snapshot(uint64_t ino) const;  // nullptr for an unknown inode
  int refresh(std::string_view data);

  struct CountedSnapshot {
    Snapshot text;
    uint64_t lookups = 0;
  };
  const MountTree& tree_;
  const std::function<std::string()> render_stats_;
  const Refresh refresh_;
  PlanFile plan_;
  mutable Mutex snapshots_mutex_;
  std::unordered_map<uint64_t, CountedSnapshot> snapshots_ DSFS_GUARDED_BY(snapshots_mutex_);
  uint64_t last_snapshot_ DSFS_GUARDED_BY(snapshots_mutex_) = kStatsSnapshotBase;
};

}  // namespace dsfs::fs
