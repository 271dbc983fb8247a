#include "tools/proxy.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/core.h>
#include <spdlog/spdlog.h>

#include <array>
#include <bit>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "src/store/thread_name.h"

namespace dsfs::tools {

namespace {

using namespace std::chrono_literals;
using std::chrono::nanoseconds;
using Time = ProxyClock::time_point;

// Reads go into blocks of this size; one read takes up to a block (and the rest of the last one).
constexpr size_t kBlockBytes = size_t{256} << 10;
// With less room than this left in the tail block, a read also gets a fresh block.
constexpr size_t kMinReadBytes = size_t{64} << 10;
// Free blocks kept for reuse (1 GiB); more go back to the allocator. At 100 ms the proxy holds
// 100-300 MB of replies: with only 64 MiB kept, blocks went back and came again as fresh pages,
// about 10 page faults per 111 KB reply (4 at 1 ms), most of the proxy's CPU at 100 ms. Kept,
// the proxy's memory stays at its peak, which it reached anyway.
constexpr size_t kMaxFreeBlocks = 4096;
constexpr int kMaxEvents = 256;
constexpr size_t kMaxThreads = 64;
constexpr int kMaxWriteIovecs = 16;
// Reads in a row from one socket before the others (and due releases) get a turn (1 MiB).
constexpr int kReadsPerTurn = 4;
constexpr size_t kMinQueuedBytes = size_t{64} << 10;
constexpr nanoseconds kMaxDuration = 1h;
constexpr nanoseconds kAcceptRetryDelay = 100ms;
// Lateness histogram: bucket 0 is under 1 us, bucket i under 2^i us.
constexpr size_t kLatenessBuckets = 24;

// epoll tokens: connection sockets are (id << 1) | side with ids from 1, so never 0 or 1.
constexpr uint64_t kListenerToken = 0;
constexpr uint64_t kWakeToken = 1;
enum Side : int { kClientSide = 0, kUpstreamSide = 1 };
enum DirectionIndex : int { kToUpstream = 0, kToClient = 1 };

std::string error_text(int error) {
  return std::strerror(error);
}

[[noreturn]] void bad_argument(std::string message) {
  throw std::invalid_argument(std::move(message));
}

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A number at the start of `text` and what follows it; nullopt if there is no plain decimal
// number (digits and one optional point) there.
std::optional<std::pair<double, std::string_view>> split_number(std::string_view text) {
  size_t end = 0;
  while (end < text.size() && ((text[end] >= '0' && text[end] <= '9') || text[end] == '.')) ++end;
  double value = 0;
  const auto [ptr, error] = std::from_chars(text.data(), text.data() + end, value);
  if (end == 0 || error != std::errc() || ptr != text.data() + end) return std::nullopt;
  return std::make_pair(value, text.substr(end));
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) ==
           std::tolower(static_cast<unsigned char>(y));
  });
}

std::string format_bytes(double bytes) {
  if (bytes >= 1e9) return fmt::format("{:.2f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  if (bytes >= 1e3) return fmt::format("{:.1f} kB", bytes / 1e3);
  return fmt::format("{:.0f} B", bytes);
}

// A resolved socket address, ready for bind/connect.
struct Endpoint {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
  const sockaddr* address() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

std::vector<Endpoint> resolve(const SocketAddress& address, bool passive) {
  std::vector<Endpoint> endpoints;
  if (address.kind == SocketAddress::Kind::kUnix) {
    Endpoint endpoint;
    auto* unix_address = reinterpret_cast<sockaddr_un*>(&endpoint.storage);
    unix_address->sun_family = AF_UNIX;
    std::memcpy(unix_address->sun_path, address.path.data(), address.path.size());
    endpoint.length =
        static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.path.size() + 1);
    endpoint.family = AF_UNIX;
    endpoints.push_back(endpoint);
    return endpoints;
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* results = nullptr;
  const std::string port = std::to_string(address.port);
  if (const int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &results); rc != 0) {
    throw std::runtime_error(
        fmt::format("cannot resolve '{}': {}", address.host, ::gai_strerror(rc)));
  }
  for (const addrinfo* result = results; result != nullptr; result = result->ai_next) {
    Endpoint endpoint;
    std::memcpy(&endpoint.storage, result->ai_addr, result->ai_addrlen);
    endpoint.length = result->ai_addrlen;
    endpoint.family = result->ai_family;
    endpoints.push_back(endpoint);
  }
  ::freeaddrinfo(results);
  return endpoints;
}

// Small writes (Redis commands and replies) must leave at once, not wait for Nagle.
void disable_nagle(int fd) {
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

// A unix socket file left behind by a proxy that died is removed; a live one, or a path that is
// not a socket, is an error.
void clear_stale_unix_socket(const SocketAddress& address, const Endpoint& endpoint) {
  struct stat status {};
  if (::lstat(address.path.c_str(), &status) != 0) return;
  if (!S_ISSOCK(status.st_mode)) {
    throw std::runtime_error(fmt::format(
        "cannot listen on {}: the path exists and is not a socket; remove it or pick another",
        address.describe()));
  }
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (probe && ::connect(probe.get(), endpoint.address(), endpoint.length) == 0) {
    throw std::runtime_error(
        fmt::format("cannot listen on {}: another process is listening there", address.describe()));
  }
  spdlog::info("dsfs proxy: removing the stale socket {}", address.describe());
  ::unlink(address.path.c_str());
}

struct Mark {
  uint64_t end;  // stream offset just past the piece
  Time release;
  bool end_of_stream;
};

// One direction of one connection: bytes read from `source`, waiting in blocks until their
// release time, then written to `destination`. Stream offsets count every byte ever read.
struct Direction {
  int index = kToUpstream;
  int source = -1;  // borrowed from the Connection
  int destination = -1;
  std::deque<std::unique_ptr<char[]>> blocks;  // blocks[0] holds offset `base` at its start
  uint64_t base = 0;
  uint64_t head = 0;  // next byte to write
  uint64_t tail = 0;  // next byte to read
  uint64_t released_end = 0;
  std::deque<Mark> marks;  // pieces not yet released, in release order
  Time last_release{};
  std::optional<Time> timer_at;  // the heap entry that will pump this direction
  bool source_readable = true;   // until a read finds it drained (edge-triggered epoll)
  bool source_hung_up = false;   // the peer shut down: read to the end whatever the sizes
  bool end_read = false;
  bool end_released = false;
  bool finished = false;  // destination shut down for writing
  bool destination_full = false;
  // An injected fault: once the bytes before it are delivered, the connection is reset or
  // closed instead of shut down for writing (end_read is then set and marks the cut).
  FaultDecision::Cut cut = FaultDecision::Cut::kNone;

  uint64_t queued() const { return tail - head; }
};

struct Connection {
  uint64_t id = 0;
  UniqueFd client;
  UniqueFd upstream;
  bool connecting = false;
  std::array<Direction, 2> directions;
};

struct Timer {
  Time at;
  uint64_t connection;
  int direction;
  bool operator>(const Timer& other) const { return at > other.at; }
};

class BlockPool {
 public:
  std::unique_ptr<char[]> take() {
    if (free_.empty()) return std::make_unique_for_overwrite<char[]>(kBlockBytes);
    auto block = std::move(free_.back());
    free_.pop_back();
    return block;
  }
  void give(std::unique_ptr<char[]> block) {
    if (free_.size() < kMaxFreeBlocks) free_.push_back(std::move(block));
  }

 private:
  std::vector<std::unique_ptr<char[]>> free_;
};

// Counters written by the proxy thread only (so plain load+store, no locked instructions) and
// read by any thread.
struct Counters {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> open{0};
  std::atomic<uint64_t> connect_failures{0};
  std::atomic<uint64_t> to_upstream{0};
  std::atomic<uint64_t> to_client{0};
  std::atomic<uint64_t> queued{0};
  std::atomic<uint64_t> releases{0};
  std::atomic<uint64_t> lateness_sum_ns{0};
  std::atomic<uint64_t> lateness_max_ns{0};
  std::array<std::atomic<uint64_t>, kLatenessBuckets> lateness_buckets{};
  std::atomic<uint64_t> fault_resets{0};
  std::atomic<uint64_t> fault_truncations{0};
  std::atomic<uint64_t> fault_stalls{0};
  std::atomic<uint64_t> refuse_windows{0};
  std::atomic<bool> refusing{false};
};

// Every engine adds to the same counters (ProxyOptions::threads).
void add(std::atomic<uint64_t>& counter, uint64_t amount) {
  counter.fetch_add(amount, std::memory_order_relaxed);
}
void subtract(std::atomic<uint64_t>& counter, uint64_t amount) {
  counter.fetch_sub(amount, std::memory_order_relaxed);
}

}  // namespace

// ---- parsing and formatting ----

std::string SocketAddress::describe() const {
  if (kind == Kind::kUnix) return "unix:" + path;
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

SocketAddress parse_socket_address(std::string_view text) {
  const auto fail = [&](std::string_view why) {
    return std::invalid_argument(fmt::format(
        "bad address '{}': {} (expected HOST:PORT, [IPV6]:PORT or unix:/PATH)", text, why));
  };
  SocketAddress address;
  if (text.starts_with("unix:")) {
    std::string_view path = text.substr(5);
    if (path.starts_with("//")) path.remove_prefix(2);  // unix:///run/x.sock, as in URLs
    if (path.empty()) throw fail("the socket path is empty");
    if (path.size() >= sizeof(sockaddr_un::sun_path)) {
      throw fail(fmt::format("the socket path is longer than {} bytes",
                             sizeof(sockaddr_un::sun_path) - 1));
    }
    if (path.find('\0') != std::string_view::npos)
      throw fail("the socket path contains a NUL byte");
    address.kind = SocketAddress::Kind::kUnix;
    address.path = std::string(path);
    return address;
  }
  std::string_view host;
  std::string_view port;
  if (text.starts_with('[')) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) throw fail("no ']' after the IPv6 address");
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (!rest.starts_with(':')) throw fail("no :PORT after ']'");
    port = rest.substr(1);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) throw fail("no :PORT");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      throw fail("an IPv6 address needs brackets, e.g. [::1]:7000");
    }
  }
  if (host.empty()) throw fail("the host is empty (use 0.0.0.0 or [::] for every interface)");
  int number = -1;
  const auto [ptr, error] = std::from_chars(port.data(), port.data() + port.size(), number);
  if (port.empty() || error != std::errc() || ptr != port.data() + port.size() || number < 0 ||
      number > 65535) {
    throw fail(fmt::format("the port '{}' is not a number in 0..65535", port));
  }
  address.host = std::string(host);
  address.port = number;
  return address;
}

