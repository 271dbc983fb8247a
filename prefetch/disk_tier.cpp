#include "prefetch/disk_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/core.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>
// The hash states' layouts, so that digest_of_header keeps them on the stack.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "src/store/get_reply.h"
#include "src/store/log_text.h"
#include "src/store/thread_name.h"
#include "src/store/value_buffer.h"

namespace dsfs::prefetch {
namespace {

constexpr std::array<char, 8> kMagic = {'D', 'S', 'F', 'S', 'T', 'I', 'E', 'R'};
// Version 3 says which ingest wrote the object (DiskTierKey::ingest): its low 32 bits in the
// header, all 64 as the seed of the payload's XXH3. Version 2 checksums with unseeded XXH3,
// version 1 with XXH64; their files are served only where the ingest is not checked (0), since
// they cannot tell one dataset of a name and generation from another. XXH3 hashes the 110 KB of
// a typical image in about half the time of XXH64, and a tier read hashes every byte it reads.
constexpr uint32_t kVersion = 3;
constexpr uint32_t kVersionUnseeded = 2;
constexpr uint32_t kVersionXxh64 = 1;
constexpr size_t kHeaderBytes = 64;
constexpr uint64_t kBlock = 4096;
constexpr std::string_view kTempSuffix = ".tmp";
// DIR/objects/XX/<dataset>-<generation>-<object>-<chunk>-<file size>, all hex: 16-16-16-8-12.
// The size is in the name so that an open after a killed daemon lists the files without a stat
// each (on a cold disk a stat waits for an inode block: 9.3 s against 1.7 s for ImageNet's
// 1.28 M objects, docs/benchmarks.md).
constexpr size_t kNameLength = 16 + 1 + 16 + 1 + 16 + 1 + 8 + 1 + 12;
// The name before the size was in it (dsfs before 2026-11-27): such files are renamed when a
// listing finds them (one stat each, once).
constexpr size_t kSizelessNameLength = 16 + 1 + 16 + 1 + 16 + 1 + 8;

// DIR/index: the index as a clean close left it, so that the next open need not list and stat
// every file (about 1.3 M of them for ImageNet). Host byte order; a digest over everything
// before it ends the file.
constexpr std::array<char, 8> kIndexMagic = {'D', 'S', 'F', 'S', 'I', 'D', 'X', '\n'};
constexpr uint32_t kIndexVersion = 2;  // 1: `bytes` was the size rounded up to 4 KiB
// One object file, in eviction order (first evicted first).
struct IndexEntry {
  uint64_t dataset = 0;
  uint64_t generation = 0;
  uint64_t object_id = 0;
  uint32_t chunk = 0;
  uint32_t reserved = 0;
  uint64_t file_size = 0;
};
struct IndexHeader {
  std::array<char, 8> magic = kIndexMagic;
  uint32_t version = kIndexVersion;
  uint32_t entry_bytes = sizeof(IndexEntry);
  uint64_t entries = 0;
};
static_assert(sizeof(IndexEntry) == 40 && sizeof(IndexHeader) == 24);

std::filesystem::path index_path_of(const std::filesystem::path& dir) {
  return dir / "index";
}

// The fixed part of a file's header, in host byte order (a file from a host of the other order
// fails the version and header checks, and is dropped).
struct Header {
  std::array<char, 8> magic = kMagic;
  uint32_t version = kVersion;
  uint32_t name_length = 0;
  uint64_t payload_length = 0;
  uint64_t payload_digest = 0;
  uint64_t generation = 0;
  uint64_t object_id = 0;
  uint32_t chunk = 0;
  uint32_t ingest_tag = 0;     // the low 32 bits of DiskTierKey::ingest (version 3; else 0)
  uint64_t header_digest = 0;  // over the bytes above and the dataset name
};
static_assert(sizeof(Header) == kHeaderBytes);

bool known_version(uint32_t version) {
  return version == kVersion || version == kVersionUnseeded || version == kVersionXxh64;
}

// The checksum of `size` bytes as a file of `version` (known_version) carries it, for `ingest`.
uint64_t digest_of(uint32_t version, const void* data, size_t size, uint64_t ingest) {
  switch (version) {
    case kVersionXxh64:
      return XXH64(data, size, 0);
    case kVersionUnseeded:
      return XXH3_64bits(data, size);
    default:
      return XXH3_64bits_withSeed(data, size, ingest);
  }
}

uint64_t digest_of_header(const Header& header, std::string_view name) {
  // The bytes before header_digest, then the name: hashed in two steps (the same digest as of the
  // two joined), so that a read allocates nothing for it.
  const size_t head = offsetof(Header, header_digest);
  if (header.version == kVersionXxh64) {
    XXH64_state_t state;
    XXH64_reset(&state, 0);
    XXH64_update(&state, &header, head);
    XXH64_update(&state, name.data(), name.size());
    return XXH64_digest(&state);
  }
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &header, head);
  XXH3_64bits_update(&state, name.data(), name.size());
  return XXH3_64bits_digest(&state);
}

uint64_t round_up(uint64_t value, uint64_t granule) {
  return (value + granule - 1) / granule * granule;
}

uint64_t on_disk_bytes(uint64_t file_size) {
  return round_up(file_size, kBlock);
}

// An open file descriptor, closed on destruction.
class UniqueFd {
 public:
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Closes now, so that a failed close (deferred write errors) is seen; returns its errno or 0.
  int close() {
    const int fd = std::exchange(fd_, -1);
    return fd >= 0 && ::close(fd) != 0 ? errno : 0;
  }

