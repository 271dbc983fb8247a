// parse_redis_url and RedisEndpoint::describe: every accepted form and every rejected one.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "src/store/redis_url.h"

namespace dsfs::store {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Transport = RedisEndpoint::Transport;

TEST(RedisUrlTest, HostOnlyUsesDefaults) {
  const RedisEndpoint e = parse_redis_url("redis://cache.example");
  EXPECT_EQ(e.transport, Transport::kTcp);
  EXPECT_EQ(e.host, "cache.example");
  EXPECT_EQ(e.port, 6379);
  EXPECT_EQ(e.db, 0);
  EXPECT_EQ(e.user, "");
  EXPECT_EQ(e.password, "");
}

TEST(RedisUrlTest, HostPortAndDb) {
  const RedisEndpoint e = parse_redis_url("redis://10.1.2.3:7000/5");
  EXPECT_EQ(e.host, "10.1.2.3");
  EXPECT_EQ(e.port, 7000);
  EXPECT_EQ(e.db, 5);
}

TEST(RedisUrlTest, TrailingSlashMeansDbZero) {
  EXPECT_EQ(parse_redis_url("redis://h:1/").db, 0);
  EXPECT_EQ(parse_redis_url("redis://h/").port, 6379);
}

TEST(RedisUrlTest, DbAsQueryParameter) {
  EXPECT_EQ(parse_redis_url("redis://h:1?db=9").db, 9);
}

TEST(RedisUrlTest, SchemeIsCaseInsensitive) {
  EXPECT_EQ(parse_redis_url("REDIS://h:2").port, 2);
  EXPECT_EQ(parse_redis_url("Unix:///s.sock").socket_path, "/s.sock");
}

TEST(RedisUrlTest, PasswordOnly) {
  const RedisEndpoint e = parse_redis_url("redis://:s3cret@h:6380");
  EXPECT_EQ(e.user, "");
  EXPECT_EQ(e.password, "s3cret");
  EXPECT_EQ(e.port, 6380);
}

TEST(RedisUrlTest, UserAndPassword) {
  const RedisEndpoint e = parse_redis_url("redis://alice:pw@h/2");
  EXPECT_EQ(e.user, "alice");
  EXPECT_EQ(e.password, "pw");
  EXPECT_EQ(e.db, 2);
}

TEST(RedisUrlTest, PercentEscapesInCredentialsAreDecoded) {
  const RedisEndpoint e = parse_redis_url("redis://al%3Aice:p%40ss%2Fw%25rd%3a@h");
  EXPECT_EQ(e.user, "al:ice");
  EXPECT_EQ(e.password, "p@ss/w%rd:");
}

TEST(RedisUrlTest, RawColonAndSlashInPasswordSurvive) {
  const RedisEndpoint e = parse_redis_url("redis://:a:b/c@h:1/3");
  EXPECT_EQ(e.password, "a:b/c");
  EXPECT_EQ(e.host, "h");
  EXPECT_EQ(e.db, 3);
}

TEST(RedisUrlTest, Ipv6Host) {
  const RedisEndpoint e = parse_redis_url("redis://[::1]:6390/1");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 6390);
  EXPECT_EQ(e.db, 1);
  EXPECT_EQ(parse_redis_url("redis://[fe80::1:2]").port, 6379);
}

TEST(RedisUrlTest, UnixSocket) {
  const RedisEndpoint e = parse_redis_url("unix:///run/redis/redis.sock");
  EXPECT_EQ(e.transport, Transport::kUnix);
  EXPECT_EQ(e.socket_path, "/run/redis/redis.sock");
  EXPECT_EQ(e.db, 0);
  EXPECT_EQ(e.password, "");
}

TEST(RedisUrlTest, UnixSocketWithDb) {
  const RedisEndpoint e = parse_redis_url("unix:///tmp/r.sock?db=4");
  EXPECT_EQ(e.socket_path, "/tmp/r.sock");
  EXPECT_EQ(e.db, 4);
}

TEST(RedisUrlTest, UnixSocketWithCredentials) {
  const RedisEndpoint with_user = parse_redis_url("unix://bob:pw%21@/tmp/r.sock?db=1");
  EXPECT_EQ(with_user.user, "bob");
  EXPECT_EQ(with_user.password, "pw!");
  EXPECT_EQ(with_user.socket_path, "/tmp/r.sock");
  EXPECT_EQ(with_user.db, 1);
  const RedisEndpoint password_only = parse_redis_url("unix://:pw@/tmp/r.sock");
  EXPECT_EQ(password_only.user, "");
  EXPECT_EQ(password_only.password, "pw");
}

TEST(RedisUrlTest, UnixSocketPathWithAtSignIsNotCredentials) {
  const RedisEndpoint e = parse_redis_url("unix:///tmp/a@b/r.sock");
  EXPECT_EQ(e.socket_path, "/tmp/a@b/r.sock");
  EXPECT_EQ(e.password, "");
}

TEST(RedisUrlTest, DescribeRedactsThePassword) {
  EXPECT_EQ(parse_redis_url("redis://alice:topsecret@h:1/2").describe(), "redis://alice:***@h:1/2");
  EXPECT_EQ(parse_redis_url("redis://:topsecret@h").describe(), "redis://:***@h:6379");
  EXPECT_EQ(parse_redis_url("redis://h").describe(), "redis://h:6379");
  EXPECT_EQ(parse_redis_url("redis://[::1]:7/0").describe(), "redis://[::1]:7");
  EXPECT_EQ(parse_redis_url("unix:///x.sock?db=3").describe(), "unix:///x.sock?db=3");
  EXPECT_EQ(parse_redis_url("unix://u:pw@/x.sock").describe(), "unix://u:***@/x.sock");
}

