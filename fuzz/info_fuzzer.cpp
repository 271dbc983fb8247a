// The info hash parser over any HGETALL reply (fields and values split at NUL bytes of the
// input): a DatasetInfo or an error naming the damage, never a crash.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/catalog/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> flat(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      flat.emplace_back();
    } else {
      flat.back() += static_cast<char>(data[i]);
    }
  }
  try {
    const dsfs::catalog::DatasetInfo info = dsfs::catalog::parse_info("fuzz", flat);
    if (info.generation == 0 || info.chunk_size == 0) __builtin_trap();
  } catch (const std::runtime_error&) {  // DatasetDamaged, or a newer schema version
  }
  return 0;
}
