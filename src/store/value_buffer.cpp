#include "src/store/value_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <new>

namespace dsfs::store {

namespace {

void prefault(char* begin, size_t size) {
  constexpr size_t kMinBytes = 64 * 1024;  // below this, the syscall costs more than it saves
  static std::atomic<bool> supported{true};
  if (size < kMinBytes || !supported.load(std::memory_order_relaxed)) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(begin) + size) & ~(page - 1);
  if (end <= first) return;
  if (madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE) != 0 &&
      (errno == EINVAL || errno == ENOSYS)) {
    supported.store(false, std::memory_order_relaxed);
  }
}

}  // namespace

std::unique_ptr<char[]> new_value_buffer(size_t bytes) {
  std::unique_ptr<char[]> buffer(new char[bytes]);  // default-initialized: not zeroed
  prefault(buffer.get(), bytes);
  return buffer;
}

AlignedValueBuffer new_aligned_value_buffer(size_t bytes) {
  void* memory = nullptr;
  if (posix_memalign(&memory, kDirectIoBlock, bytes == 0 ? 1 : bytes) != 0) throw std::bad_alloc();
  AlignedValueBuffer buffer(static_cast<char*>(memory));
  prefault(buffer.get(), bytes);
  return buffer;
}

}  // namespace dsfs::store
