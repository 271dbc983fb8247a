#pragma once
// Fetches a file's objects from Redis and checks them against the catalogue before anyone
// sees them: a wrong length, a missing key or (when asked) a wrong checksum is an error, never
// wrong bytes.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "prefetch/dataset_snapshot.h"
#include "prefetch/disk_tier.h"
#include "prefetch/object_data.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "src/store/log_limiter.h"
#include "src/store/thread_annotations.h"

namespace dsfs::prefetch {

// The stored data does not match the catalogue. Retrying will not help.
class IntegrityError : public std::runtime_error {
 public:
  enum class Kind { kMissing, kLength, kChecksum };
  IntegrityError(Kind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct FetcherOptions {
  // How long a fetch keeps retrying while Redis is unreachable before it fails.
  std::chrono::milliseconds timeout{30000};
  // GETs outstanding at once on one connection when a read needs several chunks.
  size_t pipeline_window = 8;
  // A read of a file whose fetch failed less than this ago is most likely the kernel re-issuing
  // the READ that just failed (within microseconds); another full try against a stalled Redis
  // would make one read(2) wait the timeout twice. So it first asks a fresh connection for a
  // PING with this much time to connect and answer: it fails at once unless Redis answers (it
  // may have just come back), and tries once if it does.
  std::chrono::milliseconds reissue_window{100};
  // The local-disk tier (--disk-cache), or null: looked in before Redis, and given every object
  // fetched from Redis to write behind. Must outlive the fetcher.
  DiskTier* disk_tier = nullptr;
};

struct FetcherStats {
  std::atomic<uint64_t> round_trips{0};
  std::atomic<uint64_t> gets{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> retries{0};
  std::atomic<uint64_t> missing{0};
  std::atomic<uint64_t> length_mismatches{0};
  std::atomic<uint64_t> checksum_mismatches{0};
  std::atomic<uint64_t> unavailable{0};   // fetches that failed because Redis was unreachable
  std::atomic<uint64_t> reply_errors{0};  // Redis answered with an error
};

// Thread safety: internally synchronized; fetch_chunks and the verify functions are called
// concurrently by FUSE workers and the engine. Connections come from the (synchronized) client;
// stats_ holds atomics; failed_mutex_ guards recently_failed_.
// options_ and keys_ are immutable after construction.
class ObjectFetcher {
 public:
  ObjectFetcher(store::Client& client, catalog::KeySchema keys, FetcherOptions options);

  // GETs chunks `chunks` of file `entry` (pipelined on one connection) and returns them in
  // that order, each checked for its exact length. Chunks the disk tier holds (and that check
  // out there) are read from it instead; those fetched from Redis are queued to it. Throws
  // IntegrityError, store::ReplyError, or store::ConnectionError once Redis has been unreachable
  // for the whole timeout (or at the first failure while an earlier fetch has already waited that
  // long and Redis is not back).
  std::vector<ObjectBuffer> fetch_chunks(const DatasetSnapshot& dataset, uint32_t entry,
                                         std::span<const uint32_t> chunks);

  // Checks the catalogue's checksum of file `entry` over all of its chunks, in order. Throws
  // IntegrityError on a mismatch.
  void verify_checksum(const DatasetSnapshot& dataset, uint32_t entry,
                       std::span<const ObjectBuffer> all_chunks);

  // A chunk's own digest, taken from chunks whose file passed verify_checksum, so that one chunk
  // fetched again later can be checked alone (verify_chunk) without refetching the whole file.
  static uint64_t chunk_digest(const ObjectData& chunk);
  // Throws IntegrityError (counted as a checksum mismatch) unless chunk_digest(chunk) == digest.
  void verify_chunk(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk_index,
                    const ObjectData& chunk, uint64_t digest);

  // The Redis key and the exact length of chunk `chunk` of file `entry`.
  std::string chunk_key(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk) const;
  static uint64_t chunk_length(const catalog::Catalog& catalog, uint32_t entry, uint32_t chunk);

  // Queues chunk `chunk` of file `entry`, fetched from Redis elsewhere (the engine's
  // prefetches: not read yet this epoch), to the disk tier; a no-op without one. Never blocks on
  // disk.
  void offer_to_disk(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk,
                     ObjectBuffer buffer);
  DiskTier* disk_tier() const { return options_.disk_tier; }
  // Chunk `chunk` of file `entry` from the disk tier (checked there), or null: no tier, not on
  // disk, or dropped as damaged. Reads the disk on the calling thread.
  ObjectBuffer read_from_disk(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk) const;
  // Whether the disk tier's index has chunk `chunk` of file `entry` (no disk access; false
  // without a tier). read_from_disk() may still miss.
  bool on_disk(const DatasetSnapshot& dataset, uint32_t entry, uint32_t chunk) const;

  const FetcherStats& stats() const { return stats_; }
  // Whether some node has failed a whole timeout and not answered since.
  bool redis_down() const { return client_.some_node_unanswered(); }
  const FetcherOptions& options() const { return options_; }
  store::Client& client() const { return client_; }

 private:
  // fetch_chunks without the disk tier.
  std::vector<ObjectBuffer> fetch_from_redis(const DatasetSnapshot& dataset, uint32_t entry,
                                             std::span<const uint32_t> chunks);
  // True if a fresh connection (not the pool's) connects and answers PING within `limit`.
  bool answers_within(std::chrono::milliseconds limit) const;

  store::Client& client_;
  catalog::KeySchema keys_;
  FetcherOptions options_;
  FetcherStats stats_;
  // Errors every read may meet (a dataset removed under the mount, a password changed) are
  // logged at most a few times per window each, with how many were held back.
  store::LogLimiter missing_log_;
  store::LogLimiter length_log_;
  store::LogLimiter reply_error_log_;
  store::LogLimiter unavailable_log_;
  Mutex failed_mutex_;
  // Files (dataset index << 32 | entry) whose fetch failed after waiting the whole timeout, and
  // when. Until the timeout has passed again, a fetch of the same file tries once: the kernel
  // re-issues a failed READ (the readahead, then the page), and a success of another file
  // clears a shard's down mark, so with Redis half-reachable one read(2) waited several
  // timeouts before EIO. Entries go on success, or when found expired.
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> recently_failed_
      DSFS_GUARDED_BY(failed_mutex_);
};

// CRC-32C (Castagnoli), for manifests that record it instead of XXH64.
uint32_t crc32c(uint32_t crc, const void* data, size_t length);

}  // namespace dsfs::prefetch
