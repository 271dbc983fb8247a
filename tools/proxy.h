#pragma once
// `dsfs proxy`: a WAN emulator in user space (these machines have no `tc netem`). It forwards
// byte streams between clients and one upstream server, delaying each direction by half the
// RTT (plus jitter), optionally through a rate-limited link, preserving order per connection.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace dsfs::tools {

using ProxyClock = std::chrono::steady_clock;

// Where to listen or connect: a TCP host and port, or a unix socket path.
struct SocketAddress {
  enum class Kind { kTcp, kUnix };
  Kind kind = Kind::kTcp;
  std::string host;  // kTcp: a name or an IPv4/IPv6 address (IPv6 without brackets)
  int port = 0;      // kTcp
  std::string path;  // kUnix

  // "127.0.0.1:7000", "[::1]:7000" or "unix:/run/x.sock": the form parse_socket_address reads.
  std::string describe() const;
  bool operator==(const SocketAddress&) const = default;
};

// Parses `HOST:PORT`, `[IPV6]:PORT` or `unix:/path` (`unix:///path` too). Port 0 is accepted
// (listen on a port the kernel picks). Throws std::invalid_argument naming the text.
SocketAddress parse_socket_address(std::string_view text);

// Parses a duration: a non-negative decimal number with a unit ns, us, ms or s ("100ms",
// "0.5s", "250us"); a bare 0 needs no unit. Throws std::invalid_argument naming the text.
std::chrono::nanoseconds parse_duration(std::string_view text);

// Parses a rate into bytes per second. Bits per second (SI, as tc): bit, kbit, mbit, gbit, tbit
// (any case: 100mbit, 1Gbit). Bytes per second: B, kB/KB, MB, GB (SI) and KiB, MiB, GiB; "/s" may
// follow. A bare 0 means unlimited and returns 0. Throws std::invalid_argument naming the text.
double parse_rate(std::string_view text);

// "100ms", "250us", "1.5s", "0": the largest unit that leaves a value of at least 1.
std::string format_duration(std::chrono::nanoseconds duration);
// "1gbit", "80mbit", "unlimited" (0).
std::string format_rate(double bytes_per_second);

// Faults injected on purpose, to test how clients survive a bad network or server. A "chunk" is
// what one read from a socket returned (up to 512 KiB; a reply may span several, a chunk may
// hold several replies). Every random decision comes from one generator seeded by `seed`, in
// the order chunks arrive: a seed makes the sequence of decisions repeatable, while which bytes
// they hit still depends on how the kernel split the stream.
struct FaultOptions {
  // Reset (TCP RST) each connection once this many bytes of replies went to its client: the
  // client gets these bytes, then ECONNRESET (fewer when some still sat unsent in the proxy's
  // socket buffer, which a reset discards). 0: never.
  uint64_t reset_after_bytes = 0;
  // Per chunk forwarded, either direction: reset the connection at a random byte of it (what
  // came before is delivered first).
  double reset_probability = 0;
  // Per chunk forwarded to the client: deliver a random part of it (at least one byte short),
  // then close the connection normally (FIN): the client sees a reply cut short, then EOF.
  double truncate_probability = 0;
  // Per chunk forwarded, either direction: it and everything after it on that direction of the
  // connection wait `stall` longer (order is kept).
  double stall_probability = 0;
  std::chrono::nanoseconds stall{0};
  // Refuse new connections (the listening socket is closed, so a connect gets ECONNREFUSED)
  // during [k * refuse_every, k * refuse_every + refuse_for) after the proxy started, k = 0, 1,
  // ...; only k = 0 when refuse_every is 0. Open connections are not touched.
  std::chrono::nanoseconds refuse_for{0};
  std::chrono::nanoseconds refuse_every{0};
  // Seeds the fault decisions; 0 picks a random seed (logged, so a run can be repeated).
  uint64_t seed = 0;

  bool any() const {
    return reset_after_bytes > 0 || reset_probability > 0 || truncate_probability > 0 ||
           (stall_probability > 0 && stall.count() > 0) || refuse_for.count() > 0;
  }
};

