// The `dsfs bench` engine on real files in a temp dir: listing order, epoch orders, that every
// file is read exactly once per epoch, counts and bytes, errors, the JSON, the histogram.
#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <numeric>
#include <set>

#include "tests/unit/support/files.h"
#include "tools/dataset_bench.h"

namespace dsfs::tools {
namespace {

namespace fs = std::filesystem;
using test::pattern_bytes;
using test::TempDir;
using test::write_file;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> relative_paths(const std::vector<BenchFile>& files, const fs::path& root) {
  std::vector<std::string> out;
  for (const BenchFile& file : files) out.push_back(file.path.lexically_relative(root).string());
  return out;
}

bool is_permutation_of_indices(const std::vector<uint32_t>& order) {
  std::vector<uint32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] != i) return false;
  }
  return true;
}

// ---- Orders --------------------------------------------------------------------------------

TEST(BenchOrder, SequentialIsDirectoryOrderEveryEpoch) {
  for (uint64_t epoch : {0, 1, 7}) {
    const std::vector<uint32_t> order = epoch_order(BenchPattern::kSequential, 5, 42, epoch);
    EXPECT_THAT(order, ElementsAre(0, 1, 2, 3, 4));
  }
  EXPECT_TRUE(epoch_order(BenchPattern::kSequential, 0, 1, 0).empty());
}

TEST(BenchOrder, ShuffleIsOnePermutationReusedEveryEpoch) {
  const std::vector<uint32_t> first = epoch_order(BenchPattern::kShuffle, 1000, 9, 0);
  EXPECT_TRUE(is_permutation_of_indices(first));
  std::vector<uint32_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0u);
  EXPECT_NE(first, identity);
  EXPECT_EQ(epoch_order(BenchPattern::kShuffle, 1000, 9, 1), first);
  EXPECT_EQ(epoch_order(BenchPattern::kShuffle, 1000, 9, 5), first);
  // Same seed, same order; another seed, another order.
  EXPECT_EQ(epoch_order(BenchPattern::kShuffle, 1000, 9, 0), first);
  EXPECT_NE(epoch_order(BenchPattern::kShuffle, 1000, 10, 0), first);
}

TEST(BenchOrder, EpochsIsAFreshPermutationEachEpoch) {
  std::set<std::vector<uint32_t>> seen;
  for (uint64_t epoch = 0; epoch < 5; ++epoch) {
    const std::vector<uint32_t> order = epoch_order(BenchPattern::kEpochs, 1000, 3, epoch);
    EXPECT_TRUE(is_permutation_of_indices(order)) << "epoch " << epoch;
    EXPECT_TRUE(seen.insert(order).second) << "epoch " << epoch << " repeats an earlier order";
    // Epoch e uses seed + e, reproducibly.
    EXPECT_EQ(order, epoch_order(BenchPattern::kEpochs, 1000, 3, epoch));
    EXPECT_EQ(order, epoch_order(BenchPattern::kShuffle, 1000, 3 + epoch, 0));
  }
}

TEST(BenchOrder, PatternNames) {
  for (BenchPattern pattern :
       {BenchPattern::kSequential, BenchPattern::kShuffle, BenchPattern::kEpochs}) {
    EXPECT_EQ(parse_bench_pattern(bench_pattern_name(pattern)), pattern);
  }
  EXPECT_THROW(parse_bench_pattern("random"), std::invalid_argument);
}

// ---- Listing -------------------------------------------------------------------------------

TEST(BenchListing, SortsPathsBytewiseAsFindPipedToSort) {
  TempDir dir;
  const fs::path root = dir.path() / "data";
  // "a.txt" sorts before "a/..." ('.' < '/'), "B" before "a" (bytewise, not locale order).
  for (const char* path : {"a/z", "a/b/c", "a.txt", "B", "a/Y", "c"}) {
    write_file(root / path, path);
  }
  fs::create_directories(root / "empty_dir");
  const std::vector<BenchFile> files = list_bench_files(root);
  EXPECT_THAT(relative_paths(files, root), ElementsAre("B", "a.txt", "a/Y", "a/b/c", "a/z", "c"));
  for (const BenchFile& file : files) {
    EXPECT_EQ(file.size, file.path.lexically_relative(root).string().size()) << file.path;
  }
}

