// Connection, Reply, pipeline and ConnectionPool against real redis-server processes.
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "src/store/client.h"
#include "src/store/connection.h"
#include "src/store/errors.h"
#include "src/store/pool.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::store {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;
using test::BoundSocket;
using test::free_tcp_port;
using test::TestRedisOptions;
using test::TestRedisServer;

class ConnectionTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { redis_ = std::make_unique<TestRedisServer>(); }
  static void TearDownTestSuite() { redis_.reset(); }
  void SetUp() override { Connection(redis_->endpoint()).command({"FLUSHALL"}); }
  static inline std::unique_ptr<TestRedisServer> redis_;
};

TEST_F(ConnectionTest, CommandRoundTripsBinaryValues) {
  Connection conn(redis_->endpoint());
  const std::string value("a\0b\r\n\xff", 6);
  EXPECT_EQ(conn.command({"SET", "k", value}).str(), "OK");
  Reply reply = conn.command({"GET", "k"});
  ASSERT_TRUE(reply.is_string());
  EXPECT_EQ(reply.str(), value);
  EXPECT_TRUE(conn.command({"GET", "missing"}).is_nil());
  EXPECT_EQ(conn.command({"INCRBY", "n", "41"}).integer(), 41);
}

TEST_F(ConnectionTest, EmptyArgumentsAreSent) {
  Connection conn(redis_->endpoint());
  conn.command({"SET", "empty", std::string_view{}}).expect_ok("SET");
  EXPECT_EQ(conn.command({"STRLEN", "empty"}).integer(), 0);
  EXPECT_TRUE(conn.command({"EXISTS", "empty"}).integer() == 1);
}

TEST_F(ConnectionTest, LargeValueSurvivesRoundTrip) {
  Connection conn(redis_->endpoint());
  std::string big(9 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 13);
  conn.command({"SET", "big", big}).expect_ok("SET big");
  Reply reply = conn.command({"GET", "big"});
  ASSERT_EQ(reply.str().size(), big.size());
  EXPECT_TRUE(reply.str() == big);
}

TEST_F(ConnectionTest, ErrorRepliesAreReturnedNotThrown) {
  Connection conn(redis_->endpoint());
  conn.command({"SET", "s", "text"});
  Reply reply = conn.command({"INCR", "s"});
  EXPECT_TRUE(reply.is_error());
  EXPECT_THAT(std::string(reply.str()), HasSubstr("not an integer"));
  EXPECT_THROW(reply.expect_ok("INCR s"), ReplyError);
  EXPECT_THROW(reply.integer(), ReplyError);
  EXPECT_FALSE(conn.broken());
  EXPECT_EQ(conn.command({"PING"}).str(), "PONG");
}

TEST_F(ConnectionTest, ArrayRepliesExposeElements) {
  Connection conn(redis_->endpoint());
  conn.command({"RPUSH", "list", "x", "yy", "zzz"});
  Reply reply = conn.command({"LRANGE", "list", "0", "-1"});
  ASSERT_TRUE(reply.is_array());
  ASSERT_EQ(reply.size(), 3u);
  EXPECT_EQ(Reply::element_str(reply.element(0)), "x");
  EXPECT_EQ(Reply::element_str(reply.element(2)), "zzz");
  EXPECT_EQ(reply.element(3), nullptr);
  EXPECT_EQ(Reply::element_str(nullptr), "");
}

TEST_F(ConnectionTest, ReplyMovesOwnership) {
  Connection conn(redis_->endpoint());
  Reply first = conn.command({"ECHO", "hello"});
  Reply second = std::move(first);
  EXPECT_EQ(first.raw(), nullptr);
  EXPECT_EQ(second.str(), "hello");
  first = conn.command({"ECHO", "again"});
  second = std::move(first);
  EXPECT_EQ(second.str(), "again");
}

