// dsfs proxy's fault injection: the decisions as pure logic (FaultInjector, the refusal
// windows, option checks), then each fault in the engine between real clients and a real
// redis-server: what the client sees (a reset, a cut reply, a delay, a refused connect) and that
// whatever it does receive is an exact prefix of the server's reply.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "src/cli/common.h"
#include "src/store/connection.h"
#include "src/store/errors.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"
#include "tools/proxy.h"
#include "tools/proxy_command.h"

namespace dsfs::tools {
namespace {

using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using ::testing::HasSubstr;
using Cut = FaultDecision::Cut;

using test::TestRedisOptions;
using test::TestRedisServer;

// ---------------------------------------------------------------- helpers

// Polls `condition` every 10 ms for up to `limit` (a bound against hangs, not a timing check).
bool eventually(const std::function<bool()>& condition, std::chrono::milliseconds limit = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

SocketAddress tcp_address(int port) {
  SocketAddress address;
  address.host = "127.0.0.1";
  address.port = port;
  return address;
}

ProxyOptions faulty_proxy_to(const TestRedisServer& redis, FaultOptions faults) {
  ProxyOptions options;
  options.listen = tcp_address(0);
  if (redis.port() == 0) {
    options.upstream.kind = SocketAddress::Kind::kUnix;
    options.upstream.path = redis.socket_path().string();
  } else {
    options.upstream = tcp_address(redis.port());
  }
  options.rtt = 0ns;
  faults.seed = faults.seed != 0 ? faults.seed : 42;
  options.faults = faults;
  return options;
}

store::RedisEndpoint endpoint_of(const SocketAddress& address) {
  store::RedisEndpoint endpoint;
  if (address.kind == SocketAddress::Kind::kUnix) {
    endpoint.transport = store::RedisEndpoint::Transport::kUnix;
    endpoint.socket_path = address.path;
  } else {
    endpoint.host = address.host;
    endpoint.port = address.port;
  }
  return endpoint;
}

// connect(2) to `address`; returns the fd, or -errno.
int connect_to(const SocketAddress& address) {
  sockaddr_storage storage{};
  socklen_t length = 0;
  if (address.kind == SocketAddress::Kind::kUnix) {
    auto* un = reinterpret_cast<sockaddr_un*>(&storage);
    un->sun_family = AF_UNIX;
    std::strncpy(un->sun_path, address.path.c_str(), sizeof un->sun_path - 1);
    length = sizeof(sockaddr_un);
  } else {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(address.port));
    in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    length = sizeof(sockaddr_in);
  }
  const int fd = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
    const int error = errno;
    ::close(fd);
    return -error;
  }
  return fd;
}

// A plain blocking client socket: sees exactly what the proxy delivers, and how it ends.
class RawClient {
 public:
  explicit RawClient(const SocketAddress& address) : fd_(connect_to(address)) {
    if (fd_ < 0) {
      throw std::runtime_error("cannot connect to " + address.describe() + ": " +
                               std::strerror(-fd_));
    }
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  void send_all(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << std::strerror(errno);
      data.remove_prefix(static_cast<size_t>(n));
    }
  }

  struct Received {
    std::string data;
    bool ended = false;  // EOF or an error
    int error = 0;       // errno of the error that ended it (0: EOF, or not ended)
  };
  // Reads until `bytes` have come, the connection ends, or `limit` passes.
  Received receive(size_t bytes, std::chrono::milliseconds limit = 10s) {
    Received received;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (received.data.size() < bytes) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms) break;
      pollfd waiting{fd_, POLLIN, 0};
      if (::poll(&waiting, 1, static_cast<int>(left.count())) <= 0) break;
      char buffer[65536];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) {
        received.ended = true;
        received.error = n < 0 ? errno : 0;
        break;
      }
      received.data.append(buffer, static_cast<size_t>(n));
    }
    return received;
  }

 private:
  int fd_;
};

std::string resp_get(std::string_view key) {
  return "*2\r\n$3\r\nGET\r\n$" + std::to_string(key.size()) + "\r\n" + std::string(key) + "\r\n";
}

