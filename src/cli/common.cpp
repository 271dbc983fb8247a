#include "src/cli/common.h"

#include <fmt/core.h>
#include <malloc.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

#include "src/store/log_text.h"

#include "src/store/embedded_server.h"
#include "src/store/local_cluster.h"

namespace dsfs::cli {

void add_global_options(CLI::App& sub, GlobalOptions& options) {
  constexpr const char* kGroup = "Redis and logging";
  sub.add_option("--redis", options.redis_url,
                 "Redis to use: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or "
                 "unix:///PATH/TO.sock[?db=N] (percent-escape special characters in USER and "
                 "PASSWORD). A Redis Cluster is detected by itself: name any of its nodes, or "
                 "several, comma-separated (redis://10.0.0.1:7000,redis://10.0.0.2:7000), so "
                 "that one node down does not stop dsfs; the password options apply to every "
                 "URL. Default: $DSFS_REDIS, else the local cluster of `dsfs server start "
                 "--shards` while it runs, else the embedded server under $DSFS_HOME, started "
                 "when needed")
      ->envname("DSFS_REDIS")
      // `--redis "$UNSET"` would otherwise be no --redis at all, and a job meant for a shared
      // Redis would ingest into (or mount) the embedded one without a word.
      ->check([](const std::string& url) -> std::string {
        if (!url.empty()) return "";
        return "an empty URL names no Redis (a variable that is not set?); give one, or leave "
               "--redis out to use $DSFS_REDIS or the embedded server";
      })
      ->group(kGroup);
  sub.add_option("--redis-password-file", options.redis_password_file,
                 "File whose first line is the Redis password (keep it mode 0600): the safe way "
                 "to pass one; $DSFS_REDIS_PASSWORD or $REDISCLI_AUTH work too. A password in "
                 "the --redis URL is visible to local users in `ps` until dsfs starts")
      ->group(kGroup);
  sub.add_option("--namespace", options.ns,
                 "Prefix of every Redis key dsfs reads or writes, so several dsfs installations "
                 "can share one Redis ([A-Za-z0-9._-], up to 64)")
      ->capture_default_str()
      ->group(kGroup);
  add_log_level_option(sub, options)->group(kGroup);
}

CLI::Option* add_log_level_option(CLI::App& sub, GlobalOptions& options) {
  return sub.add_option("--log-level", options.log_level, "Log detail on stderr")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
}

namespace {

// The password from --redis-password-file or the environment; nullopt when none is given.
std::optional<std::string> password_from_outside_argv(const GlobalOptions& options) {
  if (!options.redis_password_file.empty()) {
    std::ifstream in(options.redis_password_file);
    std::string password;
    if (!in || !std::getline(in, password)) {
      throw std::invalid_argument(fmt::format(
          "cannot read the Redis password from --redis-password-file {}: {}",
          store::log_text(options.redis_password_file), in ? "it is empty" : std::strerror(errno)));
    }
    if (!password.empty() && password.back() == '\r') password.pop_back();
    return password;
  }
  for (const char* name : {"DSFS_REDIS_PASSWORD", "REDISCLI_AUTH"}) {
    if (const char* password = std::getenv(name); password && *password) return password;
  }
  return std::nullopt;
}

// The seeds of a --redis list; the password from outside argv, if any, replaces each one's
// (read once: a password file is read only once however many seeds there are), and lets a URL
// name an ACL user alone (`USER@`).
std::vector<store::RedisEndpoint> parse_seed_list(std::string_view list,
                                                  const GlobalOptions& options) {
  const std::optional<std::string> password = password_from_outside_argv(options);
  std::vector<store::RedisEndpoint> seeds;
  for (const std::string_view url : split_redis_urls(list)) {
    seeds.push_back(store::parse_redis_url(url, password.has_value()));
    if (password) seeds.back().password = *password;
  }
  return seeds;
}

// The length of the "SCHEME://" that `text` starts with (RFC 3986 scheme), 0 if none.
size_t url_scheme_length(std::string_view text) {
  if (text.empty() || !std::isalpha(static_cast<unsigned char>(text[0]))) return 0;
  size_t i = 1;
  while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '+' ||
                             text[i] == '-' || text[i] == '.')) {
    ++i;
  }
  return text.substr(i).starts_with("://") ? i + 3 : 0;
}

// Overwrites the password of the one URL in `url` (a piece of an argument) with '*'.
void scrub_url_password(char* url, std::string_view text) {
  const size_t scheme_end = text.find("://");
  // A mistyped scheme ("redis//:pw@host", "redis:/:pw@host", ":pw@host"): whatever precedes the
  // last '@' may hold a password, from its first ':' on.
  const bool mistyped = text.starts_with(':') || text.starts_with("redis") ||
                        text.starts_with("--redis=redis") || text.starts_with("unix");
  if (scheme_end == std::string_view::npos && !mistyped) return;
  const size_t authority = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  const size_t at = text.rfind('@');
  if (at == std::string_view::npos || at < authority) return;
  const size_t colon = text.find(':', authority);
  if (colon == std::string_view::npos || colon > at) return;  // a user name alone
  for (size_t j = colon + 1; j < at; ++j) url[j] = '*';
}

}  // namespace

