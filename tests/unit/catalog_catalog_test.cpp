#include <fmt/core.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "src/catalog/catalog.h"

using namespace dsfs::catalog;

namespace {

constexpr uint64_t kChunk = 1000;

Catalog small_catalog() {
  CatalogBuilder b(ChecksumKind::kXxh64, kChunk);
  b.set_classes({"cat", "dog"});
  // Added out of order on purpose: the builder sorts.
  b.add_file("dog/b.jpg", 2500, 30, 0644, 4, 1, 0xb, "");
  b.add_file("cat/z.jpg", 1000, 10, 0644, 1, 0, 0xa, "");
  b.add_file("cat/a.jpg", 1001, 20, 0600, 2, 0, 0xc, R"({"w":1})");
  b.add_file("README", 0, 5, 0444, 3, kNoLabel, 0, "");
  b.add_directory("empty", 99, 0700);
  return std::move(b).build();
}

}  // namespace

TEST(CatalogEntry, StaysCompact) {
  EXPECT_EQ(sizeof(CatalogEntry), 72u);
}

TEST(Catalog, BreadthFirstWithSortedContiguousChildren) {
  const Catalog c = small_catalog();
  ASSERT_EQ(c.entry_count(), 8u);
  EXPECT_EQ(c.file_count(), 4u);
  EXPECT_EQ(c.directory_count(), 4u);
  EXPECT_EQ(c.total_bytes(), 2500u + 1000 + 1001 + 0);
  const std::vector<std::string> expected = {"",      "README",    "cat",       "dog",
                                             "empty", "cat/a.jpg", "cat/z.jpg", "dog/b.jpg"};
  for (uint32_t i = 0; i < c.entry_count(); ++i) EXPECT_EQ(c.path(i), expected[i]) << i;
  const CatalogEntry& root = c.entry(kRootIndex);
  EXPECT_TRUE(root.is_dir);
  EXPECT_EQ(root.first_child, 1u);
  EXPECT_EQ(root.child_count, 4u);
  const CatalogEntry& cat = c.entry(2);
  EXPECT_EQ(cat.first_child, 5u);
  EXPECT_EQ(cat.child_count, 2u);
  EXPECT_EQ(c.entry(3).first_child, 7u);
  EXPECT_EQ(c.entry(4).child_count, 0u);
  EXPECT_EQ(c.entry(5).parent, 2u);
  EXPECT_EQ(c.entry(7).parent, 3u);
}

