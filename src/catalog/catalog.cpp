#include "src/catalog/catalog.h"

#include <fmt/core.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "src/catalog/names.h"
#include "src/store/log_text.h"

namespace dsfs::catalog {
namespace {

constexpr uint32_t kPermissionBits = 07777;
constexpr uint32_t kDefaultDirectoryMode = 0755;

// Splits a '/'-separated relative path; every component must be valid (so no empty components,
// no leading or trailing '/').
std::vector<std::string_view> split_relative_path(std::string_view relative_path) {
  std::vector<std::string_view> components;
  size_t start = 0;
  for (;;) {
    const size_t slash = relative_path.find('/', start);
    const std::string_view component = relative_path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (!is_valid_path_component(component)) {
      throw std::invalid_argument(fmt::format(
          "invalid path '{}': component '{}' must be 1-255 bytes without '/' or NUL and not "
          "'.' or '..'",
          relative_path, component));
    }
    components.push_back(component);
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return components;
}

std::string join_prefix(const std::vector<std::string_view>& components, size_t count) {
  std::string prefix;
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) prefix += '/';
    prefix += components[i];
  }
  return prefix;
}

}  // namespace

std::string_view Catalog::name(uint32_t index) const {
  const CatalogEntry& e = entries_[index];
  return std::string_view(names_).substr(e.name_offset, e.name_length);
}

std::string_view Catalog::metadata(uint32_t index) const {
  const CatalogEntry& e = entries_[index];
  if (e.metadata_length == 0) return {};
  return std::string_view(metadata_).substr(e.metadata_offset, e.metadata_length);
}

std::string Catalog::path(uint32_t index) const {
  std::vector<uint32_t> chain;
  for (uint32_t i = index; i != kRootIndex; i = entries_[i].parent) chain.push_back(i);
  std::string result;
  for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
    if (!result.empty()) result += '/';
    result += name(*it);
  }
  return result;
}

std::optional<uint32_t> Catalog::lookup(uint32_t dir, std::string_view child_name) const {
  if (dir >= entries_.size() || !entries_[dir].is_dir) return std::nullopt;
  const CatalogEntry& d = entries_[dir];
  uint32_t low = d.first_child;
  uint32_t high = d.first_child + d.child_count;  // children are sorted bytewise
  while (low < high) {
    const uint32_t mid = low + (high - low) / 2;
    const int order = name(mid).compare(child_name);
    if (order == 0) return mid;
    if (order < 0) {
      low = mid + 1;
    } else {
      high = mid;
    }
  }
  return std::nullopt;
}

std::optional<uint32_t> Catalog::find(std::string_view relative_path) const {
  if (entries_.empty()) return std::nullopt;
  uint32_t current = kRootIndex;
  size_t start = 0;
  while (start <= relative_path.size()) {
    size_t slash = relative_path.find('/', start);
    if (slash == std::string_view::npos) slash = relative_path.size();
    const std::string_view component = relative_path.substr(start, slash - start);
    if (!component.empty()) {  // tolerate "a//b", leading and trailing '/'
      const auto child = lookup(current, component);
      if (!child) return std::nullopt;
      current = *child;
    }
    start = slash + 1;
  }
  return current;
}

uint64_t Catalog::chunk_count(uint32_t index) const {
  const CatalogEntry& e = entries_[index];
  if (e.is_dir) return 0;
  if (chunk_size_ == 0 || e.size <= chunk_size_) return 1;
  return (e.size + chunk_size_ - 1) / chunk_size_;
}

size_t Catalog::memory_bytes() const {
  size_t bytes = sizeof(*this) + entries_.capacity() * sizeof(CatalogEntry) + names_.capacity() +
                 metadata_.capacity() + classes_.capacity() * sizeof(std::string);
  for (const auto& c : classes_) bytes += c.capacity();
  return bytes;
}

CatalogBuilder::CatalogBuilder(ChecksumKind checksum_kind, uint64_t chunk_size)
    : checksum_kind_(checksum_kind), chunk_size_(chunk_size) {
  if (chunk_size == 0) throw std::invalid_argument("catalogue chunk size must be positive");
  PendingEntry root;
  root.is_dir = true;
  root.mode = kDefaultDirectoryMode;
  root.children = 0;
  pending_.push_back(std::move(root));
  child_maps_.emplace_back();
}

