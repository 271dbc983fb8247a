#include "fs/node.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <set>
#include <stdexcept>

namespace dsfs::fs {
namespace {

timespec to_timespec(int64_t unix_ns) {
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(unix_ns / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(unix_ns % 1'000'000'000);
  if (ts.tv_nsec < 0) {
    ts.tv_nsec += 1'000'000'000;
    ts.tv_sec -= 1;
  }
  return ts;
}

void set_times(struct stat& st, int64_t unix_ns) {
  st.st_mtim = st.st_atim = st.st_ctim = to_timespec(unix_ns);
}

// Read-only views of the ingested permission bits: write and set-id bits cleared, and the
// owner can always read (and enter directories).
mode_t file_permissions(uint32_t ingested) {
  const mode_t bits = ingested & 0555;
  return bits == 0 ? 0444 : (bits | 0400);
}
mode_t directory_permissions(uint32_t ingested) {
  const mode_t bits = ingested & 0555;
  return bits == 0 ? 0555 : (bits | 0500);
}

}  // namespace

namespace {

// Throws std::invalid_argument for a name that would hide the mount's own directories.
void check_listable(const prefetch::DatasetSnapshot& d) {
  if (d.name() == kMetaDirName || d.name() == kControlDirName || d.name() == kViewsDirName) {
    throw std::invalid_argument(fmt::format(
        "a dataset named '{}' would hide the mount's own {} directory", d.name(), d.name()));
  }
}

std::vector<prefetch::DatasetSnapshot> checked(std::vector<prefetch::DatasetSnapshot> datasets) {
  if (datasets.size() > kMaxDatasets) {
    throw std::invalid_argument(fmt::format("a mount can hold at most {} datasets", kMaxDatasets));
  }
  std::set<std::string_view> names;
  for (const prefetch::DatasetSnapshot& d : datasets) {
    if (!d.catalog) throw std::invalid_argument("dataset snapshot without a catalogue");
    check_listable(d);
    if (!names.insert(d.name()).second) {
      throw std::invalid_argument(fmt::format("dataset '{}' named twice", d.name()));
    }
  }
  return datasets;
}

}  // namespace

MountTree::MountTree(std::vector<prefetch::DatasetSnapshot> datasets)
    : table_(checked(std::move(datasets))),
      mounted_unix_(static_cast<int64_t>(std::time(nullptr))),
      owner_uid_(getuid()),
      owner_gid_(getgid()) {
  std::vector<const prefetch::DatasetSnapshot*> listed;
  for (uint32_t i = 0; i < table_.size(); ++i) listed.push_back(table_.get(i));
  listing_ = make_listing(std::move(listed));
}

std::shared_ptr<const MountTree::Listing> MountTree::make_listing(
    std::vector<const prefetch::DatasetSnapshot*> datasets) {
  auto listing = std::make_shared<Listing>();
  listing->datasets = std::move(datasets);
  for (const prefetch::DatasetSnapshot* d : listing->datasets) {
    listing->by_name.emplace(d->name(), d->index);
  }
  return listing;
}

std::shared_ptr<const MountTree::Listing> MountTree::listing() const {
  MutexLock lock(listing_mutex_);
  return listing_;
}

std::optional<uint32_t> MountTree::find(std::string_view name) const {
  const std::shared_ptr<const Listing> now = listing();
  const auto it = now->by_name.find(name);
  if (it == now->by_name.end()) return std::nullopt;
  return it->second;
}

const prefetch::DatasetSnapshot& MountTree::list(prefetch::DatasetSnapshot snapshot) {
  check_listable(snapshot);
  const prefetch::DatasetSnapshot& stored = table_.append(std::move(snapshot));
  std::vector<const prefetch::DatasetSnapshot*> listed = listing()->datasets;
  const auto same_name = std::find_if(listed.begin(), listed.end(),
                                      [&](const auto* d) { return d->name() == stored.name(); });
  if (same_name != listed.end()) {
    *same_name = &stored;  // keeps its place in listings
  } else {
    listed.push_back(&stored);
  }
  std::shared_ptr<const Listing> next = make_listing(std::move(listed));
  MutexLock lock(listing_mutex_);
  listing_ = std::move(next);
  return stored;
}

std::optional<uint32_t> MountTree::unlist(std::string_view name) {
  std::vector<const prefetch::DatasetSnapshot*> listed = listing()->datasets;
  const auto it =
      std::find_if(listed.begin(), listed.end(), [&](const auto* d) { return d->name() == name; });
  if (it == listed.end()) return std::nullopt;
  const uint32_t index = (*it)->index;
  listed.erase(it);
  std::shared_ptr<const Listing> next = make_listing(std::move(listed));
  MutexLock lock(listing_mutex_);
  listing_ = std::move(next);
  return index;
}

Attributes MountTree::generated(uint64_t ino, mode_t mode, nlink_t nlink, uint64_t size,
                                int64_t mtime_unix) const {
  Attributes a;
  struct stat& st = a.st;
  st.st_ino = ino;
  st.st_mode = mode;
  st.st_nlink = nlink;
  st.st_uid = owner_uid_;
  st.st_gid = owner_gid_;
  st.st_size = static_cast<off_t>(size);
  st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  st.st_blksize = kPreferredIoSize;
  set_times(st, mtime_unix * 1'000'000'000);
  return a;
}

Attributes MountTree::entry(const prefetch::DatasetSnapshot& d, uint32_t index, uint64_t ino,
                            std::optional<uint64_t> view_size) const {
  const catalog::Catalog& catalog = *d.catalog;
  const catalog::CatalogEntry& e = catalog.entry(index);
  Attributes a;
  struct stat& st = a.st;
  st.st_ino = ino;
  st.st_uid = owner_uid_;
  st.st_gid = owner_gid_;
  st.st_blksize = kPreferredIoSize;
  set_times(st, e.mtime_ns);
  if (e.is_dir) {
    st.st_mode = S_IFDIR | directory_permissions(e.mode);
    nlink_t subdirectories = 0;
    for (uint32_t c = e.first_child; c < e.first_child + e.child_count; ++c) {
      subdirectories += catalog.entry(c).is_dir;
    }
    st.st_nlink = 2 + subdirectories;
    st.st_size = kDirectorySize;
    st.st_blocks = kDirectorySize / 512;
  } else {
    const uint64_t size = view_size.value_or(e.size);
    st.st_mode = S_IFREG | file_permissions(e.mode);
    st.st_nlink = 1;
    st.st_size = static_cast<off_t>(size);
    st.st_blocks = static_cast<blkcnt_t>((size + 511) / 512);
  }
  return a;
}

void ReadReply::add(const char* data, size_t length, std::shared_ptr<const void> owner) {
  if (length == 0) return;
  // The kernel only reads these bytes; iovec (and fuse_reply_iov) take non-const pointers.
  pieces.push_back(iovec{const_cast<char*>(data), length});
  if (owner) owners.push_back(std::move(owner));
}

void ReadReply::add_range(std::string_view text, uint64_t offset, size_t size,
                          std::shared_ptr<const void> owner) {
  if (offset >= text.size()) return;
  add(text.data() + offset, std::min<size_t>(size, text.size() - offset), std::move(owner));
}

size_t ReadReply::size() const {
  size_t total = 0;
  for (const iovec& piece : pieces) total += piece.iov_len;
  return total;
}

}  // namespace dsfs::fs
