#include "fs/views.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <span>
#include <stdexcept>
#include <utility>

#include "cuda/npy.h"
#include "prefetch/object_cache_impl.h"
#include "src/store/log_text.h"
#include "src/store/thread_name.h"

namespace dsfs::prefetch {
template class BasicObjectCache<fs::ViewFileKey, fs::ViewFileKeyHash>;
}  // namespace dsfs::prefetch

namespace dsfs::fs {

size_t ViewFileKeyHash::operator()(const ViewFileKey& key) const {
  const uint64_t words[3] = {(uint64_t{key.dataset} << 32) | key.slot, key.generation, key.entry};
  return static_cast<size_t>(XXH3_64bits(words, sizeof(words)));
}
namespace {

constexpr std::array<std::string_view, 3> kImageExtensions = {".jpg", ".jpeg", ".png"};
// Undecodable files remembered at most; a dataset with more fails each of the rest on every read.
constexpr size_t kMaxRememberedFailures = 100000;
// Offered images waiting to be rendered ahead at most (each holds its source's bytes, which the
// source cache bounds anyway); the engine offers no more than its lookahead.
constexpr size_t kMaxAheadQueued = 16384;
// A dataset's predicted images are rendered ahead while one of its view files was opened (or a
// plan named them) this recently.
constexpr auto kAheadActiveFor = std::chrono::seconds(10);
// With no room in the view cache, rendering ahead retries after this, or when a file is read.
constexpr auto kAheadRoomRetry = std::chrono::milliseconds(5);

bool ends_with_ignoring_case(std::string_view text, std::string_view suffix) {
  if (text.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), text.end() - static_cast<long>(suffix.size()),
                    [](char a, char b) {
                      const auto lower = [](char c) {
                        return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
                      };
                      return lower(a) == lower(b);
                    });
}

uint64_t nanoseconds_since(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count());
}

}  // namespace

bool is_image_name(std::string_view name) {
  return std::any_of(kImageExtensions.begin(), kImageExtensions.end(), [&](std::string_view ext) {
    // A bare ".jpg" is a hidden file with no stem, not an image name.
    return name.size() > ext.size() && ends_with_ignoring_case(name, ext);
  });
}

std::string view_file_name(std::string_view source_name) {
  std::string name(source_name);
  name += kViewSuffix;
  return name;
}

std::optional<std::string_view> view_source_name(std::string_view view_name) {
  if (!view_name.ends_with(kViewSuffix)) return std::nullopt;
  const std::string_view source = view_name.substr(0, view_name.size() - kViewSuffix.size());
  if (!is_image_name(source)) return std::nullopt;
  return source;
}

// ---- ViewRegistry -----------------------------------------------------------------------------

ViewRegistry::ViewRegistry(uint32_t max_slots, uint64_t max_file_bytes)
    : max_slots_(std::min(max_slots, kMaxViewSlots)), max_file_bytes_(max_file_bytes) {
  slots_.resize(max_slots_);
  std::lock_guard lock(mutex_);
  for (const auto& [name, text] : view::view_presets()) {
    if (size() == max_slots_) break;
    add_locked(name, view::parse_view_spec(text));
  }
  preset_count_ = size();
}

uint32_t ViewRegistry::add_locked(std::string name, view::ViewSpec spec) {
  const uint32_t index = size_.load(std::memory_order_relaxed);
  std::string canonical = spec.canonical();
  auto slot = std::make_unique<Slot>();
  slot->name = name;
  slot->header = view::npy_header(spec);
  slot->file_size = view::npy_file_size(spec);
  slot->spec = std::move(spec);
  const auto [it, added] = by_canonical_.try_emplace(std::move(canonical), index);
  slot->canonical = it->second;
  try {
    by_name_.emplace(std::move(name), index);
  } catch (...) {
    if (added) by_canonical_.erase(it);
    throw;
  }
  slots_[index] = std::move(slot);
  size_.store(index + 1, std::memory_order_release);  // publishes the slot to slot()
  return index;
}