std::chrono::nanoseconds parse_duration(std::string_view text) {
  const auto fail = [&](std::string_view why) {
    return std::invalid_argument(fmt::format("bad duration '{}': {}", text, why));
  };
  if (text.starts_with('-')) throw fail("it is negative; a duration is 0 or more");
  const auto split = split_number(text);
  if (!split) throw fail("expected a number and a unit, e.g. 100ms, 0.5s, 250us or 0");
  const auto [value, unit] = *split;
  double unit_ns = 0;
  if (unit.empty()) {
    if (value != 0) throw fail("it needs a unit: ns, us, ms or s (e.g. 100ms)");
    return nanoseconds{0};
  }
  if (unit == "ns") {
    unit_ns = 1;
  } else if (unit == "us") {
    unit_ns = 1e3;
  } else if (unit == "ms") {
    unit_ns = 1e6;
  } else if (unit == "s") {
    unit_ns = 1e9;
  } else {
    throw fail(fmt::format("unknown unit '{}'; use ns, us, ms or s", unit));
  }
  const double total = value * unit_ns;
  if (!std::isfinite(total) || total > static_cast<double>(kMaxDuration.count())) {
    throw fail("it is longer than an hour");
  }
  return nanoseconds{std::llround(total)};
}

double parse_rate(std::string_view text) {
  const auto fail = [&](std::string_view why) {
    return std::invalid_argument(fmt::format(
        "bad rate '{}': {} (bits per second: 500kbit, 100mbit, 1gbit; bytes per second: 10MB, "
        "64MiB; 0: unlimited)",
        text, why));
  };
  if (text.starts_with('-')) throw fail("it is negative");
  const auto split = split_number(text);
  if (!split) throw fail("expected a number and a unit");
  auto [value, unit] = *split;
  if (unit.empty()) {
    if (value != 0) throw fail("it needs a unit");
    return 0;
  }
  if (unit.ends_with("/s")) unit.remove_suffix(2);
  struct Unit {
    std::string_view name;
    double bytes_per_second;
    bool any_case;
  };
  static constexpr std::array<Unit, 13> kUnits{{
      {"bit", 1.0 / 8, true},
      {"kbit", 1e3 / 8, true},
      {"mbit", 1e6 / 8, true},
      {"gbit", 1e9 / 8, true},
      {"tbit", 1e12 / 8, true},
      {"B", 1, false},
      {"kB", 1e3, false},
      {"KB", 1e3, false},
      {"MB", 1e6, false},
      {"GB", 1e9, false},
      {"KiB", 1024.0, false},
      {"MiB", 1024.0 * 1024, false},
      {"GiB", 1024.0 * 1024 * 1024, false},
  }};
  for (const Unit& candidate : kUnits) {
    const bool matches =
        candidate.any_case ? equals_ignoring_case(unit, candidate.name) : unit == candidate.name;
    if (!matches) continue;
    const double rate = value * candidate.bytes_per_second;
    if (!std::isfinite(rate) || rate > 1e13) throw fail("it is too large");
    if (rate == 0) return 0;
    if (rate < 1) throw fail("it is below 8bit (one byte per second)");
    return rate;
  }
  if (equals_ignoring_case(unit, "bps") || equals_ignoring_case(unit, "kbps") ||
      equals_ignoring_case(unit, "mbps") || equals_ignoring_case(unit, "gbps")) {
    throw fail(fmt::format("'{}' is ambiguous; write mbit for bits or MB for bytes", unit));
  }
  throw fail(fmt::format("unknown unit '{}'", unit));
}