 private:
  int fd_;
};

struct DirCloser {
  void operator()(DIR* dir) const { ::closedir(dir); }
};

// 0, or the errno of the first failure; a short read is ENODATA.
int pread_all(int fd, char* data, size_t length, uint64_t offset) {
  while (length > 0) {
    const ssize_t got = ::pread(fd, data, length, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno;
    if (got == 0) return ENODATA;
    data += got;
    length -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return 0;
}

int write_all(int fd, const char* data, size_t length) {
  while (length > 0) {
    const ssize_t put = ::write(fd, data, length);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return errno;
    data += put;
    length -= static_cast<size_t>(put);
  }
  return 0;
}

// Objects this large keep the block they were read into (DiskTier::get).
constexpr uint64_t kKeepBlockBytes = 16 * store::kDirectIoBlock;

// Reads from offset 0 until `length` bytes or the end of the file: the bytes read, or -errno.
// A direct read is one pread: the file is read whole, and a short read is its end (a second
// pread at an offset off the block would be refused).
ssize_t read_file(int fd, char* data, size_t length, bool direct) {
  size_t done = 0;
  while (done < length) {
    const ssize_t got = ::pread(fd, data + done, length - done, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -errno;
    if (got == 0) break;
    done += static_cast<size_t>(got);
    if (direct) break;
  }
  return static_cast<ssize_t>(done);
}

// cachestat(2), Linux 6.5; glibc 2.36 has no wrapper. The number is the same on every
// architecture (the unified syscall table).
#ifndef SYS_cachestat
#define SYS_cachestat 451
#endif
struct CachestatRange {
  uint64_t offset = 0;
  uint64_t length = 0;  // 0: to the end of the file
};
struct Cachestat {
  uint64_t cached = 0;  // pages
  uint64_t dirty = 0;
  uint64_t writeback = 0;
  uint64_t evicted = 0;
  uint64_t recently_evicted = 0;
};

enum class PageCacheAnswer { kYes, kNo, kNoCachestat };

// Whether the page cache holds every page of the open file (`file_size` bytes); asks without
// reading, so nothing is brought in.
PageCacheAnswer page_cache_holds_whole(int fd, uint64_t file_size) {
  CachestatRange range;
  Cachestat stat;
  if (::syscall(SYS_cachestat, fd, &range, &stat, 0) != 0) {
    // ENOSYS: an older kernel; EPERM: a seccomp filter (containers) that does not know it.
    return errno == ENOSYS || errno == EPERM ? PageCacheAnswer::kNoCachestat : PageCacheAnswer::kNo;
  }
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return stat.cached >= round_up(file_size, page) / page ? PageCacheAnswer::kYes
                                                         : PageCacheAnswer::kNo;
}

bool parse_hex(std::string_view text, uint64_t& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value, 16);
  return error == std::errc() && end == text.data() + text.size();
}

// The fields of an object file's name, <dataset>-<generation>-<object>-<chunk>-<size> in hex.
struct ObjectName {
  uint64_t dataset = 0;
  uint64_t generation = 0;
  uint64_t object_id = 0;
  uint32_t chunk = 0;
  std::optional<uint64_t> file_size;  // nullopt: a name of the older, sizeless kind
};

std::optional<ObjectName> parse_object_name(std::string_view name) {
  ObjectName parsed;
  uint64_t chunk = 0;
  if ((name.size() != kNameLength && name.size() != kSizelessNameLength) || name[16] != '-' ||
      name[33] != '-' || name[50] != '-' || !parse_hex(name.substr(0, 16), parsed.dataset) ||
      !parse_hex(name.substr(17, 16), parsed.generation) ||
      !parse_hex(name.substr(34, 16), parsed.object_id) || !parse_hex(name.substr(51, 8), chunk) ||
      chunk > UINT32_MAX) {
    return std::nullopt;
  }
  parsed.chunk = static_cast<uint32_t>(chunk);
  if (name.size() == kNameLength) {
    uint64_t file_size = 0;
    if (name[59] != '-' || !parse_hex(name.substr(60, 12), file_size) || file_size < kHeaderBytes) {
      return std::nullopt;
    }
    parsed.file_size = file_size;
  }
  return parsed;
}

// The dataset name an object file's header carries, if the header checks out.
std::optional<std::string> dataset_named_in(int dir_fd, const char* file) {
  UniqueFd fd(::openat(dir_fd, file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) return std::nullopt;
  Header header;
  if (pread_all(fd.get(), reinterpret_cast<char*>(&header), kHeaderBytes, 0) != 0 ||
      header.magic != kMagic || !known_version(header.version) || header.name_length > 4096) {
    return std::nullopt;
  }
  std::string name(header.name_length, '\0');
  if (pread_all(fd.get(), name.data(), name.size(), kHeaderBytes) != 0 ||
      header.header_digest != digest_of_header(header, name)) {
    return std::nullopt;
  }
  return name;
}

std::filesystem::path objects_dir_of(const std::filesystem::path& dir) {
  const std::filesystem::path objects = dir / "objects";
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) {
    throw std::runtime_error(fmt::format("{} does not exist", dir.string()));
  }
  if (!std::filesystem::is_directory(objects, error)) {
    throw std::runtime_error(fmt::format(
        "{} is not a dsfs disk cache (it has no objects/ directory): give the DIR a mount was "
        "given with --disk-cache",
        dir.string()));
  }
  return objects;
}

// Calls visit(sub, dir_fd, name, d_type) for every entry of `objects`'s subdirectory number `sub`
// (one that does not exist is skipped).
template <typename Visit>
void for_each_entry_in(const std::filesystem::path& objects, unsigned sub, Visit& visit) {
  const std::filesystem::path subdir = objects / fmt::format("{:02x}", sub);
  const std::unique_ptr<DIR, DirCloser> listing(::opendir(subdir.c_str()));
  if (!listing) {
    if (errno == ENOENT || errno == ENOTDIR) return;
    throw std::runtime_error(
        fmt::format("cannot list the disk cache {}: {}", subdir.string(), std::strerror(errno)));
  }
  const int dir_fd = ::dirfd(listing.get());
  while (const dirent* file = ::readdir(listing.get())) {
    const std::string_view name = file->d_name;
    if (name != "." && name != "..") visit(sub, dir_fd, file->d_name, file->d_type);
  }
}

// The same for each of the 256 subdirectories, in order.
template <typename Visit>
void for_each_entry(const std::filesystem::path& objects, Visit visit) {
  for (unsigned sub = 0; sub < 256; ++sub) for_each_entry_in(objects, sub, visit);
}

// Whether a listed entry is a regular file: from the listing's d_type where the filesystem gives
// one (ext4, xfs, tmpfs do), else from a stat, which then fills `st`.
bool is_regular_file(int dir_fd, const char* file, unsigned char type, struct stat& st) {
  if (type != DT_UNKNOWN) return type == DT_REG;
  return ::fstatat(dir_fd, file, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode);
}

// The pid in DIR/lock while a mount holds the lock; empty when none does.
std::string lock_holder(const std::filesystem::path& dir) {
  UniqueFd fd(::open((dir / "lock").c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return "";
  if (::flock(fd.get(), LOCK_SH | LOCK_NB) == 0) return "";  // closing the fd releases it
  if (errno != EWOULDBLOCK) return "";
  std::array<char, 32> holder{};
  const ssize_t got = ::pread(fd.get(), holder.data(), holder.size() - 1, 0);
  return got > 0 ? std::string(holder.data()) : std::string("unknown");
}

// Throws unless `dir` is new, empty, or looks like a disk cache: the tier writes DIR/lock and
// replaces DIR/index, so a directory of the user's own given by mistake would lose files of
// those names (found by an audit). A missing parent is refused too: a mistyped path would make
// a new tier somewhere unexpected.
void refuse_foreign_directory(const std::filesystem::path& dir) {
  std::error_code error;
  const auto status = std::filesystem::status(dir, error);
  if (status.type() == std::filesystem::file_type::not_found) {
    const std::filesystem::path parent = dir.parent_path().empty() ? "." : dir.parent_path();
    if (!std::filesystem::is_directory(parent, error)) {
      throw std::runtime_error(fmt::format(
          "--disk-cache {}: its parent directory {} does not exist (a mistyped path?); create "
          "it first",
          dir.string(), parent.string()));
    }
    return;
  }
  if (status.type() != std::filesystem::file_type::directory) {
    throw std::runtime_error(fmt::format("--disk-cache {}: not a directory", dir.string()));
  }
  const auto foreign = [&](const std::string& why) {
    return std::runtime_error(fmt::format(
        "--disk-cache {}: {}, so it is not a dsfs disk cache (the tier writes DIR/lock and "
        "DIR/index and would replace a file of yours); give dsfs an empty or new directory of "
        "its own",
        dir.string(), why));
  };
  const bool has_objects = std::filesystem::is_directory(dir / "objects", error);
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (name == "objects" && has_objects) continue;
    if (name == "lock" || name == "index") {
      // A lock holds a pid; an index begins with its magic (an empty one: cut short by a crash).
      std::ifstream file(entry.path(), std::ios::binary);
      std::string head(kIndexMagic.size(), '\0');
      file.read(head.data(), static_cast<std::streamsize>(head.size()));
      head.resize(static_cast<size_t>(file.gcount()));
      const bool ours = name == "lock" ? head.find_first_not_of("0123456789\n") == std::string::npos
                                       : head.empty() || std::string_view(head) ==
                                                             std::string_view(kIndexMagic.data(),
                                                                              kIndexMagic.size());
      if (!ours) throw foreign(fmt::format("its file '{}' was not written by dsfs", name));
      continue;
    }
    if (!has_objects && !name.ends_with(kTempSuffix)) {
      throw foreign(
          fmt::format("it holds '{}' and no objects/ directory", store::log_text(name, 80)));
    }
  }
}

}  // namespace

DiskTierContents inspect_disk_tier(const std::filesystem::path& dir) {
  const std::filesystem::path objects = objects_dir_of(dir);
  DiskTierContents contents;
  contents.held_by = lock_holder(dir);
  struct Group {
    uint64_t objects = 0;
    uint64_t bytes = 0;
  };
  std::map<std::pair<uint64_t, uint64_t>, Group> groups;  // (dataset hash, generation)
  std::map<uint64_t, std::string> names;                  // dataset hash -> name
  for_each_entry(objects, [&](unsigned /*sub*/, int dir_fd, const char* file, unsigned char type) {
    const std::string_view name = file;
    if (name.ends_with(kTempSuffix)) {
      ++contents.temp_files;
      return;
    }
    const std::optional<ObjectName> parsed = parse_object_name(name);
    struct stat st {};
    if (!parsed || !is_regular_file(dir_fd, file, type, st)) return;  // not ours
    Group& group = groups[{parsed->dataset, parsed->generation}];
    ++group.objects;
    // A sizeless name (an older dsfs's, renamed at the next mount) is counted by its stat.
    group.bytes +=
        on_disk_bytes(parsed->file_size ? *parsed->file_size : static_cast<uint64_t>(st.st_size));
    if (!names.contains(parsed->dataset)) {
      if (std::optional<std::string> dataset = dataset_named_in(dir_fd, file)) {
        names.emplace(parsed->dataset, std::move(*dataset));
      }
    }
  });
  for (const auto& [key, group] : groups) {
    const auto name = names.find(key.first);
    contents.generations.push_back(DiskTierContents::Generation{
        .dataset = name == names.end() ? std::string("?") : name->second,
        .generation = key.second,
        .objects = group.objects,
        .bytes = group.bytes});
    contents.objects += group.objects;
    contents.bytes += group.bytes;
  }
  std::sort(contents.generations.begin(), contents.generations.end(),
            [](const auto& a, const auto& b) {
              return std::tie(a.dataset, a.generation) < std::tie(b.dataset, b.generation);
            });
  return contents;
}

uint64_t clear_disk_tier(const std::filesystem::path& dir) {
  const std::filesystem::path objects = objects_dir_of(dir);
  const std::filesystem::path lock_path = dir / "lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (lock.get() < 0) {
    throw std::runtime_error(fmt::format("cannot open the disk cache lock {}: {}",
                                         lock_path.string(), std::strerror(errno)));
  }
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    const int lock_error = errno;
    if (lock_error == EWOULDBLOCK) {
      std::array<char, 32> holder{};
      const ssize_t got = ::pread(lock.get(), holder.data(), holder.size() - 1, 0);
      throw DiskTierLocked(fmt::format(
          "the disk cache {} is in use by a dsfs mount (pid {}); unmount it first (dsfs umount "
          "MOUNTPOINT), then clear it",
          dir.string(), got > 0 ? std::string(holder.data()) : "unknown"));
    }
    throw std::runtime_error(fmt::format("cannot lock the disk cache {}: {}", lock_path.string(),
                                         std::strerror(lock_error)));
  }
  // The saved index first: it would name files that are gone.
  if (::unlink(index_path_of(dir).c_str()) != 0 && errno != ENOENT) {
    throw std::runtime_error(fmt::format("cannot remove the disk cache index {}: {}",
                                         index_path_of(dir).string(), std::strerror(errno)));
  }
  uint64_t removed = 0;
  for_each_entry(objects, [&](unsigned /*sub*/, int dir_fd, const char* file, unsigned char) {
    std::string_view name = file;
    const bool temp = name.ends_with(kTempSuffix);
    if (temp) name.remove_suffix(kTempSuffix.size());
    if (!parse_object_name(name)) return;  // not ours: left alone
    if (::unlinkat(dir_fd, file, 0) != 0 && errno != ENOENT) {
      throw std::runtime_error(fmt::format("cannot remove {} from the disk cache {}: {}", file,
                                           dir.string(), std::strerror(errno)));
    }
    if (!temp) ++removed;
  });
  return removed;
}

size_t DiskTier::FileIdHash::operator()(const FileId& id) const {
  const std::array<uint64_t, 4> fields = {id.dataset, id.generation, id.object_id, id.chunk};
  return XXH3_64bits(fields.data(), sizeof fields);
}

DiskTier::FileId DiskTier::id_of(const DiskTierKey& key, uint64_t length) {
  return FileId{.dataset = XXH64(key.dataset.data(), key.dataset.size(), 0),
                .generation = key.generation,
                .object_id = key.object_id,
                .chunk = key.chunk,
                .file_size = kHeaderBytes + key.dataset.size() + length};
}

std::filesystem::path DiskTier::path_of(const FileId& id) const {
  return objects_dir_ / fmt::format("{:02x}", FileIdHash{}(id)&0xff) /
         fmt::format("{:016x}-{:016x}-{:016x}-{:08x}-{:012x}", id.dataset, id.generation,
                     id.object_id, id.chunk, id.file_size);
}

std::filesystem::path DiskTier::path_of(const DiskTierKey& key, uint64_t length) const {
  return path_of(id_of(key, length));
}

DiskTier::DiskTier(DiskTierOptions options)
    : options_(std::move(options)), objects_dir_(options_.dir / "objects") {
  refuse_foreign_directory(options_.dir);
  std::error_code error;
  std::filesystem::create_directories(objects_dir_, error);
  if (error) {
    throw std::runtime_error(fmt::format("cannot create the disk cache directory {}: {}",
                                         objects_dir_.string(), error.message()));
  }
  const std::filesystem::path lock_path = options_.dir / "lock";
  lock_fd_ = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (lock_fd_ < 0) {
    throw std::runtime_error(fmt::format("cannot open the disk cache lock {}: {}",
                                         lock_path.string(), std::strerror(errno)));
  }
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int lock_error = errno;
    std::array<char, 32> holder{};
    const ssize_t got = ::pread(lock_fd_, holder.data(), holder.size() - 1, 0);
    ::close(lock_fd_);
    if (lock_error == EWOULDBLOCK) {
      throw DiskTierLocked(fmt::format(
          "the disk cache {} is in use by another dsfs mount (pid {}); give each mount its own "
          "--disk-cache directory",
          options_.dir.string(), got > 0 ? std::string(holder.data()) : "unknown"));
    }
    throw std::runtime_error(fmt::format("cannot lock the disk cache {}: {}", lock_path.string(),
                                         std::strerror(lock_error)));
  }
  // Who holds it, for the second mount's message. The pid changes if the mount forks; the lock
  // (on the open file, shared with the child) does not.
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
    spdlog::debug("cannot record the pid in {}", lock_path.string());
  }
  stats_.capacity_bytes = options_.capacity_bytes;
  // Whether the filesystem takes O_DIRECT, asked once on a file it holds (flock is unaffected).
  direct_io_.store(options_.direct_io);
  if (options_.direct_io) {
    if (::fcntl(lock_fd_, F_SETFL, O_DIRECT) == 0) {
      (void)::fcntl(lock_fd_, F_SETFL, 0);
    } else {
      turn_direct_io_off("its filesystem does not support O_DIRECT");
    }
  }
  try {
    rebuild_index();
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

DiskTier::~DiskTier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  for (std::thread& writer : writers_) writer.join();
  save_index();  // still holding the lock: no other mount can change DIR meanwhile
  ::close(lock_fd_);
}

