// `dsfs proxy`: options, the listening line, the port file and signal handling around
// tools::LatencyProxy.
#include "tools/proxy_command.h"

#include <sched.h>
#include <sys/resource.h>

#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "tools/proxy.h"

namespace dsfs::tools {
namespace {

std::atomic<LatencyProxy*> g_signalled_proxy{nullptr};
static_assert(std::atomic<LatencyProxy*>::is_always_lock_free,
              "the signal handler needs a lock-free atomic");

extern "C" void on_proxy_stop_signal(int) {
  if (LatencyProxy* proxy = g_signalled_proxy.load()) proxy->stop();
}

// SIGINT/SIGTERM stop `proxy` (run() returns, the command exits 0) while this lives.
class StopSignalGuard {
 public:
  explicit StopSignalGuard(LatencyProxy& proxy) {
    g_signalled_proxy.store(&proxy);
    struct sigaction action {};
    action.sa_handler = on_proxy_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &previous_int_);
    sigaction(SIGTERM, &action, &previous_term_);
  }
  ~StopSignalGuard() {
    sigaction(SIGINT, &previous_int_, nullptr);
    sigaction(SIGTERM, &previous_term_, nullptr);
    g_signalled_proxy.store(nullptr);
  }
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

// Writes the port to `path` (via a rename, so a reader never sees half a file) and removes the
// file again on destruction.
class PortFile {
 public:
  PortFile(std::filesystem::path path, int port) : path_(std::move(path)) {
    if (path_.empty()) return;
    const std::filesystem::path partial = path_.string() + ".partial";
    {
      std::ofstream out(partial, std::ios::trunc);
      out << port << '\n';
      if (!out.flush()) {
        throw std::runtime_error(fmt::format("cannot write the port file {}", partial.string()));
      }
    }
    std::error_code error;
    std::filesystem::rename(partial, path_, error);
    if (error) {
      throw std::runtime_error(
          fmt::format("cannot write the port file {}: {}", path_.string(), error.message()));
    }
  }
  ~PortFile() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove(path_, ignored);
  }
  PortFile(const PortFile&) = delete;
  PortFile& operator=(const PortFile&) = delete;

 private:
  std::filesystem::path path_;
};

// Each connection costs two descriptors; the default soft limit (often 1024) would cap the
// proxy at about 500 clients.
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

// SCHED_FIFO, as the kernel's network stack would run ahead of user processes: on a busy
// machine a normal thread can wait a whole scheduler tick (4 ms at HZ=250) for its CPU after a
// release time. The kernel's RT throttling still leaves other processes 5% of every second.
void use_realtime_scheduling() {
  sched_param param{};
  param.sched_priority = 1;
  if (::sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &param) != 0) {
    spdlog::warn(
        "dsfs proxy: --realtime: cannot switch to SCHED_FIFO ({}); running at normal "
        "priority (needs root or CAP_SYS_NICE)",
        std::strerror(errno));
  }
}

struct ProxyCommandState {
  std::string listen;
  std::string upstream;
  std::string rtt;
  std::string jitter = "0";
  std::string rate = "0";
  size_t max_queue_mib = 64;
  std::string port_file;
  std::string stats = "0";
  uint64_t seed = 0;
  bool realtime = false;
  std::string stats_file;
  // Faults (FaultOptions).
  uint64_t reset_after_bytes = 0;
  double reset_probability = 0;
  double truncate_probability = 0;
  double stall_probability = 0;
  std::string stall = "0";
  std::string refuse_for = "0";
  std::string refuse_every = "0";
  uint64_t fault_seed = 0;
  size_t threads = 1;
};

// Runs `parse` on `text`, naming `option` in the error.
template <typename Parse>
auto parse_option(std::string_view option, const std::string& text, Parse&& parse) {
  try {
    return parse(text);
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(fmt::format("{}: {}", option, e.what()));
  }
}

