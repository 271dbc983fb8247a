// The object cache: byte bound, LRU order, single-flight loading and failure propagation.
#include <gtest/gtest.h>

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

TEST(ObjectCache, EvictedBuffersStayValidForTheirHolders) {
  ObjectCache cache(100);
  CountingLoader loader{.size = 100};
  const ObjectKey a = key(1);
  const ObjectKey b = key(2);
  const auto held = cache.get_many(std::span(&a, 1), loader.many());
  cache.get_many(std::span(&b, 1), loader.many());  // evicts a
  EXPECT_EQ(cache.peek(a), nullptr);
  EXPECT_EQ(held[0]->bytes(), std::string(100, '1'));
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

}  // namespace
}  // namespace dsfs::prefetch
