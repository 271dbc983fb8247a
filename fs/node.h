#pragma once
// A kind of node in a mount's tree (the dataset trees, .meta, .views, the control files under
// .dsfs): what the FUSE handlers ask of any node, answered without FUSE types, so each kind is
// one class that is tested without a mount, and a new kind is one new class plus its inode
// numbers (fs/inodes.h). The handlers in filesystem.cpp decode an inode, pick its kind's Node
// and turn the answer into a reply.
#include <sys/stat.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "fs/inodes.h"
#include "prefetch/dataset_snapshot.h"
#include "prefetch/dataset_table.h"
#include "src/store/thread_annotations.h"

namespace dsfs::fs {

// Data and tree are immutable for a mount's snapshot, so the kernel may cache them for a day.
inline constexpr double kImmutableTimeout = 86400.0;
inline constexpr blksize_t kPreferredIoSize = 128 * 1024;
// What directories report as their size, as on most local filesystems (du counts them).
inline constexpr off_t kDirectorySize = 4096;
// Only this xattr namespace exists on a mount (user.dsfs.label|class|meta).
inline constexpr std::string_view kUserXattrPrefix = "user.";

// A node's attributes and how long the kernel may cache them.
struct Attributes {
  struct stat st {};
  double timeout = kImmutableTimeout;
};

// The datasets a mount serves and who owns its files; builds the attributes every kind shares.
//
// Datasets come and go while mounted (fs/dataset_watcher.h): each snapshot keeps its index in
// the DatasetTable for the mount's life, so an inode names one generation for good, and the
// *listing* says which snapshot each name shows now. A dataset re-ingested and refreshed gets a
// new index under the same name; files open under the old one keep reading the old generation.
//
// Thread safety: dataset() is lock-free; listing() and find() take a short lock and return
// immutable snapshots; list()/unlist() are called by one thread at a time (the watcher), and
// may run while any number of threads read.
class MountTree {
 public:
  // The datasets listed now, in the order they are listed, and their names.
  struct Listing {
    std::vector<const prefetch::DatasetSnapshot*> datasets;
    std::unordered_map<std::string_view, uint32_t> by_name;  // name -> index
  };

  // Numbers the datasets (their index is part of inodes and cache keys) and lists them all.
  // Throws std::invalid_argument for a name twice, a name that would hide .meta, .dsfs or
  // .views, a snapshot without a catalogue, or more than kMaxDatasets.
  explicit MountTree(std::vector<prefetch::DatasetSnapshot> datasets);

  const prefetch::DatasetTable& table() const { return table_; }
  // nullptr for an index this mount does not have; listed or not, a snapshot stays readable.
  const prefetch::DatasetSnapshot* dataset(uint32_t index) const { return table_.get(index); }
  std::shared_ptr<const Listing> listing() const;
  // The index listed under `name` now.
  std::optional<uint32_t> find(std::string_view name) const;
  int64_t mounted_unix() const { return mounted_unix_; }

  // Lists `snapshot` under its name, in place of the snapshot listed under it before (which
  // stays readable by its index), and returns the stored snapshot. Throws std::invalid_argument
  // for a name that would hide the mount's own directories or no catalogue, std::length_error
  // when the table is full.
  const prefetch::DatasetSnapshot& list(prefetch::DatasetSnapshot snapshot);
  // Stops listing `name`; returns the index it showed, or nullopt if it showed none.
  std::optional<uint32_t> unlist(std::string_view name);

  // A generated directory or file (.meta, .dsfs, ...) owned by the mount's owner.
  Attributes generated(uint64_t ino, mode_t mode, nlink_t nlink, uint64_t size,
                       int64_t mtime_unix) const;
  // Catalogue entry `index` of `d` shown as inode `ino`: its own attributes, or for a view file
  // the size of its .npy (`view_size`).
  Attributes entry(const prefetch::DatasetSnapshot& d, uint32_t index, uint64_t ino,
                   std::optional<uint64_t> view_size = std::nullopt) const;

 private:
  // Builds a listing of `datasets` (in that order).
  static std::shared_ptr<const Listing> make_listing(
      std::vector<const prefetch::DatasetSnapshot*> datasets);

