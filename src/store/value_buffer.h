#pragma once
// Memory for a value that is about to be written over whole: a GET reply's payload read from the
// socket, or an object read back from the disk tier.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

namespace dsfs::store {

// Gives a value buffer's memory back: to the reuse pool (set_value_buffer_reuse_limit) when the
// buffer came in one of the pool's sizes and the pool has room, else to the heap.
struct ValueBufferDeleter {
  size_t pooled_capacity = 0;  // the bytes allocated, when a size of the pool's; 0: not pooled
  void operator()(char* memory) const;
};
using ValueBuffer = std::unique_ptr<char[], ValueBufferDeleter>;

// `bytes` bytes of uninitialized memory (nothing is zeroed: every byte is about to be overwritten).
// When the memory is fresh (a cache filling up never reuses memory), every 4 KiB page would
// fault on its first write, and on a VM each such fault cost 12-30 us: a buffer of 64 KiB or
// more is pre-faulted with one MADV_POPULATE_WRITE (in a heap on transparent huge pages, where
// the system or the user's GLIBC_TUNABLES puts it, that maps 2 MiB pages; the daemon does not ask
// for it: docs/architecture.md). On memory already mapped the call only walks the page table;
// kernels before 5.14 answer EINVAL, and the first such answer turns it off. A buffer of 64 KiB to
// 64 MiB is taken from the reuse pool when it holds one of its size. Throws std::bad_alloc when
// there is no memory. Thread-safe.
ValueBuffer new_value_buffer(size_t bytes);

// The reuse pool: buffers of objects the cache let go, kept for the next values of their size
// instead of going back to glibc. glibc returns freed memory to the arena of the thread that
// allocated it, and the daemon's fetch threads allocate unevenly across its arenas, so one arena
// grew with fresh pages while another's freed memory waited: a planned first epoch with a cache
// a quarter of the data peaked 50-100 MiB above `--prefetch off` (docs/benchmarks.md, "Object
// buffers reused across threads"). The pool hands any thread's freed buffer to any thread.
// Sizes are rounded up to 16 steps per power of two (at most 1/16 more than asked), so that a
// freed buffer fits the next value of about its size. Off (limit 0) until set; the pool never
// holds more than `limit_bytes` (setting a limit frees what it holds). Thread-safe.
void set_value_buffer_reuse_limit(size_t limit_bytes);

// Frees every buffer the pool holds (the limit stays): for a daemon whose reads paused, before
// it gives freed memory back to the system. Returns the bytes freed. Thread-safe.
size_t release_reusable_value_buffers();

struct ValueBufferReuseStats {
  uint64_t limit_bytes = 0;
  uint64_t held_bytes = 0;  // freed buffers waiting in the pool now
  uint64_t reused = 0;      // buffers the pool gave out again
  uint64_t allocated = 0;   // buffers of a pooled size that the pool had none for
};
ValueBufferReuseStats value_buffer_reuse_stats();

// Memory from posix_memalign, released with free().
struct FreeDeleter {
  void operator()(char* memory) const { std::free(memory); }
};
using AlignedValueBuffer = std::unique_ptr<char, FreeDeleter>;

// Alignment and size granule of an aligned buffer: what O_DIRECT asks of a read's memory, length
// and offset on every Linux filesystem that supports it (the logical block size is 4 KiB or less).
inline constexpr size_t kDirectIoBlock = 4096;

// As new_value_buffer, but the memory starts on a kDirectIoBlock boundary, so that a file can be
// read into it with O_DIRECT; never pooled. Throws std::bad_alloc when there is no memory.
// Thread-safe.
AlignedValueBuffer new_aligned_value_buffer(size_t bytes);

}  // namespace dsfs::store
