#include "src/cli/common.h"

#include <fmt/core.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdlib>

#include "src/store/embedded_server.h"

namespace dsfs::cli {

void add_global_options(CLI::App& sub, GlobalOptions& options) {
  constexpr const char* kGroup = "Redis and logging";
  sub.add_option("--redis", options.redis_url,
                 "Redis to use: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] or "
                 "unix:///PATH/TO.sock[?db=N] (percent-escape special characters in USER and "
                 "PASSWORD). Default: $DSFS_REDIS, else the embedded server under $DSFS_HOME, "
                 "started when needed")
      ->envname("DSFS_REDIS")
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

store::RedisEndpoint resolve_endpoint(const GlobalOptions& options) {
  if (!options.redis_url.empty()) return store::parse_redis_url(options.redis_url);
  if (const char* url = std::getenv("DSFS_REDIS"); url && *url) return store::parse_redis_url(url);
  store::EmbeddedServer server;
  if (server.start()) {
    fmt::print(stderr,
               "dsfs: started the embedded redis-server on {} (data in {}); "
               "`dsfs server stop` stops it\n",
               server.endpoint().socket_path, server.status().data_dir.string());
  }
  return server.endpoint();
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

}  // namespace dsfs::cli
