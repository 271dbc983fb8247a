// `dsfs stats`: the summary and rate lines made from stats.json samples, full and partial.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/unit/support/files.h"
#include "tools/stats_command.h"

namespace dsfs::tools {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Json = nlohmann::json;

// A stats.json as a mount with the prefetch engine serves it (trimmed to what stats reads).
Json full_sample() {
  return Json::parse(R"({
    "uptime_s": 3723.25,
    "namespace": "dsfs",
    "redis": "redis://127.0.0.1:6379",
    "bytes_read": 5000000000,
    "redis_ops": {"round_trips": 100, "gets": 5000, "bytes": 6000000000, "retries": 0},
    "datasets": {"a": {"generation": 1}, "b": {"generation": 4}},
    "watch": {"added": 1, "removed": 0, "refreshed": 2, "pending": {"b": 5}},
    "cache": {"capacity_bytes": 1073741824, "bytes": 536870912, "entries": 4321,
              "hits": 10, "misses": 2},
    "memory": {"rss_bytes": 604087040, "trims": 2, "released_bytes": 83886080},
    "prefetch": {
      "mode": "auto",
      "leader": "unread-set",
      "epoch": 2,
      "reads": {"ready": 12345, "joined": 210, "miss": 345, "hit_rate": 0.97325},
      "stall_us": {"p50": 12, "p90": 800, "p99": 12300, "p999": 50000, "max": 104200,
                   "total_s": 1.25},
      "bytes": {"prefetched": 1400000000, "used": 1300000000, "wasted": 12000000},
      "inflight": {"objects": 64, "bytes": 7000000, "target": 80, "max": 512},
      "rtt_ms": 100.25,
      "consumption_files_per_s": 1786.04,
      "connections": 8,
      "plan": {"entries": 1281167, "unresolved": 3, "position": 12345, "writers": 8},
      "predictors": [{"name": "plan", "score": 0.991, "foreseen": 1000, "scored": 1010},
                     {"name": "sequential", "score": 0.02, "foreseen": 2, "scored": 100},
                     {"name": "unread-set", "score": 0.5}]
    }
  })");
}

// The line of `text` that starts with `label`, or "" if there is none.
std::string line_of(const std::string& text, std::string_view label) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.starts_with(label)) return line;
  }
  return "";
}

TEST(StatsFormatTest, SummarizesEveryPrefetchFigure) {
  const std::string summary = format_stats_summary(full_sample(), "/mnt/dsfs");
  EXPECT_EQ(line_of(summary, "dsfs stats"),
            "dsfs stats /mnt/dsfs  uptime 1:02:03  redis redis://127.0.0.1:6379");
  EXPECT_EQ(line_of(summary, "prefetch"), "prefetch   mode auto  leader unread-set  epoch 2");
  EXPECT_EQ(line_of(summary, "reads"), "reads      hit 97.3%  ready 12,345  joined 210  miss 345");
  EXPECT_EQ(line_of(summary, "stall"),
            "stall      p50 0.01 ms  p99 12.3 ms  max 104.2 ms  total 1.25 s");
  EXPECT_EQ(line_of(summary, "bytes"), "bytes      prefetched 1.4 GB  used 1.3 GB  wasted 12.0 MB");
  EXPECT_EQ(line_of(summary, "in flight"), "in flight  64 objects (7.0 MB)  target 80  max 512");
  EXPECT_EQ(line_of(summary, "redis"), "redis      rtt 100.2 ms  connections 8");
  EXPECT_EQ(line_of(summary, "consuming"), "consuming  1786.0 files/s");
  EXPECT_EQ(line_of(summary, "plan"),
            "plan       1,281,167 entries  3 unresolved  position 12,345  writers 8");
  EXPECT_EQ(line_of(summary, "predictors"),
            "predictors plan 0.99 (1,000/1,010)  sequential 0.02 (2/100)  unread-set 0.50");
  EXPECT_EQ(line_of(summary, "cache"), "cache      536.9 MB of 1.1 GB (50.0%)  4,321 objects");
  EXPECT_EQ(line_of(summary, "memory"), "memory     RSS 604.1 MB  given back 83.9 MB (2 trims)");
  EXPECT_EQ(line_of(summary, "datasets"),
            "datasets   2 listed  added 1  removed 0  refreshed 2  pending b (generation 5; "
            "`dsfs refresh`)");
}