std::string format_duration(std::chrono::nanoseconds duration) {
  const double ns = static_cast<double>(duration.count());
  if (ns == 0) return "0";
  if (ns >= 1e9) return fmt::format("{:g}s", ns / 1e9);
  if (ns >= 1e6) return fmt::format("{:g}ms", ns / 1e6);
  if (ns >= 1e3) return fmt::format("{:g}us", ns / 1e3);
  return fmt::format("{:g}ns", ns);
}

std::string format_rate(double bytes_per_second) {
  const double bits = bytes_per_second * 8;
  if (bits <= 0) return "unlimited";
  if (bits >= 1e9) return fmt::format("{:g}gbit", bits / 1e9);
  if (bits >= 1e6) return fmt::format("{:g}mbit", bits / 1e6);
  if (bits >= 1e3) return fmt::format("{:g}kbit", bits / 1e3);
  return fmt::format("{:g}bit", bits);
}

void validate_proxy_options(const ProxyOptions& options) {
  if (options.rtt < 0ns || options.rtt > kMaxDuration) {
    bad_argument(fmt::format("--rtt must be in 0..1h, not {}ns", options.rtt.count()));
  }
  if (options.jitter < 0ns) bad_argument("--jitter must not be negative");
  if (options.jitter > options.rtt) {
    bad_argument(fmt::format("--jitter ({}) must not exceed --rtt ({}): delays cannot go below 0",
                             format_duration(options.jitter), format_duration(options.rtt)));
  }
  if (!(options.rate_bytes_per_second >= 0) || !std::isfinite(options.rate_bytes_per_second)) {
    bad_argument("--rate must be a positive rate, or 0 for unlimited");
  }
  if (options.max_queued_bytes < kMinQueuedBytes) {
    bad_argument(fmt::format("the queue bound must be at least {} bytes", kMinQueuedBytes));
  }
  if (options.stats_interval < 0ns) bad_argument("--stats must not be negative");
  if (options.threads < 1 || options.threads > kMaxThreads) {
    bad_argument(fmt::format("--threads must be in 1..{}, not {}", kMaxThreads, options.threads));
  }
  if (options.threads > 1 && (options.rate_bytes_per_second > 0 || options.faults.any())) {
    bad_argument(
        "--threads above 1 works without --rate (one link shared by every connection) and "
        "without fault injection (one seeded sequence of decisions); use --threads 1 with them");
  }
  const auto check_address = [](const SocketAddress& address, std::string_view what, bool listen) {
    if (address.kind == SocketAddress::Kind::kUnix) {
      if (address.path.empty() || address.path.size() >= sizeof(sockaddr_un::sun_path)) {
        bad_argument(fmt::format("{}: bad unix socket path '{}'", what, address.path));
      }
      return;
    }
    if (address.host.empty()) bad_argument(fmt::format("{}: the host is empty", what));
    if (address.port < (listen ? 0 : 1) || address.port > 65535) {
      bad_argument(fmt::format("{}: the port must be in {}..65535, not {}", what, listen ? 0 : 1,
                               address.port));
    }
  };
  check_address(options.listen, "--listen", true);
  check_address(options.upstream, "--upstream", false);

  const FaultOptions& faults = options.faults;
  const auto check_probability = [](double p, std::string_view what) {
    if (!(p >= 0 && p <= 1)) {
      bad_argument(fmt::format("{} must be a probability in 0..1, not {}", what, p));
    }
  };
  check_probability(faults.reset_probability, "--reset-probability");
  check_probability(faults.truncate_probability, "--truncate-probability");
  check_probability(faults.stall_probability, "--stall-probability");
  if (faults.stall < 0ns || faults.stall > kMaxDuration) bad_argument("--stall must be in 0..1h");
  if (faults.stall_probability > 0 && faults.stall == 0ns) {
    bad_argument("--stall-probability needs --stall (how long a stall lasts, e.g. 500ms)");
  }
  if (faults.refuse_for < 0ns || faults.refuse_every < 0ns) {
    bad_argument("--refuse-for and --refuse-every must not be negative");
  }
  if (faults.refuse_every > 0ns && faults.refuse_for == 0ns) {
    bad_argument("--refuse-every needs --refuse-for (how long each refusal window lasts)");
  }
  if (faults.refuse_every > 0ns && faults.refuse_for >= faults.refuse_every) {
    bad_argument(fmt::format(
        "--refuse-for ({}) must be shorter than --refuse-every ({}), or the proxy never accepts",
        format_duration(faults.refuse_for), format_duration(faults.refuse_every)));
  }
}

// ---- fault injection ----

FaultInjector::FaultInjector(const FaultOptions& options, uint64_t seed)
    : options_(options), random_(seed) {}

bool FaultInjector::draw(double probability) {
  if (probability <= 0) return false;
  if (probability >= 1) return true;
  return std::uniform_real_distribution<double>(0, 1)(random_) < probability;
}

FaultDecision FaultInjector::on_chunk(bool to_client, uint64_t offset, size_t bytes) {
  FaultDecision decision;
  // Every draw is made for every chunk, so one fault's decisions do not shift the others'.
  const bool reset = draw(options_.reset_probability);
  const bool truncate = to_client && draw(options_.truncate_probability);
  decision.stall = options_.stall > 0ns && draw(options_.stall_probability);
  const size_t random_keep = std::uniform_int_distribution<size_t>(0, bytes - 1)(random_);
  if (to_client && options_.reset_after_bytes > 0 && offset + bytes > options_.reset_after_bytes) {
    decision.cut = FaultDecision::Cut::kReset;
    decision.keep = static_cast<size_t>(options_.reset_after_bytes -
                                        std::min(offset, options_.reset_after_bytes));
  } else if (reset) {
    decision.cut = FaultDecision::Cut::kReset;
    decision.keep = random_keep;
  } else if (truncate) {
    decision.cut = FaultDecision::Cut::kTruncate;
    decision.keep = random_keep;
  }
  return decision;
}

bool FaultInjector::refusing(nanoseconds since_start) const {
  if (options_.refuse_for <= 0ns || since_start < 0ns) return false;
  if (options_.refuse_every <= 0ns) return since_start < options_.refuse_for;
  return since_start % options_.refuse_every < options_.refuse_for;
}

nanoseconds FaultInjector::next_refuse_change(nanoseconds since_start) const {
  if (options_.refuse_for <= 0ns) return nanoseconds::max();
  since_start = std::max(since_start, nanoseconds{0});
  if (options_.refuse_every <= 0ns) {
    return since_start < options_.refuse_for ? options_.refuse_for : nanoseconds::max();
  }
  const nanoseconds window_start = since_start - since_start % options_.refuse_every;
  if (since_start < window_start + options_.refuse_for) return window_start + options_.refuse_for;
  return window_start + options_.refuse_every;
}

// ---- the emulated link ----

EmulatedLink::EmulatedLink(const ProxyOptions& options, uint64_t seed)
    : one_way_delay_(options.rtt / 2),
      jitter_(options.jitter),
      rate_(options.rate_bytes_per_second),
      // About a millisecond of transmission per piece: smooth enough, few pieces.
      piece_bytes_(rate_ > 0
                       ? std::clamp(static_cast<size_t>(rate_ / 1000), size_t{1500}, kBlockBytes)
                       : kBlockBytes),
      random_(seed) {}

