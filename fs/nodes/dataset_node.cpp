#include "fs/nodes/dataset_node.h"

#include <linux/limits.h>

namespace dsfs::fs {
namespace {

constexpr std::string_view kLabelXattr = "user.dsfs.label";
constexpr std::string_view kClassXattr = "user.dsfs.class";
constexpr std::string_view kMetaXattr = "user.dsfs.meta";

std::optional<std::string> xattr_value(const prefetch::DatasetSnapshot& d, uint32_t entry,
                                       std::string_view name) {
  const catalog::Catalog& catalog = *d.catalog;
  const catalog::CatalogEntry& e = catalog.entry(entry);
  if (e.is_dir) return std::nullopt;
  if (name == kLabelXattr && e.label != catalog::kNoLabel) return std::to_string(e.label);
  if (name == kClassXattr && e.label < catalog.classes().size()) {
    return catalog.classes()[e.label];
  }
  if (name == kMetaXattr && !catalog.metadata(entry).empty()) {
    return std::string(catalog.metadata(entry));
  }
  return std::nullopt;
}

}  // namespace

int catalog_xattr(const prefetch::DatasetSnapshot& d, uint32_t entry, std::string_view name,
                  std::string& value) {
  std::optional<std::string> found = xattr_value(d, entry, name);
  if (!found) return ENODATA;
  if (found->size() > XATTR_SIZE_MAX) return E2BIG;
  value = std::move(*found);
  return 0;
}

std::string catalog_xattr_names(const prefetch::DatasetSnapshot& d, uint32_t entry) {
  std::string names;
  for (const std::string_view name : {kLabelXattr, kClassXattr, kMetaXattr}) {
    if (const auto value = xattr_value(d, entry, name); value && value->size() <= XATTR_SIZE_MAX) {
      names += name;
      names += '\0';
    }
  }
  return names;
}

const prefetch::DatasetSnapshot* DatasetNode::dataset(const InodeRef& ref) const {
  const prefetch::DatasetSnapshot* d = tree_.dataset(ref.dataset);
  return d && ref.entry < d->catalog->entry_count() ? d : nullptr;
}

std::optional<Attributes> DatasetNode::stat(const InodeRef& ref) {
  const prefetch::DatasetSnapshot* d = dataset(ref);
  if (!d) return std::nullopt;
  return tree_.entry(*d, ref.entry, entry_inode(ref.dataset, ref.entry));
}

bool DatasetNode::is_directory(const InodeRef& ref) {
  const prefetch::DatasetSnapshot* d = dataset(ref);
  return d && d->catalog->entry(ref.entry).is_dir;
}

Found DatasetNode::lookup(const InodeRef& dir, std::string_view name) {
  if (!is_directory(dir)) return {};
  const std::optional<uint32_t> child =
      tree_.dataset(dir.dataset)->catalog->lookup(dir.entry, name);
  return {child ? entry_inode(dir.dataset, *child) : 0};
}

int DatasetNode::list(const InodeRef& dir, uint64_t from, DirectorySink& out) {
  const prefetch::DatasetSnapshot* d = dataset(dir);
  if (!d) return ENOENT;
  const catalog::Catalog& catalog = *d->catalog;
  const catalog::CatalogEntry& e = catalog.entry(dir.entry);
  if (!e.is_dir) return ENOTDIR;
  for (uint64_t position = from; position < e.child_count; ++position) {
    const uint32_t child = e.first_child + static_cast<uint32_t>(position);
    if (!out.add(catalog.name(child), entry_inode(dir.dataset, child), position)) break;
  }
  return 0;
}

uint64_t DatasetNode::parent(const InodeRef& dir) {
  const prefetch::DatasetSnapshot* d = dataset(dir);
  if (!d || dir.entry == catalog::kRootIndex) return kRootInode;
  return entry_inode(dir.dataset, d->catalog->entry(dir.entry).parent);
}

int DatasetNode::open(const InodeRef& ref) {
  const prefetch::DatasetSnapshot* d = dataset(ref);
  if (!d) return ENOENT;
  return d->catalog->entry(ref.entry).is_dir ? EISDIR : 0;
}

int DatasetNode::read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) {
  if (const int error = open(ref); error != 0) return error;
  // Without OPEN, a READ at 0 is how the mount learns that a file was read (a page-cache miss).
  if (offset == 0) counters_.files_read.fetch_add(1, std::memory_order_relaxed);
  for (prefetch::Slice& s : reader_.read(*tree_.dataset(ref.dataset), ref.entry, offset, size)) {
    const char* data = s.buffer->bytes().data() + s.offset;
    out.add(data, s.length, std::move(s.buffer));
  }
  counters_.bytes_read.fetch_add(out.size(), std::memory_order_relaxed);
  return 0;
}

int DatasetNode::xattr(const InodeRef& ref, std::string_view name, std::string& value) {
  const prefetch::DatasetSnapshot* d = dataset(ref);
  if (!d) return ENOENT;
  return catalog_xattr(*d, ref.entry, name, value);
}

int DatasetNode::xattr_names(const InodeRef& ref, std::string& names) {
  const prefetch::DatasetSnapshot* d = dataset(ref);
  if (!d) return ENOENT;
  names = catalog_xattr_names(*d, ref.entry);
  return 0;
}

}  // namespace dsfs::fs