ProxyOptions make_options(const ProxyCommandState& state) {
  ProxyOptions options;
  options.listen = parse_option("--listen", state.listen, parse_socket_address);
  options.upstream = parse_option("--upstream", state.upstream, parse_socket_address);
  options.rtt = parse_option("--rtt", state.rtt, parse_duration);
  options.jitter = parse_option("--jitter", state.jitter, parse_duration);
  options.rate_bytes_per_second = parse_option("--rate", state.rate, parse_rate);
  options.stats_interval = parse_option("--stats", state.stats, parse_duration);
  options.max_queued_bytes = state.max_queue_mib << 20;
  options.jitter_seed = state.seed;
  options.threads = state.threads;
  FaultOptions& faults = options.faults;
  faults.reset_after_bytes = state.reset_after_bytes;
  faults.reset_probability = state.reset_probability;
  faults.truncate_probability = state.truncate_probability;
  faults.stall_probability = state.stall_probability;
  faults.stall = parse_option("--stall", state.stall, parse_duration);
  faults.refuse_for = parse_option("--refuse-for", state.refuse_for, parse_duration);
  faults.refuse_every = parse_option("--refuse-every", state.refuse_every, parse_duration);
  faults.seed = state.fault_seed;
  if (!state.port_file.empty() && options.listen.kind == SocketAddress::Kind::kUnix) {
    throw std::invalid_argument("--port-file: --listen is a unix socket, which has no port");
  }
  validate_proxy_options(options);
  return options;
}

nlohmann::json stats_json(const ProxyStats& s) {
  return nlohmann::json{
      {"connections_accepted", s.connections_accepted},
      {"connections_open", s.connections_open},
      {"upstream_connect_failures", s.upstream_connect_failures},
      {"bytes_to_upstream", s.bytes_to_upstream},
      {"bytes_to_client", s.bytes_to_client},
      {"bytes_queued", s.bytes_queued},
      {"releases", s.releases},
      {"lateness_mean_ms", s.lateness_mean_ms},
      {"lateness_p99_ms", s.lateness_p99_ms},
      {"lateness_max_ms", s.lateness_max_ms},
      {"faults",
       {{"resets", s.fault_resets},
        {"truncations", s.fault_truncations},
        {"stalls", s.fault_stalls},
        {"refuse_windows", s.refuse_windows},
        {"refusing", s.refusing},
        {"seed", s.fault_seed}}},
  };
}

