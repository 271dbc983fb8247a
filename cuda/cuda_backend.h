#pragma once
// The CUDA backend, compiled only when CMake finds nvcc (DSFS_HAVE_CUDA).
#include <memory>
#include <string>

#include "cuda/backend.h"

namespace dsfs::view {

// Null, with why_unavailable set ("no CUDA device: ...", driver errors), when no device is usable.
std::unique_ptr<Backend> make_cuda_backend(std::string& why_unavailable);

}  // namespace dsfs::view