// A value no two offsets of which look alike, so a shifted or repeated byte shows.
std::string distinct_bytes(size_t size, uint64_t seed) {
  std::string bytes(size, '\0');
  std::mt19937_64 random(seed);
  for (char& byte : bytes) byte = static_cast<char>(random());
  return bytes;
}

std::string bulk_reply(const std::string& value) {
  return "$" + std::to_string(value.size()) + "\r\n" + value + "\r\n";
}

// ---------------------------------------------------------------- pure logic

TEST(FaultInjector, NoFaultsConfiguredNeverFaults) {
  FaultInjector injector(FaultOptions{}, 1);
  for (uint64_t i = 0; i < 10000; ++i) {
    const FaultDecision decision = injector.on_chunk(i % 2 == 0, i * 1000, 1000);
    ASSERT_EQ(decision.cut, Cut::kNone);
    ASSERT_FALSE(decision.stall);
  }
  EXPECT_FALSE(FaultOptions{}.any());
}

TEST(FaultInjector, ResetAfterBytesCutsEachConnectionAtExactlyThatOffset) {
  FaultOptions options;
  options.reset_after_bytes = 250;
  FaultInjector injector(options, 1);
  EXPECT_EQ(injector.on_chunk(true, 0, 100).cut, Cut::kNone);
  EXPECT_EQ(injector.on_chunk(true, 150, 100).cut, Cut::kNone);  // ends exactly at 250
  const FaultDecision cut = injector.on_chunk(true, 200, 100);
  EXPECT_EQ(cut.cut, Cut::kReset);
  EXPECT_EQ(cut.keep, 50u);
  EXPECT_EQ(injector.on_chunk(true, 250, 10).keep, 0u);
  // Requests are not counted: the limit is on bytes sent to the client.
  EXPECT_EQ(injector.on_chunk(false, 200, 100).cut, Cut::kNone);
}

TEST(FaultInjector, CertainFaultsAlwaysHitAndTruncateOnlyCutsReplies) {
  FaultOptions resets;
  resets.reset_probability = 1;
  FaultInjector reset(resets, 7);
  FaultOptions truncates;
  truncates.truncate_probability = 1;
  FaultInjector truncate(truncates, 7);
  for (size_t bytes : {size_t{1}, size_t{2}, size_t{1000}, size_t{512} << 10}) {
    for (const bool to_client : {false, true}) {
      const FaultDecision r = reset.on_chunk(to_client, 0, bytes);
      EXPECT_EQ(r.cut, Cut::kReset);
      EXPECT_LT(r.keep, bytes);  // at least the last byte is lost
      const FaultDecision t = truncate.on_chunk(to_client, 0, bytes);
      EXPECT_EQ(t.cut, to_client ? Cut::kTruncate : Cut::kNone);
      if (to_client) {
        EXPECT_LT(t.keep, bytes);
      }
    }
  }
}

TEST(FaultInjector, FaultsHappenAboutAsOftenAsAskedAndASeedRepeatsThem) {
  FaultOptions options;
  options.reset_probability = 0.02;
  options.truncate_probability = 0.05;
  options.stall_probability = 0.1;
  options.stall = 100ms;
  const auto run = [&](uint64_t seed) {
    FaultInjector injector(options, seed);
    std::vector<int> outcomes;
    for (int i = 0; i < 20000; ++i) {
      const FaultDecision d = injector.on_chunk(true, 0, 4096);
      outcomes.push_back(static_cast<int>(d.cut) * 2 + (d.stall ? 1 : 0));
    }
    return outcomes;
  };
  const std::vector<int> first = run(99);
  EXPECT_EQ(first, run(99));
  EXPECT_NE(first, run(100));
  int resets = 0;
  int truncations = 0;
  int stalls = 0;
  for (const int outcome : first) {
    resets += outcome / 2 == static_cast<int>(Cut::kReset);
    truncations += outcome / 2 == static_cast<int>(Cut::kTruncate);
    stalls += outcome % 2;
  }
  // Expected 400, ~950 (a reset wins over a truncation) and 2000: wide bounds, fixed seed.
  EXPECT_GT(resets, 250);
  EXPECT_LT(resets, 550);
  EXPECT_GT(truncations, 750);
  EXPECT_LT(truncations, 1150);
  EXPECT_GT(stalls, 1700);
  EXPECT_LT(stalls, 2300);
}

