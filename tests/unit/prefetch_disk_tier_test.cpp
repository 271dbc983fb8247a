// DiskTier on real files: round trip, persistence across reopen, every kind of damage (a flipped
// byte, a truncated, deleted or foreign file, a vanished directory, a failing write) reported as
// "not found" and counted, never as wrong bytes; the byte bound; the write-behind queue's drops;
// the lock against a second mount; temp files of a killed writer. Then ObjectFetcher with a tier
// against a real redis-server: Redis is asked only for what the tier lacks or drops.
#include "prefetch/disk_tier.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>
#include <numeric>
#include <random>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "prefetch/object_fetcher.h"
#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/connection.h"
#include "tests/unit/support/files.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::prefetch {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

DiskTierKey key(uint64_t object, uint64_t generation = 1, uint32_t chunk = 0) {
  return DiskTierKey{
      .dataset = "imgs", .generation = generation, .object_id = object, .chunk = chunk};
}

ObjectBuffer object(size_t size, unsigned seed) {
  return std::make_shared<const ObjectData>(test::pattern_bytes(size, seed));
}

std::string bytes_of(const ObjectBuffer& buffer) {
  return buffer ? std::string(buffer->bytes()) : std::string("<not found>");
}

// The pages of the file that the page cache holds now (mincore on a mapping, which reads
// nothing in).
size_t cached_pages(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    ADD_FAILURE() << "cannot open " << path << ": " << std::strerror(errno);
    return 0;
  }
  const size_t size = std::filesystem::file_size(path);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* map = size == 0 ? MAP_FAILED : ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) return 0;
  std::vector<unsigned char> resident((size + page - 1) / page);
  EXPECT_EQ(::mincore(map, size, resident.data()), 0) << std::strerror(errno);
  ::munmap(map, size);
  return static_cast<size_t>(
      std::count_if(resident.begin(), resident.end(), [](unsigned char r) { return r & 1; }));
}

// Writes the file back and drops its pages from the page cache, so that the next read goes to
// the disk.
void evict_from_page_cache(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path << ": " << std::strerror(errno);
  EXPECT_EQ(::fsync(fd), 0);
  EXPECT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ::close(fd);
}

// Empty when the filesystem under `dir` lets a file be evicted from the page cache and read
// with O_DIRECT without bringing it back (a disk filesystem); else why not (tmpfs keeps every
// page in memory; some filesystems refuse O_DIRECT). Tests of what a direct read leaves in the
// page cache skip where it is not so: there is nothing to test there.
std::string direct_reads_bypass_the_page_cache(const std::filesystem::path& dir) {
  const std::filesystem::path probe = dir / "direct-probe";
  test::write_file(probe, test::pattern_bytes(64 * 1024, 7));
  evict_from_page_cache(probe);
  if (cached_pages(probe) != 0) return "the page cache here keeps a file after POSIX_FADV_DONTNEED";
  const int fd = ::open(probe.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (fd < 0) return std::string("O_DIRECT: ") + std::strerror(errno);
  void* buffer = nullptr;
  EXPECT_EQ(::posix_memalign(&buffer, 4096, 64 * 1024), 0);
  const ssize_t got = ::pread(fd, buffer, 64 * 1024, 0);
  std::free(buffer);
  ::close(fd);
  if (got != 64 * 1024) return "a direct read of the probe failed";
  if (cached_pages(probe) != 0) return "a direct read here leaves the file in the page cache";
  std::filesystem::remove(probe);
  return "";
}

// Empty when cachestat(2) sees a file under `dir` that the page cache holds (Linux 6.5, and a
// filesystem whose files are their own: on overlayfs it asks the overlay's empty mapping, not
// the file below); else why not.
std::string cachestat_sees_the_page_cache(const std::filesystem::path& dir) {
  const std::filesystem::path probe = dir / "cachestat-probe";
  test::write_file(probe, test::pattern_bytes(64 * 1024, 9));
  test::read_file(probe);
  struct {
    uint64_t offset = 0, length = 0;
  } range;
  uint64_t stat[5] = {};  // the first: pages cached
  const int fd = ::open(probe.c_str(), O_RDONLY | O_CLOEXEC);
  const long result = ::syscall(451, fd, &range, stat, 0);  // SYS_cachestat
  const int error = errno;
  ::close(fd);
  std::filesystem::remove(probe);
  if (result != 0) return std::string("cachestat(2): ") + std::strerror(error);
  if (stat[0] < 16) {  // 64 KiB, just read
    return "cachestat(2) does not see this filesystem's page cache (overlayfs?)";
  }
  return "";
}

class DiskTierTest : public ::testing::Test {
 protected:
  std::unique_ptr<DiskTier> open(uint64_t capacity = 64 * kMiB, uint64_t queue = 64 * kMiB,
                                 bool start = true) {
    auto tier = std::make_unique<DiskTier>(DiskTierOptions{.dir = dir_.path() / "tier",
                                                           .capacity_bytes = capacity,
                                                           .queue_bytes = queue,
                                                           .page_cache_first = page_cache_first_});
    if (start) tier->start();
    return tier;
  }
  // Writes `count` objects of `size` bytes (seeds = object ids) and waits until they are on disk.
  static void fill(DiskTier& tier, uint64_t first, uint64_t count, size_t size,
                   uint64_t generation = 1) {
    for (uint64_t i = first; i < first + count; ++i) {
      ASSERT_TRUE(tier.put(key(i, generation), object(size, static_cast<unsigned>(i))));
      tier.flush();
    }
  }

  // A tier the prefetch engine tells epochs to (--prefetch auto or plan), started.
  std::unique_ptr<DiskTier> open_following_epochs(uint64_t capacity) {
    auto tier = std::make_unique<DiskTier>(DiskTierOptions{
        .dir = dir_.path() / "tier", .capacity_bytes = capacity, .follows_epochs = true});
    tier->start();
    return tier;
  }

  std::filesystem::path index_path() const { return dir_.path() / "tier" / "index"; }

  bool page_cache_first_ = true;
  test::TempDir dir_{"dsfs-disk-tier"};
};

TEST_F(DiskTierTest, ObjectsComeBackByteForByte) {
  auto tier = open();
  EXPECT_EQ(tier->get(key(1), 1000), nullptr);  // nothing yet
  ASSERT_TRUE(tier->put(key(1), object(1000, 1)));
  ASSERT_TRUE(tier->put(key(2), object(0, 2)));           // empty objects too
  ASSERT_TRUE(tier->put(key(1, 1, 3), object(5000, 3)));  // another chunk of the same object
  EXPECT_FALSE(tier->put(key(1), object(1000, 1)));       // already queued
  tier->flush();
  EXPECT_EQ(bytes_of(tier->get(key(1), 1000)), test::pattern_bytes(1000, 1));
  EXPECT_EQ(bytes_of(tier->get(key(2), 0)), "");
  EXPECT_EQ(bytes_of(tier->get(key(1, 1, 3), 5000)), test::pattern_bytes(5000, 3));
  EXPECT_FALSE(tier->put(key(1), object(1000, 1)));  // already on disk
  const DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.writes, 3u);
  EXPECT_EQ(stats.hits, 3u);
  EXPECT_EQ(stats.misses, 1u);
  EXPECT_EQ(stats.bytes_read, 6000u);
  EXPECT_EQ(stats.entries, 3u);
  EXPECT_EQ(stats.bytes_used, 3 * 4096u + 4096u);  // 5000 + header take two blocks
  EXPECT_EQ(stats.checksum_failures + stats.read_errors + stats.write_errors, 0u);
}

TEST_F(DiskTierTest, AnotherGenerationOrDatasetIsAnotherObject) {
  auto tier = open();
  fill(*tier, 7, 1, 1000, /*generation=*/1);
  EXPECT_EQ(tier->get(key(7, 2), 1000), nullptr);
  EXPECT_EQ(tier->get(DiskTierKey{.dataset = "other", .generation = 1, .object_id = 7}, 1000),
            nullptr);
  EXPECT_NE(tier->get(key(7, 1), 1000), nullptr);
}

