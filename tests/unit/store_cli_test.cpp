// The shared CLI options, endpoint resolution (flag > DSFS_REDIS > embedded) and `dsfs server`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "src/cli/common.h"
#include "src/cli/server_command.h"
#include "src/store/connection.h"
#include "src/store/embedded_server.h"
#include "tests/unit/support/files.h"

namespace dsfs::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// Sets an environment variable for one test and restores the previous value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) previous_ = old;
    if (value) {
      ::setenv(name, value->c_str(), 1);
    } else {
      ::unsetenv(name);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    if (previous_) {
      ::setenv(name_, previous_->c_str(), 1);
    } else {
      ::unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> previous_;
};

void parse(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
  app.parse(args);
}

TEST(GlobalOptionsTest, DefaultsAndFlags) {
  ScopedEnv no_env("DSFS_REDIS", std::nullopt);
  CLI::App app;
  GlobalOptions options;
  add_global_options(app, options);
  parse(app, {});
  EXPECT_EQ(options.redis_url, "");
  EXPECT_EQ(options.ns, "dsfs");
  EXPECT_EQ(options.log_level, "info");

  CLI::App again;
  GlobalOptions given;
  add_global_options(again, given);
  parse(again, {"--redis", "redis://h:1", "--namespace", "team", "--log-level", "debug"});
  EXPECT_EQ(given.redis_url, "redis://h:1");
  EXPECT_EQ(given.ns, "team");
  EXPECT_EQ(given.log_level, "debug");
}

TEST(GlobalOptionsTest, HelpMentionsTheEnvironmentVariable) {
  CLI::App app;
  GlobalOptions options;
  add_global_options(app, options);
  EXPECT_THAT(app.help(), HasSubstr("DSFS_REDIS"));
}

TEST(GlobalOptionsTest, RedisFlagComesFromTheEnvironment) {
  ScopedEnv env("DSFS_REDIS", "redis://from-env:7");
  CLI::App app;
  GlobalOptions options;
  add_global_options(app, options);
  parse(app, {});
  EXPECT_EQ(options.redis_url, "redis://from-env:7");

  CLI::App flagged;
  GlobalOptions flag_wins;
  add_global_options(flagged, flag_wins);
  parse(flagged, {"--redis", "redis://from-flag:8"});
  EXPECT_EQ(resolve_endpoint(flag_wins).host, "from-flag");
}

TEST(GlobalOptionsTest, UnknownLogLevelIsRejected) {
  CLI::App app;
  GlobalOptions options;
  add_global_options(app, options);
  EXPECT_THROW(parse(app, {"--log-level", "loud"}), CLI::ValidationError);
}

TEST(ApplyLogLevelTest, SetsTheLevel) {
  GlobalOptions options;
  options.log_level = "warn";
  apply_log_level(options);
  EXPECT_EQ(spdlog::get_level(), spdlog::level::warn);
  options.log_level = "debug";
  apply_log_level(options);
  EXPECT_EQ(spdlog::default_logger()->level(), spdlog::level::debug);
  options.log_level = "nonsense";
  EXPECT_THROW(apply_log_level(options), std::invalid_argument);
}

TEST(ResolveEndpointTest, FlagThenEnvironment) {
  ScopedEnv env("DSFS_REDIS", "unix:///env.sock");
  GlobalOptions options;
  EXPECT_EQ(resolve_endpoint(options).socket_path, "/env.sock");
  options.redis_url = "redis://flag:9/1";
  const store::RedisEndpoint endpoint = resolve_endpoint(options);
  EXPECT_EQ(endpoint.host, "flag");
  EXPECT_EQ(endpoint.port, 9);
  EXPECT_EQ(endpoint.db, 1);
}

TEST(ResolveEndpointTest, BadUrlIsInvalidArgument) {
  GlobalOptions options;
  options.redis_url = "redis://h:notaport";
  EXPECT_THROW(resolve_endpoint(options), std::invalid_argument);
}

class EmbeddedHomeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_env_.emplace("DSFS_HOME", home_.string());
    redis_env_.emplace("DSFS_REDIS", std::nullopt);
  }
  void TearDown() override { store::EmbeddedServer(home_).stop(); }
  test::TempDir home_dir_{"dsfs-cli-home"};  // removed after TearDown has stopped the server
  const fs::path home_ = home_dir_.path();
  std::optional<ScopedEnv> home_env_;
  std::optional<ScopedEnv> redis_env_;
};

TEST_F(EmbeddedHomeTest, ResolveStartsTheEmbeddedServer) {
  GlobalOptions options;
  testing::internal::CaptureStderr();
  const store::RedisEndpoint endpoint = resolve_endpoint(options);
  EXPECT_THAT(testing::internal::GetCapturedStderr(),
              HasSubstr("started the embedded redis-server"));
  EXPECT_EQ(endpoint.transport, store::RedisEndpoint::Transport::kUnix);
  EXPECT_EQ(endpoint.socket_path, (home_ / "redis" / "redis.sock").string());
  EXPECT_EQ(store::Connection(endpoint).command({"PING"}).str(), "PONG");

  // Already running: no note the second time.
  testing::internal::CaptureStderr();
  resolve_endpoint(options);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// Runs `dsfs server ARGS...` and returns the exit code ExitCode carried (0 if none was thrown).
int run_server_command(std::vector<std::string> args, std::string* out = nullptr) {
  CLI::App app;
  GlobalOptions global;
  register_server_command(app, global);
  args.insert(args.begin(), "server");
  testing::internal::CaptureStdout();
  int code = 0;
  try {
    parse(app, args);
  } catch (const ExitCode& e) {
    code = e.code;
  }
  const std::string printed = testing::internal::GetCapturedStdout();
  if (out) *out = printed;
  return code;
}

TEST_F(EmbeddedHomeTest, ServerCommandLifecycle) {
  std::string out;
  EXPECT_EQ(run_server_command({"status"}, &out), 3);
  EXPECT_THAT(out, HasSubstr("running: no"));

  EXPECT_EQ(run_server_command({"start"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("started the embedded redis-server"));
  EXPECT_THAT(out, HasSubstr((home_ / "redis" / "redis.sock").string()));

  EXPECT_EQ(run_server_command({"start"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("already running"));

  EXPECT_EQ(run_server_command({"status"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("running: yes"));
  EXPECT_THAT(out, HasSubstr("pid: "));
  EXPECT_THAT(out, HasSubstr((home_ / "redis" / "data").string()));

  EXPECT_EQ(run_server_command({"stop"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("stopped"));
  EXPECT_EQ(run_server_command({"stop"}, &out), 0);
  EXPECT_THAT(out, HasSubstr("not running"));
  EXPECT_EQ(run_server_command({"status"}), 3);
}

TEST(ServerCommandTest, RequiresAnAction) {
  CLI::App app;
  GlobalOptions global;
  register_server_command(app, global);
  EXPECT_THROW(parse(app, {"server"}), CLI::RequiredError);
  EXPECT_THROW(parse(app, {"server", "restart"}), CLI::ParseError);
}

}  // namespace
}  // namespace dsfs::cli