TEST(FaultInjector, RefusalWindowsRepeatAtTheirPeriod) {
  FaultOptions options;
  options.refuse_for = 2s;
  options.refuse_every = 10s;
  const FaultInjector injector(options, 1);
  EXPECT_TRUE(injector.refusing(0s));
  EXPECT_TRUE(injector.refusing(1999ms));
  EXPECT_FALSE(injector.refusing(2s));
  EXPECT_FALSE(injector.refusing(9999ms));
  EXPECT_TRUE(injector.refusing(10s));
  EXPECT_TRUE(injector.refusing(31s));
  EXPECT_EQ(injector.next_refuse_change(0s), 2s);
  EXPECT_EQ(injector.next_refuse_change(2s), 10s);
  EXPECT_EQ(injector.next_refuse_change(5s), 10s);
  EXPECT_EQ(injector.next_refuse_change(10s), 12s);

  FaultOptions once;
  once.refuse_for = 3s;
  const FaultInjector first_only(once, 1);
  EXPECT_TRUE(first_only.refusing(2s));
  EXPECT_FALSE(first_only.refusing(3s));
  EXPECT_FALSE(first_only.refusing(100s));
  EXPECT_EQ(first_only.next_refuse_change(1s), 3s);
  EXPECT_EQ(first_only.next_refuse_change(3s), nanoseconds::max());
  EXPECT_EQ(FaultInjector(FaultOptions{}, 1).next_refuse_change(0s), nanoseconds::max());
}

