#include "prefetch/dataset_table.h"

#include <fmt/format.h>

#include <stdexcept>

namespace dsfs::prefetch {

DatasetTable::DatasetTable(std::vector<DatasetSnapshot> initial)
    : chunks_(std::make_unique<std::atomic<Chunk*>[]>(kChunkCount)) {
  if (initial.size() > kMaxDatasetIndices) {
    throw std::invalid_argument(
        fmt::format("a mount can hold at most {} datasets", kMaxDatasetIndices));
  }
  for (DatasetSnapshot& snapshot : initial) append(std::move(snapshot));
}

DatasetTable::~DatasetTable() = default;

const DatasetSnapshot& DatasetTable::append(DatasetSnapshot snapshot) {
  if (!snapshot.catalog) throw std::invalid_argument("dataset snapshot without a catalogue");
  MutexLock lock(append_mutex_);
  const uint32_t index = size_.load(std::memory_order_relaxed);
  if (index >= kMaxDatasetIndices) {
    throw std::length_error(fmt::format(
        "this mount has served {} dataset generations, its most; remount to see more", index));
  }
  Chunk* chunk = chunks_[index / kChunkSize].load(std::memory_order_relaxed);
  if (chunk == nullptr) {
    owned_chunks_.push_back(std::make_unique<Chunk[]>(kChunkSize));
    chunk = owned_chunks_.back().get();
    chunks_[index / kChunkSize].store(chunk, std::memory_order_release);
  }
  snapshot.index = index;
  owned_.push_back(std::make_unique<DatasetSnapshot>(std::move(snapshot)));
  const DatasetSnapshot& stored = *owned_.back();
  chunk[index % kChunkSize].store(&stored, std::memory_order_release);
  // Published last: a reader that sees the new size finds the snapshot in place.
  size_.store(index + 1, std::memory_order_release);
  return stored;
}

}  // namespace dsfs::prefetch
