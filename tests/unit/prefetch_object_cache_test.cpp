// The object cache: byte bound, LRU order, single-flight loading and failure propagation.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <barrier>
#include <chrono>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "prefetch/object_cache.h"

namespace dsfs::prefetch {
namespace {

using namespace std::chrono_literals;

ObjectKey key(uint64_t id, uint32_t chunk = 0, uint32_t dataset = 0) {
  return ObjectKey{.dataset = dataset, .chunk = chunk, .generation = 1, .object_id = id};
}

ObjectBuffer object_of(size_t size, char fill) {
  return std::make_shared<const ObjectData>(std::string(size, fill));
}

// A loader that counts its calls and makes objects of `size` bytes filled with the id's digit.
struct CountingLoader {
  size_t size;
  std::atomic<int> calls{0};
  std::atomic<int> objects{0};
  ObjectCache::LoadMany many() {
    return [this](std::span<const ObjectKey> keys) {
      ++calls;
      std::vector<ObjectBuffer> out;
      for (const ObjectKey& k : keys) {
        ++objects;
        out.push_back(object_of(size, static_cast<char>('0' + k.object_id % 10)));
      }
      return out;
    };
  }
};

TEST(ObjectCache, HitsAfterTheFirstLoad) {
  ObjectCache cache(1000);
  CountingLoader loader{.size = 100};
  const ObjectKey k = key(7);
  const auto first = cache.get_many(std::span(&k, 1), loader.many());
  const auto second = cache.get_many(std::span(&k, 1), loader.many());
  EXPECT_EQ(loader.calls, 1);
  EXPECT_EQ(first[0], second[0]);  // the same shared buffer, not a copy
  EXPECT_EQ(first[0]->bytes(), std::string(100, '7'));
  const CacheStats stats = cache.stats();
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.bytes, 100u);
  EXPECT_EQ(stats.entries, 1u);
}

TEST(ObjectCache, DistinguishesDatasetChunkAndGeneration) {
  ObjectCache cache(10000);
  CountingLoader loader{.size = 10};
  const std::vector<ObjectKey> keys = {
      key(1, 0, 0), key(1, 1, 0), key(1, 0, 1),
      ObjectKey{.dataset = 0, .chunk = 0, .generation = 2, .object_id = 1}};
  cache.get_many(keys, loader.many());
  EXPECT_EQ(loader.objects, 4);
  EXPECT_EQ(cache.stats().entries, 4u);
}

TEST(ObjectCache, NeverHoldsMoreThanItsCapacity) {
  ObjectCache cache(1000);
  CountingLoader loader{.size = 300};
  for (uint64_t id = 0; id < 20; ++id) {
    const ObjectKey k = key(id);
    cache.get_many(std::span(&k, 1), loader.many());
    EXPECT_LE(cache.stats().bytes, 1000u);
  }
  const CacheStats stats = cache.stats();
  EXPECT_EQ(stats.entries, 3u);  // 3 x 300 fit, a fourth would not
  EXPECT_EQ(stats.bytes, 900u);
  EXPECT_EQ(stats.evictions, 17u);
}

TEST(ObjectCache, EvictsTheLeastRecentlyUsed) {
  ObjectCache cache(300);
  CountingLoader loader{.size = 100};
  auto get = [&](uint64_t id) {
    const ObjectKey k = key(id);
    return cache.get_many(std::span(&k, 1), loader.many());
  };
  get(1);
  get(2);
  get(3);
  get(1);  // 2 is now the least recently used
  get(4);
  EXPECT_NE(cache.peek(key(1)), nullptr);
  EXPECT_EQ(cache.peek(key(2)), nullptr);
  EXPECT_NE(cache.peek(key(3)), nullptr);
  EXPECT_NE(cache.peek(key(4)), nullptr);
}

TEST(ObjectCache, ServesButDoesNotKeepObjectsLargerThanTheCache) {
  ObjectCache cache(100);
  CountingLoader loader{.size = 500};
  const ObjectKey k = key(1);
  const auto got = cache.get_many(std::span(&k, 1), loader.many());
  EXPECT_EQ(got[0]->size(), 500u);
  EXPECT_EQ(cache.peek(k), nullptr);
  EXPECT_EQ(cache.stats().too_large, 1u);
  EXPECT_EQ(cache.stats().bytes, 0u);
}

// An object a reader still holds is being read: evicting it would free nothing, so the
// newcomer is served without being kept. Once the reader lets go, it can be evicted.
TEST(ObjectCache, ObjectsBeingReadAreNeverEvicted) {
  ObjectCache cache(100);
  CountingLoader loader{.size = 100};
  const ObjectKey a = key(1);
  const ObjectKey b = key(2);
  {
    const auto held = cache.get_many(std::span(&a, 1), loader.many());
    const auto served = cache.get_many(std::span(&b, 1), loader.many());
    EXPECT_EQ(served[0]->bytes(), std::string(100, '2'));
    EXPECT_NE(cache.peek(a), nullptr);
    EXPECT_EQ(cache.peek(b), nullptr);
    EXPECT_EQ(cache.stats().not_kept, 1u);
    EXPECT_EQ(held[0]->bytes(), std::string(100, '1'));
  }
  cache.get_many(std::span(&b, 1), loader.many());  // a is no longer read: it goes
  EXPECT_EQ(cache.peek(a), nullptr);
  EXPECT_NE(cache.peek(b), nullptr);
  EXPECT_LE(cache.stats().bytes, 100u);
}

TEST(ObjectCache, LoadsOnlyTheMissingKeysInOneCall) {
  ObjectCache cache(10000);
  CountingLoader loader{.size = 10};
  const std::vector<ObjectKey> first = {key(1), key(2)};
  cache.get_many(first, loader.many());
  std::vector<ObjectKey> seen;
  const std::vector<ObjectKey> second = {key(1), key(3), key(2), key(4)};
  const auto got = cache.get_many(second, [&](std::span<const ObjectKey> keys) {
    seen.assign(keys.begin(), keys.end());
    std::vector<ObjectBuffer> out;
    out.resize(keys.size(), object_of(10, 'x'));
    return out;
  });
  EXPECT_EQ(seen, (std::vector<ObjectKey>{key(3), key(4)}));
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0]->bytes(), std::string(10, '1'));
  EXPECT_EQ(got[1]->bytes(), std::string(10, 'x'));
  EXPECT_EQ(got[2]->bytes(), std::string(10, '2'));
}