TEST_F(ConnectionTest, ManualPipelineKeepsOrder) {
  Connection conn(redis_->endpoint());
  // Keys made with fmt: "p" + std::to_string(i) trips GCC 12's false -Wrestrict at -O3.
  for (int i = 0; i < 10; ++i) conn.append({"SET", fmt::format("p{}", i), std::to_string(i * i)});
  for (int i = 0; i < 10; ++i) conn.append({"GET", fmt::format("p{}", i)});
  EXPECT_EQ(conn.pending(), 20u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(conn.read_reply().str(), "OK");
  for (int i = 0; i < 10; ++i) EXPECT_EQ(conn.read_reply().str(), std::to_string(i * i));
  EXPECT_EQ(conn.pending(), 0u);
  EXPECT_THROW(conn.read_reply(), std::logic_error);
}

TEST_F(ConnectionTest, PipelineWithWindowDeliversEveryReplyInOrder) {
  Connection conn(redis_->endpoint());
  std::vector<std::vector<std::string>> sets;
  std::vector<std::vector<std::string>> gets;
  for (int i = 0; i < 500; ++i) {
    sets.push_back({"SET", fmt::format("w{}", i), std::string(i % 37, 'v') + std::to_string(i)});
    gets.push_back({"GET", fmt::format("w{}", i)});
  }
  for (const size_t window : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
    size_t count = 0;
    pipeline(conn, sets, window, [&](size_t index, const Reply& reply) {
      EXPECT_EQ(index, count++);
      EXPECT_EQ(reply.str(), "OK");
    });
    EXPECT_EQ(count, sets.size());
    std::vector<std::string> values;
    pipeline(conn, gets, window,
             [&](size_t, const Reply& reply) { values.emplace_back(reply.str()); });
    ASSERT_EQ(values.size(), gets.size());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(values[i], sets[i][2]);
    EXPECT_EQ(conn.pending(), 0u);
  }
}

TEST_F(ConnectionTest, SelectsTheDatabaseFromTheEndpoint) {
  Connection db3(redis_->endpoint({}, {}, 3));
  db3.command({"SET", "only-in-3", "x"}).expect_ok("SET");
  Connection db0(redis_->endpoint());
  EXPECT_TRUE(db0.command({"GET", "only-in-3"}).is_nil());
  EXPECT_EQ(db3.command({"GET", "only-in-3"}).str(), "x");
  db3.command({"FLUSHDB"});
}

TEST_F(ConnectionTest, OutOfRangeDatabaseIsAReplyError) {
  try {
    Connection conn(redis_->endpoint({}, {}, 999));
    FAIL() << "SELECT 999 should have been refused";
  } catch (const ReplyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("SELECT 999"));
    EXPECT_THAT(e.what(), HasSubstr(redis_->endpoint().describe()));
  }
}

std::string value_text(const ValueReply& reply) {
  return std::string(reply.bytes.get(), reply.size);
}

// get_values reads values straight from the socket: every reply kind, values that contain
// CRLFs and RESP-looking bytes, sizes from empty to many MiB, and more keys than the window.
TEST_F(ConnectionTest, GetValuesReadsEveryKindOfReply) {
  Connection conn(redis_->endpoint());
  std::string big(5 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 11);
  const std::string tricky("$5\r\nhello\r\n-ERR\r\n\0\r", 20);
  conn.command({"SET", "big", big}).expect_ok("SET big");
  conn.command({"SET", "tricky", tricky}).expect_ok("SET tricky");
  conn.command({"SET", "empty", std::string_view{}}).expect_ok("SET empty");
  conn.command({"RPUSH", "list", "x"});
  for (int i = 0; i < 40; ++i) {
    conn.command({"SET", fmt::format("k{}", i), std::string(1000 + i * 97, char('a' + i % 26))});
  }
  std::vector<std::string> keys = {"big", "tricky", "missing", "empty", "list", "big"};
  for (int i = 0; i < 40; ++i) keys.push_back(fmt::format("k{}", i));

  for (const size_t window : {size_t{1}, size_t{3}, size_t{100}}) {
    const std::vector<ValueReply> replies = conn.get_values(keys, window);
    ASSERT_EQ(replies.size(), keys.size());
    EXPECT_EQ(replies[0].kind, ValueReply::Kind::kValue);
    EXPECT_TRUE(value_text(replies[0]) == big);
    EXPECT_EQ(value_text(replies[1]), tricky);
    EXPECT_EQ(replies[2].kind, ValueReply::Kind::kNil);
    EXPECT_EQ(replies[3].kind, ValueReply::Kind::kValue);
    EXPECT_EQ(replies[3].size, 0u);
    EXPECT_EQ(replies[4].kind, ValueReply::Kind::kError);
    EXPECT_THAT(replies[4].error, HasSubstr("WRONGTYPE"));
    EXPECT_TRUE(value_text(replies[5]) == big);
    for (int i = 0; i < 40; ++i) {
      EXPECT_EQ(value_text(replies[6 + i]), std::string(1000 + i * 97, char('a' + i % 26)));
    }
  }
  // hiredis's side of the connection is still in step.
  EXPECT_EQ(conn.command({"PING"}).str(), "PONG");
  EXPECT_EQ(conn.command({"GET", "tricky"}).str(), tricky);
  EXPECT_FALSE(conn.broken());
}

