// Pure logic of the filesystem: inode numbering, mountinfo parsing, the generated .meta files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <xxhash.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "fs/filesystem.h"
#include "fs/inodes.h"
#include "fs/memory_trimmer.h"
#include "fs/mount.h"
#include "fs/virtual_files.h"
#include "src/catalog/catalog.h"
#include "src/catalog/manifest.h"
#include "tests/unit/support/files.h"

namespace dsfs::fs {
namespace {

TEST(Inodes, EntryInodesRoundTrip) {
  for (const uint32_t dataset : {0u, 1u, 7u, kMaxDatasets - 1}) {
    for (const uint32_t entry : {0u, 1u, 123456u, UINT32_MAX}) {
      const InodeRef ref = decode_inode(entry_inode(dataset, entry));
      EXPECT_EQ(ref.kind, InodeRef::Kind::kEntry);
      EXPECT_EQ(ref.dataset, dataset);
      EXPECT_EQ(ref.entry, entry);
    }
  }
}

TEST(Inodes, MetaInodesRoundTripAndNeverCollideWithEntries) {
  for (const uint32_t dataset : {0u, 5u, kMaxDatasets - 1}) {
    for (const MetaFile file : {MetaFile::kDirectory, MetaFile::kInfo, MetaFile::kClasses,
                                MetaFile::kLabels, MetaFile::kMetadata}) {
      const uint64_t ino = meta_inode(dataset, file);
      EXPECT_LT(ino, uint64_t{1} << 32);
      const InodeRef ref = decode_inode(ino);
      EXPECT_EQ(ref.kind, InodeRef::Kind::kMeta);
      EXPECT_EQ(ref.dataset, dataset);
      EXPECT_EQ(ref.meta, file);
    }
  }
}

TEST(Inodes, FixedInodesAndGaps) {
  EXPECT_EQ(decode_inode(kRootInode).kind, InodeRef::Kind::kRoot);
  EXPECT_EQ(decode_inode(kMetaDirInode).kind, InodeRef::Kind::kMetaDir);
  EXPECT_EQ(decode_inode(kControlDirInode).kind, InodeRef::Kind::kControlDir);
  EXPECT_EQ(decode_inode(kStatsInode).kind, InodeRef::Kind::kStats);
  EXPECT_EQ(decode_inode(kStatsSnapshotBase + 1).kind, InodeRef::Kind::kStatsSnapshot);
  EXPECT_EQ(decode_inode(kStatsSnapshotBase + 123456789).kind, InodeRef::Kind::kStatsSnapshot);
  EXPECT_EQ(decode_inode(kStatsSnapshotBase).kind, InodeRef::Kind::kInvalid);
  // The snapshot range ends where the view inodes begin (bit 63): .views/SPEC of slot 0.
  EXPECT_EQ(decode_inode(2 * kStatsSnapshotBase).kind, InodeRef::Kind::kViewSpec);
  EXPECT_EQ(decode_inode(kViewsDirInode).kind, InodeRef::Kind::kViewsDir);
  EXPECT_EQ(decode_inode(0).kind, InodeRef::Kind::kInvalid);
  EXPECT_EQ(decode_inode(10).kind, InodeRef::Kind::kInvalid);
  EXPECT_EQ(decode_inode(16 + 5).kind, InodeRef::Kind::kInvalid);  // slot 5 of dataset 0: unused
  EXPECT_EQ(decode_inode(UINT64_MAX).kind, InodeRef::Kind::kInvalid);
}

TEST(Inodes, MetaFileNames) {
  for (const MetaFile file : kMetaFiles) EXPECT_EQ(meta_file_by_name(meta_file_name(file)), file);
  EXPECT_EQ(meta_file_by_name("nope.txt"), std::nullopt);
  EXPECT_EQ(meta_file_by_name(""), std::nullopt);
}

TEST(Mountinfo, ParsesFieldsAndOptionalTags) {
  const std::string text =
      "22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/vda rw\n"
      "98 22 0:52 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:50 master:3 - fuse.dsfs dsfs "
      "rw,user_id=0,group_id=0,default_permissions\n"
      "garbage line\n"
      "99 22 0:53 / /x\\134y rw - tmpfs tmp\\040fs rw\n";
  const std::vector<MountInfo> mounts = parse_mountinfo(text);
  ASSERT_EQ(mounts.size(), 3u);
  EXPECT_EQ(mounts[0].mount_point, "/");
  EXPECT_EQ(mounts[0].fs_type, "ext4");
  EXPECT_EQ(mounts[1].mount_point, "/tmp/my mnt");
  EXPECT_EQ(mounts[1].fs_type, "fuse.dsfs");
  EXPECT_EQ(mounts[1].source, "dsfs");
  EXPECT_EQ(mounts[1].device, "0:52");
  EXPECT_EQ(mounts[2].mount_point, "/x\\y");
  EXPECT_EQ(mounts[2].source, "tmp fs");
}

TEST(Mountinfo, UnescapeLeavesIncompleteEscapesAlone) {
  EXPECT_EQ(unescape_mountinfo_field("a\\040b"), "a b");
  EXPECT_EQ(unescape_mountinfo_field("a\\011b\\012"), "a\tb\n");
  EXPECT_EQ(unescape_mountinfo_field("end\\04"), "end\\04");
  EXPECT_EQ(unescape_mountinfo_field("no\\9escape"), "no\\9escape");
}

TEST(Mountpoint, RejectsMissingAndNonDirectoryPaths) {
  EXPECT_THROW(check_mountpoint("/nonexistent/dsfs/mountpoint"), std::runtime_error);
  EXPECT_THROW(check_mountpoint("/proc/self/status"), std::runtime_error);
  EXPECT_THROW(check_mountpoint("/proc"), std::runtime_error);  // already a mount point
  try {
    check_mountpoint("/nonexistent/dsfs/mountpoint");
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("does not exist"));
  }
}

TEST(DaemonLock, UmountCanWaitForTheHolder) {
  const test::TempDir dir("dsfs-lock-test");
  ::setenv("XDG_RUNTIME_DIR", dir.path().c_str(), 1);
  const std::filesystem::path mountpoint = "/some/where/mnt";
  int holder = 0;
  EXPECT_TRUE(DaemonLock::wait_released(mountpoint, std::chrono::milliseconds(0), &holder));
  {
    DaemonLock lock(mountpoint);
    EXPECT_FALSE(DaemonLock::wait_released(mountpoint, std::chrono::milliseconds(100), &holder));
    EXPECT_EQ(holder, ::getpid());
    EXPECT_THROW(DaemonLock second(mountpoint), std::runtime_error);
    EXPECT_TRUE(DaemonLock::wait_released("/other/mnt", std::chrono::milliseconds(0), &holder));
  }
  EXPECT_TRUE(DaemonLock::wait_released(mountpoint, std::chrono::milliseconds(0), &holder));
  ::unsetenv("XDG_RUNTIME_DIR");
}

TEST(Csv, QuotesOnlyWhenNeeded) {
  EXPECT_EQ(csv_field("plain/path.jpg"), "plain/path.jpg");
  EXPECT_EQ(csv_field("with space.jpg"), "with space.jpg");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("line\nbreak"), "\"line\nbreak\"");
  EXPECT_EQ(csv_field(""), "");
}

