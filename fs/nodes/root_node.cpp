#include "fs/nodes/root_node.h"

namespace dsfs::fs {
namespace {

// The mount's own directories, listed before the datasets.
constexpr std::pair<std::string_view, uint64_t> kOwnDirectories[] = {
    {kControlDirName, kControlDirInode},
    {kMetaDirName, kMetaDirInode},
    {kViewsDirName, kViewsDirInode},
};

}  // namespace

std::optional<Attributes> RootNode::stat(const InodeRef&) {
  const auto links =
      static_cast<nlink_t>(2 + std::size(kOwnDirectories) + tree_.listing()->datasets.size());
  return tree_.generated(kRootInode, S_IFDIR | 0555, links, kDirectorySize, tree_.mounted_unix());
}

Found RootNode::lookup(const InodeRef&, std::string_view name) {
  for (const auto& [own, ino] : kOwnDirectories) {
    if (name == own) return {ino};
  }
  const std::optional<uint32_t> dataset = tree_.find(name);
  return {dataset ? entry_inode(*dataset, catalog::kRootIndex) : 0};
}

int RootNode::list(const InodeRef&, uint64_t from, DirectorySink& out) {
  const uint64_t own = std::size(kOwnDirectories);
  const std::shared_ptr<const MountTree::Listing> listing = tree_.listing();
  const uint64_t count = own + listing->datasets.size();
  for (uint64_t position = from; position < count; ++position) {
    const prefetch::DatasetSnapshot* d =
        position < own ? nullptr : listing->datasets[position - own];
    const bool added =
        d == nullptr
            ? out.add(kOwnDirectories[position].first, kOwnDirectories[position].second, position)
            : out.add(d->name(), entry_inode(d->index, catalog::kRootIndex), position);
    if (!added) break;
  }
  return 0;
}

}  // namespace dsfs::fs
