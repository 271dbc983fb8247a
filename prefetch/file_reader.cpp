#include "prefetch/file_reader.h"

#include <fmt/core.h>

#include <algorithm>
#include <stdexcept>

#include "prefetch/engine.h"
#include "src/store/log_text.h"

namespace dsfs::prefetch {

FileReader::FileReader(ObjectCache& cache, ObjectFetcher& fetcher, bool verify)
    : cache_(cache), fetcher_(fetcher), verify_(verify) {}

void FileReader::report_access(uint32_t dataset, uint32_t entry) {
  if (engine_) engine_->record_access(dataset, entry);
}

std::vector<Slice> FileReader::read(const DatasetSnapshot& dataset, uint32_t entry, uint64_t offset,
                                    size_t size, bool report) {
  const catalog::Catalog& catalog = *dataset.catalog;
  const catalog::CatalogEntry& file = catalog.entry(entry);
  if (file.is_dir) throw std::invalid_argument("FileReader::read on a directory");
  if (offset >= file.size || size == 0) return {};
  if (offset == 0 && report && engine_) engine_->record_access(dataset.index, entry);
  const uint64_t end = std::min<uint64_t>(file.size, offset + size);

  const uint64_t chunk_count = catalog.chunk_count(entry);
  // Chunk numbers are 32-bit from here on (cache keys); more would wrap to the wrong chunk.
  if (chunk_count > (uint64_t{1} << 32)) {
    throw std::runtime_error(fmt::format("{}/{} has {} chunks; dsfs reads at most 2^32 per file",
                                         dataset.name(), store::log_text(catalog.path(entry)),
                                         chunk_count));
  }
  const uint64_t chunk_size = chunk_count == 1 ? file.size : catalog.chunk_size();
  const auto first_needed = static_cast<uint32_t>(offset / chunk_size);
  const auto last_needed = static_cast<uint32_t>((end - 1) / chunk_size);
  // Verifying needs the whole file once, so until then ask for every chunk: one load fetches
  // and checks them all. Afterwards only the needed chunks, each checked against its digest.
  const std::shared_ptr<const Digests> digests =
      verify_ && chunk_count > 1 ? verified_digests(dataset.index, entry) : nullptr;
  const bool whole_file_check = verify_ && !digests;
  const uint32_t first = whole_file_check ? 0 : first_needed;
  const uint32_t last = whole_file_check ? static_cast<uint32_t>(chunk_count - 1) : last_needed;

  std::vector<ObjectKey> keys;
  keys.reserve(last - first + 1);
  for (uint32_t chunk = first; chunk <= last; ++chunk) {
    keys.push_back(ObjectKey{.dataset = dataset.index,
                             .chunk = chunk,
                             .generation = dataset.generation(),
                             .object_id = file.object_id});
  }

  // This read takes every chunk it asks for whole (the usual image: one READ of 1 MiB).
  const bool whole = !whole_file_check && offset == uint64_t{first} * chunk_size &&
                     (end == file.size || end % chunk_size == 0);
  ReadOutcome outcome = ReadOutcome::kReady;
  const auto started = std::chrono::steady_clock::now();
  const std::vector<ObjectBuffer> buffers = cache_.get_many(
      keys,
      [&](std::span<const ObjectKey> missing) {
        std::vector<uint32_t> wanted;
        wanted.reserve(missing.size());
        for (const ObjectKey& key : missing) wanted.push_back(key.chunk);
        if (!verify_) return fetcher_.fetch_chunks(dataset, entry, wanted);
        if (digests) {
          std::vector<ObjectBuffer> fetched = fetcher_.fetch_chunks(dataset, entry, wanted);
          for (size_t i = 0; i < fetched.size(); ++i) {
            fetcher_.verify_chunk(dataset, entry, wanted[i], *fetched[i], (*digests)[wanted[i]]);
          }
          return fetched;
        }
        // Some chunks may still be cached, but a checksum over a mix would prove nothing about
        // the fetched ones alone: fetch the whole file and check it.
        std::vector<uint32_t> all(chunk_count);
        for (uint32_t chunk = 0; chunk < chunk_count; ++chunk) all[chunk] = chunk;
        std::vector<ObjectBuffer> all_chunks = fetcher_.fetch_chunks(dataset, entry, all);
        fetcher_.verify_checksum(dataset, entry, all_chunks);
        if (chunk_count > 1) {
          auto taken = std::make_shared<Digests>();
          taken->reserve(all_chunks.size());
          for (const ObjectBuffer& chunk : all_chunks) {
            taken->push_back(ObjectFetcher::chunk_digest(*chunk));
          }
          MutexLock lock(verified_mutex_);
          verified_[uint64_t{dataset.index} << 32 | entry] = std::move(taken);
        }
        std::vector<ObjectBuffer> result;
        result.reserve(wanted.size());
        for (const uint32_t chunk : wanted) result.push_back(all_chunks[chunk]);
        return result;
      },
      &outcome, whole);
  stats_.record(outcome, outcome == ReadOutcome::kReady
                             ? std::chrono::nanoseconds{0}
                             : std::chrono::steady_clock::now() - started);

  std::vector<Slice> slices;
  slices.reserve(last_needed - first_needed + 1);
  for (uint32_t chunk = first_needed; chunk <= last_needed; ++chunk) {
    const ObjectBuffer& buffer = buffers[chunk - first];
    const uint64_t chunk_start = uint64_t{chunk} * chunk_size;
    const uint64_t from = std::max(offset, chunk_start) - chunk_start;
    const uint64_t to = std::min<uint64_t>(end - chunk_start, buffer->size());
    if (to <= from) break;  // cannot happen: lengths were checked against the catalogue
    slices.push_back(Slice{buffer, static_cast<size_t>(from), static_cast<size_t>(to - from)});
    // Read to its end: the first to make room for what comes next. get_many already marked
    // what it found or loaded for a whole read, which is every read of a cached image.
    if (to == buffer->size() && (!whole || outcome != ReadOutcome::kReady)) {
      cache_.mark_consumed(keys[chunk - first]);
    }
  }
  return slices;
}

std::shared_ptr<const FileReader::Digests> FileReader::verified_digests(uint32_t dataset,
                                                                        uint32_t entry) const {
  MutexLock lock(verified_mutex_);
  const auto it = verified_.find(uint64_t{dataset} << 32 | entry);
  return it == verified_.end() ? nullptr : it->second;
}

}  // namespace dsfs::prefetch