std::shared_ptr<const catalog::Catalog> sample_catalog() {
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 1024);
  builder.set_classes({"ant", "bee"});
  builder.add_file("bee/b.jpg", 10, 0, 0644, 2, 1, 0, R"({"w":3,"path":"ignored"})");
  builder.add_file("ant/a,1.jpg", 20, 0, 0644, 1, 0, 0, "");
  builder.add_file("loose.txt", 5, 0, 0644, 3, catalog::kNoLabel, 0, R"({"note":"x"})");
  return std::make_shared<const catalog::Catalog>(std::move(builder).build());
}

TEST(VirtualFiles, ClassesAndLabels) {
  const auto catalog = sample_catalog();
  EXPECT_EQ(render_classes_txt(*catalog), "ant\nbee\n");
  // Catalogue order: breadth-first, names sorted within a directory.
  EXPECT_EQ(render_labels_csv(*catalog),
            "path,label\nloose.txt,\n\"ant/a,1.jpg\",0\nbee/b.jpg,1\n");
}

TEST(VirtualFiles, MetadataLinesStartWithThePath) {
  const auto catalog = sample_catalog();
  EXPECT_EQ(render_metadata_jsonl(*catalog),
            "{\"path\":\"loose.txt\",\"note\":\"x\"}\n"
            "{\"path\":\"bee/b.jpg\",\"w\":3}\n");
}

// A manifest written before ingest refused deep metadata (or by hand): printing it recursed once
// per level on the FUSE thread and overflowed its stack at tens of thousands of levels. It is
// served as a string now, never printed as JSON.
TEST(VirtualFiles, MetadataNestedTooDeepIsServedAsAString) {
  catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 1024);
  constexpr size_t kDepth = 100000;
  const std::string placeholder = "{\"a\":\"" + std::string(2 * kDepth - 2, 'x') + "\"}";
  builder.add_file("deep.bin", 1, 0, 0644, 1, catalog::kNoLabel, 0, placeholder);
  const catalog::Catalog shallow = std::move(builder).build();
  std::vector<std::byte> manifest = catalog::encode_manifest(shallow);
  const std::string deep = "{\"a\":" + std::string(kDepth, '[') + std::string(kDepth, ']') + "}";
  ASSERT_EQ(deep.size(), placeholder.size());
  const std::string_view bytes(reinterpret_cast<const char*>(manifest.data()), manifest.size());
  const size_t at = bytes.find(placeholder);
  ASSERT_NE(at, std::string_view::npos);
  std::memcpy(manifest.data() + at, deep.data(), deep.size());
  // The trailer: XXH64 of everything before it, as a writer of such a manifest stored it.
  const uint64_t digest = XXH64(manifest.data(), manifest.size() - 8, 0);
  std::memcpy(manifest.data() + manifest.size() - 8, &digest, 8);
  const catalog::Catalog catalog = catalog::decode_manifest(manifest);
  ASSERT_EQ(catalog.metadata(*catalog.find("deep.bin")), deep);
  const nlohmann::json line = nlohmann::json::parse(render_metadata_jsonl(catalog));
  EXPECT_EQ(line["path"], "deep.bin");
  EXPECT_EQ(line["metadata"], deep);
}

