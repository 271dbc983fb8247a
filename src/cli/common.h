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
  // The password for --redis / $DSFS_REDIS, from a file (first line): safe, unlike a password
  // in the URL, which every local user can read in `ps` until the process scrubs it.
  std::string redis_password_file;
  std::string ns = "dsfs";
  std::string log_level = "info";
};

// Adds --redis, --namespace and --log-level to `sub` (bound to `options`).
void add_global_options(CLI::App& sub, GlobalOptions& options);
// Adds only --log-level (`dsfs server`, which takes no --redis or --namespace).
CLI::Option* add_log_level_option(CLI::App& sub, GlobalOptions& options);

// --redis, else $DSFS_REDIS, else the embedded server (started if it is not running, with a
// note on stderr). For --redis/$DSFS_REDIS the password, if any, comes from
// --redis-password-file, else $DSFS_REDIS_PASSWORD, else $REDISCLI_AUTH, else the URL. Throws
// std::invalid_argument on a bad URL or an unreadable password file.
store::RedisEndpoint resolve_endpoint(const GlobalOptions& options);

// Overwrites, in place, the password of every Redis URL among the process's arguments
// (redis://USER:PASSWORD@..., unix://:PASSWORD@...) with '*', so that `ps` and
// /proc/PID/cmdline no longer show it. Call before anything else, on the argv main() got;
// parse a copy taken before.
void scrub_secrets_from_argv(int argc, char** argv);

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