// A name and generation can be made twice: by another namespace or Redis whose mounts share the
// tier, or again after Redis lost its data. Before the ingest was recorded, the tier served the
// first one's bytes for the second (same names, same sizes, other bytes).
TEST_F(DiskTierTest, AFileWrittenForAnotherIngestOfTheNameAndGenerationIsNotServed) {
  auto tier = open();
  DiskTierKey first = key(7);
  first.ingest = 0x1111'2222'3333'4444;
  DiskTierKey second = first;
  second.ingest = 0x5555'6666'7777'8888;
  ASSERT_TRUE(tier->put(first, object(1000, 1)));
  tier->flush();
  EXPECT_EQ(bytes_of(tier->get(first, 1000)), test::pattern_bytes(1000, 1));
  EXPECT_EQ(tier->get(second, 1000), nullptr);
  EXPECT_EQ(tier->stats().stale_drops, 1u);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
  // Read from Redis instead and written again: now the second's.
  ASSERT_TRUE(tier->put(second, object(1000, 2)));
  tier->flush();
  EXPECT_EQ(bytes_of(tier->get(second, 1000)), test::pattern_bytes(1000, 2));
  // The same low 32 bits: the payload's checksum, seeded with all 64, tells them apart.
  DiskTierKey third = second;
  third.ingest = second.ingest + (uint64_t{1} << 32);
  EXPECT_EQ(tier->get(third, 1000), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  EXPECT_EQ(tier->stats().stale_drops, 1u);
}

TEST_F(DiskTierTest, TheIndexSurvivesCloseAndReopen) {
  {
    auto tier = open();
    fill(*tier, 1, 10, 3000);
  }
  EXPECT_TRUE(std::filesystem::exists(index_path()));  // saved by the clean close
  auto tier = open();
  const DiskTierStats stats = tier->stats();
  EXPECT_TRUE(stats.index_loaded);
  EXPECT_EQ(stats.entries, 10u);
  EXPECT_EQ(stats.bytes_used, 10 * 4096u);
  // Used once: while the tier is open, no index on disk could miss its writes.
  EXPECT_FALSE(std::filesystem::exists(index_path()));
  for (uint64_t i = 1; i <= 10; ++i) {
    EXPECT_EQ(bytes_of(tier->get(key(i), 3000)), test::pattern_bytes(3000, i)) << i;
  }
}

TEST_F(DiskTierTest, ADamagedIndexIsIgnoredAndTheObjectsListed) {
  for (const char* damage : {"flip", "truncate", "empty", "other version"}) {
    SCOPED_TRACE(damage);
    std::filesystem::remove_all(dir_.path() / "tier");
    {
      auto tier = open();
      fill(*tier, 1, 5, 3000);
    }
    std::string index = test::read_file(index_path());
    ASSERT_EQ(index.size(), 24u + 5 * 40 + 8);
    if (std::string_view(damage) == "flip") index[24 + 2 * 40 + 3] ^= 1;
    if (std::string_view(damage) == "truncate") index.resize(index.size() - 40);
    if (std::string_view(damage) == "empty") index.clear();
    if (std::string_view(damage) == "other version") index[8] = 1;  // sizes rounded up
    test::write_file(index_path(), index);
    auto tier = open();
    EXPECT_FALSE(tier->stats().index_loaded);
    EXPECT_EQ(tier->stats().entries, 5u);
    EXPECT_FALSE(std::filesystem::exists(index_path()));
    for (uint64_t i = 1; i <= 5; ++i) {
      EXPECT_EQ(bytes_of(tier->get(key(i), 3000)), test::pattern_bytes(3000, i)) << i;
    }
  }
}

TEST_F(DiskTierTest, TheSavedIndexKeepsTheEvictionOrder) {
  {
    auto tier = open();
    fill(*tier, 1, 4, 4000);
    ASSERT_NE(tier->get(key(1), 4000), nullptr);  // written first, but used last
  }
  // Listing the files would take the oldest written (1) for the least recently used.
  auto tier = open(3 * 4096);
  ASSERT_TRUE(tier->stats().index_loaded);
  EXPECT_NE(tier->get(key(1), 4000), nullptr);
  EXPECT_EQ(tier->get(key(2), 4000), nullptr);
  EXPECT_NE(tier->get(key(3), 4000), nullptr);
  EXPECT_NE(tier->get(key(4), 4000), nullptr);
}

TEST_F(DiskTierTest, AKilledDaemonLeavesNoIndexThatMissesItsWrites) {
  {
    auto tier = open();
    fill(*tier, 1, 3, 3000);
  }
  ASSERT_TRUE(std::filesystem::exists(index_path()));
  // A daemon that opens the tier (taking the saved index), writes more and is killed: no
  // destructor runs, as with SIGKILL.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto tier = open();
    for (uint64_t i = 4; i <= 6; ++i) tier->put(key(i), object(3000, static_cast<unsigned>(i)));
    tier->flush();
    ::_exit(tier->stats().index_loaded && tier->stats().writes == 3 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  auto tier = open();
  EXPECT_FALSE(tier->stats().index_loaded);
  EXPECT_EQ(tier->stats().entries, 6u);
  for (uint64_t i = 1; i <= 6; ++i) {
    EXPECT_EQ(bytes_of(tier->get(key(i), 3000)), test::pattern_bytes(3000, i)) << i;
  }
}

TEST_F(DiskTierTest, AClosedTierFinishesItsQueuedWrites) {
  {
    auto tier = open();
    for (uint64_t i = 1; i <= 20; ++i) ASSERT_TRUE(tier->put(key(i), object(2000, i)));
  }
  auto tier = open();
  EXPECT_EQ(tier->stats().entries, 20u);
}

TEST_F(DiskTierTest, AFlippedByteIsNotFoundAndCounted) {
  auto tier = open();
  fill(*tier, 1, 2, 3000);
  const std::filesystem::path path = tier->path_of(key(1), 3000);
  std::string content = test::read_file(path);
  content[content.size() - 100] ^= 0x01;  // in the payload
  test::write_file(path, content);
  EXPECT_EQ(tier->get(key(1), 3000), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  EXPECT_FALSE(std::filesystem::exists(path));  // dropped
  EXPECT_EQ(tier->get(key(1), 3000), nullptr);  // now simply missing, counted once
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  EXPECT_EQ(bytes_of(tier->get(key(2), 3000)), test::pattern_bytes(3000, 2));  // others stay
  // Written again, it is served again.
  fill(*tier, 1, 1, 3000);
  EXPECT_EQ(bytes_of(tier->get(key(1), 3000)), test::pattern_bytes(3000, 1));
}

TEST_F(DiskTierTest, AFlippedHeaderByteIsNotFoundAndCounted) {
  auto tier = open();
  fill(*tier, 1, 1, 3000);
  const std::filesystem::path path = tier->path_of(key(1), 3000);
  std::string content = test::read_file(path);
  content[40] ^= 0x01;  // the object id field
  test::write_file(path, content);
  EXPECT_EQ(tier->get(key(1), 3000), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
}

TEST_F(DiskTierTest, ATruncatedFileIsNotFoundAndCounted) {
  auto tier = open();
  fill(*tier, 1, 1, 3000);
  std::filesystem::resize_file(tier->path_of(key(1), 3000), 2000);
  EXPECT_EQ(tier->get(key(1), 3000), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
  EXPECT_EQ(tier->stats().entries, 0u);
  EXPECT_EQ(tier->stats().bytes_used, 0u);
}

TEST_F(DiskTierTest, AnotherObjectsFileUnderThisNameIsNotServed) {
  auto tier = open();
  fill(*tier, 1, 2, 3000);
  std::filesystem::copy_file(tier->path_of(key(2), 3000), tier->path_of(key(1), 3000),
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(tier->get(key(1), 3000), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 1u);
}

TEST_F(DiskTierTest, AnObjectOfAnotherLengthIsNotServed) {
  auto tier = open();
  fill(*tier, 1, 1, 3000);
  // Another length is another file name: not found, and the file of the right length stays.
  EXPECT_EQ(tier->get(key(1), 2999), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 0u);
  EXPECT_EQ(bytes_of(tier->get(key(1), 3000)), test::pattern_bytes(3000, 1));
}

TEST_F(DiskTierTest, ADeletedFileOrDirectoryIsNotFoundAndCounted) {
  auto tier = open();
  fill(*tier, 1, 3, 3000);
  std::filesystem::remove(tier->path_of(key(1), 3000));
  EXPECT_EQ(tier->get(key(1), 3000), nullptr);
  EXPECT_EQ(tier->stats().read_errors, 1u);
  std::filesystem::remove_all(dir_.path() / "tier" / "objects");
  EXPECT_EQ(tier->get(key(2), 3000), nullptr);
  EXPECT_EQ(tier->get(key(3), 3000), nullptr);
  EXPECT_EQ(tier->stats().read_errors, 3u);
  EXPECT_EQ(tier->stats().entries, 0u);
  // Writes go on (the subdirectory is made again).
  fill(*tier, 4, 1, 3000);
  EXPECT_EQ(bytes_of(tier->get(key(4), 3000)), test::pattern_bytes(3000, 4));
}

// A FIFO put in a file's place: the tier's open waited for a writer forever, and with it the
// reader and the daemon's exit (found by an audit: every stage thread stuck, umount failed).
TEST_F(DiskTierTest, AFifoOrALinkInAFilesPlaceIsDroppedWithoutWaiting) {
  auto tier = open();
  fill(*tier, 1, 2, 3000);
  const std::filesystem::path fifo = tier->path_of(key(1), 3000);
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto got = std::async(std::launch::async, [&] { return tier->get(key(1), 3000); });
  if (got.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "the read of a FIFO in the tier waits for a writer";
    const int writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);  // lets it go
    if (writer >= 0) ::close(writer);
  }
  EXPECT_EQ(got.get(), nullptr);
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(fifo)));  // removed
  // A link to the object's own file elsewhere is not followed either.
  const std::filesystem::path file = tier->path_of(key(2), 3000);
  const std::filesystem::path elsewhere = dir_.path() / "elsewhere";
  std::filesystem::rename(file, elsewhere);
  std::filesystem::create_symlink(elsewhere, file);
  EXPECT_EQ(tier->get(key(2), 3000), nullptr);
  EXPECT_EQ(tier->stats().read_errors, 2u);
  EXPECT_EQ(tier->stats().entries, 0u);
  fill(*tier, 1, 1, 3000);  // written again
  EXPECT_EQ(bytes_of(tier->get(key(1), 3000)), test::pattern_bytes(3000, 1));
}

// Out of file descriptors (a loader opening thousands of files under a low `ulimit -n`): a file
// that cannot be opened now is a miss, and is kept. Before, every such read dropped a good file
// (an audit's 1,000-file tier kept 39) and logged a line each.
TEST_F(DiskTierTest, AFileThatCannotBeOpenedForWantOfDescriptorsIsKept) {
  auto tier = open();
  fill(*tier, 1, 2, 3000);
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &old_limit), 0);
  const int lowest_free = ::dup(0);
  ASSERT_GE(lowest_free, 0);
  ::close(lowest_free);
  rlimit none_left = old_limit;
  none_left.rlim_cur = static_cast<rlim_t>(lowest_free);  // the next open fails with EMFILE
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &none_left), 0);
  const ObjectBuffer while_short = tier->get(key(1), 3000);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &old_limit), 0);
  EXPECT_EQ(while_short, nullptr);
  EXPECT_EQ(tier->stats().read_errors, 1u);
  EXPECT_EQ(tier->stats().entries, 2u);
  EXPECT_EQ(bytes_of(tier->get(key(1), 3000)), test::pattern_bytes(3000, 1));
}

