#pragma once
// MOUNT/.views/SPEC/NAME/...: every image of every dataset as a preprocessed .npy tensor. The
// SPEC directories come from the ViewRegistry, the files from ViewFiles (fs/views.h); this
// class maps the dataset trees onto them (only images are shown, x.jpg as x.jpg.npy).
#include <set>
#include <string>
#include <utility>

#include "fs/node.h"
#include "fs/views.h"
#include "src/store/thread_annotations.h"

namespace dsfs::fs {

// Thread safety: the tree is immutable; ViewFiles and its registry synchronize themselves;
// shadow_warned_ is guarded by its mutex.
class ViewNode final : public Node {
 public:
  ViewNode(const MountTree& tree, ViewFiles& views) : tree_(tree), views_(views) {}

  std::optional<Attributes> stat(const InodeRef& ref) override;
  bool is_directory(const InodeRef& ref) override;
  Found lookup(const InodeRef& dir, std::string_view name) override;
  int list(const InodeRef& dir, uint64_t from, DirectorySink& out) override;
  uint64_t parent(const InodeRef& dir) override;
  int open(const InodeRef& ref) override;
  // The .npy header straight from the SPEC; anything past it from the rendered file (rendered
  // on the first such READ, then cached for the others). Throws ViewRenderError.
  int read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) override;
  // A view file carries its image's attributes.
  int xattr(const InodeRef& ref, std::string_view name, std::string& value) override;
  int xattr_names(const InodeRef& ref, std::string& names) override;

 private:
  // What a .views/SPEC/NAME/... inode names, if it exists: a directory, or an image file.
  struct Target {
    const ViewRegistry::Slot* slot = nullptr;
    const prefetch::DatasetSnapshot* dataset = nullptr;
    const catalog::CatalogEntry* entry = nullptr;
    explicit operator bool() const { return entry != nullptr; }
  };
  Target target(const InodeRef& ref) const;
  // The listed datasets that .views/SPEC shows (view inodes have room for kMaxViewDatasets).
  std::vector<const prefetch::DatasetSnapshot*> shown_datasets() const;

  // Warns, once per dataset generation, that an image's view is hidden by a sibling directory
  // of its .npy name (a loader walking the view gets fewer samples than the dataset has).
  void warn_shadowed(const prefetch::DatasetSnapshot& dataset, uint32_t image,
                     std::string_view view_name);

  const MountTree& tree_;
  ViewFiles& views_;
  Mutex shadow_warned_mutex_;
  std::set<std::pair<std::string, uint64_t>> shadow_warned_ DSFS_GUARDED_BY(shadow_warned_mutex_);
};

}  // namespace dsfs::fs
