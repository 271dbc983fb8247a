#pragma once
// Serves byte ranges of dataset files from the object cache, fetching what is missing.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "prefetch/dataset_snapshot.h"
#include "prefetch/object_cache.h"
#include "prefetch/object_fetcher.h"

namespace dsfs::prefetch {

// A piece of a read: `length` bytes at `offset` inside `buffer` (which it keeps alive).
struct Slice {
  ObjectBuffer buffer;
  size_t offset = 0;
  size_t length = 0;
};

class FileReader {
 public:
  // verify: check each file's whole checksum when its objects are fetched (a file stored in
  // chunks is then fetched whole).
  FileReader(ObjectCache& cache, ObjectFetcher& fetcher, bool verify);

  // Up to `size` bytes of file `entry` from `offset` (fewer at the end of the file, none past
  // it), as slices in order. Throws what ObjectFetcher throws.
  std::vector<Slice> read(const DatasetSnapshot& dataset, uint32_t entry, uint64_t offset,
                          size_t size);

  bool verify() const { return verify_; }

 private:
  ObjectCache& cache_;
  ObjectFetcher& fetcher_;
  bool verify_;
};

}  // namespace dsfs::prefetch
