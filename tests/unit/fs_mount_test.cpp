// A real in-process FUSE mount over a real redis-server: tree, attributes, contents (chunked and
// empty files included), generated .meta files, xattrs, EROFS, EIO on corrupt objects, --verify,
// and Redis going away and coming back.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fs/mount.h"
#include "src/catalog/catalog.h"
#include "src/catalog/dataset.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "src/store/connection.h"
#include "src/store/errors.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::fs {
namespace {

using test::list_dir;
using test::read_errno;

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;
using namespace std::chrono_literals;
namespace stdfs = std::filesystem;

constexpr uint64_t kChunkSize = 64 * 1024;
constexpr int64_t kMtimeNs = 1'600'000'000'123'456'789;
constexpr const char* kDataset = "demo";

std::string random_bytes(size_t size, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::string bytes(size, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

struct TestFile {
  std::string path;
  std::string content;
  uint32_t label = catalog::kNoLabel;
  std::string metadata;
};

std::vector<TestFile> test_files() {
  return {
      {"cats/c1.jpg", random_bytes(3000, 1), 0, ""},
      {"cats/c2.jpg", random_bytes(5000, 2), 0, R"({"width":10,"source":"camera"})"},
      {"dogs/d1.jpg", random_bytes(4000, 3), 1, ""},
      {"dogs/deep/nested/n.bin", random_bytes(100, 4), 1, ""},
      // Four chunks: three full ones and a short last one.
      {"big.bin", random_bytes(3 * kChunkSize + 3392, 5), catalog::kNoLabel, ""},
      {"empty", "", catalog::kNoLabel, ""},
      {"name with space \xc3\xa9, \"q\".txt", "hello, world\n", catalog::kNoLabel, ""},
      {"corrupt.bin", random_bytes(1000, 6), catalog::kNoLabel, ""},
      {"checksum.bin", random_bytes(1000, 7), catalog::kNoLabel, ""},
      {"later/l0.bin", random_bytes(2000, 8), catalog::kNoLabel, ""},
      {"later/l1.bin", random_bytes(2000, 9), catalog::kNoLabel, ""},
  };
}

// Drops the kernel's cached pages of `path`, so the next read reaches the filesystem.
void drop_page_cache(const stdfs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << path;
  EXPECT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0) << path;
  ::close(fd);
}

class MountTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    work_ = std::make_unique<test::TempDir>("dsfs-fs-test");
    // Persistent: the outage tests stop and restart it and expect the dataset still there.
    redis_ = std::make_unique<test::TestRedisServer>(test::TestRedisOptions{.persist = true});
    publish_dataset();
    snapshots_ = load_datasets(*client(), catalog::KeySchema("dsfs"), {kDataset});
    mount_ = make_mount("mnt", /*verify=*/false);
  }

  static void TearDownTestSuite() {
    verify_mount_.reset();
    mount_.reset();
    redis_.reset();
    work_.reset();
  }

  static std::unique_ptr<Mount> make_mount(const std::string& name, bool verify) {
    const stdfs::path mountpoint = work_->path() / name;
    stdfs::create_directories(mountpoint);
    MountOptions options;
    options.session.mountpoint = mountpoint;
    options.session.threads = 4;
    options.filesystem.cache_bytes = 16 << 20;
    options.filesystem.timeout = 2s;
    options.filesystem.verify = verify;
    options.filesystem.connections = 4;
    // These tests count requests and take Redis away under single reads: nothing may be
    // fetched ahead of them (test_prefetch.py and prefetch_engine_test cover prefetching).
    options.filesystem.prefetch = prefetch::PrefetchMode::kOff;
    // A client of the mount's own, as `dsfs mount` makes it; connected, as loading the
    // catalogue through it leaves it there.
    auto client = std::make_shared<store::Client>(std::vector{redis_->endpoint()},
                                                  client_options(options.filesystem));
    client->connect();
    return std::make_unique<Mount>(std::move(client), snapshots_, options);
  }

