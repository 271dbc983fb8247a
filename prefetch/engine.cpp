#include "prefetch/engine.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <unordered_map>

#include "src/store/errors.h"
#include "src/store/log_text.h"
#include "src/store/thread_name.h"

namespace dsfs::prefetch {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string_view prefetch_mode_name(PrefetchMode mode) {
  switch (mode) {
    case PrefetchMode::kAuto:
      return "auto";
    case PrefetchMode::kPlan:
      return "plan";
    case PrefetchMode::kOff:
      return "off";
  }
  return "?";
}

PrefetchMode parse_prefetch_mode(std::string_view text) {
  if (text == "auto") return PrefetchMode::kAuto;
  if (text == "plan") return PrefetchMode::kPlan;
  if (text == "off") return PrefetchMode::kOff;
  throw std::invalid_argument(
      fmt::format("unknown prefetch mode '{}': use auto (predict the order), plan (follow "
                  "MOUNT/.dsfs/plan only) or off",
                  text));
}

// --- PrefetchEngine ---

namespace {

// Every index of the table.
std::vector<uint32_t> all_of(const DatasetTable& datasets) {
  std::vector<uint32_t> all(datasets.size());
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = i;
  return all;
}

// The files of the `active` datasets; the others have none (nothing of theirs is predicted).
MountShape shape_of(const DatasetTable& datasets, std::span<const uint32_t> active) {
  MountShape shape;
  shape.is_file.resize(datasets.size());
  for (const uint32_t index : active) {
    const DatasetSnapshot* d = datasets.get(index);
    if (d == nullptr || !d->catalog) continue;
    const catalog::Catalog& c = *d->catalog;
    std::vector<bool> files(c.entry_count());
    for (uint32_t e = 0; e < c.entry_count(); ++e) files[e] = !c.entry(e).is_dir;
    shape.is_file[index] = std::move(files);
  }
  return shape;
}

uint64_t mean_file_bytes(const DatasetTable& datasets, std::span<const uint32_t> active) {
  uint64_t bytes = 0;
  uint64_t files = 0;
  for (const uint32_t index : active) {
    const DatasetSnapshot* d = datasets.get(index);
    if (d == nullptr || !d->catalog) continue;
    bytes += d->catalog->total_bytes();
    files += d->catalog->file_count();
  }
  return files == 0 ? 1 : std::max<uint64_t>(1, bytes / files);
}

}  // namespace

PrefetchEngine::PrefetchEngine(ObjectCache& cache, ObjectFetcher& fetcher,
                               const DatasetTable& datasets, store::Client& client, bool verify,
                               EngineOptions options)
    : cache_(cache),
      fetcher_(fetcher),
      datasets_(datasets),
      client_(client),
      verify_(verify),
      options_(options),
      // A file larger than an eighth of the cache would push out too much that is needed sooner.
      max_prefetch_file_bytes_(cache.capacity_bytes() / 8),
      model_(std::make_unique<PredictionModel>(shape_of(datasets, all_of(datasets)), options.seed)),
      windows_(std::max<size_t>(options.connections, 1) * 2,
               options.max_inflight != 0
                   ? options.max_inflight
                   : std::clamp<size_t>(
                         cache.capacity_bytes() / 2 / mean_file_bytes(datasets, all_of(datasets)),
                         std::max<size_t>(options.connections, 1) * 2, 8192)) {
  options_.connections = std::max<size_t>(options_.connections, 1);
  if (fetcher_.disk_tier() != nullptr && options_.mode != PrefetchMode::kOff) {
    disk_stagers_ = std::max<size_t>(options_.disk_stagers, 1);
  }
  // The prefetcher may fill the cache but for a tenth kept for reads it did not foresee.
  model_->set_lookahead(static_cast<size_t>(cache.capacity_bytes() * 9 / 10 /
                                            mean_file_bytes(datasets, all_of(datasets))));
}

void PrefetchEngine::reshape(std::span<const uint32_t> active) {
  // Built outside the lock: a catalogue of a million files takes a while to walk.
  auto model = std::make_unique<PredictionModel>(shape_of(datasets_, active), options_.seed);
  model->set_lookahead(
      static_cast<size_t>(cache_.capacity_bytes() * 9 / 10 / mean_file_bytes(datasets_, active)));
  std::lock_guard lock(mutex_);
  // A dataset published or removed beside them leaves the loaders' plans as they were: what is
  // unread of them, for the datasets kept, is followed on (an audit lost 40% of a planned
  // epoch's prefetches to an unrelated ingest).
  model->carry_plans_from(*model_);
  model_ = std::move(model);
  held_.reset();
  passed_for_stagers_.clear();
  wake_idle_workers_locked();
  work_.notify_all();
}

PrefetchEngine::~PrefetchEngine() {
  stop();
}

void PrefetchEngine::start() {
  if (options_.mode == PrefetchMode::kOff || !workers_.empty()) return;
  stopping_ = false;
  for (size_t i = 0; i < disk_stagers_; ++i) {
    stagers_.emplace_back([this, i] {
      name_this_thread("stage-" + std::to_string(i));
      stage_loop();
    });
  }
  for (size_t i = 0; i < options_.connections; ++i) {
    workers_.emplace_back([this, i] {
      name_this_thread("fetch-" + std::to_string(i));
      fetch_loop(i);
    });
  }
  warm_from_disk_tier();
}

bool PrefetchEngine::tier_holds_most_of(uint32_t dataset) const {
  const DatasetSnapshot* d = datasets_.get(dataset);
  if (d == nullptr || !d->catalog) return false;
  const catalog::Catalog& catalog = *d->catalog;
  constexpr uint32_t kSample = 64;
  const uint32_t entries = catalog.entry_count();
  const uint32_t samples = std::min(kSample, entries);
  uint32_t files = 0;
  uint32_t held = 0;
  for (uint32_t i = 0; i < samples; ++i) {
    const auto entry = static_cast<uint32_t>(uint64_t{i} * entries / samples);
    if (catalog.entry(entry).is_dir) continue;
    ++files;
    if (fetcher_.on_disk(*d, entry, 0)) ++held;
  }
  // Half: a tier smaller than the dataset (it evicts as it writes) still starts warm; the stagers
  // skip the files it lacks.
  return files > 0 && held * 2 >= files;
}

void PrefetchEngine::warm_from_disk_tier() {
  if (disk_stagers_ == 0 || options_.mode != PrefetchMode::kAuto) return;
  std::vector<uint32_t> held;
  for (uint32_t index = 0; index < datasets_.size(); ++index) {
    if (tier_holds_most_of(index)) held.push_back(index);
  }
  if (held.empty()) return;
  std::vector<ReadySource> ready;  // nothing is cached yet: stays empty
  std::lock_guard lock(mutex_);
  if (model_->accesses() > 0) return;  // reads came first
  for (const uint32_t index : held) model_->expect_dataset(index);
  warming_ = true;
  std::vector<Fetch> none;  // room 0: nothing for Redis
  propose_locked(0, none, ready);
  spdlog::info("prefetch: the disk tier holds {} dataset(s); staging from it until the first read",
               held.size());
}

void PrefetchEngine::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    // A worker may be waiting for a reply from a stalled Redis for up to the I/O timeout.
    for (store::GetRouter* r : routers_) r->interrupt();
  }
  work_.notify_all();
  retry_wait_.notify_all();
  staging_work_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  for (std::thread& t : stagers_) t.join();
  stagers_.clear();
  // Fetches held for a full node, or queued for the disk, were never sent or read: readers that
  // joined them fetch for themselves.
  std::vector<Fetch> held;
  {
    std::lock_guard lock(mutex_);
    held = windows_.drain();
    for (std::deque<Fetch>* queue : {&staging_, &redirected_}) {
      std::move(queue->begin(), queue->end(), std::back_inserter(held));
      queue->clear();
    }
  }
  for (const Fetch& f : held) abandon(f, "the mount is stopping", /*quietly=*/true);
}