TEST(BenchListing, SkipsSpecialFilesAndDirectorySymlinksKeepsFileSymlinks) {
  TempDir dir;
  const fs::path root = dir.path() / "data";
  write_file(root / "real", "12345");
  write_file(dir.path() / "outside" / "hidden", "x");
  ASSERT_EQ(::mkfifo((root / "fifo").c_str(), 0644), 0);
  fs::create_symlink(root / "real", root / "link_to_file");
  fs::create_directory_symlink(dir.path() / "outside", root / "link_to_dir");
  fs::create_symlink(root / "nowhere", root / "dangling");
  const std::vector<BenchFile> files = list_bench_files(root);
  EXPECT_THAT(relative_paths(files, root), ElementsAre("dangling", "link_to_file", "real"));
  EXPECT_EQ(files[0].size, 0u);
  EXPECT_EQ(files[1].size, 5u);
}

TEST(BenchListing, FilesCapTakesTheFirstInDirectoryOrder) {
  TempDir dir;
  for (const char* name : {"d", "b", "a", "c"}) write_file(dir.path() / name, "x");
  EXPECT_THAT(relative_paths(list_bench_files(dir.path(), 2), dir.path()), ElementsAre("a", "b"));
  EXPECT_EQ(list_bench_files(dir.path(), 10).size(), 4u);
}

TEST(BenchListing, MissingNotADirectoryAndEmptyAreErrorsNamingThePath) {
  TempDir dir;
  const fs::path missing = dir.path() / "missing";
  try {
    list_bench_files(missing);
    FAIL() << "no error for a missing path";
  } catch (const BenchSetupError& e) {
    EXPECT_THAT(e.what(), HasSubstr(missing.string()));
  }
  write_file(dir.path() / "file", "x");
  try {
    list_bench_files(dir.path() / "file");
    FAIL() << "no error for a regular file";
  } catch (const BenchSetupError& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a directory"));
  }
  fs::create_directories(dir.path() / "empty" / "sub");
  ASSERT_EQ(::mkfifo((dir.path() / "empty" / "fifo").c_str(), 0644), 0);
  try {
    list_bench_files(dir.path() / "empty");
    FAIL() << "no error for a tree without files";
  } catch (const BenchSetupError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no files to read under " + (dir.path() / "empty").string()));
  }
}

// ---- Runs ----------------------------------------------------------------------------------

class BenchRunTest : public ::testing::Test {
 protected:
  BenchRunTest() {
    // Sizes around the block size used below, an empty file, and nested directories.
    const std::vector<size_t> sizes = {0, 1, 4095, 4096, 4097, 10000, 123457, 3, 65536, 777};
    for (size_t i = 0; i < sizes.size(); ++i) {
      // Names made with fmt: "f" + std::to_string(i) trips GCC 12's false -Wrestrict at -O3.
      const fs::path path = root() / fmt::format("class_{}", i % 3) /
                            (i % 4 == 0 ? "deeper/" : "") / fmt::format("f{}", i);
      write_file(path, pattern_bytes(sizes[i], static_cast<unsigned>(i)));
      total_bytes_ += sizes[i];
    }
    file_count_ = sizes.size();
  }

  fs::path root() const { return dir_.path() / "tree"; }

  BenchOptions options(BenchPattern pattern, uint64_t epochs, unsigned jobs) {
    BenchOptions out;
    out.root = root();
    out.pattern = pattern;
    out.epochs = epochs;
    out.jobs = jobs;
    out.block_size = 4096;
    out.seed = 5;
    return out;
  }

  // Runs with a hook recording which file each epoch read, in completion order.
  BenchResult run_recording(BenchOptions bench_options) {
    bench_options.on_file_done = [this](uint64_t epoch, uint32_t index, bool ok) {
      std::lock_guard lock(reads_mutex_);
      reads_[epoch].push_back(index);
      if (!ok) failed_[epoch].push_back(index);
    };
    return run_dataset_bench(bench_options);
  }

