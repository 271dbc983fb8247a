#define FUSE_USE_VERSION 314
#include "fs/mount.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <fuse_lowlevel.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "src/catalog/dataset.h"
#include "src/catalog/names.h"
#include "src/store/errors.h"
#include "src/store/log_text.h"
#include "src/store/thread_name.h"

namespace dsfs::fs {
namespace {

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

// ---- mountinfo --------------------------------------------------------------------------------

std::string unescape_mountinfo_field(std::string_view field) {
  std::string out;
  out.reserve(field.size());
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size() &&
        std::all_of(field.begin() + i + 1, field.begin() + i + 4,
                    [](char c) { return c >= '0' && c <= '7'; })) {
      out += static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                               (field[i + 3] - '0'));
      i += 3;
    } else {
      out += field[i];
    }
  }
  return out;
}

std::vector<MountInfo> parse_mountinfo(std::string_view text) {
  // Line: id parent major:minor root mount-point options [optional...] - type source super-opts
  std::vector<MountInfo> mounts;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    text = end == std::string_view::npos ? std::string_view{} : text.substr(end + 1);
    std::vector<std::string_view> fields;
    size_t pos = 0;
    while (pos < line.size()) {
      const size_t next = line.find(' ', pos);
      const size_t stop = next == std::string_view::npos ? line.size() : next;
      if (stop > pos) fields.push_back(line.substr(pos, stop - pos));
      pos = stop + 1;
    }
    const auto separator = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 6 || separator == fields.end() || fields.end() - separator < 3) continue;
    mounts.push_back(MountInfo{.mount_point = unescape_mountinfo_field(fields[4]),
                               .fs_type = std::string(separator[1]),
                               .source = unescape_mountinfo_field(separator[2]),
                               .device = std::string(fields[2])});
  }
  return mounts;
}

std::optional<MountInfo> find_mount(const std::filesystem::path& real_path) {
  std::optional<MountInfo> found;
  for (MountInfo& m : parse_mountinfo(read_text_file("/proc/self/mountinfo"))) {
    if (m.mount_point == real_path.native()) found = std::move(m);  // the last one is on top
  }
  return found;
}

std::filesystem::path check_mountpoint(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status)) {
    if (error.value() == ENOTCONN) {
      throw std::runtime_error(fmt::format(
          "mountpoint {} is a dead FUSE mount (its daemon exited); clear it with `dsfs umount {}`",
          path.string(), path.string()));
    }
    const bool odd_error = error && error.value() != ENOENT;
    throw std::runtime_error(fmt::format("mountpoint {} does not exist{}; create it with mkdir",
                                         path.string(),
                                         odd_error ? " (" + error.message() + ")" : std::string()));
  }
  if (!std::filesystem::is_directory(status)) {
    throw std::runtime_error(fmt::format("mountpoint {} is not a directory", path.string()));
  }
  const std::filesystem::path real = std::filesystem::canonical(path);
  if (const std::optional<MountInfo> mounted = find_mount(real)) {
    throw std::runtime_error(fmt::format(
        "{} is already a mount point ({} from {}); unmount it first{}", real.string(),
        mounted->fs_type, mounted->source,
        mounted->fs_type == kMountType ? fmt::format(" with `dsfs umount {}`", real.string())
                                       : std::string()));
  }
  return real;
}

// ---- GenerationLeases --------------------------------------------------------------------------

namespace {

// After a failed refresh, retry after this, doubling up to the normal interval.
constexpr std::chrono::milliseconds kLeaseFirstRetry{1000};

double seconds(std::chrono::milliseconds ms) {
  return static_cast<double>(ms.count()) / 1000.0;
}

}  // namespace

GenerationLeases::GenerationLeases(store::Client& client, catalog::KeySchema keys,
                                   std::chrono::milliseconds ttl)
    : client_(client), keys_(std::move(keys)), ttl_(ttl), reader_id_(catalog::make_reader_id()) {
  if (ttl_.count() <= 0) {
    throw std::invalid_argument(
        fmt::format("the lease ttl must be positive, not {} ms", ttl_.count()));
  }
}

GenerationLeases::~GenerationLeases() {
  release();
}

