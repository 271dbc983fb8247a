#include "tests/unit/support/test_redis.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <thread>

namespace dsfs::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

BoundSocket::BoundSocket() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
  if (fd_ < 0) throw std::runtime_error("socket() failed");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    ::close(fd_);
    throw std::runtime_error("cannot find a free port");
  }
  port_ = ntohs(address.sin_port);
}

BoundSocket::~BoundSocket() {
  ::close(fd_);
}

int free_tcp_port() {
  return BoundSocket().port();
}

namespace {

// Redis 7.0 logs "Ready to accept connections" for TCP but "The server is now ready to accept
// connections at <socket>" when it listens on a unix socket only; 7.2 adds " tcp"/" unix".
bool ready_logged(const std::string& log, size_t offset) {
  return log.find("Ready to accept connections", offset) != std::string::npos ||
         log.find("ready to accept connections at", offset) != std::string::npos;
}

}  // namespace

TestRedisServer::TestRedisServer(TestRedisOptions options)
    : options_(std::move(options)), dir_("dsfs-redis") {
  // A free port can be taken between choosing and binding it (tests run in parallel): pick
  // another one then. Restarts keep the port, so only the first start may move.
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (!options_.unix_socket) port_ = free_tcp_port();
    if (launch()) return;
    if (options_.unix_socket || log_text().find("Address already in use") == std::string::npos) {
      break;
    }
  }
  throw std::runtime_error(with_log("redis-server exited at start"));
}

TestRedisServer::~TestRedisServer() {
  stop();
}

void TestRedisServer::start() {
  if (running()) return;
  if (!launch()) {
    throw std::runtime_error(
        with_log("redis-server exited at restart (port " + std::to_string(port_) + " taken?)"));
  }
}

void TestRedisServer::stop() {
  process_.reset();
}

void TestRedisServer::pause() {
  if (process_) process_->signal(SIGSTOP);
}

void TestRedisServer::resume() {
  if (process_) process_->signal(SIGCONT);
}

void TestRedisServer::restart() {
  stop();
  start();
}

std::string TestRedisServer::log_text() const {
  std::ifstream in(dir() / "redis.log");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string TestRedisServer::with_log(const std::string& what) const {
  // The directory, log included, goes away with this object, so the message carries the log.
  const std::string log = log_text();
  constexpr size_t kTail = 2000;
  return what + "; redis.log ends:\n" + (log.size() > kTail ? log.substr(log.size() - kTail) : log);
}

bool TestRedisServer::launch() {
  std::vector<std::string> args = {"redis-server"};
  if (options_.unix_socket) {
    args.insert(args.end(), {"--port", "0", "--unixsocket", socket_path().string()});
  } else {
    args.insert(args.end(), {"--port", std::to_string(port_), "--bind", "127.0.0.1"});
  }
  args.insert(args.end(),
              {"--save", "", "--dir", dir().string(), "--logfile", (dir() / "redis.log").string()});
  if (options_.persist) {
    args.insert(args.end(), {"--appendonly", "yes", "--appendfsync", "always"});
  } else {
    args.insert(args.end(), {"--appendonly", "no"});
  }
  if (!options_.password.empty()) args.insert(args.end(), {"--requirepass", options_.password});
  args.insert(args.end(), options_.extra_args.begin(), options_.extra_args.end());

  // Restarts append to the same log: only what this run writes counts.
  const size_t log_offset = log_text().size();
  try {
    process_ = std::make_unique<ChildProcess>(std::move(args));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(std::string(e.what()) + " (install Debian's redis-server)");
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < deadline) {
    if (ready_logged(log_text(), log_offset)) return true;
    if (process_->exited()) {
      process_.reset();
      return false;
    }
    std::this_thread::sleep_for(10ms);
  }
  process_.reset();
  throw std::runtime_error(with_log("redis-server did not get ready in 20 s"));
}

store::RedisEndpoint TestRedisServer::endpoint(std::string user, std::string password,
                                               int db) const {
  store::RedisEndpoint endpoint;
  if (options_.unix_socket) {
    endpoint.transport = store::RedisEndpoint::Transport::kUnix;
    endpoint.socket_path = socket_path().string();
  } else {
    endpoint.host = "127.0.0.1";
    endpoint.port = port_;
  }
  endpoint.user = std::move(user);
  endpoint.password = std::move(password);
  endpoint.db = db;
  return endpoint;
}

}  // namespace dsfs::test