  void expect_totals_consistent(const BenchResult& result) {
    uint64_t files = 0;
    uint64_t bytes = 0;
    uint64_t errors = 0;
    for (const BenchEpoch& epoch : result.epochs) {
      files += epoch.figures.files;
      bytes += epoch.figures.bytes;
      errors += epoch.figures.errors;
      EXPECT_EQ(epoch.figures.latency.count, epoch.figures.files);
    }
    EXPECT_EQ(result.totals.files, files);
    EXPECT_EQ(result.totals.bytes, bytes);
    EXPECT_EQ(result.totals.errors, errors);
    EXPECT_EQ(result.totals.latency.count, files);
    uint64_t timeline_files = 0;
    uint64_t timeline_bytes = 0;
    for (const BenchSecond& second : result.timeline) {
      timeline_files += second.files;
      timeline_bytes += second.bytes;
    }
    EXPECT_EQ(timeline_files, files);
    EXPECT_EQ(timeline_bytes, bytes);
  }

  TempDir dir_;
  uint64_t total_bytes_ = 0;
  size_t file_count_ = 0;
  std::mutex reads_mutex_;
  std::map<uint64_t, std::vector<uint32_t>> reads_;
  std::map<uint64_t, std::vector<uint32_t>> failed_;
};

TEST_F(BenchRunTest, EveryPatternReadsEveryFileOncePerEpoch) {
  for (BenchPattern pattern :
       {BenchPattern::kSequential, BenchPattern::kShuffle, BenchPattern::kEpochs}) {
    SCOPED_TRACE(std::string(bench_pattern_name(pattern)));
    reads_.clear();
    const BenchResult result = run_recording(options(pattern, 3, 3));
    EXPECT_EQ(result.listed_files, file_count_);
    EXPECT_EQ(result.listed_bytes, total_bytes_);
    EXPECT_EQ(result.totals.files, file_count_ * 3);
    EXPECT_EQ(result.totals.bytes, total_bytes_ * 3);
    EXPECT_EQ(result.totals.errors, 0u);
    ASSERT_EQ(result.epochs.size(), 3u);
    for (uint64_t e = 0; e < 3; ++e) {
      EXPECT_EQ(result.epochs[e].epoch, e);
      EXPECT_TRUE(result.epochs[e].complete);
      EXPECT_EQ(result.epochs[e].figures.files, file_count_);
      EXPECT_EQ(result.epochs[e].figures.bytes, total_bytes_);
      EXPECT_TRUE(is_permutation_of_indices(reads_[e])) << "epoch " << e;
    }
    EXPECT_EQ(reads_.size(), 3u);
    expect_totals_consistent(result);
  }
}

TEST_F(BenchRunTest, OneReaderFollowsTheEpochOrderExactly) {
  for (BenchPattern pattern :
       {BenchPattern::kSequential, BenchPattern::kShuffle, BenchPattern::kEpochs}) {
    SCOPED_TRACE(std::string(bench_pattern_name(pattern)));
    reads_.clear();
    run_recording(options(pattern, 2, 1));
    for (uint64_t e = 0; e < 2; ++e) {
      EXPECT_EQ(reads_[e], epoch_order(pattern, file_count_, 5, e)) << "epoch " << e;
    }
  }
}

TEST_F(BenchRunTest, DefaultIsOneEpochAndFilesCapsTheListing) {
  BenchOptions capped = options(BenchPattern::kEpochs, 1, 2);
  capped.epochs.reset();
  capped.max_files = 4;
  const BenchResult result = run_recording(capped);
  const std::vector<BenchFile> first_four = list_bench_files(root(), 4);
  uint64_t bytes = 0;
  for (const BenchFile& file : first_four) bytes += file.size;
  EXPECT_EQ(result.listed_files, 4u);
  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_EQ(result.totals.files, 4u);
  EXPECT_EQ(result.totals.bytes, bytes);
  EXPECT_TRUE(is_permutation_of_indices(reads_[0]));
}

TEST_F(BenchRunTest, OddBlockSizesReadEveryByte) {
  for (size_t block : {1u, 7u, 1u << 20}) {
    BenchOptions odd = options(BenchPattern::kSequential, 1, 2);
    odd.block_size = block;
    EXPECT_EQ(run_dataset_bench(odd).totals.bytes, total_bytes_) << "bs " << block;
  }
}