  // A client of the test's own (catalogue operations).
  static std::unique_ptr<store::Client> client() {
    return std::make_unique<store::Client>(std::vector{redis_->endpoint()});
  }

  // A client for leases with short timeouts and a short retry budget (the lease refresher's
  // outage below fails fast), as a mount may give its GenerationLeases.
  static std::unique_ptr<store::Client> lease_client() {
    return std::make_unique<store::Client>(
        std::vector{redis_->endpoint()},
        store::ClientOptions{.connect = {.connect_timeout = 1s, .io_timeout = 3s},
                             .retry_budget = 300ms});
  }

  static void publish_dataset() {
    const catalog::KeySchema keys("dsfs");
    const auto conn = client();
    const uint64_t generation = catalog::begin_generation(*conn, keys, kDataset);
    catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, kChunkSize);
    builder.set_classes({"cats", "dogs"});
    builder.add_directory("void", kMtimeNs, 0755);
    uint64_t id = 0;
    for (const TestFile& file : test_files()) {
      ++id;
      builder.add_file(file.path, file.content.size(), kMtimeNs, 0644, id, file.label,
                       XXH64(file.content.data(), file.content.size(), 0), file.metadata);
      const uint64_t chunks =
          std::max<uint64_t>(1, (file.content.size() + kChunkSize - 1) / kChunkSize);
      for (uint64_t k = 0; k < chunks; ++k) {
        const std::string key = chunks == 1 ? keys.object(kDataset, generation, id)
                                            : keys.object_chunk(kDataset, generation, id, k);
        const std::string_view part =
            std::string_view(file.content).substr(k * kChunkSize, kChunkSize);
        conn->command({"SET", key, part}).expect_ok("SET object");
      }
      object_ids_[file.path] = id;
    }
    catalog::DatasetInfo info;
    info.name = kDataset;
    info.generation = generation;
    info.source = "fs_mount_test";
    const catalog::Catalog catalog = std::move(builder).build();
    catalog::publish(*conn, keys, info, catalog);
    generation_ = generation;
  }

  static std::string object_key(const std::string& path) {
    return catalog::KeySchema("dsfs").object(kDataset, generation_, object_ids_.at(path));
  }

  static stdfs::path mnt() { return mount_->mountpoint(); }
  static stdfs::path data() { return mount_->mountpoint() / kDataset; }

  static nlohmann::json stats() {
    return nlohmann::json::parse(test::read_file(mnt() / ".dsfs/stats.json"));
  }

  static inline std::unique_ptr<test::TempDir> work_;
  static inline std::unique_ptr<test::TestRedisServer> redis_;
  static inline std::vector<prefetch::DatasetSnapshot> snapshots_;
  static inline std::unique_ptr<Mount> mount_;
  static inline std::unique_ptr<Mount> verify_mount_;
  static inline std::map<std::string, uint64_t> object_ids_;
  static inline uint64_t generation_ = 0;
};

TEST_F(MountTest, IsAMountPointOfTypeDsfs) {
  const std::optional<MountInfo> info = find_mount(mnt());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->fs_type, kMountType);
  EXPECT_EQ(info->source, "dsfs");
  EXPECT_THROW(check_mountpoint(mnt()), std::runtime_error);
}

TEST_F(MountTest, RootListsDatasetsAndTheVirtualDirectories) {
  EXPECT_EQ(list_dir(mnt()), (std::set<std::string>{".dsfs", ".meta", ".views", kDataset}));
  EXPECT_EQ(list_dir(mnt() / ".meta"), (std::set<std::string>{kDataset}));
  EXPECT_EQ(list_dir(mnt() / ".meta" / kDataset),
            (std::set<std::string>{"info.json", "classes.txt", "labels.csv", "metadata.jsonl"}));
  EXPECT_EQ(list_dir(mnt() / ".dsfs"), (std::set<std::string>{"plan", "refresh", "stats.json"}));
}