// Writes the counters as JSON to `path` every `interval` from its own thread (stats() may be
// read from any thread) and once more when destroyed, after the proxy stopped. Each write is a
// rename, so a reader never sees half a file; a failed write is logged, never fatal.
class StatsFileWriter {
 public:
  StatsFileWriter(const LatencyProxy& proxy, std::string path, std::chrono::nanoseconds interval)
      : proxy_(proxy), path_(std::move(path)), interval_(interval) {
    if (path_.empty()) return;
    write();
    thread_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      while (!stopping_) {
        if (wake_.wait_for(lock, interval_, [this] { return stopping_; })) break;
        write();
      }
    });
  }
  ~StatsFileWriter() {
    if (path_.empty()) return;
    {
      const std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    write();
  }
  StatsFileWriter(const StatsFileWriter&) = delete;
  StatsFileWriter& operator=(const StatsFileWriter&) = delete;

 private:
  void write() const {
    const std::string partial = path_ + ".partial";
    {
      std::ofstream out(partial, std::ios::trunc);
      out << stats_json(proxy_.stats()).dump() << '\n';
      if (!out.flush()) {
        spdlog::warn("dsfs proxy: cannot write the stats file {}", partial);
        return;
      }
    }
    std::error_code error;
    std::filesystem::rename(partial, path_, error);
    if (error)
      spdlog::warn("dsfs proxy: cannot write the stats file {}: {}", path_, error.message());
  }

  const LatencyProxy& proxy_;
  std::string path_;
  std::chrono::nanoseconds interval_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

std::string describe_faults(const FaultOptions& f) {
  std::vector<std::string> parts;
  if (f.reset_after_bytes > 0)
    parts.push_back(fmt::format("reset after {} bytes", f.reset_after_bytes));
  if (f.reset_probability > 0) parts.push_back(fmt::format("reset p={}", f.reset_probability));
  if (f.truncate_probability > 0)
    parts.push_back(fmt::format("truncate p={}", f.truncate_probability));
  if (f.stall_probability > 0) {
    parts.push_back(fmt::format("stall {} p={}", format_duration(f.stall), f.stall_probability));
  }
  if (f.refuse_for > std::chrono::nanoseconds{0}) {
    parts.push_back(f.refuse_every > std::chrono::nanoseconds{0}
                        ? fmt::format("refuse {} every {}", format_duration(f.refuse_for),
                                      format_duration(f.refuse_every))
                        : fmt::format("refuse the first {}", format_duration(f.refuse_for)));
  }
  std::string text;
  for (const std::string& part : parts) text += (text.empty() ? "" : ", ") + part;
  return text;
}

void run_proxy(const ProxyCommandState& state) {
  const ProxyOptions options = make_options(state);
  raise_open_file_limit();
  if (!state.port_file.empty()) {
    // A stale file from an earlier run would hand a waiting script the wrong port.
    std::error_code ignored;
    std::filesystem::remove(state.port_file, ignored);
  }
  LatencyProxy proxy(options);
  if (state.realtime) use_realtime_scheduling();
  const StopSignalGuard signals(proxy);
  const PortFile port_file(state.port_file, proxy.listening_address().port);
  const std::string faults = describe_faults(options.faults);
  fmt::print("dsfs proxy: {} -> {}, rtt {}, jitter {}, rate {}{}{}{}\n",
             proxy.listening_address().describe(), options.upstream.describe(),
             format_duration(options.rtt), format_duration(options.jitter),
             format_rate(options.rate_bytes_per_second),
             options.threads > 1 ? fmt::format(", {} threads", options.threads) : "",
             faults.empty() ? "" : "; faults: ", faults);
  std::fflush(stdout);
  {
    const StatsFileWriter stats_file(proxy, state.stats_file,
                                     options.stats_interval > std::chrono::nanoseconds{0}
                                         ? options.stats_interval
                                         : std::chrono::seconds{1});
    proxy.run();
  }
  spdlog::info("dsfs proxy: stopped");
}

}  // namespace