std::string ViewRegistry::file_size_refusal(std::string_view name, uint64_t file_size) const {
  if (file_size <= max_file_bytes_) return {};
  return fmt::format(
      "view spec \"{}\": its .npy files would be {} bytes each, more than the {} bytes a view "
      "file may have on this mount (half of --view-cache-size); use a smaller resize/crop or "
      "dtype=uint8/float16, or remount with a larger --view-cache-size",
      store::log_text(name), file_size, max_file_bytes_);
}

ViewRegistry::Found ViewRegistry::find_or_add(std::string_view name) {
  {
    // Fast path without parsing: a name seen before (presets included, which may be too large
    // for a small view cache).
    std::lock_guard lock(mutex_);
    if (const auto it = by_name_.find(std::string(name)); it != by_name_.end()) {
      std::string refusal = file_size_refusal(name, slots_[it->second]->file_size);
      if (!refusal.empty()) return {.slot = std::nullopt, .error = std::move(refusal)};
      return {.slot = it->second, .error = {}};
    }
  }
  view::ViewSpec spec;
  try {
    spec = view::parse_view_spec(name);
  } catch (const view::SpecError& e) {
    return {.slot = std::nullopt, .error = e.what()};
  }
  // Refused before registering: a refused SPEC takes no slot.
  if (std::string refusal = file_size_refusal(name, view::npy_file_size(spec)); !refusal.empty()) {
    return {.slot = std::nullopt, .error = std::move(refusal)};
  }
  std::lock_guard lock(mutex_);
  if (const auto it = by_name_.find(std::string(name)); it != by_name_.end()) {
    return {.slot = it->second, .error = {}};  // another thread added it meanwhile
  }
  if (size() >= max_slots_) {
    std::string error = fmt::format(
        "view spec \"{}\": this mount already has {} view directories, its limit; use one of "
        "the spellings already entered, or remount",
        store::log_text(name), max_slots_);
    if (!full_logged_) {
      full_logged_ = true;
      spdlog::warn("{} (logged once)", error);
    }
    return {.slot = std::nullopt, .error = std::move(error)};
  }
  return {.slot = add_locked(std::string(name), std::move(spec)), .error = {}};
}

const ViewRegistry::Slot* ViewRegistry::slot(uint32_t index) const {
  if (index >= size()) return nullptr;
  return slots_[index].get();
}

// ---- ViewFiles --------------------------------------------------------------------------------

ViewFiles::ViewFiles(prefetch::FileReader& reader, prefetch::ObjectCache& source_cache,
                     uint64_t cache_bytes)
    : reader_(reader),
      source_cache_(source_cache),
      registry_(ViewRegistry::kMaxSlots, cache_bytes / kMaxViewFileShare),
      cache_(cache_bytes) {}

ViewFiles::~ViewFiles() {
  stop();
}

void ViewFiles::start(std::unique_ptr<view::ViewService> service, prefetch::PrefetchEngine* engine,
                      unsigned render_ahead_threads) {
  if (service_) throw std::logic_error("ViewFiles::start called twice");
  service_ = std::move(service);
  if (!engine || render_ahead_threads == 0) return;
  try {
    for (unsigned i = 0; i < render_ahead_threads; ++i) {
      ahead_threads_.emplace_back([this] {
        name_this_thread("render-ahead");
        render_ahead_loop();
      });
    }
  } catch (...) {
    stop();
    throw;
  }
  engine->set_source_listener(
      [this](const prefetch::DatasetSnapshot& dataset, uint32_t entry, uint64_t rank,
             prefetch::ObjectBuffer source) { offer(dataset, entry, rank, std::move(source)); });
}

void ViewFiles::stop() {
  {
    std::lock_guard lock(ahead_mutex_);
    ahead_stopping_ = true;
  }
  ahead_work_.notify_all();
  for (std::thread& thread : ahead_threads_) {
    if (thread.joinable()) thread.join();
  }
  std::lock_guard lock(ahead_mutex_);
  ahead_queue_.clear();
}

