#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "src/catalog/manifest.h"

using namespace dsfs::catalog;

namespace {

void expect_same_catalog(const Catalog& a, const Catalog& b) {
  ASSERT_EQ(a.entry_count(), b.entry_count());
  EXPECT_EQ(a.file_count(), b.file_count());
  EXPECT_EQ(a.total_bytes(), b.total_bytes());
  EXPECT_EQ(a.checksum_kind(), b.checksum_kind());
  EXPECT_EQ(a.chunk_size(), b.chunk_size());
  EXPECT_EQ(a.classes(), b.classes());
  for (uint32_t i = 0; i < a.entry_count(); ++i) {
    const CatalogEntry& x = a.entry(i);
    const CatalogEntry& y = b.entry(i);
    EXPECT_EQ(a.path(i), b.path(i));
    EXPECT_EQ(a.name(i), b.name(i));
    EXPECT_EQ(a.metadata(i), b.metadata(i));
    EXPECT_EQ(x.parent, y.parent) << i;
    EXPECT_EQ(x.is_dir, y.is_dir) << i;
    EXPECT_EQ(x.mode, y.mode) << i;
    EXPECT_EQ(x.label, y.label) << i;
    EXPECT_EQ(x.first_child, y.first_child) << i;
    EXPECT_EQ(x.child_count, y.child_count) << i;
    EXPECT_EQ(x.mtime_ns, y.mtime_ns) << i;
    EXPECT_EQ(x.size, y.size) << i;
    EXPECT_EQ(x.object_id, y.object_id) << i;
    EXPECT_EQ(x.checksum, y.checksum) << i;
    EXPECT_EQ(x.name_offset, y.name_offset) << i;
    EXPECT_EQ(x.metadata_offset, y.metadata_offset) << i;
    EXPECT_EQ(x.metadata_length, y.metadata_length) << i;
  }
}

Catalog awkward_catalog(ChecksumKind kind) {
  CatalogBuilder b(kind, 4096);
  b.set_classes({"n01440764", "zebra crossing", "ünïcödé"});
  b.add_file("n01440764/img 1.JPEG", 110000, 1700000000123456789, 0644, 1, 0, 0xdeadbeefcafef00d,
             R"({"caption":"a fish","score":0.5})");
  b.add_file("n01440764/empty", 0, 1700000000000000000, 0644, 2, 0, 0xef46db3751d8e999, "");
  b.add_file("zebra crossing/日本語 ファイル.jpg", 9000, -5, 0600, 3, 1, 7, "");
  b.add_file("ünïcödé/deep/er/still/big.bin", 3 * 4096 + 1, 42, 0644, 1ull << 40, 2, 8,
             R"({"k":[1,2,3]})");
  b.add_file("notes.txt", 12, 0, 0444, 5, kNoLabel, 9, "");
  b.add_directory("empty dir", 77, 0700);
  b.add_directory("ünïcödé/deep/hollow", 78, 0755);
  return std::move(b).build();
}

std::span<const std::byte> as_span(const std::vector<std::byte>& v) {
  return {v.data(), v.size()};
}

void expect_manifest_error(const std::vector<std::byte>& bytes, const std::string& needle) {
  try {
    decode_manifest(as_span(bytes));
    ADD_FAILURE() << "expected ManifestError mentioning '" << needle << "'";
  } catch (const ManifestError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << needle;
  }
}

// An independent writer of the documented layout (docs/schema.md), so structural checks can be
// exercised with a valid trailing checksum.
struct RawEntry {
  bool is_dir = false;
  uint64_t parent = 0;
  std::string name;
  uint64_t mode = 0644;
  uint64_t mtime_zigzag = 0;
  uint64_t size = 0;
  uint64_t object_zigzag = 2;  // +1
  uint64_t label_plus_one = 0;
  uint64_t checksum = 0;
  std::optional<std::string> metadata;
  uint8_t extra_flags = 0;
};

RawEntry raw_dir(uint64_t parent, std::string name) {
  RawEntry e;
  e.is_dir = true;
  e.parent = parent;
  e.name = std::move(name);
  e.mode = 0755;
  return e;
}

RawEntry raw_file(uint64_t parent, std::string name, uint64_t size, uint64_t label_plus_one) {
  RawEntry e;
  e.parent = parent;
  e.name = std::move(name);
  e.size = size;
  e.label_plus_one = label_plus_one;
  return e;
}

struct RawManifest {
  std::string magic = "DSFSMANF";
  uint32_t version = 1;
  uint32_t flags = 0;
  std::optional<uint64_t> entry_count, file_count, total_bytes, names_bytes, metadata_bytes;
  uint8_t checksum_kind = 1;
  uint64_t chunk_size = 1000;
  std::vector<std::string> classes = {"c0", "c1"};
  std::vector<RawEntry> entries;
  std::string trailing;