void DiskTier::start() {
  std::lock_guard lock(mutex_);
  if (!writers_.empty() || stopping_) return;
  // The process that serves it now (a mount opens the tier, then forks its daemon).
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, pid.data(), pid.size(), 0) < 0) {
    spdlog::debug("cannot record the pid in {}/lock", options_.dir.string());
  }
  owner_pid_ = ::getpid();
  for (unsigned i = 0; i < std::clamp(options_.writer_threads, 1u, 64u); ++i) {
    writers_.emplace_back([this, i] {
      name_this_thread("disk-write-" + std::to_string(i));
      writer_loop();
    });
  }
}

std::optional<std::vector<DiskTier::Found>> DiskTier::load_index() {
  const std::filesystem::path path = index_path_of(options_.dir);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (fd.get() < 0) {
    if (errno != ENOENT) {
      spdlog::warn("disk cache {}: cannot open its index ({}); listing the objects instead",
                   options_.dir.string(), std::strerror(errno));
    }
    return std::nullopt;
  }
  // Used at most once: gone before anything changes, so a daemon killed later leaves no index
  // that would miss its writes (the next open lists the directory instead). The directory is
  // synced so that the removal outlives a power loss too.
  const bool removed = ::unlink(path.c_str()) == 0;
  {
    UniqueFd dir(::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!removed || dir.get() < 0 || ::fsync(dir.get()) != 0) {
      spdlog::warn("disk cache {}: cannot remove its index ({}); listing the objects instead",
                   options_.dir.string(), std::strerror(errno));
      return std::nullopt;
    }
  }
  // Header, entries, then the digest of both; anything else is damaged.
  struct stat st {};
  std::string bytes;
  IndexHeader header;
  uint64_t digest = 0;
  bool whole = ::fstat(fd.get(), &st) == 0 &&
               st.st_size >= static_cast<off_t>(sizeof header + sizeof digest);
  if (whole) {
    bytes.resize(static_cast<size_t>(st.st_size));
    whole = pread_all(fd.get(), bytes.data(), bytes.size(), 0) == 0;
  }
  if (whole) {
    std::memcpy(&header, bytes.data(), sizeof header);
    std::memcpy(&digest, bytes.data() + bytes.size() - sizeof digest, sizeof digest);
    whole = header.magic == kIndexMagic && header.version == kIndexVersion &&
            header.entry_bytes == sizeof(IndexEntry) &&
            bytes.size() == sizeof header + header.entries * sizeof(IndexEntry) + sizeof digest &&
            digest == XXH3_64bits(bytes.data(), bytes.size() - sizeof digest);
  }
  if (!whole) {
    spdlog::warn(
        "disk cache {}: its index is damaged or of another version; listing the objects "
        "instead",
        options_.dir.string());
    return std::nullopt;
  }
  std::vector<Found> found(header.entries);
  const char* next = bytes.data() + sizeof header;
  for (Found& f : found) {
    IndexEntry entry;
    std::memcpy(&entry, next, sizeof entry);
    next += sizeof entry;
    f = Found{.id = FileId{.dataset = entry.dataset,
                           .generation = entry.generation,
                           .object_id = entry.object_id,
                           .chunk = entry.chunk,
                           .file_size = entry.file_size},
              .bytes = on_disk_bytes(entry.file_size)};
  }
  return found;
}

