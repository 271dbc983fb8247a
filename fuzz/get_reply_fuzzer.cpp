// The GET path's RESP reply reader, fed from a fake socket that delivers the input in pieces
// whose sizes the first byte chooses (1 byte at a time included, so every split of a line or a
// value is tried). Whatever arrives, the reader returns replies or a failure, never crashes,
// never allocates more than a GET value may be, and never reads past the end.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "src/store/get_reply.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t piece = 1 + data[0] % 32;  // 1: every byte boundary
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  dsfs::store::ReplyReader reader([&](char* to, size_t room, bool) -> ssize_t {
    const size_t n = std::min({room, piece, rest.size()});
    std::memcpy(to, rest.data(), n);
    rest.remove_prefix(n);
    return static_cast<ssize_t>(n);
  });
  for (int replies = 0; replies < 1000; ++replies) {
    dsfs::store::ValueReply reply;
    if (dsfs::store::read_get_reply(reader, reply)) break;  // a failure ends the stream
    if (reply.kind == dsfs::store::ValueReply::Kind::kValue &&
        reply.size > dsfs::store::kMaxGetValueBytes) {
      __builtin_trap();
    }
  }
  return 0;
}