TEST_F(BenchRunTest, AFileGoneAfterListingIsCountedAsAnErrorAndReadingGoesOn) {
  BenchOptions broken = options(BenchPattern::kEpochs, 2, 2);
  fs::path removed;
  uint64_t removed_size = 0;
  broken.after_listing = [&](const std::vector<BenchFile>& files) {
    removed = files[3].path;
    removed_size = files[3].size;
    fs::remove(removed);
  };
  const BenchResult result = run_recording(broken);
  EXPECT_EQ(result.totals.errors, 2u);
  EXPECT_EQ(result.totals.files, (file_count_ - 1) * 2);
  EXPECT_EQ(result.totals.bytes, (total_bytes_ - removed_size) * 2);
  ASSERT_EQ(result.first_errors.size(), 2u);
  for (const BenchReadError& error : result.first_errors) {
    EXPECT_EQ(error.path, removed);
    EXPECT_EQ(error.operation, "open");
    EXPECT_EQ(error.error_number, ENOENT);
  }
  for (uint64_t e = 0; e < 2; ++e) {
    EXPECT_TRUE(result.epochs[e].complete);
    EXPECT_EQ(result.epochs[e].figures.errors, 1u);
    EXPECT_THAT(failed_[e], ElementsAre(3u));
    EXPECT_TRUE(is_permutation_of_indices(reads_[e]));
  }
  expect_totals_consistent(result);

  const std::string summary = format_bench_summary(broken, result);
  EXPECT_THAT(summary, HasSubstr("2 error(s)"));
  EXPECT_THAT(summary, HasSubstr(removed.string() + ": open: No such file or directory"));
}

TEST_F(BenchRunTest, ADanglingSymlinkIsAnError) {
  fs::create_symlink(root() / "nowhere", root() / "zz_dangling");
  const BenchResult result = run_dataset_bench(options(BenchPattern::kSequential, 1, 1));
  EXPECT_EQ(result.listed_files, file_count_ + 1);
  EXPECT_EQ(result.totals.files, file_count_);
  EXPECT_EQ(result.totals.errors, 1u);
  ASSERT_EQ(result.first_errors.size(), 1u);
  EXPECT_EQ(result.first_errors[0].path, root() / "zz_dangling");
}

TEST_F(BenchRunTest, ReportsOnlyTheFirstErrors) {
  for (int i = 0; i < 15; ++i) {
    fs::create_symlink(root() / "nowhere", root() / ("dangling" + std::to_string(i)));
  }
  const BenchResult result = run_dataset_bench(options(BenchPattern::kShuffle, 2, 3));
  EXPECT_EQ(result.totals.errors, 30u);
  EXPECT_EQ(result.first_errors.size(), kReportedBenchErrors);
  EXPECT_THAT(format_bench_summary(options(BenchPattern::kShuffle, 2, 3), result),
              HasSubstr("and 20 more error(s)"));
}

TEST_F(BenchRunTest, DurationWithoutEpochsLoopsUntilItEnds) {
  BenchOptions timed = options(BenchPattern::kEpochs, 1, 2);
  timed.epochs.reset();
  timed.duration = std::chrono::milliseconds(200);
  const BenchResult result = run_recording(timed);
  // How many epochs fit is up to the machine; what was read must add up whatever it is.
  ASSERT_FALSE(result.epochs.empty());
  for (size_t e = 0; e + 1 < result.epochs.size(); ++e) {
    EXPECT_TRUE(result.epochs[e].complete) << "only the last epoch may be cut short";
    EXPECT_EQ(result.epochs[e].figures.files, file_count_);
    EXPECT_TRUE(is_permutation_of_indices(reads_[e]));
  }
  expect_totals_consistent(result);
}

TEST_F(BenchRunTest, StopFlagEndsTheRunEarly) {
  std::atomic<bool> stop{false};
  BenchOptions stoppable = options(BenchPattern::kSequential, 1000, 2);
  stoppable.stop = &stop;
  std::atomic<uint64_t> done{0};
  stoppable.on_file_done = [&](uint64_t, uint32_t, bool) {
    if (++done == 5) stop = true;
  };
  const BenchResult result = run_dataset_bench(stoppable);
  // Each reader finishes the file it had started when the flag came.
  EXPECT_GE(result.totals.files, 5u);
  EXPECT_LE(result.totals.files, 5u + stoppable.jobs);
  ASSERT_EQ(result.epochs.size(), 1u);
  EXPECT_FALSE(result.epochs[0].complete);
  EXPECT_THAT(format_bench_summary(stoppable, result), HasSubstr("(cut short)"));
  expect_totals_consistent(result);
}

