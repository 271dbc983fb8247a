#include "src/cli/common.h"

#include <fmt/core.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

#include "src/store/log_text.h"

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

store::RedisEndpoint with_password(store::RedisEndpoint endpoint, const GlobalOptions& options) {
  if (auto password = password_from_outside_argv(options)) endpoint.password = std::move(*password);
  return endpoint;
}

}  // namespace

void scrub_secrets_from_argv(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    const size_t scheme_end = arg.find("://");
    if (scheme_end == std::string_view::npos) continue;
    const size_t authority = scheme_end + 3;
    const size_t at = arg.rfind('@');
    if (at == std::string_view::npos || at < authority) continue;
    const size_t colon = arg.find(':', authority);
    if (colon == std::string_view::npos || colon > at) continue;  // a user name alone
    for (size_t j = colon + 1; j < at; ++j) argv[i][j] = '*';
  }
}

store::RedisEndpoint resolve_endpoint(const GlobalOptions& options) {
  if (!options.redis_url.empty()) {
    return with_password(store::parse_redis_url(options.redis_url), options);
  }
  if (const char* url = std::getenv("DSFS_REDIS"); url && *url) {
    return with_password(store::parse_redis_url(url), options);
  }
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