std::chrono::nanoseconds EmulatedLink::next_delay() {
  if (jitter_ == 0ns) return one_way_delay_;
  std::uniform_int_distribution<int64_t> offset(-jitter_.count() / 2, jitter_.count() / 2);
  return std::max(one_way_delay_ + nanoseconds{offset(random_)}, nanoseconds{0});
}

std::chrono::nanoseconds EmulatedLink::transmission_time(size_t bytes) const {
  return nanoseconds{std::llround(static_cast<double>(bytes) * 1e9 / rate_)};
}

ProxyClock::time_point EmulatedLink::schedule_end(ProxyClock::time_point arrival,
                                                  ProxyClock::time_point& previous_release) {
  // The end of the stream takes no link time, but follows what is already on the link.
  const Time sent = rate_ > 0 ? std::max(link_free_at_, arrival) : arrival;
  previous_release = std::max(previous_release, sent + next_delay());
  return previous_release;
}

// ---- the engine ----

struct LatencyProxy::SharedCounters {
  Counters counters;
};

// One thread's share of the proxy: the connections handed to it, its own epoll, timers and
// block pool. Engine 0 also listens and accepts; adopt() is how the others receive connections
// (the one call made from another thread, besides stop()).
class LatencyProxy::Engine {
 public:
  // `options` validated by LatencyProxy. `index` 0 listens; the others serve what adopt() hands
  // them. Every engine counts in `counters`.
  Engine(ProxyOptions options, Counters& counters, size_t index);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const SocketAddress& listening_address() const { return listening_; }
  const ProxyOptions& options() const { return options_; }
  void run();
  void stop() noexcept;
  ProxyStats stats() const;
  // Engine 0 only, before run(): the engines it hands new connections to, in turn with itself.
  void set_peers(std::vector<Engine*> peers) { peers_ = std::move(peers); }
  // Serves `client` from now on; thread-safe.
  void adopt(UniqueFd client);

 private:
  enum class ReadOutcome { kProgress, kIdle, kClosed };

  void wake() noexcept;
  void open_adopted(Time now);

  void listen();
  // Opens the listening socket again after a refusal window, on the address it had.
  bool relisten();
  // Closes or reopens the listener as the refusal windows say; returns when to call it next.
  void update_refusal(Time now);
  int wait(epoll_event* events, Time deadline);
  void accept_clients(Time now);
  void open_connection(UniqueFd client, Time now);
  void on_socket_event(uint64_t token, uint32_t events);
  void run_due_timers();
  void run_deferred();
  // Reads what it may from d's source, writes what is released to its destination, then
  // schedules its next release. False once the connection is closed (c is then gone).
  bool pump(Connection& c, Direction& d);
  bool can_read(const Connection& c, const Direction& d) const;
  ReadOutcome read_once(Connection& c, Direction& d);
  bool flush(Connection& c, Direction& d, Time now);
  bool settle(Connection& c, Direction& d);
  void release_blocks(Direction& d);
  // `cut`: reset (RST) or plainly close both sides for an injected fault.
  void close_connection(Connection& c, std::string_view why,
                        FaultDecision::Cut cut = FaultDecision::Cut::kNone);
  void record_lateness(nanoseconds lateness);
  void log_stats(std::string_view when);

  ProxyOptions options_;
  SocketAddress listening_;
  Endpoint upstream_;
  std::optional<std::pair<dev_t, ino_t>> unix_socket_identity_;  // the socket file we created
  UniqueFd listener_;
  UniqueFd epoll_;
  UniqueFd wake_;
  std::atomic<bool> stop_requested_{false};
  bool use_epoll_pwait2_ = true;
  uint64_t jitter_seed_;
  std::array<EmulatedLink, 2> links_;  // indexed by DirectionIndex
  BlockPool pool_;
  uint64_t next_connection_id_ = 1;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> connections_;
  // Closed this turn; freed after it, since the turn may still hold references to them.
  std::vector<std::unique_ptr<Connection>> closed_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers_;
  std::vector<std::pair<uint64_t, int>> deferred_;  // directions that had to yield their turn
  Time accept_retry_at_ = Time::max();
  Counters& counters_;
  std::vector<Engine*> peers_;
  size_t next_engine_ = 0;  // whose turn the next accepted connection is (0: this one)
  std::mutex adopted_mutex_;
  std::vector<UniqueFd> adopted_;  // handed over by engine 0, not yet opened here
  size_t connection_id_step_ = 1;
  uint64_t fault_seed_;
  FaultInjector faults_;
  Time started_at_ = ProxyClock::now();
  Time refuse_change_at_ = Time::max();
  uint64_t bytes_at_last_stats_ = 0;
  Time last_stats_at_ = ProxyClock::now();
};

LatencyProxy::Engine::Engine(ProxyOptions options, Counters& counters, size_t index)
    : options_(std::move(options)),
      jitter_seed_((options_.jitter_seed != 0 ? options_.jitter_seed : std::random_device{}()) +
                   2 * index),
      links_{EmulatedLink(options_, jitter_seed_), EmulatedLink(options_, jitter_seed_ + 1)},
      next_connection_id_(index + 1),
      counters_(counters),
      connection_id_step_(options_.threads),
      fault_seed_(options_.faults.seed != 0 ? options_.faults.seed : std::random_device{}()),
      faults_(options_.faults, fault_seed_) {
  if (index > 0) options_.stats_interval = nanoseconds{0};  // engine 0 logs for all
  try {
    const auto upstream = resolve(options_.upstream, false);
    upstream_ = upstream.front();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(
        fmt::format("--upstream {}: {}", options_.upstream.describe(), e.what()));
  }
  if (index == 0) listen();
  epoll_ = UniqueFd(::epoll_create1(EPOLL_CLOEXEC));
  wake_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_ || !wake_) {
    throw std::runtime_error(
        fmt::format("dsfs proxy: cannot create epoll/eventfd: {}", error_text(errno)));
  }
  epoll_event listener_event{};
  listener_event.events = EPOLLIN | EPOLLET;
  listener_event.data.u64 = kListenerToken;
  epoll_event wake_event{};
  wake_event.events = EPOLLIN;
  wake_event.data.u64 = kWakeToken;
  if ((listener_ &&
       ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &listener_event) != 0) ||
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_.get(), &wake_event) != 0) {
    throw std::runtime_error(fmt::format("dsfs proxy: epoll_ctl failed: {}", error_text(errno)));
  }
}

LatencyProxy::Engine::~Engine() {
  connections_.clear();
  listener_.reset();
  if (unix_socket_identity_) {
    struct stat status {};
    // Only our own socket file: another proxy may have replaced it since.
    if (::lstat(listening_.path.c_str(), &status) == 0 &&
        std::make_pair(status.st_dev, status.st_ino) == *unix_socket_identity_) {
      ::unlink(listening_.path.c_str());
    }
  }
}