catalog::DatasetInfo GenerationLeases::pin_current(const std::string& name) {
  catalog::DatasetInfo info =
      catalog::pin_current_generation(client_, keys_, name, reader_id_, ttl_);
  MutexLock lock(mutex_);
  leases_.push_back(Lease{.name = name, .generation = info.generation});
  spdlog::debug("dataset '{}': pinned generation {} as reader {} for {} s", name, info.generation,
                reader_id_, seconds(ttl_));
  return info;
}

void GenerationLeases::unpin(const std::string& name) {
  std::optional<Lease> lease;
  {
    MutexLock lock(mutex_);
    const auto it = std::find_if(leases_.begin(), leases_.end(),
                                 [&](const Lease& held) { return held.name == name; });
    if (it == leases_.end()) return;
    lease = *it;
    leases_.erase(it);
  }
  catalog::unpin_generation(client_, keys_, lease->name, reader_id_, lease->generation);
}

void GenerationLeases::unpin(const std::string& name, uint64_t generation) {
  forget(name, generation);
  catalog::unpin_generation(client_, keys_, name, reader_id_, generation);
}

void GenerationLeases::forget(const std::string& name, uint64_t generation) {
  MutexLock lock(mutex_);
  std::erase_if(leases_,
                [&](const Lease& l) { return l.name == name && l.generation == generation; });
}

void GenerationLeases::start_refreshing() {
  MutexLock lock(mutex_);
  // Even with no lease yet: datasets published later are pinned while the mount lives.
  if (refresher_.joinable() || released_) return;
  refresher_ = std::jthread([this](std::stop_token stop) {
    name_this_thread("lease-refresh");
    refresh_loop(std::move(stop));
  });
}

uint64_t GenerationLeases::refresh_failures() const {
  MutexLock lock(mutex_);
  return refresh_failures_;
}

uint64_t GenerationLeases::refreshes() const {
  MutexLock lock(mutex_);
  return refreshes_;
}

void GenerationLeases::refresh_all() {
  std::vector<Lease> leases;
  {
    MutexLock lock(mutex_);
    leases = leases_;
  }
  for (const Lease& lease : leases) {
    if (!catalog::pin_generation(client_, keys_, lease.name, reader_id_, lease.generation, ttl_)) {
      continue;  // renewed in time
    }
    // The lease was gone: it lapsed (Redis unreachable, or this process stopped, for longer
    // than the ttl) and GC dropped it, or the dataset was removed. The generation may be gone.
    const bool exists =
        client_
            .command({"SISMEMBER", keys_.generations(lease.name), std::to_string(lease.generation)})
            .expect_ok("SISMEMBER gens")
            .integer() > 0;
    if (exists) {
      spdlog::warn(
          "dataset '{}': the lease on generation {} had lapsed (no refresh for over {} s); "
          "renewed it",
          lease.name, lease.generation, seconds(ttl_));
      continue;
    }
    catalog::unpin_generation(client_, keys_, lease.name, reader_id_, lease.generation);
    {
      MutexLock lock(mutex_);
      std::erase_if(leases_, [&](const Lease& l) {
        return l.name == lease.name && l.generation == lease.generation;
      });
    }
    spdlog::error(
        "dataset '{}': generation {}, which this mount serves, is gone (removed with `dsfs rm`, "
        "or collected while the mount's lease had lapsed); reads of files not yet cached fail "
        "with EIO; `dsfs refresh` (or a remount) serves the current one",
        lease.name, lease.generation);
  }
  MutexLock lock(mutex_);
  ++refreshes_;
}

void GenerationLeases::refresh_loop(std::stop_token stop) {
  const auto interval = std::max(ttl_ / 3, std::chrono::milliseconds{1});
  auto wait = interval;
  unsigned failures = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      // Sleeps until the next refresh, or returns at once when release() asks to stop.
      wake_.wait_for(lock, stop, wait, [] { return false; });
    }
    if (stop.stop_requested()) return;
    try {
      refresh_all();
      if (failures > 0) spdlog::info("lease refreshes work again after {} failure(s)", failures);
      failures = 0;
      wait = interval;
    } catch (const std::exception& e) {
      // Never fatal: the mount keeps serving from its snapshot, and the leases stay valid for
      // up to ttl after the last refresh that worked.
      wait = std::min(interval, kLeaseFirstRetry * (1u << std::min(failures, 10u)));
      ++failures;
      {
        MutexLock lock(mutex_);
        ++refresh_failures_;
      }
      spdlog::warn("cannot refresh this mount's leases on its generations ({}); retrying in {} s",
                   e.what(), seconds(wait));
    }
  }
}

