// Picks the preprocessing backend: CUDA when it is built in and a device answers, the CPU
// backend otherwise (same pixels, see resample.h).
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <stdexcept>

#include "cuda/backend.h"
#ifdef DSFS_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

namespace dsfs::view {

BackendKind parse_backend_kind(std::string_view text) {
  if (text == "auto") return BackendKind::kAuto;
  if (text == "cuda") return BackendKind::kCuda;
  if (text == "cpu") return BackendKind::kCpu;
  throw std::invalid_argument(
      fmt::format("view backend \"{}\" is unknown; write auto, cuda or cpu", text));
}

std::unique_ptr<Backend> make_backend(BackendKind kind) {
  if (kind == BackendKind::kCpu) return make_cpu_backend();
#ifdef DSFS_HAVE_CUDA
  std::string why_unavailable;
  if (auto cuda = make_cuda_backend(why_unavailable)) return cuda;
  if (kind == BackendKind::kCuda) {
    throw std::runtime_error(fmt::format(
        "view backend cuda is not usable: {}; use --view-backend cpu or auto", why_unavailable));
  }
  spdlog::info("view backend: cpu (CUDA unavailable: {})", why_unavailable);
#else
  if (kind == BackendKind::kCuda) {
    throw std::runtime_error(
        "view backend cuda is not built in (nvcc was not found when dsfs was built); use "
        "--view-backend cpu or auto");
  }
  spdlog::info("view backend: cpu (this dsfs was built without CUDA)");
#endif
  return make_cpu_backend();
}

}  // namespace dsfs::view
