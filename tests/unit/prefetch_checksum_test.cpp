// CRC-32C as --verify computes it for manifests that record crc32c.
#include <gtest/gtest.h>

#include <string>

#include "prefetch/object_fetcher.h"

namespace dsfs::prefetch {
namespace {

TEST(Crc32c, MatchesTheStandardCheckValue) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(0, check.data(), check.size()), 0xE3069283u);
  EXPECT_EQ(crc32c(0, "", 0), 0u);
}

TEST(Crc32c, CanBeComputedPieceByPiece) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = crc32c(0, text.data(), text.size());
  uint32_t pieces = crc32c(0, text.data(), 10);
  pieces = crc32c(pieces, text.data() + 10, text.size() - 10);
  EXPECT_EQ(pieces, whole);
  EXPECT_EQ(whole, 0x22620404u);
}

}  // namespace
}  // namespace dsfs::prefetch
