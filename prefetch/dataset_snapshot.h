#pragma once
// One dataset as a mount sees it: the generation that was current when it was loaded.
#include <xxhash.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "src/catalog/catalog.h"
#include "src/catalog/dataset.h"

namespace dsfs::prefetch {

// Thread safety: immutable after the mount loads it (info and the catalogue never change for the
// mount's lifetime); shared by every thread without a lock.
struct DatasetSnapshot {
  uint32_t index = 0;  // position among the mount's datasets; part of every cache key
  catalog::DatasetInfo info;
  std::shared_ptr<const catalog::Catalog> catalog;

  const std::string& name() const { return info.name; }
  uint64_t generation() const { return info.generation; }
  // Which ingest made this generation, never 0: a name and generation number alone can be made
  // twice (in another namespace or Redis, or again after Redis lost its data), a manifest and
  // its publish time hardly (the manifest holds every file's checksum unless ingested with
  // `--checksum none`). What the disk tier checks its files against (DiskTierKey::ingest).
  uint64_t ingest_identity() const {
    const std::array<uint64_t, 3> fields = {info.generation, info.manifest_xxh64,
                                            static_cast<uint64_t>(info.created_unix)};
    const uint64_t identity = XXH3_64bits(fields.data(), sizeof fields);
    return identity == 0 ? 1 : identity;
  }
};

}  // namespace dsfs::prefetch
