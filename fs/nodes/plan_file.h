#pragma once
// MOUNT/.dsfs/plan, the write protocol: writes are assembled into lines, each line a path
// relative to the mount, resolved to a dataset file and handed to the prefetch engine in order.
// Writing at offset 0 replaces the plan, writing at its end extends it, truncating to 0 clears
// it; any other offset is EINVAL. A line longer than kMaxPlanLineBytes (no path is) is not
// buffered: its bytes are dropped up to its newline and it counts as unresolved. The engine
// receives resolved files only and knows nothing of lines or errno.
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fs/node.h"
#include "prefetch/engine.h"
#include "src/store/thread_annotations.h"

namespace dsfs::fs {

// The longest plan line (a path relative to the mount) that is read: PATH_MAX, with its newline.
inline constexpr size_t kMaxPlanLineBytes = 4096;

// Thread safety: internally synchronized (mutex_ serializes writes: a plan is one stream).
class PlanFile {
 public:
  PlanFile(const MountTree& tree, prefetch::PrefetchEngine& engine)
      : tree_(tree), engine_(engine) {}

  // Maps a line to the dataset path it stands for ("" when it stands for none of its own), e.g.
  // a .views file to its source image. Set before the first write; called under mutex_.
  using LineMapper = std::function<std::optional<std::string>(std::string_view line)>;
  void set_line_mapper(LineMapper mapper);

  // 0, or EINVAL for an offset that neither starts nor extends the plan.
  int write(uint64_t offset, std::string_view data);
  // 0 (to 0 or to the current size), or EINVAL.
  int truncate(uint64_t size);
  uint64_t size() const;
  uint64_t unresolved() const;  // lines of the current plan that named no file

 private:
  void clear_locked() DSFS_REQUIRES(mutex_);
  // Appends the file `line` names to `out`, or counts the line as unresolved.
  void resolve_locked(std::string_view line,
                      std::vector<prefetch::PrefetchEngine::PlannedFile>& out)
      DSFS_REQUIRES(mutex_);
  // Appends `bytes` of a line to partial_, or drops them once the line is too long.
  void buffer_locked(std::string_view bytes) DSFS_REQUIRES(mutex_);

  const MountTree& tree_;
  prefetch::PrefetchEngine& engine_;
  mutable Mutex mutex_;
  LineMapper mapper_ DSFS_GUARDED_BY(mutex_);
  uint64_t size_ DSFS_GUARDED_BY(mutex_) = 0;
  // The unfinished last line (at most kMaxPlanLineBytes; a longer one is skipped to its
  // newline, oversized_ says so).
  std::string partial_ DSFS_GUARDED_BY(mutex_);
  bool oversized_ DSFS_GUARDED_BY(mutex_) = false;
  uint64_t oversized_lines_ DSFS_GUARDED_BY(mutex_) = 0;
  bool replacing_ DSFS_GUARDED_BY(mutex_) = false;  // the next files begin a new plan
  uint64_t unresolved_ DSFS_GUARDED_BY(mutex_) = 0;
  std::string first_unresolved_ DSFS_GUARDED_BY(mutex_);
};

}  // namespace dsfs::fs
