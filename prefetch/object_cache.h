#pragma once
// A byte-bounded cache of immutable objects with single-flight loading: however many readers
// ask for an object that is missing, it is loaded once and they all get that one result. The
// prefetch engine reserves room for objects it fetches ahead, so cached plus reserved bytes never
// exceed the bound.
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#include "prefetch/object_data.h"
#include "src/store/thread_annotations.h"

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

// A prefetch was given up (Redis failed, or the data did not check out). Readers that joined it
// load the object themselves, so they see the demand path's retries and errors.
class PrefetchAbandoned : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CacheStats {
  uint64_t capacity_bytes = 0;
  uint64_t bytes = 0;           // payload bytes held now
  uint64_t reserved_bytes = 0;  // room held for prefetches in flight; bytes + reserved <= capacity
  uint64_t entries = 0;
  uint64_t hits = 0;    // found in the cache
  uint64_t misses = 0;  // loaded by the caller
  uint64_t joined = 0;  // waited for a load another caller (or a prefetch) had started
  uint64_t evictions = 0;
  uint64_t too_large = 0;   // loaded objects bigger than the whole cache, served but not kept
  uint64_t not_kept = 0;    // loaded while everything else was being read or fetched: not kept
  uint64_t prefetches = 0;  // prefetches started
  uint64_t prefetch_inflight = 0;  // prefetches started and not yet finished or abandoned
  uint64_t prefetched_bytes = 0;   // bytes prefetches brought in
  uint64_t used_bytes = 0;         // of those, bytes a reader asked for before they left
  uint64_t wasted_bytes = 0;       // of those, bytes evicted before any reader asked for them
  // Objects the searches for room looked at. Each search stops where nothing further may go for
  // its newcomer, so this grows with the evictions and the objects held by readers, not with
  // the cache's size.
  uint64_t victims_examined = 0;
};

// How a get_many call found its objects: the worst of its keys.
enum class ReadOutcome : uint8_t { kReady, kJoined, kMiss };

// A byte-bounded cache of immutable objects, keyed by `Key` (hashed by `KeyHash`).
// Thread safety: internally synchronized; every member function may be called from any thread
// (FUSE workers, prefetch fetch threads, render-ahead threads). One mutex, mutex_, guards all
// mutable state (entries_, victims_, loading_, clock_, stats_); loads run outside it, and a
// load's waiters block on its promise, not on mutex_. The ObjectBuffers it hands out are
// immutable and shared.
template <typename Key, typename KeyHash>
class BasicObjectCache {
 public:
  // Loads the objects for `keys` (all missing, no duplicates) and returns them in the same
  // order. May throw; the exception then reaches every caller waiting for those keys.
  using LoadMany = std::function<std::vector<ObjectBuffer>(std::span<const Key> keys)>;

  // Predicted-use rank of objects whose order is unknown (any unread file of a shuffled epoch):
  // later than every ordered prediction, and never evicted to make room for one another.
  static constexpr uint64_t kUnorderedRank = uint64_t{1} << 62;

  explicit BasicObjectCache(uint64_t capacity_bytes);
  BasicObjectCache(const BasicObjectCache&) = delete;
  BasicObjectCache& operator=(const BasicObjectCache&) = delete;

  // Returns the objects for `keys`, in order: cached ones at once, ones another caller or a
  // prefetch is loading when that load finishes, and the rest through one call of `load` (so a
  // caller can pipeline them). Rethrows the exception of a failed load; nothing of it is cached,
  // so the next caller tries again. `outcome`, when given, receives how the objects were found.
  // `read_whole`: the caller reads every object it asks for to its end at once: cached and
  // loaded ones count as read (mark_consumed) in the same lock, and one loaded into a cache full
  // of predicted objects is served without being kept (it would only displace an object still
  // to be read). Objects it joined in flight are not marked.
  std::vector<ObjectBuffer> get_many(std::span<const Key> keys, const LoadMany& load,
                                     ReadOutcome* outcome = nullptr, bool read_whole = false);
  ObjectBuffer get(const Key& key, const std::function<ObjectBuffer()>& load);

  // The cached object, or nullptr; no loading, and it does not count as a hit or miss.
  ObjectBuffer peek(const Key& key) const;
  // Cached or being loaded.
  bool present(const Key& key) const;

