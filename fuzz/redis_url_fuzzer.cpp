// The --redis URL parser: an endpoint or std::invalid_argument, never a crash; a parsed
// endpoint describes itself without its password.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "src/store/log_text.h"
#include "src/store/redis_url.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto endpoint =
        dsfs::store::parse_redis_url(std::string_view(reinterpret_cast<const char*>(data), size));
    const std::string description = endpoint.describe();
    // The user part ("scheme://[USER]:***@") shows the password as *** and the user escaped.
    if (!endpoint.password.empty()) {
      const std::string expected = dsfs::store::log_text(endpoint.user, 64) + ":***@";
      if (description.compare(description.find("://") + 3, expected.size(), expected) != 0) {
        __builtin_trap();
      }
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
