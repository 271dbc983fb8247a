// The mount-helper form `dsfs SOURCE MOUNTPOINT -o OPTIONS` (what mount(8) runs through
// mount.fuse3 for type fuse.dsfs), translated to `dsfs mount` argv.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "fs/mount_command.h"
#include "fs/mount_helper.h"
#include "src/cli/common.h"
#include "tests/unit/support/files.h"

namespace dsfs::fs {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Argv = std::vector<std::string>;

MountHelperContext test_context() {
  MountHelperContext context;
  context.subcommands = {"mount", "umount", "list", "server"};
  context.mount_options = {{"dataset", true},
                           {"cache-size", true},
                           {"prefetch", true},
                           {"disk-cache", true},
                           {"disk-cache-size", true},
                           {"redis", true},
                           {"redis-password-file", true},
                           {"verify", false},
                           {"foreground", false}};
  context.is_directory = [](const std::string& path) { return path.starts_with("/mnt/"); };
  return context;
}

std::optional<Argv> translate(const Argv& argv) {
  return translate_mount_helper_argv(argv, test_context());
}

// The message of the std::invalid_argument translate throws.
std::string error_of(const Argv& argv) {
  try {
    translate(argv);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(MountHelper, OtherCommandLinesAreNotTheHelperForm) {
  EXPECT_FALSE(translate({"dsfs"}));
  EXPECT_FALSE(translate({"dsfs", "list"}));
  EXPECT_FALSE(translate({"dsfs", "mount", "/mnt/x"}));  // a subcommand
  EXPECT_FALSE(translate({"dsfs", "umount", "/mnt/x"}));
  EXPECT_FALSE(translate({"dsfs", "--version", "/mnt/x"}));      // an option
  EXPECT_FALSE(translate({"dsfs", "lsit", "not-a-directory"}));  // CLI11 reports the typo
  EXPECT_FALSE(translate({"dsfs", "imagenet", "-o", "/mnt/x"}));
}

TEST(MountHelper, DatasetSourceMountsThatDataset) {
  EXPECT_THAT(*translate({"dsfs", "imagenet", "/mnt/x"}),
              ElementsAre("dsfs", "mount", "/mnt/x", "--dataset=imagenet"));
}

TEST(MountHelper, DsfsSourceMountsEveryDatasetOfTheDefaultRedis) {
  EXPECT_THAT(*translate({"dsfs", "dsfs", "/mnt/x", "-o", "rw"}),
              ElementsAre("dsfs", "mount", "/mnt/x"));
}

TEST(MountHelper, UrlSourceMountsEveryDatasetOfThatRedis) {
  EXPECT_THAT(*translate({"/usr/bin/dsfs", "redis://10.0.0.1:6379/2", "/mnt/x"}),
              ElementsAre("/usr/bin/dsfs", "mount", "/mnt/x", "--redis=redis://10.0.0.1:6379/2"));
  EXPECT_THAT(*translate({"dsfs", "unix:///run/redis.sock", "/mnt/x"}),
              ElementsAre("dsfs", "mount", "/mnt/x", "--redis=unix:///run/redis.sock"));
  EXPECT_THAT(*translate({"dsfs", "redis://a:7000,redis://b:7000", "/mnt/x"}),
              ElementsAre("dsfs", "mount", "/mnt/x", "--redis=redis://a:7000,redis://b:7000"));
}

TEST(MountHelper, DsfsOptionsTakeUnderscoresOrDashes) {
  EXPECT_THAT(*translate({"dsfs", "dsfs", "/mnt/x", "-o",
                          "dataset=a,cache_size=2G,prefetch=off,disk-cache=/var/cache/dsfs,"
                          "disk_cache_size=100GiB,verify,dataset=b"}),
              ElementsAre("dsfs", "mount", "/mnt/x", "--dataset=a", "--cache-size=2G",
                          "--prefetch=off", "--disk-cache=/var/cache/dsfs",
                          "--disk-cache-size=100GiB", "--verify", "--dataset=b"));
}

TEST(MountHelper, FuseOptionsGoToMountsDashO) {
  // What mount(8) and mount.fuse3 pass for `defaults,allow_other,noatime` as root.
  EXPECT_THAT(*translate({"dsfs", "imagenet", "/mnt/x", "-o",
                          "rw,noatime,cache_size=1G,allow_other,dev,suid"}),
              ElementsAre("dsfs", "mount", "/mnt/x", "--dataset=imagenet", "--cache-size=1G", "-o",
                          "noatime,allow_other,dev,suid"));
  EXPECT_THAT(*translate({"dsfs", "dsfs", "/mnt/x", "-oro,nodev,nosuid", "-o",
                          "max_read=1048576,fsname=imagenet,auto_unmount"}),
              ElementsAre("dsfs", "mount", "/mnt/x", "-o",
                          "ro,nodev,nosuid,max_read=1048576,fsname=imagenet,auto_unmount"));
}

TEST(MountHelper, OptionsForMountAndSystemdAreDropped) {
  EXPECT_THAT(
      *translate({"dsfs", "dsfs", "/mnt/x", "-o",
                  "defaults,_netdev,nofail,noauto,auto,user,users,x-systemd.automount,"
                  "x-systemd.requires=dsfs-redis.service,comment=x,relatime,lazytime,nodiratime,"
                  "nosymfollow,rw"}),
      ElementsAre("dsfs", "mount", "/mnt/x"));
}

TEST(MountHelper, RedisUrlsInOptionsKeepTheirCommas) {
  EXPECT_THAT(*translate({"dsfs", "dsfs", "/mnt/x", "-o",
                          "redis=redis://a:7000,redis://b:7000,cache_size=1G,"
                          "redis_password_file=/etc/dsfs/redis.pass"}),
              ElementsAre("dsfs", "mount", "/mnt/x", "--redis=redis://a:7000,redis://b:7000",
                          "--cache-size=1G", "--redis-password-file=/etc/dsfs/redis.pass"));
}

TEST(MountHelper, UnknownOptionIsAnErrorNamingIt) {
  const std::string message = error_of({"dsfs", "imagenet", "/mnt/x", "-o", "allow_other,bogus=1"});
  EXPECT_THAT(message, HasSubstr("unknown mount option 'bogus=1'"));
  EXPECT_THAT(message, HasSubstr("dsfs mount --help"));
  // A FUSE option libfuse's low-level API does not take, and a value on a FUSE flag.
  EXPECT_THAT(error_of({"dsfs", "dsfs", "/mnt/x", "-o", "kernel_cache"}),
              HasSubstr("'kernel_cache'"));
  EXPECT_THAT(error_of({"dsfs", "dsfs", "/mnt/x", "-o", "allow_other=1"}),
              HasSubstr("'allow_other=1'"));
}

TEST(MountHelper, DsfsOptionWithoutItsValueIsAnError) {
  EXPECT_THAT(error_of({"dsfs", "dsfs", "/mnt/x", "-o", "cache_size"}),
              HasSubstr("mount option 'cache_size' needs a value: cache_size=VALUE"));
}

TEST(MountHelper, ConflictsAndStrayArgumentsAreErrors) {
  EXPECT_THAT(error_of({"dsfs", "imagenet", "/mnt/x", "-o", "dataset=coco"}),
              HasSubstr("SOURCE 'imagenet' names a dataset and -o names dataset= too"));
  EXPECT_THAT(error_of({"dsfs", "redis://h:1", "/mnt/x", "-o", "redis=redis://g:2"}),
              HasSubstr("SOURCE is a Redis URL and -o names redis= too"));
  EXPECT_THAT(error_of({"dsfs", "a b", "/mnt/x"}), HasSubstr("SOURCE 'a b' is neither dsfs"));
  EXPECT_THAT(error_of({"dsfs", "imagenet", "/mnt/x", "-f"}),
              HasSubstr("unexpected argument '-f'"));
  EXPECT_THAT(error_of({"dsfs", "imagenet", "/mnt/x", "-o"}), HasSubstr("-o needs a value"));
}

TEST(MountHelper, ContextOfTheRealCommandLine) {
  CLI::App app;
  cli::GlobalOptions global;
  register_mount_commands(app, global);
  app.add_subcommand("list");
  const MountHelperContext context = mount_helper_context(app);
  EXPECT_THAT(context.subcommands, ::testing::IsSupersetOf({"mount", "umount", "list"}));
  const auto takes_value = [&](const std::string& name) -> std::optional<bool> {
    for (const MountOptionName& option : context.mount_options) {
      if (option.name == name) return option.takes_value;
    }
    return std::nullopt;
  };
  EXPECT_EQ(takes_value("cache-size"), true);
  EXPECT_EQ(takes_value("dataset"), true);
  EXPECT_EQ(takes_value("redis"), true);
  EXPECT_EQ(takes_value("redis-password-file"), true);
  EXPECT_EQ(takes_value("verify"), false);
  EXPECT_EQ(takes_value("follow-updates"), false);
  EXPECT_EQ(takes_value("help"), std::nullopt);

  const test::TempDir dir;
  const std::string mountpoint = dir.path().string();
  EXPECT_TRUE(context.is_directory(mountpoint));
  EXPECT_FALSE(context.is_directory(mountpoint + "/missing"));
  EXPECT_THAT(*translate_mount_helper_argv({"dsfs", "imagenet", mountpoint, "-o",
                                            "cache_size=64M,follow_updates,rw,_netdev"},
                                           context),
              ElementsAre("dsfs", "mount", mountpoint, "--dataset=imagenet", "--cache-size=64M",
                          "--follow-updates"));
}

TEST(MountHelper, PasswordFileMustBeUnreadableByOthers) {
  const test::TempDir dir;
  const std::string file = (dir.path() / "redis.pass").string();
  std::ofstream(file) << "secret\n";
  ASSERT_EQ(::chmod(file.c_str(), 0644), 0);
  try {
    check_password_file_mode(file);
    ADD_FAILURE() << "a 0644 password file passed";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("is readable by other users (mode 0644)"));
    EXPECT_THAT(e.what(), HasSubstr("chmod 600 " + file));
  }
  ASSERT_EQ(::chmod(file.c_str(), 0600), 0);
  EXPECT_NO_THROW(check_password_file_mode(file));
  EXPECT_NO_THROW(check_password_file_mode(file + ".missing"));  // reading it says why later
}

}  // namespace
}  // namespace dsfs::fs