// A GetStream is a sliding window: keys sent in any grouping, more sent while replies are
// owed, each reply taken in the order sent, every kind of reply as get_values gives it.
TEST_F(ConnectionTest, GetStreamSlidesAWindowOfGets) {
  Connection conn(redis_->endpoint());
  for (int i = 0; i < 50; ++i) {
    conn.command({"SET", fmt::format("s{}", i), std::string(500 + i * 311, char('A' + i % 26))});
  }
  conn.command({"RPUSH", "slist", "x"});
  {
    GetStream stream(conn);
    std::vector<std::string> sent;
    size_t received = 0;
    const auto check_next = [&] {
      const ValueReply reply = stream.receive();
      const std::string& key = sent[received++];
      if (key == "nope") {
        EXPECT_EQ(reply.kind, ValueReply::Kind::kNil);
      } else if (key == "slist") {
        EXPECT_EQ(reply.kind, ValueReply::Kind::kError);
      } else {
        const int i = std::stoi(key.substr(1));
        EXPECT_EQ(value_text(reply), std::string(500 + i * 311, char('A' + i % 26))) << key;
      }
    };
    for (int i = 0; i < 50; i += 5) {
      std::vector<std::string> batch;
      for (int j = i; j < i + 5; ++j) batch.push_back(fmt::format("s{}", j));
      if (i == 20) batch.push_back("nope");
      if (i == 30) batch.push_back("slist");
      stream.send(batch);
      sent.insert(sent.end(), batch.begin(), batch.end());
      check_next();  // one reply per batch: the window keeps growing
      check_next();
    }
    EXPECT_EQ(stream.outstanding(), sent.size() - received);
    while (stream.outstanding() > 0) check_next();
    EXPECT_EQ(received, sent.size());
  }
  EXPECT_FALSE(conn.broken());
  EXPECT_EQ(conn.command({"PING"}).str(), "PONG");
  // Dropped with replies still owed: the connection must not be used for anything else.
  {
    GetStream stream(conn);
    const std::vector<std::string> keys = {"s1", "s2"};
    stream.send(keys);
    stream.receive();
  }
  EXPECT_TRUE(conn.broken());
}

