#include "prefetch/object_cache.h"

#include <xxhash.h>

#include "prefetch/object_cache_impl.h"

namespace dsfs::prefetch {

size_t ObjectKeyHash::operator()(const ObjectKey& key) const {
  const uint64_t words[3] = {(uint64_t{key.dataset} << 32) | key.chunk, key.generation,
                             key.object_id};
  return static_cast<size_t>(XXH3_64bits(words, sizeof(words)));
}

template class BasicObjectCache<ObjectKey, ObjectKeyHash>;

}  // namespace dsfs::prefetch