void DiskTier::save_index() const {
  // Called once the writers have stopped, so the index matches the directory; after a fork only
  // by the process that serves the tier (owner_pid_).
  if (::getpid() != owner_pid_) return;
  std::string bytes;
  {
    std::lock_guard lock(mutex_);
    IndexHeader header;
    header.entries = index_.size();
    bytes.reserve(sizeof header + index_.size() * sizeof(IndexEntry) + sizeof(uint64_t));
    bytes.append(reinterpret_cast<const char*>(&header), sizeof header);
    // In eviction order: what was read this epoch last.
    for (const std::list<FileId>& list : by_age_) {
      for (const FileId& id : list) {
        const IndexEntry entry{.dataset = id.dataset,
                               .generation = id.generation,
                               .object_id = id.object_id,
                               .chunk = id.chunk,
                               .file_size = id.file_size};
        bytes.append(reinterpret_cast<const char*>(&entry), sizeof entry);
      }
    }
  }
  const uint64_t digest = XXH3_64bits(bytes.data(), bytes.size());
  bytes.append(reinterpret_cast<const char*>(&digest), sizeof digest);
  // Written under a temporary name and renamed: a half-written index is never read as whole
  // (and a torn one fails its digest).
  const std::filesystem::path path = index_path_of(options_.dir);
  const std::string temp = path.string() + std::string(kTempSuffix);
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600));
  int error = fd.get() < 0 ? errno : write_all(fd.get(), bytes.data(), bytes.size());
  if (error == 0) error = fd.close();
  if (error == 0 && ::rename(temp.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temp.c_str());
    spdlog::warn(
        "disk cache {}: cannot save its index ({}); the next mount lists the objects "
        "instead",
        options_.dir.string(), std::strerror(error));
  }
}

