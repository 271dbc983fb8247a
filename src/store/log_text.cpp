#include "src/store/log_text.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <ctime>

namespace dsfs::store {

std::size_t utf8_sequence_length(std::string_view text) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  std::size_t length = 0;
  char32_t code_point = 0;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, code_point = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, code_point = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (text.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i) & 0x3F);
  }
  const bool overlong =
      (length == 3 && code_point < 0x800) || (length == 4 && code_point < 0x10000);
  const bool surrogate = code_point >= 0xD800 && code_point <= 0xDFFF;
  if (overlong || surrogate || code_point > 0x10FFFF) return 0;
  return length;
}

std::string log_text(std::string_view user_bytes, std::size_t max_bytes) {
  const std::string_view shown = user_bytes.substr(0, max_bytes);
  std::string out;
  out.reserve(shown.size() + 16);
  for (std::size_t i = 0; i < shown.size();) {
    const auto c = static_cast<unsigned char>(shown[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    switch (c) {
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      default:
        break;
    }
    // C1 controls (U+0080..U+009F, lead byte 0xC2 then 0x80..0x9F) are escaped like C0 ones.
    const bool c1_control =
        c == 0xC2 && i + 1 < shown.size() && static_cast<unsigned char>(shown[i + 1]) <= 0x9F;
    if (const std::size_t length = c1_control ? 0 : utf8_sequence_length(shown.substr(i))) {
      out.append(shown.substr(i, length));
      i += length;
      continue;
    }
    out += fmt::format("\\x{:02x}", c);
    ++i;
  }
  if (user_bytes.size() > shown.size()) {
    out += fmt::format("...(+{} bytes)", user_bytes.size() - shown.size());
  }
  return out;
}

std::string mib_text(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string utc_time_text(int64_t unix_seconds) {
  const auto time = static_cast<std::time_t>(unix_seconds);
  std::tm utc{};
  if (!gmtime_r(&time, &utc)) return std::to_string(unix_seconds);
  return fmt::format("{:%Y-%m-%d %H:%M:%S} UTC", utc);
}

}  // namespace dsfs::store
