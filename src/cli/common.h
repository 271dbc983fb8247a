#pragma once
// Options every subcommand shares, and how they pick the Redis to talk to.
#include <string>

#include "src/store/redis_url.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace dsfs::cli {

struct GlobalOptions {
  std::string redis_url;  // empty: $DSFS_REDIS, else the embedded server
  std::string ns = "dsfs";
  std::string log_level = "info";
};

// Adds --redis, --namespace and --log-level to `sub` (bound to `options`).
void add_global_options(CLI::App& sub, GlobalOptions& options);
// Adds only --log-level (`dsfs server`, which takes no --redis or --namespace).
CLI::Option* add_log_level_option(CLI::App& sub, GlobalOptions& options);

// --redis, else $DSFS_REDIS, else the embedded server (started if it is not running, with a
// note on stderr). Throws std::invalid_argument on a bad URL.
store::RedisEndpoint resolve_endpoint(const GlobalOptions& options);

// Applies --log-level to spdlog's default logger (stderr).
void apply_log_level(const GlobalOptions& options);

}  // namespace dsfs::cli

namespace dsfs::cli {

// Thrown by a subcommand to exit with a specific status without an error message (e.g.
// `dsfs server status` exits 3 when the server is not running). Any other std::exception
// escaping a subcommand prints "dsfs: error: <what()>" and exits 1.
struct ExitCode {
  int code;
};

}  // namespace dsfs::cli
