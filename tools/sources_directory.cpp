// A directory tree: walked once in sorted order (object ids follow it, so reading a directory
// in order reads consecutive objects), then read by several threads.
#include <dirent.h>
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "src/catalog/names.h"
#include "src/store/log_text.h"
#include "tools/sources.h"
#include "tools/sources_internal.h"

namespace dsfs::tools {
namespace {

constexpr size_t kReadBlockBytes = 1 << 20;

std::runtime_error errno_error(std::string_view what, const std::string& path, int error) {
  return std::runtime_error(
      fmt::format("{} '{}': {}", what, store::log_text(path), std::strerror(error)));
}

std::string_view file_type_name(mode_t mode) {
  if (S_ISFIFO(mode)) return "fifo";
  if (S_ISSOCK(mode)) return "socket";
  if (S_ISCHR(mode)) return "character device";
  if (S_ISBLK(mode)) return "block device";
  return "special file";
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

struct CloseDir {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

class DirectorySource final : public Source {
 public:
  DirectorySource(std::filesystem::path root, const SourceOptions& options)
      : Source(SourceKind::kDirectory, std::filesystem::absolute(root).lexically_normal().string()),
        root_(description()),
        options_(options) {
    // lexically_normal keeps a trailing '/' for "dir/"; the walk joins with '/' itself.
    while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
    std::error_code error;
    real_root_ = std::filesystem::weakly_canonical(root_, error).string();
    if (error) real_root_ = root_;
  }

  SourceContents read(SourceSink& sink) override {
    SourceContents contents;
    struct stat root_stat {};
    if (::stat(root_.c_str(), &root_stat) != 0) {
      throw errno_error("cannot read directory", root_, errno);
    }
    contents.directories.push_back(
        DirectoryRecord{"", detail::mtime_ns_of(root_stat, root_), root_stat.st_mode & 07777u});
    std::vector<DirectoryId> ancestors{DirectoryId{root_stat.st_dev, root_stat.st_ino}};
    walk("", ancestors, contents, sink);

    uint64_t total_bytes = 0;
    for (const auto& file : contents.files) total_bytes += file.size;
    sink.expect_totals(contents.files.size(), total_bytes);

    detail::run_workers(
        options_.parallelism, contents.files.size(), sink,
        [] { return std::string(kReadBlockBytes, '\0'); },
        [&](size_t index, std::string& block, const std::atomic<bool>&) {
          read_file(contents.files[index], block, sink);
        });
    return contents;
  }

 private:
  std::string absolute(const std::string& relative) const {
    return relative.empty() ? root_ : root_ + '/' + relative;
  }

  struct DirectoryId {
    dev_t device;
    ino_t inode;
    bool operator==(const DirectoryId&) const = default;
  };
  using FileId = DirectoryId;

  // `ancestors`: the directories from the root down to relative_dir, to detect symlink loops.
  void walk(const std::string& relative_dir, std::vector<DirectoryId>& ancestors,
            SourceContents& contents, SourceSink& sink) {
    sink.check_stop();
    const std::string dir_path = absolute(relative_dir);
    struct Child {
      std::string name;
      struct stat st;
    };
    std::vector<Child> children;
    {
      std::unique_ptr<DIR, CloseDir> dir(::opendir(dir_path.c_str()));
      if (!dir) throw errno_error("cannot read directory", dir_path, errno);
      for (;;) {
        errno = 0;
        const dirent* entry = ::readdir(dir.get());
        if (!entry) {
          if (errno != 0) throw errno_error("cannot read directory", dir_path, errno);
          break;
        }
        const std::string_view name = entry->d_name;
        if (name == "." || name == "..") continue;
        Child child{std::string(name), {}};
        if (::fstatat(::dirfd(dir.get()), entry->d_name, &child.st, AT_SYMLINK_NOFOLLOW) != 0) {
          throw errno_error("cannot stat", dir_path + '/' + child.name, errno);
        }
        children.push_back(std::move(child));
      }
    }
    // Bytewise order, as std::string compares; it is also the catalogue's child order.
    std::sort(children.begin(), children.end(),
              [](const Child& a, const Child& b) { return a.name < b.name; });

    for (auto& child : children) {
      const std::string relative =
          relative_dir.empty() ? child.name : relative_dir + '/' + child.name;
      const std::string path = absolute(relative);
      if (!catalog::is_valid_path_component(child.name)) {
        throw std::runtime_error(
            fmt::format("cannot ingest '{}': its name is not a valid path component (1-255 bytes)",
                        store::log_text(path)));
      }
      struct stat st = child.st;
      if (S_ISLNK(st.st_mode)) {
        if (options_.symlinks == SymlinkPolicy::kNone) {
          spdlog::warn("skipping '{}': symlink (--symlinks none)", store::log_text(path));
          ++contents.skipped;
          continue;
        }
        if (::stat(path.c_str(), &st) != 0) {
          spdlog::warn("skipping '{}': dangling symlink ({})", store::log_text(path),
                       std::strerror(errno));
          ++contents.skipped;
          continue;
        }
        check_link_target(path);
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) {
          spdlog::warn("skipping '{}': symlink to a {}", store::log_text(path),
                       file_type_name(st.st_mode));
          ++contents.skipped;
          continue;
        }
      }
      if (S_ISDIR(st.st_mode)) {
        const DirectoryId id{st.st_dev, st.st_ino};
        if (std::find(ancestors.begin(), ancestors.end(), id) != ancestors.end()) {
          spdlog::warn("skipping '{}': it leads back to a directory that contains it (a loop)",
                       store::log_text(path));
          ++contents.skipped;
          continue;
        }
        contents.directories.push_back(
            DirectoryRecord{relative, detail::mtime_ns_of(st, path), st.st_mode & 07777u});
        ancestors.push_back(id);
        walk(relative, ancestors, contents, sink);
        ancestors.pop_back();
      } else if (S_ISREG(st.st_mode)) {
        FileRecord file;
        file.path = relative;
        file.object_id = contents.files.size();
        file.size = static_cast<uint64_t>(st.st_size);
        file.mtime_ns = detail::mtime_ns_of(st, path);
        file.mode = st.st_mode & 07777u;
        contents.files.push_back(std::move(file));
        walked_files_.push_back(FileId{st.st_dev, st.st_ino});
      } else {
        spdlog::warn("skipping '{}': {}", store::log_text(path), file_type_name(st.st_mode));
        ++contents.skipped;
      }
    }
  }

  // A link that leads outside the source tree is followed with a warning naming it, or refused
  // (--symlinks inside): the ingest would otherwise publish any file the user can read.
  void check_link_target(const std::string& link) const {
    std::error_code error;
    const std::string target = std::filesystem::canonical(link, error).string();
    if (error) throw errno_error("cannot resolve symlink", link, error.value());
    const bool inside = target == real_root_ ||
                        (target.starts_with(real_root_) && target[real_root_.size()] == '/') ||
                        real_root_ == "/";
    if (inside) return;
    if (options_.symlinks == SymlinkPolicy::kInside) {
      throw std::runtime_error(fmt::format(
          "'{}' is a symlink to '{}', outside the source tree; --symlinks inside forbids that "
          "(remove the link, or pass --symlinks all to follow it)",
          store::log_text(link), store::log_text(target)));
    }
    spdlog::warn(
        "'{}' is a symlink to '{}', outside the source tree; following it "
        "(--symlinks inside refuses such links, --symlinks none skips all links)",
        store::log_text(link), store::log_text(target));
  }

  void read_file(FileRecord& file, std::string& block, SourceSink& sink) const {
    const std::string path = absolute(file.path);
    // O_NONBLOCK: if the file was swapped for a fifo since the walk, open must not hang.
    FileDescriptor fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
    if (fd.get() < 0) throw errno_error("cannot read", path, errno);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw errno_error("cannot stat", path, errno);
    if (!S_ISREG(st.st_mode)) {
      throw std::runtime_error(
          fmt::format("'{}' stopped being a regular file while ingesting", store::log_text(path)));
    }
    // The file the walk checked, and no other: a path whose file or directory was swapped for a
    // link since (to a file outside the tree, which --symlinks inside and none promise never to
    // read) now opens another inode.
    if (walked_files_.at(file.object_id) != FileId{st.st_dev, st.st_ino}) {
      throw std::runtime_error(fmt::format(
          "'{}' was replaced while being ingested (another file is there than at the walk); "
          "ingest again once the tree is stable",
          store::log_text(path)));
    }
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_SEQUENTIAL);
    ObjectStream stream(sink, file.object_id, options_.chunk_size, options_.checksum, file.size);
    for (;;) {
      const ssize_t got = ::read(fd.get(), block.data(), block.size());
      if (got < 0) {
        if (errno == EINTR) continue;
        throw errno_error("cannot read", path, errno);
      }
      if (got == 0) break;
      stream.append(std::string_view(block.data(), static_cast<size_t>(got)));
    }
    const FileDigest digest = stream.finish();
    if (digest.size != file.size) {
      throw std::runtime_error(fmt::format(
          "'{}' changed while being ingested (size {} at the walk, {} bytes read); ingest again "
          "once it is stable",
          store::log_text(path), file.size, digest.size));
    }
    file.checksum = digest.checksum;
  }

  std::string root_;
  std::string real_root_;  // root_ with every symlink resolved, to tell where links lead
  SourceOptions options_;
  std::vector<FileId> walked_files_;  // [object id]: what the walk found at each file's path
};

}  // namespace

std::unique_ptr<Source> make_directory_source(const std::filesystem::path& root,
                                              const SourceOptions& options) {
  return std::make_unique<DirectorySource>(root, options);
}

}  // namespace dsfs::tools
