// dsfs proxy: the parsers and the link arithmetic as pure logic, then the engine in-process
// between real clients and a real redis-server (or a small echo server for half-close).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
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

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;

using test::pattern_bytes;
using test::TempDir;
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

SocketAddress unix_address(const fs::path& path) {
  SocketAddress address;
  address.kind = SocketAddress::Kind::kUnix;
  address.path = path.string();
  return address;
}

ProxyOptions proxy_to(const SocketAddress& upstream, nanoseconds rtt) {
  ProxyOptions options;
  options.listen = tcp_address(0);
  options.upstream = upstream;
  options.rtt = rtt;
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

// Clients connected to `redis`, not counting the one asking.
long long other_clients(store::Connection& direct) {
  const store::Reply list = direct.command({"CLIENT", "LIST"});
  const std::string_view text = list.str();
  return static_cast<long long>(std::count(text.begin(), text.end(), '\n')) - 1;
}

// A plain blocking socket, for what hiredis hides: EOF, half-close.
class RawSocket {
 public:
  explicit RawSocket(const SocketAddress& address) {
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
    fd_ = ::socket(storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&storage), length) != 0) {
      const int error = errno;
      if (fd_ >= 0) ::close(fd_);
      throw std::runtime_error("cannot connect to " + address.describe() + ": " +
                               std::strerror(error));
    }
  }
  ~RawSocket() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawSocket(const RawSocket&) = delete;
  RawSocket& operator=(const RawSocket&) = delete;

  void send_all(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << std::strerror(errno);
      data.remove_prefix(static_cast<size_t>(n));
    }
  }
  void shutdown_writes() { ::shutdown(fd_, SHUT_WR); }

  struct Received {
    std::string data;
    bool closed = false;  // EOF or a reset
  };
  // Reads until `bytes` have come, the peer closes, or `limit` passes.
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
        received.closed = true;
        break;
      }
      received.data.append(buffer, static_cast<size_t>(n));
    }
    return received;
  }
  // Waits for EOF (or a reset), discarding data.
  bool closed_within(std::chrono::milliseconds limit = 10s) {
    return receive(SIZE_MAX, limit).closed;
  }

 private:
  int fd_ = -1;
};

