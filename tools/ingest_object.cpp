#include "tools/ingest_object.h"

#include <xxhash.h>

#include <algorithm>
#include <new>
#include <stdexcept>
#include <utility>

namespace dsfs::tools {

struct ObjectStream::HashState {
  struct FreeState {
    void operator()(XXH64_state_t* state) const { XXH64_freeState(state); }
  };
  std::unique_ptr<XXH64_state_t, FreeState> state{XXH64_createState()};
};

ObjectStream::ObjectStream(SourceSink& sink, uint64_t object_id, uint64_t chunk_size,
                           catalog::ChecksumKind checksum_kind, uint64_t size_hint)
    : sink_(sink),
      object_id_(object_id),
      chunk_size_(chunk_size),
      size_hint_(size_hint),
      checksum_kind_(checksum_kind) {
  if (chunk_size_ == 0) throw std::invalid_argument("chunk size must be at least 1 byte");
  if (checksum_kind_ != catalog::ChecksumKind::kNone &&
      checksum_kind_ != catalog::ChecksumKind::kXxh64) {
    throw std::invalid_argument("ingest computes xxh64 checksums or none");
  }
  if (checksum_kind_ == catalog::ChecksumKind::kXxh64) {
    hash_ = std::make_unique<HashState>();
    if (!hash_->state) throw std::bad_alloc();
  }
  restart();
}

ObjectStream::~ObjectStream() {
  if (reserved_ > 0) sink_.unreserve(reserved_);
}

void ObjectStream::restart() {
  if (reserved_ > 0) sink_.unreserve(std::exchange(reserved_, 0));
  buffer_.clear();
  // Reserving the expected size up front avoids regrowing the buffer for every small file.
  buffer_.reserve(std::min(chunk_size_, size_hint_));
  chunks_put_ = 0;
  size_ = 0;
  if (hash_) XXH64_reset(hash_->state.get(), 0);
}

void ObjectStream::append(std::string_view data) {
  if (hash_ && !data.empty()) XXH64_update(hash_->state.get(), data.data(), data.size());
  size_ += data.size();
  while (!data.empty()) {
    // A full buffer is only known to be a chunk (not the whole object) once more data arrives.
    if (buffer_.size() == chunk_size_) {
      reserved_ -= buffer_.size();
      sink_.put_piece(PieceKey{object_id_, true, chunks_put_}, std::exchange(buffer_, {}), false);
      ++chunks_put_;
      const uint64_t consumed = chunks_put_ * chunk_size_;
      buffer_.reserve(size_hint_ > consumed ? std::min(chunk_size_, size_hint_ - consumed) : 0);
    }
    const size_t take = std::min<size_t>(chunk_size_ - buffer_.size(), data.size());
    reserve_for(take);
    buffer_.append(data.substr(0, take));
    data.remove_prefix(take);
  }
}

void ObjectStream::reserve_for(uint64_t more) {
  const uint64_t needed = buffer_.size() + more;
  if (needed <= reserved_) return;
  const bool holding = reserved_ > 0;
  // A new piece of known size: all of it at once (never waiting again while holding part).
  const uint64_t consumed = chunks_put_ * chunk_size_;
  const uint64_t expected =
      size_hint_ > consumed ? std::min(chunk_size_, size_hint_ - consumed) : uint64_t{0};
  const uint64_t target = std::max(needed, holding ? uint64_t{0} : expected);
  sink_.reserve(target - reserved_, holding);
  reserved_ = target;
}

FileDigest ObjectStream::finish() {
  FileDigest digest;
  digest.size = size_;
  digest.checksum = hash_ ? XXH64_digest(hash_->state.get()) : 0;
  // Whatever the piece will not carry (a file shorter than its size said) goes back first.
  if (reserved_ > buffer_.size()) sink_.unreserve(reserved_ - buffer_.size());
  reserved_ = 0;
  if (chunks_put_ == 0) {
    sink_.put_piece(PieceKey{object_id_, false, 0}, std::move(buffer_), true);
  } else {
    sink_.put_piece(PieceKey{object_id_, true, chunks_put_}, std::move(buffer_), true);
    ++chunks_put_;
  }
  buffer_ = std::string();
  return digest;
}

}  // namespace dsfs::tools