// A server that accepts but never answers: a thread waiting on it for a reply is woken by
// interrupt() (the prefetch engine's stop) instead of sitting out the I/O timeout.
TEST(ConnectionInterrupt, WakesAThreadWaitingForAReply) {
  BoundSocket silent;
  ASSERT_EQ(::listen(silent.fd(), 4), 0);
  // Answers the connection's PING, then nothing ever again.
  std::thread server([&] {
    const int client = ::accept(silent.fd(), nullptr, nullptr);
    if (client < 0) return;
    char buffer[256];
    (void)::recv(client, buffer, sizeof buffer, 0);
    (void)::send(client, "+PONG\r\n", 7, MSG_NOSIGNAL);
    (void)::recv(client, buffer, sizeof buffer, 0);  // the GET, unanswered
    (void)::recv(client, buffer, sizeof buffer, 0);  // until the client goes
    ::close(client);
  });
  RedisEndpoint endpoint;
  endpoint.port = silent.port();
  Connection conn(endpoint, ConnectOptions{.connect_timeout = 2s, .io_timeout = 60s});
  GetStream stream(conn);
  const std::vector<std::string> keys = {"a"};
  stream.send(keys);
  std::thread interrupter([&] {
    std::this_thread::sleep_for(100ms);
    conn.interrupt();
  });
  try {
    stream.receive();
    ADD_FAILURE() << "receive() returned although nothing was ever sent back";
  } catch (const ConnectionError& e) {
    // Woken by the interrupt, not by the 60 s I/O timeout running out.
    EXPECT_THAT(e.what(), Not(HasSubstr("I/O timeout")));
  }
  interrupter.join();
  EXPECT_TRUE(conn.broken());
  server.join();
}

TEST_F(ConnectionTest, GetValuesRefusesAConnectionWithRepliesPending) {
  Connection conn(redis_->endpoint());
  conn.append({"PING"});
  const std::vector<std::string> keys = {"a"};
  EXPECT_THROW(conn.get_values(keys, 1), std::logic_error);
  EXPECT_EQ(conn.read_reply().str(), "PONG");
}

TEST_F(ConnectionTest, GetValuesFromAServerThatWentAwayThrowsAndBreaks) {
  TestRedisServer own;
  Connection conn(own.endpoint());
  conn.command({"SET", "a", "1"}).expect_ok("SET");
  own.stop();
  const std::vector<std::string> keys = {"a"};
  try {
    conn.get_values(keys, 1);
    FAIL() << "GET from a stopped server should fail";
  } catch (const ConnectionError& e) {
    EXPECT_THAT(e.what(), HasSubstr(own.endpoint().describe()));
  }
  EXPECT_TRUE(conn.broken());
}

TEST_F(ConnectionTest, ServerGoingAwayBreaksTheConnection) {
  TestRedisServer own;
  Connection conn(own.endpoint());
  EXPECT_EQ(conn.command({"PING"}).str(), "PONG");
  own.stop();
  try {
    conn.command({"PING"});
    FAIL() << "PING to a stopped server should fail";
  } catch (const ConnectionError& e) {
    EXPECT_THAT(e.what(), HasSubstr(own.endpoint().describe()));
  }
  EXPECT_TRUE(conn.broken());
  own.start();
  // Once broken, always broken: the pool replaces such connections.
  EXPECT_THROW(conn.command({"PING"}), ConnectionError);
  EXPECT_THROW(conn.append({"PING"}), ConnectionError);
}

TEST(ConnectionFailureTest, DeadPortIsAConnectionErrorNamingTheEndpoint) {
  RedisEndpoint endpoint;
  endpoint.port = free_tcp_port();
  endpoint.password = "secret-password";
  try {
    Connection conn(endpoint, ConnectOptions{.connect_timeout = 500ms, .io_timeout = 500ms});
    FAIL() << "connecting to a closed port should fail";
  } catch (const ConnectionError& e) {
    EXPECT_THAT(e.what(), HasSubstr(endpoint.describe()));
    EXPECT_THAT(e.what(), Not(HasSubstr("secret-password")));
  }
}

TEST(ConnectionFailureTest, MissingUnixSocketIsAConnectionError) {
  RedisEndpoint endpoint;
  endpoint.transport = RedisEndpoint::Transport::kUnix;
  endpoint.socket_path = "/nonexistent/dsfs/redis.sock";
  try {
    Connection conn(endpoint);
    FAIL() << "connecting to a missing socket should fail";
  } catch (const ConnectionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("/nonexistent/dsfs/redis.sock"));
  }
}