void PrefetchEngine::record_access(uint32_t dataset, uint32_t entry) {
  if (options_.mode == PrefetchMode::kOff) return;
  const Clock::time_point now = Clock::now();
  bool wake = false;
  {
    std::lock_guard lock(mutex_);
    warming_ = false;
    if (model_->observe(file_id(dataset, entry))) {
      spdlog::debug("prefetch: epoch {} begins", model_->epochs().epoch());
      new_epoch_locked();
    }
    windows_.on_access(now);
    last_access_ = now;
    measure_near_again_locked(now);
    // A read frees room for one more prefetch. Workers with GETs in flight take more work as
    // their replies come (and wake an idle one when they have their share: next_fetches), so a
    // read wakes a worker only when none has any, and at most every millisecond: a wake-up per
    // read would cost a context switch per file. Not while guesses are held back: the read gave
    // a worker nothing to fetch (one that changed the leader to an order does wake one).
    wake = idle_workers_ == options_.connections && !guesses_held_back_locked() &&
           idle_wakeup_due_locked(now);
  }
  if (wake) work_.notify_one();
}

void PrefetchEngine::new_epoch_locked() {
  cache_.new_epoch();
  if (DiskTier* tier = fetcher_.disk_tier()) tier->new_epoch();
}

bool PrefetchEngine::idle_wakeup_due_locked(Clock::time_point now) {
  if (now - last_wakeup_ <= 1ms) return false;
  last_wakeup_ = now;
  wake_idle_workers_locked();
  return true;
}