// What to do with one chunk. Cuts: the first `keep` bytes of the chunk are delivered, the rest
// (and anything read after it) is dropped, then the connection is reset or closed.
struct FaultDecision {
  enum class Cut { kNone, kReset, kTruncate };
  Cut cut = Cut::kNone;
  size_t keep = 0;     // with a cut: bytes of this chunk delivered before it (< the chunk)
  bool stall = false;  // delay this chunk and what follows by FaultOptions::stall
};

// Draws the fault decisions. Pure logic on its inputs and its generator: unit-tested without
// sockets. Not thread-safe (the proxy thread owns it).
class FaultInjector {
 public:
  FaultInjector(const FaultOptions& options, uint64_t seed);

  // A chunk of `bytes` (> 0) that starts at stream offset `offset` of one direction of one
  // connection; `to_client`: it goes to the client (a reply).
  FaultDecision on_chunk(bool to_client, uint64_t offset, size_t bytes);

  // Whether new connections are refused `since_start` after the proxy started, and when (since
  // the start) that next changes; nanoseconds::max() when it never does.
  bool refusing(std::chrono::nanoseconds since_start) const;
  std::chrono::nanoseconds next_refuse_change(std::chrono::nanoseconds since_start) const;

 private:
  bool draw(double probability);

  FaultOptions options_;
  std::mt19937_64 random_;
};

struct ProxyOptions {
  SocketAddress listen;
  SocketAddress upstream;
  // Round-trip time added: half on the way to the upstream, half on the way back. A new
  // connection's first bytes also wait for an emulated TCP handshake: they reach the upstream
  // no earlier than 1.5 RTT after the client connected, so its first reply takes 2 RTT.
  std::chrono::nanoseconds rtt{0};
  // Each direction's delay varies uniformly within rtt/2 +/- jitter/2, so a round trip stays
  // within rtt +/- jitter; never reorders bytes. At most rtt.
  std::chrono::nanoseconds jitter{0};
  // Each direction is one link of this rate shared by all connections (as netem on an
  // interface): bytes are serialized onto it in arrival order, without burst. 0: unlimited.
  double rate_bytes_per_second = 0;
  // Bytes one direction of one connection may hold; past it the proxy stops reading that side
  // until the queue drains (backpressure), so memory stays bounded.
  size_t max_queued_bytes = size_t{64} << 20;
  // Log a statistics line this often (0: never); a final one on exit when set.
  std::chrono::nanoseconds stats_interval{0};
  // Seeds the jitter; 0 picks a random seed.
  uint64_t jitter_seed = 0;
  FaultOptions faults;
  // Threads forwarding bytes, each serving its share of the connections (handed out in turn as
  // they are accepted), for a path where one thread runs out of CPU: on 16 CPUs one carried
  // 1.5 GB/s of 111 KB replies held 100 ms on 0.7 of a CPU, and four carried less. Above 1
  // only without --rate (one shared link) and without faults (one seeded sequence).
  size_t threads = 1;
};

// Throws std::invalid_argument for options the proxy cannot run with (jitter above the RTT, a
// negative duration or rate, upstream port 0, a queue bound under 64 KiB, a probability outside
// 0..1, a stall probability without a stall, a refusal window not shorter than its period).
void validate_proxy_options(const ProxyOptions& options);

// One direction of the emulated path, shared by every connection (one network interface): a
// link of the configured rate, then the propagation delay of rtt/2 +/- jitter/2. Pure arithmetic
// on times given to it, so it is unit-tested with made-up clocks.
class EmulatedLink {
 public:
  explicit EmulatedLink(const ProxyOptions& options, uint64_t seed);

  // `bytes` arrived at `arrival` on one connection; emit(piece_bytes, release) is called for
  // consecutive pieces of them (several when rate-limited, so a large read trickles out at the
  // rate instead of in one burst). `previous_release` is that connection direction's latest
  // release time: releases never go below it, so jitter never reorders bytes; it is updated.
  template <typename Emit>
  void schedule(ProxyClock::time_point arrival, size_t bytes,
                ProxyClock::time_point& previous_release, Emit&& emit);

  // When an end-of-stream arriving now may be passed on (after any bytes already scheduled).
  ProxyClock::time_point schedule_end(ProxyClock::time_point arrival,
                                      ProxyClock::time_point& previous_release);

