#pragma once
// The definitions of BasicObjectCache (object_cache.h), included only where a key type is
// instantiated: object_cache.cpp (ObjectKey) and fs/views.cpp (the view cache's key).
#include <new>
#include <stdexcept>

#include "prefetch/object_cache.h"

namespace dsfs::prefetch {

template <typename Key, typename KeyHash>
BasicObjectCache<Key, KeyHash>::BasicObjectCache(uint64_t capacity_bytes)
    : capacity_bytes_(capacity_bytes) {}

template <typename Key, typename KeyHash>
ObjectBuffer BasicObjectCache<Key, KeyHash>::get(const Key& key,
                                                 const std::function<ObjectBuffer()>& load) {
  std::vector<ObjectBuffer> result =
      get_many(std::span<const Key>(&key, 1),
               [&](std::span<const Key>) { return std::vector<ObjectBuffer>{load()}; });
  return std::move(result.front());
}

template <typename Key, typename KeyHash>
std::vector<ObjectBuffer> BasicObjectCache<Key, KeyHash>::get_many(std::span<const Key> keys,
                                                                   const LoadMany& load,
                                                                   ReadOutcome* outcome,
                                                                   bool read_whole) {
  std::vector<ObjectBuffer> result(keys.size());
  std::vector<Key> to_load;
  std::vector<size_t> to_load_positions;
  std::vector<std::promise<ObjectBuffer>> promises;
  std::vector<std::pair<size_t, std::shared_future<ObjectBuffer>>> to_wait;
  // Every key we register as loading must leave loading_ with an answer for its waiters, even
  // when we fail half-way (out of memory): otherwise later readers would join a promise that is
  // never kept and get std::future_error for that object until the cache is gone.
  const auto withdraw = [&](const std::exception_ptr& failure) {
    {
      MutexLock lock(mutex_);
      for (const Key& key : to_load) loading_.erase(key);
    }
    for (auto& promise : promises) promise.set_exception(failure);
  };
  try {
    // Reserved, so that a key is in to_load exactly when it is in loading_.
    to_load.reserve(keys.size());
    to_load_positions.reserve(keys.size());
    to_wait.reserve(keys.size());
    promises.reserve(keys.size());
    MutexLock lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) {
      const Key& key = keys[i];
      if (auto it = entries_.find(key); it != entries_.end()) {
        Entry& entry = it->second;
        if (read_whole) {
          // Read to its end now.
          set_standing_locked(key, entry, consumed_standing(entry.buffer), ++clock_);
        } else if (entry.victim.standing != Standing::kPredicted) {
          set_standing_locked(key, entry, entry.victim.standing, ++clock_);
        }
        note_used_locked(entry);
        result[i] = entry.buffer;
        ++stats_.hits;
      } else if (auto loading = loading_.find(key); loading != loading_.end()) {
        loading->second.joined = true;
        to_wait.emplace_back(i, loading->second.future);
        ++stats_.joined;
      } else {
        promises.emplace_back();
        Loading record;
        record.future = promises.back().get_future().share();
        loading_.emplace(key, std::move(record));
        to_load.push_back(key);
        to_load_positions.push_back(i);
        ++stats_.misses;
      }
    }
  } catch (...) {
    withdraw(std::current_exception());
    throw;
  }
  if (outcome) {
    *outcome = !to_load.empty()   ? ReadOutcome::kMiss
               : !to_wait.empty() ? ReadOutcome::kJoined
                                  : ReadOutcome::kReady;
  }

  if (!to_load.empty()) {
    std::vector<ObjectBuffer> loaded;
    try {
      loaded = load(to_load);
      if (loaded.size() != to_load.size()) {
        throw std::logic_error("ObjectCache: the loader returned a different number of objects");
      }
      for (const ObjectBuffer& buffer : loaded) {
        if (!buffer) throw std::logic_error("ObjectCache: the loader returned a null object");
      }
    } catch (...) {
      // Waiters see the same failure; nothing is cached, so the next caller loads again.
      withdraw(std::current_exception());
      throw;
    }
    {
      MutexLock lock(mutex_);
      // Erasing cannot throw, so no key stays registered once its load is done.
      for (const Key& key : to_load) loading_.erase(key);
      for (size_t j = 0; j < to_load.size(); ++j) {
        try {
          insert_locked(to_load[j], loaded[j], read_whole);
        } catch (const std::bad_alloc&) {
          // Served all the same, just not kept.
        }
      }
    }
    for (size_t j = 0; j < to_load.size(); ++j) {
      promises[j].set_value(loaded[j]);
      result[to_load_positions[j]] = std::move(loaded[j]);
    }
  }

