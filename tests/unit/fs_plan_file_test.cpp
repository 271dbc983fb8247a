// The plan file (MOUNT/.dsfs/plan, below FUSE): writes replace or extend the plan, lines resolve
// to dataset files handed to the engine in order; a line longer than a path can be is neither
// buffered nor resolved but counted as unresolved, the lines after it still count, and what the
// log says about plan lines is a short excerpt with control characters escaped. Each writing
// process has a plan of its own (DDP ranks sharing a mount): its writes and truncations touch
// only its plan, O_APPEND extends it wherever the kernel puts the write, and when a new writer
// arrives it goes on with the plan of the writer that exited last; the other gone writers' plans
// (and those beyond the bound) are forgotten.
#include <fmt/core.h>
#include <gtest/gtest.h>
#include <malloc.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "fs/node.h"
#include "fs/nodes/plan_file.h"
#include "prefetch/engine.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/pool.h"
#include "tests/unit/support/test_redis.h"

namespace dsfs::fs {

using namespace prefetch;
namespace {

using namespace std::chrono_literals;

constexpr const char* kName = "pl";

// Captures what is logged while it lives (the default logger is put back afterwards).
class CapturedLog {
 public:
  CapturedLog()
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000)),
        previous_(spdlog::default_logger()) {
    sink_->set_pattern("%v");  // the message alone
    auto logger = std::make_shared<spdlog::logger>("plan-limits-test", sink_);
    logger->set_level(spdlog::level::trace);
    spdlog::set_default_logger(logger);
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  // The messages logged, without their line ends.
  std::vector<std::string> lines() {
    std::vector<std::string> lines = sink_->last_formatted();
    for (std::string& line : lines) {
      while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
    }
    return lines;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

// Heap bytes in use by this process (glibc's count; 0 where malloc is replaced, e.g. ASan).
size_t heap_in_use() {
  return mallinfo2().uordblks;
}

class PlanFileTest : public ::testing::Test {
 protected:
  PlanFileTest() {
    catalog::CatalogBuilder builder(catalog::ChecksumKind::kXxh64, 1 << 20);
    builder.add_directory("dir", 0, 0755);
    for (uint32_t i = 0; i < 4; ++i) {
      builder.add_file(fmt::format("f{}.bin", i), 100, 0, 0644, /*object_id=*/i + 1,
                       catalog::kNoLabel, 0, "");
    }
    builder.add_file("empty.bin", 0, 0, 0644, /*object_id=*/9, catalog::kNoLabel, 0, "");
    DatasetSnapshot d;
    d.info.name = kName;
    d.info.generation = 1;
    d.info.chunk_size = 1 << 20;
    d.catalog = std::make_shared<const catalog::Catalog>(std::move(builder).build());
    std::vector<DatasetSnapshot> datasets;
    datasets.push_back(std::move(d));
    tree_ = std::make_unique<MountTree>(std::move(datasets));
    // Never started: the plan file needs no fetch thread.
    engine_ = std::make_unique<PrefetchEngine>(
        cache_, fetcher_, tree_->table(), client_, false,
        EngineOptions{.mode = PrefetchMode::kPlan, .connections = 1});
    plan_ = std::make_unique<PlanFile>(*tree_, *engine_);
  }
  uint64_t entries() const { return engine_->stats().plan_entries; }
  uint64_t engine_writers() const { return engine_->stats().plan_writers; }

  // Appends `text` to the plan.
  void append(std::string_view text) { ASSERT_EQ(plan_->write(me_, plan_->size(), text), 0); }

  test::TestRedisServer redis_;
  std::unique_ptr<MountTree> tree_;
  store::Client client_{{redis_.endpoint()}, store::ClientOptions{.connections_per_node = 1}};
  ObjectFetcher fetcher_{client_, catalog::KeySchema("dsfs"), FetcherOptions{.timeout = 5s}};
  ObjectCache cache_{1 << 20};
  std::unique_ptr<PrefetchEngine> engine_;
  std::unique_ptr<PlanFile> plan_;
  // The writer the single-writer tests stand for: this process (alive throughout).
  const WriteContext me_{.writer = static_cast<uint64_t>(::getpid())};
};

TEST_F(PlanFileTest, WritesReplaceOrExtendThePlanAndCountUnknownPaths) {
  const std::string first = "pl/f0.bin\npl/f1.bin\npl/f2.bin\n";
  ASSERT_EQ(plan_->write(me_, 0, first), 0);
  EXPECT_EQ(entries(), 3u);
  // Appending: at the end, even with a line split across writes.
  ASSERT_EQ(plan_->write(me_, first.size(), "pl/f"), 0);
  EXPECT_EQ(entries(), 3u);
  ASSERT_EQ(plan_->write(me_, first.size() + 4, "3.bin\n"), 0);
  EXPECT_EQ(entries(), 4u);
  // A hole or an overlap means nothing sensible.
  EXPECT_EQ(plan_->write(me_, plan_->size() + 10, "x\n"), EINVAL);
  EXPECT_EQ(plan_->write(me_, 3, "x\n"), EINVAL);
  // Unknown names, directories, other datasets and blank lines: counted (blank: ignored); a
  // leading ./ or /, trailing spaces and CR are forgiven.
  ASSERT_EQ(
      plan_->write(me_, plan_->size(), "pl/nope.bin\npl/dir\nother/f0.bin\n\n./pl/f1.bin \r\n"), 0);
  EXPECT_EQ(plan_->unresolved(), 3u);
  EXPECT_EQ(entries(), 5u);
  // Writing from the start again replaces it; so does truncating to 0.
  ASSERT_EQ(plan_->write(me_, 0, "/pl/f2.bin\n"), 0);
  EXPECT_EQ(entries(), 1u);
  EXPECT_EQ(plan_->unresolved(), 0u);
  EXPECT_EQ(plan_->truncate(me_.writer, 5), EINVAL);
  EXPECT_EQ(plan_->truncate(me_.writer, plan_->size()), 0);
  EXPECT_EQ(entries(), 1u);
  EXPECT_EQ(plan_->truncate(me_.writer, 0), 0);
  EXPECT_EQ(plan_->size(), 0u);
  EXPECT_EQ(entries(), 0u);
}

// An empty file is never READ, so the engine would never see it read and the plan's frontier
// (and the window fetched ahead of it) would stop at it for good: it is resolved, not counted
// as unresolved, and not handed to the engine.
TEST_F(PlanFileTest, AnEmptyFileIsResolvedButNotHandedToTheEngine) {
  ASSERT_EQ(plan_->write(me_, 0, "pl/f0.bin\npl/empty.bin\npl/f1.bin\n"), 0);
  EXPECT_EQ(plan_->unresolved(), 0u);
  EXPECT_EQ(entries(), 2u);
}

TEST_F(PlanFileTest, AMappedLineStandsForTheFileItMapsTo) {
  // As the mount maps a .views path to its source image.
  plan_->set_line_mapper([](std::string_view line) -> std::optional<std::string> {
    if (line.starts_with("alias/")) return fmt::format("pl/{}", line.substr(6));
    if (line.starts_with("nothing/")) return std::string();
    return std::nullopt;
  });
  ASSERT_EQ(plan_->write(me_, 0, "alias/f1.bin\npl/f2.bin\nnothing/f0.bin\nalias/f9.bin\n"), 0);
  EXPECT_EQ(entries(), 2u);
  EXPECT_EQ(plan_->unresolved(), 2u);
}

TEST_F(PlanFileTest, ALineWithoutANewlineIsNotBufferedPastThePathLimit) {
  // 16 MiB of one line, in the 128 KiB writes FUSE delivers.
  const std::string chunk(128 << 10, 'a');
  const size_t heap_before = heap_in_use();
  append("pl/f0.bin");
  for (int i = 0; i < 128; ++i) append(chunk);
  const size_t heap_after = heap_in_use();
  // Counted as soon as it is too long, not when (if ever) its newline comes.
  EXPECT_EQ(plan_->unresolved(), 1u);
  EXPECT_EQ(entries(), 0u);
  EXPECT_LT(heap_after, heap_before + (1 << 20))
      << "the line's bytes were kept: " << heap_after - heap_before << " bytes more on the heap";
  // Its newline ends it; the lines after it are read as usual.
  append("aaaa\npl/f1.bin\npl/f2.bin\n");
  EXPECT_EQ(entries(), 2u);
  EXPECT_EQ(plan_->unresolved(), 1u);
  EXPECT_EQ(plan_->size(), 9 + 128 * chunk.size() + 25);
}

TEST_F(PlanFileTest, ALineLongerThanPathMaxIsUnresolvedEvenIfItStartsWithAPath) {
  // Trailing spaces are trimmed from a line, so without the limit this would resolve to f3.bin.
  const std::string padded = "pl/f3.bin" + std::string(kMaxPlanLineBytes, ' ');
  append(padded + "\n");
  EXPECT_EQ(entries(), 0u);
  EXPECT_EQ(plan_->unresolved(), 1u);
  // In one write or split across several: the same.
  ASSERT_EQ(plan_->truncate(me_.writer, 0), 0);
  append(padded.substr(0, 3000));
  append(padded.substr(3000) + "\npl/f0.bin\n");
  EXPECT_EQ(entries(), 1u);
  EXPECT_EQ(plan_->unresolved(), 1u);
}

TEST_F(PlanFileTest, ALineOfExactlyTheLimitIsStillRead) {
  std::string line = "pl/f2.bin";
  line.resize(kMaxPlanLineBytes, ' ');
  append(line.substr(0, 100));
  append(line.substr(100) + "\n");
  EXPECT_EQ(entries(), 1u);
  EXPECT_EQ(plan_->unresolved(), 0u);
}

TEST_F(PlanFileTest, ReplacingThePlanDropsAnUnfinishedOversizedLine) {
  append(std::string(3 * kMaxPlanLineBytes, 'z'));
  EXPECT_EQ(plan_->unresolved(), 1u);
  ASSERT_EQ(plan_->write(me_, 0, "pl/f1.bin\n"), 0);  // a new plan from offset 0
  EXPECT_EQ(entries(), 1u);
  EXPECT_EQ(plan_->unresolved(), 0u);
}

TEST_F(PlanFileTest, TheLogCarriesAShortEscapedExcerptOfPlanLines) {
  CapturedLog log;
  // An unknown path with a terminal escape and a bell in it, then a huge line of control bytes.
  append("pl/\x1b[31mnot-there\x07.bin\n");
  ASSERT_EQ(plan_->write(me_, 0, "\x1b]0;owned\x07" + std::string(1 << 20, '\x01') + "\n"), 0);
  const std::vector<std::string> lines = log.lines();
  ASSERT_GE(lines.size(), 2u);
  bool named_unknown = false, named_oversized = false;
  for (const std::string& line : lines) {
    EXPECT_LT(line.size(), 1000u) << line.substr(0, 200);
    for (const char c : line) {
      EXPECT_FALSE(static_cast<unsigned char>(c) < 0x20 || c == 0x7F)
          << "a raw control character in: " << line.substr(0, 200);
    }
    named_unknown |= line.find("\\x1b[31mnot-there\\x07.bin") != std::string::npos;
    named_oversized |= line.find("longer than 4096 bytes") != std::string::npos;
  }
  EXPECT_TRUE(named_unknown) << "the unknown path is logged, escaped";
  EXPECT_TRUE(named_oversized) << "the oversized line is logged as such";
}

// A writer that exists while the test runs and is not this process: the parent (the test
// runner's shell or ctest), alive until the test ends.
uint64_t other_live_process() {
  return static_cast<uint64_t>(::getppid());
}

// A pid that existed and no longer does: a child forked and reaped.
uint64_t gone_process() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  EXPECT_EQ(::waitpid(child, &status, 0), child);
  return static_cast<uint64_t>(child);
}

// The kernel names a request's thread, not its process: every thread of a process is one writer
// (dsfs bench --plan writes each epoch's plan from another thread; it had two plans).
TEST(PlanFileWriter, EveryThreadOfAProcessIsThatProcess) {
  const auto self = static_cast<PlanFile::Writer>(::getpid());
  EXPECT_EQ(PlanFile::process_of_thread(self), self);
  PlanFile::Writer from_thread = 0;
  PlanFile::Writer thread_id = 0;
  std::thread([&] {
    thread_id = static_cast<PlanFile::Writer>(::gettid());
    from_thread = PlanFile::process_of_thread(thread_id);
  }).join();
  EXPECT_NE(thread_id, self);
  EXPECT_EQ(from_thread, self);
  EXPECT_EQ(PlanFile::process_of_thread(0), 0u);
  const PlanFile::Writer no_such = PlanFile::Writer{1} << 40;  // above any pid
  EXPECT_EQ(PlanFile::process_of_thread(no_such), no_such);
}

TEST_F(PlanFileTest, InterleavedWritersEachKeepTheirOwnPlan) {
  const WriteContext a = me_;
  const WriteContext b{.writer = other_live_process()};
  ASSERT_NE(a.writer, b.writer);
  const std::string a1 = "pl/f0.bin\npl/f1.bin\n";
  const std::string b1 = "pl/f2.bin\n";
  ASSERT_EQ(plan_->write(a, 0, a1), 0);
  ASSERT_EQ(plan_->write(b, 0, b1), 0);  // offset 0, but b's first write: a's plan stays
  EXPECT_EQ(entries(), 3u);
  EXPECT_EQ(engine_writers(), 2u);
  EXPECT_EQ(plan_->writers(), 2u);
  // Each extends at its own end, a line split across writes and the other writing in between.
  ASSERT_EQ(plan_->write(a, a1.size(), "pl/f"), 0);
  ASSERT_EQ(plan_->write(b, b1.size(), "pl/f3.bin\n"), 0);
  ASSERT_EQ(plan_->write(a, a1.size() + 4, "2.bin\npl/nope.bin\n"), 0);
  EXPECT_EQ(entries(), 5u);
  EXPECT_EQ(plan_->unresolved(), 1u);
  // stat shows the largest writer's size.
  EXPECT_EQ(plan_->size(), a1.size() + 4 + 18);
  // The other's end is no end of a writer's own plan.
  EXPECT_EQ(plan_->write(b, a1.size() + 22, "pl/f0.bin\n"), EINVAL);
  // b starts a new plan at 0: a's stays whole.
  ASSERT_EQ(plan_->write(b, 0, "pl/f1.bin\n"), 0);
  EXPECT_EQ(entries(), 4u);  // a: 3, b: 1
  EXPECT_EQ(plan_->unresolved(), 1u);
  EXPECT_EQ(engine_writers(), 2u);
}

TEST_F(PlanFileTest, AnAppendExtendsTheWritersPlanWhateverTheOffset) {
  const WriteContext a = me_;
  const WriteContext b{.writer = other_live_process(), .append = true};
  ASSERT_EQ(plan_->write(a, 0, "pl/f0.bin\npl/f1.bin\npl/f2.bin\n"), 0);
  // O_APPEND: the kernel writes at the file's size, which is a's; b starts its plan there.
  ASSERT_EQ(plan_->write(b, plan_->size(), "pl/f3.bin\n"), 0);
  EXPECT_EQ(entries(), 4u);
  EXPECT_EQ(engine_writers(), 2u);
  // And extends it at any offset, 0 included (an append never replaces).
  ASSERT_EQ(plan_->write(b, 7, "pl/f0.bin\n"), 0);
  ASSERT_EQ(plan_->write(b, 0, "pl/f1.bin\n"), 0);
  EXPECT_EQ(entries(), 6u);
  // Without O_APPEND, a wrong offset is refused, for a known writer and a new one.
  EXPECT_EQ(plan_->write({.writer = b.writer}, 7, "pl/f0.bin\n"), EINVAL);
  EXPECT_EQ(plan_->write({.writer = 1}, 5, "pl/f0.bin\n"), EINVAL);
  EXPECT_EQ(plan_->writers(), 2u);  // a refused first write leaves nothing behind
  EXPECT_EQ(entries(), 6u);
}

TEST_F(PlanFileTest, TruncatingClearsOnlyTheWritersPlan) {
  const WriteContext a = me_;
  const WriteContext b{.writer = other_live_process()};
  const std::string a1 = "pl/f0.bin\npl/f1.bin\n";
  ASSERT_EQ(plan_->write(a, 0, a1), 0);
  ASSERT_EQ(plan_->write(b, 0, "pl/f2.bin\npl/nope\n"), 0);
  EXPECT_EQ(entries(), 3u);
  EXPECT_EQ(plan_->truncate(b.writer, a1.size()), EINVAL);  // a's size, not b's
  EXPECT_EQ(plan_->truncate(a.writer, a1.size()), 0);
  EXPECT_EQ(plan_->truncate(b.writer, 0), 0);
  EXPECT_EQ(entries(), 2u);
  EXPECT_EQ(plan_->unresolved(), 0u);
  EXPECT_EQ(plan_->size(), a1.size());
  // O_TRUNC by a writer not yet known: nothing to clear.
  EXPECT_EQ(plan_->truncate(1, 0), 0);
  EXPECT_EQ(plan_->truncate(1, 5), EINVAL);
  EXPECT_EQ(entries(), 2u);
  // b writes again from 0: its plan, a new one.
  ASSERT_EQ(plan_->write(b, 0, "pl/f3.bin\n"), 0);
  EXPECT_EQ(entries(), 3u);
}

TEST(PlanFileWriters, AWriterIsGoneOnceItsProcessIs) {
  EXPECT_TRUE(PlanFile::process_exists(static_cast<uint64_t>(::getpid())));
  EXPECT_FALSE(PlanFile::process_exists(gone_process()));
  EXPECT_FALSE(PlanFile::process_exists(uint64_t{1} << 40));  // no process has such a pid
  EXPECT_TRUE(PlanFile::process_exists(0));                   // not known: never taken for gone
}

TEST_F(PlanFileTest, ANewWriterGoesOnWithTheLastGoneWritersPlanAndTheOthersAreForgotten) {
  std::set<uint64_t> live = {1, 2, 3};
  PlanFile plan(*tree_, *engine_, [&](PlanFile::Writer w) { return live.contains(w); });
  ASSERT_EQ(plan.write({.writer = 1}, 0, "pl/f0.bin\n"), 0);
  ASSERT_EQ(plan.write({.writer = 2}, 0, "pl/f1.bin\npl/f2.bin\npl/nope\n"), 0);
  ASSERT_EQ(plan.write({.writer = 3}, 0, "pl/f3.bin\n"), 0);
  EXPECT_EQ(entries(), 4u);
  EXPECT_EQ(engine_writers(), 3u);
  // 1 and 2 exit; a new writer appends (`dsfs plan --append` after `dsfs plan`): it extends the
  // plan of 2, written last, and 1's is forgotten.
  live = {3};
  ASSERT_EQ(plan.write({.writer = 4, .append = true}, 10, "pl/f0.bin\n"), 0);
  EXPECT_EQ(plan.writers(), 2u);
  EXPECT_EQ(engine_writers(), 2u);
  EXPECT_EQ(entries(), 4u);  // 2's two and the appended one, and 3's
  EXPECT_EQ(plan.unresolved(), 1u);
  EXPECT_EQ(plan.size(), 38u);
  // 4 exits; a new writer's O_TRUNC (`: > plan`) clears the plan it leaves, not 3's.
  live = {3};
  EXPECT_EQ(plan.truncate(5, 0), 0);
  EXPECT_EQ(entries(), 1u);
  EXPECT_EQ(plan.unresolved(), 0u);
  EXPECT_EQ(plan.writers(), 2u);
  // With no writer gone, a new one has an empty plan of its own: 0 is its only offset.
  live = {3, 5};
  EXPECT_EQ(plan.truncate(6, 0), 0);
  EXPECT_EQ(plan.write({.writer = 7}, 10, "pl/f0.bin\n"), EINVAL);
  EXPECT_EQ(plan.writers(), 2u);
  // And one that replaces from 0 after its predecessor exited replaces that plan in place.
  ASSERT_EQ(plan.write({.writer = 5}, 0, "pl/f1.bin\n"), 0);
  live = {3};
  ASSERT_EQ(plan.write({.writer = 8}, 0, "pl/f2.bin\npl/f3.bin\n"), 0);
  EXPECT_EQ(entries(), 3u);
  EXPECT_EQ(plan.writers(), 2u);
  EXPECT_EQ(engine_writers(), 2u);
}

// A writer that exited mid-line (no newline at the end: `cat order.txt > plan`; or killed): its
// last line is read as a line when the next writer takes the plan over. Before, it was never
// read, and the new writer's first line was glued to it ("pl/f" + "pl/f1.bin").
// A refused write or truncation was EINVAL with nothing in the log to say why.
TEST_F(PlanFileTest, ARefusedWriteOrTruncationIsLogged) {
  append("pl/f0.bin\n");
  CapturedLog log;
  EXPECT_EQ(plan_->write(me_, 5, "x\n"), EINVAL);
  EXPECT_EQ(plan_->truncate(me_.writer, 7), EINVAL);
  const std::vector<std::string> lines = log.lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("a write at offset 5, but its plan ends at 10"), std::string::npos);
  EXPECT_NE(lines[1].find("a truncation to 7, but its plan has 10 bytes"), std::string::npos);
}

TEST_F(PlanFileTest, AGoneWritersLastLineWithoutANewlineIsALineOfItsOwn) {
  std::set<uint64_t> live = {1};
  PlanFile plan(*tree_, *engine_, [&](PlanFile::Writer w) { return live.contains(w); });
  ASSERT_EQ(plan.write({.writer = 1}, 0, "pl/f0.bin\npl/f1.bin"), 0);
  EXPECT_EQ(entries(), 1u);
  live = {};
  ASSERT_EQ(plan.write({.writer = 2, .append = true}, 0, "pl/f2.bin\n"), 0);
  EXPECT_EQ(entries(), 3u);
  EXPECT_EQ(plan.unresolved(), 0u);
  // Killed mid-line: the half line is unresolved, and the next line is read as it is.
  ASSERT_EQ(plan.write({.writer = 3}, 0, "pl/f0.bin\npl/f"), 0);  // 2 is gone: 3 goes on
  EXPECT_EQ(entries(), 1u);
  ASSERT_EQ(plan.write({.writer = 4, .append = true}, 0, "pl/f1.bin\n"), 0);
  EXPECT_EQ(entries(), 2u);
  EXPECT_EQ(plan.unresolved(), 1u);
}

TEST_F(PlanFileTest, AtMost64WritersAreKeptTheLeastRecentlyWrittenGoesFirst) {
  // Every writer taken for alive, so only the bound drops them.
  PlanFile plan(*tree_, *engine_, [](PlanFile::Writer) { return true; });
  for (uint64_t w = 1; w <= kMaxPlanWriters; ++w) {
    ASSERT_EQ(plan.write({.writer = w}, 0, "pl/f0.bin\n"), 0);
  }
  EXPECT_EQ(engine_writers(), kMaxPlanWriters);
  ASSERT_EQ(plan.write({.writer = 1}, 10, "pl/f1.bin\n"), 0);  // 1 is now the latest
  ASSERT_EQ(plan.write({.writer = 1000}, 0, "pl/f2.bin\n"), 0);
  EXPECT_EQ(plan.writers(), kMaxPlanWriters);
  EXPECT_EQ(engine_writers(), kMaxPlanWriters);
  EXPECT_EQ(entries(), kMaxPlanWriters + 1);  // writer 2 (1 entry) went, 1000 came
  // Writer 2 was forgotten: its next write at its old end is no end of a plan it has.
  EXPECT_EQ(plan.write({.writer = 2}, 10, "pl/f3.bin\n"), EINVAL);
  EXPECT_EQ(plan.write({.writer = 1}, 20, "pl/f3.bin\n"), 0);  // 1 kept its plan
}

}  // namespace
}  // namespace dsfs::fs
