#pragma once
// One immutable object (a file, or one chunk of a large file) as it came from Redis.
#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "src/store/connection.h"
#include "src/store/value_buffer.h"

namespace dsfs::prefetch {

// Holds the bytes in its own string, in the buffer a GET reply was read into straight from the
// socket (store::Connection::get_values), or in the block a disk tier file was read into whole
// (header included), so a fetched object is never copied between the socket or the disk and the
// FUSE reply.
// Thread safety: the bytes are immutable once built; shared between threads through ObjectBuffer.
// The one mutable flag, awaiting_disk, is atomic.
class ObjectData {
 public:
  explicit ObjectData(std::string bytes);
  // `value` must be a kValue reply.
  explicit ObjectData(store::ValueReply value);
  // The object is `size` bytes of `block` from `offset` on; the rest of the block is kept with it.
  ObjectData(store::AlignedValueBuffer block, size_t offset, size_t size);
  // Pinned in place: bytes() points into this object.
  ObjectData(const ObjectData&) = delete;
  ObjectData& operator=(const ObjectData&) = delete;

  std::string_view bytes() const { return bytes_; }
  size_t size() const { return bytes_.size(); }

  // Set while the disk tier has deferred writing this object (DiskTier::put found its queue
  // full): it is lost to the tier if it leaves memory first, so the memory cache evicts it after
  // the other objects already read (BasicObjectCache). Cleared when a writer takes it.
  void set_awaiting_disk(bool awaiting) const {
    awaiting_disk_.store(awaiting, std::memory_order_relaxed);
  }
  bool awaiting_disk() const { return awaiting_disk_.load(std::memory_order_relaxed); }

 private:
  std::string owned_;
  store::ValueBuffer value_;
  store::AlignedValueBuffer block_;
  std::string_view bytes_;
  mutable std::atomic<bool> awaiting_disk_{false};
};

using ObjectBuffer = std::shared_ptr<const ObjectData>;

}  // namespace dsfs::prefetch
