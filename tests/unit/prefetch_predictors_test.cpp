// Predictors, scoring, leader choice and epoch detection on synthetic traces (no I/O).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <unordered_set>
#include <vector>

#include "prefetch/predictors.h"

namespace dsfs::prefetch {
namespace {

// One dataset: entry 0 is its root directory, then `files` files (and a directory every 100
// entries, as class folders would be).
MountShape shape_with(uint32_t files) {
  std::vector<bool> is_file;
  is_file.push_back(false);
  uint32_t made = 0;
  while (made < files) {
    if (is_file.size() % 100 == 1) is_file.push_back(false);
    is_file.push_back(true);
    ++made;
  }
  return MountShape{.is_file = {is_file}};
}

std::vector<FileId> files_of(const MountShape& shape) {
  std::vector<FileId> out;
  for (uint32_t e = 0; e < shape.is_file[0].size(); ++e) {
    if (shape.is_file[0][e]) out.push_back(file_id(0, e));
  }
  return out;
}

std::vector<FileId> shuffled(std::vector<FileId> files, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::shuffle(files.begin(), files.end(), random);
  return files;
}

// A prefetcher with unlimited bandwidth and room for `room` files ahead: before each access it
// takes proposals until `room` are waiting; an access hits when its file was fetched ahead.
// The writer of a plan when a test has one (the plan file keys plans by the writing process).
constexpr PlansPredictor::Writer kWriter = 1;

struct Simulation {
  Simulation(PredictionModel& m, size_t r) : model(m), room(r) {}
  PredictionModel& model;
  size_t room;
  std::unordered_set<FileId> ahead;
  uint64_t hits = 0;
  uint64_t accesses = 0;

