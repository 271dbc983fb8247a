#pragma once
// Memory for a value that is about to be written over whole: a GET reply's payload read from the
// socket, or an object read back from the disk tier.
#include <cstddef>
#include <cstdlib>
#include <memory>

namespace dsfs::store {

// `bytes` bytes of uninitialized memory (nothing is zeroed: every byte is about to be overwritten).
// When the memory is fresh (a cache filling up never reuses memory), every 4 KiB page would
// fault on its first write, and on a VM each such fault cost 12-30 us: a buffer of 64 KiB or
// more is pre-faulted with one MADV_POPULATE_WRITE, which in a heap glibc marked for transparent
// huge pages maps 2 MiB pages (fs/mount_command.cpp). On memory already mapped the call only
// walks the page table; kernels before 5.14 answer EINVAL, and the first such answer turns it
// off. Thread-safe.
std::unique_ptr<char[]> new_value_buffer(size_t bytes);

// Memory from posix_memalign, released with free().
struct FreeDeleter {
  void operator()(char* memory) const { std::free(memory); }
};
using AlignedValueBuffer = std::unique_ptr<char, FreeDeleter>;

// Alignment and size granule of an aligned buffer: what O_DIRECT asks of a read's memory, length
// and offset on every Linux filesystem that supports it (the logical block size is 4 KiB or less).
inline constexpr size_t kDirectIoBlock = 4096;

// As new_value_buffer, but the memory starts on a kDirectIoBlock boundary, so that a file can be
// read into it with O_DIRECT. Throws std::bad_alloc when there is no memory. Thread-safe.
AlignedValueBuffer new_aligned_value_buffer(size_t bytes);

}  // namespace dsfs::store
