#pragma once
// The in-memory catalogue of one dataset generation: a compact, immutable tree decoded from the
// manifest. 72 bytes per entry plus its name (and metadata bytes, when present).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dsfs::catalog {

enum class ChecksumKind : uint8_t { kNone = 0, kXxh64 = 1, kCrc32c = 2 };

inline constexpr uint32_t kNoLabel = UINT32_MAX;
inline constexpr uint32_t kRootIndex = 0;

// Entries are stored breadth-first: the root is entry 0, and every directory's children are
// contiguous and sorted by name (bytewise), so lookup is a binary search and readdir a range.
struct CatalogEntry {
  uint32_t parent;       // entry index of the parent directory (root: 0)
  uint32_t name_offset;  // into Catalog::names()
  uint16_t name_length;
  uint8_t is_dir;  // 1 directory, 0 regular file
  uint8_t reserved = 0;
  uint32_t mode;         // permission bits only (e.g. 0644)
  uint32_t label;        // class index, or kNoLabel
  uint32_t first_child;  // directories: index of first child; files: 0
  uint32_t child_count;  // directories: number of children; files: 0
  uint32_t metadata_length;
  int64_t mtime_ns;
  uint64_t size;             // file size in bytes; directories: 0
  uint64_t object_id;        // files: object id in Redis; directories: 0
  uint64_t checksum;         // of the whole file, per Catalog::checksum_kind()
  uint64_t metadata_offset;  // into Catalog::metadata()
};

// Thread safety: immutable once built or decoded; every const member function may be called
// from any number of threads at once without a lock.
class Catalog {
 public:
  Catalog() = default;

  size_t entry_count() const { return entries_.size(); }
  size_t file_count() const { return file_count_; }
  size_t directory_count() const { return entries_.size() - file_count_; }
  uint64_t total_bytes() const { return total_bytes_; }
  ChecksumKind checksum_kind() const { return checksum_kind_; }
  uint64_t chunk_size() const { return chunk_size_; }
  const std::vector<std::string>& classes() const { return classes_; }

  const CatalogEntry& entry(uint32_t index) const { return entries_[index]; }
  std::string_view name(uint32_t index) const;
  std::string_view metadata(uint32_t index) const;  // JSON object text, or empty
  // Path relative to the dataset root, '/'-separated ("" for the root).
  std::string path(uint32_t index) const;
  // Child of directory `dir` named `name`, if any.
  std::optional<uint32_t> lookup(uint32_t dir, std::string_view name) const;
  // Entry for a relative path such as "cls/img.jpg".
  std::optional<uint32_t> find(std::string_view relative_path) const;
  // Objects needed for a file: ceil(size / chunk_size), at least 1; a file with one chunk is
  // stored under the plain object key, more under object_chunk keys.
  uint64_t chunk_count(uint32_t index) const;

  // Approximate bytes this catalogue holds in memory (for stats and the memory benchmark).
  size_t memory_bytes() const;

 private:
  friend class CatalogBuilder;
  friend Catalog decode_manifest(std::span<const std::byte>);
  std::vector<CatalogEntry> entries_;
  std::string names_;
  std::string metadata_;
  std::vector<std::string> classes_;
  ChecksumKind checksum_kind_ = ChecksumKind::kXxh64;
  uint64_t chunk_size_ = 0;
  size_t file_count_ = 0;
  uint64_t total_bytes_ = 0;
};

// Builds a Catalog from files added in any order (ingest side). Directories are created for
// every path prefix; add_directory is only needed for empty directories or to set mtime/mode.
// Thread safety: not synchronized; one thread builds, then hands the Catalog over.
// A sample's metadata nests arrays and objects at most this deep. Parsing and printing JSON
// (nlohmann's dump) recurse once per level: metadata 60,000 levels deep overflowed the stack of
// the FUSE thread that rendered .meta/NAME/metadata.jsonl, killing the mount.
inline constexpr size_t kMaxMetadataDepth = 64;

// How deep arrays and objects nest in JSON text (0 for a scalar), strings skipped; for a check
// before anything recursive touches text that a user or Redis supplied. Never recurses. Counts
// only brackets: the text need not be valid JSON.
size_t json_nesting_depth(std::string_view json);

class CatalogBuilder {
 public:
  CatalogBuilder(ChecksumKind checksum_kind, uint64_t chunk_size);
  void set_classes(std::vector<std::string> classes);
  // relative_path: '/'-separated components each valid per is_valid_path_component; throws
  // std::invalid_argument otherwise, on a duplicate path, or on metadata that is not a JSON
  // object or nests deeper than kMaxMetadataDepth. Returns nothing: object ids are
  // assigned by add order via `object_id`.
  void add_file(std::string_view relative_path, uint64_t size, int64_t mtime_ns, uint32_t mode,
                uint64_t object_id, uint32_t label, uint64_t checksum, std::string metadata_json);
  void add_directory(std::string_view relative_path, int64_t mtime_ns, uint32_t mode);
  // Sorts into breadth-first order and produces the catalogue.
  Catalog build() &&;

 private:
  // A node of the tree being built; the name lives in the parent's child map.
  struct PendingEntry {
    uint32_t parent = 0;
    bool is_dir = false;
    bool explicit_dir = false;  // add_directory set its mtime/mode
    uint32_t mode = 0;
    uint32_t label = kNoLabel;
    int64_t mtime_ns = 0;
    uint64_t size = 0;
    uint64_t object_id = 0;
    uint64_t checksum = 0;
    std::string metadata;
    uint32_t children = UINT32_MAX;  // directories: index into child_maps_
  };
  using ChildMap = std::unordered_map<std::string, uint32_t>;  // name -> pending_ index
  // Returns the directory for `components[0..count)`, creating missing ones; throws if a prefix
  // is a file.
  uint32_t ensure_directory(std::string_view relative_path,
                            const std::vector<std::string_view>& components, size_t count);
  ChecksumKind checksum_kind_;
  uint64_t chunk_size_;
  std::vector<std::string> classes_;
  std::vector<PendingEntry> pending_;  // [0] is the root
  std::vector<ChildMap> child_maps_;
};

}  // namespace dsfs::catalog
