// The GET path's reply reader (src/store/get_reply.h), fed from a fake socket that delivers the
// stream in pieces of every size: replies read the same whatever the split, and a length no
// Redis string can have is a malformed reply, not an allocation of that size.
#include "src/store/get_reply.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace dsfs::store {
namespace {

// A reader over `bytes` that hands out at most `piece` bytes per receive.
ReplyReader fake_socket(std::string_view& bytes, size_t piece) {
  return ReplyReader([&bytes, piece](char* to, size_t room, bool) -> ssize_t {
    const size_t n = std::min({room, piece, bytes.size()});
    std::memcpy(to, bytes.data(), n);
    bytes.remove_prefix(n);
    return static_cast<ssize_t>(n);
  });
}

TEST(GetReply, RepliesReadTheSameAtEverySplit) {
  const std::string stream = "$5\r\nhello\r\n$-1\r\n-ERR wrong type\r\n$0\r\n\r\n$4\r\na\r\nb\r\n";
  for (size_t piece = 1; piece <= stream.size(); ++piece) {
    std::string_view rest = stream;
    ReplyReader reader = fake_socket(rest, piece);
    std::vector<ValueReply> replies(5);
    for (ValueReply& reply : replies) {
      ASSERT_FALSE(read_get_reply(reader, reply).has_value()) << "piece " << piece;
    }
    EXPECT_EQ(std::string(replies[0].bytes.get(), replies[0].size), "hello");
    EXPECT_EQ(replies[1].kind, ValueReply::Kind::kNil);
    EXPECT_EQ(replies[2].kind, ValueReply::Kind::kError);
    EXPECT_EQ(replies[2].error, "ERR wrong type");
    EXPECT_EQ(replies[3].size, 0u);
    EXPECT_EQ(std::string(replies[4].bytes.get(), replies[4].size), "a\r\nb");
    EXPECT_TRUE(reader.drained());
    ValueReply after;
    const auto end = read_get_reply(reader, after);
    ASSERT_TRUE(end.has_value());
    EXPECT_EQ(end->kind, GetReplyFailure::Kind::kIo);
    EXPECT_EQ(end->error, 0);  // the end of the stream
  }
}

TEST(GetReply, ALengthNoRedisStringCanHaveIsMalformedNotAnAllocation) {
  for (const std::string header : {"$536870913", "$9223372036854775807", "$99999999999999999999"}) {
    const std::string stream = header + "\r\nx\r\n";
    std::string_view rest = stream;
    ReplyReader reader = fake_socket(rest, 4096);
    ValueReply reply;
    const auto failure = read_get_reply(reader, reply);
    ASSERT_TRUE(failure.has_value()) << header;
    EXPECT_EQ(failure->kind, GetReplyFailure::Kind::kMalformed) << header;
    EXPECT_EQ(reply.bytes, nullptr) << header;
  }
}

TEST(GetReply, ALineWithControlBytesIsReportedEscaped) {
  const std::string stream = "+\x1b[2J\r\n";
  std::string_view rest = stream;
  ReplyReader reader = fake_socket(rest, 3);
  ValueReply reply;
  const auto failure = read_get_reply(reader, reply);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->detail, "unexpected reply to GET: '+\\x1b[2J'");
}

TEST(GetReply, AValueWithoutItsCrlfIsMalformed) {
  const std::string stream = "$3\r\nabcXY";
  std::string_view rest = stream;
  ReplyReader reader = fake_socket(rest, 2);
  ValueReply reply;
  const auto failure = read_get_reply(reader, reply);
  ASSERT_TRUE(failure.has_value());
  EXPECT_EQ(failure->kind, GetReplyFailure::Kind::kMalformed);
}

}  // namespace
}  // namespace dsfs::store
