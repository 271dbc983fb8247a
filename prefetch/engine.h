#pragma once
// The prefetch engine: learns the access order from every read, predicts what comes next
// (predictors.h) and fetches it ahead into the object cache over several Redis connections,
// each a sliding window of pipelined GETs, storing replies as they arrive; each Redis node has
// its own in-flight window (node_windows.h). With a disk tier, what it holds is staged from it
// instead, by threads of their own under a bound of their own (no round trip to cover). Readers
// find the objects ready, or join the fetch in flight; a miss is fetched by the reader itself at
// once (object_fetcher.h), ahead of everything queued here.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "prefetch/dataset_snapshot.h"
#include "prefetch/dataset_table.h"
#include "prefetch/inflight_control.h"
#include "prefetch/node_windows.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "prefetch/predictors.h"
#include "prefetch/read_stats.h"
#include "src/store/client.h"
#include "src/store/log_limiter.h"

namespace dsfs::prefetch {

enum class PrefetchMode : uint8_t {
  kAuto,  // predictors decide, a plan included
  kPlan,  // only a written plan is followed
  kOff,   // nothing is fetched ahead
};
std::string_view prefetch_mode_name(PrefetchMode mode);
// Throws std::invalid_argument naming the choices.
PrefetchMode parse_prefetch_mode(std::string_view text);

struct EngineOptions {
  PrefetchMode mode = PrefetchMode::kAuto;
  size_t connections = 8;
  // With a disk tier: threads that read what it holds into the cache ahead of the readers, one
  // object each at a time (the depth of the disk's queue), apart from the Redis connections.
  size_t disk_stagers = 16;
  // Most GETs in flight at once; 0: derived from the cache (room for half of it in flight).
  size_t max_inflight = 0;
  // Prefetching pauses when no file has been read for this long.
  std::chrono::milliseconds idle_pause{2000};
  // A fetch worker with nothing in flight looks for work on its own this often; a plan written,
  // a read while every worker is idle, or a worker with more work than its share wakes it sooner.
  std::chrono::milliseconds idle_recheck{20};
  // Guesses of an unknown order are held back while every node is nearer than this
  // (guesses_held_back_locked).
  std::chrono::microseconds near_rtt = InflightControl::kNearRtt;
  // While they are held back and reads go on, the round trip is measured again this often (a
  // few guesses go out for it): a path that grew far is noticed without waiting for a pause.
  std::chrono::milliseconds near_recheck{10000};
  uint64_t seed = 0x5eed;
};

// One node's window in stats.json: NodeWindowReport and the node's address.
struct NodeInflightReport {
  std::string address;
  bool replica = false;
  NodeWindowReport window;
};

struct PredictorReport {
  std::string name;
  double score = 0;
  uint64_t foreseen = 0;
  uint64_t scored = 0;
};

struct EngineStats {
  PrefetchMode mode = PrefetchMode::kAuto;
  std::string leader;
  uint64_t epoch = 1;
  uint64_t accesses = 0;
  uint64_t inflight_objects = 0;  // proposed and not here yet: sent, or held for a full node
  uint64_t inflight_bytes = 0;
  uint64_t inflight_limit = 0;  // every node's window together
  uint64_t inflight_max = 0;
  uint64_t inflight_peak = 0;            // the most objects in flight at once since the mount
  uint64_t inflight_held = 0;            // proposed for a node whose window is full
  uint64_t idle_workers = 0;             // fetch workers waiting for work, nothing in flight
  uint64_t fetches_opened_for_plan = 0;  // sent while their node's window was open for a plan
  // The unread set leads and its guesses are not sent: every node is near (guesses_held_back).
  bool guesses_held_back = false;
  // Times the round trip was measured again while they were held back (near_recheck).
  uint64_t near_rechecks = 0;
  // Of the node farthest away (the largest), for one server its own:
  double base_rtt_ms = 0;  // the smallest round trip since the last pause
  double rtt_ms = 0;
  double burst_per_s = 0;  // replies per second within a burst, every node's together
  uint64_t lookahead_files = 0;
  std::vector<NodeInflightReport> nodes;  // each node's window, by the client's node index
  double files_per_s = 0;
  size_t connections = 0;
  uint64_t gets = 0;
  uint64_t disk_reads = 0;    // prefetches staged from the disk tier, not Redis
  size_t disk_stagers = 0;    // threads staging from the disk tier (0: no tier, or off)
  uint64_t staging = 0;       // fetches queued for them or being read
  uint64_t staging_peak = 0;  // the most at once since the mount
  // Files the walk of a plan passed on for the stagers while their queue was full, to go on to
  // those the tier lacks: waiting now (not yet read), and the most at once since the mount.
  uint64_t passed_for_stagers = 0;
  uint64_t passed_for_stagers_peak = 0;
  uint64_t failures = 0;       // prefetches given up (Redis errors, bad data)
  uint64_t plan_entries = 0;   // every writer's plan together
  uint64_t plan_position = 0;  // entries read, every writer's plan together
  uint64_t plan_writers = 0;   // writers with a plan
  // Entries not kept because the plans held PlansPredictor::max_entries() together.
  uint64_t plan_entries_dropped = 0;
  std::vector<PredictorReport> predictors;
  // Staged from a tier that held the datasets when the mount started, before the first read.
  uint64_t staged_before_first_read = 0;
};

class PrefetchEngine {
 public:
  // The table must outlive the engine; every dataset in it now is predicted for. Connections and
  // threads start with start().
  PrefetchEngine(ObjectCache& cache, ObjectFetcher& fetcher, const DatasetTable& datasets,
                 store::Client& client, bool verify, EngineOptions options);
  ~PrefetchEngine();
  PrefetchEngine(const PrefetchEngine&) = delete;
  PrefetchEngine& operator=(const PrefetchEngine&) = delete;