TEST_F(BenchRunTest, JsonHasEveryPartAndAddsUp) {
  const BenchOptions json_options = options(BenchPattern::kEpochs, 2, 2);
  const BenchResult result = run_dataset_bench(json_options);
  // Through text and back, as a script would read it.
  const nlohmann::json json = nlohmann::json::parse(bench_result_json(json_options, result).dump());
  EXPECT_EQ(json["config"]["path"], root().string());
  EXPECT_EQ(json["config"]["pattern"], "epochs");
  EXPECT_EQ(json["config"]["epochs"], 2);
  EXPECT_EQ(json["config"]["jobs"], 2);
  EXPECT_EQ(json["config"]["block_size"], 4096);
  EXPECT_EQ(json["config"]["seed"], 5);
  EXPECT_TRUE(json["config"]["duration_s"].is_null());
  EXPECT_TRUE(json["config"]["max_files"].is_null());
  EXPECT_EQ(json["config"]["listed_files"], file_count_);
  EXPECT_EQ(json["config"]["listed_bytes"], total_bytes_);

  const nlohmann::json& totals = json["totals"];
  EXPECT_EQ(totals["files"], file_count_ * 2);
  EXPECT_EQ(totals["bytes"], total_bytes_ * 2);
  EXPECT_EQ(totals["errors"], 0);
  EXPECT_GT(totals["seconds"].get<double>(), 0);
  EXPECT_NEAR(totals["files_per_s"].get<double>(),
              totals["files"].get<double>() / totals["seconds"].get<double>(), 1e-6);
  EXPECT_NEAR(totals["mb_per_s"].get<double>(),
              totals["bytes"].get<double>() / 1e6 / totals["seconds"].get<double>(), 1e-6);
  const nlohmann::json& latency = totals["latency_ms"];
  EXPECT_EQ(latency["count"], file_count_ * 2);
  EXPECT_LE(latency["min"].get<double>(), latency["p50"].get<double>());
  EXPECT_LE(latency["p50"].get<double>(), latency["p90"].get<double>());
  EXPECT_LE(latency["p90"].get<double>(), latency["p99"].get<double>());
  EXPECT_LE(latency["p99"].get<double>(), latency["p999"].get<double>());
  EXPECT_LE(latency["p999"].get<double>(), latency["max"].get<double>());

  ASSERT_EQ(json["epochs"].size(), 2u);
  uint64_t epoch_files = 0;
  uint64_t epoch_bytes = 0;
  for (size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(json["epochs"][e]["epoch"], e);
    EXPECT_EQ(json["epochs"][e]["complete"], true);
    EXPECT_TRUE(json["epochs"][e]["latency_ms"].contains("p99"));
    epoch_files += json["epochs"][e]["files"].get<uint64_t>();
    epoch_bytes += json["epochs"][e]["bytes"].get<uint64_t>();
  }
  EXPECT_EQ(epoch_files, totals["files"]);
  EXPECT_EQ(epoch_bytes, totals["bytes"]);

  uint64_t timeline_files = 0;
  uint64_t timeline_bytes = 0;
  for (size_t i = 0; i < json["timeline"].size(); ++i) {
    EXPECT_EQ(json["timeline"][i]["second"], i);
    timeline_files += json["timeline"][i]["files"].get<uint64_t>();
    timeline_bytes += json["timeline"][i]["bytes"].get<uint64_t>();
  }
  EXPECT_EQ(timeline_files, totals["files"]);
  EXPECT_EQ(timeline_bytes, totals["bytes"]);
  EXPECT_EQ(json["errors"]["count"], 0);
  EXPECT_TRUE(json["errors"]["first"].empty());

  const std::string summary = format_bench_summary(json_options, result);
  EXPECT_THAT(summary, HasSubstr("read: files/s="));
  EXPECT_THAT(summary, HasSubstr("lat (ms): p50="));
  EXPECT_THAT(summary, HasSubstr("epoch 1: 10 files"));
}