void GenerationLeases::release() {
  if (refresher_.joinable()) {
    refresher_.request_stop();
    refresher_.join();
  }
  std::vector<Lease> leases;
  {
    MutexLock lock(mutex_);
    if (released_) return;
    released_ = true;
    leases.swap(leases_);
  }
  size_t released = 0;
  for (const Lease& lease : leases) {
    try {
      catalog::unpin_generation(client_, keys_, lease.name, reader_id_, lease.generation);
      ++released;
    } catch (const store::ConnectionError& e) {
      // Redis is away: the others would fail the same way, each after a timeout.
      spdlog::warn(
          "cannot release this mount's leases on {} generation(s) ({}); they expire "
          "within {} s",
          leases.size() - released, e.what(), seconds(ttl_));
      break;
    } catch (const std::exception& e) {
      spdlog::warn(
          "dataset '{}': cannot release this mount's lease on generation {} ({}); it expires "
          "within {} s",
          lease.name, lease.generation, e.what(), seconds(ttl_));
    }
  }
  if (released > 0) spdlog::debug("released {} lease(s) of reader {}", released, reader_id_);
}

// ---- loading ----------------------------------------------------------------------------------

std::vector<prefetch::DatasetSnapshot> load_datasets(store::Client& client,
                                                     const catalog::KeySchema& keys,
                                                     const std::vector<std::string>& names,
                                                     GenerationLeases* leases) {
  std::vector<std::string> wanted;
  const bool explicit_names = !names.empty();
  if (explicit_names) {
    std::set<std::string> seen;
    for (const std::string& name : names) {
      catalog::validate_dataset_name(name);
      if (seen.insert(name).second) wanted.push_back(name);
    }
  } else {
    wanted = catalog::list_datasets(client, keys);
    std::sort(wanted.begin(), wanted.end());
  }

  std::vector<prefetch::DatasetSnapshot> datasets;
  for (const std::string& name : wanted) {
    if (name == kMetaDirName || name == kControlDirName || name == kViewsDirName) {
      const std::string message = fmt::format(
          "dataset '{}' cannot be mounted: its name is taken by the mount's own {} directory; "
          "re-ingest it under another name",
          store::log_text(name), store::log_text(name));
      if (explicit_names) throw std::runtime_error(message);
      spdlog::warn("{}", message);
      continue;
    }
    prefetch::DatasetSnapshot snapshot;
    snapshot.index = static_cast<uint32_t>(datasets.size());
    const auto started = std::chrono::steady_clock::now();
    try {
      // Pinned before loading: from here on no re-ingest's GC can delete what the mount serves.
      snapshot.info = leases ? leases->pin_current(name) : catalog::read_info(client, keys, name);
      snapshot.catalog = catalog::load_catalog(client, keys, snapshot.info);
    } catch (const store::ConnectionError&) {
      throw;
    } catch (const std::runtime_error& e) {
      // Damaged (corrupt or mistyped info, a missing or corrupt manifest) or of a newer schema.
      // A dataset the user named is an error; one of "all datasets" is skipped, so that one bad
      // dataset does not take the others down, and its lease is dropped so `dsfs rm` can
      // remove it while this mount lives.
      if (explicit_names) throw;
      spdlog::warn("dataset '{}' skipped: {}", name, store::log_text(e.what(), 400));
      try {
        if (leases) leases->unpin(name);
      } catch (const store::ReplyError& unpin_error) {
        spdlog::warn("dataset '{}': cannot drop this mount's lease ({}); it expires by itself",
                     name, store::log_text(unpin_error.what()));
      }
      continue;
    }
    spdlog::info(
        "dataset '{}' generation {}: {} files, {} directories, {:.1f} MB, catalogue loaded "
        "in {:.2f} s ({:.1f} MB in memory)",
        name, snapshot.info.generation, snapshot.catalog->file_count(),
        snapshot.catalog->directory_count(), snapshot.catalog->total_bytes() / 1e6,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(),
        snapshot.catalog->memory_bytes() / 1e6);
    datasets.push_back(std::move(snapshot));
  }
  return datasets;
}