std::vector<DiskTier::Found> DiskTier::scan_objects() {
  // The subdirectories are listed by several threads at once: a device serves many reads of
  // directory blocks in parallel. Each file's size is in its name: no stat per file.
  const unsigned threads = std::clamp(options_.scan_threads, 1u, 256u);
  std::vector<std::vector<Found>> scanned(threads);
  std::vector<uint64_t> stale(threads, 0);
  std::vector<uint64_t> renamed(threads, 0);
  std::vector<std::exception_ptr> failures(threads);
  const auto scan = [&](unsigned thread) {
    auto visit = [&](unsigned sub, int dir_fd, const char* file, unsigned char type) {
      const std::string_view name = file;
      if (name.ends_with(kTempSuffix)) {
        // A write a killed daemon never finished: never renamed, so never an object.
        if (::unlinkat(dir_fd, file, 0) == 0) ++stale[thread];
        return;
      }
      const std::optional<ObjectName> parsed = parse_object_name(name);
      if (!parsed) return;  // not ours: left alone
      FileId id{.dataset = parsed->dataset,
                .generation = parsed->generation,
                .object_id = parsed->object_id,
                .chunk = parsed->chunk,
                .file_size = parsed->file_size.value_or(0)};
      if ((FileIdHash{}(id)&0xff) != sub) return;  // in the wrong subdirectory: not ours
      struct stat st {};
      if (!is_regular_file(dir_fd, file, type, st)) return;
      if (!parsed->file_size) {
        // Written by an older dsfs: given the name this one looks up (same subdirectory: the
        // size is not hashed), so that an upgrade keeps the tier. Its bytes are checked on
        // first read, as any file's.
        if (::fstatat(dir_fd, file, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            static_cast<uint64_t>(st.st_size) < kHeaderBytes) {
          return;
        }
        id.file_size = static_cast<uint64_t>(st.st_size);
        const std::string new_name = path_of(id).filename().string();
        if (::renameat(dir_fd, file, dir_fd, new_name.c_str()) != 0) return;
        ++renamed[thread];
      }
      scanned[thread].push_back(Found{.id = id, .bytes = on_disk_bytes(id.file_size)});
    };
    try {
      for (unsigned sub = thread; sub < 256; sub += threads)
        for_each_entry_in(objects_dir_, sub, visit);
    } catch (...) {
      failures[thread] = std::current_exception();
    }
  };
  {
    std::vector<std::jthread> workers;
    for (unsigned thread = 1; thread < threads; ++thread) workers.emplace_back(scan, thread);
    scan(0);
  }
  for (const std::exception_ptr& failure : failures) {
    if (failure) std::rethrow_exception(failure);
  }
  for (const uint64_t count : stale) stats_.stale_temp_files += count;
  const uint64_t upgraded = std::accumulate(renamed.begin(), renamed.end(), uint64_t{0});
  if (upgraded > 0) {
    spdlog::info("disk cache {}: renamed {} object files written by an older dsfs",
                 options_.dir.string(), upgraded);
  }
  // In listing order: the order of use is not known after a killed daemon (a clean close saves
  // it in DIR/index), and a stat per file to guess it from the times would cost more than it
  // saves.
  std::vector<Found> found;
  for (std::vector<Found>& part : scanned) {
    found.insert(found.end(), part.begin(), part.end());
    part = {};
  }
  return found;
}

void DiskTier::rebuild_index() {
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::vector<Found>> found = load_index();
  stats_.index_loaded = found.has_value();
  if (!found) found = scan_objects();
  std::lock_guard lock(mutex_);
  index_.reserve(found->size());  // no rehash while 1.3 M entries go in
  // All as read in the last epoch: this mount's first epoch is likely to read them again.
  std::list<FileId>& loaded = by_age_[kLastEpoch];
  for (const Found& f : *found) {
    loaded.push_back(f.id);
    if (!index_
             .emplace(f.id,
                      Entry{.bytes = f.bytes, .age = kLastEpoch, .place = std::prev(loaded.end())})
             .second) {
      loaded.pop_back();  // named twice in a (checked) index: keep the first
      continue;
    }
    stats_.bytes_used += f.bytes;
    uint64_t& newest = newest_generation_[f.id.dataset];
    newest = std::max(newest, f.id.generation);
  }
  // Older generations go first.
  for (auto it = loaded.begin(); it != loaded.end();) {
    const auto next = std::next(it);
    if (it->generation < newest_generation_[it->dataset]) {
      index_.at(*it).age = kEarlier;
      by_age_[kEarlier].splice(by_age_[kEarlier].end(), loaded, it);
    }
    it = next;
  }
  // A filesystem with less room than asked for: the tier keeps to what it has (its own files
  // included), or every write past it would fail with ENOSPC and nothing would be evicted.
  if (const std::optional<uint64_t> room = room_locked(); room && *room < stats_.capacity_bytes) {
    stats_.capacity_bytes = *room / 20 * 19;  // 5% for the index, directories, other writers
    spdlog::warn(
        "disk cache {}: its filesystem has room for {} (the tier's files included), less than "
        "the {} asked for; the tier keeps to {} until it has more",
        options_.dir.string(), store::mib_text(*room), store::mib_text(options_.capacity_bytes),
        store::mib_text(stats_.capacity_bytes));
  }
  // Made with a larger capacity before: the least recently used go, whatever their age.
  for (std::list<FileId>& list : by_age_) {
    while (stats_.bytes_used > stats_.capacity_bytes && !list.empty()) {
      erase_locked(list.front());
      ++stats_.evictions;
    }
  }
  stats_.entries = index_.size();
  stats_.open_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("disk cache {}: {} objects, {} of {} ({} in {:.2f} s){}", options_.dir.string(),
               index_.size(), store::mib_text(stats_.bytes_used),
               store::mib_text(stats_.capacity_bytes),
               stats_.index_loaded ? "index loaded" : "objects listed", stats_.open_seconds,
               stats_.stale_temp_files > 0
                   ? fmt::format("; removed {} unfinished writes", stats_.stale_temp_files)
                   : "");
}

bool DiskTier::forget_locked(const FileId& id) {
  const auto it = index_.find(id);
  if (it == index_.end()) return false;
  stats_.bytes_used -= it->second.bytes;
  by_age_[it->second.age].erase(it->second.place);
  index_.erase(it);
  stats_.entries = index_.size();
  return true;
}

void DiskTier::erase_locked(FileId id) {
  if (!forget_locked(id)) return;
  if (::unlink(path_of(id).c_str()) != 0 && errno != ENOENT) {
    spdlog::debug("disk cache: cannot remove {}: {}", path_of(id).string(), std::strerror(errno));
  }
}

bool DiskTier::recycle_locked(FileId victim, const std::filesystem::path& temp) {
  if (!forget_locked(victim)) return false;
  const std::filesystem::path from = path_of(victim);
  if (::rename(from.c_str(), temp.c_str()) == 0) return true;
  if (errno == ENOENT && std::filesystem::exists(from)) {
    // The new file's subdirectory is new (or was removed under us).
    std::error_code ignored;
    std::filesystem::create_directories(temp.parent_path(), ignored);
    if (::rename(from.c_str(), temp.c_str()) == 0) return true;
  }
  if (::unlink(from.c_str()) != 0 && errno != ENOENT) {
    spdlog::debug("disk cache: cannot remove {}: {}", from.string(), std::strerror(errno));
  }
  return false;
}

std::optional<DiskTier::FileId> DiskTier::victim_locked() const {
  if (!by_age_[kEarlier].empty()) return by_age_[kEarlier].front();
  if (options_.follows_epochs) return std::nullopt;
  for (const std::list<FileId>& list : by_age_) {
    if (!list.empty()) return list.front();
  }
  return std::nullopt;
}

std::optional<uint64_t> DiskTier::room_locked() const {
  struct statvfs fs {};
  // (A filesystem without a size, such as ramfs, says 0 blocks: no bound known.)
  if (::statvfs(options_.dir.c_str(), &fs) != 0 || fs.f_blocks == 0) return std::nullopt;
  return stats_.bytes_used + reserved_bytes_ + static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
}

void DiskTier::grow_to_room_locked() {
  if (stats_.capacity_bytes >= options_.capacity_bytes) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - room_checked_ < options_.room_check_interval) return;
  room_checked_ = now;
  const std::optional<uint64_t> room = room_locked();
  if (!room) return;
  const uint64_t capacity = std::min(options_.capacity_bytes, *room / 20 * 19);
  if (capacity <= stats_.capacity_bytes) return;
  spdlog::info(
      "disk cache {}: its filesystem has room again; the tier may take {} (of the {} "
      "asked for)",
      options_.dir.string(), store::mib_text(capacity), store::mib_text(options_.capacity_bytes));
  stats_.capacity_bytes = capacity;
}