  // root, a/ (dir), b.txt (file), a/x (file, label 1)
  static RawManifest valid() {
    RawManifest m;
    m.entries.push_back(raw_dir(0, ""));
    m.entries.push_back(raw_dir(0, "a"));
    m.entries.push_back(raw_file(0, "b.txt", 10, 1));
    m.entries.push_back(raw_file(1, "x", 2000, 2));
    m.entries.back().metadata = R"({"m":1})";
    return m;
  }

  std::vector<std::byte> bytes() const {
    std::vector<std::byte> out;
    auto byte = [&](uint64_t b) { out.push_back(static_cast<std::byte>(b & 0xff)); };
    auto fixed = [&](uint64_t v, int n) {
      for (int i = 0; i < n; ++i) byte(v >> (8 * i));
    };
    auto varint = [&](uint64_t v) {
      for (; v >= 0x80; v >>= 7) byte((v & 0x7f) | 0x80);
      byte(v);
    };
    auto text = [&](const std::string& s) {
      for (char c : s) byte(static_cast<uint8_t>(c));
    };
    uint64_t files = 0, total = 0, names = 0, meta = 0;
    for (const auto& e : entries) {
      names += e.name.size();
      if (e.metadata) meta += e.metadata->size();
      if (!e.is_dir) ++files, total += e.size;
    }
    text(magic);
    fixed(version, 4);
    fixed(flags, 4);
    varint(entry_count.value_or(entries.size()));
    varint(file_count.value_or(files));
    varint(total_bytes.value_or(total));
    byte(checksum_kind);
    varint(chunk_size);
    varint(classes.size());
    for (const auto& c : classes) varint(c.size()), text(c);
    varint(names_bytes.value_or(names));
    varint(metadata_bytes.value_or(meta));
    const int sum_bytes = checksum_kind == 1 ? 8 : checksum_kind == 2 ? 4 : 0;
    for (const auto& e : entries) {
      byte((e.is_dir ? 1 : 0) | (e.metadata ? 2 : 0) | e.extra_flags);
      varint(e.parent);
      varint(e.name.size());
      text(e.name);
      varint(e.mode);
      varint(e.mtime_zigzag);
      if (e.is_dir) continue;
      varint(e.size);
      varint(e.object_zigzag);
      varint(e.label_plus_one);
      fixed(e.checksum, sum_bytes);
      if (e.metadata) varint(e.metadata->size()), text(*e.metadata);
    }
    text(trailing);
    fixed(XXH64(out.data(), out.size(), 0), 8);
    return out;
  }
};

}  // namespace

TEST(Manifest, RoundTripsEveryField) {
  for (ChecksumKind kind : {ChecksumKind::kXxh64, ChecksumKind::kCrc32c, ChecksumKind::kNone}) {
    const Catalog original = awkward_catalog(kind);
    const auto bytes = encode_manifest(original);
    const Catalog decoded = decode_manifest(as_span(bytes));
    expect_same_catalog(original, decoded);
    EXPECT_EQ(encode_manifest(decoded), bytes);  // deterministic
    const auto big = decoded.find("ünïcödé/deep/er/still/big.bin");
    ASSERT_TRUE(big);
    EXPECT_EQ(decoded.entry(*big).object_id, 1ull << 40);
    EXPECT_EQ(decoded.chunk_count(*big), 4u);
    EXPECT_EQ(decoded.metadata(*big), R"({"k":[1,2,3]})");
    EXPECT_EQ(decoded.entry(*decoded.find("zebra crossing/日本語 ファイル.jpg")).mtime_ns, -5);
    EXPECT_EQ(decoded.entry(*decoded.find("n01440764/empty")).size, 0u);
    EXPECT_TRUE(decoded.entry(*decoded.find("empty dir")).is_dir);
    EXPECT_EQ(decoded.entry(*decoded.find("ünïcödé/deep/hollow")).child_count, 0u);
  }
  const Catalog xxh =
      decode_manifest(as_span(encode_manifest(awkward_catalog(ChecksumKind::kXxh64))));
  EXPECT_EQ(xxh.entry(*xxh.find("n01440764/img 1.JPEG")).checksum, 0xdeadbeefcafef00dull);
  const Catalog crc =
      decode_manifest(as_span(encode_manifest(awkward_catalog(ChecksumKind::kCrc32c))));
  EXPECT_EQ(crc.entry(*crc.find("n01440764/img 1.JPEG")).checksum, 0xcafef00dull);
}

