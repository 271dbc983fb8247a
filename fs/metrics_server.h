#pragma once
// The HTTP endpoint of `dsfs mount --metrics-listen`: GET /metrics answers the mount's counters
// in the Prometheus text format; any other path is 404. Two halves, because the mount forks:
// MetricsListener binds in the mount command, before anything is mounted (a taken port fails
// the mount on the terminal), and MetricsServer serves it from a thread of the daemon.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace dsfs::fs {

// Where --metrics-listen binds: "PORT" (on 127.0.0.1), "HOST:PORT" or "[IPV6]:PORT".
struct ListenAddress {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
};

// Throws std::invalid_argument naming --metrics-listen and the accepted forms.
ListenAddress parse_listen_address(std::string_view text);

// A TCP socket bound to an address and listening (close-on-exec, so nothing the mount spawns
// keeps the port). Connections wait in the backlog until a MetricsServer serves them.
// Thread safety: none needed; made and handed over by one thread.
class MetricsListener {
 public:
  // Throws std::runtime_error naming --metrics-listen, the address and what to do: the port in
  // use, an address this machine does not have, a privileged port, a host that does not resolve.
  explicit MetricsListener(const ListenAddress& address);
  ~MetricsListener();
  MetricsListener(MetricsListener&& other) noexcept;
  MetricsListener& operator=(MetricsListener&&) = delete;
  MetricsListener(const MetricsListener&) = delete;
  MetricsListener& operator=(const MetricsListener&) = delete;

  int fd() const { return fd_; }
  uint16_t port() const { return port_; }  // the port bound (the one asked for, or the kernel's)
  const std::string& describe() const { return describe_; }  // "HOST:PORT" as bound

 private:
  int fd_ = -1;  // owned
  uint16_t port_ = 0;
  std::string describe_;
};

struct MetricsServerOptions {
  // A connection's whole life: reading the request, rendering, writing the answer. A client
  // that stalls is dropped after it, so a stuck scraper delays the next scrape at most this
  // long and never holds up an unmount (the destructor wakes the thread at once).
  std::chrono::milliseconds connection_timeout{5000};
  size_t max_request_bytes = 8192;  // the request line and headers; larger is 431
};

// Serves a MetricsListener from one thread, one connection at a time, one request per
// connection (HTTP/1.0 style: Connection: close). GET or HEAD of /metrics (a query string is
// ignored) answers render() as text/plain; version=0.0.4; another path is 404, another method
// 405, a malformed request 400.
// Thread safety: render is called on the server's thread only, concurrently with whatever the
// rest of the process does, so it must synchronize with that itself (the mount's snapshot
// does). Construct and destroy from one thread; the destructor stops and joins the thread, so
// whatever render reaches must outlive this object.
class MetricsServer {
 public:
  using Render = std::function<std::string()>;
  // Starts the thread: construct after any fork.
  MetricsServer(MetricsListener listener, Render render, MetricsServerOptions options = {});
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  const MetricsListener& listener() const { return listener_; }

 private:
  void serve();
  void answer(int client);

  MetricsListener listener_;
  Render render_;
  MetricsServerOptions options_;
  int stop_fd_ = -1;  // owned: an eventfd the destructor signals
  std::thread thread_;
};

}  // namespace dsfs::fs
