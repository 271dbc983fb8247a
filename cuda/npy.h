#pragma once
// NumPy .npy format 1.0 headers for view tensors: magic, version, a little-endian dict padded with
// spaces to a multiple of 64 bytes and ended by '\n', then the raw C-order data.
#include <cstdint>
#include <string>

#include "cuda/view_spec.h"

namespace dsfs::view {

// The whole header (magic through the '\n'), its length a multiple of 64.
std::string npy_header(const ViewSpec& spec);
// npy_header(spec).size() + spec.tensor_bytes().
std::uint64_t npy_file_size(const ViewSpec& spec);

}  // namespace dsfs::view
