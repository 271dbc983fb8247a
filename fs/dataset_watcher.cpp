#include "fs/dataset_watcher.h"

#include <spdlog/spdlog.h>

#include <cerrno>

#include "fs/mount.h"
#include "src/catalog/dataset.h"
#include "src/store/errors.h"
#include "src/store/log_text.h"
#include "src/store/thread_name.h"

namespace dsfs::fs {
namespace {

bool reserved_name(std::string_view name) {
  return name == kMetaDirName || name == kControlDirName || name == kViewsDirName;
}

}  // namespace

DatasetWatcher::DatasetWatcher(MountTree& tree, store::Client& client, catalog::KeySchema keys,
                               WatchOptions options, GenerationLeases* leases,
                               ChangeListener on_change)
    : tree_(tree),
      client_(client),
      keys_(std::move(keys)),
      options_(std::move(options)),
      leases_(leases),
      on_change_(std::move(on_change)),
      announced_(tree.listing()) {}

DatasetWatcher::~DatasetWatcher() {
  stop();
}

void DatasetWatcher::start() {
  if (options_.interval.count() <= 0 || poller_.joinable()) return;
  poller_ = std::jthread([this](std::stop_token stop) {
    name_this_thread("dataset-watch");
    poll_loop(std::move(stop));
  });
}

void DatasetWatcher::stop() {
  if (!poller_.joinable()) return;
  poller_.request_stop();
  wake_.notify_all();
  poller_.join();
}

void DatasetWatcher::poll_loop(std::stop_token stop) {
  for (;;) {
    {
      std::unique_lock lock(stats_mutex_);
      // Sleeps a period, or returns at once when stop() asks.
      wake_.wait_for(lock, stop, options_.interval, [] { return false; });
    }
    if (stop.stop_requested()) return;
    PassResult result;
    try {
      int error = 0;
      run_pass(nullptr, error, result);
      MutexLock stats(stats_mutex_);
      if (failing_) spdlog::info("watching for dataset changes works again");
      failing_ = false;
    } catch (const std::exception& e) {
      MutexLock stats(stats_mutex_);
      ++stats_.poll_failures;
      // Once per outage: the mount keeps serving what it has.
      if (!failing_) {
        spdlog::warn(
            "cannot check {} for dataset changes ({}); the mount serves what it has and tries "
            "again every {} s",
            client_.describe(), store::log_text(e.what(), 400),
            static_cast<double>(options_.interval.count()) / 1000.0);
      }
      failing_ = true;
    }
    announce(result);
  }
}

int DatasetWatcher::refresh(const std::vector<std::string>& names) {
  const std::set<std::string> update(names.begin(), names.end());
  PassResult result;
  int error = 0;
  try {
    run_pass(&update, error, result);
  } catch (const std::exception& e) {
    {
      MutexLock stats(stats_mutex_);
      ++stats_.poll_failures;
    }
    spdlog::error("refresh failed: cannot read the datasets from {}: {}", client_.describe(),
                  store::log_text(e.what(), 400));
    announce(result);  // what the pass changed before it failed
    return EIO;
  }
  announce(result);
  return error;
}

void DatasetWatcher::run_pass(const std::set<std::string>* update, int& error, PassResult& result) {
  MutexLock lock(pass_mutex_);
  // Whether or not the pass got to its end (Redis may go away midway), what it changed stays
  // changed: it is numbered, its listing taken and its changes counted either way.
  try {
    pass(update, error, result);
  } catch (...) {
    seal(result);
    throw;
  }
  seal(result);
}

void DatasetWatcher::seal(PassResult& result) {
  result.number = ++passes_;
  result.listing = tree_.listing();
  MutexLock stats(stats_mutex_);
  stats_.added += result.counted.added;
  stats_.removed += result.counted.removed;
  stats_.refreshed += result.counted.refreshed;
}

void DatasetWatcher::announce(PassResult& result) {
  if (!result.listing) return;
  if (!result.changed.empty()) on_change_(result.changed);
  MutexLock lock(stats_mutex_);
  // A poll and a refresh may tell their listeners in either order; the later pass's listing
  // stays.
  if (result.number > announced_pass_) {
    announced_pass_ = result.number;
    announced_ = std::move(result.listing);
  }
}

WatchStats DatasetWatcher::stats() const {
  MutexLock lock(stats_mutex_);
  return stats_;
}

std::shared_ptr<const MountTree::Listing> DatasetWatcher::announced_listing() const {
  MutexLock lock(stats_mutex_);
  return announced_;
}

void DatasetWatcher::pass(const std::set<std::string>* update, int& error, PassResult& result) {
  const std::vector<std::string> published_list = catalog::list_datasets(client_, keys_);
  const std::set<std::string> published(published_list.begin(), published_list.end());
  std::vector<std::string>& changed = result.changed;
  WatchStats& counted = result.counted;

  // Removed: unlisted at once. Files open under them keep what the cache holds; other reads
  // find the keys gone and fail with EIO.
  for (const prefetch::DatasetSnapshot* d : tree_.listing()->datasets) {
    if (published.contains(d->name())) continue;
    tree_.unlist(d->name());
    d->mark_gone();  // its keys may come back holding another dataset's objects
    drop_lease(d->name(), d->generation());
    changed.push_back(d->name());
    ++counted.removed;
    spdlog::info("dataset '{}' was removed from Redis; it no longer appears in the mount",
                 store::log_text(d->name()));
  }

  std::vector<std::string> wanted;
  if (options_.names.empty()) {
    wanted = published_list;
  } else {
    for (const std::string& name : options_.names) {
      if (published.contains(name)) wanted.push_back(name);
    }
  }
  std::map<std::string, uint64_t> pending;
  for (const std::string& name : wanted) {
    if (reserved_name(name)) {
      if (skipped_.emplace(name, 0).second) {
        spdlog::warn(
            "dataset '{}' cannot appear in the mount: its name is taken by the mount's own {} "
            "directory; re-ingest it under another name",
            store::log_text(name), store::log_text(name));
      }
      continue;
    }
    const std::optional<uint32_t> index = tree_.find(name);
    const prefetch::DatasetSnapshot* listed = index ? tree_.dataset(*index) : nullptr;
    catalog::DatasetInfo info;
    try {
      info = catalog::read_info(client_, keys_, name);
    } catch (const store::ConnectionError&) {
      throw;
    } catch (const store::ReplyError&) {
      throw;
    } catch (const std::runtime_error& e) {
      // Damaged or of a newer schema: what is listed stays; a new one waits until it is fixed.
      if (skipped_.emplace(name, 0).second) {
        spdlog::warn("dataset '{}' cannot be served: {}", store::log_text(name),
                     store::log_text(e.what(), 400));
      }
      if (update && (update->empty() || update->contains(name))) error = EIO;
      continue;
    }
    if (listed == nullptr) {
      if (skipped_.contains(name) && skipped_[name] == info.generation) continue;
      if (list_current(name, nullptr)) {
        changed.push_back(name);
        ++counted.added;
      }
      continue;
    }
    // Removed and made again since the last pass (rm and ingest, or Redis lost its data): a
    // generation number that went down, or the one shown made by another ingest. Its keys are
    // gone or hold the new dataset's objects, so it cannot be served a moment longer.
    const bool made_again = info.generation < listed->generation() ||
                            (info.generation == listed->generation() &&
                             prefetch::ingest_identity(info) != listed->ingest_identity());
    if (made_again) {
      const uint64_t old_generation = listed->generation();
      listed->mark_gone();
      spdlog::warn(
          "dataset '{}' generation {} was removed from Redis and made again (now generation "
          "{}); the mount shows the new one, and files opened before fail with EIO",
          store::log_text(name), listed->generation(), info.generation);
      if (list_current(name, listed)) {
        changed.push_back(name);
        ++counted.refreshed;
      } else {
        tree_.unlist(name);
        drop_lease(name, old_generation);  // no-op if the failed load dropped that number's
        changed.push_back(name);
        ++counted.removed;
      }
      continue;
    }
    if (info.generation <= listed->generation()) continue;
    const bool switch_now =
        update ? (update->empty() || update->contains(name)) : options_.follow_updates;
    if (!switch_now) {
      pending[name] = info.generation;
      continue;
    }
    if (list_current(name, listed)) {
      changed.push_back(name);
      ++counted.refreshed;
    } else {
      error = EIO;
    }
  }
  if (update) {
    for (const std::string& name : *update) {
      if (published.contains(name) || tree_.find(name)) continue;
      spdlog::warn("refresh: no dataset '{}' is published in namespace '{}'", store::log_text(name),
                   keys_.ns());
      error = ENOENT;
    }
  }

  MutexLock stats(stats_mutex_);
  for (const auto& [name, generation] : pending) {
    const auto before = stats_.pending.find(name);
    if (before == stats_.pending.end() || before->second != generation) {
      spdlog::info(
          "dataset '{}' has a new generation {} (the mount serves {}); `dsfs refresh` switches "
          "to it",
          store::log_text(name), generation, tree_.dataset(*tree_.find(name))->generation());
    }
  }
  stats_.pending = std::move(pending);
  ++stats_.polls;
}

bool DatasetWatcher::list_current(const std::string& name,
                                  const prefetch::DatasetSnapshot* replacing) {
  prefetch::DatasetSnapshot snapshot;
  bool pinned = false;
  try {
    // Pinned before loading, as at mount time: no collection can delete it from here on.
    if (leases_) {
      snapshot.info = leases_->pin_current(name);
      pinned = true;
    } else {
      snapshot.info = catalog::read_info(client_, keys_, name);
    }
    snapshot.catalog = catalog::load_catalog(client_, keys_, snapshot.info);
  } catch (const store::ConnectionError&) {
    if (pinned) leases_->forget(name, snapshot.info.generation);
    throw;
  } catch (const store::ReplyError&) {
    if (pinned) leases_->forget(name, snapshot.info.generation);
    throw;
  } catch (const std::runtime_error& e) {
    spdlog::warn("dataset '{}' generation {} cannot be served: {}", store::log_text(name),
                 snapshot.info.generation, store::log_text(e.what(), 400));
    skipped_[name] = snapshot.info.generation;
    if (pinned) drop_lease(name, snapshot.info.generation);
    return false;
  }
  const uint64_t generation = snapshot.info.generation;
  const uint64_t files = snapshot.catalog->file_count();
  const uint64_t catalog_bytes = snapshot.catalog->memory_bytes();
  try {
    tree_.list(std::move(snapshot));
  } catch (const std::exception& e) {
    spdlog::warn("dataset '{}' generation {} cannot be listed: {}", store::log_text(name),
                 generation, e.what());
    skipped_[name] = generation;
    if (pinned) drop_lease(name, generation);
    return false;
  }
  skipped_.erase(name);
  if (replacing && replacing->gone()) {
    // Made again under the same number: the lease just taken is that number's, and is kept.
    if (replacing->generation() != generation) drop_lease(name, replacing->generation());
    spdlog::info("dataset '{}' now shows generation {} ({} files), made again",
                 store::log_text(name), generation, files);
  } else if (replacing) {
    drop_lease(name, replacing->generation());
    spdlog::info(
        "dataset '{}' now shows generation {} ({} files); files opened before keep reading "
        "generation {}, whose catalogue ({:.1f} MB) stays in memory until unmount",
        store::log_text(name), generation, files, replacing->generation(),
        static_cast<double>(replacing->catalog->memory_bytes()) / 1e6);
  } else {
    spdlog::info("dataset '{}' generation {} appeared: {} files ({:.1f} MB of catalogue)",
                 store::log_text(name), generation, files,
                 static_cast<double>(catalog_bytes) / 1e6);
  }
  return true;
}

void DatasetWatcher::drop_lease(const std::string& name, uint64_t generation) {
  if (!leases_) return;
  try {
    leases_->unpin(name, generation);
  } catch (const std::exception& e) {
    // The lease is no longer renewed either way, so it expires by itself.
    spdlog::warn(
        "dataset '{}': cannot drop this mount's lease on generation {} ({}); it expires "
        "by itself",
        store::log_text(name), generation, store::log_text(e.what()));
  }
}

}  // namespace dsfs::fs
