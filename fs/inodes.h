#pragma once
// Inode numbers are computed from what they name, so the kernel's inode is all a request needs
// and nothing is stored per inode:
//   1                         the mount root
//   2, 3, 4, 5, 6, 7          .meta, .dsfs, .dsfs/stats.json, .views, .dsfs/plan,
//                             .dsfs/refresh
//   16 + 8*D + k              .meta/NAME of dataset D (k = 0) and its files (k = 1..4)
//   ((D + 1) << 32) | E       catalogue entry E of dataset D (E = 0: the dataset's root)
//   (1 << 62) | N             snapshot N of .dsfs/stats.json (one per lookup; see Filesystem)
//   (1 << 63) | S << 48       .views/SPEC, the view directory in slot S of the ViewRegistry
//   (1 << 63) | S << 48 | ((D + 1) << 32) | E
//                             catalogue entry E of dataset D under .views/SPEC: a directory,
//                             or the .npy of an image (then S is the slot's canonical slot, so
//                             two spellings of one SPEC share each file and its page cache)
#include <cstdint>
#include <optional>
#include <string_view>

namespace dsfs::fs {

inline constexpr uint64_t kRootInode = 1;  // FUSE_ROOT_ID
inline constexpr uint64_t kMetaDirInode = 2;
inline constexpr uint64_t kControlDirInode = 3;
inline constexpr uint64_t kStatsInode = 4;  // the name; its contents live in snapshot inodes
inline constexpr uint64_t kViewsDirInode = 5;
inline constexpr uint64_t kPlanInode = 6;
inline constexpr uint64_t kRefreshInode = 7;
inline constexpr uint64_t kStatsSnapshotBase = uint64_t{1} << 62;
inline constexpr std::string_view kMetaDirName = ".meta";
inline constexpr std::string_view kControlDirName = ".dsfs";
inline constexpr std::string_view kStatsFileName = "stats.json";
inline constexpr std::string_view kPlanFileName = "plan";
inline constexpr std::string_view kRefreshFileName = "refresh";
inline constexpr std::string_view kViewsDirName = ".views";

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

// Dataset indices a mount can give out over its life (a dataset that appears or is refreshed
// takes a new one): dataset inodes must stay above the virtual ones and below 2^64.
inline constexpr uint32_t kMaxDatasets = (1u << 28) - 1;

// View inodes: bit 63, a 15-bit slot (below kMaxViewSlots, the registry's bound), a 16-bit
// dataset + 1 and the 32-bit entry. Datasets from index kMaxViewDatasets on are not shown under
// .views.
inline constexpr uint64_t kViewInodeFlag = uint64_t{1} << 63;
inline constexpr uint32_t kViewSlotBits = 15;
inline constexpr uint32_t kMaxViewSlots = 1u << 14;
inline constexpr uint32_t kMaxViewDatasets = (1u << 16) - 1;
static_assert(kMaxViewSlots <= (1u << kViewSlotBits));

constexpr uint64_t meta_inode(uint32_t dataset, MetaFile file) {
  return 16 + 8 * uint64_t{dataset} + static_cast<uint32_t>(file);
}
constexpr uint64_t entry_inode(uint32_t dataset, uint32_t entry) {
  return (uint64_t{dataset} + 1) << 32 | entry;
}

// .views/SPEC of view slot `slot` (< kMaxViewSlots).
constexpr uint64_t view_spec_inode(uint32_t slot) {
  return kViewInodeFlag | uint64_t{slot} << 48;
}
// Entry `entry` of dataset `dataset` (< kMaxViewDatasets) under view slot `slot`.
constexpr uint64_t view_entry_inode(uint32_t slot, uint32_t dataset, uint32_t entry) {
  return kViewInodeFlag | uint64_t{slot} << 48 | (uint64_t{dataset} + 1) << 32 | entry;
}

struct InodeRef {
  enum class Kind {
    kInvalid,
    kRoot,
    kMetaDir,
    kControlDir,
    kStats,
    kStatsSnapshot,
    kPlan,     // .dsfs/plan: the prefetch hint, writable
    kRefresh,  // .dsfs/refresh: writing dataset names refreshes them
    kMeta,
    kEntry,
    kViewsDir,   // .views
    kViewSpec,   // .views/SPEC
    kViewEntry,  // .views/SPEC/NAME/...: a directory or an image's .npy
  };
  Kind kind = Kind::kInvalid;
  uint32_t dataset = 0;                  // kMeta, kEntry, kViewEntry
  uint32_t entry = 0;                    // kEntry, kViewEntry
  MetaFile meta = MetaFile::kDirectory;  // kMeta
  uint32_t view_slot = 0;                // kViewSpec, kViewEntry
  uint64_t ino = 0;                      // the number decoded
};

// The number of kinds, for tables indexed by kind.
inline constexpr size_t kInodeKindCount = static_cast<size_t>(InodeRef::Kind::kViewEntry) + 1;

// Decodes an inode number; kInvalid for numbers that name nothing (the caller still has to
// check that the dataset and entry exist in this mount).
InodeRef decode_inode(uint64_t ino);

}  // namespace dsfs::fs