  prefetch::DatasetTable table_;
  mutable Mutex listing_mutex_;
  std::shared_ptr<const Listing> listing_ DSFS_GUARDED_BY(listing_mutex_);
  const int64_t mounted_unix_;
  const uint32_t owner_uid_;
  const uint32_t owner_gid_;
};

// Receives a directory's children in order. Each child has a position (0 for the first); a
// listing asked to start at a position resumes there.
class DirectorySink {
 public:
  virtual ~DirectorySink() = default;
  // False when the reply is full: stop, the kernel asks again from `position`. An entry that is
  // not `cacheable` must be looked up again every time (its inode changes).
  virtual bool add(std::string_view name, uint64_t ino, uint64_t position,
                   bool cacheable = true) = 0;
};

// The bytes answering a READ: pieces of buffers kept alive by `owners` until the reply is sent.
struct ReadReply {
  std::vector<iovec> pieces;
  std::vector<std::shared_ptr<const void>> owners;

  // `data` must outlive the reply: owned by `owner`, or by the node itself (owner nullptr).
  void add(const char* data, size_t length, std::shared_ptr<const void> owner = nullptr);
  // The part of `text` from `offset`, at most `size` bytes.
  void add_range(std::string_view text, uint64_t offset, size_t size,
                 std::shared_ptr<const void> owner = nullptr);
  size_t size() const;
};

// A lookup's answer: the child's inode (0: no such child), and whether the kernel may keep the
// name (stats.json is looked up afresh every time: each lookup is a new snapshot).
struct Found {
  uint64_t ino = 0;
  bool cacheable = true;
};

// Who is writing, for the one writable file that keeps state per writer (the plan: several
// loaders share a mount, each writing a plan of its own).
struct WriteContext {
  uint64_t writer = 0;  // the writing process (the FUSE request's pid)
  bool append = false;  // the file was opened O_APPEND: the write goes at the writer's end
};

// One kind of node. Every method is called from many FUSE worker threads at once: each
// implementation synchronizes itself (most hold nothing mutable). Errors are errno values;
// anything thrown is answered EIO by the caller.
class Node {
 public:
  virtual ~Node() = default;

  // Attributes of `ref`; nullopt when it names nothing in this mount.
  virtual std::optional<Attributes> stat(const InodeRef& ref) = 0;
  // Cheaper than stat where it matters (listing a directory without READDIRPLUS).
  virtual bool is_directory(const InodeRef& ref) {
    const std::optional<Attributes> attributes = stat(ref);
    return attributes && S_ISDIR(attributes->st.st_mode);
  }
  // Child `name` of directory `dir`.
  virtual Found lookup(const InodeRef& /*dir*/, std::string_view /*name*/) { return {}; }
  // Lists directory `dir` from child `from`: 0, ENOENT (names nothing) or ENOTDIR.
  virtual int list(const InodeRef& /*dir*/, uint64_t /*from*/, DirectorySink& /*out*/) {
    return ENOTDIR;
  }
  // The inode ".." of directory `dir` names.
  virtual uint64_t parent(const InodeRef& /*dir*/) { return kRootInode; }
  // Whether `ref` can be opened for reading: 0, ENOENT or EISDIR.
  virtual int open(const InodeRef& /*ref*/) { return EISDIR; }
  // Up to `size` bytes from `offset`: 0, ENOENT, EISDIR or ESTALE.
  virtual int read(const InodeRef& /*ref*/, uint64_t /*offset*/, size_t /*size*/,
                   ReadReply& /*out*/) {
    return EISDIR;
  }
  // The value of user.* attribute `name`: 0, ENODATA or ENOENT.
  virtual int xattr(const InodeRef& /*ref*/, std::string_view /*name*/, std::string& /*value*/) {
    return ENODATA;
  }
  // Every user.* attribute of `ref` that can be read, each name NUL-terminated.
  virtual int xattr_names(const InodeRef& /*ref*/, std::string& /*names*/) { return 0; }
  // Writes and truncation, by the writer `context` names: EROFS but for the writable files.
  virtual int write(const InodeRef& /*ref*/, uint64_t /*offset*/, std::string_view /*data*/,
                    const WriteContext& /*context*/) {
    return EROFS;
  }
  virtual int truncate(const InodeRef& /*ref*/, uint64_t /*size*/,
                       const WriteContext& /*context*/) {
    return EROFS;
  }
  // The kernel dropped `lookups` references to `ino` (only counted inodes care).
  virtual void forget(uint64_t /*ino*/, uint64_t /*lookups*/) {}
};

}  // namespace dsfs::fs