bool PrefetchEngine::windows_take_more_locked() const {
  return windows_.propose_more() && windows_.inflight() < windows_.limit();
}

bool PrefetchEngine::active_locked(Clock::time_point now) const {
  return warming_ || now - last_access_ < options_.idle_pause ||
         now - plan_written_ < options_.idle_pause;
}

std::vector<PrefetchEngine::Fetch> PrefetchEngine::next_fetches(size_t outstanding,
                                                                std::vector<ReadySource>& ready) {
  std::vector<Fetch> out;
  std::lock_guard lock(mutex_);
  if (stopping_) return out;
  // A map reloaded may name other copies (a failover, a node gone): the windows of nodes reads
  // left stop counting once idle.
  if (const uint64_t maps = client_.topology_refreshes(); maps != maps_seen_) {
    maps_seen_ = maps;
    windows_.retire_idle_except(client_.read_nodes_known());
  }
  // Each worker keeps about its share of every window together, so that all connections carry
  // files of the same stretch of the order.
  const size_t fair_share = windows_.limit() / options_.connections + kFetchBatch;
  if (outstanding >= fair_share) {
    // Room left in the windows is another worker's to take.
    if (idle_workers_ > 0 && windows_take_more_locked() && idle_wakeup_due_locked(Clock::now())) {
      work_.notify_one();
    }
    return out;
  }
  const size_t room = std::min(kFetchBatch, fair_share - outstanding);
  // Fetches held for a node that now has room go first: they were proposed earlier. Even after
  // reads pause: a reader may be joined to one, and no read would come to wake the engine.
  std::vector<std::pair<size_t, Fetch>> released;
  windows_.take_released(room, released);
  for (auto& [node, f] : released) out.push_back(std::move(f));
  // Staged fetches the disk tier no longer had: already counted in their node's window.
  for (Fetch& f : redirected_) out.push_back(std::move(f));
  redirected_.clear();
  const Clock::time_point now = Clock::now();
  if (!active_locked(now)) {
    if (was_active_) windows_.on_idle();  // after a pause, ramp up again
    was_active_ = false;
    return out;
  }
  was_active_ = true;
  propose_locked(room, out, ready);
  // A full batch, and the windows take more: another worker takes the next one now rather than
  // at its next reply or wake-up.
  if (out.size() == room && idle_workers_ > 0 && windows_take_more_locked()) {
    wake_idle_workers_locked();
    work_.notify_one();
  }
  return out;
}