TEST_F(DiskTierTest, AFailedWriteLeavesNothingAndIsCounted) {
  auto tier = open();
  // The writer's files may not grow past 8 KiB: a write of a larger object fails (EFBIG), as
  // ENOSPC or EIO would.
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction previous {};
  ASSERT_EQ(sigaction(SIGXFSZ, &ignore, &previous), 0);
  rlimit old_limit{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  rlimit small = old_limit;
  small.rlim_cur = 8192;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  ASSERT_TRUE(tier->put(key(1), object(100000, 1)));
  tier->flush();
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old_limit), 0);
  ASSERT_EQ(sigaction(SIGXFSZ, &previous, nullptr), 0);
  EXPECT_EQ(tier->stats().write_errors, 1u);
  EXPECT_EQ(tier->stats().bytes_used, 0u);
  EXPECT_EQ(tier->get(key(1), 100000), nullptr);
  EXPECT_TRUE(test::list_dir(tier->path_of(key(1), 100000).parent_path()).empty());  // no temp left
  // Later writes succeed.
  fill(*tier, 1, 1, 100000);
  EXPECT_EQ(bytes_of(tier->get(key(1), 100000)), test::pattern_bytes(100000, 1));
}

uint64_t files_bytes(const std::filesystem::path& dir) {
  uint64_t total = 0;
  for (const auto& file : std::filesystem::recursive_directory_iterator(dir)) {
    if (file.is_regular_file() && file.path().filename() != "lock") {
      total += (file.file_size() + 4095) / 4096 * 4096;
    }
  }
  return total;
}

TEST_F(DiskTierTest, BytesOnDiskStayWithinTheBound) {
  constexpr uint64_t kCapacity = 16 * 4096;
  auto tier = open(kCapacity);
  fill(*tier, 1, 40, 4000);  // one block each
  const DiskTierStats stats = tier->stats();
  EXPECT_LE(stats.bytes_used, kCapacity);
  EXPECT_EQ(stats.entries, 16u);
  EXPECT_EQ(stats.evictions, 24u);
  EXPECT_LE(files_bytes(dir_.path() / "tier"), kCapacity);
  // The most recent are kept.
  for (uint64_t i = 25; i <= 40; ++i) EXPECT_NE(tier->get(key(i), 4000), nullptr) << i;
  EXPECT_EQ(tier->get(key(1), 4000), nullptr);
  // Larger than the whole tier: not written.
  EXPECT_FALSE(tier->put(key(100), object(kCapacity, 100)));
  EXPECT_EQ(tier->stats().too_large, 1u);
}

TEST_F(DiskTierTest, ManyWritersAtOnceStayWithinTheBound) {
  // Eight writers, each making room for its own file: without counting the files the others are
  // writing, all eight fit "alone" and together overshoot.
  constexpr uint64_t kCapacity = 8 * 4096;
  auto tier = std::make_unique<DiskTier>(DiskTierOptions{
      .dir = dir_.path() / "tier", .capacity_bytes = kCapacity, .writer_threads = 8});
  tier->start();
  for (int round = 0; round < 20; ++round) {
    for (uint64_t i = 1; i <= 16; ++i) {
      const uint64_t id = static_cast<uint64_t>(round) * 16 + i;
      tier->put(key(id), object(12000, static_cast<unsigned>(id)));  // 3 blocks: 2 fit
    }
    tier->flush();
    ASSERT_LE(tier->stats().bytes_used, kCapacity) << round;
    ASSERT_LE(files_bytes(dir_.path() / "tier"), kCapacity) << round;
  }
  EXPECT_GT(tier->stats().writes, 0u);
}

// --prefetch off: no epochs are told apart, and the least recently used goes.
TEST_F(DiskTierTest, WithoutEpochsTheLeastRecentlyUsedGoesFirst) {
  auto tier = open(4 * 4096);
  fill(*tier, 1, 4, 4000);
  EXPECT_NE(tier->get(key(1), 4000), nullptr);  // 1 is now the one read last
  fill(*tier, 5, 1, 4000);
  EXPECT_NE(tier->get(key(1), 4000), nullptr);
  EXPECT_EQ(tier->get(key(2), 4000), nullptr);
}

