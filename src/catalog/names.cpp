#include "src/catalog/names.h"

#include <fmt/core.h>
#include <algorithm>
#include <stdexcept>

#include "src/store/log_text.h"

namespace dsfs::catalog {
namespace {

// The one alphabet for dataset names and namespaces: safe in Redis keys, SCAN patterns (no glob
// characters, no ':' separator) and as a directory name under the mount.
bool is_name_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

bool is_dot_or_dotdot(std::string_view s) {
  return s == "." || s == "..";
}

}  // namespace

bool is_valid_dataset_name(std::string_view name) {
  return !name.empty() && name.size() <= 128 && !is_dot_or_dotdot(name) &&
         std::all_of(name.begin(), name.end(), is_name_char);
}

void validate_dataset_name(std::string_view name) {
  if (!is_valid_dataset_name(name)) {
    throw std::invalid_argument(
        fmt::format("invalid dataset name '{}': use 1-128 of A-Z a-z 0-9 . _ - (not '.' or '..')",
                    store::log_text(name)));
  }
}

bool is_reserved_dataset_name(std::string_view name) {
  return name.starts_with('.');
}

void validate_new_dataset_name(std::string_view name) {
  validate_dataset_name(name);
  if (is_reserved_dataset_name(name)) {
    throw std::invalid_argument(fmt::format(
        "dataset name '{}' is reserved: names beginning with '.' belong to the mount's own "
        "directories (.dsfs, .meta, .views); choose a name that begins with a letter or digit",
        name));
  }
  if (name.starts_with('-')) {
    throw std::invalid_argument(fmt::format(
        "dataset name '{}' begins with '-', which every command line takes for an option "
        "(`dsfs info {}` would fail); choose a name that begins with a letter or digit",
        name, name));
  }
}

bool is_valid_path_component(std::string_view component) {
  return !component.empty() && component.size() <= 255 && !is_dot_or_dotdot(component) &&
         component.find_first_of(std::string_view("/\0", 2)) == std::string_view::npos;
}

void validate_namespace(std::string_view ns) {
  if (ns.empty() || ns.size() > 64 || !std::all_of(ns.begin(), ns.end(), is_name_char)) {
    throw std::invalid_argument(
        fmt::format("invalid namespace '{}': use 1-64 of A-Z a-z 0-9 . _ -", store::log_text(ns)));
  }
}

}  // namespace dsfs::catalog