TEST(VirtualFiles, InfoJson) {
  prefetch::DatasetSnapshot snapshot;
  snapshot.catalog = sample_catalog();
  snapshot.info.name = "bugs";
  snapshot.info.generation = 4;
  snapshot.info.created_unix = 0;
  snapshot.info.source = "/data/bugs";
  const nlohmann::json info = nlohmann::json::parse(render_info_json(snapshot, "ns1"));
  EXPECT_EQ(info["name"], "bugs");
  EXPECT_EQ(info["namespace"], "ns1");
  EXPECT_EQ(info["generation"], 4);
  EXPECT_EQ(info["files"], 3);
  EXPECT_EQ(info["directories"], 3);  // root, ant, bee
  EXPECT_EQ(info["bytes"], 35);
  EXPECT_EQ(info["classes"], 2);
  EXPECT_EQ(info["created"], "1970-01-01T00:00:00Z");
  EXPECT_EQ(info["chunk_size"], 1024);
  EXPECT_EQ(info["checksum"], "xxh64");
}

TEST(Filesystem, DefaultCacheSizeIsBounded) {
  const uint64_t bytes = default_cache_bytes();
  EXPECT_GE(bytes, 64ull << 20);
  EXPECT_LE(bytes, 1ull << 30);
}

// A client that is never used: building a Filesystem connects to nothing.
std::shared_ptr<store::Client> unused_client() {
  return std::make_shared<store::Client>(std::vector<store::RedisEndpoint>{store::RedisEndpoint{}});
}

TEST(Filesystem, RejectsDatasetsThatWouldHideTheVirtualDirectories) {
  prefetch::DatasetSnapshot snapshot;
  snapshot.catalog = sample_catalog();
  for (const char* name : {".meta", ".dsfs", ".views"}) {
    snapshot.info.name = name;
    EXPECT_THROW(Filesystem(unused_client(), {snapshot}, FilesystemOptions{}),
                 std::invalid_argument)
        << name;
  }
  snapshot.info.name = "twice";
  EXPECT_THROW(Filesystem(unused_client(), {snapshot, snapshot}, FilesystemOptions{}),
               std::invalid_argument);
}

// Waits up to 10 s for `trims` trims; the trimmer's own idle periods are 40 ms.
bool trims_reach(const MemoryTrimmer& trimmer, uint64_t trims) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (trimmer.stats().trims < trims) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Memory is given back once after each pause of the reads, never while they go on, and not
// before anything was read.
TEST(MemoryTrimmer, TrimsOnceAfterEachPauseOfTheReadsAndNeverDuringThem) {
  std::atomic<uint64_t> reads{0};
  std::atomic<bool> reading{false};
  std::atomic<uint64_t> looks_while_reading{0};
  // The trimmer looks every 10 ms; while `reading`, every look sees the count moved, however
  // the threads are scheduled.
  MemoryTrimmer trimmer(
      [&] {
        if (reading) {
          looks_while_reading.fetch_add(1);
          return reads.fetch_add(1) + 1;
        }
        return reads.load();
      },
      std::chrono::milliseconds(40));
  trimmer.start();
  // Nothing read yet: twenty looks without a trim (its ticks are 10 ms).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(trimmer.stats().trims, 0u);

  reading = true;
  const auto looked = looks_while_reading.load();
  while (looks_while_reading.load() < looked + 20) {  // 20 looks: five idle periods
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(trimmer.stats().trims, 0u) << "trimmed while reads went on";
  reading = false;
  ASSERT_TRUE(trims_reach(trimmer, 1));
  // No second trim without a new read: the trimmer keeps looking meanwhile.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(trimmer.stats().trims, 1u);

  reads.fetch_add(1);
  ASSERT_TRUE(trims_reach(trimmer, 2));
}

TEST(MemoryTrimmer, StopsPromptlyAndWithoutStarting) {
  {
    MemoryTrimmer never_started([] { return uint64_t{0}; }, std::chrono::hours(1));
  }
  const auto began = std::chrono::steady_clock::now();
  {
    MemoryTrimmer trimmer([] { return uint64_t{0}; }, std::chrono::hours(1));
    trimmer.start();
  }  // its ticks are 15 minutes: the stop request must cut the wait short
  EXPECT_LT(std::chrono::steady_clock::now() - began, std::chrono::seconds(30));
}

TEST(MemoryTrimmer, ResidentBytesIsThisProcesssResidentSet) {
  const uint64_t rss = resident_bytes();
  EXPECT_GT(rss, 0u);
  EXPECT_LT(rss, uint64_t{1} << 40);
}

}  // namespace
}  // namespace dsfs::fs