namespace {
// A non-blocking listening socket on `address` (resolved); throws std::runtime_error.
UniqueFd open_listener(const SocketAddress& address, const std::vector<Endpoint>& endpoints) {
  int last_error = 0;
  for (const Endpoint& endpoint : endpoints) {
    UniqueFd fd(::socket(endpoint.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) {
      last_error = errno;
      continue;
    }
    const int on = 1;
    if (endpoint.family != AF_UNIX)
      ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    if (::bind(fd.get(), endpoint.address(), endpoint.length) != 0 ||
        ::listen(fd.get(), SOMAXCONN) != 0) {
      last_error = errno;
      continue;
    }
    return fd;
  }
  throw std::runtime_error(
      fmt::format("cannot listen on {}: {}", address.describe(), error_text(last_error)));
}

std::optional<std::pair<dev_t, ino_t>> file_identity(const std::string& path) {
  struct stat status {};
  if (::lstat(path.c_str(), &status) != 0) return std::nullopt;
  return std::make_pair(status.st_dev, status.st_ino);
}
}  // namespace

void LatencyProxy::Engine::listen() {
  const SocketAddress& address = options_.listen;
  std::vector<Endpoint> endpoints;
  try {
    endpoints = resolve(address, true);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(fmt::format("--listen {}: {}", address.describe(), e.what()));
  }
  if (address.kind == SocketAddress::Kind::kUnix) clear_stale_unix_socket(address, endpoints[0]);
  listener_ = open_listener(address, endpoints);
  listening_ = address;
  if (address.kind == SocketAddress::Kind::kUnix) {
    unix_socket_identity_ = file_identity(address.path);
  } else {
    sockaddr_storage bound{};
    socklen_t length = sizeof bound;
    if (::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&bound), &length) == 0) {
      listening_.port =
          ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }
  }
}

bool LatencyProxy::Engine::relisten() {
  try {
    // The same port (the one the kernel picked for port 0) or the same socket file, which
    // stayed in place while closed so that connects were refused rather than not found.
    if (listening_.kind == SocketAddress::Kind::kUnix && unix_socket_identity_ &&
        file_identity(listening_.path) == unix_socket_identity_) {
      ::unlink(listening_.path.c_str());
    }
    listener_ = open_listener(listening_, resolve(listening_, true));
  } catch (const std::runtime_error& e) {
    spdlog::warn("dsfs proxy: a refusal window ended but {}; retrying in {}", e.what(),
                 format_duration(kAcceptRetryDelay));
    return false;
  }
  if (listening_.kind == SocketAddress::Kind::kUnix) {
    unix_socket_identity_ = file_identity(listening_.path);
  }
  epoll_event listener_event{};
  listener_event.events = EPOLLIN | EPOLLET;
  listener_event.data.u64 = kListenerToken;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &listener_event) != 0) {
    spdlog::warn("dsfs proxy: epoll_ctl failed for the listener: {}; retrying in {}",
                 error_text(errno), format_duration(kAcceptRetryDelay));
    listener_.reset();
    return false;
  }
  return true;
}

void LatencyProxy::Engine::update_refusal(Time now) {
  const nanoseconds since_start = now - started_at_;
  const bool refuse = faults_.refusing(since_start);
  if (refuse && listener_) {
    listener_.reset();  // also leaves the epoll set; queued connects are reset
    add(counters_.refuse_windows, 1);
    counters_.refusing.store(true, std::memory_order_relaxed);
    spdlog::info("dsfs proxy: refusing new connections for {} (injected fault)",
                 format_duration(options_.faults.refuse_for));
  } else if (!refuse && !listener_) {
    if (!relisten()) {
      refuse_change_at_ = now + kAcceptRetryDelay;
      return;
    }
    counters_.refusing.store(false, std::memory_order_relaxed);
    spdlog::info("dsfs proxy: accepting connections again");
    accept_clients(now);
  }
  const nanoseconds next = faults_.next_refuse_change(since_start);
  refuse_change_at_ = next == nanoseconds::max() ? Time::max() : started_at_ + next;
}

void LatencyProxy::Engine::stop() noexcept {
  stop_requested_.store(true);
  wake();
}

void LatencyProxy::Engine::adopt(UniqueFd client) {
  {
    std::lock_guard lock(adopted_mutex_);
    adopted_.push_back(std::move(client));
  }
  wake();
}

void LatencyProxy::Engine::open_adopted(Time now) {
  std::vector<UniqueFd> clients;
  {
    std::lock_guard lock(adopted_mutex_);
    clients.swap(adopted_);
  }
  for (UniqueFd& client : clients) open_connection(std::move(client), now);
}

void LatencyProxy::Engine::wake() noexcept {
  const uint64_t one = 1;
  // write(2) is async-signal-safe; a full counter (never in practice) still wakes the loop.
  if (::write(wake_.get(), &one, sizeof one) < 0) {
  }
}