ViewFileKey ViewFiles::key_of(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                              uint32_t canonical_slot) const {
  return ViewFileKey{.dataset = dataset.index,
                     .slot = canonical_slot,
                     .generation = dataset.generation(),
                     .entry = entry};
}

prefetch::ObjectBuffer ViewFiles::rendered(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                           const ViewRegistry::Slot& slot, const ViewFileKey& key,
                                           prefetch::ReadOutcome& outcome) {
  std::vector<prefetch::ObjectBuffer> files = cache_.get_many(
      std::span(&key, 1),
      [&](std::span<const ViewFileKey>) {
        return std::vector<prefetch::ObjectBuffer>{render(dataset, entry, slot, key)};
      },
      &outcome);
  return std::move(files.front());
}

prefetch::ObjectBuffer ViewFiles::read(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                       uint32_t canonical_slot, uint64_t offset, uint64_t length) {
  const ViewRegistry::Slot* slot = registry_.slot(canonical_slot);
  if (!slot) throw std::logic_error(fmt::format("view slot {} is not registered", canonical_slot));
  // Lookups refuse such SPECs; an inode the kernel got from a listing must not render either.
  if (std::string refusal = registry_.file_size_refusal(slot->name, slot->file_size);
      !refusal.empty()) {
    spdlog::warn("{} (EIO)", refusal);
    throw ViewRenderError(std::move(refusal));
  }
  if (offset == 0) {
    reader_.report_access(dataset.index, entry);
    set_active(dataset, canonical_slot, entry);
  }
  bytes_read_.fetch_add(length, std::memory_order_relaxed);
  if (offset + length <= slot->header.size()) {
    header_reads_.fetch_add(1, std::memory_order_relaxed);
    return nullptr;
  }
  const ViewFileKey key = key_of(dataset, entry, canonical_slot);
  prefetch::ReadOutcome outcome = prefetch::ReadOutcome::kReady;
  prefetch::ObjectBuffer file = rendered(dataset, entry, *slot, key, outcome);
  if (offset <= slot->header.size()) {  // the READ with the first tensor byte: once per file
    switch (outcome) {
      case prefetch::ReadOutcome::kReady:
        reads_ready_.fetch_add(1, std::memory_order_relaxed);
        break;
      case prefetch::ReadOutcome::kJoined:
        reads_joined_.fetch_add(1, std::memory_order_relaxed);
        break;
      case prefetch::ReadOutcome::kMiss:
        reads_miss_.fetch_add(1, std::memory_order_relaxed);
        break;
    }
  }
  if (offset + length >= slot->file_size) {
    // Read to its end: the kernel's page cache has it now, so it goes first when room is needed.
    cache_.mark_consumed(key);
    if (!ahead_threads_.empty()) {
      bool waiting = false;
      {
        std::lock_guard lock(ahead_mutex_);
        ++ahead_room_serial_;
        waiting = ahead_no_room_;
      }
      if (waiting) ahead_work_.notify_all();
    }
  }
  return file;
}

void ViewFiles::set_active(const prefetch::DatasetSnapshot& dataset, uint32_t canonical_slot,
                           std::optional<uint32_t> entry) {
  if (ahead_threads_.empty()) return;
  std::lock_guard lock(ahead_mutex_);
  if (active_.size() <= dataset.index) active_.resize(dataset.index + 1);
  ActiveView& active = active_[dataset.index];
  active.slot = canonical_slot;
  active.last_read = std::chrono::steady_clock::now();
  if (entry) {
    if (active.read_at.empty()) active.read_at.assign(dataset.catalog->entry_count(), 0);
    active.read_at[*entry] = ++ahead_reads_;
  }
}

