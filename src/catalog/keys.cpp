#include "src/catalog/keys.h"

#include <fmt/core.h>

#include "src/catalog/names.h"

namespace dsfs::catalog {

KeySchema::KeySchema(std::string ns) : ns_(std::move(ns)) {
  validate_namespace(ns_);
}

std::string KeySchema::datasets() const {
  return fmt::format("{}:datasets", ns_);
}

// {name} is a Redis Cluster hash tag: info, gens, nextgen, readers and manifest chunks share one
// slot, so the publishing MULTI/EXEC touches one shard.
std::string KeySchema::info(std::string_view name) const {
  return fmt::format("{}:{{{}}}:info", ns_, name);
}

std::string KeySchema::generations(std::string_view name) const {
  return fmt::format("{}:{{{}}}:gens", ns_, name);
}

std::string KeySchema::next_generation(std::string_view name) const {
  return fmt::format("{}:{{{}}}:nextgen", ns_, name);
}

std::string KeySchema::published(std::string_view name) const {
  return fmt::format("{}:{{{}}}:published", ns_, name);
}

std::string KeySchema::readers(std::string_view name) const {
  return fmt::format("{}:{{{}}}:readers", ns_, name);
}

std::string KeySchema::manifest_chunk(std::string_view name, uint64_t gen, uint64_t index) const {
  return fmt::format("{}:{{{}}}:manifest:{}:{}", ns_, name, gen, index);
}

// Object keys carry no hash tag so they spread over every cluster slot.
std::string KeySchema::object(std::string_view name, uint64_t gen, uint64_t id) const {
  return fmt::format("{}:{}:{}:o:{}", ns_, name, gen, id);
}

std::string KeySchema::object_chunk(std::string_view name, uint64_t gen, uint64_t id,
                                    uint64_t k) const {
  return fmt::format("{}:{}:{}:o:{}:{}", ns_, name, gen, id, k);
}

std::string KeySchema::object_piece(std::string_view name, uint64_t gen, uint64_t id, uint64_t k,
                                    bool chunked) const {
  return chunked ? object_chunk(name, gen, id, k) : object(name, gen, id);
}

// Names and namespaces cannot hold ':' or glob characters, so these patterns match exactly one
// dataset's (or generation's) object keys and nothing of another dataset.
std::string KeySchema::generation_objects_pattern(std::string_view name, uint64_t gen) const {
  return fmt::format("{}:{}:{}:o:*", ns_, name, gen);
}

std::string KeySchema::dataset_objects_pattern(std::string_view name) const {
  return fmt::format("{}:{}:*:o:*", ns_, name);
}

// '{' and '}' are literal in Redis glob patterns.
std::string KeySchema::generation_manifest_pattern(std::string_view name, uint64_t gen) const {
  return fmt::format("{}:{{{}}}:manifest:{}:*", ns_, name, gen);
}

std::string KeySchema::dataset_manifests_pattern(std::string_view name) const {
  return fmt::format("{}:{{{}}}:manifest:*", ns_, name);
}

}  // namespace dsfs::catalog