int LatencyProxy::Engine::wait(epoll_event* events, Time deadline) {
  if (deadline == Time::max()) return ::epoll_wait(epoll_.get(), events, kMaxEvents, -1);
  const nanoseconds remaining = std::max(deadline - ProxyClock::now(), nanoseconds{0});
  if (use_epoll_pwait2_) {
    // Nanosecond timeouts: epoll_wait's milliseconds would blur every release by up to 1 ms.
    timespec timeout{};
    timeout.tv_sec = static_cast<time_t>(remaining.count() / 1'000'000'000);
    timeout.tv_nsec = static_cast<long>(remaining.count() % 1'000'000'000);
    const int n = ::epoll_pwait2(epoll_.get(), events, kMaxEvents, &timeout, nullptr);
    if (n >= 0 || errno != ENOSYS) return n;
    use_epoll_pwait2_ = false;
    spdlog::warn(
        "dsfs proxy: epoll_pwait2 unavailable (kernel before 5.11); timers round up to 1 ms");
  }
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(remaining).count();
  return ::epoll_wait(epoll_.get(), events, kMaxEvents,
                      static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
}

void LatencyProxy::Engine::run() {
  // The kernel may otherwise fire this thread's timers up to 50 us late to batch wake-ups.
  ::prctl(PR_SET_TIMERSLACK, 1000UL);
  std::array<epoll_event, kMaxEvents> events{};
  Time next_stats =
      options_.stats_interval > 0ns ? ProxyClock::now() + options_.stats_interval : Time::max();
  if (options_.faults.any()) {
    spdlog::info("dsfs proxy: injecting faults, seed {} (--fault-seed repeats the decisions)",
                 fault_seed_);
  }
  if (options_.faults.refuse_for > 0ns) update_refusal(ProxyClock::now());
  while (!stop_requested_.load(std::memory_order_relaxed)) {
    Time deadline = std::min({next_stats, accept_retry_at_, refuse_change_at_});
    if (!timers_.empty()) deadline = std::min(deadline, timers_.top().at);
    if (!deferred_.empty()) deadline = ProxyClock::now();  // poll, then give them their turn
    const int count = wait(events.data(), deadline);
    if (count < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(fmt::format("dsfs proxy: epoll_wait failed: {}", error_text(errno)));
    }
    for (int i = 0; i < count; ++i) {
      const uint64_t token = events[i].data.u64;
      if (token == kListenerToken) {
        accept_clients(ProxyClock::now());
      } else if (token == kWakeToken) {
        uint64_t value = 0;
        if (::read(wake_.get(), &value, sizeof value) < 0) {
        }
        open_adopted(ProxyClock::now());
      } else {
        on_socket_event(token, events[i].events);
      }
      // Releases due now go out between events, not after a whole batch of reads.
      if (!timers_.empty() && timers_.top().at <= ProxyClock::now()) run_due_timers();
    }
    run_due_timers();
    run_deferred();
    const Time now = ProxyClock::now();
    if (now >= accept_retry_at_) {
      accept_retry_at_ = Time::max();
      accept_clients(now);
    }
    if (now >= refuse_change_at_) update_refusal(now);
    closed_.clear();
    if (now >= next_stats) {
      log_stats("");
      next_stats = now + options_.stats_interval;
    }
  }
  for (auto& [id, connection] : connections_) {
    for (Direction& d : connection->directions) {
      subtract(counters_.queued, d.queued());
      release_blocks(d);
    }
  }
  subtract(counters_.open, connections_.size());
  connections_.clear();
  if (options_.stats_interval > 0ns) log_stats("final: ");
}

void LatencyProxy::Engine::accept_clients(Time now) {
  if (!listener_) return;  // closed for a refusal window
  for (;;) {
    UniqueFd client(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (client) {
      const size_t turn = next_engine_++ % (peers_.size() + 1);
      if (turn == 0) {
        open_connection(std::move(client), now);
      } else {
        peers_[turn - 1]->adopt(std::move(client));
      }
      continue;
    }
    const int error = errno;
    if (error == EAGAIN || error == EWOULDBLOCK) return;
    if (error == EINTR || error == ECONNABORTED || error == EPROTO) continue;
    // Out of descriptors or memory: the pending clients wait in the backlog until a retry.
    spdlog::warn("dsfs proxy: cannot accept a connection: {}; retrying in {}", error_text(error),
                 format_duration(kAcceptRetryDelay));
    accept_retry_at_ = now + kAcceptRetryDelay;
    return;
  }
}

void LatencyProxy::Engine::open_connection(UniqueFd client, Time now) {
  add(counters_.accepted, 1);
  const uint64_t id = next_connection_id_;
  next_connection_id_ += connection_id_step_;
  const auto refuse = [&](int error) {
    add(counters_.connect_failures, 1);
    spdlog::warn("dsfs proxy: cannot connect to upstream {}: {}; closing client connection #{}",
                 options_.upstream.describe(), error_text(error), id);
  };
  UniqueFd upstream(::socket(upstream_.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!upstream) return refuse(errno);
  if (options_.listen.kind == SocketAddress::Kind::kTcp) disable_nagle(client.get());
  if (options_.upstream.kind == SocketAddress::Kind::kTcp) disable_nagle(upstream.get());
  bool connecting = false;
  if (::connect(upstream.get(), upstream_.address(), upstream_.length) != 0) {
    if (errno != EINPROGRESS) return refuse(errno);
    connecting = true;
  }

  auto connection = std::make_unique<Connection>();
  Connection& c = *connection;
  c.id = id;
  c.client = std::move(client);
  c.upstream = std::move(upstream);
  c.connecting = connecting;
  Direction& to_upstream = c.directions[kToUpstream];
  to_upstream.index = kToUpstream;
  to_upstream.source = c.client.get();
  to_upstream.destination = c.upstream.get();
  // The TCP handshake a real WAN would cost: the client learns the connection is up one RTT
  // after it began, so its first bytes reach the upstream no earlier than 1.5 RTT after.
  to_upstream.last_release = now + options_.rtt + options_.rtt / 2;
  Direction& to_client = c.directions[kToClient];
  to_client.index = kToClient;
  to_client.source = c.upstream.get();
  to_client.destination = c.client.get();
  to_client.last_release = now;

  for (const Side side : {kClientSide, kUpstreamSide}) {
    epoll_event event{};
    event.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    event.data.u64 = (id << 1) | static_cast<uint64_t>(side);
    const int fd = side == kClientSide ? c.client.get() : c.upstream.get();
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      spdlog::warn("dsfs proxy: epoll_ctl failed for connection #{}: {}; closing it", id,
                   error_text(errno));
      return;
    }
  }
  connections_.emplace(id, std::move(connection));
  add(counters_.open, 1);
  spdlog::debug("dsfs proxy: connection #{} opened", id);
}

void LatencyProxy::Engine::on_socket_event(uint64_t token, uint32_t events) {
  const auto found = connections_.find(token >> 1);
  if (found == connections_.end()) return;  // closed earlier in this turn
  Connection& c = *found->second;
  const Side side = static_cast<Side>(token & 1);
  bool writable = (events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0;
  if (side == kUpstreamSide && c.connecting) {
    if (!writable) return;
    int error = 0;
    socklen_t length = sizeof error;
    if (::getsockopt(c.upstream.get(), SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error != 0) {
      add(counters_.connect_failures, 1);
      spdlog::warn("dsfs proxy: cannot connect to upstream {}: {}; closing client connection #{}",
                   options_.upstream.describe(), error_text(error), c.id);
      close_connection(c, "");
      return;
    }
    c.connecting = false;
  }
  Direction& from = c.directions[side == kClientSide ? kToUpstream : kToClient];
  Direction& to = c.directions[side == kClientSide ? kToClient : kToUpstream];
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    from.source_readable = true;
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) from.source_hung_up = true;
    if (!pump(c, from)) return;
  }
  if (writable) {
    to.destination_full = false;
    pump(c, to);
  }
}

void LatencyProxy::Engine::run_due_timers() {
  const Time now = ProxyClock::now();
  while (!timers_.empty() && timers_.top().at <= now) {
    const Timer timer = timers_.top();
    timers_.pop();
    const auto found = connections_.find(timer.connection);
    if (found == connections_.end()) continue;
    Direction& d = found->second->directions[timer.direction];
    if (d.timer_at != timer.at) continue;  // superseded by a later entry
    d.timer_at.reset();
    pump(*found->second, d);
  }
}

void LatencyProxy::Engine::run_deferred() {
  if (deferred_.empty()) return;
  const auto turn = std::exchange(deferred_, {});
  for (const auto& [id, index] : turn) {
    const auto found = connections_.find(id);
    if (found != connections_.end()) pump(*found->second, found->second->directions[index]);
  }
}

bool LatencyProxy::Engine::can_read(const Connection& c, const Direction& d) const {
  return d.source_readable && !d.end_read && d.queued() < options_.max_queued_bytes &&
         !(c.connecting && d.index == kToClient);
}

bool LatencyProxy::Engine::pump(Connection& c, Direction& d) {
  // Read, write what is released, and again while there is room and data: a write can make
  // room for a source paused by a full queue.
  for (int reads = 0;; ++reads) {
    const bool readable = can_read(c, d);
    if (readable && reads == kReadsPerTurn) {
      deferred_.emplace_back(c.id, d.index);
      break;
    }
    if (readable && read_once(c, d) == ReadOutcome::kClosed) return false;
    if (!flush(c, d, ProxyClock::now())) return false;
    if (!can_read(c, d)) break;
  }
  return settle(c, d);
}

LatencyProxy::Engine::ReadOutcome LatencyProxy::Engine::read_once(Connection& c, Direction& d) {
  // Room: the rest of the tail block, plus a fresh block when that rest is small.
  const size_t index = (d.tail - d.base) / kBlockBytes;
  const size_t offset = (d.tail - d.base) % kBlockBytes;
  std::array<iovec, 2> room{};
  int parts = 0;
  if (index < d.blocks.size()) {
    room[parts++] = {d.blocks[index].get() + offset, kBlockBytes - offset};
  }
  bool fresh_block = false;
  if (parts == 0 || room[0].iov_len < kMinReadBytes) {
    d.blocks.push_back(pool_.take());
    fresh_block = true;
    room[parts++] = {d.blocks.back().get(), kBlockBytes};
  }
  const size_t requested = room[0].iov_len + (parts == 2 ? room[1].iov_len : 0);
  const ssize_t n = ::readv(d.source, room.data(), parts);
  const int error = errno;
  if (fresh_block && (n <= 0 || (parts == 2 && static_cast<size_t>(n) <= room[0].iov_len))) {
    pool_.give(std::move(d.blocks.back()));
    d.blocks.pop_back();
  }
  const Time now = ProxyClock::now();
  if (n > 0) {
    const uint64_t start = d.tail;
    uint64_t end = start;
    size_t kept = static_cast<size_t>(n);
    FaultDecision fault;
    if (options_.faults.any()) {
      fault = faults_.on_chunk(d.index == kToClient, start, kept);
      if (fault.stall) {
        // This chunk and all behind it wait the stall on top of the path's delay.
        d.last_release = std::max(d.last_release, now + options_.rtt / 2) + options_.faults.stall;
        add(counters_.fault_stalls, 1);
        spdlog::debug("dsfs proxy: connection #{}: stalling the {} for {} (injected)", c.id,
                      d.index == kToClient ? "replies" : "requests",
                      format_duration(options_.faults.stall));
      }
      if (fault.cut != FaultDecision::Cut::kNone) kept = fault.keep;
    }
    links_[d.index].schedule(now, kept, d.last_release, [&](size_t piece, Time release) {
      end += piece;
      if (!d.marks.empty() && d.marks.back().release == release) {
        d.marks.back().end = end;
      } else {
        d.marks.push_back({end, release, false});
      }
    });
    d.tail = end;
    add(counters_.queued, kept);
    if (fault.cut != FaultDecision::Cut::kNone) {
      // Deliver what came before the cut at its time, then reset or close (settle()); the rest
      // of the chunk is dropped and nothing more is read from this side.
      d.cut = fault.cut;
      d.end_read = true;
      d.source_readable = false;
      d.marks.push_back({d.tail, links_[d.index].schedule_end(now, d.last_release), true});
      spdlog::debug("dsfs proxy: connection #{}: {} after {} bytes of {} (injected)", c.id,
                    fault.cut == FaultDecision::Cut::kReset ? "reset" : "truncated", d.tail,
                    d.index == kToClient ? "replies" : "requests");
      return ReadOutcome::kProgress;
    }
    // A short read drained the socket: the next arrival raises a new edge. After a hang-up no
    // edge follows the end of the stream, so read on until it.
    if (static_cast<size_t>(n) < requested && !d.source_hung_up) d.source_readable = false;
    return ReadOutcome::kProgress;
  }
  if (n == 0) {
    d.end_read = true;
    d.source_readable = false;
    d.marks.push_back({d.tail, links_[d.index].schedule_end(now, d.last_release), true});
    return ReadOutcome::kProgress;
  }
  if (error == EAGAIN || error == EWOULDBLOCK) {
    d.source_readable = false;
    return ReadOutcome::kIdle;
  }
  if (error == EINTR) return ReadOutcome::kProgress;
  close_connection(
      c, fmt::format("reading from the {}: {}", d.index == kToUpstream ? "client" : "upstream",
                     error_text(error)));
  return ReadOutcome::kClosed;
}

bool LatencyProxy::Engine::flush(Connection& c, Direction& d, Time now) {
  while (!d.marks.empty() && d.marks.front().release <= now) {
    const Mark& mark = d.marks.front();
    d.released_end = mark.end;
    if (mark.end_of_stream) d.end_released = true;
    record_lateness(now - mark.release);
    d.marks.pop_front();
  }
  if (d.destination_full || (c.connecting && d.index == kToUpstream)) return true;
  while (d.head < d.released_end) {
    std::array<iovec, kMaxWriteIovecs> parts{};
    int count = 0;
    for (uint64_t at = d.head; count < kMaxWriteIovecs && at < d.released_end;) {
      const size_t offset = (at - d.base) % kBlockBytes;
      const size_t length =
          static_cast<size_t>(std::min<uint64_t>(kBlockBytes - offset, d.released_end - at));
      parts[count++] = {d.blocks[(at - d.base) / kBlockBytes].get() + offset, length};
      at += length;
    }
    msghdr message{};
    message.msg_iov = parts.data();
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t n = ::sendmsg(d.destination, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      const int error = errno;
      if (error == EINTR) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) {
        d.destination_full = true;  // edge-triggered EPOLLOUT says when there is room
        break;
      }
      close_connection(
          c, fmt::format("writing to the {}: {}", d.index == kToUpstream ? "upstream" : "client",
                         error_text(error)));
      return false;
    }
    d.head += static_cast<uint64_t>(n);
    subtract(counters_.queued, static_cast<uint64_t>(n));
    add(d.index == kToUpstream ? counters_.to_upstream : counters_.to_client,
        static_cast<uint64_t>(n));
    while (d.head - d.base >= kBlockBytes) {
      pool_.give(std::move(d.blocks.front()));
      d.blocks.pop_front();
      d.base += kBlockBytes;
    }
  }
  if (d.head == d.tail) release_blocks(d);
  return true;
}

bool LatencyProxy::Engine::settle(Connection& c, Direction& d) {
  // An upstream still connecting cannot be shut down yet; the connect completion pumps again.
  const bool connecting = c.connecting && d.index == kToUpstream;
  if (d.end_released && d.head == d.tail && !d.finished && !connecting) {
    if (d.cut != FaultDecision::Cut::kNone) {
      close_connection(c, "injected fault", d.cut);
      return false;
    }
    d.finished = true;
    ::shutdown(d.destination, SHUT_WR);  // ENOTCONN when the peer is already gone: fine
    if (c.directions[kToUpstream].finished && c.directions[kToClient].finished) {
      close_connection(c, "");
      return false;
    }
  }
  if (!d.marks.empty() && d.timer_at != d.marks.front().release) {
    d.timer_at = d.marks.front().release;
    timers_.push({*d.timer_at, c.id, d.index});
  }
  return true;
}

void LatencyProxy::Engine::release_blocks(Direction& d) {
  for (auto& block : d.blocks) pool_.give(std::move(block));
  d.blocks.clear();
  d.base = d.tail;
}

void LatencyProxy::Engine::close_connection(Connection& c, std::string_view why,
                                            FaultDecision::Cut cut) {
  if (cut == FaultDecision::Cut::kReset) {
    // A zero linger makes close() send RST (TCP); a unix socket just sees the close.
    const linger abort{.l_onoff = 1, .l_linger = 0};
    for (const UniqueFd* fd : {&c.client, &c.upstream}) {
      if (*fd) ::setsockopt(fd->get(), SOL_SOCKET, SO_LINGER, &abort, sizeof abort);
    }
    add(counters_.fault_resets, 1);
  } else if (cut == FaultDecision::Cut::kTruncate) {
    add(counters_.fault_truncations, 1);
  }
  if (why.empty()) {
    spdlog::debug("dsfs proxy: connection #{} closed", c.id);
  } else {
    spdlog::debug("dsfs proxy: connection #{} closed: {}", c.id, why);
  }
  for (Direction& d : c.directions) {
    subtract(counters_.queued, d.queued());
    d.head = d.tail;
    d.marks.clear();
    release_blocks(d);
  }
  c.client.reset();
  c.upstream.reset();
  const auto found = connections_.find(c.id);
  if (found == connections_.end()) return;
  closed_.push_back(std::move(found->second));
  connections_.erase(found);
  subtract(counters_.open, 1);
}

void LatencyProxy::Engine::record_lateness(nanoseconds lateness) {
  const auto ns = static_cast<uint64_t>(std::max<int64_t>(lateness.count(), 0));
  add(counters_.releases, 1);
  add(counters_.lateness_sum_ns, ns);
  uint64_t most = counters_.lateness_max_ns.load(std::memory_order_relaxed);
  while (ns > most &&
         !counters_.lateness_max_ns.compare_exchange_weak(most, ns, std::memory_order_relaxed)) {
  }
  const size_t bucket = std::min<size_t>(std::bit_width(ns / 1000), kLatenessBuckets - 1);
  add(counters_.lateness_buckets[bucket], 1);
}

ProxyStats LatencyProxy::Engine::stats() const {
  const auto load = [](const std::atomic<uint64_t>& counter) {
    return counter.load(std::memory_order_relaxed);
  };
  ProxyStats stats;
  stats.connections_accepted = load(counters_.accepted);
  stats.connections_open = load(counters_.open);
  stats.upstream_connect_failures = load(counters_.connect_failures);
  stats.bytes_to_upstream = load(counters_.to_upstream);
  stats.bytes_to_client = load(counters_.to_client);
  stats.bytes_queued = load(counters_.queued);
  stats.releases = load(counters_.releases);
  if (stats.releases > 0) {
    stats.lateness_mean_ms = static_cast<double>(load(counters_.lateness_sum_ns)) / 1e6 /
                             static_cast<double>(stats.releases);
    uint64_t seen = 0;
    for (size_t bucket = 0; bucket < kLatenessBuckets; ++bucket) {
      seen += load(counters_.lateness_buckets[bucket]);
      if (static_cast<double>(seen) >= 0.99 * static_cast<double>(stats.releases)) {
        stats.lateness_p99_ms = static_cast<double>(uint64_t{1} << bucket) / 1e3;
        break;
      }
    }
    stats.lateness_max_ms = static_cast<double>(load(counters_.lateness_max_ns)) / 1e6;
  }
  stats.fault_resets = load(counters_.fault_resets);
  stats.fault_truncations = load(counters_.fault_truncations);
  stats.fault_stalls = load(counters_.fault_stalls);
  stats.refuse_windows = load(counters_.refuse_windows);
  stats.refusing = counters_.refusing.load(std::memory_order_relaxed);
  stats.fault_seed = fault_seed_;
  return stats;
}

void LatencyProxy::Engine::log_stats(std::string_view when) {
  const ProxyStats s = stats();
  const uint64_t moved = s.bytes_to_upstream + s.bytes_to_client;
  const Time now = ProxyClock::now();
  const double seconds =
      std::max(std::chrono::duration<double>(now - last_stats_at_).count(), 1e-3);
  last_stats_at_ = now;
  spdlog::info(
      "dsfs proxy: {}connections open {}, accepted {}, upstream connect failures {}; {} to "
      "upstream, {} to clients ({}/s lately); {} queued; release lateness mean {:.3f} ms, "
      "p99 < {:.3f} ms, max {:.3f} ms",
      when, s.connections_open, s.connections_accepted, s.upstream_connect_failures,
      format_bytes(static_cast<double>(s.bytes_to_upstream)),
      format_bytes(static_cast<double>(s.bytes_to_client)),
      format_bytes(static_cast<double>(moved - bytes_at_last_stats_) / seconds),
      format_bytes(static_cast<double>(s.bytes_queued)), s.lateness_mean_ms, s.lateness_p99_ms,
      s.lateness_max_ms);
  if (options_.faults.any()) {
    spdlog::info(
        "dsfs proxy: {}faults injected: {} resets, {} truncated replies, {} stalls, {} refusal "
        "windows{}",
        when, s.fault_resets, s.fault_truncations, s.fault_stalls, s.refuse_windows,
        s.refusing ? " (refusing now)" : "");
  }
  bytes_at_last_stats_ = moved;
}

// ---- public wrappers ----

LatencyProxy::LatencyProxy(ProxyOptions options) : counters_(std::make_unique<SharedCounters>()) {
  validate_proxy_options(options);
  for (size_t index = 0; index < options.threads; ++index) {
    engines_.push_back(std::make_unique<Engine>(options, counters_->counters, index));
  }
  std::vector<Engine*> peers;
  for (size_t index = 1; index < engines_.size(); ++index) peers.push_back(engines_[index].get());
  engines_[0]->set_peers(std::move(peers));
}
LatencyProxy::~LatencyProxy() = default;
const SocketAddress& LatencyProxy::listening_address() const {
  return engines_[0]->listening_address();
}
const ProxyOptions& LatencyProxy::options() const {
  return engines_[0]->options();
}
void LatencyProxy::run() {
  std::vector<std::exception_ptr> failures(engines_.size());
  std::vector<std::thread> threads;
  for (size_t index = 1; index < engines_.size(); ++index) {
    threads.emplace_back([this, index, &failures] {
      name_this_thread(fmt::format("proxy-{}", index));
      try {
        engines_[index]->run();
      } catch (...) {
        failures[index] = std::current_exception();
        engines_[0]->stop();  // one engine failing stops the proxy
      }
    });
  }
  try {
    engines_[0]->run();
  } catch (...) {
    failures[0] = std::current_exception();
  }
  for (size_t index = 1; index < engines_.size(); ++index) engines_[index]->stop();
  for (std::thread& thread : threads) thread.join();
  for (std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
}
void LatencyProxy::stop() noexcept {
  for (const std::unique_ptr<Engine>& engine : engines_) engine->stop();
}
ProxyStats LatencyProxy::stats() const {
  return engines_[0]->stats();
}

BackgroundProxy::BackgroundProxy(ProxyOptions options) : proxy_(std::move(options)) {
  thread_ = std::thread([this] {
    try {
      proxy_.run();
    } catch (...) {
      failure_ = std::current_exception();
    }
  });
}

BackgroundProxy::~BackgroundProxy() {
  proxy_.stop();
  if (thread_.joinable()) thread_.join();
}

void BackgroundProxy::stop() {
  proxy_.stop();
  if (thread_.joinable()) thread_.join();
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

}  // namespace dsfs::tools
