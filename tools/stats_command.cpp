// `dsfs stats MOUNT`: reads .dsfs/stats.json and prints its figures, once or live.
#include "tools/stats_command.h"

#include <fmt/core.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <sstream>
#include <string_view>
#include <thread>

#include "src/cli/common.h"
#include "src/store/log_text.h"
#include "tools/plan_command.h"
#include "tools/progress.h"
#include "tools/stop_signal.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr std::string_view kMissing = "-";
constexpr double kMegabyte = 1e6;

// The member at `path` (object keys, outermost first), or nullptr when any step is missing or
// not an object. Never throws, whatever the JSON holds.
const Json* find(const Json& json, std::initializer_list<std::string_view> path) {
  const Json* node = &json;
  for (std::string_view key : path) {
    if (!node->is_object()) return nullptr;
    const auto it = node->find(key);
    if (it == node->end()) return nullptr;
    node = &*it;
  }
  return node;
}

std::optional<double> number(const Json& json, std::initializer_list<std::string_view> path) {
  const Json* node = find(json, path);
  if (!node || !node->is_number()) return std::nullopt;
  const double value = node->get<double>();
  if (!std::isfinite(value)) return std::nullopt;
  return value;
}

std::string text(const Json& json, std::initializer_list<std::string_view> path) {
  const Json* node = find(json, path);
  return node && node->is_string() ? node->get<std::string>() : std::string(kMissing);
}

std::string count_text(std::optional<double> value) {
  if (!value || *value < 0) return std::string(kMissing);
  return format_count(static_cast<uint64_t>(std::llround(*value)));
}