std::optional<std::string> ViewFiles::plan_source_path(
    std::string_view line, const std::vector<const prefetch::DatasetSnapshot*>& listed) {
  const std::string prefix = fmt::format("{}/", kViewsDirName);
  if (!line.starts_with(prefix)) return std::nullopt;
  line.remove_prefix(prefix.size());
  const size_t spec_end = line.find('/');
  if (spec_end == std::string_view::npos) return std::string();
  const std::string_view spec = line.substr(0, spec_end);
  const std::string_view dataset_path = line.substr(spec_end + 1);
  const std::string_view name = dataset_path.substr(0, dataset_path.find('/'));
  const std::optional<std::string_view> source = view_source_name(dataset_path);
  if (!source || name.size() == dataset_path.size()) return std::string();
  const ViewRegistry::Found found = registry_.find_or_add(spec);
  if (!found.slot) return std::string();
  for (const prefetch::DatasetSnapshot* d : listed) {
    if (d->name() == name && d->index < kMaxViewDatasets) {
      set_active(*d, registry_.slot(*found.slot)->canonical, std::nullopt);
      return std::string(*source);
    }
  }
  return std::string();
}

void ViewFiles::offer(const prefetch::DatasetSnapshot& dataset, uint32_t entry, uint64_t rank,
                      prefetch::ObjectBuffer source) {
  // Unordered guesses (any unread image of a shuffled epoch) are not rendered: the view cache
  // holds a fraction of them, and a reader's miss would evict one rendered for nothing.
  if (rank >= prefetch::ObjectCache::kUnorderedRank) {
    ahead_unordered_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  {
    std::lock_guard lock(ahead_mutex_);
    if (ahead_stopping_ || dataset.index >= active_.size()) return;
    const ActiveView& active = active_[dataset.index];
    if (active.last_read == std::chrono::steady_clock::time_point{} ||
        std::chrono::steady_clock::now() - active.last_read > kAheadActiveFor) {
      return;
    }
    ahead_offered_.fetch_add(1, std::memory_order_relaxed);
    if (ahead_queue_.size() >= kMaxAheadQueued) {
      ahead_dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    enqueue_locked(AheadItem{.dataset = &dataset,
                             .entry = entry,
                             .slot = active.slot,
                             .rank = rank,
                             .offered_at = ahead_reads_,
                             .source = std::move(source)});
  }
  ahead_work_.notify_one();
}

void ViewFiles::enqueue_locked(AheadItem item) {
  // In rank order: replies arrive out of order, and the sooner a file is read the sooner it must
  // be rendered; one put back for want of room goes before later ones queued meanwhile.
  const auto later =
      std::upper_bound(ahead_queue_.begin(), ahead_queue_.end(), item.rank,
                       [](uint64_t rank, const AheadItem& queued) { return rank < queued.rank; });
  ahead_queue_.insert(later, std::move(item));
}

void ViewFiles::render_ahead_loop() {
  std::unique_lock lock(ahead_mutex_);
  while (!ahead_stopping_) {
    if (ahead_no_room_) {
      // Wait for a reader to finish a file (or a while), then all try again.
      const uint64_t seen = ahead_room_serial_;
      ahead_work_.wait_for(lock, kAheadRoomRetry,
                           [&] { return ahead_stopping_ || ahead_room_serial_ != seen; });
      ahead_no_room_ = false;
      continue;
    }
    if (ahead_queue_.empty()) {
      ahead_work_.wait(lock);
      continue;
    }
    AheadItem item = std::move(ahead_queue_.front());
    ahead_queue_.pop_front();
    // Offered for a SPEC no longer read (the loader moved on, or to another SPEC), or read since
    // it was offered (the readers got ahead of rendering): not worth it.
    const ActiveView& active = active_[item.dataset->index];
    if (active.slot != item.slot ||
        std::chrono::steady_clock::now() - active.last_read > kAheadActiveFor ||
        (!active.read_at.empty() && active.read_at[item.entry] > item.offered_at)) {
      ahead_dropped_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    lock.unlock();
    const bool done = render_ahead(item);
    lock.lock();
    if (!done) {
      enqueue_locked(std::move(item));  // no room yet: back in line
      ahead_no_room_ = true;
    }
  }
}

bool ViewFiles::render_ahead(AheadItem& item) {
  const prefetch::DatasetSnapshot& dataset = *item.dataset;
  const ViewRegistry::Slot& slot = *registry_.slot(item.slot);
  const ViewFileKey key = key_of(dataset, item.entry, item.slot);
  const prefetch::ObjectKey source_key{.dataset = dataset.index,
                                       .chunk = 0,
                                       .generation = dataset.generation(),
                                       .object_id = dataset.catalog->entry(item.entry).object_id};
  {
    MutexLock lock(failed_mutex_);
    if (failed_.contains(key)) return true;
  }
  if (slot.file_size > cache_.capacity_bytes() / 2) {
    ahead_dropped_.fetch_add(1, std::memory_order_relaxed);  // would crowd out the readers' own
    return true;
  }
  if (cache_.present(key)) {
    cache_.promote(key, item.rank);  // keep it for this predicted read
    ahead_already_.fetch_add(1, std::memory_order_relaxed);
    source_cache_.mark_consumed(source_key);
    return true;
  }
  if (!cache_.begin_prefetch(key, slot.file_size, item.rank)) {
    if (!cache_.present(key)) return false;
    ahead_already_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  const auto started = std::chrono::steady_clock::now();
  try {
    const std::span<const std::byte> encoded =
        std::as_bytes(std::span(item.source->bytes().data(), item.source->bytes().size()));
    cache_.finish_prefetch(key, render_bytes(dataset, item.entry, slot, key, encoded));
    ahead_rendered_.fetch_add(1, std::memory_order_relaxed);
  } catch (const ViewRenderError& e) {
    ahead_errors_.fetch_add(1, std::memory_order_relaxed);
    cache_.abandon_prefetch(key, e.what());  // a reader waiting on it gets the remembered EIO
  } catch (const std::exception& e) {
    spdlog::warn("dataset '{}': rendering {} ahead for .views/{} failed: {}",
                 store::log_text(dataset.name()),
                 store::log_text(dataset.catalog->path(item.entry)), store::log_text(slot.name),
                 e.what());
    cache_.abandon_prefetch(key, e.what());
  }
  ahead_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
  // Its view is what will be read: the source's bytes may go first.
  source_cache_.mark_consumed(source_key);
  return true;
}

prefetch::ObjectBuffer ViewFiles::render(const prefetch::DatasetSnapshot& dataset, uint32_t entry,
                                         const ViewRegistry::Slot& slot, const ViewFileKey& key) {
  if (!service_) {
    throw std::logic_error("a view file was read before the view service was started");
  }
  // A file that failed is never cached, so every read of it comes here: answer from memory
  // rather than fetching and decoding it again. Rendered files never reach this lock.
  {
    MutexLock lock(failed_mutex_);
    if (const auto it = failed_.find(key); it != failed_.end()) throw ViewRenderError(it->second);
  }
  const auto started = std::chrono::steady_clock::now();
  const catalog::CatalogEntry& file = dataset.catalog->entry(entry);
  // The view's READ reported the access already.
  const std::vector<prefetch::Slice> slices =
      reader_.read(dataset, entry, 0, file.size, /*report=*/false);
  std::span<const std::byte> encoded;
  std::vector<std::byte> joined;  // only for a file stored in several chunks
  if (slices.size() == 1) {
    const prefetch::Slice& s = slices.front();
    encoded = std::as_bytes(std::span(s.buffer->bytes().data() + s.offset, s.length));
  } else if (slices.size() > 1) {
    joined.resize(file.size);
    size_t at = 0;
    for (const prefetch::Slice& s : slices) {
      std::memcpy(joined.data() + at, s.buffer->bytes().data() + s.offset, s.length);
      at += s.length;
    }
    joined.resize(at);
    encoded = joined;
  }
  const uint64_t fetch_ns = nanoseconds_since(started);
  fetch_ns_.fetch_add(fetch_ns, std::memory_order_relaxed);
  render_ns_.fetch_add(fetch_ns, std::memory_order_relaxed);
  return render_bytes(dataset, entry, slot, key, encoded);
}

prefetch::ObjectBuffer ViewFiles::render_bytes(const prefetch::DatasetSnapshot& dataset,
                                               uint32_t entry, const ViewRegistry::Slot& slot,
                                               const ViewFileKey& key,
                                               std::span<const std::byte> encoded) {
  if (!service_) {
    throw std::logic_error("a view file was rendered before the view service was started");
  }
  const auto started = std::chrono::steady_clock::now();
  std::string rendered;
  try {
    rendered = service_->render(slot.spec, encoded);
  } catch (const view::RenderBusyError& e) {
    // Not the file's fault: not remembered, a later READ may render it.
    render_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
    std::string reason = fmt::format(
        "dataset '{}': {} not rendered for .views/{}: {}", store::log_text(dataset.name()),
        store::log_text(dataset.catalog->path(entry)), store::log_text(slot.name), e.what());
    spdlog::warn("{} (EIO)", reason);
    throw ViewRenderError(std::move(reason));
  } catch (const view::DecodeError& e) {
    render_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
    std::string reason = fmt::format(
        "dataset '{}': {} cannot be decoded for .views/{}: {}", store::log_text(dataset.name()),
        store::log_text(dataset.catalog->path(entry)), store::log_text(slot.name), e.what());
    MutexLock lock(failed_mutex_);
    // Counted and logged once per file, whether a reader or rendering ahead met it first.
    if (failed_.contains(key)) throw ViewRenderError(failed_.at(key));
    render_errors_.fetch_add(1, std::memory_order_relaxed);
    spdlog::warn("{} (EIO)", reason);
    if (failed_.size() < kMaxRememberedFailures) failed_.emplace(key, reason);
    throw ViewRenderError(std::move(reason));
  }
  render_ns_.fetch_add(nanoseconds_since(started), std::memory_order_relaxed);
  if (rendered.size() != slot.file_size) {
    throw std::logic_error(fmt::format("view render of {} gave {} bytes, its size is {}",
                                       store::log_text(dataset.catalog->path(entry)),
                                       rendered.size(), slot.file_size));
  }
  return std::make_shared<const prefetch::ObjectData>(std::move(rendered));
}

ViewStats ViewFiles::stats() const {
  const auto load = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  ViewStats stats;
  if (service_) {
    stats.backend = std::string(service_->backend_name());
    stats.service = service_->stats();
    stats.cuda = view::cuda_backend_info(service_->backend());
  }
  stats.specs = registry_.size();
  stats.rendered = stats.service.rendered;
  stats.render_errors = load(render_errors_);
  stats.header_reads = load(header_reads_);
  stats.bytes_read = load(bytes_read_);
  stats.render_seconds = static_cast<double>(load(render_ns_)) / 1e9;
  stats.fetch_seconds = static_cast<double>(load(fetch_ns_)) / 1e9;
  stats.reads_ready = load(reads_ready_);
  stats.reads_joined = load(reads_joined_);
  stats.reads_miss = load(reads_miss_);
  stats.ahead = RenderAheadStats{
      .threads = static_cast<unsigned>(ahead_threads_.size()),
      .queued = 0,
      .offered = load(ahead_offered_),
      .rendered = load(ahead_rendered_),
      .already = load(ahead_already_),
      .dropped = load(ahead_dropped_),
      .unordered = load(ahead_unordered_),
      .errors = load(ahead_errors_),
      .seconds = static_cast<double>(load(ahead_ns_)) / 1e9,
  };
  {
    std::lock_guard lock(ahead_mutex_);
    stats.ahead.queued = ahead_queue_.size();
  }
  stats.cache = cache_.stats();
  return stats;
}

}  // namespace dsfs::fs
