#pragma once
// The dataset trees: MOUNT/NAME/... as ingested, each file read through the prefetch layer.
#include "fs/node.h"
#include "fs/stats.h"
#include "prefetch/file_reader.h"

namespace dsfs::fs {

// The user.dsfs.* attribute `name` of file `entry` of `d` (label, class, metadata): 0, ENODATA,
// or E2BIG for a value longer than the kernel passes (XATTR_SIZE_MAX).
int catalog_xattr(const prefetch::DatasetSnapshot& d, uint32_t entry, std::string_view name,
                  std::string& value);
// The names catalog_xattr can answer for `entry`, each NUL-terminated; a value too long to
// read is not listed (tools copying every listed xattr would fail on the file).
std::string catalog_xattr_names(const prefetch::DatasetSnapshot& d, uint32_t entry);

// Thread safety: the tree is immutable; the reader and counters synchronize themselves.
class DatasetNode final : public Node {
 public:
  DatasetNode(const MountTree& tree, prefetch::FileReader& reader, FsCounters& counters)
      : tree_(tree), reader_(reader), counters_(counters) {}

  std::optional<Attributes> stat(const InodeRef& ref) override;
  bool is_directory(const InodeRef& ref) override;
  Found lookup(const InodeRef& dir, std::string_view name) override;
  int list(const InodeRef& dir, uint64_t from, DirectorySink& out) override;
  uint64_t parent(const InodeRef& dir) override;
  int open(const InodeRef& ref) override;
  int read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) override;
  int xattr(const InodeRef& ref, std::string_view name, std::string& value) override;
  int xattr_names(const InodeRef& ref, std::string& names) override;

 private:
  // The dataset `ref` names, if it names an existing entry of it.
  const prefetch::DatasetSnapshot* dataset(const InodeRef& ref) const;

  const MountTree& tree_;
  prefetch::FileReader& reader_;
  FsCounters& counters_;
};

}  // namespace dsfs::fs