TEST_F(BenchRunTest, DropCachesWritesThreeToTheControlFileBeforeEveryEpoch) {
  BenchOptions dropping = options(BenchPattern::kEpochs, 3, 1);
  dropping.drop_caches = true;
  dropping.drop_caches_file = dir_.path() / "drop_caches";
  write_file(dropping.drop_caches_file, "");
  // One reader: the first file of each epoch sees whether the cache was dropped before it, and
  // empties the control file so that the next epoch needs a drop of its own.
  std::vector<std::pair<uint64_t, std::string>> seen_at_epoch_start;
  uint64_t files_done = 0;
  dropping.on_file_done = [&](uint64_t epoch, uint32_t, bool) {
    if (files_done++ % file_count_ != 0) return;
    seen_at_epoch_start.emplace_back(epoch, test::read_file(dropping.drop_caches_file));
    write_file(dropping.drop_caches_file, "");
  };
  const BenchResult result = run_dataset_bench(dropping);
  EXPECT_EQ(result.totals.files, file_count_ * 3);
  EXPECT_EQ(seen_at_epoch_start,
            (std::vector<std::pair<uint64_t, std::string>>{{0, "3"}, {1, "3"}, {2, "3"}}));
  EXPECT_EQ(result.epochs.size(), 3u);
  EXPECT_TRUE(bench_result_json(dropping, result)["config"]["drop_caches"].get<bool>());

  // A drop that fails between epochs stops the run with the same error as before the first.
  dropping.on_file_done = [&](uint64_t, uint32_t, bool) { fs::remove(dropping.drop_caches_file); };
  write_file(dropping.drop_caches_file, "");
  try {
    run_dataset_bench(dropping);
    FAIL() << "no error when the page cache cannot be dropped between epochs";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--drop-caches"));
  }

  dropping.on_file_done = nullptr;

  dropping.drop_caches_file = dir_.path() / "no" / "such" / "file";
  try {
    run_dataset_bench(dropping);
    FAIL() << "no error when the page cache cannot be dropped";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(dropping.drop_caches_file.string()));
    EXPECT_THAT(e.what(), HasSubstr("--drop-caches"));
  }
}

// --plan on a stand-in for a mount: a directory holding .dsfs/stats.json and a plain
// .dsfs/plan file, with the files under tree/ in it.
class BenchPlanTest : public BenchRunTest {
 protected:
  BenchPlanTest() {
    write_file(mount() / ".dsfs" / "stats.json", "{}");
    write_file(plan_file(), "stale/plan\n");
  }
  fs::path mount() const { return dir_.path(); }
  fs::path plan_file() const { return mount() / ".dsfs" / "plan"; }

  // What the plan must hold for `epoch`: the listed files in that epoch's order, relative to
  // the mount, one per line.
  std::string expected_plan(BenchPattern pattern, uint64_t epoch) {
    const std::vector<BenchFile> files = list_bench_files(root());
    std::string text;
    for (const uint32_t index : epoch_order(pattern, files.size(), 5, epoch)) {
      text += files[index].path.lexically_relative(mount()).string() + "\n";
    }
    return text;
  }
};

TEST_F(BenchPlanTest, WritesEachEpochsOrderToThePlanBeforeReadingIt) {
  for (BenchPattern pattern : {BenchPattern::kEpochs, BenchPattern::kSequential}) {
    SCOPED_TRACE(std::string(bench_pattern_name(pattern)));
    BenchOptions planned = options(pattern, 3, 1);
    planned.plan = true;
    // One reader: the first file of each epoch sees the plan written for it.
    std::vector<std::pair<uint64_t, std::string>> seen_at_epoch_start;
    uint64_t files_done = 0;
    planned.on_file_done = [&](uint64_t epoch, uint32_t, bool) {
      if (files_done++ % file_count_ == 0) {
        seen_at_epoch_start.emplace_back(epoch, test::read_file(plan_file()));
      }
    };
    const BenchResult result = run_dataset_bench(planned);
    EXPECT_EQ(result.totals.files, file_count_ * 3);
    ASSERT_EQ(seen_at_epoch_start.size(), 3u);
    for (uint64_t e = 0; e < 3; ++e) {
      EXPECT_EQ(seen_at_epoch_start[e].first, e);
      EXPECT_EQ(seen_at_epoch_start[e].second, expected_plan(pattern, e)) << "epoch " << e;
    }
    EXPECT_THAT(seen_at_epoch_start[0].second, HasSubstr("tree/class_0/deeper/f0\n"));
    const nlohmann::json json = bench_result_json(planned, result);
    EXPECT_TRUE(json["config"]["plan"].get<bool>());
    for (const nlohmann::json& epoch : json["epochs"]) {
      EXPECT_GE(epoch["plan_seconds"].get<double>(), 0.0);
      EXPECT_LE(epoch["plan_seconds"].get<double>(), epoch["seconds"].get<double>());
    }
    EXPECT_THAT(format_bench_summary(planned, result), HasSubstr("written to the mount's plan"));
  }
  // Without --plan the plan is left alone and the JSON says so.
  write_file(plan_file(), "left/alone\n");
  const BenchOptions unplanned = options(BenchPattern::kEpochs, 1, 2);
  const BenchResult result = run_dataset_bench(unplanned);
  EXPECT_EQ(test::read_file(plan_file()), "left/alone\n");
  const nlohmann::json json = bench_result_json(unplanned, result);
  EXPECT_FALSE(json["config"]["plan"].get<bool>());
  EXPECT_FALSE(json["epochs"][0].contains("plan_seconds"));
}

