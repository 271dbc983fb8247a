// The manifest decoder over any bytes: a catalogue or ManifestError, never a crash. A decoded
// catalogue is walked whole, so any entry it accepted is safe to use.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <xxhash.h>

#include "src/catalog/manifest.h"

// Most mutations break the trailing XXH64, which is checked before anything else is decoded; so
// half the inputs get a correct trailer written over their last 8 bytes, to reach the decoder
// proper (what a manifest written by a buggy or hostile tool would look like).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::byte> bytes(reinterpret_cast<const std::byte*>(data),
                               reinterpret_cast<const std::byte*>(data) + size);
  if (size > 8 && (data[size - 1] & 1)) {
    const uint64_t hash = XXH64(bytes.data(), size - 8, 0);
    for (int i = 0; i < 8; ++i) bytes[size - 8 + i] = static_cast<std::byte>(hash >> (8 * i));
  }
  try {
    const dsfs::catalog::Catalog catalog = dsfs::catalog::decode_manifest(bytes);
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < catalog.entry_count(); ++i) {
      const auto& entry = catalog.entry(i);
      bytes += entry.is_dir ? 0 : entry.size;
      (void)catalog.name(i);
      (void)catalog.metadata(i);
    }
    if (bytes != catalog.total_bytes()) __builtin_trap();
  } catch (const dsfs::catalog::ManifestError&) {
  }
  return 0;
}
