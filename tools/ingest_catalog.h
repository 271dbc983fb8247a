#pragma once
// Turning what a source read into the dataset's catalogue: ImageFolder labels and per-sample
// metadata from a JSONL file.
#include <cstdint>
#include <filesystem>
#include <istream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/catalog/catalog.h"
#include "tools/sources.h"

namespace dsfs::tools {

enum class LabelMode { kAuto, kNone };
// "auto" / "none"; throws std::invalid_argument otherwise.
LabelMode parse_label_mode(std::string_view text);

// The classes of an ImageFolder layout, exactly as torchvision assigns them: the first-level
// directories (empty ones included), sorted as Python sorts the names it decodes (by code point;
// bytes that are not UTF-8 as surrogate escapes), which is bytewise for valid UTF-8.
std::vector<std::string> image_folder_classes(const SourceContents& contents);
// The label of a file at `path`: the index of its first-level directory in `classes`, or
// catalog::kNoLabel for a file directly in the root or under no listed class.
uint32_t image_folder_label(std::string_view path, const std::vector<std::string>& classes);

// Per-sample metadata keyed by relative path; values are compact JSON object text.
struct SampleMetadata {
  std::unordered_map<std::string, std::string> by_path;
};
// Each non-blank line is a JSON object with a string member "path"; the other members become
// that path's metadata. Throws std::invalid_argument naming file:line for malformed JSON, a
// line that is not an object, a missing or non-string "path", or a path given twice.
SampleMetadata parse_metadata_jsonl(std::istream& in, std::string_view file_name);
SampleMetadata load_metadata_file(const std::filesystem::path& file);

struct CatalogBuildStats {
  uint64_t metadata_attached = 0;
  uint64_t metadata_unknown_paths = 0;  // metadata lines naming no file of the dataset
};

// Builds the catalogue: directories with their mtimes and modes, files with labels (per
// `labels`) and metadata. Throws std::invalid_argument if two entries collide (a path that is
// both a file and a directory).
catalog::Catalog build_catalog(const SourceContents& contents, LabelMode labels,
                               const SampleMetadata* metadata, catalog::ChecksumKind checksum,
                               uint64_t chunk_size, CatalogBuildStats* stats = nullptr);

}  // namespace dsfs::tools
