#pragma once
// A real, throwaway redis-server for the unit tests, and loopback TCP port helpers.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "src/store/redis_url.h"
#include "tests/unit/support/child_process.h"
#include "tests/unit/support/files.h"

namespace dsfs::test {

// A loopback TCP socket bound to a port the kernel picked (not listening until the caller says
// so); closing it leaves the port free.
class BoundSocket {
 public:
  BoundSocket();
  ~BoundSocket();
  BoundSocket(const BoundSocket&) = delete;
  BoundSocket& operator=(const BoundSocket&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

// A loopback port nothing listens on right now (another process may take it later).
int free_tcp_port();

// Every field has a default initializer, so designated initializers may name any subset
// (GCC's -Wmissing-field-initializers stays quiet).
struct TestRedisOptions {
  // Listen only on <dir>/redis.sock (no TCP) instead of a free loopback port.
  bool unix_socket = false;
  // An append-only file fsynced on every write, so stop() then start() brings the data back.
  bool persist = false;
  // Non-empty: --requirepass. endpoint() still connects without it unless asked to.
  std::string password{};
  // Appended to the command line, e.g. {"--maxmemory", "2mb"}.
  std::vector<std::string> extra_args{};
};

// redis-server in its own temp directory (data and redis.log), without RDB snapshots. Started
// by the constructor, ready when it returns; the destructor stops it and removes the directory,
// and the server dies with the test binary if that dies first (see ChildProcess).
class TestRedisServer {
 public:
  explicit TestRedisServer(TestRedisOptions options = {});
  ~TestRedisServer();
  TestRedisServer(const TestRedisServer&) = delete;
  TestRedisServer& operator=(const TestRedisServer&) = delete;

  // Starts it again on the same port or socket, in the same directory; a no-op while running.
  void start();
  // SIGTERM and wait until it has exited; a no-op while stopped.
  void stop();
  // stop() then start(): a clean restart (Redis flushes its append-only file on SIGTERM), so
  // with persist every write it acknowledged is there again. Like start() and stop(), it may be
  // called from any thread (one call at a time), e.g. from a hook the code under test runs.
  void restart();
  // SIGSTOP / SIGCONT: a stalled server that still accepts connections (the kernel completes
  // the handshake) but answers nothing. stop() and the destructor work on a paused server too.
  void pause();
  void resume();
  bool running() const { return process_ != nullptr; }

  int port() const { return port_; }  // 0 with unix_socket
  const std::filesystem::path& dir() const { return dir_.path(); }
  std::filesystem::path socket_path() const { return dir() / "redis.sock"; }
  std::string log_text() const;

  // Where it listens; credentials and db only when given, so tests can also try without.
  store::RedisEndpoint endpoint(std::string user = {}, std::string password = {}, int db = 0) const;

 private:
  // Runs redis-server and waits for *its* readiness line in the log (a probe connection could
  // reach another process on the port). False if it exited at once (e.g. the port was taken).
  bool launch();
  // `what` followed by the end of redis.log, for exceptions.
  std::string with_log(const std::string& what) const;

  TestRedisOptions options_;
  TempDir dir_;
  int port_ = 0;
  std::unique_ptr<ChildProcess> process_;
};

}  // namespace dsfs::test
