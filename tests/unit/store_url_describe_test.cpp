// RedisEndpoint::describe() goes into logs and error messages: the password is masked and what
// the user typed is escaped (found by fuzz/redis_url: a user name with control bytes or invalid
// UTF-8 was printed raw).
#include <gtest/gtest.h>

#include "src/store/redis_url.h"

namespace dsfs::store {
namespace {

TEST(RedisUrlDescribe, UserSuppliedBytesAreEscapedAndThePasswordMasked) {
  const RedisEndpoint tcp = parse_redis_url("redis://us%1B%5Bx%C3:s3cret@host:6380/2");
  EXPECT_EQ(tcp.describe(), "redis://us\\x1b[x\\xc3:***@host:6380/2");
  const RedisEndpoint unix_socket = parse_redis_url(
      "unix://:pw@/tmp/a\x01"
      "b.sock");
  EXPECT_EQ(unix_socket.describe(), "unix://:***@/tmp/a\\x01b.sock");
  EXPECT_EQ(parse_redis_url("redis://localhost").describe(), "redis://localhost:6379");
}

}  // namespace
}  // namespace dsfs::store
