#include "prefetch/object_fetcher.h"

#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <array>
#include <utility>

#include "src/store/errors.h"
#include "src/store/log_text.h"

namespace dsfs::prefetch {

ObjectFetcher::ObjectFetcher(store::Client& client, catalog::KeySchema keys, FetcherOptions options)
    : client_(client), keys_(std::move(keys)), options_(options) {}

std::string ObjectFetcher::chunk_key(const DatasetSnapshot& dataset, uint32_t entry,
                                     uint32_t chunk) const {
  return keys_.object_piece(dataset.name(), dataset.generation(),
                            dataset.catalog->entry(entry).object_id, chunk,
                            dataset.catalog->chunk_count(entry) > 1);
}

uint64_t ObjectFetcher::chunk_length(const catalog::Catalog& catalog, uint32_t entry,
                                     uint32_t chunk) {
  const uint64_t size = catalog.entry(entry).size;
  const uint64_t count = catalog.chunk_count(entry);
  if (count == 1) return size;
  const uint64_t chunk_size = catalog.chunk_size();
  return chunk + 1 < count ? chunk_size : size - (count - 1) * chunk_size;
}

bool ObjectFetcher::answers_within(std::chrono::milliseconds limit) const {
  return client_.answers_within(limit);
}

namespace {

DiskTierKey disk_key(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk) {
  return DiskTierKey{.dataset = dataset.name(),
                     .generation = dataset.generation(),
                     .object_id = dataset.catalog->entry(entry).object_id,
                     .chunk = chunk,
                     .ingest = dataset.ingest_identity()};
}

}  // namespace

void ObjectFetcher::offer_to_disk(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk,
                                  ObjectBuffer buffer) {
  if (options_.disk_tier != nullptr) {
    options_.disk_tier->put(disk_key(dataset, entry, chunk), std::move(buffer));
  }
}

bool ObjectFetcher::on_disk(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk) const {
  return options_.disk_tier != nullptr &&
         options_.disk_tier->holds(disk_key(dataset, entry, chunk),
                                   chunk_length(*dataset.catalog, entry, chunk));
}

ObjectBuffer ObjectFetcher::read_from_disk(const DatasetSnapshot& dataset, uint32_t entry,
                                           uint32_t chunk) const {
  if (options_.disk_tier == nullptr) return nullptr;
  return options_.disk_tier->get(disk_key(dataset, entry, chunk),
                                 chunk_length(*dataset.catalog, entry, chunk));
}

std::vector<ObjectBuffer> ObjectFetcher::fetch_chunks(const DatasetSnapshot& dataset,
                                                      uint32_t entry,
                                                      std::span<const uint32_t> chunks) {
  DiskTier* const tier = options_.disk_tier;
  if (tier == nullptr) return fetch_from_redis(dataset, entry, chunks);
  // The tier first; what it lacks (or drops as damaged) comes from Redis in one pipeline.
  std::vector<ObjectBuffer> buffers(chunks.size());
  std::vector<uint32_t> missing;
  std::vector<size_t> missing_at;
  for (size_t i = 0; i < chunks.size(); ++i) {
    buffers[i] = tier->get(disk_key(dataset, entry, chunks[i]),
                           chunk_length(*dataset.catalog, entry, chunks[i]));
    if (!buffers[i]) {
      missing.push_back(chunks[i]);
      missing_at.push_back(i);
    }
  }
  if (missing.empty()) return buffers;
  std::vector<ObjectBuffer> fetched = fetch_from_redis(dataset, entry, missing);
  for (size_t i = 0; i < fetched.size(); ++i) {
    tier->put(disk_key(dataset, entry, missing[i]), fetched[i]);
    buffers[missing_at[i]] = std::move(fetched[i]);
  }
  return buffers;
}

std::vector<ObjectBuffer> ObjectFetcher::fetch_from_redis(const DatasetSnapshot& dataset,
                                                          uint32_t entry,
                                                          std::span<const uint32_t> chunks) {
  if (dataset.gone()) {
    throw IntegrityError(
        IntegrityError::Kind::kMissing,
        fmt::format("dataset '{}' generation {} was removed from Redis or made again there after "
                    "this file was opened, so its objects are not fetched any more; open the "
                    "file again to read the dataset as the mount shows it now",
                    store::log_text(dataset.name()), dataset.generation()));
  }
  std::vector<std::string> keys;
  keys.reserve(chunks.size());
  for (const uint32_t chunk : chunks) keys.push_back(chunk_key(dataset, entry, chunk));

  // A node that failed a whole timeout is tried once until it answers again, while the others
  // are waited for as usual: the client keeps that state per node (Client::get_values).
  std::vector<store::ValueReply> replies;
  const uint64_t file = uint64_t{dataset.index} << 32 | entry;
  bool failed_lately = false;
  bool failed_just_now = false;
  const std::chrono::milliseconds reissue_window =
      std::min(options_.reissue_window, options_.timeout);
  {
    MutexLock lock(failed_mutex_);
    if (const auto it = recently_failed_.find(file); it != recently_failed_.end()) {
      const auto age = std::chrono::steady_clock::now() - it->second;
      failed_lately = age < options_.timeout;
      failed_just_now = age < reissue_window;
      if (!failed_lately) recently_failed_.erase(it);
    }
  }
  // The kernel re-issues a READ that failed, at once: answering it with another full try would
  // make one read(2) wait the timeout twice against a stalled Redis. So a file whose fetch failed
  // this moment (options_.reissue_window) is tried only if a fresh connection answers PING within
  // that window (Redis may be back already); later, it tries once.
  if (failed_just_now && !answers_within(reissue_window)) {
    stats_.unavailable.fetch_add(1, std::memory_order_relaxed);
    throw store::ConnectionError(fmt::format(
        "{}/{}: its read failed a moment ago and Redis at {} does not answer within {} ms",
        dataset.name(), store::log_text(dataset.catalog->path(entry)), client_.describe(),
        reissue_window.count()));
  }
  uint64_t retries = 0;
  try {
    replies = client_.get_values(keys, options_.pipeline_window,
                                 failed_lately ? std::chrono::milliseconds{0} : options_.timeout,
                                 &retries);
    stats_.retries.fetch_add(retries, std::memory_order_relaxed);
    stats_.round_trips.fetch_add(1, std::memory_order_relaxed);
    stats_.gets.fetch_add(keys.size(), std::memory_order_relaxed);
  } catch (const store::ReplyError& e) {
    // Refused before any GET ran (AUTH or READONLY on a new connection: a password changed).
    stats_.retries.fetch_add(retries, std::memory_order_relaxed);
    stats_.reply_errors.fetch_add(1, std::memory_order_relaxed);
    reply_error_log_.log(spdlog::level::err,
                         fmt::format("read of {}/{} failed: {}", dataset.name(),
                                     store::log_text(dataset.catalog->path(entry)), e.what()));
    throw;
  } catch (const store::ConnectionError& e) {
    stats_.retries.fetch_add(retries, std::memory_order_relaxed);
    stats_.unavailable.fetch_add(1, std::memory_order_relaxed);
    {
      MutexLock lock(failed_mutex_);
      // Bounded: past this many files failing at once, forget the expired ones.
      if (recently_failed_.size() >= 65536) {
        std::erase_if(recently_failed_, [&](const auto& item) {
          return std::chrono::steady_clock::now() - item.second >= options_.timeout;
        });
      }
      recently_failed_[file] = std::chrono::steady_clock::now();
    }
    // The node's state is logged by the client, once; each file at most a few times a window.
    unavailable_log_.log(spdlog::level::err,
                         fmt::format("read of {}/{} failed: {}", dataset.name(),
                                     store::log_text(dataset.catalog->path(entry)), e.what()));
    throw;
  }
  if (failed_lately) {
    MutexLock lock(failed_mutex_);
    recently_failed_.erase(file);
  }

  std::vector<ObjectBuffer> buffers;
  buffers.reserve(replies.size());
  for (size_t i = 0; i < replies.size(); ++i) {
    store::ValueReply& reply = replies[i];
    const std::string& key = keys[i];
    if (reply.kind == store::ValueReply::Kind::kError) {
      stats_.reply_errors.fetch_add(1, std::memory_order_relaxed);
      const std::string message =
          fmt::format("GET {} for {}/{} failed: Redis replied '{}'", key, dataset.name(),
                      store::log_text(dataset.catalog->path(entry)), store::log_text(reply.error));
      reply_error_log_.log(spdlog::level::err, message);
      throw store::ReplyError(message);
    }
    if (reply.kind == store::ValueReply::Kind::kNil) {
      stats_.missing.fetch_add(1, std::memory_order_relaxed);
      const std::string message = fmt::format(
          "object key {} of {}/{} is missing from Redis (the dataset removed, made again, or "
          "generation {} collected? the mount serves the current one after its next poll or "
          "`dsfs refresh MOUNT`)",
          key, dataset.name(), store::log_text(dataset.catalog->path(entry)), dataset.generation());
      missing_log_.log(spdlog::level::err, message);
      throw IntegrityError(IntegrityError::Kind::kMissing, message);
    }
    const uint64_t expected = chunk_length(*dataset.catalog, entry, chunks[i]);
    if (reply.size != expected) {
      stats_.length_mismatches.fetch_add(1, std::memory_order_relaxed);
      const std::string message = fmt::format(
          "object key {} of {}/{} holds {} bytes but the catalogue says {}: refusing to serve it",
          key, dataset.name(), store::log_text(dataset.catalog->path(entry)), reply.size, expected);
      length_log_.log(spdlog::level::err, message);
      throw IntegrityError(IntegrityError::Kind::kLength, message);
    }
    stats_.bytes.fetch_add(expected, std::memory_order_relaxed);
    buffers.push_back(std::make_shared<const ObjectData>(std::move(reply)));
  }
  return buffers;
}

void ObjectFetcher::verify_checksum(const DatasetSnapshot& dataset, uint32_t entry,
                                    std::span<const ObjectBuffer> all_chunks) {
  const catalog::Catalog& catalog = *dataset.catalog;
  const uint64_t expected = catalog.entry(entry).checksum;
  uint64_t actual = 0;
  switch (catalog.checksum_kind()) {
    case catalog::ChecksumKind::kNone:
      return;
    case catalog::ChecksumKind::kXxh64: {
      std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                       &XXH64_freeState);
      if (!state) throw std::bad_alloc();
      XXH64_reset(state.get(), 0);
      for (const ObjectBuffer& chunk : all_chunks) {
        XXH64_update(state.get(), chunk->bytes().data(), chunk->size());
      }
      actual = XXH64_digest(state.get());
      break;
    }
    case catalog::ChecksumKind::kCrc32c: {
      uint32_t crc = 0;
      for (const ObjectBuffer& chunk : all_chunks) {
        crc = crc32c(crc, chunk->bytes().data(), chunk->size());
      }
      actual = crc;
      break;
    }
  }
  if (actual != expected) {
    stats_.checksum_mismatches.fetch_add(1, std::memory_order_relaxed);
    const std::string message = fmt::format(
        "{}/{} (object {} of generation {}) has checksum {:016x} but the catalogue "
        "says {:016x}: refusing to serve it",
        dataset.name(), store::log_text(catalog.path(entry)), catalog.entry(entry).object_id,
        dataset.generation(), actual, expected);
    spdlog::error("{}", message);
    throw IntegrityError(IntegrityError::Kind::kChecksum, message);
  }
}

uint64_t ObjectFetcher::chunk_digest(const ObjectData& chunk) {
  return XXH3_64bits(chunk.bytes().data(), chunk.size());
}

void ObjectFetcher::verify_chunk(const DatasetSnapshot& dataset, uint32_t entry,
                                 uint32_t chunk_index, const ObjectData& chunk, uint64_t digest) {
  if (chunk_digest(chunk) == digest) return;
  stats_.checksum_mismatches.fetch_add(1, std::memory_order_relaxed);
  const std::string message = fmt::format(
      "{}/{} (object {} of generation {}): chunk {} differs from the one verified earlier: "
      "refusing to serve it",
      dataset.name(), store::log_text(dataset.catalog->path(entry)),
      dataset.catalog->entry(entry).object_id, dataset.generation(), chunk_index);
  spdlog::error("{}", message);
  throw IntegrityError(IntegrityError::Kind::kChecksum, message);
}

uint32_t crc32c(uint32_t crc, const void* data, size_t length) {
  // No CRC-32C library is installed here; a table-driven loop is plenty for --verify.
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* bytes = static_cast<const uint8_t*>(data);
  crc = ~crc;
  for (size_t i = 0; i < length; ++i) crc = table[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

}  // namespace dsfs::prefetch