TEST_F(BenchPlanTest, FindsTheMountAboveThePathAsGivenOrThroughASymlink) {
  EXPECT_EQ(find_dsfs_mount_root(mount()), mount());
  EXPECT_EQ(find_dsfs_mount_root(root() / "class_0" / "deeper"), mount());
  // A symlink from outside into the mount: found through the real path, and the plan names
  // the files by their place in the mount.
  TempDir outside;
  const fs::path link = outside.path() / "dataset";
  fs::create_directory_symlink(root(), link);
  EXPECT_EQ(find_dsfs_mount_root(link), mount());
  const std::vector<BenchFile> files = list_bench_files(link);
  const std::vector<std::string> lines = plan_lines_for(files, link, mount());
  ASSERT_EQ(lines.size(), file_count_);
  EXPECT_EQ(lines.front(), "tree/class_0/deeper/f0");
  for (const std::string& line : lines) EXPECT_EQ(line.rfind("tree/class_", 0), 0u) << line;

  BenchOptions planned = options(BenchPattern::kShuffle, 1, 2);
  planned.root = link;
  planned.plan = true;
  run_dataset_bench(planned);
  EXPECT_EQ(test::read_file(plan_file()), expected_plan(BenchPattern::kShuffle, 0));
}

TEST_F(BenchRunTest, PlanOutsideAMountIsASetupErrorBeforeReading) {
  BenchOptions planned = options(BenchPattern::kEpochs, 1, 1);
  planned.plan = true;
  bool read_any = false;
  planned.on_file_done = [&](uint64_t, uint32_t, bool) { read_any = true; };
  try {
    run_dataset_bench(planned);
    FAIL() << "no error for --plan outside a dsfs mount";
  } catch (const BenchSetupError& e) {
    EXPECT_THAT(e.what(), HasSubstr(root().string()));
    EXPECT_THAT(e.what(), HasSubstr(".dsfs/stats.json"));
    EXPECT_THAT(e.what(), HasSubstr("--plan"));
  }
  EXPECT_FALSE(read_any);
}

TEST_F(BenchPlanTest, APlanThatCannotBeWrittenStopsTheRunNamingIt) {
  fs::remove(plan_file());  // a mount whose dsfs has no plan file
  BenchOptions planned = options(BenchPattern::kEpochs, 2, 1);
  planned.plan = true;
  bool read_any = false;
  planned.on_file_done = [&](uint64_t, uint32_t, bool) { read_any = true; };
  try {
    run_dataset_bench(planned);
    FAIL() << "no error when the plan cannot be written";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(plan_file().string()));
  }
  EXPECT_FALSE(read_any);

  // Gone between epochs: the run stops with the same error after the first epoch.
  write_file(plan_file(), "");
  planned.on_file_done = [&](uint64_t, uint32_t, bool) { fs::remove(plan_file()); };
  try {
    run_dataset_bench(planned);
    FAIL() << "no error when the plan cannot be written between epochs";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr(plan_file().string()));
  }
}

TEST_F(BenchRunTest, BadOptionsAreRefusedBeforeReading) {
  BenchOptions bad = options(BenchPattern::kSequential, 1, 0);
  EXPECT_THROW(run_dataset_bench(bad), std::invalid_argument);
  bad = options(BenchPattern::kSequential, 0, 1);
  EXPECT_THROW(run_dataset_bench(bad), std::invalid_argument);
  bad = options(BenchPattern::kSequential, 1, 1);
  bad.block_size = 0;
  EXPECT_THROW(run_dataset_bench(bad), std::invalid_argument);
  bad = options(BenchPattern::kSequential, 1, 1);
  bad.duration = std::chrono::nanoseconds(0);
  EXPECT_THROW(run_dataset_bench(bad), std::invalid_argument);
}