void DiskTier::touch_locked(Entry& entry) {
  std::list<FileId>& to = by_age_[kThisEpoch];
  to.splice(to.end(), by_age_[entry.age], entry.place);
  entry.age = kThisEpoch;
}

void DiskTier::new_epoch() {
  std::lock_guard lock(mutex_);
  for (const FileId& id : by_age_[kLastEpoch]) index_.at(id).age = kEarlier;
  by_age_[kEarlier].splice(by_age_[kEarlier].end(), by_age_[kLastEpoch]);
  for (const FileId& id : by_age_[kThisEpoch]) index_.at(id).age = kLastEpoch;
  by_age_[kLastEpoch].splice(by_age_[kLastEpoch].end(), by_age_[kThisEpoch]);
}

void DiskTier::note_generation_locked(uint64_t dataset, uint64_t generation) {
  uint64_t& newest = newest_generation_[dataset];
  if (generation <= newest) return;
  newest = generation;
  // Rare (a re-ingest): the dataset's older files move to the front, to go first.
  std::list<FileId>& first = by_age_[kEarlier];
  const auto old_first = first.begin();
  for (std::list<FileId>& list : by_age_) {
    for (auto it = list.begin(); it != list.end() && it != old_first;) {
      const auto next = std::next(it);
      if (it->dataset == dataset && it->generation < generation) {
        index_.at(*it).age = kEarlier;
        first.splice(old_first, list, it);
      }
      it = next;
    }
  }
}

bool DiskTier::replaced_since_read(const FileId& id, int fd) const {
  struct stat read_file_stat {};
  struct stat named_file_stat {};
  return fd >= 0 && ::fstat(fd, &read_file_stat) == 0 &&
         (::stat(path_of(id).c_str(), &named_file_stat) != 0 ||
          named_file_stat.st_ino != read_file_stat.st_ino ||
          named_file_stat.st_dev != read_file_stat.st_dev);
}

bool DiskTier::is_transient(int error) {
  return error == EMFILE || error == ENFILE || error == ENOMEM || error == EAGAIN || error == EINTR;
}

void DiskTier::keep_unread(const std::filesystem::path& path, int error) {
  {
    std::lock_guard lock(mutex_);
    ++stats_.misses;
    ++stats_.read_errors;
  }
  unread_log_.log(spdlog::level::warn,
                  fmt::format("disk cache: cannot read {} now: {}; read from Redis (the file is "
                              "kept)",
                              path.string(), std::strerror(error)));
}

void DiskTier::drop_bad(const FileId& id, std::string_view dataset, const std::string& why,
                        bool checksum, int fd) {
  const bool replaced = replaced_since_read(id, fd);
  std::lock_guard lock(mutex_);
  ++stats_.misses;
  // Evicted (or dropped by another reader) since this read looked: nothing wrong with the disk.
  if (replaced || !index_.contains(id)) return;
  ++(checksum ? stats_.checksum_failures : stats_.read_errors);
  drop_log_.log(
      spdlog::level::warn,
      fmt::format("disk cache: dropped {} (object {} chunk {} of {} generation {}): {}; read "
                  "from Redis",
                  path_of(id).string(), id.object_id, id.chunk, store::log_text(dataset),
                  id.generation, why));
  erase_locked(id);
}

void DiskTier::drop_stale(const FileId& id, std::string_view dataset, bool old_format, int fd) {
  const bool replaced = replaced_since_read(id, fd);
  std::lock_guard lock(mutex_);
  ++stats_.misses;
  if (replaced || !index_.contains(id)) return;
  ++stats_.stale_drops;
  // Once per mount and kind: a tier filled from another namespace or Redis has a file like this
  // for every object, each rewritten as it is read from Redis.
  bool& told = old_format ? told_old_format_ : told_other_ingest_;
  if (!told) {
    told = true;
    spdlog::info(
        "disk cache: {} of dataset '{}' generation {} {}; such files are read from Redis and "
        "rewritten (stats.json disk_tier.stale_drops counts them)",
        path_of(id).string(), store::log_text(dataset), id.generation,
        old_format ? "was written by an older dsfs, which did not record which ingest made it"
                   : "was written for another dataset of that name and generation (another "
                     "namespace or Redis, or one made again after Redis lost its data)");
  }
  erase_locked(id);
}

bool DiskTier::holds(const DiskTierKey& key, uint64_t length) const {
  const FileId id = id_of(key, length);
  std::lock_guard lock(mutex_);
  return index_.contains(id);
}

