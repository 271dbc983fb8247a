#pragma once
// The binary manifest (schema version 1): encode a Catalog to bytes and decode it back.
// Layout is documented in docs/schema.md. Decoding is defensive: any truncation, bad offset,
// bad name, broken tree order or checksum mismatch throws ManifestError, never crashes.
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/catalog/catalog.h"

namespace dsfs::catalog {

class ManifestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::vector<std::byte> encode_manifest(const Catalog& catalog);
Catalog decode_manifest(std::span<const std::byte> bytes);

}  // namespace dsfs::catalog
