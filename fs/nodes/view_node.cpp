#include "fs/nodes/view_node.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "fs/nodes/dataset_node.h"
#include "src/store/log_text.h"

namespace dsfs::fs {

ViewNode::Target ViewNode::target(const InodeRef& ref) const {
  if (ref.kind != InodeRef::Kind::kViewEntry) return {};
  const ViewRegistry::Slot* slot = views_.registry().slot(ref.view_slot);
  const prefetch::DatasetSnapshot* d = tree_.dataset(ref.dataset);
  if (!slot || !d || ref.entry >= d->catalog->entry_count()) return {};
  const catalog::CatalogEntry& e = d->catalog->entry(ref.entry);
  if (!e.is_dir && !is_image_name(d->catalog->name(ref.entry))) return {};
  return Target{slot, d, &e};
}

std::vector<const prefetch::DatasetSnapshot*> ViewNode::shown_datasets() const {
  std::vector<const prefetch::DatasetSnapshot*> shown = tree_.listing()->datasets;
  std::erase_if(shown,
                [](const prefetch::DatasetSnapshot* d) { return d->index >= kMaxViewDatasets; });
  return shown;
}

std::optional<Attributes> ViewNode::stat(const InodeRef& ref) {
  const ViewRegistry& registry = views_.registry();
  switch (ref.kind) {
    case InodeRef::Kind::kViewsDir:
      return tree_.generated(kViewsDirInode, S_IFDIR | 0555, 2 + registry.preset_count(),
                             kDirectorySize, tree_.mounted_unix());
    case InodeRef::Kind::kViewSpec: {
      if (!registry.slot(ref.view_slot)) return std::nullopt;
      const auto datasets = static_cast<nlink_t>(shown_datasets().size());
      return tree_.generated(view_spec_inode(ref.view_slot), S_IFDIR | 0555, 2 + datasets,
                             kDirectorySize, tree_.mounted_unix());
    }
    default: {
      const Target t = target(ref);
      if (!t) return std::nullopt;
      const uint64_t ino = view_entry_inode(ref.view_slot, ref.dataset, ref.entry);
      return tree_.entry(*t.dataset, ref.entry, ino,
                         t.entry->is_dir ? std::nullopt : std::optional(t.slot->file_size));
    }
  }
}

bool ViewNode::is_directory(const InodeRef& ref) {
  switch (ref.kind) {
    case InodeRef::Kind::kViewsDir:
      return true;
    case InodeRef::Kind::kViewSpec:
      return views_.registry().slot(ref.view_slot) != nullptr;
    default: {
      const Target t = target(ref);
      return t && t.entry->is_dir;
    }
  }
}

Found ViewNode::lookup(const InodeRef& dir, std::string_view name) {
  switch (dir.kind) {
    case InodeRef::Kind::kViewsDir: {
      // Any valid SPEC can be entered; an invalid one is ENOENT with the reason in the log
      // (the kernel caches the miss, so it is logged about once per name).
      const ViewRegistry::Found found = views_.registry().find_or_add(name);
      if (!found.slot) {
        spdlog::warn("{}/{}: {} (ENOENT)", kViewsDirName, store::log_text(name), found.error);
        return {};
      }
      return {view_spec_inode(*found.slot)};
    }
    case InodeRef::Kind::kViewSpec: {
      if (!views_.registry().slot(dir.view_slot)) return {};
      const std::optional<uint32_t> dataset = tree_.find(name);
      if (!dataset || *dataset >= kMaxViewDatasets) return {};
      return {view_entry_inode(dir.view_slot, *dataset, catalog::kRootIndex)};
    }
    default: {
      const Target t = target(dir);
      if (!t || !t.entry->is_dir) return {};
      const catalog::Catalog& catalog = *t.dataset->catalog;
      // A directory keeps its name; an image x.jpg is x.jpg.npy.
      if (const auto child = catalog.lookup(dir.entry, name);
          child && catalog.entry(*child).is_dir) {
        return {view_entry_inode(dir.view_slot, dir.dataset, *child)};
      }
      const std::optional<std::string_view> source = view_source_name(name);
      if (!source) return {};
      const auto child = catalog.lookup(dir.entry, *source);
      if (!child || catalog.entry(*child).is_dir) return {};
      // Files use the canonical slot, so two spellings of a SPEC share each file.
      return {view_entry_inode(t.slot->canonical, dir.dataset, *child)};
    }
  }
}

int ViewNode::list(const InodeRef& dir, uint64_t from, DirectorySink& out) {
  switch (dir.kind) {
    case InodeRef::Kind::kViewsDir: {
      // The presets; any other valid SPEC is entered by name.
      const ViewRegistry& registry = views_.registry();
      for (uint64_t position = from; position < registry.preset_count(); ++position) {
        const auto slot = static_cast<uint32_t>(position);
        if (!out.add(registry.slot(slot)->name, view_spec_inode(slot), position)) break;
      }
      return 0;
    }
    case InodeRef::Kind::kViewSpec: {
      if (!views_.registry().slot(dir.view_slot)) return ENOENT;
      const std::vector<const prefetch::DatasetSnapshot*> shown = shown_datasets();
      for (uint64_t position = from; position < shown.size(); ++position) {
        const prefetch::DatasetSnapshot& d = *shown[position];
        if (!out.add(d.name(), view_entry_inode(dir.view_slot, d.index, catalog::kRootIndex),
                     position)) {
          break;
        }
      }
      return 0;
    }
    default:
      break;
  }
  const Target t = target(dir);
  if (!t) return ENOENT;
  if (!t.entry->is_dir) return ENOTDIR;
  const catalog::Catalog& catalog = *t.dataset->catalog;
  for (uint64_t position = from; position < t.entry->child_count; ++position) {
    const uint32_t child = t.entry->first_child + static_cast<uint32_t>(position);
    const std::string_view name = catalog.name(child);
    if (catalog.entry(child).is_dir) {
      if (!out.add(name, view_entry_inode(dir.view_slot, dir.dataset, child), position)) break;
      continue;
    }
    if (!is_image_name(name)) continue;  // not in the view
    // An image whose .npy name a sibling directory already has is not listed (lookup finds
    // the directory).
    const std::string view_name = view_file_name(name);
    if (const auto same = catalog.lookup(dir.entry, view_name);
        same && catalog.entry(*same).is_dir) {
      warn_shadowed(*t.dataset, child, view_name);
      continue;
    }
    if (!out.add(view_name, view_entry_inode(t.slot->canonical, dir.dataset, child), position)) {
      break;
    }
  }
  return 0;
}

void ViewNode::warn_shadowed(const prefetch::DatasetSnapshot& dataset, uint32_t image,
                             std::string_view view_name) {
  {
    MutexLock lock(shadow_warned_mutex_);
    if (!shadow_warned_.emplace(dataset.name(), dataset.generation()).second) return;
  }
  spdlog::warn(
      "{}/{}: its view {} is not shown in {}, where a directory of that name is; rename one "
      "of the two in the dataset to see both (and so for any other such image of '{}')",
      store::log_text(dataset.name()), store::log_text(dataset.catalog->path(image)),
      store::log_text(view_name), kViewsDirName, store::log_text(dataset.name()));
}

uint64_t ViewNode::parent(const InodeRef& dir) {
  switch (dir.kind) {
    case InodeRef::Kind::kViewsDir:
      return kRootInode;
    case InodeRef::Kind::kViewSpec:
      return kViewsDirInode;
    default: {
      const Target t = target(dir);
      if (!t || dir.entry == catalog::kRootIndex) return view_spec_inode(dir.view_slot);
      return view_entry_inode(dir.view_slot, dir.dataset, t.entry->parent);
    }
  }
}

int ViewNode::open(const InodeRef& ref) {
  if (ref.kind != InodeRef::Kind::kViewEntry) return EISDIR;
  const Target t = target(ref);
  if (!t) return ENOENT;
  return t.entry->is_dir ? EISDIR : 0;
}

int ViewNode::read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) {
  if (const int error = open(ref); error != 0) return error;
  const Target t = target(ref);
  const ViewRegistry::Slot& slot = *t.slot;
  if (offset >= slot.file_size || size == 0) return 0;
  const size_t length = static_cast<size_t>(std::min<uint64_t>(size, slot.file_size - offset));
  const prefetch::ObjectBuffer file =
      views_.read(*t.dataset, ref.entry, slot.canonical, offset, length);
  if (!file) {
    out.add(slot.header.data() + offset, length);  // a slot never changes once added
    return 0;
  }
  const char* data = file->bytes().data() + offset;
  out.add(data, length, file);
  return 0;
}

int ViewNode::xattr(const InodeRef& ref, std::string_view name, std::string& value) {
  if (ref.kind != InodeRef::Kind::kViewEntry) return ENODATA;
  const Target t = target(ref);
  if (!t) return ENOENT;
  return catalog_xattr(*t.dataset, ref.entry, name, value);
}

int ViewNode::xattr_names(const InodeRef& ref, std::string& names) {
  if (ref.kind != InodeRef::Kind::kViewEntry) return 0;
  const Target t = target(ref);
  if (!t) return ENOENT;
  names = catalog_xattr_names(*t.dataset, ref.entry);
  return 0;
}

}  // namespace dsfs::fs
