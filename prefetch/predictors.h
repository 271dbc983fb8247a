#pragma once
// Access-order prediction: several predictors watch every access, each is scored online by how
// many of the next real accesses it foresaw, and the best one leads the prefetching. Pure logic
// (no I/O, no clock), so it is tested on synthetic traces.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

namespace dsfs::prefetch {

// A file of the mount: dataset index << 32 | catalogue entry.
using FileId = uint64_t;
inline constexpr FileId file_id(uint32_t dataset, uint32_t entry) {
  return uint64_t{dataset} << 32 | entry;
}
inline constexpr uint32_t dataset_of(FileId file) {
  return static_cast<uint32_t>(file >> 32);
}
inline constexpr uint32_t entry_of(FileId file) {
  return static_cast<uint32_t>(file);
}

// Which catalogue entries of each mounted dataset are files, in catalogue (directory) order.
struct MountShape {
  std::vector<std::vector<bool>> is_file;  // [dataset][entry]
  bool contains(FileId file) const;
  bool file(FileId file) const {
    return contains(file) && is_file[dataset_of(file)][entry_of(file)];
  }
};

// Which files have been read this epoch, and where epochs begin: a shuffled or repeated epoch
// reads every file once, so a run of accesses to files already read means a new epoch.
class EpochTracker {
 public:
  explicit EpochTracker(const MountShape& shape);
  // Records an access; true when it begins a new epoch (the tracker has then already moved the
  // recent re-reads that began it into the new epoch).
  bool observe(FileId file);
  bool read(FileId file) const;
  // Begins a new epoch now (a loader announced one by replacing the plan).
  void begin_epoch();
  uint64_t epoch() const { return epoch_; }  // 1 for the first
  uint64_t read_count() const { return read_count_; }
  // Accesses at the end of the last epoch that really began the new one.
  size_t carried_over() const { return carried_over_; }

  static constexpr size_t kWindow = 32;   // recent accesses looked at
  static constexpr size_t kRepeats = 16;  // of which this many re-reads begin an epoch

 private:
  void set_read(FileId file);
  std::vector<std::vector<uint64_t>> read_;  // bitsets [dataset][entry]
  uint64_t read_count_ = 0;
  uint64_t epoch_ = 1;
  struct Recent {
    FileId file;
    bool repeat;
  };
  std::vector<Recent> recent_;  // ring of the last kWindow accesses
  size_t recent_next_ = 0;
  size_t recent_repeats_ = 0;
  size_t carried_over_ = 0;
};

// A file to fetch ahead, and when it is expected: `rank` grows with the distance ahead (see
// ObjectCache::begin_prefetch); files of no known order get ObjectCache::kUnorderedRank.
struct Proposal {
  FileId file;
  uint64_t rank;
};

class Predictor {
 public:
  virtual ~Predictor() = default;
  virtual std::string_view name() const = 0;
  // Whether this predictor can say anything now (the plan predictor needs a plan, repeat needs
  // a finished epoch).
  virtual bool ready() const = 0;
  // Learns of an access; returns whether it had expected it among the next accesses.
  virtual bool observe(FileId file) = 0;
  virtual void new_epoch() {}
  // The next file to fetch ahead, continuing from the last proposal; nullopt when none is left.
  // `now` is the number of accesses seen so far (ranks are now + distance ahead).
  virtual std::optional<Proposal> propose(uint64_t now) = 0;
  // Starts proposing again from the current position (the predictor has just become leader).
  virtual void restart() = 0;
  // How many files ahead the prefetcher can hold (the cache's room, in files).
  void set_lookahead(size_t files) { lookahead_ = files == 0 ? 1 : files; }

 protected:
  size_t lookahead_ = 1;
};

// Predictors whose guess is an order: a reader at position p will next read p+1, p+2, ...
// An access within a window around the current position counts as foreseen; several loader
// workers read a little out of order, hence the window behind as well as ahead.
class OrderedPredictor : public Predictor {
 public:
  bool observe(FileId file) override;
  std::optional<Proposal> propose(uint64_t now) override;
  // From a window behind the position: other workers' stragglers are still to be read.
  void restart() override { proposed_ = cursor_ > window() ? cursor_ - window() : 0; }
  // Files proposed just before the epoch began were skipped as read: propose them again.
  void new_epoch() override { restart(); }

 protected:
  virtual std::optional<uint64_t> position(FileId file) const = 0;
  virtual std::optional<FileId> at(uint64_t position) const = 0;  // nullopt: not a file
  virtual uint64_t length() const = 0;
  uint64_t window() const;
  void reset_cursor() { cursor_ = proposed_ = 0; }

 private:
  uint64_t cursor_ = 0;    // the position after the latest access
  uint64_t proposed_ = 0;  // the next position to propose
};

// Reads follow catalogue (directory) order, dataset after dataset: cp, tar, md5sum, loaders
// without shuffling.
class SequentialPredictor final : public OrderedPredictor {
 public:
  explicit SequentialPredictor(const MountShape& shape);
  std::string_view name() const override { return "sequential"; }
  bool ready() const override { return true; }

