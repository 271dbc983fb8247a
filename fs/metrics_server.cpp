#include "fs/metrics_server.h"

#include <arpa/inet.h>
#include <fmt/core.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <system_error>
#include <utility>

#include "fs/metrics.h"
#include "src/store/log_text.h"
#include "src/store/thread_name.h"

namespace dsfs::fs {
namespace {

constexpr int kBacklog = 16;
// What a connection with unread input may still send after its answer before it is closed
// (reading it first keeps the kernel from resetting the connection under the answer).
constexpr size_t kMaxDrainBytes = 1 << 20;

std::string host_port(std::string_view host, uint16_t port) {
  return host.find(':') == std::string_view::npos ? fmt::format("{}:{}", host, port)
                                                  : fmt::format("[{}]:{}", host, port);
}

[[noreturn]] void throw_bad_listen(std::string_view text, std::string_view why) {
  throw std::invalid_argument(fmt::format(
      "--metrics-listen '{}': {}; give PORT (served on 127.0.0.1), HOST:PORT or [IPV6]:PORT, "
      "e.g. --metrics-listen 9464 or --metrics-listen 0.0.0.0:9464",
      store::log_text(text), why));
}

// Closes a connection when the answer is done, however it ends.
class Connection {
 public:
  explicit Connection(int fd) : fd_(fd) {}
  ~Connection() { ::close(fd_); }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

 private:
  int fd_;
};

std::string_view reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 431:
      return "Request Header Fields Too Large";
    default:
      return "Internal Server Error";
  }
}

}  // namespace

ListenAddress parse_listen_address(std::string_view text) {
  ListenAddress address;
  std::string_view port = text;
  if (text.empty()) throw_bad_listen(text, "empty");
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close == 1 || close + 1 >= text.size() ||
        text[close + 1] != ':') {
      throw_bad_listen(text, "an IPv6 address is written [ADDRESS]:PORT");
    }
    address.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else if (const size_t colon = text.rfind(':'); colon != std::string_view::npos) {
    if (colon == 0)
      throw_bad_listen(text, "no host before the port (127.0.0.1: this machine only)");
    if (text.substr(0, colon).find(':') != std::string_view::npos) {
      throw_bad_listen(text, "an IPv6 address is written [ADDRESS]:PORT");
    }
    address.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || error != std::errc() || end != port.data() + port.size() || value == 0 ||
      value > 65535) {
    throw_bad_listen(text, "the port must be a number from 1 to 65535");
  }
  address.port = static_cast<uint16_t>(value);
  return address;
}

MetricsListener::MetricsListener(const ListenAddress& address) {
  const std::string where = host_port(address.host, address.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  if (const int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    throw std::runtime_error(fmt::format(
        "--metrics-listen {}: cannot resolve '{}' ({}); give an address of this machine, e.g. "
        "127.0.0.1:{} (nothing was mounted)",
        store::log_text(where), store::log_text(address.host), ::gai_strerror(rc), address.port));
  }
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, &::freeaddrinfo);
  int first_error = 0;
  for (const addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
    // Non-blocking, so accept() never waits for a client that went away after poll().
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      if (first_error == 0) first_error = errno;
      continue;
    }
    // A remount right after an unmount finds the port's old connections in TIME_WAIT; this
    // still refuses a port another socket listens on.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, kBacklog) == 0) {
      fd_ = fd;
    } else {
      if (first_error == 0) first_error = errno;
      ::close(fd);
    }
  }
  if (fd_ < 0) {
    std::string what;
    switch (first_error) {
      case EADDRINUSE:
        what =
            "the port is already in use (another mount or exporter listens there); choose a "
            "free port";
        break;
      case EADDRNOTAVAIL:
        what =
            "this machine has no such address; use 127.0.0.1 (the default), 0.0.0.0 for every "
            "interface, or one of its own addresses";
        break;
      case EACCES:
        what = "ports below 1024 need root; choose a port from 1024 up, e.g. 9464";
        break;
      default:
        what = fmt::format("cannot listen there ({})", std::strerror(first_error));
    }
    throw std::runtime_error(
        fmt::format("--metrics-listen {}: {} (nothing was mounted)", store::log_text(where), what));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  char text[INET6_ADDRSTRLEN] = {};
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
    if (bound.ss_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&bound);
      ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
      port_ = ntohs(in6->sin6_port);
    } else {
      const auto* in4 = reinterpret_cast<const sockaddr_in*>(&bound);
      ::inet_ntop(AF_INET, &in4->sin_addr, text, sizeof text);
      port_ = ntohs(in4->sin_port);
    }
  }
  describe_ = host_port(text[0] != '\0' ? std::string_view(text) : address.host, port_);
}

MetricsListener::~MetricsListener() {
  if (fd_ >= 0) ::close(fd_);
}

MetricsListener::MetricsListener(MetricsListener&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      port_(other.port_),
      describe_(std::move(other.describe_)) {}

MetricsServer::MetricsServer(MetricsListener listener, Render render, MetricsServerOptions options)
    : listener_(std::move(listener)), render_(std::move(render)), options_(options) {
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) {
    throw std::system_error(errno, std::generic_category(),
                            "--metrics-listen: cannot create an eventfd");
  }
  try {
    thread_ = std::thread([this] {
      name_this_thread("metrics-http");
      serve();
    });
  } catch (...) {
    ::close(stop_fd_);
    throw;
  }
  spdlog::info("serving metrics at http://{}/metrics", listener_.describe());
}