// ---- Session ----------------------------------------------------------------------------------

Session::Session(Filesystem& filesystem, SessionOptions options)
    : options_(std::move(options)), filesystem_(filesystem) {
  // Not "ro": .dsfs/plan takes writes. Every other change is answered EROFS by the filesystem.
  std::string mount_options = "fsname=dsfs,subtype=dsfs,default_permissions";
  for (const std::string& option : options_.fuse_options) {
    if (option.empty()) continue;
    mount_options += "," + option;
    if (option.starts_with("max_read=")) {
      filesystem.set_max_read(static_cast<uint32_t>(std::strtoul(option.c_str() + 9, nullptr, 10)));
    }
  }
  // fuse_opt_add_arg copies each argument; fuse_opt_free_args releases them.
  struct Args {
    fuse_args args = FUSE_ARGS_INIT(0, nullptr);
    ~Args() { fuse_opt_free_args(&args); }
  } fuse_args;
  for (const char* arg : {"dsfs", "-o", mount_options.c_str()}) {
    if (fuse_opt_add_arg(&fuse_args.args, arg) != 0) throw std::bad_alloc();
  }
  if (options_.debug && fuse_opt_add_arg(&fuse_args.args, "-d") != 0) throw std::bad_alloc();
  session_ = fuse_session_new(&fuse_args.args, &Filesystem::operations(), sizeof(fuse_lowlevel_ops),
                              &filesystem);
  if (!session_) {
    throw std::runtime_error(fmt::format(
        "cannot create the FUSE session: bad mount options '{}' (libfuse printed why above)",
        mount_options));
  }
  if (fuse_session_mount(session_, options_.mountpoint.c_str()) != 0) {
    fuse_session_destroy(std::exchange(session_, nullptr));
    throw std::runtime_error(fmt::format(
        "cannot mount on {}: FUSE refused (is /dev/fuse available and fusermount3 installed?)",
        options_.mountpoint.string()));
  }
  mounted_ = true;
  filesystem.attach_session(session_);
}

Session::~Session() {
  if (signal_handlers_) fuse_remove_signal_handlers(session_);
  unmount();
  fuse_session_destroy(session_);
}

int Session::run() {
  struct LoopConfig {
    fuse_loop_config* config = fuse_loop_cfg_create();
    ~LoopConfig() { fuse_loop_cfg_destroy(config); }
  } loop;
  if (!loop.config) throw std::bad_alloc();
  const unsigned threads = std::max(options_.threads, 1u);
  fuse_loop_cfg_set_max_threads(loop.config, threads);
  fuse_loop_cfg_set_idle_threads(loop.config, threads);
  // A /dev/fuse descriptor per thread: requests are not funnelled through one queue.
  fuse_loop_cfg_set_clone_fd(loop.config, 1);
  return fuse_session_loop_mt(session_, loop.config);
}

void Session::exit() {
  fuse_session_exit(session_);
}

void Session::unmount() {
  if (!mounted_) return;
  mounted_ = false;
  filesystem_.attach_session(nullptr);
  fuse_session_unmount(session_);
}

void Session::install_signal_handlers() {
  if (signal_handlers_) return;
  if (fuse_set_signal_handlers(session_) != 0) {
    throw std::runtime_error("cannot install the SIGINT/SIGTERM/SIGHUP handlers");
  }
  signal_handlers_ = true;
}

