#pragma once
// Options every subcommand shares, and how they pick the Redis to talk to.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/store/client.h"
#include "src/store/redis_url.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace dsfs::cli {

struct GlobalOptions {
  // One URL, or several comma-separated seed nodes of one Redis Cluster; empty: $DSFS_REDIS,
  // else the embedded server.
  std::string redis_url;
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

// Splits a --redis value into its URLs: at each comma that starts another URL (",redis://",
// ",unix://", any ",SCHEME://"), so a comma inside a password does not split it. One URL gives
// one piece; empty pieces are kept (parse_redis_url then names them).
std::vector<std::string_view> split_redis_urls(std::string_view list);

// --redis, else $DSFS_REDIS, else what `dsfs server start` runs under $DSFS_HOME: the local
// Redis Cluster while it runs (its running nodes), else the embedded server (started if it is
// not running, with a note on stderr): the seed nodes a store::Client starts from. --redis and
// $DSFS_REDIS may name several comma-separated URLs (seed nodes of one Redis Cluster: any one that
// answers will do). For them the password, if any, comes from --redis-password-file, else
// $DSFS_REDIS_PASSWORD, else $REDISCLI_AUTH, else each URL; the first three apply to every URL.
// Throws std::invalid_argument on a bad URL (naming it) or an unreadable password file.
std::vector<store::RedisEndpoint> resolve_seeds(const GlobalOptions& options);

// The first of resolve_seeds: for what speaks to one server by design (the latency proxy,
// bench/redis_raw). Everything else builds a store::Client with make_client.
store::RedisEndpoint resolve_endpoint(const GlobalOptions& options);

// A store::Client on resolve_seeds(options): a single server or a Redis Cluster (the client
// finds out on first use). Throws like resolve_seeds; opens no connection (the client's first
// use throws ConnectionError naming the seed when none answers within its retry budget).
std::shared_ptr<store::Client> make_client(const GlobalOptions& options,
                                           store::ClientOptions client_options = {});

// Overwrites, in place, the password of every Redis URL among the process's arguments
// (redis://USER:PASSWORD@..., unix://:PASSWORD@..., each URL of a comma-separated list) with
// '*', so that `ps` and /proc/PID/cmdline no longer show it. Call before anything else, on the argv
// main() got; parse a copy taken before.
void scrub_secrets_from_argv(int argc, char** argv);

// What to say when `file`, inside the dsfs mount `mount`, cannot be opened (errno `error`):
// "cannot read FILE: REASON; WHAT TO DO". A dead mount (its daemon exited: ENOTCONN, or
// ECONNABORTED) is named as one, with how to clear it.
std::string unreadable_in_mount(const std::string& file, const std::string& mount, int error);

// Applies --log-level to spdlog's default logger (stderr).
void apply_log_level(const GlobalOptions& options);

// Sets glibc's malloc to `arenas` arenas and a fixed mmap threshold (allocations of at least
// that many bytes are mapped, and unmapped when freed), unless the environment sets them
// (MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_, GLIBC_TUNABLES). Call before starting threads.
void tune_malloc(int arenas, int mmap_threshold);

}  // namespace dsfs::cli

namespace dsfs::cli {

// Thrown by a subcommand to exit with a specific status without an error message (e.g.
// `dsfs server status` exits 3 when the server is not running). Any other std::exception
// escaping a subcommand prints "dsfs: error: <what()>" and exits 1.
struct ExitCode {
  int code;
};

}  // namespace dsfs::cli