  // Prefetch side. begin_prefetch reserves `size` bytes for `key`, to be used at `rank` (smaller
  // is sooner): room comes from free space, objects already read, or prefetched objects ranked
  // later than `rank`; never from objects being read, loaded, or needed sooner. Returns false,
  // changing nothing, when the key is cached or loading or there is no such room. After true,
  // exactly one of finish_prefetch / abandon_prefetch must follow.
  bool begin_prefetch(const Key& key, uint64_t size, uint64_t rank);
  // Stores the object (its size must be the reserved size) and hands it to joined readers.
  void finish_prefetch(const Key& key, ObjectBuffer buffer);
  // Releases the reservation; joined readers load the object themselves.
  void abandon_prefetch(const Key& key, const std::string& why);

  // A reader has read this object to its end: the first to go when room is needed (the last of
  // those while the disk tier is still to write it: ObjectData::awaiting_disk).
  void mark_consumed(const Key& key);
  // The cached object is predicted to be read at `rank`: it stays like a prefetch of that rank
  // (an object already read, or predicted later, is kept for this use). Returns it, or nullptr
  // (changing nothing) when it is not cached.
  ObjectBuffer promote(const Key& key, uint64_t rank);
  // A new epoch: objects read in the last one are as likely as any unread object to be read
  // again, so they stay, ranked kUnorderedRank.
  void new_epoch();

  CacheStats stats() const;
  uint64_t capacity_bytes() const { return capacity_bytes_; }

 private:
  // Eviction order: first objects already read (oldest first), then those of them the disk tier
  // still has to write (ObjectData::awaiting_disk when they were read: the tier would lose them),
  // then ones fetched on demand and not yet read to their end (least recently used first), then
  // prefetched ones, ranked latest first. A demand fetch is being read when it is stored, so it
  // is soon consumed.
  enum class Standing : uint8_t { kConsumed, kConsumedAwaitingDisk, kOther, kPredicted };
  // kConsumed, or kConsumedAwaitingDisk for an object the disk tier is still to write.
  static Standing consumed_standing(const ObjectBuffer& buffer);
  struct VictimOrder {
    Standing standing;
    uint64_t order;  // kConsumed*, kOther: last use (older first); kPredicted: ~rank
    uint64_t serial;
    auto operator<=>(const VictimOrder&) const = default;
  };
  struct Entry {
    ObjectBuffer buffer;
    VictimOrder victim;
    uint64_t rank = 0;
    bool prefetched = false;
    bool used = false;
  };
  struct Loading {
    std::shared_future<ObjectBuffer> future;
    std::shared_ptr<std::promise<ObjectBuffer>> prefetch_promise;  // set for prefetches
    uint64_t reserved = 0;
    uint64_t rank = 0;
    bool joined = false;
  };
  // kDemand may evict anything not being read; kReadOnce only what is read or unpredicted.
  enum class RoomFor : uint8_t { kPrefetch, kDemand, kReadOnce };

  void insert_locked(const Key& key, ObjectBuffer buffer, bool read_whole) DSFS_REQUIRES(mutex_);
  // Evicts until `size` more bytes fit; false (evicting nothing) when they cannot.
  bool make_room_locked(uint64_t size, RoomFor purpose, uint64_t rank) DSFS_REQUIRES(mutex_);
  void set_standing_locked(const Key& key, Entry& entry, Standing standing, uint64_t order)
      DSFS_REQUIRES(mutex_);
  void erase_entry_locked(typename std::unordered_map<Key, Entry, KeyHash>::iterator it)
      DSFS_REQUIRES(mutex_);
  void note_used_locked(Entry& entry) DSFS_REQUIRES(mutex_);

  const uint64_t capacity_bytes_;
  mutable Mutex mutex_;  // guards everything below
  std::unordered_map<Key, Entry, KeyHash> entries_ DSFS_GUARDED_BY(mutex_);
  // Serials are unique, so is each order.
  std::map<VictimOrder, Key> victims_ DSFS_GUARDED_BY(mutex_);
  std::unordered_map<Key, Loading, KeyHash> loading_ DSFS_GUARDED_BY(mutex_);
  uint64_t clock_ DSFS_GUARDED_BY(mutex_) = 0;  // use counter for LRU order and serials
  CacheStats stats_ DSFS_GUARDED_BY(mutex_);
};

// The cache of Redis objects. The view directory keeps its rendered files in a cache of the same
// kind keyed by its own type (fs/views.h); each key type is instantiated once (object_cache.cpp,
// fs/views.cpp) from the definitions in object_cache_impl.h.
using ObjectCache = BasicObjectCache<ObjectKey, ObjectKeyHash>;
extern template class BasicObjectCache<ObjectKey, ObjectKeyHash>;

}  // namespace dsfs::prefetch