TEST(StatsFormatTest, TheDiskTierHasARowOnlyWhenTheMountHasOne) {
  Json stats = full_sample();
  EXPECT_EQ(line_of(format_stats_summary(stats, "/m"), "disk tier"), "");
  stats["disk_tier"] = nullptr;  // as a mount without --disk-cache serves it
  EXPECT_EQ(line_of(format_stats_summary(stats, "/m"), "disk tier"), "");
  stats["disk_tier"] = Json::parse(R"({"capacity_bytes": 4000000000, "bytes_used": 2000000000,
      "entries": 12345, "hits": 100, "direct_reads": 60, "misses": 7, "bytes_read": 500000000,
      "writes": 20, "writes_deferred": 3, "writes_dropped": 0, "checksum_failures": 1, "write_errors": 2})");
  stats["prefetch"]["disk_staging"] =
      Json::parse(R"({"threads": 16, "objects": 9, "peak": 32, "before_first_read": 7,
          "passed_on": 1200, "passed_on_peak": 1900})");
  EXPECT_EQ(line_of(format_stats_summary(stats, "/m"), "disk tier"),
            "disk tier  2.0 GB of 4.0 GB (50.0%)  12,345 objects  hits 100 (60 direct)  misses 7  "
            "read 500.0 MB"
            "  written 20  deferred 3  dropped 0  bad files 1  write errors 2"
            "  staging 9 (peak 32, 16 readers, 7 before the first read, 1,200 passed on)");
  // A mount from before the stagers: their figures read as missing, the rest stands.
  stats["prefetch"].erase("disk_staging");
  EXPECT_EQ(line_of(format_stats_summary(stats, "/m"), "disk tier"),
            "disk tier  2.0 GB of 4.0 GB (50.0%)  12,345 objects  hits 100 (60 direct)  misses 7  "
            "read 500.0 MB"
            "  written 20  deferred 3  dropped 0  bad files 1  write errors 2"
            "  staging - (peak -, - readers, - before the first read, - passed on)");
}

TEST(StatsFormatTest, AMountThatPredatesTheWatcherListsItsDatasetsOnly) {
  Json stats = full_sample();
  stats.erase("watch");
  EXPECT_EQ(line_of(format_stats_summary(stats, "/m"), "datasets"), "datasets   2 listed");
}

TEST(StatsFormatTest, MissingFieldsPrintAsADash) {
  Json stats = full_sample();
  Json& prefetch = stats["prefetch"];
  prefetch.erase("leader");
  prefetch["reads"].erase("hit_rate");
  prefetch["stall_us"] = {{"p50", 5}};
  prefetch.erase("bytes");
  prefetch["inflight"].erase("target");
  prefetch.erase("rtt_ms");
  prefetch.erase("plan");
  prefetch.erase("predictors");
  stats.erase("uptime_s");
  stats["cache"].erase("capacity_bytes");

  const std::string summary = format_stats_summary(stats, "/m");
  EXPECT_EQ(line_of(summary, "dsfs stats"),
            "dsfs stats /m  uptime -  redis redis://127.0.0.1:6379");
  EXPECT_EQ(line_of(summary, "prefetch"), "prefetch   mode auto  leader -  epoch 2");
  EXPECT_EQ(line_of(summary, "reads"), "reads      hit -  ready 12,345  joined 210  miss 345");
  EXPECT_EQ(line_of(summary, "stall"), "stall      p50 0.01 ms  p99 -  max -  total -");
  EXPECT_EQ(line_of(summary, "bytes"), "bytes      prefetched -  used -  wasted -");
  EXPECT_EQ(line_of(summary, "in flight"), "in flight  64 objects (7.0 MB)  target -  max 512");
  EXPECT_EQ(line_of(summary, "redis"), "redis      rtt -  connections 8");
  EXPECT_EQ(line_of(summary, "plan"), "plan       - entries  - unresolved  position -  writers -");
  EXPECT_EQ(line_of(summary, "predictors"), "predictors -");
  EXPECT_EQ(line_of(summary, "cache"), "cache      536.9 MB of -  4,321 objects");
}