  bool rate_limited() const { return rate_ > 0; }

 private:
  std::chrono::nanoseconds next_delay();
  std::chrono::nanoseconds transmission_time(size_t bytes) const;

  std::chrono::nanoseconds one_way_delay_;
  std::chrono::nanoseconds jitter_;
  double rate_;
  size_t piece_bytes_;
  ProxyClock::time_point link_free_at_{};
  std::mt19937_64 random_;
};

// Counters, readable from any thread while the proxy runs.
struct ProxyStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_open = 0;
  uint64_t upstream_connect_failures = 0;
  uint64_t bytes_to_upstream = 0;
  uint64_t bytes_to_client = 0;
  uint64_t bytes_queued = 0;  // read, not yet written
  // How late pieces were passed on after their release time (the emulator's own error).
  uint64_t releases = 0;
  double lateness_mean_ms = 0;
  double lateness_p99_ms = 0;  // upper bound of the power-of-two histogram bucket
  double lateness_max_ms = 0;
  // Faults injected (FaultOptions): connections reset, replies truncated, chunks stalled,
  // refusal windows begun, and whether new connections are being refused now.
  uint64_t fault_resets = 0;
  uint64_t fault_truncations = 0;
  uint64_t fault_stalls = 0;
  uint64_t refuse_windows = 0;
  bool refusing = false;
  uint64_t fault_seed = 0;  // the seed in use (the one picked when FaultOptions::seed is 0)
};

// The proxy: ProxyOptions::threads engines, each one thread with its own epoll and min-heap of
// release times; the first also accepts, and hands each new connection to the engines in turn.
// The constructor binds and listens (so connections queue from then on); run() serves until
// stop(), the first engine on the calling thread and the others on threads of their own.
class LatencyProxy {
 public:
  // Throws std::invalid_argument for bad options, std::runtime_error when it cannot listen
  // (address in use, a unix path that is not a stale socket) or resolve the upstream host.
  explicit LatencyProxy(ProxyOptions options);
  ~LatencyProxy();  // closes every connection; removes the unix socket it created
  LatencyProxy(const LatencyProxy&) = delete;
  LatencyProxy& operator=(const LatencyProxy&) = delete;

  // The address it listens on, with the port the kernel chose for port 0.
  const SocketAddress& listening_address() const;
  const ProxyOptions& options() const;

  // Serves until stop(); closes all connections before it returns. Throws std::runtime_error
  // if epoll itself fails (in any engine). Call from one thread at a time.
  void run();
  // Makes run() return soon; callable from any thread and from a signal handler.
  void stop() noexcept;

  // Every engine's counters together.
  ProxyStats stats() const;

 private:
  class Engine;
  struct SharedCounters;
  std::unique_ptr<SharedCounters> counters_;
  std::vector<std::unique_ptr<Engine>> engines_;  // [0] listens
};

// A LatencyProxy running on its own thread (tests, benchmarks): listening when constructed,
// stopped and joined on destruction.
class BackgroundProxy {
 public:
  explicit BackgroundProxy(ProxyOptions options);
  ~BackgroundProxy();
  BackgroundProxy(const BackgroundProxy&) = delete;
  BackgroundProxy& operator=(const BackgroundProxy&) = delete;

  LatencyProxy& proxy() { return proxy_; }
  const SocketAddress& address() const { return proxy_.listening_address(); }
  // Stops and joins; rethrows what run() threw, if anything.
  void stop();

 private:
  LatencyProxy proxy_;
  std::exception_ptr failure_;
  std::thread thread_;
};

template <typename Emit>
void EmulatedLink::schedule(ProxyClock::time_point arrival, size_t bytes,
                            ProxyClock::time_point& previous_release, Emit&& emit) {
  while (bytes > 0) {
    size_t piece = bytes;
    ProxyClock::time_point sent = arrival;
    if (rate_ > 0) {
      piece = std::min(bytes, piece_bytes_);
      link_free_at_ = std::max(link_free_at_, arrival) + transmission_time(piece);
      sent = link_free_at_;
    }
    previous_release = std::max(previous_release, sent + next_delay());
    emit(piece, previous_release);
    bytes -= piece;
  }
}

}  // namespace dsfs::tools
