#pragma once
// One dataset as a mount sees it: the generation that was current when it was loaded.
#include <xxhash.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "src/catalog/catalog.h"
#include "src/catalog/dataset.h"

namespace dsfs::prefetch {

// Which ingest made the generation `info` describes, never 0: a name and generation number
// alone can be made twice (in another namespace or Redis, or again after Redis lost its data),
// a manifest and its publish time hardly (the manifest holds every file's checksum unless
// ingested with `--checksum none`).
inline uint64_t ingest_identity(const catalog::DatasetInfo& info) {
  const std::array<uint64_t, 3> fields = {info.generation, info.manifest_xxh64,
                                          static_cast<uint64_t>(info.created_unix)};
  const uint64_t identity = XXH3_64bits(fields.data(), sizeof fields);
  return identity == 0 ? 1 : identity;
}

// Thread safety: immutable after the mount loads it (info and the catalogue never change for the
// mount's lifetime), but for gone(), set once by the watcher; shared by every thread without a
// lock.
struct DatasetSnapshot {
  uint32_t index = 0;  // position among the mount's datasets; part of every cache key
  catalog::DatasetInfo info;
  std::shared_ptr<const catalog::Catalog> catalog;

  const std::string& name() const { return info.name; }
  uint64_t generation() const { return info.generation; }
  // What the disk tier checks its files against (DiskTierKey::ingest).
  uint64_t ingest_identity() const { return prefetch::ingest_identity(info); }

  // The dataset was removed from Redis, or made again there under this generation number: its
  // keys are gone or hold another dataset's objects now, so nothing of it is fetched from Redis
  // any more (what the memory cache and the disk tier hold of it is still its own).
  bool gone() const { return gone_->load(std::memory_order_acquire); }
  void mark_gone() const { gone_->store(true, std::memory_order_release); }

 private:
  // Shared by copies (the table keeps the one stored); never null.
  std::shared_ptr<std::atomic<bool>> gone_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace dsfs::prefetch