  // Starts the fetch threads (after any fork: threads do not survive one). Idempotent. With a
  // disk tier that holds most of a dataset (a remount), the stagers begin at once, before any
  // read, to fill the cache with its files at random, as a steady epoch begins with the last
  // one's files in memory; the first read or plan ends that, and prediction takes over as usual.
  void start();
  void stop();

  // A reader began reading file `entry` of dataset `dataset` (a READ at offset 0).
  void record_access(uint32_t dataset, uint32_t entry);

  // The datasets to predict for changed (a dataset appeared, went or was refreshed): predicts
  // for those of `active` (indices in the table) from now on. What was learnt is dropped; what
  // is unread of each writer's plan, for the datasets of `active`, carries over. Accesses to
  // other datasets are served but not predicted from.
  void reshape(std::span<const uint32_t> active);

  // A file a plan names, resolved by the plan file (fs/nodes/plan_file.h): dataset index and
  // catalogue entry.
  struct PlannedFile {
    uint32_t dataset = 0;
    uint32_t entry = 0;
  };
  // Who wrote a plan: the plan file keys plans by the writing process, so that several loaders
  // (DDP ranks on one node) sharing a mount each have a plan of their own, followed at its own
  // position.
  using PlanWriter = uint64_t;
  // A writer's plan (MOUNT/.dsfs/plan): the files its readers will read next, in order.
  // plan_clear() drops it; plan_extend() appends `files`, and with `new_plan` says they begin a
  // plan that replaced the writer's last one (a new epoch: objects read in the last one count as
  // unread again). plan_forget() drops the plan of a writer that is gone, and its memory.
  void plan_clear(PlanWriter writer);
  void plan_extend(PlanWriter writer, std::span<const PlannedFile> files, bool new_plan);
  void plan_forget(PlanWriter writer);

  EngineStats stats() const;
  const EngineOptions& options() const { return options_; }

  // Told of each proposed file (stored in one object) once its bytes are in the cache, already
  // there or just fetched, with the rank of its predicted use: the view renders ahead from it.
  // Called on fetch threads without the engine's lock; it must be quick.
  using SourceReadyListener =
      std::function<void(const DatasetSnapshot&, uint32_t entry, uint64_t rank, ObjectBuffer)>;
  // Before start(); it must stay callable until stop().
  void set_source_listener(SourceReadyListener listener) { source_listener_ = std::move(listener); }