MetricsServer::~MetricsServer() {
  const uint64_t one = 1;
  if (::write(stop_fd_, &one, sizeof one) != static_cast<ssize_t>(sizeof one)) {
    spdlog::error("cannot stop the metrics server: {}", std::strerror(errno));
  }
  thread_.join();
  ::close(stop_fd_);
}

void MetricsServer::serve() {
  for (;;) {
    pollfd fds[2] = {{.fd = listener_.fd(), .events = POLLIN, .revents = 0},
                     {.fd = stop_fd_, .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("the metrics server stopped: poll: {}", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    const int client = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (client < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays in the backlog: wait a little (or for the stop) rather
        // than spin on it.
        spdlog::warn("metrics server: cannot accept a connection: {}", std::strerror(errno));
        pollfd stop = {.fd = stop_fd_, .events = POLLIN, .revents = 0};
        if (::poll(&stop, 1, 100) > 0) return;
      }
      continue;
    }
    const Connection connection(client);
    try {
      answer(client);
    } catch (const std::exception& e) {
      spdlog::warn("metrics server: {}", e.what());
    }
  }
}

void MetricsServer::answer(int client) {
  const auto deadline = std::chrono::steady_clock::now() + options_.connection_timeout;
  // Waits until `client` is ready for `events`: false when the deadline has passed or the
  // server is stopping.
  const auto wait = [&](short events) {
    for (;;) {
      const auto left =
          std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now())
              .count();
      if (left <= 0) return false;
      pollfd fds[2] = {{.fd = client, .events = events, .revents = 0},
                       {.fd = stop_fd_, .events = POLLIN, .revents = 0}};
      const int ready = ::poll(fds, 2, static_cast<int>(std::min<int64_t>(left, INT_MAX)));
      if (ready < 0 && errno != EINTR) return false;
      if (fds[1].revents != 0) return false;
      if (fds[0].revents != 0) return true;  // errors and hang-ups too: recv/send says which
    }
  };

  // The request line and headers, up to the blank line (or the client's end of sending).
  std::string request;
  bool too_large = false;
  bool complete = false;
  char buffer[4096];
  while (!complete && !too_large) {
    if (!wait(POLLIN)) return;
    const ssize_t got = ::recv(client, buffer, sizeof buffer, 0);
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return;
    }
    if (got == 0) {
      if (request.find('\n') == std::string::npos) return;  // no request line: nothing to answer
      break;
    }
    request.append(buffer, static_cast<size_t>(got));
    complete =
        request.find("\r\n\r\n") != std::string::npos || request.find("\n\n") != std::string::npos;
    too_large = !complete && request.size() > options_.max_request_bytes;
  }

  int status = 200;
  std::string body;
  std::string extra_headers;
  bool head = false;
  if (too_large) {
    status = 431;
    body = fmt::format("The request is larger than {} bytes\n", options_.max_request_bytes);
  } else {
    std::string_view line(request);
    line = line.substr(0, line.find('\n'));
    if (line.ends_with('\r')) line.remove_suffix(1);
    const size_t first_space = line.find(' ');
    const size_t last_space = line.rfind(' ');
    if (first_space == std::string_view::npos || first_space == last_space ||
        !line.substr(last_space + 1).starts_with("HTTP/")) {
      status = 400;
      body = "Malformed request line\n";
    } else {
      const std::string_view method = line.substr(0, first_space);
      std::string_view path = line.substr(first_space + 1, last_space - first_space - 1);
      path = path.substr(0, path.find('?'));
      head = method == "HEAD";
      if (method != "GET" && !head) {
        status = 405;
        extra_headers = "Allow: GET, HEAD\r\n";
        body = "Only GET and HEAD are served\n";
      } else if (path != "/metrics") {
        status = 404;
        body = "Not found: the metrics are at /metrics\n";
      } else {
        try {
          body = render_();
        } catch (const std::exception& e) {
          spdlog::error("metrics server: cannot render the metrics: {}", e.what());
          status = 500;
          body = "The metrics could not be rendered; the mount's log says why\n";
        }
      }
    }
  }
  std::string response = fmt::format(
      "HTTP/1.0 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}Connection: close\r\n\r\n",
      status, reason_phrase(status),
      status == 200 ? kMetricsContentType : std::string_view("text/plain; charset=utf-8"),
      body.size(), extra_headers);
  if (!head) response += body;

  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = ::send(client, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n >= 0) {
      sent += static_cast<size_t>(n);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait(POLLOUT)) return;
    } else if (errno != EINTR) {
      return;
    }
  }
  ::shutdown(client, SHUT_WR);
  // A request cut short left input unread: take what the client still sends (until it closes,
  // within the deadline), so that closing does not reset the connection under the answer.
  size_t drained = 0;
  while (too_large && drained < kMaxDrainBytes && wait(POLLIN)) {
    const ssize_t got = ::recv(client, buffer, sizeof buffer, 0);
    if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) break;
    if (got > 0) drained += static_cast<size_t>(got);
  }
}

}  // namespace dsfs::fs
