#include "src/store/value_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace dsfs::store {
namespace {

// Whether every page wholly inside [begin, begin + size) is resident.
bool all_pages_resident(const char* begin, size_t size) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(begin) + size) & ~(page - 1);
  std::vector<unsigned char> resident((end - first) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(first), end - first, resident.data()), 0);
  for (const unsigned char r : resident) {
    if ((r & 1) == 0) return false;
  }
  return true;
}

bool kernel_populates_on_advice() {
  void* probe = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return false;
  const bool supported = madvise(probe, 4096, MADV_POPULATE_WRITE) == 0;
  munmap(probe, 4096);
  return supported;
}

TEST(ValueBuffer, ALargeBufferIsMappedBeforeItsFirstWrite) {
  if (!kernel_populates_on_advice()) GTEST_SKIP() << "no MADV_POPULATE_WRITE (Linux < 5.14)";
  // 8 MiB: above glibc's mmap threshold in this process, so the memory is fresh, never touched.
  constexpr size_t kBytes = size_t{8} << 20;
  const ValueBuffer buffer = new_value_buffer(kBytes);
  ASSERT_NE(buffer, nullptr);
  EXPECT_TRUE(all_pages_resident(buffer.get(), kBytes))
      << "fresh pages would fault one by one as the socket or the file fills them";
  buffer[0] = 'a';  // and it is ordinary writable memory
  buffer[kBytes - 1] = 'z';
  EXPECT_EQ(buffer[kBytes - 1], 'z');
}

TEST(ValueBuffer, EmptyAndSmallBuffersAreGiven) {
  EXPECT_NE(new_value_buffer(0), nullptr);
  const ValueBuffer small = new_value_buffer(100);
  small[99] = 'x';
  EXPECT_EQ(small[99], 'x');
}