 private:
  std::optional<uint64_t> position(FileId file) const override;
  std::optional<FileId> at(uint64_t position) const override;
  uint64_t length() const override { return total_; }
  const MountShape& shape_;
  std::vector<uint64_t> base_;  // first position of each dataset
  uint64_t total_ = 0;
};

// This epoch reads in the previous epoch's order (fixed seeds, validation passes).
class RepeatPredictor final : public OrderedPredictor {
 public:
  explicit RepeatPredictor(const MountShape& shape);
  std::string_view name() const override { return "repeat"; }
  bool ready() const override { return !previous_.empty(); }
  bool observe(FileId file) override;
  // `carried_over`: how many of the latest accesses already belong to the new epoch.
  void begin_epoch(size_t carried_over);

 private:
  std::optional<uint64_t> position(FileId file) const override;
  std::optional<FileId> at(uint64_t position) const override;
  uint64_t length() const override { return previous_.size(); }
  std::vector<FileId> current_;
  std::vector<FileId> previous_;
  std::vector<std::vector<uint32_t>> position_;  // [dataset][entry] in previous_, or kNone
  size_t position_capacity_ = 0;                 // entries of all datasets
  static constexpr uint32_t kNone = UINT32_MAX;
};

// The exact order a loader announced in MOUNT/.dsfs/plan. Several epochs may be appended; a
// file listed several times is matched to its earliest occurrence not yet read.
class PlanPredictor final : public Predictor {
 public:
  explicit PlanPredictor(const MountShape& shape);
  std::string_view name() const override { return "plan"; }
  bool ready() const override { return frontier_ < plan_.size(); }
  bool observe(FileId file) override;
  std::optional<Proposal> propose(uint64_t now) override;
  void restart() override { proposed_ = frontier_; }

  void clear();
  // False when `file` is not one of the mount's (and is not listed).
  bool append(FileId file);
  uint64_t entries() const { return plan_.size(); }
  uint64_t position() const { return frontier_; }  // entries read, counting from the start
  // Calls `fn` with each entry not read yet, in order.
  void for_each_unread(const std::function<void(FileId)>& fn) const;
  // How far past the frontier the plan lists `file` unread, if it does.
  std::optional<uint64_t> distance(FileId file) const;
  // How far past the frontier the last proposal was.
  uint64_t lead() const { return proposed_ > frontier_ ? proposed_ - frontier_ : 0; }

 private:
  std::vector<FileId> plan_;
  std::vector<bool> read_;
  std::vector<uint32_t> next_same_;           // next position of the same file, or kNone
  std::vector<std::vector<uint32_t>> first_;  // [dataset][entry]: earliest unread position
  std::vector<std::vector<uint32_t>> last_;   // [dataset][entry]: latest position listed
  uint64_t frontier_ = 0;                     // the earliest position not yet read
  uint64_t proposed_ = 0;
  static constexpr uint32_t kNone = UINT32_MAX;
};

// Every writer's plan: each loader process (a DDP rank) writes MOUNT/.dsfs/plan for itself, and
// the ranks sharing a mount read side by side. An access counts against the plan that lists it
// soonest; proposals come from the plan whose lead is shortest, so each rank is fetched for at
// its own position; the lookahead (the cache's room) is shared evenly by the plans with files
// left. Each plan holds 8 bytes per file of the mount besides its entries, so the plan file keeps
// the number of writers bounded and forgets those that are gone; the entries of every plan
// together are bounded by max_entries() (about 12 bytes each), so a loader that appends each
// epoch's order instead of replacing it cannot grow the mount's memory without end.
class PlansPredictor final : public Predictor {
 public:
  using Writer = uint64_t;
  // Entries the plans may hold together: kPlanEntriesPerFile per entry of the mount (file or
  // directory: as many epochs ahead, and some), at least kMinPlanEntries.
  static constexpr uint64_t kPlanEntriesPerFile = 16;
  static constexpr uint64_t kMinPlanEntries = uint64_t{1} << 22;
  explicit PlansPredictor(const MountShape& shape);
  std::string_view name() const override { return "plan"; }
  bool ready() const override;
  bool observe(FileId file) override;
  std::optional<Proposal> propose(uint64_t now) override;
  void restart() override;

  void clear(Writer writer);
  // False when the entry is not listed: a file not of the mount's, or the plans already hold
  // max_entries() together.
  bool append(Writer writer, FileId file);
  void forget(Writer writer);
  uint64_t entries() const { return entries_; }  // every plan's
  uint64_t max_entries() const { return max_entries_; }
  uint64_t position() const;             // entries read, every plan's
  bool lists_unread(FileId file) const;  // some plan lists `file` at a position not read yet
  size_t writers() const { return plans_.size(); }
  // Appends to this one what `other` (of another shape) has not read yet of each writer's plan,
  // in order; entries this shape lacks are dropped. Returns the entries carried.
  uint64_t carry_unread_from(const PlansPredictor& other);