// Accepts one connection at a time, reads until EOF, then sends everything back and closes:
// the half-close a proxy must pass on in both directions.
class EchoAfterEofServer {
 public:
  EchoAfterEofServer() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        ::listen(listener_, 16) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      throw std::runtime_error("cannot start the echo server");
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~EchoAfterEofServer() {
    stopping_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  EchoAfterEofServer(const EchoAfterEofServer&) = delete;
  EchoAfterEofServer& operator=(const EchoAfterEofServer&) = delete;

  int port() const { return port_; }
  size_t echoed() const { return echoed_; }

 private:
  void serve() {
    while (!stopping_) {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      std::string data;
      char buffer[65536];
      ssize_t n = 0;
      while ((n = ::recv(client, buffer, sizeof buffer, 0)) > 0) {
        data.append(buffer, static_cast<size_t>(n));
      }
      for (size_t sent = 0; sent < data.size();) {
        const ssize_t written =
            ::send(client, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
        if (written <= 0) break;
        sent += static_cast<size_t>(written);
      }
      echoed_ += data.size();
      ::close(client);
    }
  }

  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> echoed_{0};
  std::thread thread_;
};

// ---------------------------------------------------------------- parsers

TEST(ProxyParse, Durations) {
  EXPECT_EQ(parse_duration("100ms"), 100ms);
  EXPECT_EQ(parse_duration("0.5s"), 500ms);
  EXPECT_EQ(parse_duration("250us"), 250us);
  EXPECT_EQ(parse_duration("1500ns"), 1500ns);
  EXPECT_EQ(parse_duration("2s"), 2s);
  EXPECT_EQ(parse_duration("0"), 0ns);
  EXPECT_EQ(parse_duration("0ms"), 0ns);
  EXPECT_EQ(parse_duration(".25ms"), 250us);
  for (const char* bad : {"", "-5ms", "5", "ms", "abc", "5 ms", "5min", "2h", "1e3ms", "5ms5",
                          "1.2.3ms", "7200s", "+5ms"}) {
    EXPECT_THROW(parse_duration(bad), std::invalid_argument) << bad;
  }
  try {
    parse_duration("-5ms");
    FAIL() << "a negative duration was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("-5ms"), HasSubstr("negative")));
  }
  try {
    parse_duration("10");
    FAIL() << "a duration without a unit was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("unit"));
  }
}

TEST(ProxyParse, Rates) {
  EXPECT_DOUBLE_EQ(parse_rate("100mbit"), 12.5e6);
  EXPECT_DOUBLE_EQ(parse_rate("1gbit"), 125e6);
  EXPECT_DOUBLE_EQ(parse_rate("1Gbit"), 125e6);
  EXPECT_DOUBLE_EQ(parse_rate("500kbit"), 62500);
  EXPECT_DOUBLE_EQ(parse_rate("8bit"), 1);
  EXPECT_DOUBLE_EQ(parse_rate("10MB"), 10e6);
  EXPECT_DOUBLE_EQ(parse_rate("10MB/s"), 10e6);
  EXPECT_DOUBLE_EQ(parse_rate("64MiB"), 64.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_rate("1.5GB"), 1.5e9);
  EXPECT_DOUBLE_EQ(parse_rate("0"), 0);  // unlimited
  for (const char* bad :
       {"", "-1mbit", "100", "100mbps", "100Mb", "100mb", "fast", "mbit", "1bit", "10 MB"}) {
    EXPECT_THROW(parse_rate(bad), std::invalid_argument) << bad;
  }
  try {
    parse_rate("100mbps");
    FAIL() << "an ambiguous unit was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("100mbps"), HasSubstr("ambiguous")));
  }
}

TEST(ProxyParse, Addresses) {
  SocketAddress address = parse_socket_address("127.0.0.1:7000");
  EXPECT_EQ(address.kind, SocketAddress::Kind::kTcp);
  EXPECT_EQ(address.host, "127.0.0.1");
  EXPECT_EQ(address.port, 7000);

  address = parse_socket_address("localhost:0");
  EXPECT_EQ(address.host, "localhost");
  EXPECT_EQ(address.port, 0);

  address = parse_socket_address("[::1]:6379");
  EXPECT_EQ(address.host, "::1");
  EXPECT_EQ(address.port, 6379);
  EXPECT_EQ(address.describe(), "[::1]:6379");

  address = parse_socket_address("unix:/tmp/dsfs proxy.sock");
  EXPECT_EQ(address.kind, SocketAddress::Kind::kUnix);
  EXPECT_EQ(address.path, "/tmp/dsfs proxy.sock");
  EXPECT_EQ(address.describe(), "unix:/tmp/dsfs proxy.sock");
  EXPECT_EQ(parse_socket_address("unix:///run/redis.sock").path, "/run/redis.sock");

  for (const char* text : {"127.0.0.1:7000", "[fe80::1]:1", "unix:/x.sock", "h:65535"}) {
    EXPECT_EQ(parse_socket_address(parse_socket_address(text).describe()),
              parse_socket_address(text));
  }
  for (const std::string& bad :
       {std::string(""), std::string("7000"), std::string("127.0.0.1"), std::string("::1:7000"),
        std::string("host:99999"), std::string("host:-1"), std::string("host:abc"),
        std::string("host:"), std::string(":7000"), std::string("unix:"), std::string("[::1]7000"),
        std::string("[::1:7000"), std::string("[]:7000"), "unix:/" + std::string(200, 'x')}) {
    EXPECT_THROW(parse_socket_address(bad), std::invalid_argument) << bad;
  }
  try {
    parse_socket_address("nonsense");
    FAIL() << "an address without a port was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("nonsense"), HasSubstr("HOST:PORT")));
  }
}

TEST(ProxyParse, Formats) {
  EXPECT_EQ(format_duration(0ns), "0");
  EXPECT_EQ(format_duration(100ms), "100ms");
  EXPECT_EQ(format_duration(1500ms), "1.5s");
  EXPECT_EQ(format_duration(250us), "250us");
  EXPECT_EQ(format_rate(0), "unlimited");
  EXPECT_EQ(format_rate(parse_rate("1gbit")), "1gbit");
  EXPECT_EQ(format_rate(parse_rate("10MB")), "80mbit");
  EXPECT_EQ(format_rate(parse_rate("500kbit")), "500kbit");
  for (const char* text : {"100ms", "250us", "1.5s"}) {
    EXPECT_EQ(format_duration(parse_duration(text)), text);
  }
}

TEST(ProxyParse, OptionsAreValidated) {
  ProxyOptions options = proxy_to(tcp_address(6379), 10ms);
  EXPECT_NO_THROW(validate_proxy_options(options));
  options.jitter = 20ms;
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
  options.jitter = 10ms;
  EXPECT_NO_THROW(validate_proxy_options(options));
  options.rtt = -1ms;
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
  options = proxy_to(tcp_address(0), 10ms);  // upstream port 0
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
  options = proxy_to(tcp_address(6379), 10ms);
  options.rate_bytes_per_second = -1;
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
  options.rate_bytes_per_second = 0;
  options.max_queued_bytes = 100;
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
  EXPECT_THROW(LatencyProxy{options}, std::invalid_argument);
  options = proxy_to(tcp_address(6379), 10ms);
  options.threads = 0;
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
  options.threads = 4;
  EXPECT_NO_THROW(validate_proxy_options(options));
  options.rate_bytes_per_second = parse_rate("1gbit");  // one link shared by every connection
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
  options.rate_bytes_per_second = 0;
  options.faults.truncate_probability = 0.1;  // one seeded sequence of decisions
  EXPECT_THROW(validate_proxy_options(options), std::invalid_argument);
}

// ---------------------------------------------------------------- the link arithmetic

TEST(EmulatedLink, DelaysByHalfTheRtt) {
  ProxyOptions options = proxy_to(tcp_address(1), 100ms);
  EmulatedLink link(options, 1);
  const auto t0 = ProxyClock::time_point{} + 1h;
  ProxyClock::time_point previous{};
  std::vector<std::pair<size_t, ProxyClock::time_point>> pieces;
  link.schedule(t0, 300000, previous,
                [&](size_t bytes, auto release) { pieces.emplace_back(bytes, release); });
  ASSERT_EQ(pieces.size(), 1u);  // no rate: all at once
  EXPECT_EQ(pieces[0].first, 300000u);
  EXPECT_EQ(pieces[0].second, t0 + 50ms);
  EXPECT_EQ(previous, t0 + 50ms);
  EXPECT_EQ(link.schedule_end(t0 + 1ms, previous), t0 + 51ms);
}

TEST(EmulatedLink, JitterStaysInBoundsAndNeverReorders) {
  ProxyOptions options = proxy_to(tcp_address(1), 100ms);
  options.jitter = 20ms;
  EmulatedLink link(options, 42);
  const auto t0 = ProxyClock::time_point{} + 1h;
  ProxyClock::time_point previous{};
  std::set<int64_t> distinct_delays;
  for (int i = 0; i < 2000; ++i) {
    const auto arrival = t0 + i * 100us;
    const auto before = previous;
    link.schedule(arrival, 100, previous, [&](size_t, ProxyClock::time_point release) {
      EXPECT_GE(release, before) << "reordered at " << i;
      EXPECT_LE(release, arrival + 60ms) << i;
      EXPECT_GE(release, arrival + 40ms) << i;
      distinct_delays.insert((release - arrival).count());
    });
  }
  EXPECT_GT(distinct_delays.size(), 100u) << "the jitter does not vary the delay";
}

TEST(EmulatedLink, RateSerializesBytesAcrossConnections) {
  ProxyOptions options = proxy_to(tcp_address(1), 0ms);
  options.rate_bytes_per_second = parse_rate("1MB");  // 1 byte per microsecond
  EmulatedLink link(options, 1);
  const auto t0 = ProxyClock::time_point{} + 1h;
  ProxyClock::time_point first{};
  ProxyClock::time_point second{};
  size_t total = 0;
  size_t pieces = 0;
  ProxyClock::time_point last{};
  link.schedule(t0, 10000, first, [&](size_t bytes, ProxyClock::time_point release) {
    total += bytes;
    ++pieces;
    EXPECT_LE(bytes, 1500u);  // trickles out instead of one 10 ms burst
    EXPECT_GT(release, last);
    last = release;
  });
  EXPECT_EQ(total, 10000u);
  EXPECT_GT(pieces, 1u);
  EXPECT_EQ(first, t0 + 10ms);
  // Another connection's bytes arriving at the same time queue behind them on the link.
  link.schedule(t0, 10000, second, [](size_t, ProxyClock::time_point) {});
  EXPECT_EQ(second, t0 + 20ms);
  // An idle link sends at once again.
  link.schedule(t0 + 1s, 1000, first, [](size_t, ProxyClock::time_point) {});
  EXPECT_EQ(first, t0 + 1s + 1ms);
}

TEST(EmulatedLink, RateAndDelayAdd) {
  ProxyOptions options = proxy_to(tcp_address(1), 20ms);
  options.rate_bytes_per_second = parse_rate("8mbit");  // 1 byte per microsecond
  EmulatedLink link(options, 1);
  const auto t0 = ProxyClock::time_point{} + 1h;
  ProxyClock::time_point previous{};
  link.schedule(t0, 5000, previous, [](size_t, ProxyClock::time_point) {});
  EXPECT_EQ(previous, t0 + 5ms + 10ms);
  EXPECT_EQ(link.schedule_end(t0, previous), t0 + 15ms);
}

// ---------------------------------------------------------------- through a real Redis

TEST(LatencyProxy, PingTakesAtLeastTheRtt) {
  TestRedisServer redis;
  BackgroundProxy proxy(proxy_to(tcp_address(redis.port()), 50ms));
  EXPECT_NE(proxy.address().port, 0);
  store::Connection client(endpoint_of(proxy.address()));
  EXPECT_EQ(client.command({"PING"}).str(), "PONG");  // also pays the emulated handshake
  const auto start = std::chrono::steady_clock::now();
  const store::Reply pong = client.command({"PING"});
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(pong.str(), "PONG");
  EXPECT_GE(elapsed, 50ms);  // a lower bound on the injected delay, as tests/README.md allows
  EXPECT_GE(proxy.proxy().stats().releases, 2u);
}

TEST(LatencyProxy, WorksAtZeroRtt) {
  TestRedisServer redis;
  BackgroundProxy proxy(proxy_to(tcp_address(redis.port()), 0ms));
  store::Connection client(endpoint_of(proxy.address()));
  EXPECT_EQ(client.command({"PING"}).str(), "PONG");
  client.command({"SET", "greeting", "hello"}).expect_ok("SET");
  EXPECT_EQ(client.command({"GET", "greeting"}).str(), "hello");
  EXPECT_EQ(proxy.proxy().stats().connections_open, 1u);
}

void expect_large_value_intact(ProxyOptions options) {
  BackgroundProxy proxy(std::move(options));
  const std::string value = pattern_bytes(size_t{64} << 20, 7);
  store::Connection client(endpoint_of(proxy.address()));
  client.command({"SET", "big", value}).expect_ok("SET big");
  const store::Reply reply = client.command({"GET", "big"});
  ASSERT_TRUE(reply.is_string());
  ASSERT_EQ(reply.str().size(), value.size());
  EXPECT_TRUE(reply.str() == value) << "the 64 MiB value came back different";
  const ProxyStats stats = proxy.proxy().stats();
  EXPECT_GT(stats.bytes_to_upstream, value.size());
  EXPECT_GT(stats.bytes_to_client, value.size());
  EXPECT_EQ(stats.bytes_queued, 0u);
}

TEST(LatencyProxy, LargeValueArrivesIntact) {
  TestRedisServer redis;
  expect_large_value_intact(proxy_to(tcp_address(redis.port()), 0ms));
}

TEST(LatencyProxy, LargeValueArrivesIntactThroughASmallQueue) {
  // A 256 KiB bound per direction: reading stops and resumes hundreds of times.
  TestRedisServer redis;
  ProxyOptions options = proxy_to(tcp_address(redis.port()), 2ms);
  options.max_queued_bytes = size_t{256} << 10;
  expect_large_value_intact(options);
}

TEST(LatencyProxy, RateLimitedLinkDeliversIntact) {
  TestRedisServer redis;
  ProxyOptions options = proxy_to(tcp_address(redis.port()), 1ms);
  options.rate_bytes_per_second = parse_rate("200mbit");
  BackgroundProxy proxy(options);
  const std::string value = pattern_bytes(size_t{2} << 20, 3);
  store::Connection client(endpoint_of(proxy.address()));
  client.command({"SET", "v", value}).expect_ok("SET");
  EXPECT_TRUE(client.command({"GET", "v"}).str() == value);
}

TEST(LatencyProxy, PipelinedRepliesComeBackInOrderDespiteJitter) {
  TestRedisServer redis;
  ProxyOptions options = proxy_to(tcp_address(redis.port()), 10ms);
  options.jitter = 10ms;
  BackgroundProxy proxy(options);
  store::Connection client(endpoint_of(proxy.address()));
  constexpr int kCommands = 300;
  std::vector<std::string> payloads;
  for (int i = 0; i < kCommands; ++i) {
    payloads.push_back(
        pattern_bytes(static_cast<size_t>(i) * 331 % 70000 + 1, static_cast<unsigned>(i)));
  }
  for (int i = 0; i < kCommands; ++i) {
    client.append({"INCR", "counter"});
    client.append({"ECHO", payloads[static_cast<size_t>(i)]});
  }
  for (int i = 0; i < kCommands; ++i) {
    EXPECT_EQ(client.read_reply().integer(), i + 1);
    const store::Reply echo = client.read_reply();
    ASSERT_TRUE(echo.str() == payloads[static_cast<size_t>(i)]) << "reply " << i << " out of order";
  }
}

// Threads of this process named proxy-N: the engines beyond the first (which runs on the caller's
// thread).
size_t proxy_engine_threads() {
  size_t count = 0;
  for (const auto& task : fs::directory_iterator("/proc/self/task")) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    if (name.starts_with("proxy-")) ++count;
  }
  return count;
}

void expect_two_hundred_concurrent_connections(size_t proxy_threads) {
  TestRedisServer redis(TestRedisOptions{.extra_args = {"--maxclients", "1000"}});
  ProxyOptions options = proxy_to(tcp_address(redis.port()), 5ms);
  options.threads = proxy_threads;
  BackgroundProxy proxy(options);
  // The other engines run (a proxy ignoring --threads would pass the rest of this test too).
  ASSERT_TRUE(eventually([&] { return proxy_engine_threads() == proxy_threads - 1; }));
  constexpr int kConnections = 200;
  constexpr int kThreads = 4;
  std::vector<std::unique_ptr<store::Connection>> clients;
  for (int i = 0; i < kConnections; ++i) {
    clients.push_back(std::make_unique<store::Connection>(endpoint_of(proxy.address())));
  }
  ASSERT_TRUE(eventually([&] { return proxy.proxy().stats().connections_open == kConnections; }));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        // Every connection of this thread has its commands in flight at once.
        for (int i = t; i < kConnections; i += kThreads) {
          const std::string key = "key:" + std::to_string(i);
          clients[static_cast<size_t>(i)]->append({"SET", key, pattern_bytes(1000, i)});
          clients[static_cast<size_t>(i)]->append({"GET", key});
          clients[static_cast<size_t>(i)]->append({"INCR", "total"});
        }
        for (int i = t; i < kConnections; i += kThreads) {
          store::Connection& c = *clients[static_cast<size_t>(i)];
          if (c.read_reply().str() != "OK") ++failures;
          if (c.read_reply().str() != pattern_bytes(1000, i)) ++failures;
          if (c.read_reply().integer() < 1) ++failures;
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
  store::Connection direct(redis.endpoint());
  EXPECT_EQ(direct.command({"GET", "total"}).str(), std::to_string(kConnections));
  EXPECT_EQ(proxy.proxy().stats().connections_accepted, static_cast<uint64_t>(kConnections));
  clients.clear();
  EXPECT_TRUE(eventually([&] { return proxy.proxy().stats().connections_open == 0; }));
  EXPECT_EQ(proxy.proxy().stats().bytes_queued, 0u);
}

TEST(LatencyProxy, TwoHundredConcurrentConnections) {
  expect_two_hundred_concurrent_connections(1);
}

// With --threads the first engine accepts and hands every connection after it to the next
// engine in turn: three of every four here are served by other threads, whose counters add up
// in one ProxyStats.
TEST(LatencyProxy, TwoHundredConnectionsOverFourThreads) {
  expect_two_hundred_concurrent_connections(4);
}

TEST(LatencyProxy, LargeValuesArriveIntactOverSeveralThreads) {
  TestRedisServer redis;
  ProxyOptions options = proxy_to(tcp_address(redis.port()), 2ms);
  options.threads = 3;
  BackgroundProxy proxy(options);
  const std::string value = pattern_bytes(size_t{8} << 20, 11);
  {
    store::Connection writer(endpoint_of(proxy.address()));
    writer.command({"SET", "big", value}).expect_ok("SET big");
  }
  std::vector<std::unique_ptr<store::Connection>> readers;
  for (int i = 0; i < 6; ++i) {
    readers.push_back(std::make_unique<store::Connection>(endpoint_of(proxy.address())));
    readers.back()->append({"GET", "big"});
  }
  for (auto& reader : readers) EXPECT_TRUE(reader->read_reply().str() == value);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(readers[1]->command({"PING"}).str(), "PONG");
  EXPECT_GE(std::chrono::steady_clock::now() - start, 2ms);  // the delay holds on every thread
  EXPECT_EQ(proxy.proxy().stats().connections_accepted, 7u);
}

TEST(LatencyProxy, ClientCloseClosesTheUpstreamConnection) {
  TestRedisServer redis;
  BackgroundProxy proxy(proxy_to(tcp_address(redis.port()), 5ms));
  store::Connection direct(redis.endpoint());
  ASSERT_EQ(other_clients(direct), 0);
  auto first = std::make_unique<store::Connection>(endpoint_of(proxy.address()));
  auto second = std::make_unique<store::Connection>(endpoint_of(proxy.address()));
  EXPECT_EQ(first->command({"PING"}).str(), "PONG");
  EXPECT_EQ(second->command({"PING"}).str(), "PONG");
  EXPECT_EQ(other_clients(direct), 2);
  first.reset();
  EXPECT_TRUE(eventually([&] { return other_clients(direct) == 1; }))
      << "Redis still sees " << other_clients(direct) << " clients";
  second.reset();
  EXPECT_TRUE(eventually([&] { return other_clients(direct) == 0; }));
  EXPECT_TRUE(eventually([&] { return proxy.proxy().stats().connections_open == 0; }));
}

TEST(LatencyProxy, UpstreamCloseReachesTheClient) {
  TestRedisServer redis;
  BackgroundProxy proxy(proxy_to(tcp_address(redis.port()), 5ms));
  RawSocket client(proxy.address());
  client.send_all("PING\r\n");
  EXPECT_EQ(client.receive(7).data, "+PONG\r\n");
  store::Connection direct(redis.endpoint());
  EXPECT_EQ(direct.command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"}).integer(), 1);
  EXPECT_TRUE(client.closed_within()) << "the client did not see the upstream close";
}

TEST(LatencyProxy, HalfCloseDeliversQueuedBytesThenTheEnd) {
  EchoAfterEofServer echo;
  BackgroundProxy proxy(proxy_to(tcp_address(echo.port()), 20ms));
  RawSocket client(proxy.address());
  const std::string data = pattern_bytes(3 << 20, 11);
  client.send_all(data);
  client.shutdown_writes();  // the echo server answers only once it sees this end
  const RawSocket::Received back = client.receive(SIZE_MAX);
  EXPECT_TRUE(back.closed);
  EXPECT_EQ(back.data.size(), data.size());
  EXPECT_TRUE(back.data == data);
  EXPECT_TRUE(eventually([&] { return proxy.proxy().stats().connections_open == 0; }));
}

TEST(LatencyProxy, UnixSocketsOnBothSides) {
  TestRedisServer redis(TestRedisOptions{.unix_socket = true});
  TempDir dir("dsfs-proxy");
  const fs::path socket_path = dir.path() / "proxy.sock";
  ProxyOptions options;
  options.listen = unix_address(socket_path);
  options.upstream = unix_address(redis.socket_path());
  options.rtt = 2ms;
  {
    BackgroundProxy proxy(options);
    EXPECT_EQ(proxy.address().describe(), "unix:" + socket_path.string());
    store::Connection client(endpoint_of(proxy.address()));
    EXPECT_EQ(client.command({"PING"}).str(), "PONG");
    const std::string value = pattern_bytes(1 << 20, 5);
    client.command({"SET", "v", value}).expect_ok("SET");
    EXPECT_TRUE(client.command({"GET", "v"}).str() == value);
    EXPECT_TRUE(fs::exists(socket_path));
  }
  EXPECT_FALSE(fs::exists(socket_path)) << "the proxy left its socket file behind";
}

TEST(LatencyProxy, UnixListenReplacesOnlyAStaleSocket) {
  TestRedisServer redis;
  TempDir dir("dsfs-proxy");
  const fs::path socket_path = dir.path() / "proxy.sock";
  ProxyOptions options = proxy_to(tcp_address(redis.port()), 0ms);
  options.listen = unix_address(socket_path);
  {
    // A socket file whose owner is gone.
    const int stale = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, socket_path.c_str(), sizeof address.sun_path - 1);
    ASSERT_EQ(::bind(stale, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    ::close(stale);
  }
  {
    BackgroundProxy proxy(options);
    store::Connection client(endpoint_of(proxy.address()));
    EXPECT_EQ(client.command({"PING"}).str(), "PONG");
    // A second proxy on the same path would steal it from a live one: refused.
    try {
      LatencyProxy second(options);
      ADD_FAILURE() << "a second proxy took over a live socket";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("another process is listening"));
    }
  }
  test::write_file(socket_path, "not a socket");
  try {
    LatencyProxy proxy(options);
    ADD_FAILURE() << "a regular file was replaced by a socket";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a socket"));
  }
  EXPECT_EQ(test::read_file(socket_path), "not a socket");
}

TEST(LatencyProxy, ListeningOnATakenPortIsAClearError) {
  test::BoundSocket taken;
  ProxyOptions options = proxy_to(tcp_address(6379), 0ms);
  options.listen = tcp_address(taken.port());
  try {
    LatencyProxy proxy(options);
    ADD_FAILURE() << "listened on a port in use";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("cannot listen on " + options.listen.describe()),
                                HasSubstr("in use")));
  }
}

TEST(LatencyProxy, UpstreamDownClosesTheClientAndKeepsServing) {
  TestRedisServer redis;
  BackgroundProxy proxy(proxy_to(tcp_address(redis.port()), 1ms));
  redis.stop();
  {
    RawSocket client(proxy.address());
    client.send_all("PING\r\n");
    const RawSocket::Received received = client.receive(SIZE_MAX);
    EXPECT_TRUE(received.closed);
    EXPECT_EQ(received.data, "");
  }
  EXPECT_TRUE(eventually([&] { return proxy.proxy().stats().upstream_connect_failures == 1; }));
  redis.start();
  store::Connection client(endpoint_of(proxy.address()));
  EXPECT_EQ(client.command({"PING"}).str(), "PONG");
}

// ---------------------------------------------------------------- the command line

void run_command(std::vector<std::string> args) {
  CLI::App app{"dsfs"};
  cli::GlobalOptions global;
  register_proxy_command(app, global);
  args.insert(args.begin(), "proxy");
  std::reverse(args.begin(), args.end());  // CLI11 takes a vector in reverse order
  app.parse(args);
}

std::string command_error(std::vector<std::string> args) {
  try {
    run_command(std::move(args));
  } catch (const std::invalid_argument& e) {
    return e.what();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ProxyCommand, BadArgumentsAreClearErrors) {
  EXPECT_THAT(
      command_error({"--listen", "nonsense", "--upstream", "127.0.0.1:6379", "--rtt", "10ms"}),
      AllOf(HasSubstr("--listen"), HasSubstr("nonsense"), HasSubstr("HOST:PORT")));
  EXPECT_THAT(
      command_error({"--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:6379", "--rtt", "-5ms"}),
      AllOf(HasSubstr("--rtt"), HasSubstr("negative")));
  EXPECT_THAT(command_error({"--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:6379", "--rtt",
                             "10ms", "--rate", "fast"}),
              AllOf(HasSubstr("--rate"), HasSubstr("fast")));
  EXPECT_THAT(command_error({"--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:6379", "--rtt",
                             "10ms", "--jitter", "20ms"}),
              HasSubstr("--jitter"));
  EXPECT_THAT(
      command_error({"--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:0", "--rtt", "10ms"}),
      HasSubstr("--upstream"));
  EXPECT_THAT(command_error({"--listen", "127.0.0.1:0", "--upstream", "no-such-host.invalid:1",
                             "--rtt", "10ms"}),
              AllOf(HasSubstr("--upstream"), HasSubstr("no-such-host.invalid")));
  EXPECT_THAT(command_error({"--listen", "unix:/tmp/x.sock", "--upstream", "127.0.0.1:6379",
                             "--rtt", "10ms", "--port-file", "/tmp/x.port"}),
              HasSubstr("--port-file"));
  EXPECT_THAT(command_error({"--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:6379", "--rtt",
                             "10ms", "--threads", "2", "--rate", "1gbit"}),
              AllOf(HasSubstr("--threads"), HasSubstr("--rate")));
  EXPECT_THROW(run_command({"--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:6379"}),
               CLI::RequiredError);
}

}  // namespace
}  // namespace dsfs::tools
