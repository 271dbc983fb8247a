#pragma once
// The reader of GET replies on the read path: RESP lines through a small staging buffer, bulk
// payloads straight into a buffer of their exact size. Split out of Connection so a fuzzer can
// feed it from a fake socket that delivers the bytes in any pieces.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "src/store/value_buffer.h"

namespace dsfs::store {

// One GET reply read by Connection::get_values.
struct ValueReply {
  enum class Kind : uint8_t { kValue, kNil, kError };
  Kind kind = Kind::kNil;
  ValueBuffer bytes;  // kValue: `size` bytes (or more), no terminator
  size_t size = 0;
  std::string error;  // kError: Redis's message
};

// The largest value a GET reply may announce: Redis's own limit on a string (proto-max-bulk-len
// defaults to 512 MiB). A longer length is a broken stream, not a value to allocate memory for.
inline constexpr size_t kMaxGetValueBytes = size_t{512} << 20;

// Reads RESP replies from a socket (recv) or from any other source of bytes. Not thread-safe:
// one reader per stream, used by one thread at a time.
class ReplyReader {
 public:
  // Fills [to, to + room) with at least one byte and returns how many, 0 at the end of the
  // stream, or -1 with errno set. wait_all: the caller wants all of `room` (MSG_WAITALL).
  using Receive = std::function<ssize_t(char* to, size_t room, bool wait_all)>;

  explicit ReplyReader(int fd) : fd_(fd) {}
  explicit ReplyReader(Receive receive) : receive_(std::move(receive)) {}

  // The next line, without its "\r\n". Returns false with `error` set (errno, 0 for EOF) on
  // failure, or with error = -1 for a line longer than the staging buffer.
  bool line(std::string_view& out, int& error);
  // Exactly n bytes into dest.
  bool read_exact(char* dest, size_t n, int& error);
  bool drained() const { return pos_ == len_; }

 private:
  bool receive(char* to, size_t room, size_t& count, int& error, bool wait_all = false);

  int fd_ = -1;
  Receive receive_;
  char staging_[4096];
  size_t pos_ = 0;
  size_t len_ = 0;
};

// Why a GET reply could not be read.
struct GetReplyFailure {
  enum class Kind : uint8_t { kIo, kLineTooLong, kMalformed };
  Kind kind = Kind::kIo;
  int error = 0;         // kIo: errno, 0 for the end of the stream
  std::string detail{};  // kMalformed: what was wrong, with an escaped excerpt
};

// Reads one GET reply (a bulk string, nil or an error) into `reply`; nullopt on success. After
// a failure the stream is out of step and must not be read again.
std::optional<GetReplyFailure> read_get_reply(ReplyReader& reader, ValueReply& reply);

}  // namespace dsfs::store
