#include "prefetch/file_reader.h"

#include <algorithm>
#include <stdexcept>

namespace dsfs::prefetch {

FileReader::FileReader(ObjectCache& cache, ObjectFetcher& fetcher, bool verify)
    : cache_(cache), fetcher_(fetcher), verify_(verify) {}

std::vector<Slice> FileReader::read(const DatasetSnapshot& dataset, uint32_t entry, uint64_t offset,
                                    size_t size) {
  const catalog::Catalog& catalog = *dataset.catalog;
  const catalog::CatalogEntry& file = catalog.entry(entry);
  if (file.is_dir) throw std::invalid_argument("FileReader::read on a directory");
  if (offset >= file.size || size == 0) return {};
  const uint64_t end = std::min<uint64_t>(file.size, offset + size);

  const uint64_t chunk_count = catalog.chunk_count(entry);
  const uint64_t chunk_size = chunk_count == 1 ? file.size : catalog.chunk_size();
  const auto first_needed = static_cast<uint32_t>(offset / chunk_size);
  const auto last_needed = static_cast<uint32_t>((end - 1) / chunk_size);
  // Verifying needs the whole file, so ask for every chunk: one load then fetches and checks
  // them all, and later reads of the file find them cached.
  const uint32_t first = verify_ ? 0 : first_needed;
  const uint32_t last = verify_ ? static_cast<uint32_t>(chunk_count - 1) : last_needed;

  std::vector<ObjectKey> keys;
  keys.reserve(last - first + 1);
  for (uint32_t chunk = first; chunk <= last; ++chunk) {
    keys.push_back(ObjectKey{.dataset = dataset.index,
                             .chunk = chunk,
                             .generation = dataset.generation(),
                             .object_id = file.object_id});
  }

  const std::vector<ObjectBuffer> buffers =
      cache_.get_many(keys, [&](std::span<const ObjectKey> missing) {
        std::vector<uint32_t> wanted;
        wanted.reserve(missing.size());
        for (const ObjectKey& key : missing) wanted.push_back(key.chunk);
        if (!verify_) return fetcher_.fetch_chunks(dataset, entry, wanted);
        // Some chunks may still be cached, but a checksum over a mix would prove nothing about
        // the fetched ones alone: fetch the whole file and check it.
        std::vector<uint32_t> all(chunk_count);
        for (uint32_t chunk = 0; chunk < chunk_count; ++chunk) all[chunk] = chunk;
        std::vector<ObjectBuffer> whole = fetcher_.fetch_chunks(dataset, entry, all);
        fetcher_.verify_checksum(dataset, entry, whole);
        std::vector<ObjectBuffer> result;
        result.reserve(wanted.size());
        for (const uint32_t chunk : wanted) result.push_back(whole[chunk]);
        return result;
      });

  std::vector<Slice> slices;
  slices.reserve(last_needed - first_needed + 1);
  for (uint32_t chunk = first_needed; chunk <= last_needed; ++chunk) {
    const ObjectBuffer& buffer = buffers[chunk - first];
    const uint64_t chunk_start = uint64_t{chunk} * chunk_size;
    const uint64_t from = std::max(offset, chunk_start) - chunk_start;
    const uint64_t to = std::min<uint64_t>(end - chunk_start, buffer->size());
    if (to <= from) break;  // cannot happen: lengths were checked against the catalogue
    slices.push_back(Slice{buffer, static_cast<size_t>(from), static_cast<size_t>(to - from)});
  }
  return slices;
}

}  // namespace dsfs::prefetch
