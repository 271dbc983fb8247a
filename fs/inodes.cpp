#include "fs/inodes.h"

namespace dsfs::fs {

std::string_view meta_file_name(MetaFile file) {
  switch (file) {
    case MetaFile::kDirectory:
      return "";
    case MetaFile::kInfo:
      return "info.json";
    case MetaFile::kClasses:
      return "classes.txt";
    case MetaFile::kLabels:
      return "labels.csv";
    case MetaFile::kMetadata:
      return "metadata.jsonl";
  }
  return "";
}

std::optional<MetaFile> meta_file_by_name(std::string_view name) {
  for (const MetaFile file : kMetaFiles) {
    if (meta_file_name(file) == name) return file;
  }
  return std::nullopt;
}

namespace {

InodeRef decode_kind(uint64_t ino) {
  using Kind = InodeRef::Kind;
  if (ino == kRootInode) return {.kind = Kind::kRoot};
  if (ino == kMetaDirInode) return {.kind = Kind::kMetaDir};
  if (ino == kControlDirInode) return {.kind = Kind::kControlDir};
  if (ino == kStatsInode) return {.kind = Kind::kStats};
  if (ino == kViewsDirInode) return {.kind = Kind::kViewsDir};
  if (ino == kPlanInode) return {.kind = Kind::kPlan};
  if (ino == kRefreshInode) return {.kind = Kind::kRefresh};
  if (ino & kViewInodeFlag) {
    const auto slot = static_cast<uint32_t>((ino >> 48) & ((uint64_t{1} << kViewSlotBits) - 1));
    const auto dataset_plus_one = static_cast<uint32_t>((ino >> 32) & 0xffffu);
    const auto entry = static_cast<uint32_t>(ino & 0xffffffffu);
    if (slot >= kMaxViewSlots) return {};
    if (dataset_plus_one == 0) {
      return entry == 0 ? InodeRef{.kind = Kind::kViewSpec, .view_slot = slot} : InodeRef{};
    }
    return {.kind = Kind::kViewEntry,
            .dataset = dataset_plus_one - 1,
            .entry = entry,
            .view_slot = slot};
  }
  if (ino > kStatsSnapshotBase && ino < 2 * kStatsSnapshotBase)
    return {.kind = Kind::kStatsSnapshot};
  if (ino >= 16 && ino < (uint64_t{1} << 32)) {
    const uint64_t slot = (ino - 16) % 8;
    if (slot > static_cast<uint32_t>(MetaFile::kMetadata)) return {};
    return {.kind = Kind::kMeta,
            .dataset = static_cast<uint32_t>((ino - 16) / 8),
            .meta = static_cast<MetaFile>(slot)};
  }
  const uint64_t dataset_plus_one = ino >> 32;
  if (dataset_plus_one == 0 || dataset_plus_one > kMaxDatasets) return {};
  return {.kind = Kind::kEntry,
          .dataset = static_cast<uint32_t>(dataset_plus_one - 1),
          .entry = static_cast<uint32_t>(ino & 0xffffffffu)};
}

}  // namespace

InodeRef decode_inode(uint64_t ino) {
  InodeRef ref = decode_kind(ino);
  ref.ino = ino;
  return ref;
}

}  // namespace dsfs::fs