TEST(Manifest, RoundTripsEmptyCatalogue) {
  const Catalog empty = CatalogBuilder(ChecksumKind::kXxh64, 4096).build();
  expect_same_catalog(empty, decode_manifest(as_span(encode_manifest(empty))));
}

TEST(Manifest, IsCompact) {
  CatalogBuilder b(ChecksumKind::kXxh64, 4 << 20);
  std::vector<std::string> classes;
  for (int k = 0; k < 10; ++k) classes.push_back("n0" + std::to_string(1440764 + k));
  b.set_classes(classes);
  size_t name_bytes = 0;
  for (int k = 0; k < 10; ++k) {
    for (int i = 0; i < 1000; ++i) {
      const std::string name = classes[k] + "_" + std::to_string(i) + ".JPEG";
      name_bytes += name.size();
      b.add_file(classes[k] + "/" + name, 100000 + i * 37, 1700000000000000000 + i, 0644,
                 k * 1000 + i, k, 0x0123456789abcdefull * (i + 1), "");
    }
  }
  const auto bytes = encode_manifest(std::move(b).build());
  // Fixed 8-byte checksum plus a few bytes of varints per file (ImageNet: tens of MB).
  EXPECT_LE(bytes.size(), name_bytes + 10000 * 24);
}

TEST(Manifest, RejectsEveryTruncation) {
  const auto bytes = encode_manifest(awkward_catalog(ChecksumKind::kXxh64));
  for (size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_THROW(decode_manifest(std::span(bytes.data(), length)), ManifestError) << length;
  }
}

TEST(Manifest, DetectsEverySingleByteFlip) {
  const auto bytes = encode_manifest(awkward_catalog(ChecksumKind::kXxh64));
  for (size_t at = 0; at < bytes.size(); ++at) {
    for (int bit = 0; bit < 8; ++bit) {
      auto corrupt = bytes;
      corrupt[at] ^= static_cast<std::byte>(1 << bit);
      EXPECT_THROW(decode_manifest(as_span(corrupt)), ManifestError) << at << ":" << bit;
    }
    auto corrupt = bytes;
    corrupt[at] ^= std::byte{0xff};
    EXPECT_THROW(decode_manifest(as_span(corrupt)), ManifestError) << at;
  }
}

TEST(Manifest, RejectsTrailingBytesAfterTheChecksum) {
  auto bytes = encode_manifest(awkward_catalog(ChecksumKind::kXxh64));
  bytes.push_back(std::byte{0});
  EXPECT_THROW(decode_manifest(as_span(bytes)), ManifestError);
}

TEST(ManifestStructure, HandWrittenValidManifestDecodes) {
  const Catalog c = decode_manifest(as_span(RawManifest::valid().bytes()));
  ASSERT_EQ(c.entry_count(), 4u);
  EXPECT_EQ(c.find("a/x"), 3u);
  EXPECT_EQ(c.entry(3).label, 1u);
  EXPECT_EQ(c.entry(2).label, 0u);
  EXPECT_EQ(c.entry(3).object_id, 2u);
  EXPECT_EQ(c.metadata(3), R"({"m":1})");
  EXPECT_EQ(c.total_bytes(), 2010u);
}

