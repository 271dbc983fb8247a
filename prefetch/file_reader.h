#pragma once
// Serves byte ranges of dataset files from the object cache, fetching what is missing.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "prefetch/dataset_snapshot.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"
#include "prefetch/read_stats.h"
#include "src/store/thread_annotations.h"

namespace dsfs::prefetch {

class PrefetchEngine;

// A piece of a read: `length` bytes at `offset` inside `buffer` (which it keeps alive).
struct Slice {
  ObjectBuffer buffer;
  size_t offset = 0;
  size_t length = 0;
};

// Thread safety: internally synchronized; read() is called by every FUSE worker at once. The
// cache and fetcher synchronize themselves, stats_ is atomics, verified_mutex_ guards verified_.
// set_engine must be called before the first read (it is not synchronized).
class FileReader {
 public:
  // verify: check each file's whole checksum when its objects are fetched (a file stored in
  // chunks is fetched whole the first time; chunks fetched again later are checked against
  // digests taken then).
  FileReader(ObjectCache& cache, ObjectFetcher& fetcher, bool verify);

  // Up to `size` bytes of file `entry` from `offset` (fewer at the end of the file, none past
  // it), as slices in order. Throws what ObjectFetcher throws. A read from offset 0 is reported
  // to the engine unless `report` is false (the view reports its own reads).
  std::vector<Slice> read(const DatasetSnapshot& dataset, uint32_t entry, uint64_t offset,
                          size_t size, bool report = true);
  // Tells the engine (if any) that file `entry` of dataset `dataset` began to be read.
  void report_access(uint32_t dataset, uint32_t entry);

  bool verify() const { return verify_; }

  // Reports every file read from its start to `engine` (which may then fetch what comes next).
  void set_engine(PrefetchEngine* engine) { engine_ = engine; }
  const ReadStats& stats() const { return stats_; }

 private:
  using Digests = std::vector<uint64_t>;  // ObjectFetcher::chunk_digest of each chunk, in order
  std::shared_ptr<const Digests> verified_digests(uint32_t dataset, uint32_t entry) const;

  ObjectCache& cache_;
  ObjectFetcher& fetcher_;
  bool verify_;
  PrefetchEngine* engine_ = nullptr;
  ReadStats stats_;
  // Chunked files that passed the whole-file check, by (dataset << 32 | entry). Without them a
  // file larger than the cache was fetched whole again on every miss (chunks^2 GETs).
  mutable Mutex verified_mutex_;
  std::unordered_map<uint64_t, std::shared_ptr<const Digests>> verified_
      DSFS_GUARDED_BY(verified_mutex_);
};

}  // namespace dsfs::prefetch