 private:
  struct Fetch {
    ObjectKey key;
    std::string redis_key;
    uint64_t length = 0;
    uint32_t dataset = 0;
    uint32_t entry = 0;
    bool verify = false;
    uint64_t rank = 0;
    bool single_object = false;  // the whole file is this one object
    // Where its GET goes (store::Client's node index; kNoNode: routed when sent) and whose
    // window it counts in (node 0 for kNoNode).
    size_t route = store::Client::kNoNode;
    size_t node = 0;
  };
  struct ReadySource {
    uint32_t dataset = 0;
    uint32_t entry = 0;
    uint64_t rank = 0;
    ObjectBuffer buffer;
  };
  void fetch_loop(size_t worker);
  // Fetches for a worker with `outstanding` GETs in flight, at most kFetchBatch, that the cache
  // has room for. Empty: nothing now. Proposed files already cached are added to `ready` (when
  // a source listener is set). Wakes another worker when the windows have room for more.
  std::vector<Fetch> next_fetches(size_t outstanding, std::vector<ReadySource>& ready);
  // Proposes files while there is room: those the disk tier holds into staging_ (up to
  // staging_limit()), the others into `out` (at most about `room`, under their node's window).
  // While a plan leads, files for the stagers that find their queue full are passed on
  // (passed_for_stagers_, up to the windows' limit) and the walk goes on to files for Redis.
  // Stops at the first file that finds no room, keeping it for later (held_); true when that
  // file goes to Redis (a worker must take it). mutex_ held.
  bool propose_locked(size_t room, std::vector<Fetch>& out, std::vector<ReadySource>& ready);
  // Reserves cache room for every chunk of the proposed file and queues its fetches: into
  // staging_ (from_disk) or `out`/its node's window. False (nothing reserved) when the cache has
  // no room. Chunks already cached are promoted (and added to `ready`). mutex_ held.
  bool reserve_locked(const Proposal& proposal, bool from_disk, std::vector<Fetch>& out,
                      std::vector<ReadySource>& ready);
  // Whether the unread set's guesses (no order known) are held back: it leads, there is no disk
  // tier, and every node is nearer than options_.near_rtt, where a reader's miss costs it less
  // than guesses cost the machine. Its first guesses measure the round trip, and again after
  // each pause, and every options_.near_recheck of reads held back (measure_near_again_locked).
  // mutex_ held.
  bool guesses_held_back_locked() const;
  // At a read: while guesses have been held back for options_.near_recheck, has every node's
  // round trip measured afresh. mutex_ held.
  void measure_near_again_locked(std::chrono::steady_clock::time_point now);
  std::chrono::steady_clock::time_point held_back_since_{};  // or zero: not held back
  uint64_t near_rechecks_ = 0;
  // Whether the memory cache holds (or is loading) every chunk of the file.
  bool cached_whole_locked(const DatasetSnapshot& d, uint32_t entry) const;
  // The most fetches one worker takes at once. Replies on one connection come back in the order
  // sent, and the connections share the path: a worker that took the next thousand planned files
  // would have the readers' next file wait behind them while every other connection's replies
  // (files far ahead) took their share of the path. Small batches spread consecutive files over
  // every connection, so files arrive about in the order they are read.
  static constexpr size_t kFetchBatch = 16;
  void finish(Fetch& fetch, store::ValueReply reply);
  // The node a fetch of `redis_key` goes to: Fetch::route and Fetch::node.
  std::pair<size_t, size_t> route_of(const std::string& redis_key) const;
  // A disk stager: reads queued fetches from the disk tier into the cache; one the tier no
  // longer has (evicted, damaged) goes to Redis instead (redirected_, or held by its window).
  void stage_loop();
  // Fetches queued for the stagers or being read, at most: enough to keep each busy.
  size_t staging_limit() const { return disk_stagers_ * 2; }
  // Checks (with --verify), caches and hands on a fetched object; from_redis: also write it
  // behind to the disk tier.
  void complete(Fetch& fetch, ObjectBuffer buffer, bool from_redis);
  // `quietly`: at a stop, logged at debug only.
  void abandon(const Fetch& fetch, const std::string& why, bool quietly = false);
  store::LogLimiter failures_log_{1, std::chrono::minutes(1)};
  bool active_locked(std::chrono::steady_clock::time_point now) const;
  // Whether the disk tier holds at least half of a sample of the dataset's files.
  bool tier_holds_most_of(uint32_t dataset) const;
  // The warm start (start()): stages the datasets the tier holds until the first read.
  void warm_from_disk_tier();
  void stats_locked(EngineStats& s) const;  // all but the nodes' addresses; mutex_ held
  // An epoch began: the RAM cache and the disk tier rank last epoch's reads again; mutex_ held.
  void new_epoch_locked();
  ObjectCache& cache_;
  ObjectFetcher& fetcher_;
  const DatasetTable& datasets_;
  store::Client& client_;
  const bool verify_;
  EngineOptions options_;
  uint64_t max_prefetch_file_bytes_;
  size_t disk_stagers_ = 0;  // threads start() starts: 0 without a disk tier or prefetching