TEST(ObjectCache, ConcurrentMissesOfOneObjectLoadItOnce) {
  ObjectCache cache(1 << 20);
  constexpr int kThreads = 16;
  std::atomic<int> loads{0};
  std::atomic<bool> release{false};
  std::barrier start(kThreads);
  std::vector<ObjectBuffer> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      results[t] = cache.get(key(42), [&] {
        ++loads;
        // Hold the load open until every other thread has had the chance to ask too.
        while (!release) std::this_thread::sleep_for(1ms);
        return object_of(1000, 'z');
      });
    });
  }
  // The load is held open, so every other thread must join it; a second load is a failure.
  // (The deadline only keeps a broken cache from hanging the test.)
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!(loads == 1 && cache.stats().joined == kThreads - 1) && loads <= 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  release = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(loads, 1);
  for (const ObjectBuffer& r : results) EXPECT_EQ(r, results[0]);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().joined, static_cast<uint64_t>(kThreads - 1));
}

TEST(ObjectCache, AFailedLoadReachesEveryWaiterAndIsRetriedByTheNextCaller) {
  ObjectCache cache(1 << 20);
  constexpr int kThreads = 8;
  std::atomic<int> loads{0};
  std::atomic<bool> release{false};
  std::atomic<int> failures{0};
  std::barrier start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      try {
        cache.get(key(5), [&]() -> ObjectBuffer {
          ++loads;
          while (!release) std::this_thread::sleep_for(1ms);
          throw std::runtime_error("redis is down");
        });
      } catch (const std::runtime_error& e) {
        EXPECT_STREQ(e.what(), "redis is down");
        ++failures;
      }
    });
  }
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (cache.stats().joined + 1 < kThreads && loads <= 1 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  release = true;
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(loads, 1);
  EXPECT_EQ(failures, kThreads);
  EXPECT_EQ(cache.peek(key(5)), nullptr);

  const ObjectBuffer retried = cache.get(key(5), [&] {
    ++loads;
    return object_of(3, 'k');
  });
  EXPECT_EQ(loads, 2);
  EXPECT_EQ(retried->bytes(), "kkk");
  EXPECT_EQ(cache.peek(key(5)), retried);
}

