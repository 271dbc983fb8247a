#pragma once
// Dataset-level operations on Redis: list, info, load a generation's catalogue, publish a new
// generation atomically, remove, and garbage-collect old generations.
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/catalog/catalog.h"
#include "src/catalog/keys.h"
#include "src/store/connection.h"

namespace dsfs::catalog {

class DatasetNotFound : public std::runtime_error {
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

std::vector<std::string> list_datasets(store::Connection& conn, const KeySchema& keys);

// Throws DatasetNotFound ("dataset 'x' not found in namespace 'dsfs' on <endpoint>; see
// `dsfs list`") or std::runtime_error if the hash is corrupt / of a newer schema version.
DatasetInfo read_info(store::Connection& conn, const KeySchema& keys, const std::string& name);

// Fetches and decodes the manifest of info.generation. Throws ManifestError if chunks are
// missing, the length or xxh64 disagree with info, or decoding fails.
std::shared_ptr<const Catalog> load_catalog(store::Connection& conn, const KeySchema& keys,
                                            const DatasetInfo& info);

// Allocates a fresh generation number (INCR nextgen) and records it in the gens set.
uint64_t begin_generation(store::Connection& conn, const KeySchema& keys, const std::string& name);

// Writes the manifest chunks of info.generation, then flips info (MULTI/EXEC, one slot) so the
// new generation becomes current, then SADDs the name to the datasets set. Fills in
// info.manifest_* and info.previous_generation. Objects must already be written.
void publish(store::Connection& conn, const KeySchema& keys, DatasetInfo& info,
             const Catalog& catalog);

// Deletes keys of every generation of `name` except the current one and `keep_previous` ones
// before it (a mounted reader keeps its snapshot), in SCAN+UNLINK batches.
// Returns keys deleted.
uint64_t collect_garbage(store::Connection& conn, const KeySchema& keys, const std::string& name,
                         unsigned keep_previous = 1);

// Removes every key of the dataset (info, manifests, objects of all generations) in batches,
// and its name from the datasets set. Throws DatasetNotFound if it does not exist.
// progress(keys_deleted) is called after each batch.
uint64_t remove_dataset(store::Connection& conn, const KeySchema& keys, const std::string& name,
                        const std::function<void(uint64_t)>& progress = {});

}  // namespace dsfs::catalog
