// The FUSE request handlers under concurrent requests, through a real in-process mount: many
// threads reading .dsfs/stats.json while other FUSE threads forget the snapshots they read.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fs/inodes.h"
#include "fs/mount.h"
#include "src/catalog/catalog.h"
#include "src/store/client.h"
#include "tests/unit/support/files.h"

namespace dsfs::fs {
namespace {

using namespace std::chrono_literals;
namespace stdfs = std::filesystem;

// A mount of one tiny dataset. Nothing here reads file contents, so no Redis is needed: the
// client connects only on a file read.
class FsReview : public ::testing::Test {
 protected:
  void SetUp() override {
    catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 4096);
    builder.add_file("a.bin", 10, 0, 0644, 1, catalog::kNoLabel, 0, "");
    prefetch::DatasetSnapshot d;
    d.info.name = "rv";
    d.info.generation = 1;
    d.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
    store::RedisEndpoint nowhere;
    nowhere.host = "127.0.0.1";
    nowhere.port = 1;
    MountOptions options;
    options.session.mountpoint = dir_.path() / "mnt";
    options.session.threads = 8;
    stdfs::create_directories(options.session.mountpoint);
    mount_ = std::make_unique<Mount>(
        std::make_shared<store::Client>(std::vector{nowhere}, client_options(options.filesystem)),
        std::vector{std::move(d)}, options);
  }

  test::TempDir dir_{"dsfs-fs-concurrency"};
  std::unique_ptr<Mount> mount_;
};

// A stats.json snapshot is freed by FORGET (before: by RELEASE), which another FUSE thread may
// handle as soon as the reader has its bytes: while the READ handler is still inside
// fuse_reply_buf (sanitizers check the written buffer after writev returns). Under the
// project's ASan build that aborted the daemon; the snapshot must outlive every reply from it.
TEST_F(FsReview, StatsJsonSnapshotsOutliveTheirReplies) {
  const stdfs::path stats = mount_->mountpoint() / kControlDirName / kStatsFileName;
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 8; ++t) {
    readers.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        const int fd = ::open(stats.c_str(), O_RDONLY);
        if (fd < 0) {
          ++bad;
          continue;
        }
        std::string text;
        char buf[65536];
        ssize_t n = 0;
        while ((n = ::read(fd, buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
        ::close(fd);
        if (n < 0 || !text.starts_with("{") || !text.ends_with("}\n")) ++bad;
      }
    });
  }
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace dsfs::fs
