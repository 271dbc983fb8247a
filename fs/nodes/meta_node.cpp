#include "fs/nodes/meta_node.h"

#include "fs/virtual_files.h"

namespace dsfs::fs {

MetaNode::MetaNode(const MountTree& tree, std::string ns) : tree_(tree), ns_(std::move(ns)) {}

MetaNode::Contents& MetaNode::contents(uint32_t dataset) {
  MutexLock lock(contents_mutex_);
  std::unique_ptr<Contents>& contents = contents_[dataset];
  if (!contents) contents = std::make_unique<Contents>();
  return *contents;
}

const std::string& MetaNode::content(uint32_t dataset, MetaFile file) {
  const auto slot = static_cast<size_t>(file);
  Contents& contents = this->contents(dataset);
  std::call_once(contents.once[slot], [&] {
    const prefetch::DatasetSnapshot& d = *tree_.dataset(dataset);
    switch (file) {
      case MetaFile::kInfo:
        contents.text[slot] = render_info_json(d, ns_);
        break;
      case MetaFile::kClasses:
        contents.text[slot] = render_classes_txt(*d.catalog);
        break;
      case MetaFile::kLabels:
        contents.text[slot] = render_labels_csv(*d.catalog);
        break;
      case MetaFile::kMetadata:
        contents.text[slot] = render_metadata_jsonl(*d.catalog);
        break;
      case MetaFile::kDirectory:
        break;
    }
  });
  return contents.text[slot];
}

std::optional<Attributes> MetaNode::stat(const InodeRef& ref) {
  const auto datasets = static_cast<nlink_t>(tree_.listing()->datasets.size());
  if (ref.kind == InodeRef::Kind::kMetaDir) {
    return tree_.generated(kMetaDirInode, S_IFDIR | 0555, 2 + datasets, kDirectorySize,
                           tree_.mounted_unix());
  }
  if (!exists(ref)) return std::nullopt;
  const uint64_t ino = meta_inode(ref.dataset, ref.meta);
  const int64_t created = tree_.dataset(ref.dataset)->info.created_unix;
  if (ref.meta == MetaFile::kDirectory) {
    return tree_.generated(ino, S_IFDIR | 0555, 2, kDirectorySize, created);
  }
  return tree_.generated(ino, S_IFREG | 0444, 1, content(ref.dataset, ref.meta).size(), created);
}

bool MetaNode::is_directory(const InodeRef& ref) {
  return ref.kind == InodeRef::Kind::kMetaDir || (exists(ref) && ref.meta == MetaFile::kDirectory);
}

Found MetaNode::lookup(const InodeRef& dir, std::string_view name) {
  if (dir.kind == InodeRef::Kind::kMetaDir) {
    const std::optional<uint32_t> dataset = tree_.find(name);
    return {dataset ? meta_inode(*dataset, MetaFile::kDirectory) : 0};
  }
  if (!is_directory(dir)) return {};
  const std::optional<MetaFile> file = meta_file_by_name(name);
  return {file ? meta_inode(dir.dataset, *file) : 0};
}

int MetaNode::list(const InodeRef& dir, uint64_t from, DirectorySink& out) {
  if (dir.kind == InodeRef::Kind::kMetaDir) {
    const std::shared_ptr<const MountTree::Listing> listing = tree_.listing();
    for (uint64_t position = from; position < listing->datasets.size(); ++position) {
      const prefetch::DatasetSnapshot& d = *listing->datasets[position];
      if (!out.add(d.name(), meta_inode(d.index, MetaFile::kDirectory), position)) {
        break;
      }
    }
    return 0;
  }
  if (!exists(dir)) return ENOENT;
  if (dir.meta != MetaFile::kDirectory) return ENOTDIR;
  for (uint64_t position = from; position < std::size(kMetaFiles); ++position) {
    const MetaFile file = kMetaFiles[position];
    if (!out.add(meta_file_name(file), meta_inode(dir.dataset, file), position)) break;
  }
  return 0;
}

uint64_t MetaNode::parent(const InodeRef& dir) {
  return dir.kind == InodeRef::Kind::kMetaDir ? kRootInode : kMetaDirInode;
}

int MetaNode::open(const InodeRef& ref) {
  if (ref.kind == InodeRef::Kind::kMetaDir) return EISDIR;
  if (!exists(ref)) return ENOENT;
  return ref.meta == MetaFile::kDirectory ? EISDIR : 0;
}

int MetaNode::read(const InodeRef& ref, uint64_t offset, size_t size, ReadReply& out) {
  if (const int error = open(ref); error != 0) return error;
  // The text lives as long as the mount: no owner to hold.
  out.add_range(content(ref.dataset, ref.meta), offset, size);
  return 0;
}

}  // namespace dsfs::fs