TEST(ManifestStructure, RejectsBadHeaders) {
  auto m = RawManifest::valid();
  m.magic = "DSFSMANX";
  expect_manifest_error(m.bytes(), "magic");
  m = RawManifest::valid();
  m.version = 2;
  expect_manifest_error(m.bytes(), "upgrade dsfs");
  m.version = 0;
  expect_manifest_error(m.bytes(), "version 0");
  m = RawManifest::valid();
  m.flags = 4;
  expect_manifest_error(m.bytes(), "header flags");
  m = RawManifest::valid();
  m.checksum_kind = 9;
  expect_manifest_error(m.bytes(), "checksum kind");
  m = RawManifest::valid();
  m.chunk_size = 0;
  expect_manifest_error(m.bytes(), "chunk size");
  m.chunk_size = 1ull << 40;
  expect_manifest_error(m.bytes(), "chunk size");
  m = RawManifest::valid();
  m.classes = {"ok", "bad\nname"};
  expect_manifest_error(m.bytes(), "class 1");
  m.classes = {""};
  expect_manifest_error(m.bytes(), "class name length");
}

TEST(ManifestStructure, RejectsAbsurdCountsWithoutAllocating) {
  auto m = RawManifest::valid();
  m.entry_count = 4000000000ull;
  expect_manifest_error(m.bytes(), "cannot fit");
  m.entry_count = UINT64_MAX;
  expect_manifest_error(m.bytes(), "entry count");
  m.entry_count = 0;
  expect_manifest_error(m.bytes(), "entry count");
  m = RawManifest::valid();
  m.names_bytes = 1ull << 50;
  expect_manifest_error(m.bytes(), "names size");
  m = RawManifest::valid();
  m.metadata_bytes = 1ull << 50;
  expect_manifest_error(m.bytes(), "metadata size");
  m = RawManifest::valid();
  m.entries[2].size = 1ull << 60;
  expect_manifest_error(m.bytes(), "file size");
  m = RawManifest::valid();
  m.entries[2].name = std::string(256, 'n');
  expect_manifest_error(m.bytes(), "name length");
}

TEST(ManifestStructure, RejectsCountsThatDisagree) {
  auto m = RawManifest::valid();
  m.file_count = 1;
  expect_manifest_error(m.bytes(), "header says 1 files");
  m.file_count = 4;
  expect_manifest_error(m.bytes(), "file count");
  m = RawManifest::valid();
  m.total_bytes = 2011;
  expect_manifest_error(m.bytes(), "2011 bytes");
  m = RawManifest::valid();
  m.entry_count = 3;
  expect_manifest_error(m.bytes(), "unexpected bytes");
  m = RawManifest::valid();
  m.entry_count = 5;
  expect_manifest_error(m.bytes(), "truncated");
  m = RawManifest::valid();
  m.names_bytes = 5;
  expect_manifest_error(m.bytes(), "names");
  m = RawManifest::valid();
  m.names_bytes = 8;
  expect_manifest_error(m.bytes(), "names");
  m = RawManifest::valid();
  m.metadata_bytes = 10;
  expect_manifest_error(m.bytes(), "metadata");
  m = RawManifest::valid();
  m.metadata_bytes = 3;
  expect_manifest_error(m.bytes(), "metadata length");
  m = RawManifest::valid();
  m.trailing = "x";
  expect_manifest_error(m.bytes(), "unexpected bytes");
}

TEST(ManifestStructure, RejectsABadRoot) {
  auto m = RawManifest::valid();
  m.entries[0].is_dir = false;
  expect_manifest_error(m.bytes(), "root");
  m = RawManifest::valid();
  m.entries[0].name = "r";
  expect_manifest_error(m.bytes(), "root");
  m = RawManifest::valid();
  m.entries[0].parent = 1;
  expect_manifest_error(m.bytes(), "root");
}

TEST(ManifestStructure, RejectsBadNames) {
  for (const std::string& bad :
       std::vector<std::string>{"", "a/b", std::string("a\0b", 3), ".", ".."}) {
    auto m = RawManifest::valid();
    m.entries[3].name = bad;
    expect_manifest_error(m.bytes(), "invalid name");
  }
}