void register_proxy_command(CLI::App& app, cli::GlobalOptions& global) {
  auto state = std::make_shared<ProxyCommandState>();
  CLI::App* sub = app.add_subcommand(
      "proxy",
      "Emulate a WAN link in user space (no tc netem needed): forward every connection made to\n"
      "--listen to --upstream, delaying each direction by half of --rtt (so a request and its\n"
      "reply take one RTT more), keeping the bytes of each connection in order. A new\n"
      "connection's first bytes also wait for an emulated TCP handshake (one more RTT).\n"
      "When one side closes, what is queued is delivered, then the other side is closed.\n"
      "Prints one line once it listens; SIGINT/SIGTERM stop it (exit 0).\n"
      "Fault injection (to test clients): resets, truncated replies, stalls and refused\n"
      "connects, each counted in the --stats lines and --stats-file.\n"
      "Example: dsfs proxy --listen 127.0.0.1:7000 --upstream 127.0.0.1:6379 --rtt 100ms");
  sub->add_option("--listen", state->listen,
                  "Where clients connect: HOST:PORT, [IPV6]:PORT or unix:/PATH (a stale socket "
                  "file there is replaced; the file is removed on exit). Port 0: any free port "
                  "(see --port-file)")
      ->required();
  sub->add_option("--upstream", state->upstream,
                  "The server to forward to: HOST:PORT, [IPV6]:PORT or unix:/PATH")
      ->required();
  sub->add_option("--rtt", state->rtt,
                  "Round-trip time to add: a number and a unit ns, us, ms or s (100ms, 0.5s, "
                  "250us), or 0")
      ->required();
  sub->add_option("--jitter", state->jitter,
                  "Random variation: each direction's delay is uniform in rtt/2 +/- jitter/2, so a "
                  "round trip stays within rtt +/- jitter; never reorders bytes. At most --rtt")
      ->capture_default_str();
  sub->add_option("--rate", state->rate,
                  "Bandwidth of each direction, shared by all connections like one network "
                  "interface (bytes are serialized at this rate, no burst): 500kbit, 100mbit, "
                  "1gbit (bits/s, SI) or 10MB, 64MiB (bytes/s); 0: unlimited")
      ->capture_default_str();
  sub->add_option("--max-queue-mib", state->max_queue_mib,
                  "Bytes one direction of one connection may hold, in MiB; beyond it the proxy "
                  "stops reading that side until it drains (backpressure)")
      ->check(CLI::Range(size_t{1}, size_t{4096}))
      ->capture_default_str();
  sub->add_option("--threads", state->threads,
                  "Threads forwarding bytes, each serving its share of the connections, for a "
                  "path where one thread runs out of CPU (one carried 1.5 GB/s of replies held "
                  "100 ms on 0.7 of a CPU). Above 1 only without --rate and without fault "
                  "injection")
      ->check(CLI::Range(size_t{1}, size_t{64}))
      ->capture_default_str();
  sub->add_option("--port-file", state->port_file,
                  "Write the port it listens on to this file once listening (useful with port "
                  "0); removed on exit");
  sub->add_option("--stats", state->stats,
                  "Log counters (connections, bytes, how late releases were) on stderr at this "
                  "interval, e.g. 5s, and once more on exit; 0: never")
      ->capture_default_str();
  sub->add_option("--seed", state->seed, "Seed of the jitter; 0: random")->capture_default_str();
  sub->add_option("--stats-file", state->stats_file,
                  "Write the counters (connections, bytes, faults injected) as JSON to this file "
                  "every --stats interval (every 1s when --stats is 0) and once more on exit");
  // Faults.
  const std::string faults = "Fault injection";
  sub->add_option(
         "--reset-after", state->reset_after_bytes,
         "Reset (TCP RST) every connection once this many bytes of replies went to its "
         "client: it gets these bytes (fewer if they still sat in the proxy's send buffer), "
         "then ECONNRESET; 0: never")
      ->group(faults)
      ->capture_default_str();
  sub->add_option("--reset-probability", state->reset_probability,
                  "Chance, per chunk forwarded in either direction (what one read returned, up "
                  "to 512 KiB), that the connection is reset at a random byte of it")
      ->group(faults)
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--truncate-probability", state->truncate_probability,
                  "Chance, per chunk of replies, that only a random part of it is delivered and "
                  "the connection then closed normally (the client sees a cut reply, then EOF)")
      ->group(faults)
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--stall-probability", state->stall_probability,
                  "Chance, per chunk forwarded in either direction, that it and everything after "
                  "it on that connection wait --stall longer (order is kept)")
      ->group(faults)
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--stall", state->stall, "How long an injected stall lasts, e.g. 500ms")
      ->group(faults)
      ->capture_default_str();
  sub->add_option("--refuse-for", state->refuse_for,
                  "Refuse new connections (the listening socket is closed: ECONNREFUSED) for "
                  "this long after starting, e.g. 2s; open connections are not touched")
      ->group(faults)
      ->capture_default_str();
  sub->add_option("--refuse-every", state->refuse_every,
                  "Repeat the --refuse-for window at this period (must be longer), e.g. 10s; 0: "
                  "only once, at the start")
      ->group(faults)
      ->capture_default_str();
  sub->add_option("--fault-seed", state->fault_seed,
                  "Seed of the fault decisions (the same seed draws the same sequence; which "
                  "bytes they hit depends on how the kernel splits reads); 0: random, logged")
      ->group(faults)
      ->capture_default_str();
  sub->add_flag("--realtime", state->realtime,
                "Run at real-time priority (SCHED_FIFO 1; root or CAP_SYS_NICE), as a kernel "
                "network stack would: on a busy machine releases then stay within about 1 ms "
                "instead of waiting up to a scheduler tick (4 ms) for a CPU");
  cli::add_log_level_option(*sub, global);
  sub->callback([state, &global] {
    cli::apply_log_level(global);
    run_proxy(*state);
  });
}

}  // namespace dsfs::tools