bool PrefetchEngine::propose_locked(size_t room, std::vector<Fetch>& out,
                                    std::vector<ReadySource>& ready) {
  const PlansPredictor& plans = model_->plan();
  const bool plan_leads = model_->leader() == "plan" && plans.entries() > plans.position();
  windows_.set_plan_leads(plan_leads);
  if (!plan_leads) passed_for_stagers_.clear();  // guesses of an order that no longer leads
  const size_t staging_before = staging_.size();
  bool for_redis_waits = false;
  bool cache_full = false;
  // Files the walk passed on for the stagers come first, in order, as their queue frees up; one
  // the plans no longer list unread was read meanwhile (its reader took it from the tier).
  while (!passed_for_stagers_.empty() && staging_.size() + staging_busy_ < staging_limit()) {
    const Proposal passed = passed_for_stagers_.front();
    if (!plans.lists_unread(passed.file)) {
      passed_for_stagers_.pop_front();
      continue;
    }
    cache_full = !reserve_locked(passed, /*from_disk=*/true, out, ready);
    if (cache_full) break;
    passed_for_stagers_.pop_front();
  }
  while (!cache_full) {
    if (!held_) {
      if (options_.mode == PrefetchMode::kPlan && model_->leader() != "plan") break;
      if (guesses_held_back_locked()) break;
      held_ = model_->propose();
      if (!held_) break;
    }
    const DatasetSnapshot& d = *datasets_.get(dataset_of(held_->file));
    const uint32_t entry = entry_of(held_->file);
    const catalog::Catalog& catalog = *d.catalog;
    if (catalog.entry(entry).size > max_prefetch_file_bytes_ ||
        (verify_ && catalog.chunk_count(entry) > 1)) {
      held_.reset();  // left to the reader
      continue;
    }
    // A file the disk tier holds is staged from it by the stagers, under their own bound (a
    // local read; no window of Redis's); the others go to Redis under their node's window.
    const bool from_disk = disk_stagers_ > 0 && fetcher_.on_disk(d, entry, 0);
    if (warming_ && !from_disk) {
      held_.reset();  // nothing from Redis before the first read: left to its reader
      continue;
    }
    if (from_disk && staging_.size() + staging_busy_ >= staging_limit()) {
      // While a plan leads, the walk goes on past files for the stagers (no cache room taken
      // yet) to those the tier lacks: 100 ms away each of those must be asked a round trip
      // before its read, and the stagers' queue is only a few milliseconds long. One the memory
      // cache holds whole needs no stager: it is kept for this use at once. (Files are passed
      // on only while the queue is full, and it stays full under the lock, so none jumps them.)
      if (plan_leads && cached_whole_locked(d, entry)) {
        reserve_locked(*held_, from_disk, out, ready);  // only promotes
        held_.reset();
        continue;
      }
      if (plan_leads && passed_for_stagers_.size() < windows_.limit()) {
        passed_for_stagers_.push_back(*held_);
        passed_peak_ = std::max<uint64_t>(passed_peak_, passed_for_stagers_.size());
        held_.reset();
        continue;
      }
      break;  // keep held_ for when there is room
    }
    if (!from_disk && (out.size() >= room || !windows_.propose_more())) {
      for_redis_waits = true;
      break;  // keep held_ for when there is room
    }
    if (!reserve_locked(*held_, from_disk, out, ready)) break;  // keep held_ until room frees up
    held_.reset();
  }
  inflight_peak_ = std::max(inflight_peak_, inflight_objects_);
  if (staging_.size() > staging_before) {
    staging_peak_ = std::max<uint64_t>(staging_peak_, staging_.size() + staging_busy_);
    staging_work_.notify_all();
  }
  return for_redis_waits;
}

void PrefetchEngine::measure_near_again_locked(Clock::time_point now) {
  if (!guesses_held_back_locked()) {
    held_back_since_ = {};
  } else if (held_back_since_ == Clock::time_point{}) {
    held_back_since_ = now;
  } else if (now - held_back_since_ >= options_.near_recheck) {
    // The base round trip only falls: a route that grew far would keep guesses held back until
    // the next pause. The next guesses' replies measure it again.
    windows_.measure_base_again();
    held_back_since_ = {};
    ++near_rechecks_;
  }
}

bool PrefetchEngine::guesses_held_back_locked() const {
  return disk_stagers_ == 0 && model_->leader() == "unread-set" &&
         windows_.all_near(options_.near_rtt);
}

bool PrefetchEngine::cached_whole_locked(const DatasetSnapshot& d, uint32_t entry) const {
  const catalog::Catalog& catalog = *d.catalog;
  for (uint32_t chunk = 0; chunk < catalog.chunk_count(entry); ++chunk) {
    if (!cache_.present(ObjectKey{.dataset = d.index,
                                  .chunk = chunk,
                                  .generation = d.generation(),
                                  .object_id = catalog.entry(entry).object_id})) {
      return false;
    }
  }
  return true;
}

