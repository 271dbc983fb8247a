#pragma once
// Dataset-level operations on Redis: list, info, load a generation's catalogue, publish a new
// generation atomically, remove, garbage-collect old generations, and the readers' leases that
// keep a generation from being collected while it is mounted. All of them go through a
// store::Client, so a single server and a Redis Cluster are the same to them: a dataset's own
// keys (NS:{NAME}:...) share one slot, its objects spread over every node, and the SCANs of
// rm and GC walk every primary.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"

namespace dsfs::catalog {

class DatasetNotFound : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The dataset's keys in Redis are not what dsfs wrote: its info hash is corrupt, of another type
// (WRONGTYPE), or names a manifest that is missing. Other datasets are unaffected: listing and
// mounting all datasets skip this one with its reason, and `dsfs rm` still removes it.
class DatasetDamaged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The info hash. Field names in Redis are the member names.
struct DatasetInfo {
  std::string name;
  uint32_t schema_version = kSchemaVersion;
  uint64_t generation = 0;
  uint64_t previous_generation = 0;  // 0: none
  uint64_t file_count = 0;
  uint64_t dir_count = 0;
  uint64_t total_bytes = 0;
  uint64_t class_count = 0;
  int64_t created_unix = 0;  // when this generation was published
  std::string source;        // what was ingested (path or URL list)
  uint64_t chunk_size = kDefaultChunkSize;
  uint64_t manifest_chunks = 0;
  uint64_t manifest_bytes = 0;
  uint64_t manifest_xxh64 = 0;  // of the whole manifest byte string
};

// Published datasets (those whose info key exists), sorted. A name in the set that is not a valid
// dataset name is listed too; read_info reports it as damaged. `unpublished` (if given) gets the
// names in the set with no info, sorted: an ingest running, or one interrupted before its first
// publish that left its objects (dsfs rm removes them).
std::vector<std::string> list_datasets(store::Client& client, const KeySchema& keys,
                                       std::vector<std::string>* unpublished = nullptr);

// One dataset of a listing: its info, or why it cannot be served.
struct DatasetStatus {
  std::string name;
  std::optional<DatasetInfo> info;  // set when healthy
  std::string damage;               // set when not: the reason, escaped for printing
};

// Reads the info of every published dataset and checks that the manifest its current
// generation names exists (one pipelined EXISTS each; the manifest's checksum is checked when a
// mount loads it). A damaged dataset is reported in `damage`, never thrown: one bad dataset does
// not hide the others. Throws store errors only (Redis unreachable, the datasets set damaged).
std::vector<DatasetStatus> list_dataset_status(store::Client& client, const KeySchema& keys,
                                               std::vector<std::string>* unpublished = nullptr);

// Throws DatasetNotFound ("dataset 'x' not found in namespace 'dsfs' on <endpoint>; see
// `dsfs list`"), DatasetDamaged if the hash is corrupt or not a hash (or the name stored in the
// datasets set is not a valid name), or std::runtime_error if it is of a newer schema version.
DatasetInfo read_info(store::Client& client, const KeySchema& keys, const std::string& name);

// Fetches and decodes the manifest of info.generation. Throws ManifestError if chunks are
// missing, the length or xxh64 disagree with info, or decoding fails.
// The info hash of `name` from its HGETALL reply (field, value, field, value...): what read_info
// does once the reply is in. Throws DatasetDamaged, or std::runtime_error for a newer schema.
DatasetInfo parse_info(const std::string& name, const std::vector<std::string>& flat_fields);

std::shared_ptr<const Catalog> load_catalog(store::Client& client, const KeySchema& keys,
                                            const DatasetInfo& info);

// How a Redis that evicts keys would lose objects of every dataset on it, without a word: for
// the first primary whose maxmemory-policy is allkeys-* (any key may be evicted when it is full),
// "Redis at NODE evicts any key when full (maxmemory-policy P, maxmemory N)"; empty when none
// does, or INFO is not allowed. `*limited` (if given) is set when that node has a maxmemory, so
// eviction can start now (without one it starts only once a maxmemory is set).
std::string eviction_risk(store::Client& client, bool* limited = nullptr);

// Allocates a fresh generation number (INCR nextgen) and records it in the gens set.
uint64_t begin_generation(store::Client& client, const KeySchema& keys, const std::string& name);

// Writes the manifest chunks of info.generation, then flips info (MULTI/EXEC, one slot) so the
// new generation becomes current, then SADDs the name to the datasets set. Fills in
// info.manifest_* and info.previous_generation. Objects must already be written.
// `before_flip`, if given, runs once the manifest is written, just before the flip: what it
// throws leaves the generation unpublished (an ingest interrupted meanwhile).
void publish(store::Client& client, const KeySchema& keys, DatasetInfo& info,
             const Catalog& catalog, const std::function<void()>& before_flip = {});

// Deletes keys of every generation of `name` except the current one, `keep_previous` published
// ones before it, and any generation pinned by an unexpired lease (pinned_generations, which
// also drops expired leases), in SCAN+UNLINK batches. Returns keys deleted.
uint64_t collect_garbage(store::Client& client, const KeySchema& keys, const std::string& name,
                         unsigned keep_previous = 1);

// Takes `name` out of the datasets set if it has no info and no generation left: a first ingest
// that failed, its generation deleted, left nothing else (list named it as an ingest that left
// what it wrote). A publish begun meanwhile adds the name again when it flips. Returns whether
// it was taken out.
bool forget_if_nothing_left(store::Client& client, const KeySchema& keys, const std::string& name);

// Deletes every object and manifest chunk of generation `gen` of `name` (SCAN+UNLINK batches),
// then its entry in the gens set, last, so that an interrupted deletion is found and redone by
// the next collection. Returns keys deleted. The caller makes sure `gen` is not the current one.
uint64_t delete_generation(store::Client& client, const KeySchema& keys, const std::string& name,
                           uint64_t gen);

// ---- Leases ------------------------------------------------------------------------------------
// A reader serving a generation (a mount) holds a lease on it in NS:{NAME}:readers, a sorted set
// whose members are "GEN:READER_ID" scored by their expiry in milliseconds of the Redis server's
// clock (TIME), so hosts with skewed clocks agree. GC keeps every generation with an unexpired
// lease; a reader that dies without unpinning stops refreshing, and its lease expires after ttl.

// A reader id unique to this process and call: "HOST:PID:RANDOM".
std::string make_reader_id();

// Pins generation `gen` of `name` for `reader_id` until ttl from now (server time), or extends
// that lease (refresh). Returns true if the lease did not exist before: a first pin, or a lease
// that had expired and been dropped by GC, which may have collected the generation since.
// Two round trips (TIME, ZADD). Throws std::invalid_argument for an empty id or a ttl <= 0.
bool pin_generation(store::Client& client, const KeySchema& keys, const std::string& name,
                    const std::string& reader_id, uint64_t gen, std::chrono::milliseconds ttl);

// Drops the lease of `reader_id` on `gen` (no error if there is none).
void unpin_generation(store::Client& client, const KeySchema& keys, const std::string& name,
                      const std::string& reader_id, uint64_t gen);

// Reads info and pins its current generation for `reader_id`, re-reading until the pinned
// generation is still current: generations only grow and GC never touches the current one, so
// no collection, even one already running, can delete it. Returns the info pinned.
// Throws like read_info, or std::runtime_error if the dataset keeps changing.
DatasetInfo pin_current_generation(store::Client& client, const KeySchema& keys,
                                   const std::string& name, const std::string& reader_id,
                                   std::chrono::milliseconds ttl);

// Generations pinned by unexpired leases; drops the expired ones (entries it cannot parse are
// ignored and left alone). Two round trips (TIME, then ZREMRANGEBYSCORE + ZRANGEBYSCORE).
std::set<uint64_t> pinned_generations(store::Client& client, const KeySchema& keys,
                                      const std::string& name);

// Members ("GEN:READER_ID") of the unexpired leases on `name`, by the server's clock: the
// readers (mounts) using it now. Two round trips; changes nothing.
std::vector<std::string> live_leases(store::Client& client, const KeySchema& keys,
                                     const std::string& name);

// Removes every key of the dataset (info, manifests, objects of all generations, leases) in
// batches, and its name from the datasets set, but for its generation counter (nextgen): a
// dataset made again under the name goes on from the next generation number, never one the
// removed dataset had. Throws DatasetNotFound if it does not exist (the counter alone does not
// count).
// progress(keys_deleted) is called after each batch.
uint64_t remove_dataset(store::Client& client, const KeySchema& keys, const std::string& name,
                        const std::function<void(uint64_t)>& progress = {});

}  // namespace dsfs::catalog
