// scrub_secrets_from_argv: the password of every Redis URL among the arguments is overwritten
// in place (what /proc/PID/cmdline and `ps` show), and nothing else is touched.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/cli/common.h"

namespace dsfs::cli {
namespace {

std::vector<std::string> scrubbed(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  scrub_secrets_from_argv(static_cast<int>(argv.size()), argv.data());
  return args;
}

TEST(ScrubSecretsFromArgv, OverwritesEveryUrlPasswordAndNothingElse) {
  const auto args =
      scrubbed({"dsfs", "mount", "/mnt/x", "--redis", "redis://trainer:p%40ss@db:6379/2",
                "--redis=redis://:pw@h", "unix://:sock-secret@/run/redis.sock", "redis://user@h",
                "http://example.com/a@b", "--log-level", "debug"});
  EXPECT_EQ(args[0], "dsfs");
  EXPECT_EQ(args[2], "/mnt/x");
  EXPECT_EQ(args[4], "redis://trainer:******@db:6379/2");
  EXPECT_EQ(args[5], "--redis=redis://:**@h");
  EXPECT_EQ(args[6], "unix://:***********@/run/redis.sock");
  EXPECT_EQ(args[7], "redis://user@h");  // a user name alone is no secret
  EXPECT_EQ(args[8], "http://example.com/a@b");
  EXPECT_EQ(args[10], "debug");
}

// A mistyped scheme kept the password in plain sight (ps) and in the error message.
TEST(ScrubSecretsFromArgv, AMistypedSchemeHidesThePasswordToo) {
  const auto args = scrubbed({"dsfs", "list", "--redis", "redis//:S3cr3t@h:1", "redis:/:S3cr3t@h",
                              ":S3cr3t@h", "/mnt/a:b@c"});
  EXPECT_EQ(args[3], "redis//:******@h:1");
  EXPECT_EQ(args[4], "redis:********@h");
  EXPECT_EQ(args[5], ":******@h");
  EXPECT_EQ(args[6], "/mnt/a:b@c");  // not a Redis URL
}

}  // namespace
}  // namespace dsfs::cli
