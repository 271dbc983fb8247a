#include "src/store/value_buffer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
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
  const std::unique_ptr<char[]> buffer = new_value_buffer(kBytes);
  ASSERT_NE(buffer, nullptr);
  EXPECT_TRUE(all_pages_resident(buffer.get(), kBytes))
      << "fresh pages would fault one by one as the socket or the file fills them";
  buffer[0] = 'a';  // and it is ordinary writable memory
  buffer[kBytes - 1] = 'z';
  EXPECT_EQ(buffer[kBytes - 1], 'z');
}

TEST(ValueBuffer, EmptyAndSmallBuffersAreGiven) {
  EXPECT_NE(new_value_buffer(0), nullptr);
  const std::unique_ptr<char[]> small = new_value_buffer(100);
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

}  // namespace
}  // namespace dsfs::store
