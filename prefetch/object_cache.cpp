#include "prefetch/object_cache.h"

#include <xxhash.h>

#include <new>
#include <stdexcept>

namespace dsfs::prefetch {

size_t ObjectKeyHash::operator()(const ObjectKey& key) const {
  const uint64_t words[3] = {(uint64_t{key.dataset} << 32) | key.chunk, key.generation,
                             key.object_id};
  return static_cast<size_t>(XXH3_64bits(words, sizeof(words)));
}

ObjectCache::ObjectCache(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

ObjectBuffer ObjectCache::get(const ObjectKey& key, const std::function<ObjectBuffer()>& load) {
  std::vector<ObjectBuffer> result =
      get_many(std::span<const ObjectKey>(&key, 1),
               [&](std::span<const ObjectKey>) { return std::vector<ObjectBuffer>{load()}; });
  return std::move(result.front());
}

std::vector<ObjectBuffer> ObjectCache::get_many(std::span<const ObjectKey> keys,
                                                const LoadMany& load) {
  std::vector<ObjectBuffer> result(keys.size());
  std::vector<ObjectKey> to_load;
  std::vector<size_t> to_load_positions;
  std::vector<std::promise<ObjectBuffer>> promises;
  std::vector<std::pair<size_t, std::shared_future<ObjectBuffer>>> to_wait;
  // Every key we register as loading must leave loading_ with an answer for its waiters, even
  // when we fail half-way (out of memory): otherwise later readers would join a promise that is
  // never kept and get std::future_error for that object until the cache is gone.
  const auto withdraw = [&](const std::exception_ptr& failure) {
    {
      std::lock_guard lock(mutex_);
      for (const ObjectKey& key : to_load) loading_.erase(key);
    }
    for (auto& promise : promises) promise.set_exception(failure);
  };
  try {
    // Reserved, so that a key is in to_load exactly when it is in loading_.
    to_load.reserve(keys.size());
    to_load_positions.reserve(keys.size());
    to_wait.reserve(keys.size());
    promises.reserve(keys.size());
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < keys.size(); ++i) {
      const ObjectKey& key = keys[i];
      if (auto it = index_.find(key); it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        result[i] = it->second->buffer;
        ++stats_.hits;
      } else if (auto loading = loading_.find(key); loading != loading_.end()) {
        to_wait.emplace_back(i, loading->second);
        ++stats_.joined;
      } else {
        promises.emplace_back();
        loading_.emplace(key, promises.back().get_future().share());
        to_load.push_back(key);
        to_load_positions.push_back(i);
        ++stats_.misses;
      }
    }
  } catch (...) {
    withdraw(std::current_exception());
    throw;
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
      std::lock_guard lock(mutex_);
      for (const ObjectKey& key : to_load) loading_.erase(key);
      for (size_t j = 0; j < to_load.size(); ++j) {
        try {
          insert_locked(to_load[j], loaded[j]);
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
  for (auto& [position, future] : to_wait) result[position] = future.get();
  return result;
}

void ObjectCache::insert_locked(const ObjectKey& key, ObjectBuffer buffer) {
  const uint64_t size = buffer->size();
  if (size > capacity_bytes_) {
    ++stats_.too_large;
    return;
  }
  if (auto existing = index_.find(key); existing != index_.end()) {
    stats_.bytes -= existing->second->buffer->size();
    lru_.erase(existing->second);
    index_.erase(existing);
  }
  while (stats_.bytes + size > capacity_bytes_ && !lru_.empty()) {
    const Entry& victim = lru_.back();
    stats_.bytes -= victim.buffer->size();
    index_.erase(victim.key);
    lru_.pop_back();
    ++stats_.evictions;
  }
  lru_.push_front(Entry{key, std::move(buffer)});
  try {
    index_.emplace(key, lru_.begin());
  } catch (...) {
    lru_.pop_front();  // an unindexed entry would later be evicted from bytes never counted
    throw;
  }
  stats_.bytes += size;
}

ObjectBuffer ObjectCache::peek(const ObjectKey& key) const {
  std::lock_guard lock(mutex_);
  const auto it = index_.find(key);
  return it == index_.end() ? nullptr : it->second->buffer;
}

CacheStats ObjectCache::stats() const {
  std::lock_guard lock(mutex_);
  CacheStats snapshot = stats_;
  snapshot.capacity_bytes = capacity_bytes_;
  snapshot.entries = index_.size();
  return snapshot;
}

}  // namespace dsfs::prefetch