// One epoch of `order` as the engine meets it: each object read from the tier, or else fetched
// and written to it. Returns the tier's hits.
uint64_t read_epoch(DiskTier& tier, const std::vector<uint64_t>& order) {
  const uint64_t hits_before = tier.stats().hits;
  for (const uint64_t i : order) {
    if (tier.get(key(i), 4000) == nullptr) {
      tier.put(key(i), object(4000, static_cast<unsigned>(i)));
      tier.flush();
    }
  }
  tier.new_epoch();
  return tier.stats().hits - hits_before;
}

// A tier smaller than the data, read in the same order every epoch: least-recently-used eviction
// evicts each file just before its next read (no hits at all); keeping the files read in the last
// epoch serves the tier's share of every epoch from disk.
TEST_F(DiskTierTest, EpochsInOneOrderFindTheTiersShareOnDisk) {
  auto tier = open_following_epochs(4 * 4096);
  std::vector<uint64_t> order(10);
  std::iota(order.begin(), order.end(), 1);
  EXPECT_EQ(read_epoch(*tier, order), 0u);
  for (int epoch = 1; epoch <= 3; ++epoch) EXPECT_EQ(read_epoch(*tier, order), 4u) << epoch;
  const DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.writes, 4u);  // the first epoch's first four, kept since
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_EQ(stats.writes_declined, 6u + 3 * 6u);
  EXPECT_LE(stats.bytes_used, 4u * 4096);
}

TEST_F(DiskTierTest, ShuffledEpochsFindTheTiersShareOnDisk) {
  auto tier = open_following_epochs(4 * 4096);
  std::vector<uint64_t> order(10);
  std::iota(order.begin(), order.end(), 1);
  std::mt19937 random(7);
  std::shuffle(order.begin(), order.end(), random);
  read_epoch(*tier, order);
  for (int epoch = 1; epoch <= 3; ++epoch) {
    std::shuffle(order.begin(), order.end(), random);
    EXPECT_EQ(read_epoch(*tier, order), 4u) << epoch;
  }
}

// A file neither read nor written for a whole epoch (another dataset's, a guess never read) makes
// room for new ones; files of this epoch and the last are kept, and a write that needs one of
// them gone is declined.
TEST_F(DiskTierTest, FilesNotReadForAWholeEpochMakeRoom) {
  auto tier = open_following_epochs(4 * 4096);
  fill(*tier, 1, 4, 4000);
  EXPECT_FALSE(tier->put(key(5), object(4000, 5)));  // all four written this epoch
  tier->new_epoch();
  EXPECT_NE(tier->get(key(1), 4000), nullptr);
  EXPECT_NE(tier->get(key(2), 4000), nullptr);
  EXPECT_FALSE(tier->put(key(5), object(4000, 5)));  // 3 and 4 are of the last epoch
  tier->new_epoch();                                 // 3 and 4 were not read in it
  fill(*tier, 5, 2, 4000);
  EXPECT_EQ(tier->get(key(3), 4000), nullptr);
  EXPECT_EQ(tier->get(key(4), 4000), nullptr);
  EXPECT_FALSE(tier->put(key(7), object(4000, 7)));
  for (uint64_t i : {1, 2, 5, 6}) EXPECT_NE(tier->get(key(i), 4000), nullptr) << i;
  EXPECT_EQ(tier->stats().evictions, 2u);
  EXPECT_EQ(tier->stats().writes_declined, 3u);
  // An older generation goes first, whenever it was read.
  fill(*tier, 1, 1, 4000, /*generation=*/2);
  EXPECT_EQ(tier->get(key(1, 1), 4000), nullptr);
  EXPECT_NE(tier->get(key(1, 2), 4000), nullptr);
}

TEST_F(DiskTierTest, OlderGenerationsGoFirst) {
  auto tier = open(4 * 4096);
  fill(*tier, 1, 2, 4000, /*generation=*/1);
  fill(*tier, 1, 2, 4000, /*generation=*/2);
  // Generation 1 read last, yet it goes first once generation 2 needs room.
  EXPECT_NE(tier->get(key(1, 1), 4000), nullptr);
  EXPECT_NE(tier->get(key(2, 1), 4000), nullptr);
  fill(*tier, 3, 2, 4000, /*generation=*/2);
  for (uint64_t i = 1; i <= 3; ++i) EXPECT_NE(tier->get(key(i, 2), 4000), nullptr) << i;
  EXPECT_EQ(tier->get(key(1, 1), 4000), nullptr);
  EXPECT_EQ(tier->get(key(2, 1), 4000), nullptr);
}

// A full tier writes each object into the file it evicts (the same inode), rather than deleting
// one file and creating another; what it writes there is the new object whole, whether the file
// was larger or smaller. The evicted file is held open so that its inode number cannot come back
// by chance through a delete and a create.
TEST_F(DiskTierTest, AFullTierWritesIntoTheFileItEvicts) {
  constexpr uint64_t kCapacity = 12 * 4096;
  auto tier = open(kCapacity);
  fill(*tier, 1, 4, 10000);  // three blocks each, with the header: full
  const int held = ::open(tier->path_of(key(1), 10000).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0) << std::strerror(errno);
  struct stat evicted {};
  ASSERT_EQ(::fstat(held, &evicted), 0);
  fill(*tier, 5, 1, 9000);  // smaller, evicting 1 (read this epoch first, the oldest)
  struct stat written {};
  ASSERT_EQ(::stat(tier->path_of(key(5), 9000).c_str(), &written), 0) << std::strerror(errno);
  EXPECT_EQ(written.st_ino, evicted.st_ino);
  ::close(held);
  fill(*tier, 6, 1, 11500);  // larger, evicting 2
  fill(*tier, 7, 1, 3000);   // one block, evicting 3
  // A read finds any byte more or less than the object's file should hold.
  EXPECT_EQ(bytes_of(tier->get(key(5), 9000)), test::pattern_bytes(9000, 5));
  EXPECT_EQ(bytes_of(tier->get(key(6), 11500)), test::pattern_bytes(11500, 6));
  EXPECT_EQ(bytes_of(tier->get(key(7), 3000)), test::pattern_bytes(3000, 7));
  EXPECT_EQ(bytes_of(tier->get(key(4), 10000)), test::pattern_bytes(10000, 4));
  for (uint64_t i = 1; i <= 3; ++i) EXPECT_EQ(tier->get(key(i), 10000), nullptr) << i;
  const DiskTierStats stats = tier->stats();
  EXPECT_EQ(stats.evictions, 3u);
  EXPECT_EQ(stats.files_reused, 3u);
  EXPECT_EQ(stats.checksum_failures, 0u);
  EXPECT_EQ(stats.read_errors, 0u);
  EXPECT_EQ(stats.entries, 4u);
  EXPECT_LE(files_bytes(dir_.path() / "tier"), kCapacity);
  size_t temp_files = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir_.path() / "tier")) {
    temp_files += entry.path().string().ends_with(".tmp") ? 1 : 0;
  }
  EXPECT_EQ(temp_files, 0u);
}

TEST_F(DiskTierTest, AReopenWithASmallerSizeEvictsDownToIt) {
  {
    auto tier = open();
    fill(*tier, 1, 10, 4000);
  }
  auto tier = open(4 * 4096);
  EXPECT_EQ(tier->stats().entries, 4u);
  EXPECT_LE(files_bytes(dir_.path() / "tier"), 4 * 4096u);
}