TEST(ConnectionFailureTest, SilentServerTimesOutInsteadOfHanging) {
  // A listening socket that never answers: the kernel completes the handshake, nothing replies.
  BoundSocket silent;
  ASSERT_EQ(::listen(silent.fd(), 4), 0);
  RedisEndpoint endpoint;
  endpoint.port = silent.port();
  try {
    Connection conn(endpoint, ConnectOptions{.connect_timeout = 300ms, .io_timeout = 300ms});
    FAIL() << "a server that never answers should time out";
  } catch (const ConnectionError& e) {
    EXPECT_THAT(e.what(), HasSubstr("I/O timeout of 300 ms"));
  }
}

TEST(ConnectionFailureTest, WritingToAVanishedServerIsAnErrorNotSigpipe) {
  TestRedisServer redis;
  Connection conn(redis.endpoint());
  redis.stop();
  // Megabytes of writes to a closed socket: EPIPE (SIGPIPE would end this test binary).
  const std::string big(32 << 20, 'x');
  EXPECT_THROW(
      {
        for (int i = 0; i < 4; ++i) conn.append({"SET", "k", big});
        while (conn.pending() > 0) conn.read_reply();
      },
      ConnectionError);
  EXPECT_TRUE(conn.broken());
}

class AuthTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    redis_ = std::make_unique<TestRedisServer>(TestRedisOptions{
        .password = "default-secret",
        .extra_args = {"--user", "alice", "on", ">alice-secret", "~*", "&*", "+@all"}});
  }
  static void TearDownTestSuite() { redis_.reset(); }
  static inline std::unique_ptr<TestRedisServer> redis_;
};

TEST_F(AuthTest, PasswordOnlyAuthenticatesTheDefaultUser) {
  Connection conn(redis_->endpoint("", "default-secret"));
  EXPECT_EQ(conn.command({"ACL", "WHOAMI"}).str(), "default");
}

TEST_F(AuthTest, AclUserAuthenticates) {
  Connection conn(redis_->endpoint("alice", "alice-secret"));
  EXPECT_EQ(conn.command({"ACL", "WHOAMI"}).str(), "alice");
}

TEST_F(AuthTest, WrongPasswordIsAReplyErrorWithoutThePassword) {
  try {
    Connection conn(redis_->endpoint("", "wrong-guess"));
    FAIL() << "a wrong password should be refused";
  } catch (const ReplyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("refused the credentials"));
    EXPECT_THAT(e.what(), HasSubstr("127.0.0.1:" + std::to_string(redis_->port())));
    EXPECT_THAT(e.what(), Not(HasSubstr("wrong-guess")));
  }
  EXPECT_THROW(Connection(redis_->endpoint("alice", "default-secret")), ReplyError);
}

TEST_F(AuthTest, MissingPasswordSaysOneIsRequired) {
  try {
    Connection conn(redis_->endpoint());
    FAIL() << "a server with requirepass should refuse an unauthenticated connection";
  } catch (const ReplyError& e) {
    EXPECT_THAT(e.what(), HasSubstr("requires a password"));
    // The safe ways first: a password in the URL shows in `ps` (it once advised only that).
    EXPECT_THAT(e.what(), HasSubstr("--redis-password-file"));
    EXPECT_THAT(e.what(), HasSubstr("DSFS_REDIS_PASSWORD"));
  }
}

class PoolTest : public ::testing::Test {
 protected:
  TestRedisServer redis_;
};

TEST_F(PoolTest, ReturnedConnectionsAreReused) {
  ConnectionPool pool(redis_.endpoint(), 4);
  for (int i = 0; i < 5; ++i) {
    auto lease = pool.acquire();
    EXPECT_EQ(lease->command({"PING"}).str(), "PONG");
  }
  EXPECT_EQ(pool.connects(), 1u);
  {
    auto first = pool.acquire();
    auto second = pool.acquire();
    EXPECT_EQ((*second).command({"PING"}).str(), "PONG");
  }
  EXPECT_EQ(pool.connects(), 2u);
}

