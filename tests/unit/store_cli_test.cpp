// The shared CLI options, endpoint resolution (flag > DSFS_REDIS > a running local cluster >
// embedded) and `dsfs server`.
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
#include "src/store/local_cluster.h"
#include "tests/unit/support/files.h"

namespace dsfs::cli {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

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

TEST(GlobalOptionsTest, HelpSaysAClusterIsDetectedAndSeveralSeedsMayBeNamed) {
  CLI::App app;
  GlobalOptions options;
  add_global_options(app, options);
  EXPECT_THAT(app.help(), HasSubstr("Redis Cluster is detected"));
  EXPECT_THAT(app.help(), HasSubstr("comma-separated"));
}

TEST(SplitRedisUrlsTest, SplitsOnlyWhereAnotherUrlStarts) {
  using Pieces = std::vector<std::string_view>;
  EXPECT_EQ(split_redis_urls("redis://h:1"), Pieces{"redis://h:1"});
  EXPECT_EQ(split_redis_urls("redis://a:7000,redis://b:7001"),
            (Pieces{"redis://a:7000", "redis://b:7001"}));
  EXPECT_EQ(split_redis_urls("redis://a:1, unix:///s.sock,REDIS://c"),
            (Pieces{"redis://a:1", "unix:///s.sock", "REDIS://c"}));
  // A comma inside a password (or anywhere else not followed by SCHEME://) is part of the URL.
  EXPECT_EQ(split_redis_urls("redis://:pa,ss@h:1"), Pieces{"redis://:pa,ss@h:1"});
  EXPECT_EQ(split_redis_urls("redis://:pa,ss@h:1,redis://:x,y@g:2"),
            (Pieces{"redis://:pa,ss@h:1", "redis://:x,y@g:2"}));
  EXPECT_EQ(split_redis_urls(""), Pieces{""});
}

TEST(ResolveSeedsTest, SeveralUrlsAreSeveralSeedsInOrder) {
  ScopedEnv no_password("DSFS_REDIS_PASSWORD", std::nullopt);
  ScopedEnv no_cli_auth("REDISCLI_AUTH", std::nullopt);
  GlobalOptions options;
  options.redis_url = "redis://:one@10.0.0.1:7000,redis://10.0.0.2:7001";
  const std::vector<store::RedisEndpoint> seeds = resolve_seeds(options);
  ASSERT_EQ(seeds.size(), 2u);
  EXPECT_EQ(seeds[0].host, "10.0.0.1");
  EXPECT_EQ(seeds[0].port, 7000);
  EXPECT_EQ(seeds[0].password, "one");
  EXPECT_EQ(seeds[1].host, "10.0.0.2");
  EXPECT_EQ(seeds[1].port, 7001);
  EXPECT_EQ(seeds[1].password, "");
  EXPECT_EQ(resolve_endpoint(options).host, "10.0.0.1");  // the first seed

  ScopedEnv env("DSFS_REDIS", "redis://e1:1,redis://e2:2");
  options.redis_url.clear();
  EXPECT_EQ(resolve_seeds(options).size(), 2u);
}

TEST(ResolveSeedsTest, APasswordFromOutsideArgvAppliesToEverySeed) {
  ScopedEnv password("DSFS_REDIS_PASSWORD", "from-env");
  GlobalOptions options;
  options.redis_url = "redis://:in-url@a:1,redis://b:2,unix:///c.sock";
  for (const store::RedisEndpoint& seed : resolve_seeds(options)) {
    EXPECT_EQ(seed.password, "from-env") << seed.describe();
  }
  const test::TempDir dir("dsfs-cli-password");
  const fs::path file = dir.path() / "password";
  test::write_file(file, "from-file\n");
  options.redis_password_file = file.string();
  for (const store::RedisEndpoint& seed : resolve_seeds(options)) {
    EXPECT_EQ(seed.password, "from-file") << seed.describe();
  }
}

TEST(ResolveSeedsTest, ABadUrlInTheListIsNamed) {
  GlobalOptions options;
  options.redis_url = "redis://good:1,redis://bad:notaport";
  try {
    resolve_seeds(options);
    FAIL() << "a list with a bad URL was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad"));
  }
}

TEST(ScrubSecretsFromArgvTest, EveryUrlOfAListIsScrubbed) {
  std::string flag = "--redis=redis://:pw1@h1:1,redis://u:secret2@h2:2, unix://:s3@/r.sock";
  std::string single = "redis://:pa,ss@h:1";
  std::string program = "dsfs";
  char* argv[] = {program.data(), flag.data(), single.data()};
  scrub_secrets_from_argv(3, argv);
  EXPECT_EQ(flag, "--redis=redis://:***@h1:1,redis://u:*******@h2:2, unix://:**@/r.sock");
  EXPECT_EQ(single, "redis://:*****@h:1");  // one URL whose password holds a comma
}

class EmbeddedHomeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_env_.emplace("DSFS_HOME", home_.string());
    redis_env_.emplace("DSFS_REDIS", std::nullopt);
  }
  void TearDown() override {
    store::LocalCluster(home_).stop();  // false, at no cost, when none was made
    store::EmbeddedServer(home_).stop();
  }
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
  // A client of it: a single server, not a cluster.
  const std::shared_ptr<store::Client> client = make_client(options);
  EXPECT_FALSE(client->is_cluster());
  EXPECT_EQ(client->command({"PING"}).str(), "PONG");

  // Already running: no note the second time.
  testing::internal::CaptureStderr();
  resolve_endpoint(options);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

// A running local cluster (`dsfs server start --shards N`) is what dsfs uses without --redis:
// its nodes are the seeds, and the single server is not started beside it. Stopped, the single
// server takes its place, with a note saying so.
TEST_F(EmbeddedHomeTest, ResolveUsesTheRunningLocalCluster) {
  store::LocalCluster cluster(home_);
  cluster.start(1, 1);
  const store::LocalClusterStatus status = cluster.status();
  std::vector<int> ports;
  for (const store::LocalClusterNodeStatus& node : status.nodes) ports.push_back(node.port);
  GlobalOptions options;
  testing::internal::CaptureStderr();
  const std::vector<store::RedisEndpoint> seeds = resolve_seeds(options);
  EXPECT_THAT(testing::internal::GetCapturedStderr(), Not(HasSubstr("embedded")));
  std::vector<int> seed_ports;
  for (const store::RedisEndpoint& seed : seeds) {
    EXPECT_EQ(seed.transport, store::RedisEndpoint::Transport::kTcp);
    EXPECT_EQ(seed.host, "127.0.0.1");
    seed_ports.push_back(seed.port);
  }
  EXPECT_EQ(seed_ports, ports);
  EXPECT_EQ(resolve_endpoint(options).port, ports.front());
  EXPECT_FALSE(store::EmbeddedServer(home_).status().running);
  EXPECT_TRUE(make_client(options)->is_cluster());

  cluster.stop();
  testing::internal::CaptureStderr();
  EXPECT_EQ(resolve_endpoint(options).transport, store::RedisEndpoint::Transport::kUnix);
  const std::string note = testing::internal::GetCapturedStderr();
  EXPECT_THAT(note, HasSubstr("started the embedded redis-server"));
  EXPECT_THAT(note, HasSubstr("the local Redis Cluster in " + (home_ / "cluster").string() +
                              " is stopped"));
  EXPECT_TRUE(store::EmbeddedServer(home_).status().running);
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