ObjectBuffer DiskTier::get(const DiskTierKey& key, uint64_t length) {
  const FileId id = id_of(key, length);
  {
    std::lock_guard lock(mutex_);
    const auto it = index_.find(id);
    if (it == index_.end()) {
      ++stats_.misses;
      return nullptr;
    }
    // A generation older than the newest of its dataset keeps its place at the front.
    if (id.generation >= newest_generation_[id.dataset]) touch_locked(it->second);
  }
  const std::filesystem::path path = path_of(id);
  if (options_.before_open_for_tests) options_.before_open_for_tests(path);
  // Neither followed nor waited on: a link or a FIFO put in a file's place (the open of a FIFO
  // waits for a writer forever, with the reader and the daemon's exit behind it).
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0 && is_transient(errno)) {
    keep_unread(path, errno);
    return nullptr;
  }
  if (fd.get() < 0) {
    drop_bad(id, key.dataset,
             errno == ENOENT  ? std::string("the file vanished")
             : errno == ELOOP ? std::string("it is a symbolic link")
                              : std::strerror(errno),
             false);
    return nullptr;
  }
  if (struct stat file_stat{}; ::fstat(fd.get(), &file_stat) != 0 || !S_ISREG(file_stat.st_mode)) {
    drop_bad(id, key.dataset, "it is not a regular file", false);
    return nullptr;
  }
  const uint64_t expected = id.file_size;
  bool direct = read_directly(fd.get(), expected);
  // The whole file in one read, asking for one byte more than it should hold so that a longer
  // file shows without a stat; rounded up to the block for O_DIRECT. Not zeroed, and pre-faulted
  // in one call: a remount's first epoch fills an empty cache from here.
  const uint64_t request = round_up(expected + 1, store::kDirectIoBlock);
  store::AlignedValueBuffer block = store::new_aligned_value_buffer(request);
  ssize_t got = read_file(fd.get(), block.get(), request, direct);
  if (got == -EINVAL && direct) {
    // A filesystem that takes O_DIRECT at open and refuses it at read (a larger logical block).
    turn_direct_io_off("it refused a direct read (EINVAL)");
    direct = false;
    if (::fcntl(fd.get(), F_SETFL, 0) == 0) got = read_file(fd.get(), block.get(), request, false);
  }
  if (got < 0 && is_transient(static_cast<int>(-got))) {
    keep_unread(path, static_cast<int>(-got));
    return nullptr;
  }
  if (got < 0) {
    drop_bad(id, key.dataset, std::strerror(static_cast<int>(-got)), false);
    return nullptr;
  }
  if (static_cast<uint64_t>(got) != expected) {
    drop_bad(id, key.dataset,
             static_cast<uint64_t>(got) > expected
                 ? fmt::format("the file has more than the {} bytes expected", expected)
                 : fmt::format("the file has {} bytes, {} expected", got, expected),
             true, fd.get());
    return nullptr;
  }
  const size_t head_size = kHeaderBytes + key.dataset.size();
  Header header;
  std::memcpy(&header, block.get(), kHeaderBytes);
  const std::string_view name(block.get() + kHeaderBytes, key.dataset.size());
  if (header.magic != kMagic || !known_version(header.version) ||
      header.name_length != key.dataset.size() || header.payload_length != length ||
      header.generation != key.generation || header.object_id != key.object_id ||
      header.chunk != key.chunk || name != key.dataset ||
      header.header_digest != digest_of_header(header, name)) {
    drop_bad(id, key.dataset, "its header does not match the object", true, fd.get());
    return nullptr;
  }
  if (key.ingest != 0 &&
      (header.version != kVersion || header.ingest_tag != static_cast<uint32_t>(key.ingest))) {
    drop_stale(id, key.dataset, header.version != kVersion, fd.get());
    return nullptr;
  }
  const char* payload = block.get() + head_size;
  if (digest_of(header.version, payload, length, key.ingest) != header.payload_digest) {
    drop_bad(id, key.dataset, "its payload fails its checksum", true, fd.get());
    return nullptr;
  }
  {
    std::lock_guard lock(mutex_);
    ++stats_.hits;
    ++(direct ? stats_.direct_reads : stats_.page_cache_reads);
    stats_.bytes_read += length;
  }
  // A large object keeps the block it was read into (header and rounding: at most 1/16 more than
  // the RAM cache counts); a small one is copied out, so that the overhead stays within that.
  if (length >= kKeepBlockBytes) {
    return std::make_shared<const ObjectData>(std::move(block), head_size, length);
  }
  store::ValueReply copy{.kind = store::ValueReply::Kind::kValue,
                         .bytes = store::new_value_buffer(length),
                         .size = length,
                         .error = {}};
  std::memcpy(copy.bytes.get(), payload, length);
  return std::make_shared<const ObjectData>(std::move(copy));
}

bool DiskTier::read_directly(int fd, uint64_t file_size) {
  if (!direct_io_.load(std::memory_order_relaxed)) return false;
  if (options_.page_cache_first && cachestat_works_.load(std::memory_order_relaxed)) {
    const PageCacheAnswer cached = page_cache_holds_whole(fd, file_size);
    if (cached == PageCacheAnswer::kYes) return false;
    if (cached == PageCacheAnswer::kNoCachestat) {
      cachestat_works_.store(false, std::memory_order_relaxed);
      spdlog::info(
          "disk cache: cachestat(2) is not available here (Linux 6.5 has it); every "
          "read of {} goes around the page cache",
          options_.dir.string());
    }
  }
  if (::fcntl(fd, F_SETFL, O_DIRECT) == 0) return true;
  if (errno == EINVAL) turn_direct_io_off("its filesystem does not support O_DIRECT");
  return false;
}

void DiskTier::turn_direct_io_off(const char* why) {
  if (direct_io_.exchange(false)) {
    spdlog::info("disk cache: {} is read through the page cache: {}", options_.dir.string(), why);
  }
}

bool DiskTier::put(const DiskTierKey& key, ObjectBuffer buffer) {
  const FileId id = id_of(key, buffer->size());
  const uint64_t bytes = on_disk_bytes(id.file_size);
  std::lock_guard lock(mutex_);
  if (stopping_ || index_.contains(id) || queued_.contains(id)) return false;
  if (bytes > stats_.capacity_bytes) {
    ++stats_.too_large;
    return false;
  }
  note_generation_locked(id.dataset, id.generation);  // its older generations may go first
  if (options_.follows_epochs && by_age_[kEarlier].empty() &&
      stats_.bytes_used + reserved_bytes_ + bytes > stats_.capacity_bytes) {
    ++stats_.writes_declined;  // full of files to keep: not worth a copy and a queue slot
    return false;
  }
  if (stats_.queued_bytes + buffer->size() > options_.queue_bytes) {
    // The writers are behind (a fast Redis, busy CPUs): remember it without holding its bytes.
    // While the RAM cache or a reader holds it, a writer that catches up can still write it.
    if (options_.deferred_limit == 0) {
      ++stats_.writes_dropped;
      return false;
    }
    if (deferred_.size() >= options_.deferred_limit) {
      // The oldest: the least likely to be in memory still.
      if (ObjectBuffer forgotten = deferred_.front().buffer.lock()) {
        forgotten->set_awaiting_disk(false);
      }
      deferred_.pop_front();
      ++stats_.writes_dropped;
    }
    ++stats_.writes_deferred;
    buffer->set_awaiting_disk(true);  // the memory cache keeps it a little longer
    deferred_.push_back(Deferred{
        .id = id, .dataset = std::string(key.dataset), .ingest = key.ingest, .buffer = buffer});
    work_.notify_one();
    return true;
  }
  stats_.queued_bytes += buffer->size();
  queued_.insert(id);
  queue_.push_back(Write{.id = id,
                         .dataset = std::string(key.dataset),
                         .ingest = key.ingest,
                         .buffer = std::move(buffer)});
  work_.notify_one();
  return true;
}

void DiskTier::flush() {
  std::unique_lock lock(mutex_);
  if (writers_.empty()) return;
  idle_.wait(lock, [this] { return queue_.empty() && deferred_.empty() && writing_ == 0; });
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard lock(mutex_);
  DiskTierStats stats = stats_;
  stats.direct_io = direct_io_.load(std::memory_order_relaxed);
  return stats;
}

