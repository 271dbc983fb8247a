#include "prefetch/predictors.h"

#include <algorithm>

#include "prefetch/object_cache.h"

namespace dsfs::prefetch {

bool MountShape::contains(FileId file) const {
  const uint32_t d = dataset_of(file);
  return d < is_file.size() && entry_of(file) < is_file[d].size();
}

// --- EpochTracker ---

EpochTracker::EpochTracker(const MountShape& shape) : recent_(kWindow, Recent{0, false}) {
  read_.reserve(shape.is_file.size());
  for (const auto& files : shape.is_file) read_.emplace_back((files.size() + 63) / 64, 0);
}

bool EpochTracker::read(FileId file) const {
  const uint32_t d = dataset_of(file);
  const uint32_t e = entry_of(file);
  if (d >= read_.size() || e / 64 >= read_[d].size()) return false;
  return (read_[d][e / 64] >> (e % 64)) & 1;
}

void EpochTracker::set_read(FileId file) {
  const uint32_t d = dataset_of(file);
  const uint32_t e = entry_of(file);
  if (d >= read_.size() || e / 64 >= read_[d].size()) return;
  uint64_t& word = read_[d][e / 64];
  const uint64_t bit = uint64_t{1} << (e % 64);
  if (!(word & bit)) ++read_count_;
  word |= bit;
}

bool EpochTracker::observe(FileId file) {
  const bool repeat = read(file);
  Recent& slot = recent_[recent_next_];
  if (slot.repeat) --recent_repeats_;
  slot = Recent{file, repeat};
  if (repeat) ++recent_repeats_;
  recent_next_ = (recent_next_ + 1) % kWindow;
  set_read(file);
  if (recent_repeats_ < kRepeats) return false;
  // A new epoch. The re-reads that revealed it are its first accesses.
  begin_epoch();
  for (size_t i = 0; i < kWindow; ++i) {
    // Oldest first, so carried_over_ counts from the first re-read on.
    Recent& r = recent_[(recent_next_ + i) % kWindow];
    if (r.repeat || carried_over_ > 0) {
      ++carried_over_;
      set_read(r.file);
    }
    r.repeat = false;
  }
  recent_repeats_ = 0;
  return true;
}

void EpochTracker::begin_epoch() {
  for (auto& words : read_) std::fill(words.begin(), words.end(), 0);
  read_count_ = 0;
  carried_over_ = 0;
  ++epoch_;
}

// --- OrderedPredictor ---

uint64_t OrderedPredictor::window() const {
  // Wide enough for several loader workers reading their batches side by side, narrow enough
  // that a random order rarely lands in it.
  return std::clamp<uint64_t>(length() / 32, 16, 1024);
}

bool OrderedPredictor::observe(FileId file) {
  const std::optional<uint64_t> p = position(file);
  if (!p) return false;
  const uint64_t w = window();
  const bool foreseen = *p + w >= cursor_ && *p < cursor_ + w;
  cursor_ = foreseen ? std::max(cursor_, *p + 1) : *p + 1;
  // A jump (a new pass, or another file altogether) restarts the proposals from there.
  if (!foreseen) proposed_ = cursor_;
  return foreseen;
}

std::optional<Proposal> OrderedPredictor::propose(uint64_t now) {
  const uint64_t end = std::min(length(), cursor_ + lookahead_);
  while (proposed_ < end) {
    const uint64_t p = proposed_++;
    if (const std::optional<FileId> file = at(p)) {
      return Proposal{*file, now + (p > cursor_ ? p - cursor_ : 0)};
    }
  }
  return std::nullopt;
}

// --- SequentialPredictor ---

SequentialPredictor::SequentialPredictor(const MountShape& shape) : shape_(shape) {
  for (const auto& files : shape.is_file) {
    base_.push_back(total_);
    total_ += files.size();
  }
}

std::optional<uint64_t> SequentialPredictor::position(FileId file) const {
  if (!shape_.contains(file)) return std::nullopt;
  return base_[dataset_of(file)] + entry_of(file);
}

std::optional<FileId> SequentialPredictor::at(uint64_t position) const {
  if (position >= total_) return std::nullopt;
  const auto d = static_cast<uint32_t>(std::upper_bound(base_.begin(), base_.end(), position) -
                                       base_.begin() - 1);
  const FileId file = file_id(d, static_cast<uint32_t>(position - base_[d]));
  return shape_.file(file) ? std::optional(file) : std::nullopt;
}

// --- RepeatPredictor ---

RepeatPredictor::RepeatPredictor(const MountShape& shape) {
  for (const auto& files : shape.is_file) {
    position_.emplace_back(files.size(), kNone);
    position_capacity_ += files.size();
  }
}

bool RepeatPredictor::observe(FileId file) {
  // begin_epoch() indexes position_ with every file kept: none outside it.
  const uint32_t d = dataset_of(file);
  if (d >= position_.size() || entry_of(file) >= position_[d].size()) return false;
  // An epoch that never ends (a reader of a subset, forever) must not grow this without bound.
  if (current_.size() >= 2 * position_capacity_ + EpochTracker::kWindow) current_.clear();
  current_.push_back(file);
  return OrderedPredictor::observe(file);
}

void RepeatPredictor::begin_epoch(size_t carried_over) {
  carried_over = std::min(carried_over, current_.size());
  std::vector<FileId> next(current_.end() - static_cast<ptrdiff_t>(carried_over), current_.end());
  current_.resize(current_.size() - carried_over);
  for (const FileId file : previous_) position_[dataset_of(file)][entry_of(file)] = kNone;
  previous_ = std::move(current_);
  current_ = std::move(next);
  for (uint32_t i = 0; i < previous_.size(); ++i) {
    uint32_t& p = position_[dataset_of(previous_[i])][entry_of(previous_[i])];
    if (p == kNone) p = i;  // a file read twice: its first read
  }
  reset_cursor();
  for (const FileId file : current_) OrderedPredictor::observe(file);
}

std::optional<uint64_t> RepeatPredictor::position(FileId file) const {
  const uint32_t d = dataset_of(file);
  if (d >= position_.size() || entry_of(file) >= position_[d].size()) return std::nullopt;
  const uint32_t p = position_[d][entry_of(file)];
  return p == kNone ? std::nullopt : std::optional<uint64_t>(p);
}

std::optional<FileId> RepeatPredictor::at(uint64_t position) const {
  return position < previous_.size() ? std::optional(previous_[position]) : std::nullopt;
}

// --- PlanPredictor ---

PlanPredictor::PlanPredictor(const MountShape& shape) {
  for (const auto& files : shape.is_file) {
    first_.emplace_back(files.size(), kNone);
    last_.emplace_back(files.size(), kNone);
  }
}

void PlanPredictor::clear() {
  for (const FileId file : plan_) {
    first_[dataset_of(file)][entry_of(file)] = kNone;
    last_[dataset_of(file)][entry_of(file)] = kNone;
  }
  plan_.clear();
  read_.clear();
  next_same_.clear();
  frontier_ = proposed_ = 0;
}

bool PlanPredictor::append(FileId file) {
  const uint32_t d = dataset_of(file);
  const uint32_t e = entry_of(file);
  if (d >= first_.size() || e >= first_[d].size() || plan_.size() >= kNone) return false;
  const auto position = static_cast<uint32_t>(plan_.size());
  plan_.push_back(file);
  read_.push_back(false);
  next_same_.push_back(kNone);
  if (last_[d][e] != kNone) next_same_[last_[d][e]] = position;
  last_[d][e] = position;
  if (first_[d][e] == kNone) first_[d][e] = position;
  return true;
}

void PlanPredictor::for_each_unread(const std::function<void(FileId)>& fn) const {
  for (uint64_t p = frontier_; p < plan_.size(); ++p) {
    if (!read_[p]) fn(plan_[p]);
  }
}

bool PlanPredictor::observe(FileId file) {
  const uint32_t d = dataset_of(file);
  const uint32_t e = entry_of(file);
  if (d >= first_.size() || e >= first_[d].size()) return false;
  const uint32_t p = first_[d][e];
  if (p == kNone) return false;
  const bool foreseen = p < frontier_ + std::max<uint64_t>(lookahead_, 64);
  read_[p] = true;
  first_[d][e] = next_same_[p];
  if (next_same_[p] == kNone) last_[d][e] = kNone;
  while (frontier_ < plan_.size() && read_[frontier_]) ++frontier_;
  return foreseen;
}

std::optional<Proposal> PlanPredictor::propose(uint64_t now) {
  proposed_ = std::max(proposed_, frontier_);
  const uint64_t end = std::min<uint64_t>(plan_.size(), frontier_ + lookahead_);
  while (proposed_ < end) {
    const uint64_t p = proposed_++;
    if (!read_[p]) return Proposal{plan_[p], now + (p - frontier_)};
  }
  return std::nullopt;
}

std::optional<uint64_t> PlanPredictor::distance(FileId file) const {
  const uint32_t d = dataset_of(file);
  const uint32_t e = entry_of(file);
  if (d >= first_.size() || e >= first_[d].size() || first_[d][e] == kNone) return std::nullopt;
  return first_[d][e] - frontier_;
}

// --- PlansPredictor ---

PlansPredictor::PlansPredictor(const MountShape& shape) : shape_(shape) {
  uint64_t files = 0;
  for (const std::vector<bool>& dataset : shape.is_file) files += dataset.size();
  max_entries_ = std::max(kMinPlanEntries, kPlanEntriesPerFile * files);
}

PlanPredictor* PlansPredictor::find(Writer writer) const {
  for (const auto& [w, plan] : plans_) {
    if (w == writer) return plan.get();
  }
  return nullptr;
}

bool PlansPredictor::ready() const {
  return std::any_of(plans_.begin(), plans_.end(), [](const auto& p) { return p.second->ready(); });
}

bool PlansPredictor::observe(FileId file) {
  PlanPredictor* soonest = nullptr;
  uint64_t soonest_distance = 0;
  for (const auto& [writer, plan] : plans_) {
    const std::optional<uint64_t> d = plan->distance(file);
    if (d && (soonest == nullptr || *d < soonest_distance)) {
      soonest = plan.get();
      soonest_distance = *d;
    }
  }
  return soonest != nullptr && soonest->observe(file);
}

std::optional<Proposal> PlansPredictor::propose(uint64_t now) {
  std::vector<PlanPredictor*> ready;
  for (const auto& [writer, plan] : plans_) {
    if (plan->ready()) ready.push_back(plan.get());
  }
  if (ready.empty()) return std::nullopt;
  std::sort(ready.begin(), ready.end(),
            [](const PlanPredictor* a, const PlanPredictor* b) { return a->lead() < b->lead(); });
  for (PlanPredictor* plan : ready) {
    plan->set_lookahead(lookahead_ / ready.size());
    if (std::optional<Proposal> proposal = plan->propose(now)) {
      // The plans' readers take turns: a file n places ahead in one of k plans is about k * n
      // accesses away.
      proposal->rank = now + (proposal->rank - now) * ready.size();
      return proposal;
    }
  }
  return std::nullopt;
}

void PlansPredictor::restart() {
  for (const auto& [writer, plan] : plans_) plan->restart();
}

void PlansPredictor::clear(Writer writer) {
  if (PlanPredictor* plan = find(writer)) {
    entries_ -= plan->entries();
    plan->clear();
  }
}

bool PlansPredictor::append(Writer writer, FileId file) {
  if (entries_ >= max_entries_) return false;
  PlanPredictor* plan = find(writer);
  if (plan == nullptr) {
    plans_.emplace_back(writer, std::make_unique<PlanPredictor>(shape_));
    plan = plans_.back().second.get();
    plan->set_lookahead(lookahead_);
  }
  if (!plan->append(file)) return false;
  ++entries_;
  return true;
}

uint64_t PlansPredictor::carry_unread_from(const PlansPredictor& other) {
  uint64_t carried = 0;
  for (const auto& [writer, plan] : other.plans_) {
    plan->for_each_unread([&, w = writer](FileId file) { carried += append(w, file) ? 1 : 0; });
  }
  return carried;
}

void PlansPredictor::forget(Writer writer) {
  if (PlanPredictor* plan = find(writer)) entries_ -= plan->entries();
  std::erase_if(plans_, [writer](const auto& p) { return p.first == writer; });
}

bool PlansPredictor::lists_unread(FileId file) const {
  return std::any_of(plans_.begin(), plans_.end(),
                     [file](const auto& p) { return p.second->distance(file).has_value(); });
}

uint64_t PlansPredictor::position() const {
  uint64_t total = 0;
  for (const auto& [writer, plan] : plans_) total += plan->position();
  return total;
}

// --- UnreadSetPredictor ---

UnreadSetPredictor::UnreadSetPredictor(const MountShape& shape, const EpochTracker& epochs,
                                       uint64_t seed)
    : shape_(shape), epochs_(epochs), random_(seed), included_(shape.is_file.size(), false) {
  for (const auto& files : shape.is_file) sample_.emplace_back(files.size(), false);
}

bool UnreadSetPredictor::in_sample(FileId file) const {
  return sample_[dataset_of(file)][entry_of(file)];
}

void UnreadSetPredictor::set_in_sample(FileId file, bool in) {
  sample_[dataset_of(file)][entry_of(file)] = in;
}

void UnreadSetPredictor::include_dataset(uint32_t dataset) {
  // Only datasets being read: a mount of several datasets usually trains on one.
  included_[dataset] = true;
  const size_t from = order_.size();
  const auto& files = shape_.is_file[dataset];
  for (uint32_t e = 0; e < files.size(); ++e) {
    if (files[e]) order_.push_back(file_id(dataset, e));
  }
  // Shuffle the new files into the part not yet sampled.
  std::shuffle(order_.begin() + static_cast<ptrdiff_t>(std::min(next_, from)), order_.end(),
               random_);
}

void UnreadSetPredictor::top_up() {
  while (sample_size_ < lookahead_ && next_ < order_.size()) {
    const FileId file = order_[next_++];
    if (epochs_.read(file) || in_sample(file)) continue;
    set_in_sample(file, true);
    ++sample_size_;
    to_propose_.push_back(file);
  }
  // Not leading, nobody takes proposals: keep only what a leader could still fetch.
  if (to_propose_.size() > 2 * lookahead_) {
    to_propose_.erase(to_propose_.begin(), to_propose_.end() - static_cast<ptrdiff_t>(lookahead_));
  }
}

bool UnreadSetPredictor::observe(FileId file) {
  if (!shape_.contains(file)) return false;
  if (!included_[dataset_of(file)]) include_dataset(dataset_of(file));
  const bool foreseen = in_sample(file);
  if (foreseen) {
    set_in_sample(file, false);
    --sample_size_;
  }
  top_up();
  return foreseen;
}

void UnreadSetPredictor::new_epoch() {
  for (auto& in : sample_) std::fill(in.begin(), in.end(), false);
  sample_size_ = 0;
  to_propose_.clear();
  std::shuffle(order_.begin(), order_.end(), random_);
  next_ = 0;
  top_up();
}

std::optional<Proposal> UnreadSetPredictor::propose(uint64_t) {
  while (!to_propose_.empty()) {
    const FileId file = to_propose_.back();
    to_propose_.pop_back();
    if (in_sample(file) && !epochs_.read(file)) {
      return Proposal{file, ObjectCache::kUnorderedRank};
    }
  }
  return std::nullopt;
}

void UnreadSetPredictor::expect(uint32_t dataset) {
  if (dataset >= included_.size() || included_[dataset]) return;
  include_dataset(dataset);
  top_up();
}

void UnreadSetPredictor::restart() {
  // Propose the whole current sample: what it holds was never fetched while it was not leading.
  to_propose_.clear();
  for (uint32_t d = 0; d < sample_.size(); ++d) {
    for (uint32_t e = 0; e < sample_[d].size(); ++e) {
      if (sample_[d][e]) to_propose_.push_back(file_id(d, e));
    }
  }
  std::shuffle(to_propose_.begin(), to_propose_.end(), random_);
}

// --- PredictionModel ---

PredictionModel::PredictionModel(MountShape shape, uint64_t seed)
    : shape_(std::move(shape)), epochs_(shape_) {
  auto plan = std::make_unique<PlansPredictor>(shape_);
  auto repeat = std::make_unique<RepeatPredictor>(shape_);
  plan_ = plan.get();
  repeat_ = repeat.get();
  predictors_.push_back(std::move(plan));
  predictors_.push_back(std::move(repeat));
  predictors_.push_back(std::make_unique<SequentialPredictor>(shape_));
  auto unread = std::make_unique<UnreadSetPredictor>(shape_, epochs_, seed);
  unread_ = unread.get();
  predictors_.push_back(std::move(unread));
  for (const auto& p : predictors_) scores_.push_back(PredictorScore{.name = p->name()});
  // With no evidence yet, the best guess is the one that assumes nothing about the order.
  leader_ = predictors_.size() - 1;
}

void PredictionModel::expect_dataset(uint32_t dataset) {
  unread_->expect(dataset);
}

void PredictionModel::set_lookahead(size_t files) {
  for (auto& p : predictors_) p->set_lookahead(files);
}

bool PredictionModel::observe(FileId file) {
  ++accesses_;
  // A file of another shape (a handle of the generation before a refresh, a dataset not
  // predicted for) says nothing of this one's order, and the predictors' tables have no room
  // for it.
  if (!shape_.file(file)) return false;
  const bool new_epoch = epochs_.observe(file);
  if (new_epoch) begin_epoch(epochs_.carried_over());
  for (size_t i = 0; i < predictors_.size(); ++i) {
    Predictor& p = *predictors_[i];
    PredictorScore& s = scores_[i];
    s.ready = p.ready();
    const bool foreseen = p.observe(file);
    if (!s.ready) {
      s.score *= 1 - kScoreWeight;
      continue;
    }
    ++s.scored;
    if (foreseen) ++s.foreseen;
    s.score += ((foreseen ? 1.0 : 0.0) - s.score) * kScoreWeight;
  }
  choose_leader();
  return new_epoch;
}

void PredictionModel::begin_epoch(size_t carried_over) {
  repeat_->begin_epoch(carried_over);
  for (auto& p : predictors_) {
    if (p.get() != repeat_) p->new_epoch();
  }
}

void PredictionModel::choose_leader() {
  const size_t unordered = predictors_.size() - 1;  // the unread set: no order among its guesses
  size_t best = leader_;
  for (size_t i = 0; i < predictors_.size(); ++i) {
    if (!predictors_[i]->ready()) continue;
    // A challenger must do better by the margin, except that an order that foresees most reads
    // about as well as the unread set takes over from it: it also says which file comes first.
    double margin = i == leader_ ? 0 : kHysteresis;
    if (i != unordered && best == unordered && scores_[i].score >= 0.5) margin = -kHysteresis;
    if (!predictors_[best]->ready() || scores_[i].score > scores_[best].score + margin) best = i;
  }
  if (!predictors_[best]->ready()) best = predictors_.size() - 1;
  if (best != leader_) {
    leader_ = best;
    predictors_[leader_]->restart();
  }
}

std::optional<Proposal> PredictionModel::propose() {
  Predictor& leader = *predictors_[leader_];
  const bool plan = &leader == plan_;  // a plan is explicit: fetch what it lists
  while (std::optional<Proposal> proposal = leader.propose(accesses_)) {
    if (shape_.file(proposal->file) && (plan || !epochs_.read(proposal->file))) return proposal;
  }
  return std::nullopt;
}

void PredictionModel::plan_clear(PlansPredictor::Writer writer) {
  plan_->clear(writer);
}
bool PredictionModel::plan_append(PlansPredictor::Writer writer, FileId file) {
  return plan_->append(writer, file);
}
void PredictionModel::plan_forget(PlansPredictor::Writer writer) {
  plan_->forget(writer);
}

uint64_t PredictionModel::carry_plans_from(const PredictionModel& old) {
  const uint64_t carried = plan_->carry_unread_from(*old.plan_);
  if (carried > 0) plan_published(false);
  return carried;
}

bool PredictionModel::plan_published(bool replaced) {
  const bool new_epoch = replaced && epochs_.read_count() > 0;
  if (new_epoch) {
    epochs_.begin_epoch();
    begin_epoch(0);
  }
  scores_[0].score = 1.0;
  if (plan_->ready()) {
    leader_ = 0;
    plan_->restart();
  }
  return new_epoch;
}

std::vector<PredictorScore> PredictionModel::scores() const {
  std::vector<PredictorScore> out = scores_;
  for (size_t i = 0; i < out.size(); ++i) out[i].ready = predictors_[i]->ready();
  return out;
}

}  // namespace dsfs::prefetch