TEST_F(DiskTierTest, AFullQueueDefersWritesAndWritesThoseStillInMemory) {
  // Not started: nothing leaves the queue.
  auto tier = open(64 * kMiB, /*queue=*/10000, /*start=*/false);
  EXPECT_TRUE(tier->put(key(1), object(4000, 1)));
  EXPECT_TRUE(tier->put(key(2), object(4000, 2)));
  // The queue is full: 3 and 4 are remembered, not held. Object 3 stays in memory (as the RAM
  // cache would keep it); object 4's last reference goes at once.
  const ObjectBuffer kept = object(4000, 3);
  EXPECT_TRUE(tier->put(key(3), kept));
  EXPECT_TRUE(tier->put(key(4), object(4000, 4)));
  EXPECT_EQ(tier->stats().writes_deferred, 2u);
  EXPECT_EQ(tier->stats().writes_dropped, 0u);
  EXPECT_EQ(tier->stats().queued_bytes, 8000u);
  tier->start();
  tier->flush();
  EXPECT_EQ(tier->stats().writes, 3u);
  EXPECT_EQ(tier->stats().writes_dropped, 1u);
  EXPECT_EQ(tier->stats().queued_bytes, 0u);
  EXPECT_EQ(bytes_of(tier->get(key(3), 4000)), bytes_of(kept));
  EXPECT_EQ(tier->get(key(4), 4000), nullptr);
  EXPECT_TRUE(tier->put(key(4), object(4000, 4)));  // room again
  tier->flush();
  EXPECT_EQ(tier->stats().writes, 4u);
}