  // Only after our own loads are done, so two callers never wait on each other.
  for (auto& [position, future] : to_wait) {
    try {
      result[position] = future.get();
    } catch (const PrefetchAbandoned&) {
      // The prefetch we joined gave up: load it ourselves, with the demand path's retries.
      if (outcome) *outcome = ReadOutcome::kMiss;
      result[position] =
          std::move(get_many(keys.subspan(position, 1), load, nullptr, read_whole).front());
    }
  }
  return result;
}

template <typename Key, typename KeyHash>
typename BasicObjectCache<Key, KeyHash>::Standing BasicObjectCache<Key, KeyHash>::consumed_standing(
    const ObjectBuffer& buffer) {
  return buffer->awaiting_disk() ? Standing::kConsumedAwaitingDisk : Standing::kConsumed;
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::note_used_locked(Entry& entry) {
  if (entry.prefetched && !entry.used) {
    entry.used = true;
    stats_.used_bytes += entry.buffer->size();
  }
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::set_standing_locked(const Key& key, Entry& entry,
                                                         Standing standing, uint64_t order) {
  victims_.erase(entry.victim);
  entry.victim = VictimOrder{standing, order, ++clock_};
  victims_.emplace(entry.victim, key);
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::erase_entry_locked(
    typename std::unordered_map<Key, Entry, KeyHash>::iterator it) {
  Entry& entry = it->second;
  stats_.bytes -= entry.buffer->size();
  if (entry.prefetched && !entry.used) stats_.wasted_bytes += entry.buffer->size();
  victims_.erase(entry.victim);
  entries_.erase(it);
}

template <typename Key, typename KeyHash>
bool BasicObjectCache<Key, KeyHash>::make_room_locked(uint64_t size, RoomFor purpose,
                                                      uint64_t rank) {
  if (stats_.bytes + stats_.reserved_bytes + size <= capacity_bytes_) return true;
  // Whether an object may go for this one. Objects being read (a reader holds their buffer) stay
  // whatever they are: evicting them would free nothing until the reader is done.
  const auto evictable = [&](const Entry& entry) {
    if (entry.buffer.use_count() > 1) return false;
    switch (entry.victim.standing) {
      case Standing::kConsumed:
      case Standing::kConsumedAwaitingDisk:
        return true;
      case Standing::kPredicted:
        return purpose == RoomFor::kDemand || (purpose == RoomFor::kPrefetch && entry.rank > rank);
      case Standing::kOther:
        return purpose != RoomFor::kPrefetch;
    }
    return false;
  };
  // First find out whether enough can go, so a refusal evicts nothing. Victims are ordered by
  // standing (consumed, other, predicted), so the walk skips or stops at a whole standing that
  // may not go for this newcomer: a walk over every object held would run under the lock on
  // every miss of an epoch whose cache is full of predictions (measured: half the daemon's CPU
  // with 5,000 objects held).
  uint64_t can_free = capacity_bytes_ - stats_.bytes - stats_.reserved_bytes;
  std::vector<Key> chosen;
  for (auto it = victims_.begin(); it != victims_.end() && can_free < size;) {
    const Standing standing = it->first.standing;
    if (standing == Standing::kOther && purpose == RoomFor::kPrefetch) {
      it = victims_.lower_bound(VictimOrder{Standing::kPredicted, 0, 0});
      continue;
    }
    if (standing == Standing::kPredicted && purpose == RoomFor::kReadOnce) break;
    ++stats_.victims_examined;
    const Key& key = it->second;
    ++it;
    const Entry& entry = entries_.at(key);
    if (!evictable(entry)) {
      // Predicted objects come last, latest first: past one ranked no later than the newcomer,
      // none may go.
      if (purpose == RoomFor::kPrefetch && entry.victim.standing == Standing::kPredicted &&
          entry.rank <= rank) {
        break;
      }
      continue;
    }
    can_free += entry.buffer->size();
    chosen.push_back(key);
  }
  if (can_free < size) return false;
  for (const Key& key : chosen) {
    erase_entry_locked(entries_.find(key));
    ++stats_.evictions;
  }
  return true;
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::insert_locked(const Key& key, ObjectBuffer buffer,
                                                   bool read_whole) {
  const uint64_t size = buffer->size();
  if (size > capacity_bytes_) {
    ++stats_.too_large;
    return;
  }
  if (auto existing = entries_.find(key); existing != entries_.end()) erase_entry_locked(existing);
  if (!make_room_locked(size, read_whole ? RoomFor::kReadOnce : RoomFor::kDemand, 0)) {
    ++stats_.not_kept;
    return;
  }
  const Standing standing = read_whole ? consumed_standing(buffer) : Standing::kOther;
  Entry entry{.buffer = std::move(buffer), .victim = {standing, ++clock_, ++clock_}};
  auto [it, inserted] = entries_.emplace(key, std::move(entry));
  try {
    victims_.emplace(it->second.victim, key);
  } catch (...) {
    entries_.erase(it);  // an entry without a victim slot could never be evicted
    throw;
  }
  stats_.bytes += size;
}

template <typename Key, typename KeyHash>
bool BasicObjectCache<Key, KeyHash>::begin_prefetch(const Key& key, uint64_t size, uint64_t rank) {
  MutexLock lock(mutex_);
  if (size > capacity_bytes_ || entries_.contains(key) || loading_.contains(key)) return false;
  if (!make_room_locked(size, RoomFor::kPrefetch, rank)) return false;
  auto promise = std::make_shared<std::promise<ObjectBuffer>>();
  Loading record;
  record.future = promise->get_future().share();
  record.prefetch_promise = promise;
  record.reserved = size;
  record.rank = rank;
  loading_.emplace(key, std::move(record));
  stats_.reserved_bytes += size;
  ++stats_.prefetches;
  ++stats_.prefetch_inflight;
  return true;
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::finish_prefetch(const Key& key, ObjectBuffer buffer) {
  std::shared_ptr<std::promise<ObjectBuffer>> promise;
  {
    MutexLock lock(mutex_);
    const auto it = loading_.find(key);
    if (it == loading_.end() || !it->second.prefetch_promise) {
      throw std::logic_error("finish_prefetch without begin_prefetch");
    }
    Loading loading = std::move(it->second);
    loading_.erase(it);
    stats_.reserved_bytes -= loading.reserved;
    --stats_.prefetch_inflight;
    promise = std::move(loading.prefetch_promise);
    const uint64_t size = buffer->size();
    // The reservation made the room; a size other than the one reserved still must fit.
    if (size <= loading.reserved || make_room_locked(size, RoomFor::kDemand, 0)) {
      Entry entry{.buffer = buffer,
                  .victim = {Standing::kPredicted, ~loading.rank, ++clock_},
                  .rank = loading.rank,
                  .prefetched = true};
      auto [entry_it, inserted] = entries_.emplace(key, std::move(entry));
      victims_.emplace(entry_it->second.victim, key);
      stats_.bytes += size;
      stats_.prefetched_bytes += size;
      if (loading.joined) note_used_locked(entry_it->second);
    } else {
      ++stats_.not_kept;
    }
  }
  promise->set_value(std::move(buffer));
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::abandon_prefetch(const Key& key, const std::string& why) {
  std::shared_ptr<std::promise<ObjectBuffer>> promise;
  {
    MutexLock lock(mutex_);
    const auto it = loading_.find(key);
    if (it == loading_.end() || !it->second.prefetch_promise) return;
    stats_.reserved_bytes -= it->second.reserved;
    --stats_.prefetch_inflight;
    promise = std::move(it->second.prefetch_promise);
    loading_.erase(it);
  }
  promise->set_exception(std::make_exception_ptr(PrefetchAbandoned(why)));
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::mark_consumed(const Key& key) {
  MutexLock lock(mutex_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return;
  note_used_locked(it->second);
  set_standing_locked(key, it->second, consumed_standing(it->second.buffer), ++clock_);
}

template <typename Key, typename KeyHash>
ObjectBuffer BasicObjectCache<Key, KeyHash>::promote(const Key& key, uint64_t rank) {
  MutexLock lock(mutex_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return nullptr;
  Entry& entry = it->second;
  if (entry.victim.standing != Standing::kPredicted || entry.rank > rank) {
    entry.rank = rank;
    set_standing_locked(key, entry, Standing::kPredicted, ~rank);
  }
  return entry.buffer;
}

template <typename Key, typename KeyHash>
void BasicObjectCache<Key, KeyHash>::new_epoch() {
  MutexLock lock(mutex_);
  for (auto& [key, entry] : entries_) {
    if (entry.victim.standing != Standing::kConsumed &&
        entry.victim.standing != Standing::kConsumedAwaitingDisk) {
      continue;
    }
    entry.rank = kUnorderedRank;
    set_standing_locked(key, entry, Standing::kPredicted, ~kUnorderedRank);
  }
}

template <typename Key, typename KeyHash>
ObjectBuffer BasicObjectCache<Key, KeyHash>::peek(const Key& key) const {
  MutexLock lock(mutex_);
  const auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second.buffer;
}

template <typename Key, typename KeyHash>
bool BasicObjectCache<Key, KeyHash>::present(const Key& key) const {
  MutexLock lock(mutex_);
  return entries_.contains(key) || loading_.contains(key);
}

template <typename Key, typename KeyHash>
CacheStats BasicObjectCache<Key, KeyHash>::stats() const {
  MutexLock lock(mutex_);
  CacheStats snapshot = stats_;
  snapshot.capacity_bytes = capacity_bytes_;
  snapshot.entries = entries_.size();
  return snapshot;
}

}  // namespace dsfs::prefetch