TEST_F(PoolTest, AcquireBlocksWhileAllConnectionsAreLent) {
  ConnectionPool pool(redis_.endpoint(), 1);
  std::atomic<bool> acquired{false};
  std::thread waiter;
  {
    auto held = pool.acquire();
    waiter = std::thread([&] {
      auto lease = pool.acquire();
      acquired = true;
    });
    std::this_thread::sleep_for(100ms);
    EXPECT_FALSE(acquired.load());
  }
  waiter.join();
  EXPECT_TRUE(acquired.load());
  EXPECT_EQ(pool.connects(), 1u);
}

TEST_F(PoolTest, ConnectionWithUnreadRepliesIsNotReused) {
  ConnectionPool pool(redis_.endpoint(), 2);
  {
    auto lease = pool.acquire();
    lease->append({"ECHO", "left behind"});
  }
  auto lease = pool.acquire();
  EXPECT_EQ(lease->command({"ECHO", "fresh"}).str(), "fresh");
  EXPECT_EQ(pool.connects(), 2u);
}

TEST_F(PoolTest, BrokenConnectionsAreReplacedAfterRestart) {
  ConnectionPool pool(redis_.endpoint(), 2);
  {
    auto a = pool.acquire();
    auto b = pool.acquire();
    a->command({"SET", "survivor", "1"});
    b->command({"PING"});
  }
  EXPECT_EQ(pool.connects(), 2u);
  redis_.stop();
  redis_.start();
  // The idle connections are dead; a retry loop (Backoff, as Client::run has) gets a working one
  // once the broken one is dropped.
  Backoff backoff(5000ms);
  int attempts = 0;
  std::string pong;
  for (;;) {
    ++attempts;
    try {
      auto lease = pool.acquire();
      pong = std::string(lease->command({"PING"}).str());
      break;
    } catch (const ConnectionError& e) {
      ASSERT_TRUE(backoff.wait()) << "no working connection within 5 s: " << e.what();
    }
  }
  EXPECT_EQ(pong, "PONG");
  EXPECT_EQ(attempts, 2);  // one stale connection, then (idle ones flushed) a fresh one
  EXPECT_EQ(pool.connects(), 3u);
}

TEST_F(PoolTest, FailedConnectDoesNotLeakASlot) {
  RedisEndpoint dead;
  dead.port = free_tcp_port();
  ConnectionPool pool(dead, 1, ConnectOptions{.connect_timeout = 300ms, .io_timeout = 300ms});
  EXPECT_THROW(pool.acquire(), ConnectionError);
  EXPECT_THROW(pool.acquire(), ConnectionError);  // would block forever if the slot leaked
  EXPECT_EQ(pool.connects(), 0u);
}

// The one retry schedule of dsfs: 50 ms doubling, never sleeping past the deadline, and no
// wait at all once it has passed.
TEST(BackoffTest, WaitsWithinTheBudgetThenSaysNo) {
  const auto start = std::chrono::steady_clock::now();
  Backoff backoff(1000ms);
  int waits = 0;
  while (backoff.wait()) ++waits;
  const auto spent = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(backoff.expired());
  EXPECT_GE(spent, 1000ms);
  EXPECT_LT(spent, 5000ms);  // a hang guard, not a timing
  // 50 + 100 + 200 + 400 ms, then what is left of the second: at most five, doubling.
  EXPECT_GE(waits, 1);
  EXPECT_LE(waits, 5);
  const auto after = std::chrono::steady_clock::now();
  EXPECT_FALSE(backoff.wait());
  EXPECT_LT(std::chrono::steady_clock::now() - after, 50ms);  // no sleep once expired

  Backoff none(0ms);
  EXPECT_TRUE(none.expired());
  EXPECT_FALSE(none.wait());
}

TEST(BackoffTest, ResetStartsAgainFromTheShortestStep) {
  Backoff backoff(10000ms);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(backoff.wait());  // 50 + 100 + 200 + 400 ms
  backoff.reset();
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(backoff.wait());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 700ms);  // 50 ms, not the next 800
}

}  // namespace
}  // namespace dsfs::store
