#pragma once
#include <string>
#include <string_view>

namespace dsfs::catalog {

// A dataset name is [A-Za-z0-9._-]{1,128} and not "." or "..".
bool is_valid_dataset_name(std::string_view name);
// Throws std::invalid_argument: "invalid dataset name 'x y': use 1-128 of A-Z a-z 0-9 . _ -".
void validate_dataset_name(std::string_view name);

// Names beginning with '.' are reserved for the mount's own directories at its root (.dsfs,
// .meta, .views, and any added later): a dataset under such a name could not be mounted beside
// them. Existing datasets with such names can still be listed, read and removed.
bool is_reserved_dataset_name(std::string_view name);
// validate_dataset_name, and refuses a reserved name or one beginning with '-' (an option to every
// command line): for a dataset about to be created.
// Throws std::invalid_argument naming it and what to do.
void validate_new_dataset_name(std::string_view name);

// One path component inside a dataset: 1-255 bytes, no '/', no NUL, not "." or "..".
bool is_valid_path_component(std::string_view component);

// Namespace: [A-Za-z0-9._-]{1,64}. Throws std::invalid_argument naming it.
void validate_namespace(std::string_view ns);

}  // namespace dsfs::catalog