TEST(RedisUrlTest, DescribeRoundTripsThroughTheParser) {
  for (const char* url : {"redis://h:1/2", "redis://[::1]:7", "unix:///x.sock?db=3"}) {
    const RedisEndpoint e = parse_redis_url(url);
    const RedisEndpoint again = parse_redis_url(e.describe());
    EXPECT_EQ(again.host, e.host) << url;
    EXPECT_EQ(again.port, e.port) << url;
    EXPECT_EQ(again.socket_path, e.socket_path) << url;
    EXPECT_EQ(again.db, e.db) << url;
  }
}

// Every malformed URL throws std::invalid_argument whose message names the URL (password
// redacted) and the problem.
struct BadUrl {
  const char* url;
  const char* problem;  // a fragment the message must contain
};

class RedisUrlRejectTest : public ::testing::TestWithParam<BadUrl> {};

TEST_P(RedisUrlRejectTest, ThrowsInvalidArgumentNamingTheProblem) {
  const BadUrl bad = GetParam();
  try {
    parse_redis_url(bad.url);
    FAIL() << "accepted " << bad.url;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("invalid Redis URL"));
    EXPECT_THAT(e.what(), HasSubstr(bad.problem)) << bad.url;
    EXPECT_THAT(e.what(), Not(HasSubstr("hunter2"))) << "password leaked for " << bad.url;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, RedisUrlRejectTest,
    ::testing::Values(
        BadUrl{"", "empty URL"}, BadUrl{"localhost:6379", "expected redis://"},
        BadUrl{"redis//:hunter2@h:1", "expected redis://"},
        BadUrl{"redis:/:hunter2@h:1", "expected redis://"}, BadUrl{":hunter2@h", "expected"},
        BadUrl{"http://h:6379", "expected redis://"}, BadUrl{"rediss://h:6379", "TLS"},
        BadUrl{"redis://", "missing host"}, BadUrl{"redis://:6379", "missing host"},
        BadUrl{"redis://h:", "port '' is not a number"},
        BadUrl{"redis://h:abc", "port 'abc' is not a number"},
        BadUrl{"redis://h:0", "out of range"}, BadUrl{"redis://h:65536", "out of range"},
        BadUrl{"redis://h:-1", "not a number"},
        BadUrl{"redis://h:99999999999999999999", "not a number"},
        BadUrl{"redis://h:1/x", "database 'x'"}, BadUrl{"redis://h:1/-2", "database '-2'"},
        BadUrl{"redis://h:1/1/2", "database '1/2'"},
        BadUrl{"redis://h:1/2?db=3", "database given twice"},
        BadUrl{"redis://h:1?timeout=3", "unsupported query"}, BadUrl{"redis://h:1?", "empty query"},
        BadUrl{"redis://h:1?db=", "database ''"},
        BadUrl{"redis://::1:6379", "IPv6 host must be written in brackets"},
        BadUrl{"redis://[::1:6379", "closing ']'"}, BadUrl{"redis://[::1]x", "expected ':PORT'"},
        BadUrl{"redis://[]:1", "not an IPv6 address"},
        BadUrl{"redis://[zz]:1", "not an IPv6 address"}, BadUrl{"redis://hunter2@h", "missing ':'"},
        BadUrl{"redis://user:@h", "empty password"},
        BadUrl{"redis://:hunter2%zz@h", "bad percent-escape in the password"},
        BadUrl{"redis://:hunter2%4@h", "bad percent-escape"},
        BadUrl{"redis://u%g1:hunter2@h", "bad percent-escape in the user name"},
        BadUrl{"redis://:hunter2@h:99999", "out of range"}, BadUrl{"redis://h ost:1", "whitespace"},
        BadUrl{"unix://", "must be absolute"}, BadUrl{"unix://relative.sock", "must be absolute"},
        BadUrl{"unix:///", "missing socket path"}, BadUrl{"unix:///dir/", "missing socket path"},
        BadUrl{"unix:///s.sock?db=x", "database 'x'"},
        BadUrl{"unix:///s.sock?foo=1", "unsupported query"},
        BadUrl{"unix://hunter2@/s.sock", "missing ':'"},
        BadUrl{"unix://:@/s.sock", "empty password"}));

// With the password given apart (a file, the environment), 'USER@' names an ACL user.
TEST(RedisUrlTest, AUserAloneIsAUserWhenThePasswordIsGivenApart) {
  const RedisEndpoint endpoint = parse_redis_url("redis://reader@h:7000", true);
  EXPECT_EQ(endpoint.user, "reader");
  EXPECT_EQ(endpoint.password, "");
  EXPECT_EQ(endpoint.port, 7000);
  EXPECT_THROW(parse_redis_url("redis://@h:7000", true), std::invalid_argument);
  try {
    parse_redis_url("redis://reader@h:7000");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("--redis-password-file"));
  }
}

TEST(RedisUrlRedactionTest, PasswordIsRedactedInErrors) {
  try {
    parse_redis_url("redis://alice:hunter2@h:notaport");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("redis://alice:***@h:notaport"));
  }
}

}  // namespace
}  // namespace dsfs::store