bool PrefetchEngine::reserve_locked(const Proposal& proposal, bool from_disk,
                                    std::vector<Fetch>& out, std::vector<ReadySource>& ready) {
  const DatasetSnapshot& d = *datasets_.get(dataset_of(proposal.file));
  const uint32_t entry = entry_of(proposal.file);
  const catalog::Catalog& catalog = *d.catalog;
  const uint64_t chunks = catalog.chunk_count(entry);
  // All of a file's chunks, or none: half a file ahead saves nothing.
  std::vector<Fetch> file_fetches;
  for (uint32_t chunk = 0; chunk < chunks; ++chunk) {
    const ObjectKey key{.dataset = d.index,
                        .chunk = chunk,
                        .generation = d.generation(),
                        .object_id = catalog.entry(entry).object_id};
    const uint64_t length = ObjectFetcher::chunk_length(catalog, entry, chunk);
    if (cache_.present(key)) {
      // Already here: keep it for this use, or a later prefetch could evict it as read.
      ObjectBuffer cached = cache_.promote(key, proposal.rank);  // nullptr while loading
      if (source_listener_ && chunks == 1 && cached) {
        ready.push_back(ReadySource{.dataset = d.index,
                                    .entry = entry,
                                    .rank = proposal.rank,
                                    .buffer = std::move(cached)});
      }
      continue;
    }
    if (!cache_.begin_prefetch(key, length, proposal.rank)) {
      if (cache_.present(key)) continue;
      for (const Fetch& f : file_fetches) cache_.abandon_prefetch(f.key, "no room");
      return false;
    }
    std::string redis_key = fetcher_.chunk_key(d, entry, chunk);
    const auto [route, node] = route_of(redis_key);
    file_fetches.push_back(Fetch{.key = key,
                                 .redis_key = std::move(redis_key),
                                 .length = length,
                                 .dataset = d.index,
                                 .entry = entry,
                                 .verify = verify_,
                                 .rank = proposal.rank,
                                 .single_object = chunks == 1,
                                 .route = route,
                                 .node = node});
  }
  for (Fetch& f : file_fetches) {
    ++inflight_objects_;
    inflight_bytes_ += f.length;
    if (from_disk) {
      if (warming_) ++staged_before_first_read_;
      staging_.push_back(std::move(f));
      continue;
    }
    // A node whose window is full keeps it until a reply of its own frees room; the others go on.
    if (windows_.offer(f.node, f) == NodeWindows<Fetch>::Admit::kSend) out.push_back(std::move(f));
  }
  return true;
}

std::pair<size_t, size_t> PrefetchEngine::route_of(const std::string& redis_key) const {
  // Never discovers (the engine's lock is held): the mount found the topology before any read.
  const size_t route = client_.route_read_known(redis_key).node;
  return {route, route == store::Client::kNoNode ? 0 : route};
}

void PrefetchEngine::finish(Fetch& fetch, store::ValueReply reply) {
  if (reply.kind != store::ValueReply::Kind::kValue || reply.size != fetch.length) {
    // The reader's own fetch reports it properly (missing key, wrong length, Redis error).
    abandon(fetch, fmt::format("GET {} gave no value of {} bytes", fetch.redis_key, fetch.length));
    return;
  }
  complete(fetch, std::make_shared<const ObjectData>(std::move(reply)), /*from_redis=*/true);
}

