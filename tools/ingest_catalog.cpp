#include "tools/ingest_catalog.h"

#include <fmt/core.h>
#include <linux/limits.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "src/store/log_text.h"

namespace dsfs::tools {
namespace {

std::string_view first_component(std::string_view path) {
  return path.substr(0, path.find('/'));
}

// Metadata paths are matched like list paths: "./a/b" and "a//b" name "a/b".
std::string metadata_key(std::string_view path) {
  std::string key;
  while (!path.empty()) {
    const auto slash = path.find('/');
    const std::string_view component = path.substr(0, slash);
    path = slash == std::string_view::npos ? std::string_view{} : path.substr(slash + 1);
    if (component.empty() || component == ".") continue;
    if (!key.empty()) key += '/';
    key += component;
  }
  return key;
}

// Python's view of a file name: os.fsdecode decodes UTF-8 with surrogateescape, so every byte
// that is not part of a well-formed UTF-8 sequence becomes the code point U+DC00 + byte.
// torchvision sorts class names as such str, by code point; for valid UTF-8 that is bytewise
// order, but an escaped byte (0xDC80..0xDCFF) sorts before U+E000 and above, unlike its byte.
class PythonCodePoints {
 public:
  explicit PythonCodePoints(std::string_view name) : rest_(name) {}
  bool done() const { return rest_.empty(); }
  char32_t next() {
    const auto byte = [&](size_t i) { return static_cast<unsigned char>(rest_[i]); };
    const unsigned char lead = byte(0);
    size_t length = 1;
    char32_t value = lead;
    unsigned char low = 0x80, high = 0xBF;  // bounds of the second byte (Unicode table 3-7)
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
      value = lead & 0x1F;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      value = lead & 0x0F;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;  // no UTF-8-encoded surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      value = lead & 0x07;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    } else if (lead >= 0x80) {
      length = 0;  // a continuation byte or an invalid lead byte
    }
    bool valid = length > 0 && length <= rest_.size();
    for (size_t i = 1; valid && i < length; ++i) {
      const unsigned char b = byte(i);
      valid = i == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
      value = (value << 6) | (b & 0x3F);
    }
    if (!valid) {
      rest_.remove_prefix(1);
      return 0xDC00 + lead;
    }
    rest_.remove_prefix(length);
    return value;
  }

 private:
  std::string_view rest_;
};

// a < b as Python compares os.fsdecode(a) < os.fsdecode(b).
bool python_name_less(std::string_view a, std::string_view b) {
  PythonCodePoints left(a), right(b);
  while (!left.done() && !right.done()) {
    const char32_t x = left.next(), y = right.next();
    if (x != y) return x < y;
  }
  return left.done() && !right.done();
}

}  // namespace

LabelMode parse_label_mode(std::string_view text) {
  if (text == "auto") return LabelMode::kAuto;
  if (text == "none") return LabelMode::kNone;
  throw std::invalid_argument(fmt::format("unknown label mode '{}': use auto or none", text));
}

std::vector<std::string> image_folder_classes(const SourceContents& contents) {
  std::vector<std::string> classes;
  // Sources list entries grouped by directory, so skipping a repeat of the last name keeps the
  // list (and the sort below) about as short as the number of classes, not of files.
  const auto add = [&](std::string_view top) {
    if (classes.empty() || classes.back() != top) classes.emplace_back(top);
  };
  for (const auto& directory : contents.directories) {
    if (!directory.path.empty()) add(first_component(directory.path));
  }
  // Archives and URL lists imply directories by their files' paths.
  for (const auto& file : contents.files) {
    if (file.path.find('/') != std::string::npos) add(first_component(file.path));
  }
  std::sort(classes.begin(), classes.end(), python_name_less);
  classes.erase(std::unique(classes.begin(), classes.end()), classes.end());
  return classes;
}

uint32_t image_folder_label(std::string_view path, const std::vector<std::string>& classes) {
  const auto slash = path.find('/');
  if (slash == std::string_view::npos) return catalog::kNoLabel;
  const std::string_view top = path.substr(0, slash);
  const auto it = std::lower_bound(classes.begin(), classes.end(), top, python_name_less);
  if (it == classes.end() || *it != top) return catalog::kNoLabel;
  return static_cast<uint32_t>(it - classes.begin());
}