std::optional<DiskTier::Write> DiskTier::next_write_locked() {
  if (!queue_.empty()) {
    Write write = std::move(queue_.front());
    queue_.pop_front();
    return write;
  }
  // Oldest first: the memory cache lets go of objects about in the order they were read, so the
  // oldest deferred object is the next to be lost (the newest has the longest left). Those gone
  // already cost a failed lock each. At a stop, not written: an unmount should not wait for a
  // cache's worth of writes.
  while (!deferred_.empty()) {
    Deferred deferred = std::move(deferred_.front());
    deferred_.pop_front();
    if (index_.contains(deferred.id) || queued_.contains(deferred.id)) continue;
    ObjectBuffer buffer = stopping_ ? nullptr : deferred.buffer.lock();
    if (!buffer) {
      ++stats_.writes_dropped;
      continue;
    }
    buffer->set_awaiting_disk(false);  // held by this write now
    queued_.insert(deferred.id);
    stats_.queued_bytes += buffer->size();
    return Write{.id = deferred.id,
                 .dataset = std::move(deferred.dataset),
                 .ingest = deferred.ingest,
                 .buffer = std::move(buffer)};
  }
  return std::nullopt;
}

void DiskTier::writer_loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    work_.wait(lock, [this] { return stopping_ || !queue_.empty() || !deferred_.empty(); });
    std::optional<Write> next = next_write_locked();
    if (!next) {
      if (stopping_) break;  // every queued write done
      idle_.notify_all();    // the deferred ones were all gone from memory
      continue;
    }
    Write write = std::move(*next);
    ++writing_;
    lock.unlock();
    try {
      write_one(write);
    } catch (const std::exception& e) {
      spdlog::warn("disk cache: a write failed: {}", e.what());
    }
    lock.lock();
    queued_.erase(write.id);
    stats_.queued_bytes -= write.buffer->size();
    --writing_;
    idle_.notify_all();
  }
}

void DiskTier::write_one(const Write& write) {
  const FileId& id = write.id;
  const std::string_view payload = write.buffer->bytes();
  Header header;
  header.name_length = static_cast<uint32_t>(write.dataset.size());
  header.payload_length = payload.size();
  header.payload_digest = digest_of(header.version, payload.data(), payload.size(), write.ingest);
  header.generation = id.generation;
  header.object_id = id.object_id;
  header.chunk = id.chunk;
  header.ingest_tag = static_cast<uint32_t>(write.ingest);
  header.header_digest = digest_of_header(header, write.dataset);
  std::string head(reinterpret_cast<const char*>(&header), kHeaderBytes);
  head += write.dataset;
  const uint64_t bytes = on_disk_bytes(head.size() + payload.size());
  const std::filesystem::path path = path_of(id);
  const std::filesystem::path temp = path.string() + std::string(kTempSuffix);
  std::optional<uint64_t> reused_size;  // of the evicted file this write took over, if any
  {
    // Room first, so the bound holds while the file is written too (and while the other
    // writers write theirs: their bytes are reserved).
    std::lock_guard lock(mutex_);
    // The first file evicted becomes this one (renamed to its temporary name, then rewritten):
    // a full tier writes without creating and deleting an inode per object, which on an ext4
    // without a journal costs a walk past every inode deleted in the last minute.
    grow_to_room_locked();
    bool none_may_go = false;
    while (stats_.bytes_used + reserved_bytes_ + bytes > stats_.capacity_bytes) {
      const std::optional<FileId> victim = victim_locked();
      if (!victim) {
        none_may_go = !index_.empty();
        break;
      }
      if (reused_size) {
        erase_locked(*victim);
      } else if (recycle_locked(*victim, temp)) {
        reused_size = victim->file_size;
        ++stats_.files_reused;
      }
      ++stats_.evictions;
    }
    if (stats_.bytes_used + reserved_bytes_ + bytes > stats_.capacity_bytes) {
      // What it holds is to be kept (follows_epochs), or the rest of the tier is being written
      // by the other writers.
      ++(none_may_go ? stats_.writes_declined : stats_.writes_dropped);
      if (reused_size) ::unlink(temp.c_str());
      return;
    }
    reserved_bytes_ += bytes;
  }
  int error = 0;
  {
    // A file taken over is overwritten in place, not truncated to nothing first: ext4 flushes a
    // file truncated to zero and rewritten at its close (auto_da_alloc), so the writer would
    // start its writeback itself. Cut at a page boundary below the new size first, so that no
    // page is half overwritten (a read of the old page before the write).
    const uint64_t new_size = head.size() + payload.size();
    const uint64_t whole_pages = new_size / kBlock * kBlock;
    // O_NONBLOCK: a FIFO taken over (put in an object file's place) fails the open at once.
    constexpr int kWriteFlags = O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK;
    UniqueFd fd(
        ::open(temp.c_str(), reused_size ? kWriteFlags : kWriteFlags | O_CREAT | O_TRUNC, 0600));
    if (fd.get() >= 0 && reused_size && *reused_size > whole_pages &&
        ::ftruncate(fd.get(), static_cast<off_t>(whole_pages)) != 0) {
      error = errno;
    }
    if (fd.get() < 0 && errno == ENOENT) {
      // Its subdirectory is new (or was removed under us).
      std::error_code ignored;
      std::filesystem::create_directories(path.parent_path(), ignored);
      fd.reset(::open(temp.c_str(), kWriteFlags | O_CREAT | O_TRUNC, 0600));
    }
    if (fd.get() < 0) {
      error = errno;
    } else if (error == 0) {
      error = write_all(fd.get(), head.data(), head.size());
      if (error == 0) error = write_all(fd.get(), payload.data(), payload.size());
      const int close_error = fd.close();
      if (error == 0) error = close_error;
    }
  }
  std::lock_guard lock(mutex_);
  reserved_bytes_ -= bytes;
  if (error == 0 && ::rename(temp.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temp.c_str());
    ++stats_.write_errors;
    // A full or failing disk fails every write alike: one line per errno for the mount.
    if (std::find(write_errnos_logged_.begin(), write_errnos_logged_.end(), error) ==
        write_errnos_logged_.end()) {
      write_errnos_logged_.push_back(error);
      spdlog::warn("disk cache: cannot write {}: {}; objects not written are read from Redis",
                   path.string(), std::strerror(error));
    }
    // The filesystem is full below the tier's capacity (other files took the room): the tier
    // keeps to what it holds now, so later writes evict to make room instead of failing, until
    // the filesystem has room again (grow_to_room_locked). Warned once; later ones (several
    // writers meet the same full disk) are news only in detail.
    if ((error == ENOSPC || error == EDQUOT) && stats_.bytes_used < stats_.capacity_bytes) {
      spdlog::log(told_filesystem_full_ ? spdlog::level::info : spdlog::level::warn,
                  "disk cache {}: its filesystem is full with {} of the tier's files, below the {} "
                  "it may take; it keeps to {} until the filesystem has room again",
                  options_.dir.string(), store::mib_text(stats_.bytes_used),
                  store::mib_text(stats_.capacity_bytes), store::mib_text(stats_.bytes_used));
      told_filesystem_full_ = true;
      stats_.capacity_bytes = stats_.bytes_used;
      room_checked_ = std::chrono::steady_clock::now();
    }
    return;
  }
  std::list<FileId>& list = by_age_[kThisEpoch];
  list.push_back(id);
  index_.emplace(id, Entry{.bytes = bytes, .age = kThisEpoch, .place = std::prev(list.end())});
  stats_.bytes_used += bytes;
  stats_.entries = index_.size();
  ++stats_.writes;
  stats_.bytes_written += payload.size();
}

}  // namespace dsfs::prefetch
