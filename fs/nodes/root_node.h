#pragma once
// The mount's root directory: .dsfs, .meta, .views and one directory per dataset.
#include "fs/node.h"

namespace dsfs::fs {

// Thread safety: holds nothing mutable; the tree is immutable.
class RootNode final : public Node {
 public:
  explicit RootNode(const MountTree& tree) : tree_(tree) {}

  std::optional<Attributes> stat(const InodeRef& ref) override;
  bool is_directory(const InodeRef&) override { return true; }
  Found lookup(const InodeRef& dir, std::string_view name) override;
  int list(const InodeRef& dir, uint64_t from, DirectorySink& out) override;

 private:
  const MountTree& tree_;
};

}  // namespace dsfs::fs