void set_readahead(dev_t device, uint64_t bytes) {
  const std::filesystem::path knob =
      fmt::format("/sys/class/bdi/{}:{}/read_ahead_kb", major(device), minor(device));
  const std::string value = fmt::format("{}\n", (bytes + 1023) / 1024);
  const int fd = ::open(knob.c_str(), O_WRONLY | O_CLOEXEC);
  const bool written =
      fd >= 0 && ::write(fd, value.data(), value.size()) == static_cast<ssize_t>(value.size());
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!written) {
    spdlog::info("cannot set readahead through {}: {}; keeping the kernel's", knob.string(),
                 std::strerror(error));
    return;
  }
  spdlog::debug("readahead {} KiB via {}", (bytes + 1023) / 1024, knob.string());
}

// ---- Mount ------------------------------------------------------------------------------------

Mount::Mount(std::shared_ptr<store::Client> client, std::vector<prefetch::DatasetSnapshot> datasets,
             MountOptions options)
    : filesystem_(std::make_unique<Filesystem>(std::move(client), std::move(datasets),
                                               std::move(options.filesystem))) {
  filesystem_->start_views();
  filesystem_->start_prefetch();
  session_ = std::make_unique<Session>(*filesystem_, std::move(options.session));
  filesystem_->start_watching();
  loop_ = std::async(std::launch::async, [session = session_.get()] { return session->run(); });
}

Mount::~Mount() {
  session_->exit();
  // Unmounting ends the connection once nothing on the mount is open any more; the serving
  // threads then see it gone and return.
  session_->unmount();
  while (loop_.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
    spdlog::warn("{} is unmounted but files on it are still open; waiting for them to be closed",
                 session_->mountpoint().string());
  }
  try {
    loop_.get();
  } catch (const std::exception& e) {
    spdlog::error("the FUSE loop of {} failed: {}", session_->mountpoint().string(), e.what());
  }
  session_.reset();
  filesystem_.reset();
}

// ---- DaemonLock -------------------------------------------------------------------------------

namespace {

std::filesystem::path runtime_directory() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg && *xdg) return std::filesystem::path(xdg) / "dsfs";
  return std::filesystem::path("/tmp") / fmt::format("dsfs-{}", geteuid());
}

int read_pid(int fd) {
  char text[64] = {};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  return n > 0 ? std::atoi(text) : 0;
}

}  // namespace

std::filesystem::path DaemonLock::path_for(const std::filesystem::path& mountpoint) {
  const std::string& text = mountpoint.native();
  return runtime_directory() /
         fmt::format("mount-{:016x}.lock", XXH64(text.data(), text.size(), 0));
}

DaemonLock::DaemonLock(const std::filesystem::path& mountpoint)
    : path_(path_for(mountpoint)), mountpoint_(mountpoint) {
  const std::filesystem::path dir = path_.parent_path();
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw std::system_error(errno, std::generic_category(), "cannot create " + dir.string());
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
    throw std::runtime_error(
        fmt::format("{} is not a directory owned by this user; remove it or set XDG_RUNTIME_DIR",
                    dir.string()));
  }
  fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd_ < 0) {
    throw std::system_error(errno, std::generic_category(), "cannot open " + path_.string());
  }
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int holder = read_pid(fd_);
    close(std::exchange(fd_, -1));
    throw std::runtime_error(fmt::format(
        "another dsfs daemon (pid {}) is still serving or shutting down {}; wait for it to exit",
        holder, mountpoint.string()));
  }
  record_pid();
}

void DaemonLock::record_pid() {
  const std::string note = fmt::format("{}\n{}\n", getpid(), mountpoint_.string());
  if (ftruncate(fd_, 0) != 0 ||
      pwrite(fd_, note.data(), note.size(), 0) != static_cast<ssize_t>(note.size())) {
    spdlog::debug("cannot record the daemon pid in {}", path_.string());
  }
}

DaemonLock::~DaemonLock() {
  if (fd_ < 0) return;
  // Unlink while still holding the lock, so a waiter never mistakes a stale file for a daemon.
  unlink(path_.c_str());
  close(fd_);
}

bool DaemonLock::wait_released(const std::filesystem::path& mountpoint,
                               std::chrono::milliseconds wait, int* holder_pid) {
  const std::filesystem::path path = path_for(mountpoint);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return true;  // no daemon has it
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) return true;
    if (std::chrono::steady_clock::now() >= deadline) {
      if (holder_pid) *holder_pid = read_pid(fd);
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace dsfs::fs