void PrefetchEngine::stage_loop() {
  while (true) {
    std::optional<Fetch> fetch;
    {
      std::unique_lock lock(mutex_);
      staging_work_.wait(lock, [&] { return stopping_ || !staging_.empty(); });
      if (stopping_) return;  // stop() abandons what is queued
      fetch = std::move(staging_.front());
      staging_.pop_front();
      ++staging_busy_;
    }
    ObjectBuffer buffer =
        fetcher_.read_from_disk(*datasets_.get(fetch->dataset), fetch->entry, fetch->key.chunk);
    const bool staged = buffer != nullptr;
    if (staged) {
      disk_reads_.fetch_add(1, std::memory_order_relaxed);
      complete(*fetch, std::move(buffer), /*from_redis=*/false);
    }
    bool wake = false;
    std::vector<ReadySource> ready;
    {
      std::lock_guard lock(mutex_);
      --staging_busy_;
      if (!staged) {
        // Evicted or dropped as damaged since it was proposed: Redis has it. Offered whether or
        // not its node's queue is full (its cache room is already reserved, which bounds it).
        if (windows_.offer(fetch->node, *fetch) == NodeWindows<Fetch>::Admit::kSend) {
          redirected_.push_back(std::move(*fetch));
        }
        wake = true;
      }
      // Half their queue drained: the stagers propose more themselves, what the tier holds
      // (waking a worker for each batch lagged behind the readers on a busy machine). A file for
      // Redis stops them: a worker sends it.
      if (!stopping_ && staging_.size() + staging_busy_ <= staging_limit() / 2 &&
          active_locked(Clock::now())) {
        std::vector<Fetch> none;  // room 0: nothing for Redis is taken here
        if (propose_locked(0, none, ready)) wake = true;
      }
      wake = wake && idle_workers_ > 0;
      if (wake) wake_idle_workers_locked();
    }
    if (wake) work_.notify_one();
    for (ReadySource& r : ready) {
      source_listener_(*datasets_.get(r.dataset), r.entry, r.rank, std::move(r.buffer));
    }
  }
}

void PrefetchEngine::complete(Fetch& fetch, ObjectBuffer buffer, bool from_redis) {
  const DatasetSnapshot& d = *datasets_.get(fetch.dataset);
  if (fetch.verify) {
    try {
      fetcher_.verify_checksum(d, fetch.entry, std::span(&buffer, 1));
    } catch (const IntegrityError& e) {
      abandon(fetch, e.what());
      return;
    }
  }
  cache_.finish_prefetch(fetch.key, buffer);
  // Written behind to the disk tier (if any), as the demand path's fetches are.
  if (from_redis) fetcher_.offer_to_disk(d, fetch.entry, fetch.key.chunk, buffer);
  {
    std::lock_guard lock(mutex_);
    --inflight_objects_;
    inflight_bytes_ -= fetch.length;
  }
  if (source_listener_ && fetch.single_object) {
    source_listener_(d, fetch.entry, fetch.rank, std::move(buffer));
  }
}

void PrefetchEngine::abandon(const Fetch& fetch, const std::string& why, bool quietly) {
  failures_.fetch_add(1, std::memory_order_relaxed);
  if (quietly) {
    spdlog::debug("prefetch of {} given up: {}", store::log_text(fetch.redis_key), why);
  } else {
    // Not silent (a low `ulimit -n` failed thousands of prefetches with nothing in the log), but
    // at most a line a minute: an outage fails every fetch, and the reads say so themselves.
    failures_log_.log(spdlog::level::warn,
                      fmt::format("prefetch of {} given up: {}; a read fetches it when it needs it "
                                  "(stats.json prefetch.failures counts these)",
                                  store::log_text(fetch.redis_key), store::log_text(why, 400)));
  }
  cache_.abandon_prefetch(fetch.key, why);
  std::lock_guard lock(mutex_);
  --inflight_objects_;
  inflight_bytes_ -= fetch.length;
}

