// The read path below FUSE: FileReader over a real ObjectFetcher and a real redis-server
// (--verify on files larger than the cache, chunks corrupted after the first check, chunk numbers
// beyond 32 bits), and the object cache's single-flight bookkeeping when memory runs out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <chrono>
#include <cstdlib>
#include <future>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "prefetch/file_reader.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/connection.h"
#include "src/store/pool.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"

// Allocation failure on demand: while positive, counts down allocations on this thread and
// throws std::bad_alloc from the one that brings it to zero.
namespace {
thread_local int fail_allocation_in = 0;
}  // namespace

// GCC at -O2 cannot see that this malloc-backed new pairs with the free-backed deletes below.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  if (fail_allocation_in > 0 && --fail_allocation_in == 0) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}

namespace dsfs::prefetch {
namespace {

using namespace std::chrono_literals;

constexpr const char* kName = "rv";
constexpr uint64_t kGeneration = 3;

// One dataset with one file, `path`, of `size` bytes stored in chunks of `chunk_size`.
DatasetSnapshot snapshot_of(uint64_t chunk_size, uint64_t size, uint64_t checksum) {
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, chunk_size);
  builder.add_file("f.bin", size, 0, 0644, /*object_id=*/1, catalog::kNoLabel, checksum, "");
  DatasetSnapshot d;
  d.info.name = kName;
  d.info.generation = kGeneration;
  d.info.chunk_size = chunk_size;
  d.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
  return d;
}

uint32_t file_entry(const DatasetSnapshot& d) {
  return *d.catalog->lookup(catalog::kRootIndex, "f.bin");
}

std::string bytes_of(const std::vector<Slice>& slices) {
  std::string out;
  for (const Slice& s : slices) out.append(s.buffer->bytes().substr(s.offset, s.length));
  return out;
}

class FileReaderReview : public ::testing::Test {
 protected:
  void set(uint64_t chunk, uint64_t chunk_count, std::string_view value) {
    const catalog::KeySchema keys("dsfs");
    const std::string key = chunk_count == 1 ? keys.object(kName, kGeneration, 1)
                                             : keys.object_chunk(kName, kGeneration, 1, chunk);
    store::Connection conn(redis_.endpoint());
    conn.command({"SET", key, value}).expect_ok("SET");
  }