TEST(ManifestStructure, RejectsBrokenTreeOrder) {
  auto m = RawManifest::valid();
  m.entries[3].parent = 3;
  expect_manifest_error(m.bytes(), "not before it");
  m.entries[3].parent = 7;
  expect_manifest_error(m.bytes(), "not before it");
  m = RawManifest::valid();
  m.entries[3].parent = 2;  // b.txt is a file
  expect_manifest_error(m.bytes(), "not a directory");
  m = RawManifest::valid();
  std::swap(m.entries[1], m.entries[2]);  // siblings out of order
  m.entries[3].parent = 2;
  expect_manifest_error(m.bytes(), "not sorted");
  m = RawManifest::valid();
  m.entries[2].name = "a";
  m.entries[2].is_dir = true;
  m.entries[2].size = 0;
  m.entries[2].label_plus_one = 0;
  expect_manifest_error(m.bytes(), "duplicate name 'a'");
  m = RawManifest::valid();  // a child of root after a child of 'a': not contiguous
  m.entries.push_back(raw_file(0, "c", 1, 0));
  expect_manifest_error(m.bytes(), "not contiguous");
}

TEST(ManifestStructure, RejectsBadEntryFields) {
  auto m = RawManifest::valid();
  m.entries[3].label_plus_one = 3;  // label 2 with 2 classes
  expect_manifest_error(m.bytes(), "label 2");
  m = RawManifest::valid();
  m.entries[2].mode = 010000;
  expect_manifest_error(m.bytes(), "mode");
  m = RawManifest::valid();
  m.entries[2].extra_flags = 0x80;
  expect_manifest_error(m.bytes(), "unknown flags");
  m = RawManifest::valid();
  m.entries[1].metadata = "{}";
  expect_manifest_error(m.bytes(), "directory entry 1 has metadata");
  m = RawManifest::valid();
  m.entries[3].metadata = "";
  m.metadata_bytes = 0;
  expect_manifest_error(m.bytes(), "metadata length");
}

TEST(ManifestStructure, RejectsVarintOverflow) {
  auto bytes = RawManifest::valid().bytes();
  // Replace the entry count (1 byte right after the 16-byte fixed header) by an 11-byte varint.
  std::vector<std::byte> patched(bytes.begin(), bytes.begin() + 16);
  for (int i = 0; i < 10; ++i) patched.push_back(std::byte{0xff});
  patched.push_back(std::byte{0x01});
  patched.insert(patched.end(), bytes.begin() + 17, bytes.end() - 8);
  const uint64_t hash = XXH64(patched.data(), patched.size(), 0);
  for (int i = 0; i < 8; ++i) patched.push_back(static_cast<std::byte>(hash >> (8 * i)));
  expect_manifest_error(patched, "overflows 64 bits");
}

// Random damage behind a recomputed checksum reaches the structural checks: decoding must either
// throw ManifestError or yield a consistent tree, never crash (run under ASan/UBSan in CI).
TEST(ManifestStructure, SurvivesRandomDamageBehindAValidChecksum) {
  const auto original = encode_manifest(awkward_catalog(ChecksumKind::kXxh64));
  std::mt19937_64 random(20240601);
  int decoded_ok = 0;
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::byte> damaged(original.begin(), original.end() - 8);
    const int edits = 1 + static_cast<int>(random() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = 16 + random() % (damaged.size() - 16);  // past magic/version/flags
      switch (random() % 3) {
        case 0:
          damaged[at] = static_cast<std::byte>(random());
          break;
        case 1:
          damaged.erase(damaged.begin() + static_cast<std::ptrdiff_t>(at));
          break;
        default:
          damaged.insert(damaged.begin() + static_cast<std::ptrdiff_t>(at),
                         static_cast<std::byte>(random()));
      }
    }
    const uint64_t hash = XXH64(damaged.data(), damaged.size(), 0);
    for (int i = 0; i < 8; ++i) damaged.push_back(static_cast<std::byte>(hash >> (8 * i)));
    try {
      const Catalog c = decode_manifest(as_span(damaged));
      ++decoded_ok;
      for (uint32_t i = 0; i < c.entry_count(); ++i) ASSERT_EQ(c.find(c.path(i)), i);
    } catch (const ManifestError&) {
    }
  }
  EXPECT_LT(decoded_ok, 3000);
}