TEST(StatsFormatTest, FieldsOfTheWrongTypePrintAsADash) {
  Json stats = full_sample();
  stats["prefetch"]["reads"] = "not an object";
  stats["prefetch"]["epoch"] = "two";
  stats["prefetch"]["mode"] = 3;
  stats["prefetch"]["inflight"]["objects"] = -4;
  stats["prefetch"]["predictors"] = {{{"score", "high"}}, 7};
  const std::string summary = format_stats_summary(stats, "/m");
  EXPECT_EQ(line_of(summary, "prefetch"), "prefetch   mode -  leader unread-set  epoch -");
  EXPECT_EQ(line_of(summary, "reads"), "reads      hit -  ready -  joined -  miss -");
  EXPECT_THAT(line_of(summary, "in flight"), HasSubstr("- objects"));
  EXPECT_EQ(line_of(summary, "predictors"), "predictors - -  - -");
}

TEST(StatsFormatTest, AMountWithoutTheEngineSaysSoOnceAndStillShowsTheCache) {
  Json stats = full_sample();
  stats.erase("prefetch");
  const std::string summary = format_stats_summary(stats, "/m");
  EXPECT_THAT(line_of(summary, "prefetch"), HasSubstr("predates the engine"));
  EXPECT_EQ(line_of(summary, "reads"), "");
  EXPECT_EQ(line_of(summary, "cache"), "cache      536.9 MB of 1.1 GB (50.0%)  4,321 objects");

  const std::string bare = format_stats_summary(Json::object(), "/m");
  EXPECT_THAT(bare, HasSubstr("uptime -"));
  EXPECT_EQ(line_of(bare, "cache"), "cache      - of -  - objects");
  EXPECT_EQ(line_of(bare, "memory"), "memory     RSS -  given back - (- trims)");
}

TEST(StatsFormatTest, AnRttOfZeroIsNotMeasuredYet) {
  Json stats = full_sample();
  stats["prefetch"]["rtt_ms"] = 0;
  EXPECT_EQ(line_of(format_stats_summary(stats, "/m"), "redis"),
            "redis      rtt not measured yet  connections 8");
}

TEST(StatsFormatTest, RatesComeFromTheDeltasOverTheInterval) {
  const Json before = full_sample();
  Json after = full_sample();
  after["uptime_s"] = 3725.25;
  after["prefetch"]["reads"] = {
      {"ready", 12345 + 1800}, {"joined", 210 + 100}, {"miss", 345 + 100}, {"hit_rate", 0.97}};
  after["bytes_read"] = 5000000000 + 400000000;  // 400 MB in 2 s
  after["redis_ops"]["bytes"] = 6000000000 + 300000000;

  ASSERT_EQ(stats_interval_seconds(before, after), 2.0);
  EXPECT_EQ(format_stats_rates(before, after, 2.0),
            "rates      1000.0 reads/s  200.0 MB/s  hit 95.0%  redis 150.0 MB/s\n");
}

TEST(StatsFormatTest, RatesOfMissingOrResetCountersPrintAsADash) {
  const Json before = full_sample();
  Json restarted = full_sample();
  restarted["uptime_s"] = 2.0;  // a new daemon: every counter started again
  restarted["bytes_read"] = 10;
  restarted["prefetch"]["reads"]["ready"] = 1;
  EXPECT_EQ(stats_interval_seconds(before, restarted), std::nullopt);
  EXPECT_EQ(format_stats_rates(before, restarted, 1.0),
            "rates      - reads/s  - MB/s  hit -  redis 0.0 MB/s\n");

  EXPECT_EQ(format_stats_rates(Json::object(), Json::object(), 1.0),
            "rates      - reads/s  - MB/s  hit -  redis - MB/s\n");
  EXPECT_EQ(stats_interval_seconds(Json::object(), before), std::nullopt);
}

TEST(StatsReadTest, ReadsTheFileAfreshAndRejectsWhatIsNotAJsonObject) {
  test::TempDir dir;
  test::write_file(dir.path() / ".dsfs" / "stats.json", R"({"uptime_s": 1})");
  EXPECT_EQ(read_stats_json(dir.path())["uptime_s"], 1);
  test::write_file(dir.path() / ".dsfs" / "stats.json", R"({"uptime_s": 2})");
  EXPECT_EQ(read_stats_json(dir.path())["uptime_s"], 2);

  test::write_file(dir.path() / ".dsfs" / "stats.json", "{ truncated");
  try {
    read_stats_json(dir.path());
    FAIL() << "no error for a broken stats.json";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("stats.json is not a JSON object"));
  }
  try {
    read_stats_json(dir.path() / "missing");
    FAIL() << "no error for a missing stats.json";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot read"));
    EXPECT_THAT(e.what(), Not(HasSubstr("JSON")));
  }
}

}  // namespace
}  // namespace dsfs::tools
