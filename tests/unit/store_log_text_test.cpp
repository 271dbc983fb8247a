#include "src/store/log_text.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace dsfs::store {
namespace {

TEST(LogText, PrintableAsciiAndUtf8PassUnchanged) {
  EXPECT_EQ(log_text("n01440764/n01440764_10026.JPEG"), "n01440764/n01440764_10026.JPEG");
  EXPECT_EQ(log_text("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x90\x88"),
            "caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x90\x88");
}

TEST(LogText, ControlCharactersAndBackslashAreEscaped) {
  EXPECT_EQ(log_text("a\nb\rc\td\\e"), "a\\nb\\rc\\td\\\\e");
  EXPECT_EQ(log_text(std::string("\x1b[31mred\x7f\0", 10)), "\\x1b[31mred\\x7f\\x00");
  EXPECT_EQ(log_text("\xc2\x85"), "\\xc2\\x85");  // U+0085 (NEL), a C1 control
}

TEST(LogText, InvalidUtf8BytesAreEscapedOneByOne) {
  EXPECT_EQ(log_text("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(log_text("\xc3"), "\\xc3");                             // truncated sequence
  EXPECT_EQ(log_text("\xc0\xaf"), "\\xc0\\xaf");                    // overlong '/'
  EXPECT_EQ(log_text("\xed\xa0\x80"), "\\xed\\xa0\\x80");           // a UTF-16 surrogate
  EXPECT_EQ(log_text("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
}

TEST(LogText, LongInputIsCutAndTheCutIsCounted) {
  const std::string line(10'000, 'x');
  EXPECT_EQ(log_text(line, 8), "xxxxxxxx...(+9992 bytes)");
  EXPECT_EQ(log_text(line).size(), kLogExcerptBytes + std::string("...(+9800 bytes)").size());
  EXPECT_EQ(log_text("short", 8), "short");
}

TEST(LogText, ACutInsideAUtf8SequenceEscapesTheRemnant) {
  EXPECT_EQ(log_text("ab\xc3\xa9", 3), "ab\\xc3...(+1 bytes)");
}

TEST(UtcTimeText, IsTheCalendarTimeInUtcOrTheNumberPastTheCalendar) {
  EXPECT_EQ(utc_time_text(0), "1970-01-01 00:00:00 UTC");
  EXPECT_EQ(utc_time_text(1796316975), "2026-12-03 16:56:15 UTC");
  EXPECT_EQ(utc_time_text(INT64_MAX), "9223372036854775807");
}

TEST(MibText, OneDecimal) {
  EXPECT_EQ(mib_text(0), "0.0 MiB");
  EXPECT_EQ(mib_text(5 << 20), "5.0 MiB");
  EXPECT_EQ(mib_text((5 << 20) - 4096), "5.0 MiB");
  EXPECT_EQ(mib_text(1843200), "1.8 MiB");
}

}  // namespace
}  // namespace dsfs::store
