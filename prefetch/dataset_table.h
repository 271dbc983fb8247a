#pragma once
// Every dataset snapshot a mount has served, by index. A dataset published, re-ingested or
// refreshed while mounted gets a new index; an index, once given, names the same snapshot until
// the table is destroyed, so inodes and cache keys that carry it never come to mean another
// generation, and readers find a snapshot by index without a lock.
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "prefetch/dataset_snapshot.h"
#include "src/store/thread_annotations.h"

namespace dsfs::prefetch {

// Indices a table can give out over its life.
inline constexpr uint32_t kMaxDatasetIndices = (1u << 28) - 1;

// Thread safety: get() and size() are lock-free and may run on any thread while another
// appends; append() serializes itself. A snapshot is never moved or freed before the table.
class DatasetTable {
 public:
  // The first snapshots take indices 0, 1, ... in order (their `index` is overwritten). Throws
  // std::invalid_argument for a snapshot without a catalogue or more than kMaxDatasetIndices.
  explicit DatasetTable(std::vector<DatasetSnapshot> initial = {});
  ~DatasetTable();
  DatasetTable(const DatasetTable&) = delete;
  DatasetTable& operator=(const DatasetTable&) = delete;

  // nullptr for an index not given out yet.
  const DatasetSnapshot* get(uint32_t index) const {
    if (index >= size()) return nullptr;
    return chunks_[index / kChunkSize].load(std::memory_order_acquire)[index % kChunkSize].load(
        std::memory_order_acquire);
  }
  // Indices given out: [0, size()).
  uint32_t size() const { return size_.load(std::memory_order_acquire); }

  // Stores `snapshot` under the next index (written into it) and returns it. Throws
  // std::length_error once kMaxDatasetIndices have been given out, std::invalid_argument for a
  // snapshot without a catalogue.
  const DatasetSnapshot& append(DatasetSnapshot snapshot);

 private:
  static constexpr uint32_t kChunkSize = 1u << 14;
  static constexpr uint32_t kChunkCount = (kMaxDatasetIndices + kChunkSize) / kChunkSize;
  using Chunk = std::atomic<const DatasetSnapshot*>;

  Mutex append_mutex_;
  std::vector<std::unique_ptr<DatasetSnapshot>> owned_ DSFS_GUARDED_BY(append_mutex_);
  std::vector<std::unique_ptr<Chunk[]>> owned_chunks_ DSFS_GUARDED_BY(append_mutex_);
  std::unique_ptr<std::atomic<Chunk*>[]> chunks_;
  std::atomic<uint32_t> size_{0};
};

}  // namespace dsfs::prefetch
