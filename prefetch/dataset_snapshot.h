#pragma once
// One dataset as a mount sees it: the generation that was current when it was loaded.
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
};

}  // namespace dsfs::prefetch
