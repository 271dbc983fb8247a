#include "src/store/get_reply.h"

#include <fmt/core.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "src/store/log_text.h"
#include "src/store/value_buffer.h"

namespace dsfs::store {

bool ReplyReader::line(std::string_view& out, int& error) {
  for (;;) {
    const char* begin = staging_ + pos_;
    const size_t available = len_ - pos_;
    const void* cr = available >= 2 ? memmem(begin, available, "\r\n", 2) : nullptr;
    if (cr) {
      const size_t length = static_cast<size_t>(static_cast<const char*>(cr) - begin);
      out = std::string_view(begin, length);
      pos_ += length + 2;
      return true;
    }
    if (pos_ > 0) {
      std::memmove(staging_, begin, available);
      len_ = available;
      pos_ = 0;
    }
    if (len_ == sizeof(staging_)) {
      error = -1;
      return false;
    }
    if (!receive(staging_ + len_, sizeof(staging_) - len_, len_, error)) return false;
  }
}

bool ReplyReader::read_exact(char* dest, size_t n, int& error) {
  const size_t from_staging = std::min(n, len_ - pos_);
  std::memcpy(dest, staging_ + pos_, from_staging);
  pos_ += from_staging;
  size_t got = from_staging;
  while (got < n) {
    // MSG_WAITALL: one wake-up for the whole value rather than one per burst Redis writes.
    if (!receive(dest + got, n - got, got, error, /*wait_all=*/true)) return false;
  }
  return true;
}

bool ReplyReader::receive(char* to, size_t room, size_t& count, int& error, bool wait_all) {
  for (;;) {
    const ssize_t n =
        receive_ ? receive_(to, room, wait_all) : ::recv(fd_, to, room, wait_all ? MSG_WAITALL : 0);
    if (n > 0) {
      count += static_cast<size_t>(n);
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    error = n == 0 ? 0 : errno;
    return false;
  }
}

std::optional<GetReplyFailure> read_get_reply(ReplyReader& reader, ValueReply& reply) {
  using Kind = GetReplyFailure::Kind;
  int error = 0;
  std::string_view header;
  if (!reader.line(header, error)) {
    if (error < 0) return GetReplyFailure{.kind = Kind::kLineTooLong};
    return GetReplyFailure{.kind = Kind::kIo, .error = error};
  }
  if (header.starts_with('-')) {
    reply.kind = ValueReply::Kind::kError;
    reply.error = std::string(header.substr(1));
    return std::nullopt;
  }
  long long length = -2;
  if (header.starts_with('$')) {
    const auto [end, ec] =
        std::from_chars(header.data() + 1, header.data() + header.size(), length);
    if (ec != std::errc() || end != header.data() + header.size()) length = -2;
  }
  if (length == -1) {
    reply.kind = ValueReply::Kind::kNil;
    return std::nullopt;
  }
  if (length < 0 || static_cast<unsigned long long>(length) > kMaxGetValueBytes) {
    return GetReplyFailure{
        .kind = Kind::kMalformed,
        .detail = fmt::format("unexpected reply to GET: '{}'", log_text(header, 64))};
  }
  reply.kind = ValueReply::Kind::kValue;
  reply.size = static_cast<size_t>(length);
  reply.bytes = new_value_buffer(reply.size + 2);  // the value and its CRLF, from the stream
  if (!reader.read_exact(reply.bytes.get(), reply.size + 2, error)) {
    return GetReplyFailure{.kind = Kind::kIo, .error = error};
  }
  if (reply.bytes[reply.size] != '\r' || reply.bytes[reply.size + 1] != '\n') {
    return GetReplyFailure{
        .kind = Kind::kMalformed,
        .detail = fmt::format("malformed GET reply (no CRLF after {} bytes)", reply.size)};
  }
  return std::nullopt;
}

}  // namespace dsfs::store