void CatalogBuilder::set_classes(std::vector<std::string> classes) {
  for (const auto& c : classes) {
    // classes.txt holds one class per line.
    if (c.empty() || c.size() > 4096 || c.find_first_of(std::string_view("\n\0", 2)) != c.npos) {
      throw std::invalid_argument(
          fmt::format("invalid class name '{}': must be 1-4096 bytes without newline or NUL",
                      store::log_text(c)));
    }
  }
  classes_ = std::move(classes);
}

uint32_t CatalogBuilder::ensure_directory(std::string_view relative_path,
                                          const std::vector<std::string_view>& components,
                                          size_t count) {
  uint32_t current = 0;
  for (size_t i = 0; i < count; ++i) {
    ChildMap& children = child_maps_[pending_[current].children];
    const auto found = children.find(std::string(components[i]));
    if (found != children.end()) {
      if (!pending_[found->second].is_dir) {
        throw std::invalid_argument(
            fmt::format("path '{}' needs '{}' to be a directory, but it is a file", relative_path,
                        join_prefix(components, i + 1)));
      }
      current = found->second;
      continue;
    }
    if (pending_.size() >= UINT32_MAX - 1) throw std::length_error("catalogue: too many entries");
    PendingEntry dir;
    dir.parent = current;
    dir.is_dir = true;
    dir.mode = kDefaultDirectoryMode;
    dir.children = static_cast<uint32_t>(child_maps_.size());
    child_maps_.emplace_back();
    const auto index = static_cast<uint32_t>(pending_.size());
    pending_.push_back(std::move(dir));
    child_maps_[pending_[current].children].emplace(std::string(components[i]), index);
    current = index;
  }
  return current;
}