std::vector<std::string_view> split_redis_urls(std::string_view list) {
  std::vector<std::string_view> urls;
  size_t begin = 0;
  for (size_t comma = list.find(','); comma != std::string_view::npos;
       comma = list.find(',', comma + 1)) {
    size_t next = comma + 1;
    while (next < list.size() && list[next] == ' ') ++next;   // "URL, URL" too
    if (url_scheme_length(list.substr(next)) == 0) continue;  // a comma inside this URL
    urls.push_back(list.substr(begin, comma - begin));
    begin = next;
    comma = next - 1;
  }
  urls.push_back(list.substr(begin));
  return urls;
}

void scrub_secrets_from_argv(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    for (const std::string_view url : split_redis_urls(arg)) {
      scrub_url_password(argv[i] + (url.data() - arg.data()), url);
    }
  }
}

std::vector<store::RedisEndpoint> resolve_seeds(const GlobalOptions& options) {
  if (!options.redis_url.empty()) {
    return parse_seed_list(options.redis_url, options);
  }
  if (const char* url = std::getenv("DSFS_REDIS"); url && *url) {
    return parse_seed_list(url, options);
  }
  // What `dsfs server start` runs: the local cluster when it runs (it and the single server
  // never run together), else the single server, started on demand. A cluster whose state file
  // is damaged says so, and the single server is used.
  store::LocalClusterStatus cluster;
  try {
    cluster = store::LocalCluster().status();
  } catch (const std::runtime_error& e) {
    fmt::print(stderr, "dsfs: warning: {}\n", e.what());
  }
  if (cluster.complete && cluster.any_running()) {
    std::vector<store::RedisEndpoint> seeds;  // every running node: any one that answers will do
    for (const store::LocalClusterNodeStatus& node : cluster.nodes) {
      if (!node.running) continue;
      store::RedisEndpoint seed;
      seed.host = "127.0.0.1";
      seed.port = node.port;
      seeds.push_back(std::move(seed));
    }
    spdlog::debug("using the local Redis Cluster in {} ({} running nodes as seeds)",
                  cluster.dir.string(), seeds.size());
    return seeds;
  }
  store::EmbeddedServer server;
  if (server.start()) {
    fmt::print(stderr,
               "dsfs: started the embedded redis-server on {} (data in {}); "
               "`dsfs server stop` stops it\n",
               server.endpoint().socket_path, server.status().data_dir.string());
    if (cluster.exists && cluster.complete) {
      fmt::print(stderr,
                 "dsfs: note: the local Redis Cluster in {} is stopped, so dsfs uses this single "
                 "server in its place; to use the cluster: `dsfs server stop`, then `dsfs "
                 "server start --shards {} --replicas {}`\n",
                 cluster.dir.string(), cluster.shards, cluster.replicas);
    }
  }
  return {server.endpoint()};
}

store::RedisEndpoint resolve_endpoint(const GlobalOptions& options) {
  return resolve_seeds(options).front();
}

std::shared_ptr<store::Client> make_client(const GlobalOptions& options,
                                           store::ClientOptions client_options) {
  return std::make_shared<store::Client>(resolve_seeds(options), std::move(client_options));
}

void apply_log_level(const GlobalOptions& options) {
  // spdlog's own default logger writes to stdout, where command output (and `dsfs list`
  // pipelines) belong; logs go to stderr instead.
  static const auto stderr_logger = [] {
    auto logger = spdlog::stderr_color_mt("dsfs");
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
    spdlog::set_default_logger(logger);
    return logger;
  }();
  const auto level = spdlog::level::from_str(options.log_level);
  if (level == spdlog::level::off && options.log_level != "off") {
    throw std::invalid_argument(fmt::format(
        "unknown log level '{}': use trace, debug, info, warn or error", options.log_level));
  }
  stderr_logger->set_level(level);
  spdlog::set_level(level);
}

std::string unreadable_in_mount(const std::string& file, const std::string& mount, int error) {
  std::string advice;
  switch (error) {
    case ENOTCONN:
    case ECONNABORTED:  // what a request meets as the kernel aborts the connection
      advice = fmt::format(
          "the mount's dsfs daemon has exited (its log under $DSFS_HOME/logs says why); "
          "`dsfs umount {}` clears it, then mount again",
          mount);
      break;
    case ENOENT:
      advice = fmt::format("is {} a dsfs mount?", mount);
      break;
    default:
      advice = fmt::format("is {} still a dsfs mount?", mount);
  }
  return fmt::format("cannot read {}: {}; {}", file, std::strerror(error), advice);
}

void tune_malloc(int arenas, int mmap_threshold) {
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr && mallopt(M_ARENA_MAX, arenas) != 1) {
    spdlog::debug("mallopt(M_ARENA_MAX) failed");
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  const bool threshold_set = std::getenv("MALLOC_MMAP_THRESHOLD_") != nullptr ||
                             (tunables != nullptr && std::strstr(tunables, "mmap_threshold"));
  if (!threshold_set && mallopt(M_MMAP_THRESHOLD, mmap_threshold) != 1) {
    spdlog::debug("mallopt(M_MMAP_THRESHOLD) failed");
  }
}

}  // namespace dsfs::cli