  test::TestRedisServer redis_;
  store::Client client_{{redis_.endpoint()}, store::ClientOptions{.connections_per_node = 2}};
  ObjectFetcher fetcher_{client_, catalog::KeySchema("dsfs"), FetcherOptions{.timeout = 2s}};
};

// --verify on a file larger than the cache used to fetch the whole file again on every cache
// miss (each load re-inserted every chunk, evicting the ones read next): reading it once cost
// chunks^2 GETs, and the whole file was held in memory per read.
TEST_F(FileReaderReview, VerifyReadsAFileLargerThanTheCacheInLinearGets) {
  constexpr uint64_t kChunk = 4096;
  constexpr uint64_t kChunks = 16;
  const std::string content = test::pattern_bytes(kChunk * kChunks - 100, 11);
  for (uint64_t k = 0; k < kChunks; ++k) {
    set(k, kChunks, std::string_view(content).substr(k * kChunk, kChunk));
  }
  const DatasetSnapshot d =
      snapshot_of(kChunk, content.size(), XXH64(content.data(), content.size(), 0));
  ObjectCache cache(2 * kChunk);  // two chunks of a sixteen-chunk file
  FileReader reader(cache, fetcher_, /*verify=*/true);

  std::string read;
  for (uint64_t offset = 0; offset < content.size(); offset += 1000) {
    read += bytes_of(reader.read(d, file_entry(d), offset, 1000));
  }
  EXPECT_EQ(read, content);
  // One whole verified fetch, then each chunk at most once more (reads stay in order).
  EXPECT_LE(fetcher_.stats().gets.load(), 2 * kChunks);
}

// The per-chunk shortcut must not weaken --verify: a chunk changed after the file was verified
// is still refused when it is fetched again.
TEST_F(FileReaderReview, VerifyStillCatchesAChunkCorruptedAfterTheFirstCheck) {
  constexpr uint64_t kChunk = 4096;
  constexpr uint64_t kChunks = 4;
  const std::string content = test::pattern_bytes(kChunk * kChunks, 12);
  for (uint64_t k = 0; k < kChunks; ++k) {
    set(k, kChunks, std::string_view(content).substr(k * kChunk, kChunk));
  }
  const DatasetSnapshot d =
      snapshot_of(kChunk, content.size(), XXH64(content.data(), content.size(), 0));
  ObjectCache cache(kChunk);  // one chunk: the others are fetched again
  FileReader reader(cache, fetcher_, /*verify=*/true);
  ASSERT_EQ(bytes_of(reader.read(d, file_entry(d), 0, content.size())), content);

  set(2, kChunks, std::string(kChunk, 'x'));  // same length, other bytes
  // Chunk 0 is intact (it matches what was verified); chunk 2 is not.
  EXPECT_EQ(bytes_of(reader.read(d, file_entry(d), 0, 10)), content.substr(0, 10));
  EXPECT_THROW(reader.read(d, file_entry(d), 2 * kChunk + 5, 10), IntegrityError);
  EXPECT_EQ(fetcher_.stats().checksum_mismatches.load(), 1u);
}

// Chunk numbers were truncated to 32 bits: with more than 2^32 chunks (1-byte chunks are
// allowed), a read beyond chunk 2^32 looked up chunk (n mod 2^32) and returned nothing, a silent
// end of file in the middle of the file. It must return the right bytes or fail.
TEST_F(FileReaderReview, NeverServesAnotherChunkWhenChunkNumbersExceed32Bits) {
  constexpr uint64_t kWrapped = (uint64_t{1} << 32) + 3;
  set(3, 2, "A");         // what the truncated chunk number names
  set(kWrapped, 2, "B");  // the chunk the read needs
  const DatasetSnapshot d = snapshot_of(/*chunk_size=*/1, kWrapped + 5, /*checksum=*/0);
  ObjectCache cache(1 << 20);
  FileReader reader(cache, fetcher_, /*verify=*/false);
  // Such a file is refused with this error, and only this one: no other exception (a lookup
  // of the wrong chunk failing some other way) may pass for it.
  EXPECT_THAT([&] { reader.read(d, file_entry(d), kWrapped, 1); },
              testing::ThrowsMessage<std::runtime_error>(
                  testing::HasSubstr("has 4294967304 chunks; dsfs reads at most 2^32 per file")));
  EXPECT_EQ(fetcher_.stats().gets.load(), 0u);  // and chunk 3 ("A") was never fetched
}

// Running out of memory inside get_many (registering the keys, or caching what was loaded) used
// to leave some keys registered as loading with a promise nobody would keep: every later read of
// those objects failed with std::future_error (broken promise) until remount. Whatever
// allocation fails, the next call must load and return the objects.
TEST(ObjectCacheReview, AnAllocationFailureInGetManyNeverStrandsAKey) {
  const std::vector<ObjectKey> keys = {
      ObjectKey{.dataset = 0, .chunk = 0, .generation = 1, .object_id = 1},
      ObjectKey{.dataset = 0, .chunk = 1, .generation = 1, .object_id = 1},
      ObjectKey{.dataset = 0, .chunk = 0, .generation = 1, .object_id = 2},
  };
  const auto build = [](std::span<const ObjectKey> missing) {
    std::vector<ObjectBuffer> out;
    for (const ObjectKey& k : missing) {
      out.push_back(std::make_shared<const ObjectData>(std::string(10, char('a' + k.object_id))));
    }
    return out;
  };
  bool reached_the_end = false;
  for (int n = 1; n < 500 && !reached_the_end; ++n) {
    ObjectCache cache(1 << 20);
    const ObjectKey warm = keys[1];  // one hit, so every path of get_many runs
    cache.get_many(std::span(&warm, 1), build);
    // Fails the n-th allocation of get_many after the loader has run (the loader's own failures
    // are ordinary load failures, tested elsewhere).
    const ObjectCache::LoadMany arm_after_load = [&](std::span<const ObjectKey> missing) {
      auto out = build(missing);
      fail_allocation_in = n;
      return out;
    };
    fail_allocation_in = 0;
    try {
      cache.get_many(keys, arm_after_load);
    } catch (const std::bad_alloc&) {
    }
    reached_the_end = fail_allocation_in > 0;  // fewer than n allocations: none failed
    fail_allocation_in = 0;
    try {
      const std::vector<ObjectBuffer> again = cache.get_many(keys, build);
      ASSERT_EQ(again.size(), keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        EXPECT_EQ(again[i]->bytes(), std::string(10, char('a' + keys[i].object_id))) << n;
      }
    } catch (const std::future_error& e) {
      FAIL() << "allocation " << n << " after the load stranded a key: " << e.what();
    }
  }
  EXPECT_TRUE(reached_the_end);
}

// The same for allocations made while registering the keys, before any loading.
TEST(ObjectCacheReview, AnAllocationFailureWhileRegisteringNeverStrandsAKey) {
  std::vector<ObjectKey> keys;
  for (uint64_t id = 1; id <= 40; ++id) {
    keys.push_back(ObjectKey{.dataset = 0, .chunk = 0, .generation = 1, .object_id = id});
  }
  const auto build = [](std::span<const ObjectKey> missing) {
    std::vector<ObjectBuffer> out;
    for (size_t i = 0; i < missing.size(); ++i) {
      out.push_back(std::make_shared<const ObjectData>(std::string(3, 'z')));
    }
    return out;
  };
  bool reached_the_end = false;
  for (int n = 1; n < 2000 && !reached_the_end; ++n) {
    ObjectCache cache(1 << 20);
    fail_allocation_in = n;
    try {
      cache.get_many(keys, build);
    } catch (const std::bad_alloc&) {
    }
    reached_the_end = fail_allocation_in > 0;
    fail_allocation_in = 0;
    try {
      EXPECT_EQ(cache.get_many(keys, build).size(), keys.size());
    } catch (const std::future_error& e) {
      FAIL() << "allocation " << n << " stranded a key: " << e.what();
    }
  }
  EXPECT_TRUE(reached_the_end);
}

}  // namespace
}  // namespace dsfs::prefetch