 private:
  PlanPredictor* find(Writer writer) const;
  const MountShape& shape_;
  uint64_t max_entries_ = 0;
  uint64_t entries_ = 0;  // every plan's
  std::vector<std::pair<Writer, std::unique_ptr<PlanPredictor>>> plans_;
};

// A shuffled epoch reads every file once: any file not read yet this epoch is as likely as any
// other to come next. It keeps a random sample of `lookahead` unread files (its guess) and
// scores on whether accesses fall in it, which is the best anyone can do without the seed.
class UnreadSetPredictor final : public Predictor {
 public:
  UnreadSetPredictor(const MountShape& shape, const EpochTracker& epochs, uint64_t seed);
  std::string_view name() const override { return "unread-set"; }
  bool ready() const override { return true; }
  bool observe(FileId file) override;
  void new_epoch() override;
  std::optional<Proposal> propose(uint64_t now) override;
  void restart() override;
  // Samples `dataset`'s files before any of them is read (a warm start; observe() includes a
  // dataset at its first access otherwise).
  void expect(uint32_t dataset);

 private:
  void include_dataset(uint32_t dataset);
  void top_up();
  bool in_sample(FileId file) const;
  void set_in_sample(FileId file, bool in);
  const MountShape& shape_;
  const EpochTracker& epochs_;
  std::mt19937_64 random_;
  std::vector<bool> included_;             // datasets whose files are in order_
  std::vector<FileId> order_;              // a random order of the included datasets' files
  size_t next_ = 0;                        // next of order_ to sample
  std::vector<std::vector<bool>> sample_;  // [dataset][entry]
  size_t sample_size_ = 0;
  std::vector<FileId> to_propose_;  // sampled, not yet proposed (a stack)
};

struct PredictorScore {
  std::string_view name;
  double score = 0;       // recent fraction of accesses foreseen (exponentially weighted)
  uint64_t foreseen = 0;  // accesses foreseen, all told
  uint64_t scored = 0;    // accesses scored while ready
  bool ready = false;
};

// The predictors together: scores them, picks the leader and hands out its proposals.
// Thread safety: not synchronized. PrefetchEngine owns one and calls it only under its mutex_.
class PredictionModel {
 public:
  explicit PredictionModel(MountShape shape, uint64_t seed = 0x5eed);

  // Records an access. True when it began a new epoch. A file not in the shape (a handle of an
  // earlier generation's catalogue, a dataset not predicted for) is counted and otherwise ignored.
  bool observe(FileId file);
  // The leader's next proposal, skipping files read this epoch; nullopt when it has none.
  std::optional<Proposal> propose();
  void set_lookahead(size_t files);

  // The plans, one per writer (PlansPredictor).
  void plan_clear(PlansPredictor::Writer writer);
  bool plan_append(PlansPredictor::Writer writer, FileId file);  // PlansPredictor::append
  void plan_forget(PlansPredictor::Writer writer);
  // A new plan is trusted at once: it leads until the accesses stop matching it. A plan that
  // replaced its writer's last one begins a new epoch.
  // Returns whether it began a new epoch.
  bool plan_published(bool replaced);
  // After a reshape (a dataset published or removed): what `old` had not read yet of every
  // writer's plan, for the datasets this shape keeps, is this model's plan, and leads. Returns
  // the entries carried.
  uint64_t carry_plans_from(const PredictionModel& old);
  // Before any read: guess `dataset`'s files as the unread set does (a shuffled epoch of it is
  // coming), so that propose() has files of it to offer.
  void expect_dataset(uint32_t dataset);

  std::string_view leader() const { return predictors_[leader_]->name(); }
  std::vector<PredictorScore> scores() const;
  const EpochTracker& epochs() const { return epochs_; }
  const PlansPredictor& plan() const { return *plan_; }
  uint64_t accesses() const { return accesses_; }
  const MountShape& shape() const { return shape_; }

  // Score weight of each new access: a change of pattern shows within a few dozen accesses.
  static constexpr double kScoreWeight = 1.0 / 32;
  // A challenger must beat the leader by this much to take over (no flapping on noise).
  static constexpr double kHysteresis = 0.05;

 private:
  void choose_leader();
  void begin_epoch(size_t carried_over);
  MountShape shape_;
  EpochTracker epochs_;
  std::vector<std::unique_ptr<Predictor>> predictors_;  // in order of preference on ties
  std::vector<PredictorScore> scores_;
  PlansPredictor* plan_;
  RepeatPredictor* repeat_;
  UnreadSetPredictor* unread_;
  size_t leader_;
  uint64_t accesses_ = 0;
};

}  // namespace dsfs::prefetch