void PrefetchEngine::fetch_loop(size_t worker) {
  // GETs go to each key's node; replies are taken as each node sends them, so a slow node does
  // not hold back fetches from the others. Each fetch is found again by its tag.
  std::unique_ptr<store::GetRouter> router;
  std::unordered_map<uint64_t, Fetch> outstanding;
  uint64_t next_tag = 0;
  auto backoff = 50ms;
  const auto drop_router = [&](const std::string& why) {
    {
      std::lock_guard lock(mutex_);
      for (const auto& [tag, f] : outstanding) windows_.on_ended(f.node);
    }
    for (const auto& [tag, f] : outstanding) abandon(f, why);
    outstanding.clear();
    if (router) {
      std::lock_guard lock(mutex_);
      std::erase(routers_, router.get());
    }
    router.reset();
  };
  const auto ensure_router = [&] {
    if (router) return;
    router = std::make_unique<store::GetRouter>(client_);
    std::lock_guard lock(mutex_);
    routers_.push_back(router.get());
    if (stopping_) router->interrupt();  // stop() ran meanwhile
  };
  // Far from Redis a new connection waits round trips (the handshake, AUTH) before its first
  // GET goes out. Connected now, while the mount waits for its first reader, a first epoch's
  // opening GETs wait one round trip, not three. A failure here waits for the first send.
  try {
    ensure_router();
    for (const size_t node : client_.read_nodes_known()) router->connect(node);
  } catch (const std::exception& e) {
    spdlog::debug("prefetch worker {}: connecting ahead: {}", worker, e.what());
    drop_router(e.what());
  }
  while (!stopping_) {
    try {
      std::vector<ReadySource> ready;
      std::vector<Fetch> batch = next_fetches(outstanding.size(), ready);
      for (ReadySource& r : ready) {
        source_listener_(*datasets_.get(r.dataset), r.entry, r.rank, std::move(r.buffer));
      }
      if (!batch.empty()) {
        ensure_router();
        std::vector<std::string> keys;
        std::vector<uint64_t> tags;
        std::vector<size_t> nodes;
        keys.reserve(batch.size());
        tags.reserve(batch.size());
        nodes.reserve(batch.size());
        for (Fetch& f : batch) {
          keys.push_back(f.redis_key);
          tags.push_back(next_tag);
          nodes.push_back(f.route);
          outstanding.emplace(next_tag++, std::move(f));
        }
        try {
          router->send(keys, tags, nodes);
          backoff = 50ms;
        } catch (const store::ConnectionError& e) {
          spdlog::debug("prefetch worker {}: {}", worker, e.what());
          drop_router(e.what());
          std::unique_lock lock(mutex_);
          retry_wait_.wait_for(lock, backoff, [&] { return stopping_.load(); });
          backoff = std::min(backoff * 2, std::chrono::milliseconds{2000});
          continue;
        }
        gets_.fetch_add(keys.size(), std::memory_order_relaxed);
      }
      if (outstanding.empty()) {
        // Until woken for work (a wake-up counted for the idle workers, not any notify: the
        // condition variable wakes spuriously too), stopped, or for a look of its own.
        std::unique_lock lock(mutex_);
        ++idle_workers_;
        const uint64_t wakeups = idle_wakeups_;
        work_.wait_for(lock, options_.idle_recheck,
                       [&] { return stopping_.load() || idle_wakeups_ != wakeups; });
        --idle_workers_;
        continue;
      }
      store::GetRouter::Received received = router->receive();
      const auto it = outstanding.find(received.tag);
      Fetch fetch = std::move(it->second);
      outstanding.erase(it);
      const Clock::time_point arrived = Clock::now();
      {
        std::lock_guard lock(mutex_);
        // From when the router wrote the GET, so connecting to a node first (10+ ms near a
        // loaded server, several round trips far away) is not taken for distance.
        windows_.on_answered(fetch.node, arrived - received.sent_at, arrived);
      }
      finish(fetch, std::move(received.reply));
    } catch (const std::exception& e) {
      // Redis went away or broke the stream: readers that joined these fetch for themselves.
      spdlog::debug("prefetch worker {} failed: {}", worker, e.what());
      drop_router(e.what());
    }
  }
  drop_router("the mount is stopping");
}

void PrefetchEngine::plan_clear(PlanWriter writer) {
  std::lock_guard lock(mutex_);
  model_->plan_clear(writer);
}

void PrefetchEngine::plan_forget(PlanWriter writer) {
  std::lock_guard lock(mutex_);
  model_->plan_forget(writer);
}

