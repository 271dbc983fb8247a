#pragma once
// Redis key naming, schema version 1 (docs/schema.md is the reference).
#include <cstdint>
#include <string>
#include <string_view>

namespace dsfs::catalog {

inline constexpr uint32_t kSchemaVersion = 1;
inline constexpr uint64_t kDefaultChunkSize = 4ull << 20;
inline constexpr uint64_t kManifestChunkSize = 8ull << 20;

class KeySchema {
 public:
  explicit KeySchema(std::string ns = "dsfs");  // validates ns
  const std::string& ns() const { return ns_; }

  std::string datasets() const;                              // ns:datasets (set)
  std::string info(std::string_view name) const;             // ns:{name}:info (hash)
  std::string generations(std::string_view name) const;      // ns:{name}:gens (set of every
                                                             // generation with keys, for GC)
  std::string next_generation(std::string_view name) const;  // ns:{name}:nextgen (counter)
  std::string published(std::string_view name) const;        // ns:{name}:published (set of every
                                                             // generation that was ever current)
  std::string readers(std::string_view name) const;  // ns:{name}:readers (sorted set of leases:
                                                     // "GEN:READER" scored by expiry in ms)
  std::string manifest_chunk(std::string_view name, uint64_t gen, uint64_t index) const;
  std::string object(std::string_view name, uint64_t gen, uint64_t id) const;  // ns:name:gen:o:id
  std::string object_chunk(std::string_view name, uint64_t gen, uint64_t id, uint64_t k) const;
  // Where piece k of object id lives: a file stored in one piece uses the plain object key,
  // a chunked one (Catalog::chunk_count > 1) the chunk keys. The one place that rule is kept.
  std::string object_piece(std::string_view name, uint64_t gen, uint64_t id, uint64_t k,
                           bool chunked) const;
  // SCAN MATCH patterns: every key of one generation's objects / of one dataset's objects.
  std::string generation_objects_pattern(std::string_view name, uint64_t gen) const;
  std::string dataset_objects_pattern(std::string_view name) const;
  // SCAN MATCH patterns: manifest chunks of one generation / of every generation.
  std::string generation_manifest_pattern(std::string_view name, uint64_t gen) const;
  std::string dataset_manifests_pattern(std::string_view name) const;

 private:
  std::string ns_;
};

}  // namespace dsfs::catalog