TEST(FaultOptionsCheck, RejectsWhatCannotRunNamingTheOption) {
  const auto error_of = [](const std::function<void(FaultOptions&)>& change) {
    ProxyOptions options;
    options.listen = tcp_address(0);
    options.upstream = tcp_address(6379);
    change(options.faults);
    try {
      validate_proxy_options(options);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(error_of([](FaultOptions& f) { f.reset_probability = 1.5; }),
              HasSubstr("--reset-probability"));
  EXPECT_THAT(error_of([](FaultOptions& f) { f.truncate_probability = -0.1; }),
              HasSubstr("--truncate-probability"));
  EXPECT_THAT(error_of([](FaultOptions& f) { f.stall_probability = 0.1; }),
              HasSubstr("needs --stall"));
  EXPECT_THAT(error_of([](FaultOptions& f) { f.refuse_every = 10s; }),
              HasSubstr("needs --refuse-for"));
  EXPECT_THAT(error_of([](FaultOptions& f) {
                f.refuse_for = 10s;
                f.refuse_every = 10s;
              }),
              HasSubstr("must be shorter than --refuse-every"));
  EXPECT_EQ(error_of([](FaultOptions& f) {
              f.stall_probability = 0.1;
              f.stall = 1s;
              f.refuse_for = 1s;
              f.refuse_every = 5s;
            }),
            "accepted");
}

TEST(ProxyFaultCommand, BadFaultOptionsAreOneLineErrorsNamingTheOption) {
  const auto error_of = [](std::vector<std::string> extra) {
    CLI::App app;
    cli::GlobalOptions global;
    register_proxy_command(app, global);
    std::vector<std::string> args = {
        "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:6379", "--rtt", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    try {
      app.parse(args);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("ran");
  };
  EXPECT_THAT(error_of({"--stall-probability", "0.5"}), HasSubstr("--stall"));
  EXPECT_THAT(error_of({"--reset-probability", "2"}), HasSubstr("--reset-probability"));
  EXPECT_THAT(error_of({"--stall", "5", "--stall-probability", "0.5"}), HasSubstr("--stall"));
  EXPECT_THAT(error_of({"--refuse-every", "1s", "--refuse-for", "2s"}),
              HasSubstr("--refuse-every"));
}

// ---------------------------------------------------------------- the engine, real Redis

TEST(ProxyFaults, ResetAfterBytesDeliversExactlyThoseBytesThenResets) {
  TestRedisServer redis;
  store::Connection direct(redis.endpoint());
  const std::string value = distinct_bytes(200000, 1);
  direct.command({"SET", "big", value});
  FaultOptions faults;
  faults.reset_after_bytes = 4000;  // within any loopback window: nothing is left unsent
  BackgroundProxy proxy(faulty_proxy_to(redis, faults));

  RawClient client(proxy.address());
  client.send_all(resp_get("big"));
  const RawClient::Received received = client.receive(SIZE_MAX);
  ASSERT_TRUE(received.ended);
  EXPECT_EQ(received.error, ECONNRESET);
  EXPECT_EQ(received.data, bulk_reply(value).substr(0, 4000));
  EXPECT_EQ(proxy.proxy().stats().bytes_to_client, 4000u);
  EXPECT_EQ(proxy.proxy().stats().fault_resets, 1u);
  // The next connection gets its own 4000 bytes.
  RawClient again(proxy.address());
  again.send_all(resp_get("big"));
  EXPECT_EQ(again.receive(SIZE_MAX).data, bulk_reply(value).substr(0, 4000));
  EXPECT_TRUE(eventually([&] { return proxy.proxy().stats().fault_resets == 2; }));
}

TEST(ProxyFaults, TruncatedReplyIsAPrefixThenEndOfStream) {
  TestRedisServer redis;
  store::Connection direct(redis.endpoint());
  const std::string value = distinct_bytes(1 << 20, 2);
  direct.command({"SET", "big", value});
  FaultOptions faults;
  faults.truncate_probability = 1;
  BackgroundProxy proxy(faulty_proxy_to(redis, faults));

  RawClient client(proxy.address());
  client.send_all(resp_get("big"));
  const RawClient::Received received = client.receive(SIZE_MAX);
  ASSERT_TRUE(received.ended);
  EXPECT_EQ(received.error, 0) << "a truncation closes normally, not with a reset";
  const std::string reply = bulk_reply(value);
  ASSERT_LT(received.data.size(), reply.size());
  EXPECT_TRUE(reply.starts_with(received.data)) << "the bytes delivered must be a prefix";
  EXPECT_TRUE(eventually([&] { return proxy.proxy().stats().fault_truncations == 1; }));
}

TEST(ProxyFaults, RandomCutsOnlyEverDeliverAPrefixOfTheReply) {
  TestRedisServer redis;
  store::Connection direct(redis.endpoint());
  const std::string value = distinct_bytes(3 << 20, 3);
  direct.command({"SET", "big", value});
  const std::string reply = bulk_reply(value);
  FaultOptions faults;
  faults.reset_probability = 0.1;
  faults.truncate_probability = 0.1;
  faults.stall_probability = 0.05;
  faults.stall = 20ms;
  BackgroundProxy proxy(faulty_proxy_to(redis, faults));

  int complete = 0;
  int cut = 0;
  for (int i = 0; i < 40; ++i) {
    RawClient client(proxy.address());
    client.send_all(resp_get("big"));
    const RawClient::Received received = client.receive(reply.size());
    ASSERT_TRUE(reply.starts_with(received.data)) << "attempt " << i;
    if (received.data.size() == reply.size()) {
      ++complete;
    } else {
      ASSERT_TRUE(received.ended) << "attempt " << i << ": neither complete nor ended";
      EXPECT_TRUE(received.error == 0 || received.error == ECONNRESET) << received.error;
      ++cut;
    }
  }
  EXPECT_GT(cut, 0);
  const ProxyStats stats = proxy.proxy().stats();
  EXPECT_GT(stats.fault_resets + stats.fault_truncations, 0u);
  std::printf("random cuts: %d complete, %d cut; %llu resets, %llu truncations, %llu stalls\n",
              complete, cut, static_cast<unsigned long long>(stats.fault_resets),
              static_cast<unsigned long long>(stats.fault_truncations),
              static_cast<unsigned long long>(stats.fault_stalls));
}

TEST(ProxyFaults, ResetIsAConnectionErrorForTheRedisClient) {
  TestRedisServer redis;
  FaultOptions faults;
  faults.reset_probability = 1;
  BackgroundProxy proxy(faulty_proxy_to(redis, faults));
  // The client's first command (or the connect's handshake) hits the reset.
  EXPECT_THROW(
      {
        store::Connection through(endpoint_of(proxy.address()));
        through.command({"PING"});
      },
      store::ConnectionError);
  EXPECT_TRUE(eventually([&] { return proxy.proxy().stats().fault_resets >= 1; }));
}

TEST(ProxyFaults, StallDelaysTheReplyByAtLeastTheStallAndKeepsItIntact) {
  TestRedisServer redis;
  store::Connection direct(redis.endpoint());
  direct.command({"SET", "k", "value"});
  FaultOptions faults;
  faults.stall_probability = 1;
  faults.stall = 300ms;
  BackgroundProxy proxy(faulty_proxy_to(redis, faults));
  store::Connection through(endpoint_of(proxy.address()));
  const auto began = std::chrono::steady_clock::now();
  EXPECT_EQ(through.command({"GET", "k"}).str(), "value");
  EXPECT_GE(std::chrono::steady_clock::now() - began, 300ms);  // a lower bound on the fault
  EXPECT_GE(proxy.proxy().stats().fault_stalls, 2u);           // the request and the reply
}

void expect_refused_then_accepted(const TestRedisServer& redis, SocketAddress listen) {
  FaultOptions faults;
  faults.refuse_for = 1500ms;
  ProxyOptions options = faulty_proxy_to(redis, faults);
  options.listen = std::move(listen);
  BackgroundProxy proxy(options);
  ASSERT_TRUE(eventually([&] { return proxy.proxy().stats().refusing; }));
  const int refused = connect_to(proxy.address());
  if (refused >= 0) ::close(refused);
  EXPECT_EQ(refused, -ECONNREFUSED) << std::strerror(refused < 0 ? -refused : 0);
  EXPECT_EQ(proxy.proxy().stats().refuse_windows, 1u);
  // After the window it listens again at the same address and serves.
  ASSERT_TRUE(eventually([&] { return !proxy.proxy().stats().refusing; }));
  store::Connection through(endpoint_of(proxy.address()));
  EXPECT_EQ(through.command({"PING"}).str(), "PONG");
  EXPECT_EQ(proxy.proxy().stats().refuse_windows, 1u);
}

TEST(ProxyFaults, RefusesConnectsDuringTheWindowThenAcceptsOnTheSamePort) {
  TestRedisServer redis;
  expect_refused_then_accepted(redis, tcp_address(0));
}

TEST(ProxyFaults, RefusesConnectsOnAUnixSocketThenAcceptsAgain) {
  TestRedisServer redis;
  test::TempDir dir;
  SocketAddress listen;
  listen.kind = SocketAddress::Kind::kUnix;
  listen.path = (dir.path() / "proxy.sock").string();
  expect_refused_then_accepted(redis, listen);
}

TEST(ProxyFaults, RepeatedRefusalWindowsLeaveOpenConnectionsAlone) {
  TestRedisServer redis;
  FaultOptions faults;
  faults.refuse_for = 200ms;
  faults.refuse_every = 400ms;
  BackgroundProxy proxy(faulty_proxy_to(redis, faults));
  ASSERT_TRUE(eventually([&] {
    const ProxyStats stats = proxy.proxy().stats();
    return stats.refuse_windows >= 1 && !stats.refusing;
  }));
  store::Connection through(endpoint_of(proxy.address()));
  ASSERT_TRUE(eventually([&] { return proxy.proxy().stats().refuse_windows >= 3; }));
  EXPECT_EQ(through.command({"PING"}).str(), "PONG");
}

}  // namespace
}  // namespace dsfs::tools
