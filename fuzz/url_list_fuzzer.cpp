// Ingest's URL-list parser (lines of http(s) URLs with an optional path): entries or
// std::invalid_argument naming the line, never a crash; every path it accepts is a valid
// relative path.
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string_view>

#include "tools/sources.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)dsfs::tools::looks_like_url_list(text);
  try {
    for (const auto& entry : dsfs::tools::parse_url_list(text, "fuzz.txt")) {
      if (entry.relative_path.empty() || entry.relative_path.front() == '/') __builtin_trap();
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
