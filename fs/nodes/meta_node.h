#pragma once
// MOUNT/.meta/NAME/: info.json, classes.txt, labels.csv and metadata.jsonl of each dataset,
// rendered once on first use (stat needs their exact size) and kept for the mount's life.
#include <array>
#include <mutex>

#include "fs/node.h"

namespace dsfs::fs {

// Thread safety: each text is rendered once under its std::once_flag, then only read;
// contents_mutex_ guards the table of texts (datasets appear while mounted).
class MetaNode final : public Node {
 public:
  MetaNode(const MountTree& tree, std::string ns);

  std::optional<Attributes> stat(const InodeRef& ref) override;
  bool is_directory(const InodeRef& ref) override;
  Found lookup(const InodeRef& dir, std::string_view name) override;
  int list(const InodeRef& dir, uint64_t from, DirectorySink& out) override;
  uint64_t parent(const InodeRef& dir) override;
  int open(const InodeRef& ref) override;
  int read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) override;

  // The text of `file` of dataset `dataset` (an existing dataset; not kDirectory).
  const std::string& content(uint32_t dataset, MetaFile file);

 private:
  struct Contents {
    std::array<std::once_flag, 5> once;
    std::array<std::string, 5> text;
  };
  // Whether `ref` names .meta/NAME (or a file in it) of an existing dataset.
  bool exists(const InodeRef& ref) const { return tree_.dataset(ref.dataset) != nullptr; }
  Contents& contents(uint32_t dataset);

  const MountTree& tree_;
  const std::string ns_;
  Mutex contents_mutex_;
  // By dataset index, made on first use; never erased, so references stay valid.
  std::unordered_map<uint32_t, std::unique_ptr<Contents>> contents_
      DSFS_GUARDED_BY(contents_mutex_);
};

}  // namespace dsfs::fs