size_t json_nesting_depth(std::string_view json) {
  size_t depth = 0;
  size_t deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, whatever it is
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void CatalogBuilder::add_file(std::string_view relative_path, uint64_t size, int64_t mtime_ns,
                              uint32_t mode, uint64_t object_id, uint32_t label, uint64_t checksum,
                              std::string metadata_json) {
  const auto components = split_relative_path(relative_path);
  if (const size_t depth = json_nesting_depth(metadata_json); depth > kMaxMetadataDepth) {
    throw std::invalid_argument(
        fmt::format("metadata of '{}' nests {} levels deep (its object "
                    "included), more than {}",
                    relative_path, depth, kMaxMetadataDepth));
  }
  if (!metadata_json.empty()) {
    const auto parsed = nlohmann::json::parse(metadata_json, nullptr, /*allow_exceptions=*/false);
    if (!parsed.is_object()) {
      throw std::invalid_argument(fmt::format("metadata of '{}' must be a JSON object, got: {:.80}",
                                              relative_path, metadata_json));
    }
  }
  if (metadata_json.size() > UINT32_MAX) {
    throw std::invalid_argument(fmt::format("metadata of '{}' is too large", relative_path));
  }
  const uint32_t parent = ensure_directory(relative_path, components, components.size() - 1);
  ChildMap& siblings = child_maps_[pending_[parent].children];
  if (siblings.contains(std::string(components.back()))) {
    throw std::invalid_argument(fmt::format("duplicate path '{}'", relative_path));
  }
  if (pending_.size() >= UINT32_MAX - 1) throw std::length_error("catalogue: too many entries");
  PendingEntry file;
  file.parent = parent;
  file.mode = mode & kPermissionBits;
  file.label = label;
  file.mtime_ns = mtime_ns;
  file.size = size;
  file.object_id = object_id;
  file.checksum = checksum;
  file.metadata = std::move(metadata_json);
  const auto index = static_cast<uint32_t>(pending_.size());
  pending_.push_back(std::move(file));
  siblings.emplace(std::string(components.back()), index);
}

void CatalogBuilder::add_directory(std::string_view relative_path, int64_t mtime_ns,
                                   uint32_t mode) {
  uint32_t index = 0;  // "" is the dataset root
  if (!relative_path.empty()) {
    const auto components = split_relative_path(relative_path);
    index = ensure_directory(relative_path, components, components.size());
  }
  PendingEntry& dir = pending_[index];
  dir.explicit_dir = true;
  dir.mtime_ns = mtime_ns;
  dir.mode = mode & kPermissionBits;
}

Catalog CatalogBuilder::build() && {
  for (const auto& p : pending_) {
    if (!p.is_dir && p.label != kNoLabel && p.label >= classes_.size()) {
      throw std::invalid_argument(fmt::format(
          "label {} is out of range: the catalogue has {} classes", p.label, classes_.size()));
    }
  }
  Catalog catalog;
  catalog.checksum_kind_ = checksum_kind_;
  catalog.chunk_size_ = chunk_size_;
  catalog.classes_ = std::move(classes_);
  catalog.entries_.reserve(pending_.size());

  auto make_entry = [&](const PendingEntry& p, uint32_t parent, std::string_view name) {
    if (catalog.names_.size() + name.size() > UINT32_MAX) {
      throw std::length_error("catalogue: names exceed 4 GiB");
    }
    CatalogEntry e{};
    e.parent = parent;
    e.name_offset = static_cast<uint32_t>(catalog.names_.size());
    e.name_length = static_cast<uint16_t>(name.size());
    catalog.names_ += name;
    e.is_dir = p.is_dir ? 1 : 0;
    e.mode = p.mode;
    e.label = p.is_dir ? kNoLabel : p.label;
    e.mtime_ns = p.mtime_ns;
    if (!p.is_dir) {
      e.size = p.size;
      e.object_id = p.object_id;
      e.checksum = checksum_kind_ == ChecksumKind::kNone ? 0 : p.checksum;
      if (checksum_kind_ == ChecksumKind::kCrc32c) e.checksum &= UINT32_MAX;
      if (!p.metadata.empty()) {
        e.metadata_offset = catalog.metadata_.size();
        e.metadata_length = static_cast<uint32_t>(p.metadata.size());
        catalog.metadata_ += p.metadata;
      }
      ++catalog.file_count_;
      catalog.total_bytes_ += p.size;
    }
    catalog.entries_.push_back(e);
  };

  // Breadth-first: appending each directory's sorted children as it is visited keeps every
  // directory's children contiguous.
  std::vector<uint32_t> order;  // catalogue index -> pending index
  order.reserve(pending_.size());
  order.push_back(0);
  make_entry(pending_[0], kRootIndex, {});
  std::vector<std::pair<std::string_view, uint32_t>> children;
  for (size_t i = 0; i < order.size(); ++i) {
    const PendingEntry& p = pending_[order[i]];
    if (!p.is_dir) continue;
    const ChildMap& map = child_maps_[p.children];
    if (map.empty()) continue;
    children.assign(map.begin(), map.end());
    std::sort(children.begin(), children.end());  // string_view order is bytewise
    catalog.entries_[i].first_child = static_cast<uint32_t>(catalog.entries_.size());
    catalog.entries_[i].child_count = static_cast<uint32_t>(children.size());
    for (const auto& [child_name, child_index] : children) {
      order.push_back(child_index);
      make_entry(pending_[child_index], static_cast<uint32_t>(i), child_name);
    }
  }

  // Directories only implied by file paths take the newest mtime below them. Children follow
  // their parent, so a reverse sweep finishes each directory before its parent reads it.
  for (size_t i = catalog.entries_.size(); i-- > 1;) {
    const uint32_t parent_index = catalog.entries_[i].parent;
    if (pending_[order[parent_index]].explicit_dir) continue;
    CatalogEntry& parent = catalog.entries_[parent_index];
    parent.mtime_ns = std::max(parent.mtime_ns, catalog.entries_[i].mtime_ns);
  }

  catalog.names_.shrink_to_fit();  // grown by appends; the catalogue lives as long as the mount
  catalog.metadata_.shrink_to_fit();
  pending_.clear();
  child_maps_.clear();
  return catalog;
}

}  // namespace dsfs::catalog