// Decimal units, as `dsfs bench` and `dsfs list` print them (MB = 10^6 bytes).
std::string bytes_text(std::optional<double> value) {
  if (!value || *value < 0) return std::string(kMissing);
  static constexpr const char* kUnits[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  double scaled = *value;
  size_t unit = 0;
  while (scaled >= 1000 && unit + 1 < std::size(kUnits)) {
    scaled /= 1000;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", scaled)
                   : fmt::format("{:.1f} {}", scaled, kUnits[unit]);
}

// Three significant-ish digits from microseconds to seconds.
std::string milliseconds_text(std::optional<double> ms) {
  if (!ms || *ms < 0) return std::string(kMissing);
  if (*ms < 10) return fmt::format("{:.2f} ms", *ms);
  if (*ms < 1000) return fmt::format("{:.1f} ms", *ms);
  return fmt::format("{:.2f} s", *ms / 1000);
}

std::string microseconds_text(std::optional<double> us) {
  return milliseconds_text(us ? std::optional<double>(*us / 1000) : std::nullopt);
}

std::string percent_text(std::optional<double> fraction) {
  if (!fraction || *fraction < 0) return std::string(kMissing);
  return fmt::format("{:.1f}%", *fraction * 100);
}

std::string fixed_text(std::optional<double> value, int decimals) {
  if (!value) return std::string(kMissing);
  return fmt::format("{:.{}f}", *value, decimals);
}

std::string row(std::string_view label, std::string_view content) {
  return fmt::format("{:<11}{}\n", label, content);
}

std::string predictors_text(const Json& prefetch) {
  const Json* predictors = find(prefetch, {"predictors"});
  if (!predictors || !predictors->is_array()) return std::string(kMissing);
  if (predictors->empty()) return "none";
  std::string line;
  for (const Json& predictor : *predictors) {
    if (!line.empty()) line += "  ";
    const std::optional<double> foreseen = number(predictor, {"foreseen"});
    const std::optional<double> scored = number(predictor, {"scored"});
    line += fmt::format("{} {}", text(predictor, {"name"}),
                        fixed_text(number(predictor, {"score"}), 2));
    if (foreseen || scored) {
      line += fmt::format(" ({}/{})", count_text(foreseen), count_text(scored));
    }
  }
  return line;
}

std::string prefetch_rows(const Json& stats) {
  const Json* prefetch = find(stats, {"prefetch"});
  if (!prefetch || !prefetch->is_object()) {
    return row("prefetch", "- (no prefetch figures: this mount's dsfs predates the engine)");
  }
  const Json& p = *prefetch;
  std::string rows;
  rows += row("prefetch", fmt::format("mode {}  leader {}  epoch {}", text(p, {"mode"}),
                                      text(p, {"leader"}), count_text(number(p, {"epoch"}))));
  rows += row("reads", fmt::format("hit {}  ready {}  joined {}  miss {}",
                                   percent_text(number(p, {"reads", "hit_rate"})),
                                   count_text(number(p, {"reads", "ready"})),
                                   count_text(number(p, {"reads", "joined"})),
                                   count_text(number(p, {"reads", "miss"}))));
  const std::optional<double> stall_total_s = number(p, {"stall_us", "total_s"});
  rows +=
      row("stall",
          fmt::format("p50 {}  p99 {}  max {}  total {}",
                      microseconds_text(number(p, {"stall_us", "p50"})),
                      microseconds_text(number(p, {"stall_us", "p99"})),
                      microseconds_text(number(p, {"stall_us", "max"})),
                      milliseconds_text(stall_total_s ? std::optional<double>(*stall_total_s * 1000)
                                                      : std::nullopt)));
  rows += row("bytes", fmt::format("prefetched {}  used {}  wasted {}",
                                   bytes_text(number(p, {"bytes", "prefetched"})),
                                   bytes_text(number(p, {"bytes", "used"})),
                                   bytes_text(number(p, {"bytes", "wasted"}))));
  rows += row("in flight", fmt::format("{} objects ({})  target {}  max {}",
                                       count_text(number(p, {"inflight", "objects"})),
                                       bytes_text(number(p, {"inflight", "bytes"})),
                                       count_text(number(p, {"inflight", "target"})),
                                       count_text(number(p, {"inflight", "max"}))));
  const std::optional<double> rtt_ms = number(p, {"rtt_ms"});
  rows += row("redis",
              fmt::format("rtt {}  connections {}",
                          rtt_ms && *rtt_ms == 0 ? "not measured yet" : milliseconds_text(rtt_ms),
                          count_text(number(p, {"connections"}))));
  rows += row("consuming",
              fmt::format("{} files/s", fixed_text(number(p, {"consumption_files_per_s"}), 1)));
  rows += row("plan", fmt::format("{} entries  {} unresolved  position {}  writers {}",
                                  count_text(number(p, {"plan", "entries"})),
                                  count_text(number(p, {"plan", "unresolved"})),
                                  count_text(number(p, {"plan", "position"})),
                                  count_text(number(p, {"plan", "writers"}))));
  rows += row("predictors", predictors_text(p));
  return rows;
}

std::string cache_row(const Json& stats) {
  const std::optional<double> bytes = number(stats, {"cache", "bytes"});
  const std::optional<double> capacity = number(stats, {"cache", "capacity_bytes"});
  std::string fill;
  if (bytes && capacity && *capacity > 0)
    fill = fmt::format(" ({:.1f}%)", *bytes / *capacity * 100);
  return row("cache", fmt::format("{} of {}{}  {} objects", bytes_text(bytes), bytes_text(capacity),
                                  fill, count_text(number(stats, {"cache", "entries"}))));
}

// The daemon's resident memory and what it gave back to the system when reads paused.
std::string memory_row(const Json& stats) {
  return row("memory", fmt::format("RSS {}  given back {} ({} trims)",
                                   bytes_text(number(stats, {"memory", "rss_bytes"})),
                                   bytes_text(number(stats, {"memory", "released_bytes"})),
                                   count_text(number(stats, {"memory", "trims"}))));
}

// The disk tier (--disk-cache), or "" without one: fill, hits (and how many of them were read
// around the page cache, with O_DIRECT), bytes read, writes and what went
// wrong there (each a read that went to Redis instead, never an error), then the engine's stagers
// (--disk-cache-readers): files queued or being read from the tier into memory now, and the peak.
std::string disk_tier_row(const Json& stats) {
  const Json* tier = find(stats, {"disk_tier"});
  if (!tier || !tier->is_object()) return "";
  const std::optional<double> used = number(*tier, {"bytes_used"});
  const std::optional<double> capacity = number(*tier, {"capacity_bytes"});
  std::string fill;
  if (used && capacity && *capacity > 0) fill = fmt::format(" ({:.1f}%)", *used / *capacity * 100);
  return row(
      "disk tier",
      fmt::format(
          "{} of {}{}  {} objects  hits {} ({} direct)  misses {}  read {}  written {}  "
          "deferred {}  dropped {}  bad files {}  write errors {}",
          bytes_text(used), bytes_text(capacity), fill, count_text(number(*tier, {"entries"})),
          count_text(number(*tier, {"hits"})), count_text(number(*tier, {"direct_reads"})),
          count_text(number(*tier, {"misses"})), bytes_text(number(*tier, {"bytes_read"})),
          count_text(number(*tier, {"writes"})), count_text(number(*tier, {"writes_deferred"})),
          count_text(number(*tier, {"writes_dropped"})),
          count_text(number(*tier, {"checksum_failures"})),
          count_text(number(*tier, {"write_errors"}))) +
          fmt::format("  staging {} (peak {}, {} readers, {} before the first read, {} passed on)",
                      count_text(number(stats, {"prefetch", "disk_staging", "objects"})),
                      count_text(number(stats, {"prefetch", "disk_staging", "peak"})),
                      count_text(number(stats, {"prefetch", "disk_staging", "threads"})),
                      count_text(number(stats, {"prefetch", "disk_staging", "before_first_read"})),
                      count_text(number(stats, {"prefetch", "disk_staging", "passed_on"}))));
}

// The datasets shown and what the watcher changed: "3 listed  added 1  removed 0  refreshed 2
// pending ds (generation 5)".
std::string datasets_row(const Json& stats) {
  const Json* listed = find(stats, {"datasets"});
  const std::string count = listed && listed->is_object()
                                ? count_text(static_cast<double>(listed->size()))
                                : std::string(kMissing);
  const Json* watch = find(stats, {"watch"});
  if (!watch) return row("datasets", fmt::format("{} listed", count));
  std::string line = fmt::format(
      "{} listed  added {}  removed {}  refreshed {}", count, count_text(number(*watch, {"added"})),
      count_text(number(*watch, {"removed"})), count_text(number(*watch, {"refreshed"})));
  if (const Json* pending = find(*watch, {"pending"}); pending && pending->is_object()) {
    for (const auto& [name, generation] : pending->items()) {
      line += fmt::format(
          "  pending {} (generation {}; `dsfs refresh`)", store::log_text(name),
          count_text(generation.is_number() ? std::optional<double>(generation.get<double>())
                                            : std::nullopt));
    }
  }
  return row("datasets", line);
}

// current - previous, or nullopt if either is missing or the counter went backwards.
std::optional<double> delta(const Json& previous, const Json& current,
                            std::initializer_list<std::string_view> path) {
  const std::optional<double> before = number(previous, path);
  const std::optional<double> after = number(current, path);
  if (!before || !after || *after < *before) return std::nullopt;
  return *after - *before;
}

std::string rate_text(std::optional<double> amount, double seconds, double unit,
                      std::string_view suffix) {
  if (!amount || seconds <= 0) return fmt::format("{} {}", kMissing, suffix);
  return fmt::format("{:.1f} {}", *amount / unit / seconds, suffix);
}

}  // namespace

std::string read_stats_text(const fs::path& mount) {
  const fs::path file = mount / kStatsFile;
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    throw std::runtime_error(cli::unreadable_in_mount(file.string(), mount.string(), errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw std::runtime_error(
        fmt::format("cannot read {}: {}", file.string(), std::strerror(errno)));
  }
  return std::move(text).str();
}

Json read_stats_json(const fs::path& mount) {
  Json stats = Json::parse(read_stats_text(mount), nullptr, /*allow_exceptions=*/false);
  if (!stats.is_object()) {
    throw std::runtime_error(fmt::format("{} is not a JSON object; is {} a dsfs mount?",
                                         (mount / kStatsFile).string(), mount.string()));
  }
  return stats;
}

std::string format_stats_summary(const Json& stats, const std::string& mount) {
  const std::optional<double> uptime = number(stats, {"uptime_s"});
  std::string summary = fmt::format("dsfs stats {}  uptime {}  redis {}\n", mount,
                                    uptime ? format_duration(*uptime) : std::string(kMissing),
                                    text(stats, {"redis"}));
  summary += prefetch_rows(stats);
  summary += cache_row(stats);
  summary += memory_row(stats);
  summary += disk_tier_row(stats);
  summary += datasets_row(stats);
  return summary;
}

std::optional<double> stats_interval_seconds(const Json& previous, const Json& current) {
  const std::optional<double> before = number(previous, {"uptime_s"});
  const std::optional<double> after = number(current, {"uptime_s"});
  if (!before || !after || *after <= *before) return std::nullopt;
  return *after - *before;
}

std::string format_stats_rates(const Json& previous, const Json& current, double seconds) {
  std::optional<double> reads;
  std::optional<double> served;
  const auto ready = delta(previous, current, {"prefetch", "reads", "ready"});
  const auto joined = delta(previous, current, {"prefetch", "reads", "joined"});
  const auto miss = delta(previous, current, {"prefetch", "reads", "miss"});
  if (ready && joined && miss) {
    reads = *ready + *joined + *miss;
    served = *ready + *joined;
  }
  const std::string hit =
      reads && *reads > 0 ? percent_text(*served / *reads) : std::string(kMissing);
  return row(
      "rates",
      fmt::format(
          "{}  {}  hit {}  redis {}", rate_text(reads, seconds, 1, "reads/s"),
          rate_text(delta(previous, current, {"bytes_read"}), seconds, kMegabyte, "MB/s"), hit,
          rate_text(delta(previous, current, {"redis_ops", "bytes"}), seconds, kMegabyte, "MB/s")));
}

namespace {

struct StatsCommandState {
  std::string mount;
  bool watch = false;
  double interval_s = 1.0;
  bool json = false;
};

// Sleeps `seconds`, waking early when SIGINT/SIGTERM arrives.
void sleep_unless_stopped(double seconds) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                     std::chrono::duration<double>(seconds));
  constexpr auto kSlice = std::chrono::milliseconds(50);
  while (!StopSignalGuard::stopped() && Clock::now() < until) {
    std::this_thread::sleep_for(std::min<Clock::duration>(kSlice, until - Clock::now()));
  }
}

void watch_stats(const StatsCommandState& state) {
  using Clock = std::chrono::steady_clock;
  const bool terminal = ::isatty(STDOUT_FILENO) == 1;
  StopSignalGuard signals;
  std::optional<Json> previous;
  Clock::time_point previous_time;
  while (!StopSignalGuard::stopped()) {
    Json current = read_stats_json(state.mount);
    const Clock::time_point now = Clock::now();
    std::string block = format_stats_summary(current, state.mount);
    if (previous) {
      // The mount's own clock when it has one: the snapshot times, not when we woke up.
      const double seconds =
          stats_interval_seconds(*previous, current)
              .value_or(std::chrono::duration<double>(now - previous_time).count());
      block += format_stats_rates(*previous, current, seconds);
    } else {
      block += row("rates", "- (after the first interval)");
    }
    // ANSI home + clear only on a terminal; a pipe or file gets one block per interval.
    fmt::print("{}{}{}", terminal ? "\x1b[H\x1b[2J" : "", block, terminal ? "" : "\n");
    std::fflush(stdout);
    previous = std::move(current);
    previous_time = now;
    sleep_unless_stopped(state.interval_s);
  }
}

void run_stats_command(const StatsCommandState& state) {
  try {
    check_dsfs_mount(state.mount);
  } catch (const PlanInputError& e) {
    fmt::print(stderr, "dsfs: error: {}\n", e.what());
    throw cli::ExitCode{2};
  }
  if (state.json) {
    const std::string text = read_stats_text(state.mount);
    fmt::print("{}{}", text, !text.empty() && text.back() == '\n' ? "" : "\n");
    return;
  }
  if (!state.watch) {
    const Json stats = read_stats_json(state.mount);
    fmt::print("{}", format_stats_summary(stats, state.mount));
    return;
  }
  watch_stats(state);
}

}  // namespace