TEST(ValueBuffer, AnAlignedBufferIsAlignedForDirectIoAndPreFaulted) {
  for (const size_t bytes :
       {size_t{0}, size_t{1}, size_t{4096}, size_t{100'000}, size_t{8} << 20}) {
    const AlignedValueBuffer buffer = new_aligned_value_buffer(bytes);
    ASSERT_NE(buffer, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer.get()) % kDirectIoBlock, 0u) << bytes << " bytes";
    if (bytes > 0) {
      buffer.get()[bytes - 1] = 'z';
      EXPECT_EQ(buffer.get()[bytes - 1], 'z');
    }
  }
  if (!kernel_populates_on_advice()) GTEST_SKIP() << "no MADV_POPULATE_WRITE (Linux < 5.14)";
  constexpr size_t kBytes = size_t{8} << 20;
  const AlignedValueBuffer large = new_aligned_value_buffer(kBytes);
  EXPECT_TRUE(all_pages_resident(large.get(), kBytes));
}

// The reuse pool is the process's; each test starts it with a limit of its own and ends it off.
class ValueBufferReuse : public ::testing::Test {
 protected:
  void SetUp() override { set_value_buffer_reuse_limit(size_t{1} << 20); }
  void TearDown() override { set_value_buffer_reuse_limit(0); }
};

TEST_F(ValueBufferReuse, AFreedBufferGoesToTheNextValueOfItsSize) {
  ValueBuffer first = new_value_buffer(100'000);
  const char* memory = first.get();
  std::memset(first.get(), 'a', 100'000);
  const ValueBufferReuseStats before = value_buffer_reuse_stats();
  first.reset();
  EXPECT_EQ(value_buffer_reuse_stats().held_bytes, before.held_bytes + 25 * 4096)
      << "100,000 bytes are kept as 25 steps of 4 KiB";
  // 99,000 bytes round up to the same 102,400.
  const ValueBuffer second = new_value_buffer(99'000);
  EXPECT_EQ(second.get(), memory);
  const ValueBufferReuseStats after = value_buffer_reuse_stats();
  EXPECT_EQ(after.reused, before.reused + 1);
  EXPECT_EQ(after.allocated, before.allocated);
  EXPECT_EQ(after.held_bytes, before.held_bytes);
}

TEST_F(ValueBufferReuse, AValueOfAnotherSizeGetsFreshMemory) {
  new_value_buffer(100'000).reset();
  const ValueBufferReuseStats before = value_buffer_reuse_stats();
  const ValueBuffer larger = new_value_buffer(200'000);
  const ValueBufferReuseStats after = value_buffer_reuse_stats();
  EXPECT_EQ(after.reused, before.reused);
  EXPECT_EQ(after.allocated, before.allocated + 1);
  EXPECT_EQ(after.held_bytes, before.held_bytes) << "the held buffer stays for its own size";
}

TEST_F(ValueBufferReuse, ThePoolHoldsNoMoreThanItsLimit) {
  set_value_buffer_reuse_limit(250'000);
  std::vector<ValueBuffer> buffers;
  for (int i = 0; i < 3; ++i) buffers.push_back(new_value_buffer(100'000));
  buffers.clear();  // 3 x 102,400 freed: two fit the limit, the third goes back to the heap
  EXPECT_EQ(value_buffer_reuse_stats().held_bytes, 2 * 102'400u);
  EXPECT_EQ(value_buffer_reuse_stats().limit_bytes, 250'000u);
}

TEST_F(ValueBufferReuse, ReleaseFreesWhatThePoolHolds) {
  new_value_buffer(100'000).reset();
  new_value_buffer(300'000).reset();
  const size_t held = value_buffer_reuse_stats().held_bytes;
  EXPECT_GE(held, 400'000u);
  EXPECT_EQ(release_reusable_value_buffers(), held);
  EXPECT_EQ(value_buffer_reuse_stats().held_bytes, 0u);
  const ValueBufferReuseStats before = value_buffer_reuse_stats();
  const ValueBuffer fresh = new_value_buffer(100'000);
  EXPECT_EQ(value_buffer_reuse_stats().allocated, before.allocated + 1);
}

TEST_F(ValueBufferReuse, NothingIsKeptWithALimitOfZero) {
  set_value_buffer_reuse_limit(0);
  const ValueBufferReuseStats before = value_buffer_reuse_stats();
  new_value_buffer(100'000).reset();
  new_value_buffer(100'000).reset();
  const ValueBufferReuseStats after = value_buffer_reuse_stats();
  EXPECT_EQ(after.held_bytes, 0u);
  EXPECT_EQ(after.reused, before.reused);
  EXPECT_EQ(after.allocated, before.allocated);
}

TEST_F(ValueBufferReuse, EveryRequestedByteIsThereAndTheRoundingIsASixteenthAtMost) {
  set_value_buffer_reuse_limit(size_t{128} << 20);  // room for the largest pooled size
  for (const size_t bytes :
       {size_t{100}, size_t{65'535}, size_t{65'536}, size_t{65'537}, size_t{131'071},
        size_t{131'072}, (size_t{1} << 20) + 1, size_t{64} << 20, (size_t{64} << 20) + 1}) {
    const bool pooled = bytes >= 65'536 && bytes <= (size_t{64} << 20);
    release_reusable_value_buffers();          // (131,071 bytes round up to 131,072's size)
    for (int round = 0; round < 2; ++round) {  // fresh, then (for pooled sizes) reused
      const uint64_t reused_before = value_buffer_reuse_stats().reused;
      ValueBuffer buffer = new_value_buffer(bytes);
      EXPECT_EQ(value_buffer_reuse_stats().reused, reused_before + (pooled && round == 1 ? 1 : 0))
          << bytes << " bytes, round " << round;
      std::memset(buffer.get(), 'x', bytes);  // under ASan, a byte short would be reported
      const size_t capacity = buffer.get_deleter().pooled_capacity;
      if (!pooled) {
        EXPECT_EQ(capacity, 0u) << bytes << " bytes are not pooled";
      } else {
        EXPECT_GE(capacity, bytes);
        EXPECT_LE(capacity, bytes + bytes / 16) << bytes << " bytes";
      }
    }
  }
}

// Buffers freed on one thread are taken by others (the point of the pool): no buffer is ever
// given to two owners at once, which each owner's own pattern, checked before it lets go, shows.
TEST_F(ValueBufferReuse, BuffersMoveBetweenThreadsWithOneOwnerEach) {
  set_value_buffer_reuse_limit(size_t{4} << 20);
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  std::vector<std::thread> threads;
  std::vector<int> damaged(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &damaged] {
      std::vector<ValueBuffer> held;
      for (int round = 0; round < kRounds; ++round) {
        const size_t bytes = 65'536 + static_cast<size_t>((round * 7 + t * 13) % 5) * 4096;
        ValueBuffer buffer = new_value_buffer(bytes);
        std::memset(buffer.get(), 'A' + t, bytes);
        held.push_back(std::move(buffer));
        if (held.size() > 3) {
          const ValueBuffer& oldest = held.front();
          const size_t oldest_bytes = 65'536;  // every buffer has at least this much
          for (size_t i = 0; i < oldest_bytes; i += 4096) {
            if (oldest.get()[i] != 'A' + t) ++damaged[t];
          }
          held.erase(held.begin());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(damaged[t], 0) << "thread " << t;
  EXPECT_GT(value_buffer_reuse_stats().reused, 0u);
}

}  // namespace
}  // namespace dsfs::store