SampleMetadata parse_metadata_jsonl(std::istream& in, std::string_view file_name) {
  SampleMetadata metadata;
  std::string line;
  size_t line_number = 0;
  size_t over_xattr_limit = 0;  // samples whose metadata no extended attribute holds
  while (std::getline(in, line)) {
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto where = [&] { return fmt::format("{}:{}", file_name, line_number); };
    // The line's object is the sample's metadata ("path" taken out): the same depth, the one
    // CatalogBuilder checks, told here with the line.
    if (const size_t depth = catalog::json_nesting_depth(line);
        depth > catalog::kMaxMetadataDepth) {
      throw std::invalid_argument(
          fmt::format("{}: the metadata nests {} levels deep (its object included), more than "
                      "dsfs keeps ({}); flatten it",
                      where(), depth, catalog::kMaxMetadataDepth));
    }
    nlohmann::json object;
    try {
      object = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {  // syntax, a number out of range...
      throw std::invalid_argument(
          fmt::format("{}: malformed JSON: {}", where(), store::log_text(e.what())));
    }
    if (!object.is_object()) {
      throw std::invalid_argument(fmt::format("{}: expected a JSON object", where()));
    }
    const auto path_member = object.find("path");
    if (path_member == object.end() || !path_member->is_string()) {
      throw std::invalid_argument(
          fmt::format("{}: every line needs a string member \"path\"", where()));
    }
    std::string key = metadata_key(path_member->get_ref<const std::string&>());
    if (key.empty()) {
      throw std::invalid_argument(fmt::format("{}: \"path\" names no file", where()));
    }
    object.erase(path_member);
    std::string text;
    try {
      if (!object.empty()) text = object.dump();
    } catch (const nlohmann::json::exception& e) {  // a string that is not UTF-8
      throw std::invalid_argument(fmt::format("{}: {}", where(), store::log_text(e.what())));
    }
    if (text.size() > XATTR_SIZE_MAX && ++over_xattr_limit == 1) {
      spdlog::warn(
          "{}: the metadata of '{}' is {} bytes, more than an extended attribute holds ({}): "
          "it is read from .meta/NAME/metadata.jsonl, not as user.dsfs.meta (and so for any "
          "other such sample)",
          where(), store::log_text(key), text.size(), XATTR_SIZE_MAX);
    }
    if (!metadata.by_path.emplace(key, std::move(text)).second) {
      throw std::invalid_argument(fmt::format("{}: path '{}' appears twice", where(), key));
    }
  }
  if (in.bad()) throw std::runtime_error(fmt::format("cannot read '{}'", file_name));
  return metadata;
}

SampleMetadata load_metadata_file(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) {
    throw std::runtime_error(
        fmt::format("cannot read metadata file '{}': {}", file.string(), std::strerror(errno)));
  }
  return parse_metadata_jsonl(in, file.string());
}

catalog::Catalog build_catalog(const SourceContents& contents, LabelMode labels,
                               const SampleMetadata* metadata, catalog::ChecksumKind checksum,
                               uint64_t chunk_size, CatalogBuildStats* stats) {
  CatalogBuildStats local_stats;
  catalog::CatalogBuilder builder(checksum, chunk_size);
  std::vector<std::string> classes;
  if (labels == LabelMode::kAuto) classes = image_folder_classes(contents);
  builder.set_classes(classes);

  for (const auto& directory : contents.directories) {
    builder.add_directory(directory.path, directory.mtime_ns, directory.mode);
  }
  for (const auto& file : contents.files) {
    std::string file_metadata;
    if (metadata) {
      if (const auto it = metadata->by_path.find(file.path); it != metadata->by_path.end()) {
        file_metadata = it->second;
        ++local_stats.metadata_attached;
      }
    }
    const uint32_t label =
        labels == LabelMode::kAuto ? image_folder_label(file.path, classes) : catalog::kNoLabel;
    builder.add_file(file.path, file.size, file.mtime_ns, file.mode, file.object_id, label,
                     file.checksum, std::move(file_metadata));
  }
  if (metadata) {
    local_stats.metadata_unknown_paths = metadata->by_path.size() - local_stats.metadata_attached;
  }
  if (stats) *stats = local_stats;
  return std::move(builder).build();
}

}  // namespace dsfs::tools