  void access(FileId file) {
    while (ahead.size() < room) {
      const std::optional<Proposal> p = model.propose();
      if (!p) break;
      ahead.insert(p->file);
    }
    ++accesses;
    if (ahead.erase(file)) ++hits;
    if (model.observe(file)) ahead.clear();  // a new epoch: last epoch's guesses are stale
  }
  double hit_rate() const { return accesses == 0 ? 0 : static_cast<double>(hits) / accesses; }
  void reset_counts() { hits = accesses = 0; }
};

TEST(EpochTracker, ARunOfRereadsBeginsANewEpochAndCarriesThem) {
  const MountShape shape = shape_with(1000);
  EpochTracker epochs(shape);
  const std::vector<FileId> files = files_of(shape);
  for (const FileId f : files) EXPECT_FALSE(epochs.observe(f));
  EXPECT_EQ(epochs.epoch(), 1u);
  EXPECT_EQ(epochs.read_count(), 1000u);
  size_t seen = 0;
  bool began = false;
  for (const FileId f : shuffled(files, 3)) {
    ++seen;
    if (epochs.observe(f)) {
      began = true;
      break;
    }
  }
  ASSERT_TRUE(began);
  EXPECT_EQ(seen, EpochTracker::kRepeats);  // every access was a re-read
  EXPECT_EQ(epochs.epoch(), 2u);
  EXPECT_EQ(epochs.carried_over(), seen);
  EXPECT_EQ(epochs.read_count(), seen);  // those re-reads are this epoch's first reads
}

TEST(EpochTracker, AFewRereadsWithinAnEpochDoNotEndIt) {
  const MountShape shape = shape_with(1000);
  EpochTracker epochs(shape);
  const std::vector<FileId> files = files_of(shape);
  for (size_t i = 0; i < 500; ++i) {
    EXPECT_FALSE(epochs.observe(files[i]));
    if (i % 4 == 3) {
      EXPECT_FALSE(epochs.observe(files[i - 1]));  // a second process re-reads
    }
  }
  EXPECT_EQ(epochs.epoch(), 1u);
}

TEST(Predictors, SequentialReadsAreFollowedInDirectoryOrder) {
  PredictionModel model(shape_with(5000));
  model.set_lookahead(64);
  Simulation sim{model, 64};
  const std::vector<FileId> files = files_of(model.shape());
  for (size_t i = 0; i < 200; ++i) sim.access(files[i]);
  EXPECT_EQ(model.leader(), "sequential");
  sim.reset_counts();
  for (size_t i = 200; i < files.size(); ++i) sim.access(files[i]);
  EXPECT_GT(sim.hit_rate(), 0.99);
}

// When the lookahead covers every unread file, the unread set foresees every read too; an order
// that does as well is worth more (the view renders ahead only what comes in a known order).
TEST(Predictors, AnOrderForeseenAsWellAsTheUnreadSetLeads) {
  PredictionModel model(shape_with(300));
  model.set_lookahead(1000);
  Simulation sim{model, 1000};
  const std::vector<FileId> files = files_of(model.shape());
  for (size_t i = 0; i < 150; ++i) sim.access(files[i]);
  EXPECT_EQ(model.leader(), "sequential");
}

TEST(Predictors, SequentialToleratesSeveralWorkersReadingSideBySide) {
  PredictionModel model(shape_with(6000));
  model.set_lookahead(512);
  Simulation sim{model, 512};
  const std::vector<FileId> files = files_of(model.shape());
  // 4 workers each take a batch of 32 in turn; their reads interleave.
  for (size_t base = 0; base + 128 <= files.size(); base += 128) {
    for (size_t i = 0; i < 32; ++i) {
      for (size_t w = 0; w < 4; ++w) sim.access(files[base + w * 32 + i]);
    }
  }
  EXPECT_EQ(model.leader(), "sequential");
  EXPECT_GT(sim.hit_rate(), 0.95);
}

// Shuffled epochs with a seed nobody told us: the unread set leads, and a prefetcher holding k
// files ahead hits as often as any policy can without the order, k/N (1 + ln(N/k)).
TEST(Predictors, ShuffledEpochsReachTheBoundOfAnyOrderBlindPolicy) {
  constexpr uint32_t kFiles = 20000;
  for (const double fraction : {0.05, 0.1, 0.25, 0.5}) {
    PredictionModel model(shape_with(kFiles), 42);
    const auto room = static_cast<size_t>(fraction * kFiles);
    model.set_lookahead(room);
    Simulation sim{model, room};
    const std::vector<FileId> files = files_of(model.shape());
    for (const FileId f : shuffled(files, 1)) sim.access(f);
    sim.reset_counts();
    for (uint64_t epoch = 2; epoch <= 3; ++epoch) {
      for (const FileId f : shuffled(files, epoch)) sim.access(f);
    }
    const double bound = fraction * (1 + std::log(1 / fraction));
    EXPECT_EQ(model.leader(), "unread-set") << fraction;
    EXPECT_EQ(model.epochs().epoch(), 3u) << fraction;
    EXPECT_NEAR(sim.hit_rate(), bound, 0.03) << "cache " << fraction;
  }
}

TEST(Predictors, AnExpectedDatasetIsGuessedBeforeAnyRead) {
  PredictionModel model(shape_with(1000), 7);
  model.set_lookahead(50);
  EXPECT_FALSE(model.propose().has_value());  // nothing read, nothing expected: no guess
  model.expect_dataset(0);
  std::set<FileId> guessed;
  while (const std::optional<Proposal> p = model.propose()) {
    EXPECT_TRUE(model.shape().contains(p->file));
    EXPECT_TRUE(model.shape().is_file[0][entry_of(p->file)]);
    guessed.insert(p->file);
  }
  EXPECT_EQ(guessed.size(), 50u);  // the lookahead's worth, each once
  // The first read takes one guess; the sample is topped up with one more file.
  const FileId first = *guessed.begin();
  model.observe(first);
  const std::optional<Proposal> next = model.propose();
  ASSERT_TRUE(next.has_value());
  EXPECT_FALSE(guessed.contains(next->file));
}

TEST(Predictors, ARepeatedOrderIsLearnedFromTheLastEpoch) {
  PredictionModel model(shape_with(4000));
  model.set_lookahead(200);
  Simulation sim{model, 200};
  const std::vector<FileId> order = shuffled(files_of(model.shape()), 9);
  for (const FileId f : order) sim.access(f);
  sim.reset_counts();
  for (const FileId f : order) sim.access(f);
  EXPECT_EQ(model.leader(), "repeat");
  // The first re-reads only reveal the new epoch; after that, nearly everything is foreseen.
  EXPECT_GT(sim.hit_rate(), 0.95);
}

// Reads of files the model does not know (a file handle of the generation before a refresh,
// whose catalogue was larger, or a dataset not predicted for) are not predicted for. The repeat
// predictor once kept them for its next epoch and indexed its table with them there: the mount
// crashed after a generation switch under random reads with a small cache.
TEST(Predictors, ReadsOfFilesTheModelDoesNotKnowAreIgnoredAcrossEpochs) {
  PredictionModel model(shape_with(400));
  model.set_lookahead(50);
  const std::vector<FileId> order = shuffled(files_of(model.shape()), 5);
  const std::vector<FileId> unknown = {file_id(0, 2'000'000'000), file_id(0, 401'000),
                                       file_id(7, 3), file_id(1'000'000, 1'000'000)};
  for (int epoch = 0; epoch < 4; ++epoch) {
    for (size_t i = 0; i < order.size(); ++i) {
      model.observe(order[i]);
      if (i % 40 == 0) {
        for (const FileId f : unknown) EXPECT_FALSE(model.observe(f));
      }
      for (int k = 0; k < 60 && model.propose(); ++k) {
      }
    }
  }
  EXPECT_GE(model.epochs().epoch(), 4u);
  EXPECT_EQ(model.leader(), "repeat");  // the unknown reads did not spoil the order learned
}

TEST(Predictors, APlanLeadsAtOnceAndIsFollowedExactly) {
  PredictionModel model(shape_with(3000));
  model.set_lookahead(100);
  Simulation sim{model, 100};
  const std::vector<FileId> order = shuffled(files_of(model.shape()), 5);
  for (const FileId f : order) model.plan_append(kWriter, f);
  model.plan_published(true);
  EXPECT_EQ(model.leader(), "plan");
  for (const FileId f : order) sim.access(f);
  EXPECT_EQ(sim.hits, sim.accesses);  // every single read was fetched ahead
  EXPECT_EQ(model.plan().position(), order.size());
}

TEST(Predictors, APlanReadByWorkersOutOfOrderStillLeads) {
  PredictionModel model(shape_with(3000));
  model.set_lookahead(1000);
  Simulation sim{model, 1000};
  const std::vector<FileId> order = shuffled(files_of(model.shape()), 6);
  for (const FileId f : order) model.plan_append(kWriter, f);
  model.plan_published(true);
  // 8 workers, batches of 64 each, interleaved.
  for (size_t base = 0; base + 512 <= order.size(); base += 512) {
    for (size_t i = 0; i < 64; ++i) {
      for (size_t w = 0; w < 8; ++w) sim.access(order[base + w * 64 + i]);
    }
  }
  EXPECT_EQ(model.leader(), "plan");
  EXPECT_GT(sim.hit_rate(), 0.99);
}

TEST(Predictors, APlanTheLoaderIgnoresLosesTheLead) {
  PredictionModel model(shape_with(3000));
  model.set_lookahead(100);
  Simulation sim{model, 100};
  const std::vector<FileId> files = files_of(model.shape());
  for (const FileId f : shuffled(files, 7)) model.plan_append(kWriter, f);
  model.plan_published(true);
  for (size_t i = 0; i < 300; ++i) sim.access(files[i]);  // but it reads in directory order
  EXPECT_EQ(model.leader(), "sequential");
}

// Two DDP ranks on one mount: each writes its half of the epoch as its own plan and reads it at
// its own pace; every read of either was fetched ahead.
TEST(Predictors, TwoWritersPlansAreEachFollowedAtTheirOwnPosition) {
  PredictionModel model(shape_with(3000));
  model.set_lookahead(200);
  Simulation sim{model, 200};
  const std::vector<FileId> order = shuffled(files_of(model.shape()), 12);
  const std::vector<FileId> rank0(order.begin(), order.begin() + 1500);
  const std::vector<FileId> rank1(order.begin() + 1500, order.end());
  for (const FileId f : rank0) model.plan_append(1, f);
  model.plan_published(true);
  for (const FileId f : rank1) model.plan_append(2, f);
  model.plan_published(true);
  EXPECT_EQ(model.plan().writers(), 2u);
  EXPECT_EQ(model.plan().entries(), 3000u);
  EXPECT_EQ(model.leader(), "plan");
  // Rank 1 reads twice as fast as rank 0 for a while, then rank 0 catches up.
  size_t next0 = 0;
  size_t next1 = 0;
  while (next1 < rank1.size()) {
    sim.access(rank1[next1++]);
    if (next1 < rank1.size()) sim.access(rank1[next1++]);
    if (next0 < rank0.size()) sim.access(rank0[next0++]);
  }
  while (next0 < rank0.size()) sim.access(rank0[next0++]);
  EXPECT_EQ(sim.hits, sim.accesses);
  EXPECT_EQ(model.plan().position(), 3000u);
}

// A second writer does not replace the first one's plan, and forgetting a writer drops only its
// plan.
TEST(Predictors, AWritersPlanIsClearedAndForgottenAloneAndItsShareOfTheLookaheadReturns) {
  PredictionModel model(shape_with(1000));
  model.set_lookahead(100);
  const std::vector<FileId> order = shuffled(files_of(model.shape()), 13);
  for (size_t i = 0; i < 500; ++i) model.plan_append(1, order[i]);
  model.plan_published(true);
  for (size_t i = 500; i < 1000; ++i) model.plan_append(2, order[i]);
  model.plan_published(true);
  // With two plans, each gets half the lookahead: 50 proposals from each, 100 in all.
  std::unordered_set<FileId> proposed;
  while (const std::optional<Proposal> p = model.propose()) proposed.insert(p->file);
  EXPECT_EQ(proposed.size(), 100u);
  for (size_t i = 0; i < 50; ++i) {
    EXPECT_TRUE(proposed.count(order[i])) << i;
    EXPECT_TRUE(proposed.count(order[500 + i])) << i;
  }
  model.plan_clear(1);
  EXPECT_EQ(model.plan().entries(), 500u);
  model.plan_forget(1);
  model.plan_forget(2);
  EXPECT_EQ(model.plan().writers(), 0u);
  EXPECT_FALSE(model.propose());
  // A plan alone again has the whole lookahead.
  for (size_t i = 0; i < 1000; ++i) model.plan_append(3, order[i]);
  model.plan_published(true);
  proposed.clear();
  while (const std::optional<Proposal> p = model.propose()) proposed.insert(p->file);
  EXPECT_EQ(proposed.size(), 100u);
}

// A file listed by two plans (DistributedSampler pads the last ranks with repeats) counts against
// the plan that expects it soonest.
TEST(Predictors, AFileInTwoPlansCountsAgainstThePlanThatExpectsItSoonest) {
  PredictionModel model(shape_with(100));
  model.set_lookahead(10);
  const std::vector<FileId> files = files_of(model.shape());
  // Plan 1 lists files[50] last; plan 2 lists it first.
  for (size_t i = 0; i <= 50; ++i) model.plan_append(1, files[i]);
  model.plan_append(2, files[50]);
  for (size_t i = 51; i < 100; ++i) model.plan_append(2, files[i]);
  model.plan_published(true);
  model.observe(files[50]);
  // Plan 2 moved on; plan 1 still expects files[50] after its first 50.
  EXPECT_EQ(model.plan().position(), 1u);
  for (size_t i = 0; i < 50; ++i) model.observe(files[i]);
  EXPECT_EQ(model.plan().position(), 51u);
}

// The plans of every writer together keep at most max_entries(): a loader that appends each
// epoch's order to the last one instead of replacing it stops growing the mount's memory there.
// A cleared or forgotten plan gives its room back; a file not of the mount's is not counted.
TEST(Predictors, ThePlansHoldABoundedNumberOfEntries) {
  const MountShape big = shape_with(300'000);  // its entries: the files and their directories
  EXPECT_EQ(PredictionModel(big).plan().max_entries(),
            PlansPredictor::kPlanEntriesPerFile * big.is_file[0].size());
  PredictionModel model(shape_with(1000));
  const PlansPredictor& plans = model.plan();
  ASSERT_EQ(plans.max_entries(), PlansPredictor::kMinPlanEntries);
  const std::vector<FileId> files = files_of(model.shape());
  EXPECT_FALSE(model.plan_append(1, file_id(0, 5000)));
  uint64_t kept = 0;
  for (uint64_t i = 0; i < plans.max_entries() + 500; ++i) {
    kept += model.plan_append(1, files[i % files.size()]) ? 1 : 0;
  }
  EXPECT_EQ(kept, plans.max_entries());
  EXPECT_EQ(plans.entries(), plans.max_entries());
  EXPECT_FALSE(model.plan_append(2, files[0])) << "a second writer is bounded too";
  model.plan_clear(1);
  EXPECT_EQ(plans.entries(), 0u);
  EXPECT_TRUE(model.plan_append(2, files[0]));
  EXPECT_TRUE(model.plan_append(1, files[1]));
  model.plan_forget(2);
  EXPECT_EQ(plans.entries(), 1u);
}

TEST(Predictors, ReplacingThePlanBeginsANewEpoch) {
  PredictionModel model(shape_with(1000));
  model.set_lookahead(50);
  const std::vector<FileId> files = files_of(model.shape());
  for (const FileId f : files) model.observe(f);
  EXPECT_EQ(model.epochs().epoch(), 1u);
  const std::vector<FileId> next = shuffled(files, 8);
  for (const FileId f : next) model.plan_append(kWriter, f);
  model.plan_published(true);
  EXPECT_EQ(model.epochs().epoch(), 2u);
  // Files read last epoch are proposed again at once, in the plan's order.
  for (size_t i = 0; i < 10; ++i) {
    const std::optional<Proposal> p = model.propose();
    ASSERT_TRUE(p);
    EXPECT_EQ(p->file, next[i]);
  }
}

// A loader that changes its pattern is followed within a few hundred accesses.
TEST(Predictors, ASwitchOfPatternIsNoticedWithinAFewHundredAccesses) {
  constexpr uint32_t kFiles = 10000;
  PredictionModel model(shape_with(kFiles), 11);
  model.set_lookahead(500);
  Simulation sim{model, 500};
  const std::vector<FileId> files = files_of(model.shape());
  for (size_t i = 0; i < 3000; ++i) sim.access(files[i]);
  ASSERT_EQ(model.leader(), "sequential");
  // Now a shuffled pass over the rest of this epoch.
  std::vector<FileId> rest(files.begin() + 3000, files.end());
  rest = shuffled(rest, 12);
  size_t switched_after = 0;
  for (size_t i = 0; i < rest.size(); ++i) {
    sim.access(rest[i]);
    if (model.leader() == "unread-set") {
      switched_after = i + 1;
      break;
    }
  }
  EXPECT_GT(switched_after, 0u);
  EXPECT_LT(switched_after, 300u);
  // And back: a second, sequential epoch.
  for (size_t i = switched_after; i < rest.size(); ++i) sim.access(rest[i]);
  size_t back_after = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    sim.access(files[i]);
    if (model.leader() == "sequential" || model.leader() == "repeat") {
      back_after = i + 1;
      break;
    }
  }
  EXPECT_GT(back_after, 0u);
  EXPECT_LT(back_after, 300u);
}

TEST(Predictors, ScoresCountWhatEachForesaw) {
  PredictionModel model(shape_with(2000));
  model.set_lookahead(100);
  const std::vector<FileId> files = files_of(model.shape());
  for (const FileId f : files) model.observe(f);
  bool saw_sequential = false;
  bool saw_plan = false;
  for (const PredictorScore& s : model.scores()) {
    if (s.name == "sequential") {
      saw_sequential = true;
      EXPECT_EQ(s.scored, files.size());
      EXPECT_GE(s.foreseen, files.size() - 1);
      EXPECT_GT(s.score, 0.99);
    }
    if (s.name == "plan") {
      saw_plan = true;
      EXPECT_EQ(s.scored, 0u);  // no plan: not scored
    }
  }
  // A renamed predictor must fail here, not skip the checks above.
  EXPECT_TRUE(saw_sequential) << "no predictor named 'sequential' in the scores";
  EXPECT_TRUE(saw_plan) << "no predictor named 'plan' in the scores";
}

}  // namespace
}  // namespace dsfs::prefetch
