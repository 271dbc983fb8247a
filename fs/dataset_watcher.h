#pragma once
// Keeps a mount's datasets in step with Redis while it is mounted: a dataset published after the
// mount is listed within one poll, a removed one is unlisted, and a re-ingested one switches to
// its new generation when asked (`dsfs refresh`, which writes MOUNT/.dsfs/refresh) or at once
// with --follow-updates. A switch lists the new generation under a new dataset index
// (MountTree), so a file open under the old one keeps reading the old generation's bytes, never
// a mix of two.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fs/node.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "src/store/thread_annotations.h"

namespace dsfs::fs {

class GenerationLeases;

inline constexpr std::chrono::milliseconds kDefaultWatchInterval{2000};

struct WatchOptions {
  // The datasets the mount was asked for; empty: every published dataset, new ones included.
  std::vector<std::string> names;
  // How often Redis is asked for changes; 0: never (only `dsfs refresh` changes the mount).
  std::chrono::milliseconds interval = kDefaultWatchInterval;
  // Switch to a re-ingested dataset's new generation as soon as it is seen.
  bool follow_updates = false;
};

struct WatchStats {
  uint64_t polls = 0;          // passes over Redis, polls and refreshes
  uint64_t poll_failures = 0;  // passes that could not reach Redis
  uint64_t added = 0;          // datasets listed after the mount
  uint64_t removed = 0;        // datasets unlisted because they were removed
  uint64_t refreshed = 0;      // datasets switched to a new generation
  // Datasets with a newer generation than the one listed, not switched to yet.
  std::map<std::string, uint64_t> pending;
};

// Thread safety: every public member may be called from any thread; passes over Redis (polls
// and refreshes) run one at a time under pass_mutex_, and only they change the tree.
class DatasetWatcher {
 public:
  // Told, after a pass changed the tree, the names whose listing changed. Called on the thread
  // that ran the pass, outside the watcher's locks.
  using ChangeListener = std::function<void(const std::vector<std::string>& names)>;

  // Asks Redis through `client` (the mount's). `leases` (may be null) pins each generation
  // listed and is told of those unlisted. Both must outlive the watcher.
  DatasetWatcher(MountTree& tree, store::Client& client, catalog::KeySchema keys,
                 WatchOptions options, GenerationLeases* leases, ChangeListener on_change);
  ~DatasetWatcher();  // stop()
  DatasetWatcher(const DatasetWatcher&) = delete;
  DatasetWatcher& operator=(const DatasetWatcher&) = delete;

  // Starts polling (options.interval > 0). Call after any fork. Idempotent.
  void start();
  void stop();

  // One pass now that also switches `names` (empty: every listed dataset) to their current
  // generation. Returns 0; ENOENT if a name is neither listed nor published; EIO if Redis could
  // not be reached or a dataset could not be loaded (the log says which and why).
  int refresh(const std::vector<std::string>& names);

  WatchStats stats() const;
  const WatchOptions& options() const { return options_; }

  // The tree's listing as of the last pass whose listener has returned (at first, the tree's):
  // what stats.json shows. A switch shows here only after the listener told the kernel to forget
  // the old generation's names, so a path opened once stats show a generation reads that one.
  std::shared_ptr<const MountTree::Listing> announced_listing() const;

 private:
  // A pass's outcome: the names whose listing it changed and how (added, removed, refreshed),
  // its number and the tree's listing after it (null until it ran).
  struct PassResult {
    std::vector<std::string> changed;
    WatchStats counted;
    uint64_t number = 0;
    std::shared_ptr<const MountTree::Listing> listing;
  };
  // Compares the tree with Redis and applies what changed; switches the datasets in `update`
  // (all of them when null and following updates). Records each change in `result` as it makes
  // it, so that a pass that throws midway (store errors when Redis cannot be reached) still says
  // what it changed.
  void pass(const std::set<std::string>* update, int& error, PassResult& result)
      DSFS_REQUIRES(pass_mutex_);
  // One pass under pass_mutex_, numbered, its listing taken and its changes counted in the stats
  // even when it throws (rethrown).
  void run_pass(const std::set<std::string>* update, int& error, PassResult& result);
  // Numbers a pass that ran (finished or not), takes its listing and adds its changes to the stats.
  void seal(PassResult& result) DSFS_REQUIRES(pass_mutex_);
  // Loads and pins the current generation of `name` and lists it. False (logged) if it cannot
  // be served; store errors propagate.
  bool list_current(const std::string& name, const prefetch::DatasetSnapshot* replacing)
      DSFS_REQUIRES(pass_mutex_);
  void drop_lease(const std::string& name, uint64_t generation) DSFS_REQUIRES(pass_mutex_);
  // After a pass that ran (finished or not): tells the listener what it changed, then makes its
  // listing the announced one unless a later pass's already is.
  void announce(PassResult& result);
  void poll_loop(std::stop_token stop);

  MountTree& tree_;
  store::Client& client_;
  const catalog::KeySchema keys_;
  const WatchOptions options_;
  GenerationLeases* const leases_;
  const ChangeListener on_change_;

  Mutex pass_mutex_;
  // Generations that could not be served (damaged, a newer schema), warned about once each.
  std::map<std::string, uint64_t> skipped_ DSFS_GUARDED_BY(pass_mutex_);
  uint64_t passes_ DSFS_GUARDED_BY(pass_mutex_) = 0;  // numbers the passes, in the tree's order

  mutable Mutex stats_mutex_;
  std::condition_variable_any wake_;  // waits on stats_mutex_: the poller's sleep
  WatchStats stats_ DSFS_GUARDED_BY(stats_mutex_);
  bool failing_ DSFS_GUARDED_BY(stats_mutex_) = false;  // the last poll failed (logged once)
  std::shared_ptr<const MountTree::Listing> announced_ DSFS_GUARDED_BY(stats_mutex_);
  uint64_t announced_pass_ DSFS_GUARDED_BY(stats_mutex_) = 0;
  std::jthread poller_;
};

}  // namespace dsfs::fs
