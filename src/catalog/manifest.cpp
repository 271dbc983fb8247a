#include "src/catalog/manifest.h"

#include <fmt/core.h>
#include <xxhash.h>

#include <array>
#include <cstring>

#include "src/catalog/names.h"

namespace dsfs::catalog {
namespace {

// Layout (docs/schema.md has the reference): all integers little-endian; "varint" is unsigned
// LEB128, "zigzag" a signed value as a zigzag-mapped varint.
constexpr std::array<char, 8> kMagic = {'D', 'S', 'F', 'S', 'M', 'A', 'N', 'F'};
constexpr uint32_t kManifestVersion = 1;
constexpr size_t kFixedHeaderBytes = kMagic.size() + 4 + 4;  // magic, version, flags
constexpr size_t kTrailerBytes = 8;                          // XXH64 of everything before it
// The smallest non-root entry: flags, parent, name length, one name byte, mode, mtime delta.
constexpr size_t kMinEntryBytes = 6;
constexpr uint8_t kEntryIsDir = 1u << 0;
constexpr uint8_t kEntryHasMetadata = 1u << 1;
constexpr uint8_t kKnownEntryFlags = kEntryIsDir | kEntryHasMetadata;
constexpr uint64_t kMaxChunkSize = 1ull << 30;
constexpr uint64_t kMaxFileSize = 1ull << 48;  // 256 TiB: anything larger is corruption
constexpr uint64_t kMaxClassNameBytes = 4096;
constexpr uint32_t kMaxMode = 07777;

uint64_t zigzag_encode(uint64_t value) {
  // Two's-complement reinterpretation, done in unsigned arithmetic to stay well defined.
  return (value << 1) ^ (0 - (value >> 63));
}

uint64_t zigzag_decode(uint64_t value) {
  return (value >> 1) ^ (0 - (value & 1));
}

size_t checksum_bytes(ChecksumKind kind) {
  switch (kind) {
    case ChecksumKind::kNone:
      return 0;
    case ChecksumKind::kXxh64:
      return 8;
    case ChecksumKind::kCrc32c:
      return 4;
  }
  return 0;
}

class Writer {
 public:
  explicit Writer(size_t reserve) { out_.reserve(reserve); }
  void byte(uint8_t b) { out_.push_back(static_cast<std::byte>(b)); }
  void fixed(uint64_t value, size_t bytes) {
    for (size_t i = 0; i < bytes; ++i) byte(static_cast<uint8_t>(value >> (8 * i)));
  }
  void varint(uint64_t value) {
    while (value >= 0x80) {
      byte(static_cast<uint8_t>(value | 0x80));
      value >>= 7;
    }
    byte(static_cast<uint8_t>(value));
  }
  void text(std::string_view s) {
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  std::vector<std::byte> finish() {
    fixed(XXH64(out_.data(), out_.size(), 0), kTrailerBytes);
    return std::move(out_);
  }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  size_t position() const { return pos_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  uint8_t byte(std::string_view what) {
    need(1, what);
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  uint64_t fixed(size_t count, std::string_view what) {
    need(count, what);
    uint64_t value = 0;
    for (size_t i = 0; i < count; ++i) value |= uint64_t(uint8_t(bytes_[pos_ + i])) << (8 * i);
    pos_ += count;
    return value;
  }
  uint64_t varint(std::string_view what) {
    uint64_t value = 0;
    for (unsigned shift = 0;; shift += 7) {
      const uint8_t b = byte(what);
      if (shift == 63 && b > 1) fail(fmt::format("{} overflows 64 bits", what));
      value |= uint64_t(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return value;
      if (shift == 63) fail(fmt::format("{} overflows 64 bits", what));
    }
  }
  // A varint that must lie in [low, high].
  uint64_t bounded(std::string_view what, uint64_t low, uint64_t high) {
    const size_t at = pos_;
    const uint64_t value = varint(what);
    if (value < low || value > high) {
      fail(fmt::format("{} is {} at byte {}, outside [{}, {}]", what, value, at, low, high));
    }
    return value;
  }
  std::string_view text(size_t count, std::string_view what) {
    need(count, what);
    std::string_view s(reinterpret_cast<const char*>(bytes_.data()) + pos_, count);
    pos_ += count;
    return s;
  }
  [[noreturn]] void fail(const std::string& message) const {
    throw ManifestError("corrupt manifest: " + message);
  }

 private:
  void need(size_t count, std::string_view what) const {
    if (count > remaining()) {
      throw ManifestError(
          fmt::format("manifest truncated: {} needs {} bytes at offset {}, only {} left", what,
                      count, pos_, remaining()));
    }
  }
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
};

}  // namespace

std::vector<std::byte> encode_manifest(const Catalog& catalog) {
  const size_t entry_count = catalog.entry_count();
  size_t metadata_bytes = 0;
  size_t names_bytes = 0;
  for (uint32_t i = 0; i < entry_count; ++i) {
    names_bytes += catalog.entry(i).name_length;
    metadata_bytes += catalog.entry(i).metadata_length;
  }
  Writer w(64 + entry_count * 24 + names_bytes + metadata_bytes);
  for (char c : kMagic) w.byte(static_cast<uint8_t>(c));
  w.fixed(kManifestVersion, 4);
  w.fixed(0, 4);  // flags: none defined in version 1
  w.varint(entry_count);
  w.varint(catalog.file_count());
  w.varint(catalog.total_bytes());
  w.byte(static_cast<uint8_t>(catalog.checksum_kind()));
  w.varint(catalog.chunk_size());
  w.varint(catalog.classes().size());
  for (const auto& c : catalog.classes()) {
    w.varint(c.size());
    w.text(c);
  }
  w.varint(names_bytes);
  w.varint(metadata_bytes);

  const size_t sum_bytes = checksum_bytes(catalog.checksum_kind());
  uint64_t previous_mtime = 0;
  uint64_t previous_object = 0;
  for (uint32_t i = 0; i < entry_count; ++i) {
    const CatalogEntry& e = catalog.entry(i);
    uint8_t flags = e.is_dir ? kEntryIsDir : 0;
    if (!e.is_dir && e.metadata_length > 0) flags |= kEntryHasMetadata;
    w.byte(flags);
    w.varint(e.parent);
    w.varint(e.name_length);
    w.text(catalog.name(i));
    w.varint(e.mode);
    // Deltas: neighbours usually share an mtime and have consecutive object ids.
    const auto mtime = static_cast<uint64_t>(e.mtime_ns);
    w.varint(zigzag_encode(mtime - previous_mtime));
    previous_mtime = mtime;
    if (e.is_dir) continue;
    w.varint(e.size);
    w.varint(zigzag_encode(e.object_id - previous_object));
    previous_object = e.object_id;
    w.varint(e.label == kNoLabel ? 0 : uint64_t(e.label) + 1);
    w.fixed(e.checksum, sum_bytes);
    if (flags & kEntryHasMetadata) {
      w.varint(e.metadata_length);
      w.text(catalog.metadata(i));
    }
  }
  return w.finish();
}

Catalog decode_manifest(std::span<const std::byte> bytes) {
  if (bytes.size() < kFixedHeaderBytes + kTrailerBytes) {
    throw ManifestError(
        fmt::format("manifest truncated: {} bytes is shorter than the smallest manifest ({} bytes)",
                    bytes.size(), kFixedHeaderBytes + kTrailerBytes));
  }
  if (std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    throw ManifestError("not a dsfs manifest (wrong magic bytes)");
  }
  const size_t body_size = bytes.size() - kTrailerBytes;
  Reader r(bytes.first(body_size));
  r.text(kMagic.size(), "magic");
  const uint64_t version = r.fixed(4, "version");
  if (version != kManifestVersion) {
    throw ManifestError(fmt::format(
        "manifest version {} is not supported (this dsfs reads version {}); {}", version,
        kManifestVersion, version > kManifestVersion ? "upgrade dsfs" : "re-ingest the dataset"));
  }
  const uint64_t stored_hash = Reader(bytes.subspan(body_size)).fixed(kTrailerBytes, "checksum");
  const uint64_t actual_hash = XXH64(bytes.data(), body_size, 0);
  if (stored_hash != actual_hash) {
    throw ManifestError(fmt::format(
        "manifest checksum mismatch (stored {:016x}, computed {:016x}): the manifest is corrupt; "
        "re-ingest the dataset",
        stored_hash, actual_hash));
  }

  if (const uint64_t flags = r.fixed(4, "header flags"); flags != 0) {
    r.fail(fmt::format("unknown header flags {:#x}", flags));
  }
  const uint64_t entry_count = r.bounded("entry count", 1, UINT32_MAX - 1);
  // Every entry but the root takes at least kMinEntryBytes: check before reserving memory.
  if (entry_count - 1 > r.remaining() / kMinEntryBytes) {
    r.fail(
        fmt::format("entry count {} cannot fit in the {} bytes left", entry_count, r.remaining()));
  }
  const uint64_t file_count = r.bounded("file count", 0, entry_count - 1);
  const uint64_t total_bytes = r.varint("total bytes");
  const uint8_t kind = r.byte("checksum kind");
  if (kind > static_cast<uint8_t>(ChecksumKind::kCrc32c)) {
    r.fail(fmt::format("unknown checksum kind {}", kind));
  }
  Catalog catalog;
  catalog.checksum_kind_ = static_cast<ChecksumKind>(kind);
  catalog.chunk_size_ = r.bounded("chunk size", 1, kMaxChunkSize);
  const uint64_t class_count = r.bounded("class count", 0, r.remaining() / 2);
  catalog.classes_.reserve(class_count);
  for (uint64_t i = 0; i < class_count; ++i) {
    const uint64_t length = r.bounded("class name length", 1, kMaxClassNameBytes);
    std::string_view name = r.text(length, "class name");
    if (name.find_first_of(std::string_view("\n\0", 2)) != name.npos) {
      r.fail(fmt::format("class {} name contains a newline or NUL", i));
    }
    catalog.classes_.emplace_back(name);
  }
  const uint64_t names_bytes = r.bounded("names size", 0, r.remaining());
  const uint64_t metadata_bytes = r.bounded("metadata size", 0, r.remaining());
  catalog.entries_.reserve(entry_count);
  catalog.names_.reserve(names_bytes);
  catalog.metadata_.reserve(metadata_bytes);

  const size_t sum_bytes = checksum_bytes(catalog.checksum_kind_);
  uint64_t mtime = 0;
  uint64_t object_id = 0;
  uint64_t files_seen = 0;
  uint64_t bytes_seen = 0;
  for (uint64_t i = 0; i < entry_count; ++i) {
    const uint8_t flags = r.byte("entry flags");
    if (flags & ~kKnownEntryFlags)
      r.fail(fmt::format("entry {} has unknown flags {:#x}", i, flags));
    const bool is_dir = flags & kEntryIsDir;
    if (is_dir && (flags & kEntryHasMetadata))
      r.fail(fmt::format("directory entry {} has metadata", i));
    CatalogEntry e{};
    e.is_dir = is_dir ? 1 : 0;
    e.label = kNoLabel;
    const uint64_t parent = r.varint("entry parent");
    const uint64_t name_length = r.bounded("entry name length", 0, 255);
    const std::string_view name = r.text(name_length, "entry name");
    if (i == 0) {
      if (!is_dir || parent != 0 || name_length != 0) {
        r.fail("entry 0 must be the root: a directory with no name and parent 0");
      }
    } else {
      if (parent >= i) r.fail(fmt::format("entry {} has parent {}, not before it", i, parent));
      if (!catalog.entries_[parent].is_dir) {
        r.fail(fmt::format("entry {} has parent {}, which is not a directory", i, parent));
      }
      if (!is_valid_path_component(name)) {
        r.fail(fmt::format("entry {} has an invalid name '{}'", i, name));
      }
      // Breadth-first order: parents never decrease, so each directory's children are one run,
      // and names within a run strictly increase (sorted, no duplicates).
      const CatalogEntry& previous = catalog.entries_[i - 1];
      if (i > 1 && parent < previous.parent) {
        r.fail(
            fmt::format("entry {} (parent {}) follows an entry of parent {}: children are not "
                        "contiguous in breadth-first order",
                        i, parent, previous.parent));
      }
      if (i > 1 && parent == previous.parent) {
        const int order = catalog.name(static_cast<uint32_t>(i - 1)).compare(name);
        if (order == 0) r.fail(fmt::format("duplicate name '{}' in directory {}", name, parent));
        if (order > 0)
          r.fail(fmt::format("entry {} '{}' is not sorted after its sibling", i, name));
      }
      CatalogEntry& dir = catalog.entries_[parent];
      if (dir.child_count == 0) dir.first_child = static_cast<uint32_t>(i);
      ++dir.child_count;
    }
    e.parent = static_cast<uint32_t>(parent);
    if (catalog.names_.size() + name_length > names_bytes) {
      r.fail(fmt::format("names exceed the {} bytes the header declares", names_bytes));
    }
    e.name_offset = static_cast<uint32_t>(catalog.names_.size());
    e.name_length = static_cast<uint16_t>(name_length);
    catalog.names_ += name;
    e.mode = static_cast<uint32_t>(r.bounded("entry mode", 0, kMaxMode));
    mtime += zigzag_decode(r.varint("entry mtime"));
    e.mtime_ns = static_cast<int64_t>(mtime);
    if (!is_dir) {
      e.size = r.bounded("file size", 0, kMaxFileSize);
      object_id += zigzag_decode(r.varint("object id"));
      e.object_id = object_id;
      const uint64_t label = r.varint("label");  // 0: none, else class index + 1
      if (label > class_count) {
        r.fail(fmt::format("entry {} has label {} but there are only {} classes", i, label - 1,
                           class_count));
      }
      e.label = label == 0 ? kNoLabel : static_cast<uint32_t>(label - 1);
      e.checksum = r.fixed(sum_bytes, "file checksum");
      if (flags & kEntryHasMetadata) {
        const uint64_t length =
            r.bounded("metadata length", 1, metadata_bytes - catalog.metadata_.size());
        e.metadata_offset = catalog.metadata_.size();
        e.metadata_length = static_cast<uint32_t>(length);
        catalog.metadata_ += r.text(length, "metadata");
      }
      ++files_seen;
      bytes_seen += e.size;
      if (bytes_seen < e.size) r.fail("total size overflows 64 bits");
    }
    catalog.entries_.push_back(e);
  }
  if (r.remaining() != 0) {
    r.fail(fmt::format("{} unexpected bytes after the last entry", r.remaining()));
  }
  if (files_seen != file_count) {
    r.fail(fmt::format("header says {} files, entries hold {}", file_count, files_seen));
  }
  if (bytes_seen != total_bytes) {
    r.fail(fmt::format("header says {} bytes in total, files hold {}", total_bytes, bytes_seen));
  }
  if (catalog.names_.size() != names_bytes || catalog.metadata_.size() != metadata_bytes) {
    r.fail("names or metadata sizes disagree with the header");
  }
  catalog.file_count_ = files_seen;
  catalog.total_bytes_ = bytes_seen;
  return catalog;
}

}  // namespace dsfs::catalog
