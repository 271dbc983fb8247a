#pragma once
// `dsfs stats MOUNT [--watch]`: a mount's .dsfs/stats.json (prefetch engine, cache, Redis) as a
// compact summary, redrawn live with rates under --watch. The formatting is pure functions of
// the parsed JSON, so it is tested on samples; any field may be missing (an older mount): it
// prints as "-".
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "src/cli/common.h"

namespace dsfs::tools {

// The whole of MOUNT/.dsfs/stats.json, read afresh (each open is a new snapshot). Throws
// std::runtime_error naming the file if it cannot be read.
std::string read_stats_text(const std::filesystem::path& mount);
// read_stats_text parsed; throws std::runtime_error if it is not a JSON object.
nlohmann::json read_stats_json(const std::filesystem::path& mount);

// The summary of one snapshot, a line per topic: a header (mount, uptime), then prefetch mode,
// leader and epoch; reads and hit rate; stalls; bytes prefetched/used/wasted; in flight; Redis
// RTT and connections; consumption rate; plan; predictors; cache.
std::string format_stats_summary(const nlohmann::json& stats, const std::string& mount);

// Seconds between two snapshots by their "uptime_s", or nullopt when either lacks it or it did
// not increase (the mount restarted).
std::optional<double> stats_interval_seconds(const nlohmann::json& previous,
                                             const nlohmann::json& current);

// One "rates" line for the interval between two snapshots `seconds` apart: reads/s, MB/s
// returned to readers, the interval's hit rate, Redis MB/s. A counter that is missing or went
// backwards prints as "-".
std::string format_stats_rates(const nlohmann::json& previous, const nlohmann::json& current,
                               double seconds);

// `dsfs stats MOUNT [--watch] [--interval S] [--json]`.
void register_stats_command(CLI::App& app, cli::GlobalOptions& global);

}  // namespace dsfs::tools
