#pragma once
// A byte-bounded cache of immutable objects with single-flight loading: however many readers
// ask for an object that is missing, it is loaded once and they all get that one result.
#include <cstdint>
#include <functional>
#include <future>
#include <list>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "prefetch/object_data.h"

namespace dsfs::prefetch {

// Which object: one chunk of one object of one dataset generation. `dataset` is the mount's
// index of the dataset, so two mounted datasets never share entries.
struct ObjectKey {
  uint32_t dataset = 0;
  uint32_t chunk = 0;
  uint64_t generation = 0;
  uint64_t object_id = 0;
  bool operator==(const ObjectKey&) const = default;
};

struct ObjectKeyHash {
  size_t operator()(const ObjectKey& key) const;
};

struct CacheStats {
  uint64_t capacity_bytes = 0;
  uint64_t bytes = 0;  // payload bytes held now (never above capacity_bytes)
  uint64_t entries = 0;
  uint64_t hits = 0;    // found in the cache
  uint64_t misses = 0;  // loaded by the caller
  uint64_t joined = 0;  // waited for a load another caller had started
  uint64_t evictions = 0;
  uint64_t too_large = 0;  // loaded objects bigger than the whole cache, served but not kept
};

class ObjectCache {
 public:
  // Loads the objects for `keys` (all missing, no duplicates) and returns them in the same
  // order. May throw; the exception then reaches every caller waiting for those keys.
  using LoadMany = std::function<std::vector<ObjectBuffer>(std::span<const ObjectKey> keys)>;

  explicit ObjectCache(uint64_t capacity_bytes);
  ObjectCache(const ObjectCache&) = delete;
  ObjectCache& operator=(const ObjectCache&) = delete;

  // Returns the objects for `keys`, in order: cached ones at once, ones another caller is
  // loading when that load finishes, and the rest through one call of `load` (so a caller can
  // pipeline them). Rethrows the exception of a failed load; nothing of it is cached, so the
  // next caller tries again.
  std::vector<ObjectBuffer> get_many(std::span<const ObjectKey> keys, const LoadMany& load);
  ObjectBuffer get(const ObjectKey& key, const std::function<ObjectBuffer()>& load);

  // The cached object, or nullptr; no loading, and it does not count as a hit or miss.
  ObjectBuffer peek(const ObjectKey& key) const;

  CacheStats stats() const;
  uint64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  struct Entry {
    ObjectKey key;
    ObjectBuffer buffer;
  };
  using Lru = std::list<Entry>;  // front: most recently used

  void insert_locked(const ObjectKey& key, ObjectBuffer buffer);

  const uint64_t capacity_bytes_;
  mutable std::mutex mutex_;
  Lru lru_;
  std::unordered_map<ObjectKey, Lru::iterator, ObjectKeyHash> index_;
  std::unordered_map<ObjectKey, std::shared_future<ObjectBuffer>, ObjectKeyHash> loading_;
  CacheStats stats_;
};

}  // namespace dsfs::prefetch
