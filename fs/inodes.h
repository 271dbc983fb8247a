#pragma once
// Inode numbers are computed from what they name, so the kernel's inode is all a request needs
// and nothing is stored per inode:
//   1                         the mount root
//   2, 3, 4                   .meta, .dsfs, .dsfs/stats.json
//   16 + 8*D + k              .meta/NAME of dataset D (k = 0) and its files (k = 1..4)
//   ((D + 1) << 32) | E       catalogue entry E of dataset D (E = 0: the dataset's root)
//   (1 << 62) | N             snapshot N of .dsfs/stats.json (one per lookup; see Filesystem)
#include <cstdint>
#include <optional>
#include <string_view>

namespace dsfs::fs {

inline constexpr uint64_t kRootInode = 1;  // FUSE_ROOT_ID
inline constexpr uint64_t kMetaDirInode = 2;
inline constexpr uint64_t kControlDirInode = 3;
inline constexpr uint64_t kStatsInode = 4;  // the name; its contents live in snapshot inodes
inline constexpr uint64_t kStatsSnapshotBase = uint64_t{1} << 62;
inline constexpr std::string_view kMetaDirName = ".meta";
inline constexpr std::string_view kControlDirName = ".dsfs";
inline constexpr std::string_view kStatsFileName = "stats.json";

enum class MetaFile : uint32_t {
  kDirectory = 0,
  kInfo = 1,
  kClasses = 2,
  kLabels = 3,
  kMetadata = 4
};
inline constexpr MetaFile kMetaFiles[] = {MetaFile::kInfo, MetaFile::kClasses, MetaFile::kLabels,
                                          MetaFile::kMetadata};
std::string_view meta_file_name(MetaFile file);
std::optional<MetaFile> meta_file_by_name(std::string_view name);

// Datasets a mount can hold: dataset inodes must stay above the virtual ones and below 2^64.
inline constexpr uint32_t kMaxDatasets = (1u << 28) - 1;

constexpr uint64_t meta_inode(uint32_t dataset, MetaFile file) {
  return 16 + 8 * uint64_t{dataset} + static_cast<uint32_t>(file);
}
constexpr uint64_t entry_inode(uint32_t dataset, uint32_t entry) {
  return (uint64_t{dataset} + 1) << 32 | entry;
}

struct InodeRef {
  enum class Kind { kInvalid, kRoot, kMetaDir, kControlDir, kStats, kStatsSnapshot, kMeta, kEntry };
  Kind kind = Kind::kInvalid;
  uint32_t dataset = 0;
  uint32_t entry = 0;                    // kEntry
  MetaFile meta = MetaFile::kDirectory;  // kMeta
};

// Decodes an inode number; kInvalid for numbers that name nothing (the caller still has to
// check that the dataset and entry exist in this mount).
InodeRef decode_inode(uint64_t ino);

}  // namespace dsfs::fs