TEST(ObjectCache, RejectsALoaderThatReturnsTheWrongNumberOfObjects) {
  ObjectCache cache(1000);
  const std::vector<ObjectKey> keys = {key(1), key(2)};
  EXPECT_THROW(cache.get_many(keys,
                              [](std::span<const ObjectKey>) {
                                return std::vector<ObjectBuffer>{object_of(1, 'a')};
                              }),
               std::logic_error);
  // Nothing is left half-loaded: both keys load normally afterwards.
  CountingLoader loader{.size = 1};
  cache.get_many(keys, loader.many());
  EXPECT_EQ(loader.objects, 2);
}

TEST(ObjectCache, RandomizedConcurrentUseKeepsTheBoundAndTheContents) {
  constexpr uint64_t kCapacity = 64 * 1024;
  ObjectCache cache(kCapacity);
  constexpr int kThreads = 8;
  constexpr int kIterations = 2000;
  std::atomic<int> wrong{0};
  std::atomic<int> over_capacity{0};
  std::atomic<int> thrown{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 random(1234 + t);
      for (int i = 0; i < kIterations; ++i) {
        std::vector<ObjectKey> keys;
        const int count = 1 + static_cast<int>(random() % 4);
        for (int k = 0; k < count; ++k) keys.push_back(key(random() % 64, random() % 2));
        const bool fail = random() % 50 == 0;
        try {
          const auto got = cache.get_many(keys, [&](std::span<const ObjectKey> missing) {
            if (fail) throw std::runtime_error("injected");
            std::vector<ObjectBuffer> out;
            for (const ObjectKey& k : missing) {
              // Size and fill are functions of the key, so any holder can check the bytes.
              const size_t size = 512 + (k.object_id * 97 + k.chunk * 31) % 4096;
              out.push_back(object_of(size, static_cast<char>('A' + k.object_id % 26)));
            }
            return out;
          });
          for (size_t j = 0; j < keys.size(); ++j) {
            const size_t size = 512 + (keys[j].object_id * 97 + keys[j].chunk * 31) % 4096;
            if (got[j]->bytes() !=
                std::string(size, static_cast<char>('A' + keys[j].object_id % 26))) {
              ++wrong;
            }
          }
        } catch (const std::runtime_error&) {
          ++thrown;
        }
        if (cache.stats().bytes > kCapacity) ++over_capacity;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(over_capacity, 0);
  EXPECT_GT(thrown, 0);  // the injected failures did happen and were survived
  const CacheStats stats = cache.stats();
  EXPECT_LE(stats.bytes, kCapacity);
  EXPECT_GT(stats.evictions, 0u);
  EXPECT_GT(stats.hits, 0u);
}

// --- prefetching: reservations, eviction order, joins ---

TEST(ObjectCachePrefetch, ReservationsCountAgainstTheBound) {
  ObjectCache cache(300);
  EXPECT_TRUE(cache.begin_prefetch(key(1), 100, 10));
  EXPECT_TRUE(cache.begin_prefetch(key(2), 100, 11));
  EXPECT_TRUE(cache.begin_prefetch(key(3), 100, 12));
  EXPECT_FALSE(cache.begin_prefetch(key(4), 100, 13));  // full of reservations
  EXPECT_FALSE(cache.begin_prefetch(key(1), 100, 10));  // already in flight
  CacheStats stats = cache.stats();
  EXPECT_EQ(stats.reserved_bytes, 300u);
  EXPECT_EQ(stats.prefetch_inflight, 3u);
  cache.finish_prefetch(key(1), object_of(100, '1'));
  cache.abandon_prefetch(key(2), "test");
  stats = cache.stats();
  EXPECT_EQ(stats.reserved_bytes, 100u);
  EXPECT_EQ(stats.bytes, 100u);
  EXPECT_EQ(stats.prefetch_inflight, 1u);
  EXPECT_EQ(stats.prefetched_bytes, 100u);
  EXPECT_NE(cache.peek(key(1)), nullptr);
  EXPECT_FALSE(cache.present(key(2)));
}

TEST(ObjectCachePrefetch, APrefetchEvictsWhatWasReadThenWhatIsNeededLatest) {
  ObjectCache cache(300);
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(cache.begin_prefetch(key(id), 100, 100 + id));
    cache.finish_prefetch(key(id), object_of(100, char('0' + id)));
  }
  // Nothing read, and the newcomer is needed later than all: no room for it.
  EXPECT_FALSE(cache.begin_prefetch(key(9), 100, 200));
  EXPECT_EQ(cache.stats().evictions, 0u);
  // Needed sooner than key 3 (rank 103): key 3 goes.
  EXPECT_TRUE(cache.begin_prefetch(key(4), 100, 102));
  EXPECT_EQ(cache.peek(key(3)), nullptr);
  cache.finish_prefetch(key(4), object_of(100, '4'));
  // Once key 2 is read to its end, it goes first, even for a newcomer needed latest.
  cache.mark_consumed(key(2));
  EXPECT_TRUE(cache.begin_prefetch(key(5), 100, 500));
  EXPECT_EQ(cache.peek(key(2)), nullptr);
  EXPECT_NE(cache.peek(key(1)), nullptr);
  EXPECT_NE(cache.peek(key(4)), nullptr);
  cache.abandon_prefetch(key(5), "test");
  const CacheStats stats = cache.stats();
  EXPECT_EQ(stats.wasted_bytes, 100u);  // key 3, never read
  EXPECT_EQ(stats.used_bytes, 100u);    // key 2
}

TEST(ObjectCachePrefetch, ReadObjectsTheDiskTierStillHasToWriteGoLast) {
  // Three objects prefetched and read in turn; the disk tier deferred writing the first (the
  // oldest read, which would otherwise go first).
  ObjectCache cache(300);
  std::vector<ObjectBuffer> objects;
  for (uint64_t id = 1; id <= 3; ++id) {
    objects.push_back(object_of(100, char('0' + id)));
    ASSERT_TRUE(cache.begin_prefetch(key(id), 100, id));
    cache.finish_prefetch(key(id), objects.back());
  }
  objects[0]->set_awaiting_disk(true);
  for (uint64_t id = 1; id <= 3; ++id) cache.mark_consumed(key(id));
  objects.clear();  // the cache's references only: all may go
  // Room for one more: key 2, read after key 1, goes in its place.
  ASSERT_TRUE(cache.begin_prefetch(key(4), 100, 4));
  cache.finish_prefetch(key(4), object_of(100, '4'));
  EXPECT_NE(cache.peek(key(1)), nullptr);
  EXPECT_EQ(cache.peek(key(2)), nullptr);
  // Kept longer, not for ever: once the other read objects are gone, it goes too, for a
  // prefetch as for a demand load.
  ASSERT_TRUE(cache.begin_prefetch(key(5), 100, 5));
  EXPECT_EQ(cache.peek(key(3)), nullptr);
  EXPECT_NE(cache.peek(key(1)), nullptr);
  cache.mark_consumed(key(4));
  ASSERT_TRUE(cache.begin_prefetch(key(6), 100, 6));
  EXPECT_EQ(cache.peek(key(4)), nullptr);
  EXPECT_NE(cache.peek(key(1)), nullptr);
  ASSERT_TRUE(cache.begin_prefetch(key(7), 100, 7));
  EXPECT_EQ(cache.peek(key(1)), nullptr);
  EXPECT_EQ(cache.stats().evictions, 4u);
}

TEST(ObjectCachePrefetch, ANewEpochKeepsObjectsTheDiskTierStillHasToWriteAsGuesses) {
  ObjectCache cache(200);
  CountingLoader loader{.size = 100};
  cache.get_many(std::vector<ObjectKey>{key(1)}, loader.many(), nullptr, /*read_whole=*/true);
  const ObjectBuffer kept = cache.peek(key(1));
  kept->set_awaiting_disk(true);
  cache.mark_consumed(key(1));
  cache.new_epoch();
  // A guess now, ranked with every unread file: a read-once miss may not displace it.
  cache.get_many(std::vector<ObjectKey>{key(2)}, loader.many(), nullptr, /*read_whole=*/true);
  cache.get_many(std::vector<ObjectKey>{key(3)}, loader.many(), nullptr, /*read_whole=*/true);
  EXPECT_NE(cache.peek(key(1)), nullptr);
}

TEST(ObjectCachePrefetch, UnorderedGuessesNeverEvictOneAnother) {
  ObjectCache cache(200);
  ASSERT_TRUE(cache.begin_prefetch(key(1), 100, ObjectCache::kUnorderedRank));
  cache.finish_prefetch(key(1), object_of(100, '1'));
  ASSERT_TRUE(cache.begin_prefetch(key(2), 100, ObjectCache::kUnorderedRank));
  cache.finish_prefetch(key(2), object_of(100, '2'));
  EXPECT_FALSE(cache.begin_prefetch(key(3), 100, ObjectCache::kUnorderedRank));
  // An ordered prediction is sooner than any unordered guess.
  EXPECT_TRUE(cache.begin_prefetch(key(3), 100, 5));
  cache.abandon_prefetch(key(3), "test");
}

TEST(ObjectCachePrefetch, ANewEpochKeepsLastEpochsObjectsAsGuesses) {
  ObjectCache cache(200);
  CountingLoader loader{.size = 100};
  for (uint64_t id = 1; id <= 2; ++id) {
    const ObjectKey k = key(id);
    cache.get_many(std::span(&k, 1), loader.many());
    cache.mark_consumed(k);
  }
  cache.new_epoch();
  // Read last epoch, unread in this one: as good as any unordered guess, so not displaced by one.
  EXPECT_FALSE(cache.begin_prefetch(key(3), 100, ObjectCache::kUnorderedRank));
  EXPECT_TRUE(cache.begin_prefetch(key(3), 100, 7));
  cache.finish_prefetch(key(3), object_of(100, '3'));
  EXPECT_EQ(cache.stats().entries, 2u);
}

// The search for room stops where nothing further may go: a cache full of predictions (a steady
// epoch of a dataset larger than the cache) answered every read-once miss by walking all of
// them under the lock, half the daemon's CPU with 5,000 objects held. Checked on the count of
// objects the searches looked at, not on time.
TEST(ObjectCachePrefetch, SearchesForRoomDoNotWalkObjectsThatMayNotGo) {
  constexpr uint64_t kHeld = 1000, kMisses = 200;
  ObjectCache cache(kHeld * 100);
  for (uint64_t id = 0; id < kHeld; ++id) {
    ASSERT_TRUE(cache.begin_prefetch(key(id), 100, ObjectCache::kUnorderedRank));
    cache.finish_prefetch(key(id), object_of(100, 'p'));
  }
  CountingLoader loader{.size = 100};
  for (uint64_t id = kHeld; id < kHeld + kMisses; ++id) {
    const ObjectKey miss = key(id);
    cache.get_many(std::span(&miss, 1), loader.many(), nullptr, /*read_whole=*/true);
  }
  EXPECT_EQ(cache.stats().not_kept, kMisses);
  EXPECT_EQ(cache.stats().entries, kHeld);
  EXPECT_LE(cache.stats().victims_examined, kMisses);

  // Objects read in pieces (kept, not consumed) may not go for a prefetch: a prefetch that finds
  // only those skips them all at once.
  ObjectCache pieces(kHeld * 100);
  for (uint64_t id = 0; id < kHeld; ++id) {
    const ObjectKey k = key(id);
    pieces.get_many(std::span(&k, 1), loader.many(), nullptr, /*read_whole=*/false);
  }
  ASSERT_EQ(pieces.stats().entries, kHeld);
  const uint64_t before = pieces.stats().victims_examined;
  for (uint64_t id = kHeld; id < kHeld + kMisses; ++id) {
    EXPECT_FALSE(pieces.begin_prefetch(key(id), 100, 5));
  }
  EXPECT_LE(pieces.stats().victims_examined - before, kMisses);
}

// A miss read whole at once (the usual image) is consumed as soon as it is served: keeping it
// by evicting a prefetched object still to be read would turn that object's read into a miss.
TEST(ObjectCachePrefetch, AMissReadWholeNeverDisplacesAPrefetchedObject) {
  ObjectCache cache(200);
  for (uint64_t id = 1; id <= 2; ++id) {
    ASSERT_TRUE(cache.begin_prefetch(key(id), 100, ObjectCache::kUnorderedRank));
    cache.finish_prefetch(key(id), object_of(100, char('0' + id)));
  }
  CountingLoader loader{.size = 100};
  const ObjectKey miss = key(3);
  const auto served = cache.get_many(std::span(&miss, 1), loader.many(), nullptr, true);
  EXPECT_EQ(served[0]->bytes(), std::string(100, '3'));
  EXPECT_EQ(cache.peek(miss), nullptr);
  EXPECT_NE(cache.peek(key(1)), nullptr);
  EXPECT_NE(cache.peek(key(2)), nullptr);
  EXPECT_EQ(cache.stats().not_kept, 1u);
  // Read in pieces (not whole), it is kept: its next piece would otherwise be fetched again.
  const ObjectKey piecewise = key(4);
  cache.get_many(std::span(&piecewise, 1), loader.many(), nullptr, false);
  EXPECT_NE(cache.peek(piecewise), nullptr);
  EXPECT_EQ(cache.stats().entries, 2u);
}

// An object read last epoch that this epoch's plan names again is kept for that use: without
// promote() it stayed "read" and was the first to go for the plan's later objects.
TEST(ObjectCachePrefetch, APromotedObjectIsKeptForItsPredictedUse) {
  ObjectCache cache(200);
  CountingLoader loader{.size = 100};
  for (uint64_t id = 1; id <= 2; ++id) {
    const ObjectKey k = key(id);
    cache.get_many(std::span(&k, 1), loader.many());
    cache.mark_consumed(k);
  }
  cache.promote(key(1), 10);                           // the plan reads key 1 soon
  EXPECT_TRUE(cache.begin_prefetch(key(3), 100, 20));  // key 2 (read, not named) goes
  EXPECT_NE(cache.peek(key(1)), nullptr);
  EXPECT_EQ(cache.peek(key(2)), nullptr);
  EXPECT_FALSE(cache.begin_prefetch(key(4), 100, 30));  // later than both: no room
  cache.finish_prefetch(key(3), object_of(100, '3'));
  cache.promote(key(9), 1);  // not cached: nothing happens
  EXPECT_EQ(cache.stats().entries, 2u);
}

// True once a reader has joined a load in flight (stats().joined), false after `limit`.
bool joined_within(ObjectCache& cache, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (cache.stats().joined == 0) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

TEST(ObjectCachePrefetch, ReadersJoinAPrefetchInFlight) {
  ObjectCache cache(1000);
  ASSERT_TRUE(cache.begin_prefetch(key(1), 100, 1));
  CountingLoader loader{.size = 100};
  ReadOutcome outcome = ReadOutcome::kReady;
  std::thread reader([&] {
    const ObjectKey k = key(1);
    const auto got = cache.get_many(std::span(&k, 1), loader.many(), &outcome);
    EXPECT_EQ(got[0]->bytes(), std::string(100, 'p'));
  });
  // Bounded: a reader that never joins fails here, and the prefetch is ended anyway so that
  // the reader (if it is waiting elsewhere) is released and the test does not hang.
  EXPECT_TRUE(joined_within(cache, 20s)) << "the reader never joined the prefetch";
  cache.finish_prefetch(key(1), object_of(100, 'p'));
  reader.join();
  EXPECT_EQ(outcome, ReadOutcome::kJoined);
  EXPECT_EQ(loader.calls, 0);  // fetched once, by the prefetch
  EXPECT_EQ(cache.stats().used_bytes, 100u);
}

TEST(ObjectCachePrefetch, ReadersOfAnAbandonedPrefetchLoadItThemselves) {
  ObjectCache cache(1000);
  ASSERT_TRUE(cache.begin_prefetch(key(1), 100, 1));
  CountingLoader loader{.size = 100};
  ReadOutcome outcome = ReadOutcome::kReady;
  std::thread reader([&] {
    const ObjectKey k = key(1);
    const auto got = cache.get_many(std::span(&k, 1), loader.many(), &outcome);
    EXPECT_EQ(got[0]->bytes(), std::string(100, '1'));
  });
  // Bounded: a reader that never joins fails here, and the prefetch is ended anyway so that
  // the reader (if it is waiting elsewhere) is released and the test does not hang.
  EXPECT_TRUE(joined_within(cache, 20s)) << "the reader never joined the prefetch";
  cache.abandon_prefetch(key(1), "Redis went away");
  reader.join();
  EXPECT_EQ(outcome, ReadOutcome::kMiss);
  EXPECT_EQ(loader.calls, 1);
  EXPECT_EQ(cache.stats().reserved_bytes, 0u);
}

TEST(ObjectCachePrefetch, ADemandLoadDoesNotFetchWhatIsAlreadyInFlight) {
  ObjectCache cache(1000);
  CountingLoader loader{.size = 100};
  const ObjectKey k = key(1);
  cache.get_many(std::span(&k, 1), loader.many());
  EXPECT_FALSE(cache.begin_prefetch(k, 100, 1));  // cached
  EXPECT_TRUE(cache.present(k));
}

// Readers, prefetches (finished or abandoned), consumption marks and epochs all at once: cached
// plus reserved bytes never exceed the bound, every object read has the right bytes, each key is
// loaded by at most one caller at a time, and an object evicted and read again is right.
TEST(ObjectCachePrefetch, RandomizedConcurrentPrefetchAndReadsKeepTheBound) {
  constexpr uint64_t kCapacity = 48 * 1024;
  constexpr uint64_t kKeys = 96;
  ObjectCache cache(kCapacity);
  const auto size_of = [](const ObjectKey& k) { return 256 + (k.object_id * 131) % 3000; };
  const auto bytes_of = [&](const ObjectKey& k) {
    return std::string(size_of(k), static_cast<char>('a' + k.object_id % 26));
  };
  std::array<std::atomic<int>, kKeys> loading_now{};
  std::atomic<int> wrong{0}, over{0}, doubled{0}, reads{0};
  std::atomic<bool> done{false};
  const auto check_bound = [&] {
    const CacheStats s = cache.stats();
    if (s.bytes + s.reserved_bytes > kCapacity) ++over;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {  // readers
    threads.emplace_back([&, t] {
      std::mt19937_64 random(77 + t);
      for (int i = 0; i < 3000; ++i) {
        const ObjectKey k = key(random() % kKeys);
        const auto got = cache.get_many(std::span(&k, 1), [&](std::span<const ObjectKey> miss) {
          std::vector<ObjectBuffer> out;
          for (const ObjectKey& m : miss) {
            if (loading_now[m.object_id].fetch_add(1) != 0) ++doubled;
            out.push_back(std::make_shared<const ObjectData>(bytes_of(m)));
            loading_now[m.object_id].fetch_sub(1);
          }
          return out;
        });
        if (got[0]->bytes() != bytes_of(k)) ++wrong;
        ++reads;
        if (random() % 2) cache.mark_consumed(k);
        if (random() % 500 == 0) cache.new_epoch();
        check_bound();
      }
    });
  }
  for (int t = 0; t < 2; ++t) {  // prefetchers
    threads.emplace_back([&, t] {
      std::mt19937_64 random(991 + t);
      while (!done) {
        const ObjectKey k = key(random() % kKeys);
        const uint64_t rank = random() % 4 == 0 ? ObjectCache::kUnorderedRank : random() % 1000;
        if (!cache.begin_prefetch(k, size_of(k), rank)) continue;
        if (loading_now[k.object_id].fetch_add(1) != 0) ++doubled;
        check_bound();
        if (random() % 8 == 0) {
          loading_now[k.object_id].fetch_sub(1);
          cache.abandon_prefetch(k, "injected");
        } else {
          auto buffer = std::make_shared<const ObjectData>(bytes_of(k));
          loading_now[k.object_id].fetch_sub(1);
          cache.finish_prefetch(k, std::move(buffer));
        }
        check_bound();
      }
    });
  }
  for (int t = 0; t < 4; ++t) threads[t].join();
  done = true;
  for (size_t t = 4; t < threads.size(); ++t) threads[t].join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(over, 0);
  EXPECT_EQ(doubled, 0);
  const CacheStats s = cache.stats();
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.prefetch_inflight, 0u);
  EXPECT_GT(s.prefetches, 0u);
  EXPECT_GT(s.evictions, 0u);
  EXPECT_GT(s.joined + s.hits, 0u);
  EXPECT_LE(s.used_bytes + s.wasted_bytes, s.prefetched_bytes);
}

}  // namespace
}  // namespace dsfs::prefetch
