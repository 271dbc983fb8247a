#include "src/store/value_buffer.h"

#include <sanitizer/asan_interface.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>

#include "src/store/thread_annotations.h"

namespace dsfs::store {

namespace {

constexpr size_t kMinPrefaultBytes = 64 * 1024;  // below this, the syscall costs more than it saves

void prefault(char* begin, size_t size) {
  static std::atomic<bool> supported{true};
  if (size < kMinPrefaultBytes || !supported.load(std::memory_order_relaxed)) return;
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(begin) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(begin) + size) & ~(page - 1);
  if (end <= first) return;
  if (madvise(reinterpret_cast<void*>(first), end - first, MADV_POPULATE_WRITE) != 0 &&
      (errno == EINVAL || errno == ENOSYS)) {
    supported.store(false, std::memory_order_relaxed);
  }
}

// The pool's sizes: 16 steps per power of two from 64 KiB (a step of 4 KiB) up to 64 MiB.
constexpr int kSmallestPowerOfTwo = 16;
constexpr int kLargestPowerOfTwo = 26;
constexpr int kStepsPerPowerOfTwo = 16;
constexpr size_t kMinPooledBytes = size_t{1} << kSmallestPowerOfTwo;
constexpr size_t kMaxPooledBytes = size_t{1} << kLargestPowerOfTwo;
constexpr size_t kSizeClasses =
    (kLargestPowerOfTwo - kSmallestPowerOfTwo) * kStepsPerPowerOfTwo + 1;

// `bytes` (kMinPooledBytes to kMaxPooledBytes) rounded up to its power of two's step.
size_t pooled_capacity(size_t bytes) {
  const int power = std::bit_width(bytes) - 1;
  const size_t step = size_t{1} << (power - 4);
  return (bytes + step - 1) & ~(step - 1);
}

size_t size_class(size_t capacity) {
  const int power = std::bit_width(capacity) - 1;
  return static_cast<size_t>(power - kSmallestPowerOfTwo) * kStepsPerPowerOfTwo +
         (capacity >> (power - 4)) - kStepsPerPowerOfTwo;
}

// Freed buffers, a list per size class linked through the buffers' own first bytes, so that
// giving one back never allocates (a deleter must not throw). Under ASan the rest of a held
// buffer is poisoned: a use after its release is still reported.
class ReusePool {
 public:
  void set_limit(size_t limit_bytes) DSFS_EXCLUDES(mutex_) {
    char* excess = nullptr;
    {
      MutexLock lock(mutex_);
      limit_bytes_ = limit_bytes;
      enabled_.store(limit_bytes > 0, std::memory_order_relaxed);
      excess = take_all_locked();  // simplest way to fit a lower limit; the pool refills
    }
    free_list(excess);
  }

  size_t release_all() DSFS_EXCLUDES(mutex_) {
    char* held = nullptr;
    size_t bytes = 0;
    {
      MutexLock lock(mutex_);
      bytes = held_bytes_;
      held = take_all_locked();
    }
    free_list(held);
    return bytes;
  }

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // A held buffer of exactly `capacity` bytes, or nullptr.
  char* take(size_t capacity) DSFS_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    char*& head = heads_[size_class(capacity)];
    if (head == nullptr) {
      ++allocated_;
      return nullptr;
    }
    char* buffer = head;
    ASAN_UNPOISON_MEMORY_REGION(buffer, capacity);
    std::memcpy(&head, buffer, sizeof(char*));
    held_bytes_ -= capacity;
    ++reused_;
    return buffer;
  }

  // Keeps `buffer` if the limit allows; false: the caller frees it.
  bool give(char* buffer, size_t capacity) DSFS_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (held_bytes_ + capacity > limit_bytes_) return false;
    char*& head = heads_[size_class(capacity)];
    std::memcpy(buffer, &head, sizeof(char*));
    ASAN_POISON_MEMORY_REGION(buffer + sizeof(char*), capacity - sizeof(char*));
    head = buffer;
    held_bytes_ += capacity;
    return true;
  }

  ValueBufferReuseStats stats() DSFS_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return {.limit_bytes = limit_bytes_,
            .held_bytes = held_bytes_,
            .reused = reused_,
            .allocated = allocated_};
  }

 private:
  // Unlinks every held buffer into one list (through the same first bytes) for free_list.
  char* take_all_locked() DSFS_REQUIRES(mutex_) {
    char* all = nullptr;
    for (char*& head : heads_) {
      while (head != nullptr) {
        char* buffer = head;
        ASAN_UNPOISON_MEMORY_REGION(buffer, sizeof(char*));
        std::memcpy(&head, buffer, sizeof(char*));
        std::memcpy(buffer, &all, sizeof(char*));
        all = buffer;
      }
    }
    held_bytes_ = 0;
    return all;
  }

  // Outside the lock: freeing a large buffer may take glibc a while.
  static void free_list(char* buffer) {
    while (buffer != nullptr) {
      char* next = nullptr;
      std::memcpy(&next, buffer, sizeof(char*));
      delete[] buffer;
      buffer = next;
    }
  }

  Mutex mutex_;
  std::atomic<bool> enabled_{false};  // limit_bytes_ > 0, read without the lock
  size_t limit_bytes_ DSFS_GUARDED_BY(mutex_) = 0;
  size_t held_bytes_ DSFS_GUARDED_BY(mutex_) = 0;
  uint64_t reused_ DSFS_GUARDED_BY(mutex_) = 0;
  uint64_t allocated_ DSFS_GUARDED_BY(mutex_) = 0;
  std::array<char*, kSizeClasses> heads_ DSFS_GUARDED_BY(mutex_){};
};

// Never destroyed: a buffer may be freed by a static's destructor at exit.
ReusePool& reuse_pool() {
  static ReusePool* const pool = new ReusePool;
  return *pool;
}

}  // namespace

void ValueBufferDeleter::operator()(char* memory) const {
  if (pooled_capacity != 0 && reuse_pool().give(memory, pooled_capacity)) return;
  delete[] memory;
}

ValueBuffer new_value_buffer(size_t bytes) {
  ReusePool& pool = reuse_pool();
  if (bytes < kMinPooledBytes || bytes > kMaxPooledBytes || !pool.enabled()) {
    ValueBuffer buffer(new char[bytes]);  // default-initialized: not zeroed
    prefault(buffer.get(), bytes);
    return buffer;
  }
  const size_t capacity = pooled_capacity(bytes);
  if (char* reused = pool.take(capacity)) {
    return ValueBuffer(reused, ValueBufferDeleter{.pooled_capacity = capacity});
  }
  ValueBuffer buffer(new char[capacity], ValueBufferDeleter{.pooled_capacity = capacity});
  prefault(buffer.get(), capacity);
  return buffer;
}

void set_value_buffer_reuse_limit(size_t limit_bytes) {
  reuse_pool().set_limit(limit_bytes);
}

size_t release_reusable_value_buffers() {
  return reuse_pool().release_all();
}

ValueBufferReuseStats value_buffer_reuse_stats() {
  return reuse_pool().stats();
}

AlignedValueBuffer new_aligned_value_buffer(size_t bytes) {
  void* memory = nullptr;
  if (posix_memalign(&memory, kDirectIoBlock, bytes == 0 ? 1 : bytes) != 0) throw std::bad_alloc();
  AlignedValueBuffer buffer(static_cast<char*>(memory));
  prefault(buffer.get(), bytes);
  return buffer;
}

}  // namespace dsfs::store