void register_stats_command(CLI::App& app, cli::GlobalOptions& global) {
  auto state = std::make_shared<StatsCommandState>();
  CLI::App* sub = app.add_subcommand(
      "stats",
      "Show a mount's live figures from MOUNT/.dsfs/stats.json: the prefetch engine's mode,\n"
      "leading predictor and epoch, hit rate (reads served from cache or joined to a fetch in\n"
      "flight), read stalls, bytes prefetched/used/wasted, requests in flight, Redis RTT,\n"
      "consumption rate, the plan, each predictor's score, and the cache. Figures a mount does\n"
      "not report print as '-'. --watch redraws until Ctrl-C (exit 0) and adds rates over each\n"
      "interval. Exits 2 if MOUNT is not a dsfs mount, 1 if stats.json cannot be read.");
  sub->add_option("MOUNT", state->mount, "Root of a dsfs mount (where `dsfs mount` mounted it)")
      ->required();
  CLI::Option* watch =
      sub->add_flag("--watch,-w", state->watch,
                    "Redraw every --interval (clearing the screen on a terminal; one block per "
                    "interval otherwise) with reads/s, MB/s, hit rate and Redis MB/s over the "
                    "interval, until Ctrl-C");
  sub->add_option("--interval,-n", state->interval_s, "Seconds between redraws with --watch")
      ->check(CLI::Range(0.05, 86400.0))
      ->capture_default_str();
  sub->add_flag("--json", state->json, "Print stats.json as the mount serves it, once")
      ->excludes(watch);
  cli::add_log_level_option(*sub, global);
  sub->callback([state, &global] {
    cli::apply_log_level(global);
    run_stats_command(*state);
  });
}

}  // namespace dsfs::tools
