#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dsfs::store {

// The longest excerpt of user-supplied bytes a log line or error message carries.
inline constexpr std::size_t kLogExcerptBytes = 200;

// Makes bytes a user, a file or a server supplied safe to put in a log line or an error
// message: valid UTF-8 printable text passes unchanged; control characters (C0, DEL, C1), a
// backslash and bytes that are not valid UTF-8 are escaped (\n, \t, \\, \xNN); at most
// max_bytes of the input are shown, and a cut is marked with how many bytes were left out
// ("...(+N bytes)"). The result is never longer than about 4 * max_bytes + 20 characters.
// Pure function; safe from any thread.
std::string log_text(std::string_view user_bytes, std::size_t max_bytes = kLogExcerptBytes);

// The length (2 to 4) of the valid multi-byte UTF-8 sequence that starts text, or 0 when text
// does not start with one: ASCII, a stray or truncated byte, an overlong form, a surrogate or a
// code point above U+10FFFF. Pure function.
std::size_t utf8_sequence_length(std::string_view text);

// A unix time in seconds as "YYYY-MM-DD HH:MM:SS UTC" for a message; the number itself when
// the calendar cannot hold it. Pure function.
std::string utc_time_text(int64_t unix_seconds);

// A byte count in MiB with one decimal ("12.5 MiB"), for a message. Pure function.
std::string mib_text(uint64_t bytes);

}  // namespace dsfs::store
