#pragma once
// MOUNT/.dsfs/plan, the write protocol: writes are assembled into lines, each line a path
// relative to the mount, resolved to a dataset file and handed to the prefetch engine in order.
// Each writing process has a plan of its own (several loaders, e.g. DDP ranks on one node, share
// a mount): writing at offset 0 replaces the writer's plan, writing at its end (or through
// O_APPEND, wherever the kernel puts it) extends it, truncating to 0 clears it; any other offset
// is EINVAL. A new writer takes over the plan of the last writer that exited, if any. A line longer
// than kMaxPlanLineBytes (no path is) is not buffered: its bytes are dropped up to its newline and
// it counts as unresolved. A writer's last line without a newline is read when another process
// takes its plan over (the first write after it exited), never glued to that writer's first line.
// The engine receives resolved files only, under the writer's id, and knows nothing of lines or
// errno.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fs/node.h"
#include "prefetch/engine.h"
#include "src/store/log_limiter.h"
#include "src/store/thread_annotations.h"

namespace dsfs::fs {

// The longest plan line (a path relative to the mount) that is read: PATH_MAX, with its newline.
inline constexpr size_t kMaxPlanLineBytes = 4096;
// The most writers whose plans are kept; beyond it the least recently written is forgotten.
inline constexpr size_t kMaxPlanWriters = 64;

// The plan file: one write stream per writer (the writing process), each the plan the engine
// follows for that writer.
//
// Contract, per writer: a write at offset 0 when the writer has written starts a new plan
// (replacing that writer's plan only); a write at the writer's size, or any write with
// `append`, extends it; any other offset is EINVAL. truncate(writer, 0) clears the writer's
// plan, truncate to the writer's size is a no-op, anything else is EINVAL. size() (what stat
// shows) is the largest writer's size, unresolved() the unresolved lines of every writer's
// current plan. When a writer not yet known first writes or truncates, the writers that are
// gone (their process no longer exists, by `alive`) are dropped: the one written last is taken
// over by the new writer, which goes on with its plan as its own (so one process after another
// can replace, extend or clear the plan: `dsfs plan`, then `dsfs plan --append`; a restarted
// loader replaces its predecessor's plan), the others are forgotten (engine plan_forget). Beyond
// kMaxPlanWriters the least recently written is forgotten. The engine knows each plan by an id
// of the plan file's, not by the pid.
//
// Thread safety: internally synchronized; mutex_ serializes every write and truncation (the
// engine is called under it, in the order the writes came).
class PlanFile {
 public:
  using Writer = prefetch::PrefetchEngine::PlanWriter;
  // Whether `writer` may still write (by default: its process exists, or it is 0, unknown).
  using Liveness = std::function<bool(Writer writer)>;
  static bool process_exists(Writer writer);
  // The process (thread group) a FUSE request's thread belongs to: the kernel sends the calling
  // thread's id, and a loader's threads (dsfs bench writes each epoch's plan from another one)
  // write one plan. The id itself when /proc does not say (the thread is gone).
  static Writer process_of_thread(Writer thread);

  PlanFile(const MountTree& tree, prefetch::PrefetchEngine& engine,
           Liveness alive = &PlanFile::process_exists)
      : tree_(tree), engine_(engine), alive_(std::move(alive)) {}

  // Maps a line to the dataset path it stands for ("" when it stands for none of its own), e.g.
  // a .views file to its source image. Set before the first write; called under mutex_.
  using LineMapper = std::function<std::optional<std::string>(std::string_view line)>;
  void set_line_mapper(LineMapper mapper);

  // 0, or EINVAL for an offset that neither starts nor extends the writer's plan.
  int write(const WriteContext& context, uint64_t offset, std::string_view data);
  // 0 (to 0 or to the writer's size), or EINVAL.
  int truncate(Writer writer, uint64_t size);
  uint64_t size() const;        // the largest writer's size
  uint64_t unresolved() const;  // lines of the writers' current plans that named no file
  size_t writers() const;       // writers known (each has or had a plan)

 private:
  // One writer's stream.
  struct Stream {
    Writer plan = 0;  // the id the engine knows the plan by (not a pid: a plan outlives one)
    uint64_t size = 0;
    // The unfinished last line (at most kMaxPlanLineBytes; a longer one is skipped to its
    // newline, oversized says so).
    std::string partial;
    bool oversized = false;
    uint64_t oversized_lines = 0;
    bool replacing = false;  // the next files begin a new plan
    uint64_t unresolved = 0;
    std::string first_unresolved;
    uint64_t last_written = 0;  // write_clock_ at its last write
  };

  // The stream of `writer`. For a new writer, the writers that are gone are dropped, but for
  // the one written last whose stream the new writer takes over; without one a stream is made
  // if `create` (nullptr otherwise).
  Stream* stream_locked(Writer writer, bool create) DSFS_REQUIRES(mutex_);
  void forget_locked(Writer writer) DSFS_REQUIRES(mutex_);
  void clear_locked(Stream& s) DSFS_REQUIRES(mutex_);
  // Appends the file `line` names to `out`, or counts the line as unresolved.
  void resolve_locked(Stream& s, std::string_view line,
                      std::vector<prefetch::PrefetchEngine::PlannedFile>& out)
      DSFS_REQUIRES(mutex_);
  // The writer's unfinished last line as a line of its own (the writer is gone: nothing will
  // finish it); its file joins the plan.
  void end_line_locked(Writer writer, Stream& s) DSFS_REQUIRES(mutex_);
  // EINVAL for a write or truncation of `writer` that means nothing (`what`), logged (limited).
  int refuse(Writer writer, const std::string& what);
  store::LogLimiter refused_log_;
  // Logs the first line that named no file, once per plan (`before`: s.unresolved until now).
  void warn_unresolved_locked(Writer writer, const Stream& s, uint64_t before)
      DSFS_REQUIRES(mutex_);
  // Appends `bytes` of a line to s.partial, or drops them once the line is too long.
  void buffer_locked(Writer writer, Stream& s, std::string_view bytes) DSFS_REQUIRES(mutex_);

  const MountTree& tree_;
  prefetch::PrefetchEngine& engine_;
  const Liveness alive_;
  mutable Mutex mutex_;
  LineMapper mapper_ DSFS_GUARDED_BY(mutex_);
  std::unordered_map<Writer, Stream> streams_ DSFS_GUARDED_BY(mutex_);
  uint64_t write_clock_ DSFS_GUARDED_BY(mutex_) = 0;
  Writer plans_ DSFS_GUARDED_BY(mutex_) = 0;  // the last plan id given
};

}  // namespace dsfs::fs