// ---- Latency histogram ---------------------------------------------------------------------

TEST(LatencyHistogram, EmptyIsAllZero) {
  const LatencyHistogram histogram;
  EXPECT_EQ(histogram.count(), 0u);
  EXPECT_EQ(histogram.min(), 0u);
  EXPECT_EQ(histogram.max(), 0u);
  EXPECT_EQ(histogram.percentile(0.5), 0u);
  EXPECT_EQ(histogram.mean(), 0);
}

TEST(LatencyHistogram, PercentilesAreWithinOnePercent) {
  LatencyHistogram histogram;
  // 1 us .. 10 ms in 1 us steps, shuffled order does not matter to a histogram.
  for (uint64_t us = 1; us <= 10000; ++us) histogram.record(us * 1000);
  EXPECT_EQ(histogram.count(), 10000u);
  EXPECT_EQ(histogram.min(), 1000u);
  EXPECT_EQ(histogram.max(), 10'000'000u);
  EXPECT_DOUBLE_EQ(histogram.mean(), 5000.5 * 1000);
  for (double q : {0.01, 0.25, 0.5, 0.9, 0.99, 0.999}) {
    const double exact = std::ceil(q * 10000) * 1000;
    EXPECT_NEAR(static_cast<double>(histogram.percentile(q)), exact, exact * 0.01) << "q " << q;
  }
  EXPECT_EQ(histogram.percentile(1.0), 10'000'000u);
  EXPECT_EQ(histogram.percentile(0.0), 1000u);
}

TEST(LatencyHistogram, SmallValuesAreExactAndHugeOnesDoNotOverflow) {
  LatencyHistogram histogram;
  for (uint64_t v : {0u, 1u, 2u, 100u, 127u}) histogram.record(v);
  EXPECT_EQ(histogram.percentile(0.2), 0u);
  EXPECT_EQ(histogram.percentile(0.4), 1u);
  EXPECT_EQ(histogram.percentile(0.8), 100u);
  histogram.record(UINT64_MAX);
  EXPECT_EQ(histogram.max(), UINT64_MAX);
  EXPECT_EQ(histogram.percentile(1.0), UINT64_MAX);
  EXPECT_GE(histogram.percentile(0.99), UINT64_MAX / 100 * 99);
}

TEST(LatencyHistogram, MergeEqualsRecordingEverythingInOne) {
  LatencyHistogram a;
  LatencyHistogram b;
  LatencyHistogram both;
  for (uint64_t v = 1; v < 5000; v += 3) {
    (v % 2 ? a : b).record(v * 977);
    both.record(v * 977);
  }
  a.merge(b);
  EXPECT_EQ(a.count(), both.count());
  EXPECT_EQ(a.min(), both.min());
  EXPECT_EQ(a.max(), both.max());
  EXPECT_DOUBLE_EQ(a.mean(), both.mean());
  for (double q : {0.1, 0.5, 0.9, 0.99}) EXPECT_EQ(a.percentile(q), both.percentile(q));
  a.clear();
  EXPECT_EQ(a.count(), 0u);
  EXPECT_EQ(a.percentile(0.5), 0u);
}

TEST(BenchFigures, ThroughputAndSummaryText) {
  ThroughputFigures figures{.files = 2000, .bytes = 220'000'000, .errors = 0, .seconds = 2.0};
  figures.latency.p50_ms = 1.5;
  figures.latency.max_ms = 20;
  EXPECT_DOUBLE_EQ(figures.files_per_second(), 1000);
  EXPECT_DOUBLE_EQ(figures.megabytes_per_second(), 110);
  EXPECT_THAT(format_throughput(figures),
              HasSubstr("files/s=1000.0, MB/s=110.0, lat (ms): p50=1.500"));
  EXPECT_THAT(format_throughput(figures), HasSubstr("max=20.000"));
  EXPECT_EQ(ThroughputFigures{}.files_per_second(), 0);
}

}  // namespace
}  // namespace dsfs::tools
