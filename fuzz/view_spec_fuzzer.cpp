// The .views SPEC parser (a directory name any local user can look up): a spec or
// std::invalid_argument, never a crash.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "cuda/view_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)dsfs::view::parse_view_spec(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
