#pragma once
// How a source hands file contents to ingest: a stream per file that splits it into Redis-sized
// pieces (one plain object, or chunks of a larger one) and checksums it on the way.
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "src/catalog/catalog.h"

namespace dsfs::tools {

// Names one Redis value of an object: the whole object, or chunk `chunk_index` of a larger one.
struct PieceKey {
  uint64_t object_id = 0;
  bool chunked = false;
  uint64_t chunk_index = 0;
  bool operator==(const PieceKey&) const = default;
};

// Thrown inside source threads when the ingest is stopping (an error elsewhere or a signal);
// the caller reports the real reason.
class StopRequested : public std::runtime_error {
 public:
  StopRequested() : std::runtime_error("ingest is stopping") {}
};

// Receives the pieces a source reads. Implemented by the Redis writer (and by tests in memory).
// Every member may be called from several source threads at once.
class SourceSink {
 public:
  virtual ~SourceSink() = default;
  // Counts `bytes` a source is about to read into memory against the sink's bound on bytes in
  // flight (read and not yet stored), waiting while they do not fit. `holding`: the caller
  // holds a reservation already (a piece being filled); it then waits only while stored bytes
  // are still to be acknowledged, so that sources holding part of a piece each never wait on
  // one another. Throws StopRequested. The default sink bounds nothing.
  virtual void reserve(uint64_t /*bytes*/, bool /*holding*/) {}
  // Gives back reserved bytes that no piece will carry (a stream abandoned or started over, a
  // file shorter than it said).
  virtual void unreserve(uint64_t /*bytes*/) {}
  // Takes one piece, whose bytes were reserved (reserve()) before they were read: never waits
  // for room. `completes_object` marks an object's last piece (its file is then done once
  // stored). Throws StopRequested.
  virtual void put_piece(const PieceKey& key, std::string bytes, bool completes_object) = 0;
  virtual bool stop_requested() const = 0;
  void check_stop() const {
    if (stop_requested()) throw StopRequested();
  }
  // Progress hooks; a total of 0 means unknown.
  virtual void expect_totals(uint64_t /*files*/, uint64_t /*bytes*/) {}
  // How far through its input a streaming source is (an archive's compressed bytes), for an ETA
  // when the totals are unknown.
  virtual void input_position(uint64_t /*consumed*/, uint64_t /*total*/) {}
};

struct FileDigest {
  uint64_t size = 0;
  uint64_t checksum = 0;  // 0 when the checksum kind is kNone
};

// Streams one file into pieces of at most chunk_size bytes. A file of at most chunk_size bytes
// (including an empty one) becomes one plain object; a larger one becomes chunks 0..n-1, as
// Catalog::chunk_count expects. Holds at most one chunk in memory, reserved from the sink before
// it is read: a whole chunk at once where the size is known (size_hint), so that a bound on bytes
// in flight holds for chunks larger than it too; as the bytes come otherwise. Used by one thread.
class ObjectStream {
 public:
  ObjectStream(SourceSink& sink, uint64_t object_id, uint64_t chunk_size,
               catalog::ChecksumKind checksum_kind, uint64_t size_hint = 0);
  ~ObjectStream();
  ObjectStream(const ObjectStream&) = delete;
  ObjectStream& operator=(const ObjectStream&) = delete;

  void append(std::string_view data);
  // Starts the object over (a retried download); pieces already put are overwritten later.
  void restart();
  // Puts the last piece and returns the file's size and checksum. Call once.
  FileDigest finish();

 private:
  struct HashState;
  SourceSink& sink_;
  uint64_t object_id_;
  uint64_t chunk_size_;
  uint64_t size_hint_;
  catalog::ChecksumKind checksum_kind_;
  std::unique_ptr<HashState> hash_;
  // Reserves room in the sink for `more` bytes about to join buffer_.
  void reserve_for(uint64_t more);
  std::string buffer_;
  uint64_t reserved_ = 0;  // bytes reserved in the sink and not yet put (>= buffer_.size())
  uint64_t chunks_put_ = 0;
  uint64_t size_ = 0;
};

}  // namespace dsfs::tools