void PrefetchEngine::plan_extend(PlanWriter writer, std::span<const PlannedFile> files,
                                 bool new_plan) {
  std::lock_guard lock(mutex_);
  warming_ = false;  // the plan says what comes, from Redis too where the tier lacks it
  const PlansPredictor& plans = model_->plan();
  for (const PlannedFile& file : files) {
    if (model_->plan_append(writer, file_id(file.dataset, file.entry)) ||
        plans.entries() < plans.max_entries()) {
      continue;
    }
    if (plan_entries_dropped_++ == 0) {
      spdlog::warn(
          "prefetch: the plans written to .dsfs/plan hold {} entries, the most this mount keeps "
          "({} per file); later entries are ignored until a plan is replaced. Write each "
          "epoch's order as a new plan (open the file with O_TRUNC, as PlanSampler does) "
          "instead of appending to the last one",
          plans.entries(), PlansPredictor::kPlanEntriesPerFile);
    }
  }
  // Objects read last epoch are unread again in the one the new plan begins.
  if (model_->plan_published(new_plan)) new_epoch_locked();
  // The plans propose again from their readers' positions.
  passed_for_stagers_.clear();
  plan_written_ = Clock::now();
  wake_idle_workers_locked();
  work_.notify_all();
}

EngineStats PrefetchEngine::stats() const {
  EngineStats s;
  {
    std::lock_guard lock(mutex_);
    stats_locked(s);
  }
  // Addresses from the client, outside the engine's lock.
  for (NodeInflightReport& n : s.nodes) {
    try {
      n.address = client_.address_of(n.window.node);
      n.replica = client_.is_replica(n.window.node);
    } catch (const std::out_of_range&) {
      // Counted as node 0 before the topology was known. (Not a literal: GCC 12's false
      // -Wrestrict on assigning one, bug 105329.)
      n.address = fmt::format("node {}", n.window.node);
    }
  }
  return s;
}

void PrefetchEngine::stats_locked(EngineStats& s) const {
  s.mode = options_.mode;
  s.leader = options_.mode == PrefetchMode::kOff ? "none" : std::string(model_->leader());
  s.epoch = model_->epochs().epoch();
  s.accesses = model_->accesses();
  s.inflight_objects = inflight_objects_;
  s.inflight_bytes = inflight_bytes_;
  s.inflight_limit = options_.mode == PrefetchMode::kOff ? 0 : windows_.limit();
  s.inflight_max = windows_.max_total();
  s.inflight_peak = inflight_peak_;
  s.inflight_held = windows_.held();
  s.idle_workers = idle_workers_;
  s.fetches_opened_for_plan = windows_.opened_for_plan();
  s.guesses_held_back = options_.mode == PrefetchMode::kAuto && guesses_held_back_locked();
  s.near_rechecks = near_rechecks_;
  for (const NodeWindowReport& n : windows_.report()) {
    s.base_rtt_ms = std::max(s.base_rtt_ms, n.base_rtt_ms);
    s.rtt_ms = std::max(s.rtt_ms, n.rtt_ms);
    s.burst_per_s += n.burst_per_s;
    s.nodes.push_back(NodeInflightReport{.address = {}, .replica = false, .window = n});
  }
  s.files_per_s = windows_.files_per_s();
  s.connections = options_.mode == PrefetchMode::kOff ? 0 : options_.connections;
  s.gets = gets_.load(std::memory_order_relaxed);
  s.disk_reads = disk_reads_.load(std::memory_order_relaxed);
  s.disk_stagers = disk_stagers_;
  s.staging = staging_.size() + staging_busy_;
  s.staging_peak = staging_peak_;
  // Only those still to be read: one its reader took meanwhile leaves the deque only when the
  // stagers' queue frees up, but it waits for nothing.
  const PlansPredictor& plans = model_->plan();
  s.passed_for_stagers = static_cast<uint64_t>(
      std::count_if(passed_for_stagers_.begin(), passed_for_stagers_.end(),
                    [&](const Proposal& passed) { return plans.lists_unread(passed.file); }));
  s.passed_for_stagers_peak = passed_peak_;
  s.staged_before_first_read = staged_before_first_read_;
  s.failures = failures_.load(std::memory_order_relaxed);
  s.plan_entries = model_->plan().entries();
  s.plan_position = model_->plan().position();
  s.plan_writers = model_->plan().writers();
  s.plan_entries_dropped = plan_entries_dropped_;
  for (const PredictorScore& p : model_->scores()) {
    s.predictors.push_back(PredictorReport{std::string(p.name), p.score, p.foreseen, p.scored});
  }
}

}  // namespace dsfs::prefetch