TEST_F(MountTest, DatasetTreeIsExactlyTheIngestedOne) {
  std::set<std::string> found;
  for (const auto& entry : stdfs::recursive_directory_iterator(data())) {
    found.insert(stdfs::relative(entry.path(), data()).string());
  }
  std::set<std::string> expected = {"void", "cats", "dogs", "dogs/deep", "dogs/deep/nested",
                                    "later"};
  for (const TestFile& file : test_files()) expected.insert(file.path);
  EXPECT_EQ(found, expected);
  EXPECT_TRUE(list_dir(data() / "void").empty());
}

TEST_F(MountTest, StatGivesIngestedSizesTimesAndReadOnlyModes) {
  for (const TestFile& file : test_files()) {
    struct stat st {};
    ASSERT_EQ(::stat((data() / file.path).c_str(), &st), 0) << file.path;
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 07777, 0444u) << file.path;
    EXPECT_EQ(static_cast<size_t>(st.st_size), file.content.size()) << file.path;
    EXPECT_EQ(st.st_blocks, static_cast<blkcnt_t>((file.content.size() + 511) / 512));
    EXPECT_EQ(st.st_mtim.tv_sec, kMtimeNs / 1'000'000'000);
    EXPECT_EQ(st.st_mtim.tv_nsec, kMtimeNs % 1'000'000'000);
    EXPECT_EQ(st.st_nlink, 1u);
  }
  struct stat dir {};
  ASSERT_EQ(::stat((data() / "dogs").c_str(), &dir), 0);
  EXPECT_TRUE(S_ISDIR(dir.st_mode));
  EXPECT_EQ(dir.st_mode & 0222, 0u);
  EXPECT_EQ(dir.st_nlink, 3u);  // ".", its entry in the parent, and deep/..
  struct stat a {
  }, b{};
  ASSERT_EQ(::stat((data() / "cats/c1.jpg").c_str(), &a), 0);
  ASSERT_EQ(::stat((data() / "cats/c2.jpg").c_str(), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
  EXPECT_EQ(::access((data() / "nope").c_str(), F_OK), -1);
  EXPECT_EQ(errno, ENOENT);
  // A name longer than any a dataset can hold: ENAMETOOLONG, as ext4 answers (it was ENOENT).
  EXPECT_EQ(::access((data() / std::string(NAME_MAX + 1, 'n')).c_str(), F_OK), -1);
  EXPECT_EQ(errno, ENAMETOOLONG);
  EXPECT_EQ(::access((data() / std::string(NAME_MAX, 'n')).c_str(), F_OK), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(MountTest, ReadsReturnTheIngestedBytes) {
  for (const TestFile& file : test_files()) {
    if (file.path == "corrupt.bin" || file.path == "checksum.bin" ||
        file.path.starts_with("later/")) {
      continue;  // kept unread for the tests that damage or take away their objects
    }
    std::string content;
    ASSERT_EQ(read_errno(data() / file.path, &content), 0) << file.path;
    EXPECT_TRUE(content == file.content) << file.path;
  }
}

TEST_F(MountTest, ReadsAcrossChunkBoundariesAtAnyOffset) {
  const std::string expected = random_bytes(3 * kChunkSize + 3392, 5);
  const int fd = ::open((data() / "big.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const std::vector<std::pair<off_t, size_t>> ranges = {
      {0, 10},
      {kChunkSize - 5, 10},                         // spans chunks 0 and 1
      {kChunkSize - 1, 2 * kChunkSize + 2},         // spans three chunks
      {3 * kChunkSize, 3392},                       // exactly the short last chunk
      {3 * kChunkSize + 3000, 1000},                // runs past the end: short read
      {static_cast<off_t>(expected.size()), 100}};  // at the end: nothing
  for (const auto& [offset, length] : ranges) {
    std::string buf(length, '\0');
    const ssize_t n = ::pread(fd, buf.data(), length, offset);
    const size_t want = std::min<size_t>(length, expected.size() - static_cast<size_t>(offset));
    ASSERT_EQ(n, static_cast<ssize_t>(want)) << "offset " << offset;
    EXPECT_TRUE(buf.substr(0, want) == expected.substr(static_cast<size_t>(offset), want))
        << "offset " << offset;
  }
  ::close(fd);
}

TEST_F(MountTest, ConcurrentReadersGetTheSameBytes) {
  const std::string expected = random_bytes(3 * kChunkSize + 3392, 5);
  std::atomic<int> mismatches{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 6; ++t) {
    readers.emplace_back([&] {
      std::string content;
      if (read_errno(data() / "big.bin", &content) != 0 || content != expected) ++mismatches;
    });
  }
  for (auto& reader : readers) reader.join();
  EXPECT_EQ(mismatches, 0);
}

TEST_F(MountTest, MetaFilesDescribeTheDataset) {
  const stdfs::path meta = mnt() / ".meta" / kDataset;
  EXPECT_EQ(test::read_file(meta / "classes.txt"), "cats\ndogs\n");

  const std::string labels = test::read_file(meta / "labels.csv");
  std::istringstream lines(labels);
  std::string line;
  std::vector<std::string> rows;
  while (std::getline(lines, line)) rows.push_back(line);
  ASSERT_FALSE(rows.empty());
  EXPECT_EQ(rows[0], "path,label");
  EXPECT_EQ(rows.size(), 1 + test_files().size());
  EXPECT_THAT(rows, ::testing::Contains("cats/c1.jpg,0"));
  EXPECT_THAT(rows, ::testing::Contains("dogs/deep/nested/n.bin,1"));
  EXPECT_THAT(rows, ::testing::Contains("big.bin,"));
  EXPECT_THAT(rows, ::testing::Contains("\"name with space \xc3\xa9, \"\"q\"\".txt\","));

  const nlohmann::json info = nlohmann::json::parse(test::read_file(meta / "info.json"));
  EXPECT_EQ(info["name"], kDataset);
  EXPECT_EQ(info["generation"], generation_);
  EXPECT_EQ(info["files"], test_files().size());
  EXPECT_EQ(info["classes"], 2);
  EXPECT_EQ(info["chunk_size"], kChunkSize);
  EXPECT_EQ(info["source"], "fs_mount_test");
  EXPECT_EQ(info["namespace"], "dsfs");

  const std::string metadata = test::read_file(meta / "metadata.jsonl");
  EXPECT_EQ(metadata, "{\"path\":\"cats/c2.jpg\",\"width\":10,\"source\":\"camera\"}\n");

  // stat must give the exact size, or readers that trust st_size would truncate.
  for (const char* name : {"classes.txt", "labels.csv", "info.json", "metadata.jsonl"}) {
    EXPECT_EQ(stdfs::file_size(meta / name), test::read_file(meta / name).size()) << name;
  }
}

std::string get_xattr(const stdfs::path& path, const char* name, int* error) {
  *error = 0;
  const ssize_t size = ::getxattr(path.c_str(), name, nullptr, 0);  // size probe
  if (size < 0) {
    *error = errno;
    return {};
  }
  std::string value(static_cast<size_t>(size), '\0');
  const ssize_t n = ::getxattr(path.c_str(), name, value.data(), value.size());
  if (n < 0) *error = errno;
  return value.substr(0, n < 0 ? 0 : static_cast<size_t>(n));
}

TEST_F(MountTest, FilesCarryLabelClassAndMetadataXattrs) {
  int error = 0;
  EXPECT_EQ(get_xattr(data() / "dogs/d1.jpg", "user.dsfs.label", &error), "1");
  EXPECT_EQ(error, 0);
  EXPECT_EQ(get_xattr(data() / "dogs/d1.jpg", "user.dsfs.class", &error), "dogs");
  EXPECT_EQ(get_xattr(data() / "cats/c2.jpg", "user.dsfs.meta", &error),
            R"({"width":10,"source":"camera"})");
  get_xattr(data() / "dogs/d1.jpg", "user.dsfs.meta", &error);
  EXPECT_EQ(error, ENODATA);
  get_xattr(data() / "big.bin", "user.dsfs.label", &error);
  EXPECT_EQ(error, ENODATA);
  get_xattr(data() / "cats", "user.dsfs.label", &error);
  EXPECT_EQ(error, ENODATA);

  char small[1];
  EXPECT_EQ(::getxattr((data() / "dogs/d1.jpg").c_str(), "user.dsfs.class", small, sizeof small),
            -1);
  EXPECT_EQ(errno, ERANGE);

  std::string names(256, '\0');
  const ssize_t n = ::listxattr((data() / "cats/c2.jpg").c_str(), names.data(), names.size());
  ASSERT_GT(n, 0);
  names.resize(static_cast<size_t>(n));
  EXPECT_EQ(names, std::string("user.dsfs.label\0user.dsfs.class\0user.dsfs.meta\0", 47));
  EXPECT_EQ(::listxattr((data() / "big.bin").c_str(), nullptr, 0), 0);
}

TEST_F(MountTest, ChangesAreRefusedWithEROFS) {
  const stdfs::path file = data() / "cats/c1.jpg";
  // The kernel no longer asks on open (no OPEN requests) and the mount is not `ro` (.dsfs/plan
  // takes writes), so root may get a writable descriptor: every write through it is refused.
  const int fd = ::open(file.c_str(), O_WRONLY);
  if (fd >= 0) {
    EXPECT_EQ(::write(fd, "x", 1), -1);
    EXPECT_EQ(errno, EROFS);
    ::close(fd);
  } else {
    EXPECT_EQ(errno, EROFS);
  }
  EXPECT_EQ(::open(file.c_str(), O_WRONLY | O_TRUNC), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::open((data() / "cats/new.jpg").c_str(), O_WRONLY | O_CREAT, 0644), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::mkdir((data() / "newdir").c_str(), 0755), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::rename(file.c_str(), (data() / "cats/moved.jpg").c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::unlink(file.c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::setxattr(file.c_str(), "user.x", "1", 1, 0), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::truncate(file.c_str(), 0), -1);
  EXPECT_EQ(errno, EROFS);
}

TEST_F(MountTest, AnObjectOfTheWrongLengthIsEIONeverWrongBytes) {
  store::Connection conn(redis_->endpoint());
  conn.command({"SET", object_key("corrupt.bin"), "too short"}).expect_ok("SET");
  EXPECT_EQ(read_errno(data() / "corrupt.bin"), EIO);
  const nlohmann::json s = stats();
  EXPECT_GE(s["errors"]["integrity"].get<int>(), 1);
  EXPECT_GE(s["errors"]["length_mismatches"].get<int>(), 1);
  // A missing key is EIO too.
  conn.command({"DEL", object_key("corrupt.bin")}).expect_ok("DEL");
  EXPECT_EQ(read_errno(data() / "corrupt.bin"), EIO);
  EXPECT_GE(stats()["errors"]["missing_objects"].get<int>(), 1);
}

TEST_F(MountTest, VerifyCatchesSameLengthCorruption) {
  const std::string good = random_bytes(1000, 7);
  std::string bad = good;
  bad[500] ^= 0x5a;
  store::Connection conn(redis_->endpoint());
  conn.command({"SET", object_key("checksum.bin"), bad}).expect_ok("SET");
  verify_mount_ = make_mount("mnt-verify", /*verify=*/true);
  const stdfs::path verified = verify_mount_->mountpoint() / kDataset;

  EXPECT_EQ(read_errno(verified / "checksum.bin"), EIO);
  // Intact files, a chunked one included, pass verification.
  std::string content;
  ASSERT_EQ(read_errno(verified / "big.bin", &content), 0);
  EXPECT_TRUE(content == random_bytes(3 * kChunkSize + 3392, 5));
  ASSERT_EQ(read_errno(verified / "cats/c1.jpg", &content), 0);
  EXPECT_TRUE(content == random_bytes(3000, 1));
  const nlohmann::json verify_stats =
      nlohmann::json::parse(verify_mount_->filesystem().stats_json());
  EXPECT_GE(verify_stats["errors"]["checksum_mismatches"].get<int>(), 1);

  // Without --verify only the length is checked, which this corruption passes.
  ASSERT_EQ(read_errno(data() / "checksum.bin", &content), 0);
  EXPECT_TRUE(content == bad);
  verify_mount_.reset();
}

TEST_F(MountTest, StatsJsonCountsRequestsAndBytes) {
  drop_page_cache(data() / "dogs/d1.jpg");
  const nlohmann::json before = stats();
  std::string content;
  ASSERT_EQ(read_errno(data() / "dogs/d1.jpg", &content), 0);
  const nlohmann::json after = stats();
  EXPECT_EQ(after["bytes_read"].get<uint64_t>(),
            before["bytes_read"].get<uint64_t>() + content.size());
  EXPECT_GT(after["files_read"].get<uint64_t>(), before["files_read"].get<uint64_t>());
  EXPECT_GT(after["requests"]["read"].get<uint64_t>(), before["requests"]["read"].get<uint64_t>());
  EXPECT_EQ(after["datasets"][kDataset]["generation"], generation_);
  EXPECT_EQ(after["cache"]["capacity_bytes"], 16 << 20);
  EXPECT_GT(after["redis_ops"]["gets"].get<uint64_t>(), 0u);
  EXPECT_LE(after["cache"]["bytes"].get<uint64_t>(),
            after["cache"]["capacity_bytes"].get<uint64_t>());
}

// Files never change, so the kernel is told to skip OPEN and RELEASE: reading many files costs
// no OPEN after the first (which answers ENOSYS to switch it off) and no RELEASE at all.
TEST_F(MountTest, ReadingFilesCostsNoOpenOrReleaseRequests) {
  const std::vector<std::string> files = {"cats/c1.jpg", "cats/c2.jpg", "dogs/d1.jpg", "big.bin"};
  const nlohmann::json before = stats();
  for (int round = 0; round < 3; ++round) {
    for (const std::string& file : files) {
      drop_page_cache(data() / file);  // every round reaches the filesystem
      ASSERT_EQ(read_errno(data() / file), 0) << file;
    }
  }
  const nlohmann::json after = stats();
  EXPECT_LE(after["requests"]["open"].get<uint64_t>(), 1u);
  EXPECT_EQ(after["requests"].count("release"), 0u);
  EXPECT_EQ(after["files_read"].get<uint64_t>(),
            before["files_read"].get<uint64_t>() + 3 * files.size());
}

// Each open of stats.json sees counters as of that open, whole, with stat's size matching the
// bytes read, even though the kernel caches file contents across opens.
TEST_F(MountTest, EveryOpenOfStatsJsonIsAFreshWholeSnapshot) {
  const stdfs::path path = mnt() / ".dsfs/stats.json";
  uint64_t last_lookups = 0;
  for (int i = 0; i < 5; ++i) {
    const uintmax_t size = stdfs::file_size(path);
    const std::string text = test::read_file(path);
    const nlohmann::json s = nlohmann::json::parse(text);
    EXPECT_GT(size, 0u);
    const uint64_t lookups = s["requests"]["lookup"].get<uint64_t>();
    EXPECT_GT(lookups, last_lookups);  // this open's own lookup is counted in its snapshot
    last_lookups = lookups;
  }
}

// .dsfs/plan is the mount's one writable file: O_TRUNC replaces the plan, O_APPEND extends it,
// and it reads back empty (stats.json says what it holds). Everything else stays EROFS.
TEST_F(MountTest, ThePlanTakesWritesAndNothingElseDoes) {
  const stdfs::path plan = mnt() / ".dsfs" / "plan";
  struct stat st {};
  ASSERT_EQ(::stat(plan.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0200u);
  const auto write_plan = [&](int flags, const std::string& text) {
    const int fd = ::open(plan.c_str(), O_WRONLY | flags);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
    EXPECT_EQ(::close(fd), 0);
  };
  const std::string prefix = std::string(kDataset) + "/";
  write_plan(O_TRUNC, prefix + "later/l0.bin\n" + prefix + "later/l1.bin\n");
  EXPECT_EQ(stats()["prefetch"]["plan"]["entries"], 2);
  write_plan(O_APPEND, prefix + "later/l0.bin\nno/such/file\n");
  EXPECT_EQ(stats()["prefetch"]["plan"]["entries"], 3);
  EXPECT_EQ(stats()["prefetch"]["plan"]["unresolved"], 1);
  ASSERT_EQ(::stat(plan.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 0);
  EXPECT_EQ(test::read_file(plan), "");
  write_plan(O_TRUNC, prefix + "later/l1.bin\n");
  EXPECT_EQ(stats()["prefetch"]["plan"]["entries"], 1);
  EXPECT_EQ(stats()["prefetch"]["plan"]["unresolved"], 0);
  EXPECT_EQ(::truncate(plan.c_str(), 0), 0);
  EXPECT_EQ(stats()["prefetch"]["plan"]["entries"], 0);
  // O_TRUNC alone clears it too (`: > plan`): it must reach the mount although OPEN does not.
  write_plan(O_TRUNC, prefix + "later/l1.bin\n");
  EXPECT_EQ(stats()["prefetch"]["plan"]["entries"], 1);
  write_plan(O_TRUNC, "");
  EXPECT_EQ(stats()["prefetch"]["plan"]["entries"], 0);
  // Still read-only everywhere else, .dsfs included.
  const int created = ::open((mnt() / ".dsfs" / "other").c_str(), O_WRONLY | O_CREAT, 0644);
  const int create_errno = errno;
  if (created >= 0) ::close(created);  // an fd left open would keep the mount from unmounting
  EXPECT_EQ(created, -1);
  EXPECT_EQ(create_errno, EROFS);
  EXPECT_EQ(::truncate((mnt() / ".dsfs" / "stats.json").c_str(), 0), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::truncate((data() / "later/l0.bin").c_str(), 0), -1);
  EXPECT_EQ(errno, EROFS);
}

// Last: takes Redis away and brings it back.
TEST_F(MountTest, ReadsFailWithEIOWhileRedisIsAwayAndWorkAgainWhenItIsBack) {
  const uint64_t unavailable_before =
      mount_->filesystem().counters().errors[static_cast<size_t>(ErrorKind::kUnavailable)];
  redis_->stop();
  const int error = read_errno(data() / "later/l0.bin");
  redis_->start();
  EXPECT_EQ(error, EIO);
  const nlohmann::json s = stats();
  // The kernel may re-issue the failed read; the repeat fails at once.
  EXPECT_GE(s["errors"]["redis_unavailable"].get<uint64_t>(), unavailable_before + 1);
  EXPECT_GT(s["redis_ops"]["retries"].get<uint64_t>(), 0u);  // it retried before giving up

  // Same mount, no remount: the pool reconnects.
  std::string content;
  ASSERT_EQ(read_errno(data() / "later/l0.bin", &content), 0);
  EXPECT_TRUE(content == random_bytes(2000, 8));
  ASSERT_EQ(read_errno(data() / "later/l1.bin", &content), 0);
  EXPECT_TRUE(content == random_bytes(2000, 9));
}

// Polls `done` for up to 20 s (the lease thread runs on its own schedule).
template <typename Done>
bool eventually(Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(20ms);
  }
  return true;
}

TEST_F(MountTest, LeasesPinTheServedGenerationRefreshThroughAnOutageAndRelease) {
  const catalog::KeySchema keys("dsfs");
  const std::string readers = keys.readers(kDataset);
  const auto leases_client = lease_client();
  auto leases = std::make_unique<GenerationLeases>(*leases_client, keys, 600ms);
  const auto loaded = load_datasets(*client(), keys, {kDataset}, leases.get());
  ASSERT_EQ(loaded.size(), 1u);
  EXPECT_EQ(loaded[0].generation(), generation_);
  const auto pinned = [&] { return catalog::pinned_generations(*client(), keys, kDataset); };
  const std::set<uint64_t> just_ours = {generation_};
  EXPECT_EQ(pinned(), just_ours);
  {
    store::Connection conn(redis_->endpoint());
    EXPECT_FALSE(
        conn.command({"ZSCORE", readers, std::to_string(generation_) + ":" + leases->reader_id()})
            .is_nil());
  }

  // Three refreshes take at least the 600 ms ttl: only refreshing keeps the lease alive.
  leases->start_refreshing();
  ASSERT_TRUE(eventually([&] { return leases->refreshes() >= 3; }));
  EXPECT_EQ(pinned(), just_ours);

  // Redis away for longer than the ttl: refreshes fail (logged, not fatal), and once it is
  // back the lapsed lease is renewed because the generation still exists.
  // Counted once Redis has exited (stop() waits for it): a refresh already in flight when the
  // stop began may still have completed. Then two failed rounds in a row, and none succeeded.
  redis_->stop();
  const uint64_t before_outage = leases->refreshes();
  const uint64_t failures_before = leases->refresh_failures();
  ASSERT_TRUE(eventually([&] { return leases->refresh_failures() >= failures_before + 2; }));
  EXPECT_EQ(leases->refreshes(), before_outage);
  redis_->start();
  ASSERT_TRUE(eventually([&] { return leases->refreshes() >= before_outage + 2; }));
  EXPECT_EQ(pinned(), just_ours);

  // As if GC had dropped the lease while it had lapsed: the generation still exists, so the
  // next refresh pins it again.
  store::Connection conn(redis_->endpoint());
  const std::string member = std::to_string(generation_) + ":" + leases->reader_id();
  const std::string gen_text = std::to_string(generation_);
  conn.command({"ZREM", readers, member}).expect_ok("ZREM");
  const uint64_t before_drop = leases->refreshes();
  ASSERT_TRUE(eventually([&] { return leases->refreshes() >= before_drop + 2; }));
  EXPECT_EQ(pinned(), just_ours);
  // As if it had also been collected (or removed): the lease is given up, not re-created.
  conn.command({"SREM", keys.generations(kDataset), gen_text}).expect_ok("SREM");
  conn.command({"ZREM", readers, member}).expect_ok("ZREM");
  const uint64_t before_gone = leases->refreshes();
  ASSERT_TRUE(eventually([&] { return leases->refreshes() >= before_gone + 2; }));
  EXPECT_EQ(conn.command({"EXISTS", readers}).integer(), 0);
  conn.command({"SADD", keys.generations(kDataset), gen_text}).expect_ok("SADD");

  leases.reset();  // unpins what is left (nothing here) without waiting for the ttl
  EXPECT_EQ(conn.command({"EXISTS", readers}).integer(), 0);
}

TEST_F(MountTest, ReleasingLeasesUnpinsAtOnce) {
  const catalog::KeySchema keys("dsfs");
  const auto leases_client = lease_client();
  auto leases = std::make_unique<GenerationLeases>(*leases_client, keys, 60s);
  load_datasets(*leases_client, keys, {kDataset}, leases.get());
  leases->start_refreshing();
  store::Connection conn(redis_->endpoint());
  EXPECT_EQ(conn.command({"ZCARD", keys.readers(kDataset)}).integer(), 1);
  const auto started = std::chrono::steady_clock::now();
  leases.reset();  // stops the refresher mid-sleep and unpins
  EXPECT_LT(std::chrono::steady_clock::now() - started, 5s);
  EXPECT_EQ(conn.command({"EXISTS", keys.readers(kDataset)}).integer(), 0);
  EXPECT_THROW(GenerationLeases(*leases_client, keys, 0ms), std::invalid_argument);
}

}  // namespace
}  // namespace dsfs::fs