TEST_F(DiskTierTest, DeferredObjectsAreWrittenOldestFirstAndMarkedUntilThen) {
  // One writer, a queue of one object, a tier of two files: the tier keeps the two written
  // last, which tells the order the writer took the deferred objects in.
  auto tier = std::make_unique<DiskTier>(DiskTierOptions{.dir = dir_.path() / "tier",
                                                         .capacity_bytes = 2 * 4096,
                                                         .queue_bytes = 4000,
                                                         .writer_threads = 1});
  std::vector<ObjectBuffer> held;
  for (uint64_t i = 1; i <= 4; ++i) {
    held.push_back(object(4000, static_cast<unsigned>(i)));
    ASSERT_TRUE(tier->put(key(i), held.back()));
  }
  // 1 queued (held by the queue, not marked); 2..4 deferred, marked for the memory cache.
  EXPECT_EQ(tier->stats().writes_deferred, 3u);
  EXPECT_FALSE(held[0]->awaiting_disk());
  for (size_t i = 1; i < 4; ++i) EXPECT_TRUE(held[i]->awaiting_disk()) << i + 1;
  tier->start();
  tier->flush();
  EXPECT_EQ(tier->stats().writes, 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_FALSE(held[i]->awaiting_disk()) << i + 1;
  // Oldest first: 1, 2, 3, 4 written in turn, so 3 and 4 are left (newest first would have
  // left 3 and 2).
  EXPECT_EQ(tier->get(key(1), 4000), nullptr);
  EXPECT_EQ(tier->get(key(2), 4000), nullptr);
  EXPECT_NE(tier->get(key(3), 4000), nullptr);
  EXPECT_NE(tier->get(key(4), 4000), nullptr);
}

TEST_F(DiskTierTest, ADeferredObjectForgottenPastTheLimitIsNoLongerMarked) {
  auto tier = std::make_unique<DiskTier>(DiskTierOptions{.dir = dir_.path() / "tier",
                                                         .capacity_bytes = 64 * kMiB,
                                                         .queue_bytes = 4000,
                                                         .deferred_limit = 1});
  const ObjectBuffer queued = object(4000, 1);
  const ObjectBuffer forgotten = object(4000, 2);
  const ObjectBuffer deferred = object(4000, 3);
  ASSERT_TRUE(tier->put(key(1), queued));
  ASSERT_TRUE(tier->put(key(2), forgotten));
  ASSERT_TRUE(tier->put(key(3), deferred));  // past the limit: 2 is forgotten
  EXPECT_FALSE(forgotten->awaiting_disk());
  EXPECT_TRUE(deferred->awaiting_disk());
  EXPECT_EQ(tier->stats().writes_dropped, 1u);
}

TEST_F(DiskTierTest, DeferredWritesPastTheLimitForgetTheOldest) {
  auto tier = std::make_unique<DiskTier>(DiskTierOptions{.dir = dir_.path() / "tier",
                                                         .capacity_bytes = 64 * kMiB,
                                                         .queue_bytes = 4000,
                                                         .deferred_limit = 2});
  std::vector<ObjectBuffer> held;
  for (uint64_t i = 1; i <= 5; ++i) {
    held.push_back(object(4000, static_cast<unsigned>(i)));
    EXPECT_TRUE(tier->put(key(i), held.back()));
  }
  // 1 queued; 2..5 deferred, of which 2 and 3 were forgotten.
  EXPECT_EQ(tier->stats().writes_deferred, 4u);
  EXPECT_EQ(tier->stats().writes_dropped, 2u);
  tier->start();
  tier->flush();
  EXPECT_EQ(tier->stats().writes, 3u);
  for (const uint64_t i : {1, 4, 5}) EXPECT_NE(tier->get(key(i), 4000), nullptr) << i;
  for (const uint64_t i : {2, 3}) EXPECT_EQ(tier->get(key(i), 4000), nullptr) << i;
}

TEST_F(DiskTierTest, AnObjectDeferredTwiceIsWrittenOnce) {
  auto tier = open(64 * kMiB, /*queue=*/8000, /*start=*/false);
  const ObjectBuffer first = object(5000, 1);
  const ObjectBuffer second = object(4000, 2);
  EXPECT_TRUE(tier->put(key(1), first));
  EXPECT_TRUE(tier->put(key(2), second));  // deferred
  EXPECT_TRUE(tier->put(key(2), second));  // fetched again meanwhile: deferred again
  tier->start();
  tier->flush();
  EXPECT_FALSE(tier->put(key(2), second));  // on disk already
  EXPECT_EQ(tier->stats().writes, 2u);
  EXPECT_EQ(tier->stats().writes_dropped, 0u);
  EXPECT_EQ(tier->stats().entries, 2u);
  EXPECT_EQ(tier->stats().bytes_used, 8192u + 4096u);
  EXPECT_EQ(bytes_of(tier->get(key(2), 4000)), bytes_of(second));
}

TEST_F(DiskTierTest, ASecondOpenOfTheSameDirectoryIsRefused) {
  auto first = open();
  try {
    open();
    FAIL() << "a second tier opened the same directory";
  } catch (const DiskTierLocked& e) {
    EXPECT_NE(std::string(e.what()).find("in use by another dsfs mount"), std::string::npos)
        << e.what();
  }
  first.reset();
  EXPECT_NO_THROW(open());
}

// A directory of the user's own given by mistake lost its files named index and lock (the tier
// replaced them; found by an audit), and a mistyped path made a new tier with its parents.
TEST_F(DiskTierTest, ADirectoryThatIsNotADiskCacheIsRefusedAndLeftAsItWas) {
  const std::filesystem::path dir = dir_.path() / "tier";
  std::filesystem::create_directories(dir);
  test::write_file(dir / "index", "my dataset index");
  test::write_file(dir / "lock", "my lock");
  EXPECT_THAT([&] { open(); }, testing::ThrowsMessage<std::runtime_error>(
                                   testing::HasSubstr("not a dsfs disk cache")));
  EXPECT_EQ(test::read_file(dir / "index"), "my dataset index");
  EXPECT_EQ(test::read_file(dir / "lock"), "my lock");
  std::filesystem::remove(dir / "index");
  std::filesystem::remove(dir / "lock");
  test::write_file(dir / "train.txt", "mine");
  EXPECT_THAT([&] { open(); }, testing::ThrowsMessage<std::runtime_error>(
                                   testing::HasSubstr("holds 'train.txt' and no objects/")));
  EXPECT_FALSE(std::filesystem::exists(dir / "lock"));
  const std::filesystem::path typo = dir_.path() / "no-such-parent" / "tier";
  EXPECT_THAT([&] { DiskTier tier(DiskTierOptions{.dir = typo, .capacity_bytes = kMiB}); },
              testing::ThrowsMessage<std::runtime_error>(testing::HasSubstr("does not exist")));
  EXPECT_FALSE(std::filesystem::exists(typo.parent_path()));
  // A tier's own directory (its lock, its index, its objects) opens as before.
  std::filesystem::remove(dir / "train.txt");
  open().reset();
  EXPECT_NO_THROW(open());
}

TEST_F(DiskTierTest, TempFilesOfAKilledWriterAreRemovedNotServed) {
  std::filesystem::path temp;
  {
    auto tier = open();
    fill(*tier, 1, 1, 3000);
    temp = tier->path_of(key(2), 3000).string() + ".tmp";
    // What a writer killed before its rename leaves: here even a whole, valid file.
    std::filesystem::create_directories(temp.parent_path());
    std::filesystem::copy_file(tier->path_of(key(1), 3000), temp);
  }
  // Killed: its clean close's index is not there.
  std::filesystem::remove(index_path());
  auto tier = open();
  EXPECT_FALSE(std::filesystem::exists(temp));
  EXPECT_EQ(tier->stats().stale_temp_files, 1u);
  EXPECT_EQ(tier->stats().entries, 1u);
  EXPECT_EQ(tier->get(key(2), 3000), nullptr);
  EXPECT_NE(tier->get(key(1), 3000), nullptr);
}

TEST_F(DiskTierTest, FilesOfAnOlderDsfsAreRenamedAndServed) {
  std::filesystem::path named;
  std::filesystem::path sizeless;
  {
    auto tier = open();
    fill(*tier, 1, 2, 3000);
    // The name an older dsfs gave object 2's file: the same, less the size at its end.
    named = tier->path_of(key(2), 3000);
    sizeless = named.string().substr(0, named.string().rfind('-'));
    std::filesystem::rename(named, sizeless);
  }
  std::filesystem::remove(index_path());  // an older dsfs's index is of another version
  auto tier = open();
  EXPECT_FALSE(std::filesystem::exists(sizeless));
  EXPECT_TRUE(std::filesystem::exists(named));
  EXPECT_EQ(tier->stats().entries, 2u);
  EXPECT_EQ(tier->stats().bytes_used, 2 * 4096u);
  EXPECT_EQ(bytes_of(tier->get(key(2), 3000)), test::pattern_bytes(3000, 2));
  EXPECT_EQ(bytes_of(tier->get(key(1), 3000)), test::pattern_bytes(3000, 1));
}

// An object file's header, as the format fixes it: the fields the tests below read and rewrite.
struct FileHeaderLayout {
  static constexpr size_t kVersion = 8;         // u32
  static constexpr size_t kPayloadDigest = 24;  // u64, over the payload
  static constexpr size_t kHeaderDigest = 56;   // u64, over the 56 bytes before it and the name
  static constexpr size_t kBytes = 64;          // then the dataset name, then the payload
};

template <typename T>
T field(const std::string& file, size_t at) {
  T value;
  std::memcpy(&value, file.data() + at, sizeof value);
  return value;
}

template <typename T>
void set_field(std::string& file, size_t at, T value) {
  std::memcpy(file.data() + at, &value, sizeof value);
}

// Rewrites an object file as dsfs wrote it before version 2: version 1, XXH64 checksums.
void rewrite_as_version_1(const std::filesystem::path& path, std::string_view dataset) {
  using L = FileHeaderLayout;
  std::string file = test::read_file(path);
  set_field<uint32_t>(file, L::kVersion, 1);
  const size_t payload_at = L::kBytes + dataset.size();
  set_field<uint64_t>(file, L::kPayloadDigest,
                      XXH64(file.data() + payload_at, file.size() - payload_at, 0));
  const std::string covered = file.substr(0, L::kHeaderDigest) + std::string(dataset);
  set_field<uint64_t>(file, L::kHeaderDigest, XXH64(covered.data(), covered.size(), 0));
  test::write_file(path, file);
}

TEST_F(DiskTierTest, NewFilesCarryXxh3Checksums) {
  using L = FileHeaderLayout;
  auto tier = open();
  fill(*tier, 1, 1, 3000);
  const std::string file = test::read_file(tier->path_of(key(1), 3000));
  ASSERT_EQ(file.size(), L::kBytes + 4 + 3000);
  EXPECT_EQ(field<uint32_t>(file, L::kVersion), 3u);
  // Seeded with the ingest (0 here, the tests' keys: the same as unseeded).
  EXPECT_EQ(field<uint64_t>(file, L::kPayloadDigest),
            XXH3_64bits(file.data() + L::kBytes + 4, 3000));
  const std::string covered = file.substr(0, L::kHeaderDigest) + "imgs";
  EXPECT_EQ(field<uint64_t>(file, L::kHeaderDigest), XXH3_64bits(covered.data(), covered.size()));
}

TEST_F(DiskTierTest, FilesOfTheFirstFormatAreStillReadAndChecked) {
  using L = FileHeaderLayout;
  auto tier = open();
  fill(*tier, 1, 3, 3000);
  for (uint64_t i = 1; i <= 2; ++i) rewrite_as_version_1(tier->path_of(key(i), 3000), "imgs");
  // Object 2: a flipped payload byte under version 1's checksum.
  std::string damaged = test::read_file(tier->path_of(key(2), 3000));
  damaged[damaged.size() - 100] ^= 0x01;
  test::write_file(tier->path_of(key(2), 3000), damaged);
  // Object 3: marked version 1 but still carrying XXH3 checksums: the version picks the hash.
  std::string relabelled = test::read_file(tier->path_of(key(3), 3000));
  set_field<uint32_t>(relabelled, L::kVersion, 1);
  test::write_file(tier->path_of(key(3), 3000), relabelled);

  EXPECT_EQ(bytes_of(tier->get(key(1), 3000)), test::pattern_bytes(3000, 1));
  EXPECT_EQ(tier->get(key(2), 3000), nullptr);
  EXPECT_EQ(tier->get(key(3), 3000), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 2u);
  // After a reopen (the index saved and loaded), the version 1 file is still served, and
  // `dsfs cache show` reads the dataset's name from its header.
  tier.reset();
  tier = open();
  EXPECT_EQ(bytes_of(tier->get(key(1), 3000)), test::pattern_bytes(3000, 1));
  const DiskTierContents contents = inspect_disk_tier(dir_.path() / "tier");
  ASSERT_EQ(contents.generations.size(), 1u);
  EXPECT_EQ(contents.generations[0].dataset, "imgs");
  // It does not say which ingest wrote it: a mount that checks (every mount) drops it.
  DiskTierKey checked = key(1);
  checked.ingest = 42;
  EXPECT_EQ(tier->get(checked, 3000), nullptr);
  EXPECT_EQ(tier->stats().stale_drops, 1u);
}

TEST_F(DiskTierTest, WriterThreadsCarryTheirNames) {
  // What `top -H` and bench/first_epoch.py's CPU per thread name see.
  const auto names = [] {
    std::vector<std::string> found;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::string name = test::read_file(task.path() / "comm");
      if (!name.empty() && name.back() == '\n') name.pop_back();
      found.push_back(name);
    }
    return found;
  };
  auto tier = open(64 * kMiB, 64 * kMiB, /*start=*/false);
  EXPECT_EQ(std::ranges::count(names(), "disk-write-0"), 0);
  tier->start();
  // Each writer names itself as it starts, in no set order: wait for all, with a deadline.
  const std::vector<std::string> expected = {"disk-write-0", "disk-write-1", "disk-write-2",
                                             "disk-write-3"};
  const auto all_named = [&] {
    const std::vector<std::string> now = names();
    return std::ranges::all_of(
        expected, [&](const auto& name) { return std::ranges::count(now, name) == 1; });
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!all_named() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  const std::vector<std::string> now = names();
  for (const std::string& name : expected) {
    EXPECT_EQ(std::ranges::count(now, name), 1) << name;
  }
}

TEST_F(DiskTierTest, ForeignFilesAreLeftAlone) {
  std::filesystem::create_directories(dir_.path() / "tier" / "objects" / "00");
  test::write_file(dir_.path() / "tier" / "objects" / "00" / "notes.txt", "mine");
  auto tier = open();
  EXPECT_EQ(tier->stats().entries, 0u);
  EXPECT_TRUE(std::filesystem::exists(dir_.path() / "tier" / "objects" / "00" / "notes.txt"));
}

TEST_F(DiskTierTest, AReadFromDiskLeavesNothingInThePageCache) {
  if (const std::string why = direct_reads_bypass_the_page_cache(dir_.path()); !why.empty()) {
    GTEST_SKIP() << why;
  }
  auto tier = open();
  ASSERT_TRUE(tier->stats().direct_io);
  constexpr size_t kSize = 300'000;  // 74 pages
  fill(*tier, 1, 1, kSize);
  const std::filesystem::path path = tier->path_of(key(1), kSize);
  evict_from_page_cache(path);
  ASSERT_EQ(cached_pages(path), 0u);
  EXPECT_EQ(bytes_of(tier->get(key(1), kSize)), test::pattern_bytes(kSize, 1));
  // A read through the page cache leaves every page of the file there (and readahead more).
  EXPECT_EQ(cached_pages(path), 0u) << "the tier's file is in the page cache beside the object";
  EXPECT_EQ(tier->stats().direct_reads, 1u);
  EXPECT_EQ(tier->stats().page_cache_reads, 0u);
}

TEST_F(DiskTierTest, AFileThePageCacheHoldsIsReadFromIt) {
  for (const std::string& why : {cachestat_sees_the_page_cache(dir_.path()),
                                 direct_reads_bypass_the_page_cache(dir_.path())}) {
    if (!why.empty()) GTEST_SKIP() << why;
  }
  auto tier = open();
  constexpr size_t kSize = 100'000;
  fill(*tier, 1, 1, kSize);
  const std::filesystem::path path = tier->path_of(key(1), kSize);
  test::read_file(path);  // now wholly in the page cache
  const size_t pages = (std::filesystem::file_size(path) + 4095) / 4096;
  ASSERT_EQ(cached_pages(path), pages);
  EXPECT_EQ(bytes_of(tier->get(key(1), kSize)), test::pattern_bytes(kSize, 1));
  EXPECT_EQ(tier->stats().page_cache_reads, 1u);
  EXPECT_EQ(tier->stats().direct_reads, 0u);
  // Gone from the page cache, it is read from the disk.
  evict_from_page_cache(path);
  EXPECT_EQ(bytes_of(tier->get(key(1), kSize)), test::pattern_bytes(kSize, 1));
  EXPECT_EQ(tier->stats().direct_reads, 1u);
  EXPECT_EQ(tier->stats().page_cache_reads, 1u);
  EXPECT_EQ(tier->stats().hits, 2u);
}

TEST_F(DiskTierTest, WithDirectReadsOffEveryReadGoesThroughThePageCache) {
  auto tier = std::make_unique<DiskTier>(DiskTierOptions{
      .dir = dir_.path() / "tier", .capacity_bytes = 64 * kMiB, .direct_io = false});
  tier->start();
  EXPECT_FALSE(tier->stats().direct_io);
  fill(*tier, 1, 1, 100'000);
  evict_from_page_cache(tier->path_of(key(1), 100'000));
  EXPECT_EQ(bytes_of(tier->get(key(1), 100'000)), test::pattern_bytes(100'000, 1));
  EXPECT_EQ(tier->stats().page_cache_reads, 1u);
  EXPECT_EQ(tier->stats().direct_reads, 0u);
}

// A filesystem (ramfs, tmpfs) mounted over a directory for the length of a test; unmounted
// (lazily) after.
class ScratchMount {
 public:
  ScratchMount(const std::filesystem::path& dir, const char* type, const char* options = nullptr)
      : dir_(dir) {
    std::filesystem::create_directories(dir_);
    if (::mount("dsfs-test", dir_.c_str(), type, 0, options) == 0) {
      mounted_ = true;
    } else {
      error_ = std::strerror(errno);
    }
  }
  ~ScratchMount() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  ScratchMount(const ScratchMount&) = delete;
  ScratchMount& operator=(const ScratchMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::filesystem::path dir_;
  bool mounted_ = false;
  std::string error_;
};

// A filesystem that filled up (other files took the room) holds the tier to what it had; once
// room comes back the tier grows to its capacity again (before, only a remount did).
TEST_F(DiskTierTest, ATierHeldBackByAFullFilesystemGrowsWhenRoomComesBack) {
  const std::filesystem::path small = dir_.path() / "small";
  const ScratchMount tmpfs(small, "tmpfs", "size=256k");
  if (!tmpfs.mounted()) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << tmpfs.error();
  constexpr uint64_t kCapacity = 200 * 1024;
  DiskTier tier(DiskTierOptions{.dir = small / "tier",
                                .capacity_bytes = kCapacity,
                                .room_check_interval = std::chrono::milliseconds(0)});
  tier.start();
  ASSERT_EQ(tier.stats().capacity_bytes, kCapacity);
  const std::string filler(160 * 1024, 'x');
  test::write_file(small / "filler", filler);
  fill(tier, 1, 40, 4000);  // one block each: about 24 fit beside the filler
  const DiskTierStats full = tier.stats();
  EXPECT_GT(full.write_errors, 0u);
  EXPECT_LT(full.capacity_bytes, 120 * 1024u);
  EXPECT_LE(full.bytes_used, full.capacity_bytes);
  std::filesystem::remove(small / "filler");
  fill(tier, 41, 40, 4000);
  const DiskTierStats again = tier.stats();
  EXPECT_EQ(again.capacity_bytes, kCapacity);
  EXPECT_GT(again.bytes_used, full.capacity_bytes);
  EXPECT_LE(again.bytes_used, kCapacity);
  EXPECT_EQ(again.write_errors, full.write_errors);
  EXPECT_EQ(bytes_of(tier.get(key(80), 4000)), test::pattern_bytes(4000, 80));
}

TEST_F(DiskTierTest, AFilesystemWithoutODirectIsReadThroughThePageCache) {
  // ramfs has no O_DIRECT on any kernel (tmpfs has had it since Linux 6.6).
  const ScratchMount ramfs(dir_.path() / "ramfs", "ramfs");
  if (!ramfs.mounted()) GTEST_SKIP() << "cannot mount a ramfs here (needs root): " << ramfs.error();
  const int probe =
      ::open((dir_.path() / "ramfs" / "p").c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (probe >= 0) {
    ::close(probe);
    GTEST_SKIP() << "this kernel's ramfs takes O_DIRECT: there is no fallback to show";
  }
  DiskTier tier(DiskTierOptions{.dir = dir_.path() / "ramfs" / "tier",
                                .capacity_bytes = 64 * kMiB,
                                .page_cache_first = false});
  tier.start();
  EXPECT_FALSE(tier.stats().direct_io);
  for (uint64_t i = 1; i <= 3; ++i) {
    ASSERT_TRUE(tier.put(key(i), object(70'000, static_cast<unsigned>(i))));
  }
  tier.flush();
  for (uint64_t i = 1; i <= 3; ++i) {
    EXPECT_EQ(bytes_of(tier.get(key(i), 70'000)), test::pattern_bytes(70'000, i));
  }
  EXPECT_EQ(tier.stats().page_cache_reads, 3u);
  EXPECT_EQ(tier.stats().direct_reads, 0u);
  EXPECT_EQ(tier.stats().checksum_failures + tier.stats().read_errors, 0u);
}

TEST_F(DiskTierTest, LargeObjectsComeBackWholeAndTheirDamageIsCaught) {
  page_cache_first_ = false;  // every read from the disk, directly where the filesystem allows
  auto tier = open();
  // Around the size from which an object keeps the block it was read into (64 KiB), around a
  // block's edge with the header, and large.
  const std::vector<size_t> sizes = {65'535, 65'536, 65'537, 4096 * 20 - 64 - 4, 1'048'593};
  for (size_t i = 0; i < sizes.size(); ++i) {
    fill(*tier, i + 1, 1, sizes[i]);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    evict_from_page_cache(tier->path_of(key(i + 1), sizes[i]));
    EXPECT_EQ(bytes_of(tier->get(key(i + 1), sizes[i])),
              test::pattern_bytes(sizes[i], static_cast<unsigned>(i + 1)))
        << sizes[i] << " bytes";
  }
  EXPECT_EQ(tier->stats().hits, sizes.size());
  EXPECT_EQ(tier->stats().direct_reads + tier->stats().page_cache_reads, sizes.size());
  EXPECT_EQ(tier->stats().direct_reads, tier->stats().direct_io ? sizes.size() : 0u);
  // A flipped byte in the last block, a truncated file, a byte appended: each dropped, counted.
  const std::filesystem::path flipped = tier->path_of(key(5), sizes[4]);
  std::string content = test::read_file(flipped);
  content[content.size() - 3] ^= 0x10;
  test::write_file(flipped, content);
  evict_from_page_cache(flipped);
  EXPECT_EQ(tier->get(key(5), sizes[4]), nullptr);
  std::filesystem::resize_file(tier->path_of(key(4), sizes[3]), 4096 * 19);
  evict_from_page_cache(tier->path_of(key(4), sizes[3]));
  EXPECT_EQ(tier->get(key(4), sizes[3]), nullptr);
  const std::filesystem::path longer = tier->path_of(key(3), sizes[2]);
  test::write_file(longer, test::read_file(longer) + "x");
  evict_from_page_cache(longer);
  EXPECT_EQ(tier->get(key(3), sizes[2]), nullptr);
  EXPECT_EQ(tier->stats().checksum_failures, 3u);
  EXPECT_EQ(tier->stats().entries, 2u);
  EXPECT_EQ(bytes_of(tier->get(key(1), sizes[0])), test::pattern_bytes(sizes[0], 1));
}

TEST_F(DiskTierTest, ConcurrentReadsWritesAndEvictionsNeverGiveWrongBytes) {
  // Room for a quarter of the objects: readers race the writer's evictions and each other's
  // drops, and must only ever see the right bytes or nothing.
  constexpr uint64_t kObjects = 64;
  auto tier = open(16 * 4096);
  std::vector<std::thread> threads;
  std::atomic<uint64_t> served{0};
  std::atomic<uint64_t> wrong{0};
  // The writer is a thread of its own: on a loaded machine it may not have written anything
  // within the 400 rounds, so they go on until some reads were served (or a deadline passes).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (unsigned t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (unsigned round = 0;
           round < 400 || (served.load() == 0 && std::chrono::steady_clock::now() < deadline);
           ++round) {
        const uint64_t i = 1 + (round * 7 + t * 13) % kObjects;
        if (const ObjectBuffer got = tier->get(key(i), 3000)) {
          served.fetch_add(1);
          if (got->bytes() != test::pattern_bytes(3000, static_cast<unsigned>(i))) {
            wrong.fetch_add(1);
          }
        } else {
          tier->put(key(i), object(3000, static_cast<unsigned>(i)));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  tier->flush();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(served.load(), 0u);
  const DiskTierStats stats = tier->stats();
  EXPECT_LE(stats.bytes_used, 16 * 4096u);
  EXPECT_EQ(stats.checksum_failures, 0u);
  EXPECT_LE(files_bytes(dir_.path() / "tier"), 16 * 4096u);
}

// ObjectFetcher with a tier: what the tier holds is not asked of Redis; what the tier drops is.
class FetcherWithDiskTier : public ::testing::Test {
 protected:
  static constexpr const char* kName = "dt";
  void SetUp() override {
    catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 4096);
    builder.add_file("a.bin", 3000, 0, 0644, 1, catalog::kNoLabel, 0, "");
    builder.add_file("big.bin", 10000, 0, 0644, 2, catalog::kNoLabel, 0, "");  // 3 chunks
    dataset_.info.name = kName;
    dataset_.info.generation = 1;
    dataset_.info.chunk_size = 4096;
    dataset_.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
    conn_.command({"SET", keys_.object(kName, 1, 1), test::pattern_bytes(3000, 1)})
        .expect_ok("SET");
    const std::string big = test::pattern_bytes(10000, 2);
    for (uint32_t chunk = 0; chunk < 3; ++chunk) {
      conn_
          .command(
              {"SET", keys_.object_piece(kName, 1, 2, chunk, true), big.substr(chunk * 4096, 4096)})
          .expect_ok("SET");
    }
    tier_.start();
  }
  std::string fetch(const char* name, std::vector<uint32_t> chunks) {
    const uint32_t entry = *dataset_.catalog->lookup(catalog::kRootIndex, name);
    std::string out;
    for (const ObjectBuffer& b : fetcher_.fetch_chunks(dataset_, entry, chunks)) {
      out += b->bytes();
    }
    return out;
  }

  test::TestRedisServer redis_;
  store::Connection conn_{redis_.endpoint()};
  store::Client client_{{redis_.endpoint()}, store::ClientOptions{.connections_per_node = 2}};
  test::TempDir dir_{"dsfs-disk-tier"};
  DiskTier tier_{DiskTierOptions{.dir = dir_.path() / "tier", .capacity_bytes = 64 * kMiB}};
  const catalog::KeySchema keys_{"dsfs"};
  ObjectFetcher fetcher_{client_, keys_, FetcherOptions{.disk_tier = &tier_}};
  DatasetSnapshot dataset_;
};

TEST_F(FetcherWithDiskTier, RedisIsAskedOnlyForWhatTheTierLacks) {
  EXPECT_EQ(fetch("a.bin", {0}), test::pattern_bytes(3000, 1));
  EXPECT_EQ(fetch("big.bin", {1}), test::pattern_bytes(10000, 2).substr(4096, 4096));
  EXPECT_EQ(fetcher_.stats().gets.load(), 2u);
  tier_.flush();
  EXPECT_EQ(tier_.stats().writes, 2u);
  // From disk now: no GET.
  EXPECT_EQ(fetch("a.bin", {0}), test::pattern_bytes(3000, 1));
  EXPECT_EQ(fetcher_.stats().gets.load(), 2u);
  // A mix: chunk 1 from disk, 0 and 2 from Redis, in the order asked.
  EXPECT_EQ(fetch("big.bin", {0, 1, 2}), test::pattern_bytes(10000, 2));
  EXPECT_EQ(fetcher_.stats().gets.load(), 4u);
  EXPECT_EQ(tier_.stats().hits, 2u);
}

TEST_F(FetcherWithDiskTier, ADamagedFileIsReadFromRedis) {
  EXPECT_EQ(fetch("a.bin", {0}), test::pattern_bytes(3000, 1));
  tier_.flush();
  const std::filesystem::path path =
      tier_.path_of(DiskTierKey{.dataset = kName, .generation = 1, .object_id = 1}, 3000);
  std::string content = test::read_file(path);
  content.back() ^= 0x80;
  test::write_file(path, content);
  EXPECT_EQ(fetch("a.bin", {0}), test::pattern_bytes(3000, 1));
  EXPECT_EQ(fetcher_.stats().gets.load(), 2u);
  EXPECT_EQ(tier_.stats().checksum_failures, 1u);
  tier_.flush();  // and written again, whole
  EXPECT_EQ(fetch("a.bin", {0}), test::pattern_bytes(3000, 1));
  EXPECT_EQ(fetcher_.stats().gets.load(), 2u);
}

TEST_F(FetcherWithDiskTier, ANewGenerationNeverGetsTheOldBytes) {
  EXPECT_EQ(fetch("a.bin", {0}), test::pattern_bytes(3000, 1));
  tier_.flush();
  conn_.command({"SET", keys_.object(kName, 2, 1), test::pattern_bytes(3000, 9)}).expect_ok("SET");
  dataset_.info.generation = 2;
  EXPECT_EQ(fetch("a.bin", {0}), test::pattern_bytes(3000, 9));
}

}  // namespace
}  // namespace dsfs::prefetch