  // Guards everything below up to the atomics (the model, in-flight accounting, the plan, the
  // held proposal); work_ waits on it. Listeners are called outside it. Proposing asks the disk
  // tier's index under it: the tier's lock nests inside this one, never the reverse.
  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::unique_ptr<PredictionModel> model_;  // replaced whole by reshape()
  NodeWindows<Fetch> windows_;              // each node's window, and fetches held for a full one
  uint64_t maps_seen_ = 0;         // client_.topology_refreshes() when windows_ last retired nodes
  uint64_t inflight_objects_ = 0;  // sent or held
  uint64_t inflight_peak_ = 0;
  uint64_t inflight_bytes_ = 0;
  std::optional<Proposal> held_;  // proposed, but the cache had no room yet
  // Proposed for the stagers while their queue was full, in order, no cache room reserved yet:
  // staged before anything the walk proposes later. Only while a plan leads; cleared when a plan
  // is written (the plans propose again from their readers' positions).
  std::deque<Proposal> passed_for_stagers_;
  uint64_t passed_peak_ = 0;
  std::chrono::steady_clock::time_point last_access_{};
  std::chrono::steady_clock::time_point plan_written_{};
  uint64_t plan_entries_dropped_ = 0;  // over the plans' bound; the first is logged
  bool was_active_ = false;
  // Staging from the disk tier before the first read (warm_from_disk_tier): only what the tier
  // holds is proposed meanwhile, nothing is asked of Redis.
  bool warming_ = false;
  uint64_t staged_before_first_read_ = 0;
  std::deque<Fetch> staging_;     // for the disk stagers, in the order proposed
  size_t staging_busy_ = 0;       // taken by a stager, not finished
  uint64_t staging_peak_ = 0;     // of staging_ and staging_busy_ together
  std::deque<Fetch> redirected_;  // staged, not on disk after all: counted in a window, to send
  std::condition_variable staging_work_;  // stagers wait on it for staging_ or stop
  size_t idle_workers_ = 0;               // workers waiting for work with nothing in flight
  // Wake-ups meant for idle workers (wake_idle_workers_locked): an idle worker goes on when it
  // changes, and waits out any other notify (or a spurious one) of work_.
  uint64_t idle_wakeups_ = 0;
  void wake_idle_workers_locked() { ++idle_wakeups_; }  // then notify work_; mutex_ held
  // A wake-up for an idle worker (wake_idle_workers_locked) unless one was made within the last
  // millisecond: true when made (then notify work_). mutex_ held.
  bool idle_wakeup_due_locked(std::chrono::steady_clock::time_point now);
  // Whether the windows take more fetches now. mutex_ held.
  bool windows_take_more_locked() const;
  std::condition_variable retry_wait_;  // a worker's backoff after a failed send; stop() ends it
  std::chrono::steady_clock::time_point last_wakeup_{};
  SourceReadyListener source_listener_;

  std::atomic<uint64_t> gets_{0};
  std::atomic<uint64_t> disk_reads_{0};  // prefetches served by the disk tier
  std::atomic<uint64_t> failures_{0};
  std::atomic<bool> stopping_{false};
  std::vector<store::GetRouter*> routers_;  // the workers' own, for stop() to interrupt
  std::vector<std::thread> workers_;
  std::vector<std::thread> stagers_;
};

}  // namespace dsfs::prefetch