TEST(Catalog, KeepsFileAttributes) {
  const Catalog c = small_catalog();
  const auto a = c.find("cat/a.jpg");
  ASSERT_TRUE(a);
  const CatalogEntry& e = c.entry(*a);
  EXPECT_FALSE(e.is_dir);
  EXPECT_EQ(e.size, 1001u);
  EXPECT_EQ(e.mtime_ns, 20);
  EXPECT_EQ(e.mode, 0600u);
  EXPECT_EQ(e.object_id, 2u);
  EXPECT_EQ(e.label, 0u);
  EXPECT_EQ(e.checksum, 0xcu);
  EXPECT_EQ(c.metadata(*a), R"({"w":1})");
  EXPECT_EQ(c.metadata(*c.find("cat/z.jpg")), "");
  EXPECT_EQ(c.entry(*c.find("README")).label, kNoLabel);
  EXPECT_EQ(c.classes(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(c.checksum_kind(), ChecksumKind::kXxh64);
  EXPECT_EQ(c.chunk_size(), kChunk);
}

TEST(Catalog, DirectoryTimesAndModes) {
  const Catalog c = small_catalog();
  const CatalogEntry& empty = c.entry(*c.find("empty"));
  EXPECT_TRUE(empty.is_dir);
  EXPECT_EQ(empty.mtime_ns, 99);
  EXPECT_EQ(empty.mode, 0700u);
  // Implied directories take the newest mtime below them and mode 0755.
  EXPECT_EQ(c.entry(*c.find("cat")).mtime_ns, 20);
  EXPECT_EQ(c.entry(*c.find("cat")).mode, 0755u);
  EXPECT_EQ(c.entry(kRootIndex).mtime_ns, 99);
}

TEST(Catalog, LookupAndFind) {
  const Catalog c = small_catalog();
  EXPECT_EQ(c.find(""), kRootIndex);
  EXPECT_EQ(c.find("/"), kRootIndex);
  EXPECT_EQ(c.lookup(kRootIndex, "cat"), 2u);
  EXPECT_EQ(c.lookup(2, "z.jpg"), 6u);
  EXPECT_EQ(c.lookup(2, "b.jpg"), std::nullopt);
  EXPECT_EQ(c.lookup(6, "x"), std::nullopt);     // a file has no children
  EXPECT_EQ(c.lookup(4, "x"), std::nullopt);     // empty directory
  EXPECT_EQ(c.lookup(1000, "x"), std::nullopt);  // out of range
  EXPECT_EQ(c.find("dog/b.jpg"), 7u);
  EXPECT_EQ(c.find("dog//b.jpg/"), 7u);
  EXPECT_EQ(c.find("dog/c.jpg"), std::nullopt);
  EXPECT_EQ(c.find("README/x"), std::nullopt);
  EXPECT_EQ(c.find("cat/../dog"), std::nullopt);
  EXPECT_EQ(Catalog().find("a"), std::nullopt);
}

TEST(Catalog, LookupIsBytewiseOverManyChildren) {
  CatalogBuilder b(ChecksumKind::kNone, kChunk);
  std::vector<std::string> names = {"B", "a", "Z", "é", "ä", "_", "-", "0", "a b", "ab", "a.b"};
  // fmt, not "n" + std::to_string(i): GCC 12 at -O3 warns falsely on that (-Wrestrict).
  for (int i = 0; i < 300; ++i) names.push_back(fmt::format("n{}", i));
  for (size_t i = 0; i < names.size(); ++i)
    b.add_file("d/" + names[i], i, 0, 0644, i, kNoLabel, 0, "");
  const Catalog c = std::move(b).build();
  const uint32_t d = *c.find("d");
  const CatalogEntry& dir = c.entry(d);
  ASSERT_EQ(dir.child_count, names.size());
  for (uint32_t i = dir.first_child + 1; i < dir.first_child + dir.child_count; ++i) {
    EXPECT_LT(c.name(i - 1), c.name(i));
  }
  EXPECT_EQ(c.name(dir.first_child), "-");                        // 0x2d sorts first
  EXPECT_EQ(c.name(dir.first_child + dir.child_count - 1), "é");  // 0xc3 0xa9 sorts last
  for (size_t i = 0; i < names.size(); ++i) {
    const auto found = c.lookup(d, names[i]);
    ASSERT_TRUE(found) << names[i];
    EXPECT_EQ(c.entry(*found).object_id, i);
  }
  EXPECT_EQ(c.lookup(d, "n300"), std::nullopt);
  EXPECT_EQ(c.lookup(d, ""), std::nullopt);
}

TEST(Catalog, ChunkCount) {
  const Catalog c = small_catalog();
  EXPECT_EQ(c.chunk_count(*c.find("README")), 1u);     // empty file: one (empty) object
  EXPECT_EQ(c.chunk_count(*c.find("cat/z.jpg")), 1u);  // exactly the chunk size
  EXPECT_EQ(c.chunk_count(*c.find("cat/a.jpg")), 2u);  // one byte over
  EXPECT_EQ(c.chunk_count(*c.find("dog/b.jpg")), 3u);
  EXPECT_EQ(c.chunk_count(kRootIndex), 0u);
}

TEST(Catalog, EmptyDataset) {
  const Catalog c = CatalogBuilder(ChecksumKind::kXxh64, kChunk).build();
  EXPECT_EQ(c.entry_count(), 1u);
  EXPECT_EQ(c.file_count(), 0u);
  EXPECT_EQ(c.path(kRootIndex), "");
  EXPECT_EQ(c.find(""), kRootIndex);
}

TEST(CatalogBuilder, RejectsBadPaths) {
  CatalogBuilder b(ChecksumKind::kXxh64, kChunk);
  for (const char* bad : {"", "/a", "a/", "a//b", "./a", "a/../b", "..", "."}) {
    EXPECT_THROW(b.add_file(bad, 1, 0, 0644, 1, kNoLabel, 0, ""), std::invalid_argument) << bad;
  }
  EXPECT_THROW(b.add_file(std::string("a\0b", 3), 1, 0, 0644, 1, kNoLabel, 0, ""),
               std::invalid_argument);
  EXPECT_THROW(b.add_file(std::string(256, 'x'), 1, 0, 0644, 1, kNoLabel, 0, ""),
               std::invalid_argument);
  EXPECT_THROW(b.add_directory("a/./b", 0, 0755), std::invalid_argument);
}

TEST(CatalogBuilder, RejectsDuplicatesAndFileDirectoryClashes) {
  CatalogBuilder b(ChecksumKind::kXxh64, kChunk);
  b.add_file("a/b", 1, 0, 0644, 1, kNoLabel, 0, "");
  EXPECT_THROW(b.add_file("a/b", 1, 0, 0644, 2, kNoLabel, 0, ""), std::invalid_argument);
  EXPECT_THROW(b.add_file("a", 1, 0, 0644, 3, kNoLabel, 0, ""), std::invalid_argument);
  EXPECT_THROW(b.add_file("a/b/c", 1, 0, 0644, 4, kNoLabel, 0, ""), std::invalid_argument);
  EXPECT_THROW(b.add_directory("a/b", 0, 0755), std::invalid_argument);
  b.add_directory("a", 7, 0750);  // an implied directory may be given its attributes later
  const Catalog c = std::move(b).build();
  EXPECT_EQ(c.entry_count(), 3u);
  EXPECT_EQ(c.entry(*c.find("a")).mtime_ns, 7);
  EXPECT_EQ(c.entry(*c.find("a")).mode, 0750u);
}

TEST(CatalogBuilder, RejectsLabelsBeyondClassesAndBadMetadata) {
  CatalogBuilder b(ChecksumKind::kXxh64, kChunk);
  b.set_classes({"only"});
  b.add_file("x", 1, 0, 0644, 1, 1, 0, "");
  EXPECT_THROW(std::move(b).build(), std::invalid_argument);

  CatalogBuilder m(ChecksumKind::kXxh64, kChunk);
  EXPECT_THROW(m.add_file("x", 1, 0, 0644, 1, kNoLabel, 0, "[1]"), std::invalid_argument);
  EXPECT_THROW(m.add_file("x", 1, 0, 0644, 1, kNoLabel, 0, "{"), std::invalid_argument);
  // Nested deeper than kMaxMetadataDepth: refused before anything recursive reads it.
  const auto nested = [](size_t depth) {
    return "{\"a\":" + std::string(depth - 1, '[') + std::string(depth - 1, ']') + "}";
  };
  EXPECT_NO_THROW(m.add_file("shallow", 1, 0, 0644, 2, kNoLabel, 0, nested(kMaxMetadataDepth)));
  EXPECT_THROW(m.add_file("deep", 1, 0, 0644, 3, kNoLabel, 0, nested(kMaxMetadataDepth + 1)),
               std::invalid_argument);
  EXPECT_THROW(m.set_classes({"a\nb"}), std::invalid_argument);
  EXPECT_THROW(m.set_classes({""}), std::invalid_argument);
  EXPECT_THROW(CatalogBuilder(ChecksumKind::kXxh64, 0), std::invalid_argument);
}

TEST(JsonNestingDepth, CountsBracketsOutsideStrings) {
  EXPECT_EQ(json_nesting_depth(""), 0u);
  EXPECT_EQ(json_nesting_depth("3"), 0u);
  EXPECT_EQ(json_nesting_depth("{}"), 1u);
  EXPECT_EQ(json_nesting_depth(R"({"a":[1,{"b":[]}],"c":{}})"), 4u);
  EXPECT_EQ(json_nesting_depth(R"({"a":"[[[{{{"})"), 1u);
  EXPECT_EQ(json_nesting_depth(R"({"a\"[[":"\\"})"), 1u);  // escaped quote and backslash
  EXPECT_EQ(json_nesting_depth("]]]{"), 1u);               // not JSON: still no underflow
  EXPECT_EQ(json_nesting_depth(std::string(100000, '[')), 100000u);
}

TEST(CatalogBuilder, ModeKeepsPermissionBitsOnly) {
  CatalogBuilder b(ChecksumKind::kXxh64, kChunk);
  b.add_file("x", 1, 0, 0100644, 1, kNoLabel, 0, "");
  const Catalog c = std::move(b).build();
  EXPECT_EQ(c.entry(*c.find("x")).mode, 0644u);
}

TEST(Catalog, MemoryStaysUnderAHundredBytesPerFilePlusName) {
  CatalogBuilder b(ChecksumKind::kXxh64, kChunk);
  size_t name_bytes = 0;
  constexpr int kClasses = 10;
  constexpr int kPerClass = 2000;
  std::vector<std::string> classes;
  for (int k = 0; k < kClasses; ++k) classes.push_back("class" + std::to_string(k));
  b.set_classes(classes);
  for (int k = 0; k < kClasses; ++k) {
    for (int i = 0; i < kPerClass; ++i) {
      const std::string name = "n0144" + std::to_string(k) + "_" + std::to_string(i) + ".JPEG";
      name_bytes += name.size();
      b.add_file("class" + std::to_string(k) + "/" + name, 110000, 0, 0644, k * kPerClass + i, k, 0,
                 "");
    }
  }
  const Catalog c = std::move(b).build();
  EXPECT_LE(c.memory_bytes(), c.file_count() * 100 + name_bytes + 4096);
}
