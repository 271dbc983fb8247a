#include "fs/mount_command.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <poll.h>
#include <spawn.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "fs/filesystem.h"
#include "fs/inodes.h"
#include "fs/metrics_server.h"
#include "fs/mount.h"
#include "prefetch/disk_tier.h"
#include "src/catalog/dataset.h"
#include "src/catalog/keys.h"
#include "src/catalog/names.h"
#include "src/store/embedded_server.h"
#include "src/store/errors.h"
#include "src/store/log_text.h"
#include "src/store/value_buffer.h"

extern char** environ;

namespace dsfs::fs {
namespace {

// How long `dsfs mount` waits for its daemon to answer a first request.
constexpr std::chrono::milliseconds kReadyWait{30000};
// Below this a disk tier holds hardly an image (each takes a 4 KiB block at least, and a chunk up
// to 4 MiB): a size like 4096 (a missing unit) is refused, not left to cache nothing.
constexpr uint64_t kMinDiskCacheBytes = uint64_t{1} << 20;
// Below this --cache-size holds few files (a warning says so).
constexpr uint64_t kSmallCacheBytes = uint64_t{8} << 20;

struct MountArgs {
  std::string mountpoint;
  std::vector<std::string> datasets;
  std::vector<std::string> fuse_options;
  bool foreground = false;
  bool debug_fuse = false;
  uint64_t cache_bytes = default_cache_bytes();
  std::string disk_cache;
  uint64_t disk_cache_bytes = 0;
  unsigned disk_cache_readers = kDefaultDiskStagers;
  bool disk_cache_page_cache = false;
  double timeout_s = 30;
  double lease_ttl_s = static_cast<double>(kDefaultLeaseTtl.count()) / 1000.0;
  bool verify = false;
  unsigned threads = kDefaultThreads;
  unsigned connections = kDefaultConnections;
  std::string read_from = "primary";
  uint64_t readahead_bytes = kDefaultReadahead;
  std::string view_backend = "auto";
  std::string prefetch = "auto";
  unsigned max_inflight = 0;
  uint64_t view_cache_bytes = kDefaultViewCacheBytes;
  std::string view_render_ahead = "auto";
  uint64_t view_max_pixels = view::kDefaultMaxPixels;
  uint64_t view_render_memory_bytes = view::kDefaultRenderMemoryBytes;
  std::string log_file;
  double watch_interval_s = static_cast<double>(kDefaultWatchInterval.count()) / 1000.0;
  bool follow_updates = false;
  std::string metrics_listen;  // empty: no metrics endpoint
};

struct RefreshArgs {
  std::string mountpoint;
  std::vector<std::string> datasets;
};

struct UmountArgs {
  std::string mountpoint;
  bool lazy = false;
  double wait_s = 10;
};

// --view-render-ahead: "auto" (a thread per core) or a count up to 256.
unsigned render_ahead_threads(const std::string& text) {
  if (text == "auto") return std::max(1u, std::thread::hardware_concurrency());
  unsigned threads = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), threads);
  if (error != std::errc() || end != text.data() + text.size() || threads > 256) {
    throw std::invalid_argument(
        fmt::format("'{}' is not auto or a number of threads from 0 to 256", text));
  }
  return threads;
}

// Object buffers are allocated on the fetch threads and freed on whichever thread evicts them;
// with glibc's default of 8 arenas per core, each arena kept its own high-water mark of freed
// buffers (measured: 2-3x less RSS beyond the cache with 2, at the same throughput). Call before
// the daemon starts its threads; MALLOC_ARENA_MAX in the environment wins.
//
// Object buffers (100 KB to a few MiB) are also kept off mmap: above glibc's threshold (128 KiB
// at first) each one was mmapped and unmapped again on eviction, so every object fetched paid
// fresh pages, a page fault and zeroing per 4 KiB. From the arenas, an evicted object's memory
// is reused by the next. Measured on a VM whose page faults cost 12 us: a first epoch with a
// 25% cache, 3,000 files, 3,029-3,113 -> 3,524-3,573 files/s, 430 -> 325 us of daemon CPU per
// file (docs/benchmarks.md). glibc's own settings in the environment win.
void tune_malloc() {
  cli::tune_malloc(/*arenas=*/2, /*mmap_threshold=*/32 << 20);  // the most glibc accepts
}

// Units for durations: a bare number is seconds.
CLI::AsNumberWithUnit duration_units() {
  return CLI::AsNumberWithUnit(
      std::map<std::string, double>{{"ms", 0.001}, {"s", 1.0}, {"m", 60.0}, {"min", 60.0}});
}

std::filesystem::path default_log_file(const std::filesystem::path& mountpoint) {
  const std::string base = mountpoint.filename().empty() ? "root" : mountpoint.filename().string();
  return store::EmbeddedServer::default_home() / "logs" / fmt::format("mount-{}.log", base);
}

// Sends every log line to `path` from now on (the daemon's stderr is /dev/null).
void log_to_file(const std::filesystem::path& path, const std::string& level) {
  if (std::error_code error;
      !std::filesystem::create_directories(path.parent_path(), error) && error) {
    throw std::runtime_error(fmt::format(
        "cannot create {} for the mount's log: {}; give --log-file a writable place (or set "
        "DSFS_HOME to a writable directory)",
        store::log_text(path.parent_path().string()), error.message()));
  }
  // Only its owner may read it (it names datasets, paths and the Redis endpoint): created 0600,
  // and an existing file made so, before spdlog appends to it.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0 || ::fchmod(fd, 0600) != 0) {
    const int error = errno;
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(
        fmt::format("cannot create the log file {}: {}", path.string(), std::strerror(error)));
  }
  ::close(fd);
  auto logger = spdlog::basic_logger_mt("dsfs-mount", path.string());
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e [%P] %l %v");
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::trace);  // a daemon may be killed; keep every line
  spdlog::set_default_logger(logger);
}

// The daemon's report on the pipe from daemonize_when_ready: 'R' (serving), or 'F' and why not.
void report_failure(int ready_fd, std::string_view why) {
  // One write below PIPE_BUF arrives whole, so the parent reads it in one go.
  const std::string message = fmt::format("F{}", why.substr(0, 4000));
  if (::write(ready_fd, message.data(), message.size()) < 0) {
    spdlog::debug("the mount command has gone");
  }
}

// Forks. The parent waits until the child reports the mount serving (exit 0) or failing (exit
// 1, printing the reason the child sent) and never returns; the child detaches from the
// terminal and gets the descriptor to report on. Unlike fuse_daemonize(), the caller's exit
// status says whether the mount really works.
int daemonize_when_ready(const std::filesystem::path& mountpoint,
                         const std::filesystem::path& log_file, size_t dataset_count) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw std::system_error(errno, std::generic_category(), "cannot create a pipe");
  }
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child < 0) throw std::system_error(errno, std::generic_category(), "cannot fork");
  if (child > 0) {
    ::close(fds[1]);
    pollfd wait_for{.fd = fds[0], .events = POLLIN, .revents = 0};
    int polled = 0;
    do {
      polled = ::poll(&wait_for, 1, static_cast<int>(kReadyWait.count()));
    } while (polled < 0 && errno == EINTR);
    char report[4096] = {};
    ssize_t got = 0;
    if (polled > 0) {
      do {
        got = ::read(fds[0], report, sizeof report);
      } while (got < 0 && errno == EINTR);
    }
    if (got > 0 && report[0] == 'R') {
      fmt::print(stderr,
                 "dsfs: mounted {} dataset(s) on {}; log: {}; unmount with `dsfs umount {}`\n",
                 dataset_count, mountpoint.string(), log_file.string(), mountpoint.string());
      ::_exit(0);  // no destructors: the mount now belongs to the child
    }
    if (polled == 0) ::kill(child, SIGTERM);
    if (got > 1 && report[0] == 'F') {
      fmt::print(stderr, "dsfs: error: {} (the mount daemon for {} gave up; its log is {})\n",
                 std::string_view(report + 1, static_cast<size_t>(got - 1)), mountpoint.string(),
                 log_file.string());
      ::_exit(1);
    }
    fmt::print(stderr, "dsfs: error: the mount daemon for {} {}; its log is {}\n",
               mountpoint.string(), polled == 0 ? "did not become ready" : "failed",
               log_file.string());
    ::_exit(1);
  }
  ::close(fds[0]);
  ::setsid();
  if (::chdir("/") != 0) spdlog::debug("cannot chdir to /");
  const int null_fd = ::open("/dev/null", O_RDWR);
  if (null_fd >= 0) {
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(null_fd, STDOUT_FILENO);
    ::dup2(null_fd, STDERR_FILENO);
    if (null_fd > STDERR_FILENO) ::close(null_fd);
  }
  return fds[1];
}

void run_mount(const MountArgs& args, const cli::GlobalOptions& global) {
  cli::apply_log_level(global);
  const std::filesystem::path mountpoint = check_mountpoint(args.mountpoint);
  if (args.timeout_s <= 0) throw std::invalid_argument("--timeout must be positive");
  if (args.lease_ttl_s < 1) throw std::invalid_argument("--lease-ttl must be at least 1s");
  if (args.watch_interval_s < 0) throw std::invalid_argument("--watch-interval cannot be negative");
  if (!args.disk_cache.empty() && args.disk_cache_bytes == 0) {
    throw std::invalid_argument("--disk-cache needs a --disk-cache-size above 0 (e.g. 200GiB)");
  }
  if (!args.disk_cache.empty() && args.disk_cache_bytes < kMinDiskCacheBytes) {
    throw std::invalid_argument(fmt::format(
        "--disk-cache-size {} bytes holds no object worth keeping: give at least 1MiB (size it "
        "to the dataset, e.g. 200GiB)",
        args.disk_cache_bytes));
  }
  if (!args.disk_cache.empty()) {
    // Its files would be written through this mount, which refuses every write.
    const std::filesystem::path tier = std::filesystem::weakly_canonical(args.disk_cache);
    const auto [end, _] =
        std::mismatch(mountpoint.begin(), mountpoint.end(), tier.begin(), tier.end());
    if (end == mountpoint.end()) {
      throw std::invalid_argument(
          fmt::format("--disk-cache {} is inside the mountpoint {}: give a directory outside it",
                      tier.string(), mountpoint.string()));
    }
  }
  // Bound before anything is mounted, so a port in use fails here; served by the daemon.
  std::optional<MetricsListener> metrics_listener;
  if (!args.metrics_listen.empty()) {
    metrics_listener.emplace(parse_listen_address(args.metrics_listen));
  }
  const catalog::KeySchema keys(global.ns);
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
  FilesystemOptions fs_options;
  fs_options.timeout = timeout;
  fs_options.connections = args.connections;
  fs_options.read_from = store::parse_read_from(args.read_from);
  // One client for the whole mount: catalogue loads, leases, the watcher, reads and prefetch.
  std::shared_ptr<store::Client> client = cli::make_client(global, client_options(fs_options));
  if (client->is_cluster()) {
    spdlog::info("Redis at {} is a cluster of {} nodes; reads from {}", client->describe(),
                 client->nodes().size(), store::to_string(fs_options.read_from));
  }

  // Pins every generation the mount serves so re-ingests cannot collect it; released at the
  // end of a clean unmount, expired after the ttl if this process dies. A client of its own
  // with short timeouts: a stalled Redis must not hold up an unmount long, and a refresh that
  // fails is simply retried later.
  std::shared_ptr<store::Client> lease_client = cli::make_client(
      global, store::ClientOptions{.connect = {.connect_timeout = std::chrono::milliseconds{1000},
                                               .io_timeout = std::chrono::milliseconds{3000}},
                                   .connections_per_node = 2,
                                   .retry_budget = std::chrono::milliseconds{3000}});
  GenerationLeases leases(*lease_client, keys,
                          std::chrono::milliseconds(static_cast<int64_t>(args.lease_ttl_s * 1000)));
  std::vector<prefetch::DatasetSnapshot> datasets =
      load_datasets(*client, keys, args.datasets, &leases);
  if (args.cache_bytes < kSmallCacheBytes) {
    // Accepted (tests and tiny machines use it), but not silently: with --cache-size 0 or 64KiB
    // nothing was prefetched and every file was read past the cache, without a word.
    spdlog::warn(
        "--cache-size {} holds few files: a file larger than it is read past the cache, and "
        "little is prefetched ahead; give at least {} (the default is {})",
        store::mib_text(args.cache_bytes), store::mib_text(kSmallCacheBytes),
        store::mib_text(default_cache_bytes()));
  }
  try {
    if (const std::string risk = catalog::eviction_risk(*client); !risk.empty()) {
      spdlog::warn(
          "{}: files of its datasets can be evicted, and their reads then fail with EIO; set "
          "maxmemory-policy noeviction",
          risk);
    }
  } catch (const store::ConnectionError& e) {
    // A primary down (a shard of a cluster) does not keep the mount from serving the others.
    spdlog::debug("cannot ask every primary for its maxmemory-policy: {}", e.what());
  }
  if (datasets.empty()) {
    spdlog::warn(
        "no dataset of namespace '{}' on {} can be served (none is published, or each was "
        "skipped: see above); the mount shows only .meta and .dsfs (ingest one with `dsfs "
        "ingest`)",
        global.ns, client->describe());
  }

  DaemonLock lock(mountpoint);
  std::filesystem::path log_file;
  if (!args.foreground) {
    log_file = args.log_file.empty()
                   ? default_log_file(mountpoint)
                   : std::filesystem::absolute(args.log_file);  // "m.log" alone too
    log_to_file(log_file, global.log_level);
  }

  fs_options.ns = global.ns;
  fs_options.cache_bytes = args.cache_bytes;
  fs_options.verify = args.verify;
  fs_options.view_backend = view::parse_backend_kind(args.view_backend);
  fs_options.view_cache_bytes = args.view_cache_bytes;
  fs_options.view_render_ahead_threads = render_ahead_threads(args.view_render_ahead);
  fs_options.view_max_pixels = args.view_max_pixels;
  fs_options.view_render_memory_bytes = args.view_render_memory_bytes;
  fs_options.prefetch = prefetch::parse_prefetch_mode(args.prefetch);
  fs_options.max_inflight = args.max_inflight;
  fs_options.disk_stagers = args.disk_cache_readers;
  fs_options.watch = WatchOptions{
      .names = args.datasets,
      .interval = std::chrono::milliseconds(static_cast<int64_t>(args.watch_interval_s * 1000)),
      .follow_updates = args.follow_updates};
  fs_options.leases = &leases;
  fs_options.control_client = lease_client.get();
  // Opened before the fork, so a directory another mount holds is refused on the terminal; its
  // writer thread starts in the daemon.
  std::unique_ptr<prefetch::DiskTier> disk_tier;
  if (!args.disk_cache.empty()) {
    disk_tier = std::make_unique<prefetch::DiskTier>(prefetch::DiskTierOptions{
        .dir = std::filesystem::absolute(args.disk_cache),
        .capacity_bytes = args.disk_cache_bytes,
        .direct_io = !args.disk_cache_page_cache,
        .follows_epochs = fs_options.prefetch != prefetch::PrefetchMode::kOff});
    fs_options.disk_tier = disk_tier.get();
  }
  const size_t dataset_count = datasets.size();
  Filesystem filesystem(client, std::move(datasets), fs_options);
  Session session(filesystem, SessionOptions{.mountpoint = mountpoint,
                                             .fuse_options = args.fuse_options,
                                             .threads = args.threads,
                                             .debug = args.debug_fuse});
  spdlog::info(
      "mounted {} dataset(s) from {} (namespace '{}') on {}; cache {}, timeout {} s{}{}",
      dataset_count, client->describe(), global.ns, store::log_text(mountpoint.string()),
      store::mib_text(args.cache_bytes), args.timeout_s, args.verify ? ", verifying checksums" : "",
      disk_tier ? fmt::format(", disk cache {} ({} MiB)", disk_tier->options().dir.string(),
                              args.disk_cache_bytes >> 20)
                : "");

  int ready_fd = -1;
  if (!args.foreground) {
    ready_fd = daemonize_when_ready(mountpoint, log_file, dataset_count);
    lock.record_pid();
  }
  tune_malloc();
  // Buffers of evicted objects are kept for the next ones, up to a sixteenth of the cache beside
  // it (src/store/value_buffer.h).
  store::set_value_buffer_reuse_limit(args.cache_bytes / 16);
  // Declared after the filesystem, so it stops before what it reports on goes.
  std::optional<MetricsServer> metrics;
  // After the fork: CUDA state does not survive one.
  try {
    filesystem.start_views();
    filesystem.start_prefetch();
    if (disk_tier) disk_tier->start();
    if (metrics_listener) {
      metrics.emplace(std::move(*metrics_listener),
                      [&filesystem] { return filesystem.metrics_text(); });
    }
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    if (ready_fd >= 0) report_failure(ready_fd, e.what());
    throw cli::ExitCode{1};
  }
  leases.start_refreshing();  // after the fork: the thread must run in the daemon
  filesystem.start_watching();
  filesystem.start_memory_trimming();
  session.install_signal_handlers();
  // Reports readiness once a real request has been answered: stat() of the mount's root only
  // returns after the kernel's INIT and a GETATTR went through this process. Readahead is set
  // then too, since INIT caps it at the kernel's default.
  std::thread readiness([&mountpoint, ready_fd, readahead = args.readahead_bytes] {
    struct stat st {};
    const bool serving = ::stat(mountpoint.c_str(), &st) == 0 && st.st_ino == kRootInode;
    if (serving && readahead != 0) set_readahead(st.st_dev, readahead);
    if (ready_fd < 0) return;
    if (serving) {
      if (::write(ready_fd, "R", 1) != 1) spdlog::debug("the mount command has gone");
    } else {
      report_failure(ready_fd,
                     fmt::format("{} did not answer a stat() of its root", mountpoint.string()));
    }
    ::close(ready_fd);
  });
  int result = 0;
  std::exception_ptr failure;
  try {
    result = session.run();
  } catch (...) {
    failure = std::current_exception();
  }
  // Unmount before joining: a stat() still waiting would otherwise wait forever.
  session.unmount();
  if (readiness.joinable()) readiness.join();
  // Before the daemon lock goes: once `dsfs umount` returns, an ingest may collect them.
  leases.release();
  if (failure) std::rethrow_exception(failure);
  if (result > 0) {
    spdlog::info("{} received; unmounted {}", strsignal(result), mountpoint.string());
  } else if (result < 0) {
    spdlog::error("the FUSE loop of {} failed: {}", mountpoint.string(), std::strerror(-result));
    throw cli::ExitCode{1};
  } else {
    spdlog::info("{} was unmounted; exiting", mountpoint.string());
  }
}

// Runs fusermount3 (for users who may not call umount2 themselves); true on success.
bool run_fusermount(const std::filesystem::path& mountpoint, bool lazy) {
  std::vector<std::string> argv_strings = {"fusermount3", "-u"};
  if (lazy) argv_strings.emplace_back("-z");
  argv_strings.push_back(mountpoint.string());
  std::vector<char*> argv;
  for (std::string& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawnp(&pid, "fusermount3", nullptr, nullptr, argv.data(), environ) != 0) {
    throw std::runtime_error("cannot run fusermount3: install Debian's fuse3 package");
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void run_umount(const UmountArgs& args) {
  // A dead mount (its daemon killed) cannot be stat()ed, so look it up lexically first.
  std::filesystem::path mountpoint = std::filesystem::absolute(args.mountpoint).lexically_normal();
  if (!mountpoint.has_filename() && mountpoint.has_parent_path() && mountpoint != "/") {
    mountpoint = mountpoint.parent_path();
  }
  std::optional<MountInfo> mounted = find_mount(mountpoint);
  if (!mounted) {
    std::error_code error;
    const std::filesystem::path real = std::filesystem::canonical(mountpoint, error);
    if (error) {
      throw std::runtime_error(
          fmt::format("{} is not mounted ({})", mountpoint.string(), error.message()));
    }
    mountpoint = real;
    mounted = find_mount(mountpoint);
  }
  if (!mounted) throw std::runtime_error(fmt::format("{} is not mounted", mountpoint.string()));
  if (mounted->fs_type != kMountType) {
    throw std::runtime_error(fmt::format("{} is not a dsfs mount (it is {} from {})",
                                         mountpoint.string(), mounted->fs_type, mounted->source));
  }

  if (geteuid() == 0) {
    if (umount2(mountpoint.c_str(), args.lazy ? MNT_DETACH : 0) != 0) {
      if (errno == EBUSY) {
        throw std::runtime_error(fmt::format(
            "{} is busy: a process has a file or its working directory there (see `fuser -vm "
            "{}`); close them, or detach now with `dsfs umount --lazy`",
            mountpoint.string(), mountpoint.string()));
      }
      throw std::runtime_error(
          fmt::format("cannot unmount {}: {}", mountpoint.string(), std::strerror(errno)));
    }
  } else if (!run_fusermount(mountpoint, args.lazy)) {
    throw std::runtime_error(fmt::format("fusermount3 could not unmount {} (its message is above)",
                                         mountpoint.string()));
  }

  if (args.lazy) {
    fmt::print(stderr, "dsfs: detached {}; its daemon exits once the files open there are closed\n",
               mountpoint.string());
    return;
  }
  int holder = 0;
  const auto wait = std::chrono::milliseconds(static_cast<int64_t>(args.wait_s * 1000));
  if (!DaemonLock::wait_released(mountpoint, wait, &holder)) {
    throw std::runtime_error(
        fmt::format("{} is unmounted, but its dsfs daemon (pid {}) has not exited after {} s",
                    mountpoint.string(), holder, args.wait_s));
  }
}

}  // namespace

// The "datasets" object of MOUNT/.dsfs/stats.json: name -> generation.
std::map<std::string, uint64_t> mounted_generations(const std::filesystem::path& mountpoint) {
  const std::filesystem::path stats = mountpoint / kControlDirName / kStatsFileName;
  std::ifstream in(stats);
  if (!in) {
    throw std::runtime_error(cli::unreadable_in_mount(stats.string(), mountpoint.string(), errno));
  }
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  std::map<std::string, uint64_t> generations;
  if (!json.is_object() || !json.contains("datasets") || !json["datasets"].is_object()) {
    throw std::runtime_error(fmt::format("{} has no datasets section", stats.string()));
  }
  for (const auto& [name, d] : json["datasets"].items()) {
    generations[name] = d.value("generation", uint64_t{0});
  }
  return generations;
}

void run_refresh(const RefreshArgs& args) {
  const std::filesystem::path mountpoint = args.mountpoint;
  for (const std::string& name : args.datasets) catalog::validate_dataset_name(name);
  const std::map<std::string, uint64_t> before = mounted_generations(mountpoint);
  const std::filesystem::path file = mountpoint / kControlDirName / kRefreshFileName;
  const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    throw std::runtime_error(
        fmt::format("cannot open {}: {}{}", file.string(), std::strerror(error),
                    error == ENOENT  ? "; is this a dsfs mount of version 0.2 or later?"
                    : error == EROFS ? "; the mount was made read-only (-o ro): remount it without"
                                     : ""));
  }
  std::string request;
  for (const std::string& name : args.datasets) request += name + "\n";
  if (request.empty()) request = "\n";
  const ssize_t written = ::write(fd, request.data(), request.size());
  const int error = errno;
  ::close(fd);
  if (written < 0) {
    // The mount answers with one errno for the whole request: which name it was is in its log.
    std::string named;
    for (const std::string& name : args.datasets) {
      named += fmt::format("{}'{}'", named.empty() ? "" : ", ", store::log_text(name));
    }
    const std::string which =
        args.datasets.size() == 1
            ? fmt::format("dataset {}", named)
            : fmt::format("one of the datasets {} (the mount's log says which)", named);
    switch (error) {
      case ENOENT:
        throw std::runtime_error(fmt::format(
            "{} is not published (see `dsfs list`); nothing was refreshed on {}",
            args.datasets.empty() ? std::string("a dataset") : which, mountpoint.string()));
      case EINVAL:
        throw std::runtime_error(fmt::format("the name of {} is not valid", which));
      default:
        throw std::runtime_error(fmt::format(
            "refresh of {} failed: {}; the mount's log says why (Redis unreachable, or a "
            "damaged dataset)",
            mountpoint.string(), std::strerror(error)));
    }
  }
  const std::map<std::string, uint64_t> after = mounted_generations(mountpoint);
  bool any = false;
  for (const auto& [name, generation] : after) {
    const auto was = before.find(name);
    if (was == before.end()) {
      fmt::print("{}: appeared (generation {})\n", name, generation);
      any = true;
    } else if (was->second != generation) {
      fmt::print("{}: generation {} -> {}\n", name, was->second, generation);
      any = true;
    } else if (args.datasets.empty() ||
               std::find(args.datasets.begin(), args.datasets.end(), name) != args.datasets.end()) {
      fmt::print("{}: generation {}, already current\n", name, generation);
    }
  }
  for (const auto& [name, generation] : before) {
    if (!after.contains(name)) {
      fmt::print("{}: removed (was generation {})\n", name, generation);
      any = true;
    }
  }
  if (!any && after.empty()) fmt::print("no datasets are published; the mount is empty\n");
}

void register_mount_commands(CLI::App& app, cli::GlobalOptions& global) {
  auto mount_args = std::make_shared<MountArgs>();
  CLI::App* mount = app.add_subcommand(
      "mount",
      "Mount published datasets as a read-only filesystem: MOUNTPOINT/NAME/... for each dataset, "
      "MOUNTPOINT/.meta/NAME/ for labels and metadata, MOUNTPOINT/.views/SPEC/NAME/... for every "
      "image as a preprocessed .npy tensor (SPEC: a preset such as imagenet-eval, or e.g. "
      "resize=256,crop=224,dtype=float16,layout=chw,norm=imagenet), "
      "MOUNTPOINT/.dsfs/stats.json for counters. "
      "Returns once the mount is ready and keeps serving in the background (-f: in the "
      "foreground).");
  mount
      ->add_option("MOUNTPOINT", mount_args->mountpoint,
                   "An existing directory; what it holds is hidden while mounted")
      ->required();
  mount->add_option("--dataset", mount_args->datasets,
                    "Mount only this dataset (repeat for several); default: every published one");
  mount->add_flag("-f,--foreground", mount_args->foreground,
                  "Stay in the foreground and log to stderr; Ctrl-C unmounts");
  mount
      ->add_option("-o", mount_args->fuse_options,
                   "Extra FUSE mount options, comma-separated (e.g. allow_other)")
      ->delimiter(',')
      ->allow_extra_args(false);
  mount
      ->add_option("--cache-size", mount_args->cache_bytes,
                   "Bytes of objects kept in memory (e.g. 512MiB, 4GiB)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  CLI::Option* disk_cache =
      mount->add_option("--disk-cache", mount_args->disk_cache,
                        "A directory on local disk (an NVMe or SSD, not tmpfs) that keeps the "
                        "objects read from Redis across epochs and remounts: a read missing the "
                        "memory cache looks there before Redis. Off unless given; needs "
                        "--disk-cache-size. One mount per directory");
  mount
      ->add_option("--disk-cache-size", mount_args->disk_cache_bytes,
                   "Bytes the --disk-cache directory may take (e.g. 200GiB). Size it to hold "
                   "the whole dataset plus 1% (each object takes at least a 4 KiB block), and "
                   "within the disk's free space: then from the second epoch on (and after a "
                   "remount) reads stay local")
      ->transform(CLI::AsSizeValue(false))
      ->needs(disk_cache);
  mount
      ->add_option("--disk-cache-readers", mount_args->disk_cache_readers,
                   "Threads that read the files the prefetcher foresees from the --disk-cache "
                   "directory into memory ahead of the readers, one file each at a time: the "
                   "depth of the disk's queue. An NVMe or SSD serves many reads at once; on a "
                   "single spinning disk fewer (4) seek less")
      ->check(CLI::Range(1u, 256u))
      ->needs(disk_cache)
      ->capture_default_str();
  mount
      ->add_flag("--disk-cache-page-cache", mount_args->disk_cache_page_cache,
                 "Read the --disk-cache files through the page cache. By default a file the "
                 "page cache holds whole is read from it and the others with O_DIRECT, so that "
                 "the tier's files do not take memory beside their copies in --cache-size. For a "
                 "host whose free memory should keep the tier's files between epochs")
      ->needs(disk_cache);
  mount
      ->add_option("--timeout", mount_args->timeout_s,
                   "How long a read waits for an unreachable Redis before failing with EIO "
                   "(e.g. 30s, 500ms)")
      ->transform(duration_units())
      ->capture_default_str();
  mount
      ->add_option("--lease-ttl", mount_args->lease_ttl_s,
                   "How long the mount's hold on the generations it serves outlives it if it "
                   "dies without unmounting; renewed every third of it (e.g. 60s)")
      ->transform(duration_units())
      ->capture_default_str();
  mount
      ->add_option("--watch-interval", mount_args->watch_interval_s,
                   "How often Redis is checked for datasets published, removed or re-ingested "
                   "since the mount (e.g. 2s; 0: never, only `dsfs refresh`). New datasets appear "
                   "(with no --dataset), removed ones disappear; a re-ingested one keeps its "
                   "generation until `dsfs refresh` or --follow-updates")
      ->transform(duration_units())
      ->capture_default_str();
  mount->add_flag("--follow-updates", mount_args->follow_updates,
                  "Switch to a re-ingested dataset's new generation as soon as it is seen; files "
                  "already open keep reading the generation they were opened in");
  mount->add_flag("--verify", mount_args->verify,
                  "Check every file's checksum when it is fetched (a mismatch is EIO)");
  mount->add_option("--threads", mount_args->threads, "FUSE request threads")
      ->check(CLI::Range(1u, 256u))
      ->capture_default_str();
  mount
      ->add_option("--prefetch", mount_args->prefetch,
                   "Fetching ahead of readers: auto (learn the order from the reads: a plan "
                   "written to MOUNTPOINT/.dsfs/plan, directory order, the last epoch's order, "
                   "or any file not read yet this epoch; those guesses are not sent to a Redis "
                   "under 1 ms away, where a miss costs less than they do), plan (only follow a "
                   "written plan), or off (fetch only what is read)")
      ->check(CLI::IsMember({"auto", "plan", "off"}))
      ->capture_default_str();
  mount
      ->add_option("--connections", mount_args->connections,
                   "Redis connections that prefetch (each a sliding window of pipelined GETs); "
                   "reads that miss use up to as many more")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  mount
      ->add_option("--read-from", mount_args->read_from,
                   "On a Redis Cluster, which copies reads of objects may use: primary, replica "
                   "(spread over the replicas; primaries keep serving writes and metadata), or "
                   "any (primaries and replicas in turn). Objects never change once published, "
                   "so every copy is right; a replica that has not yet received a new object "
                   "answers nil and the read asks the primary. Whichever is chosen, a copy that "
                   "does not answer is passed over for its shard's others while it is down, so "
                   "a dead primary does not stall reads until its replica is promoted. No "
                   "effect on a single server")
      ->check(CLI::IsMember({"primary", "replica", "any"}))
      ->capture_default_str();
  mount
      ->add_option("--max-inflight", mount_args->max_inflight,
                   "Most prefetch GETs in flight at once (0: as many as half the cache holds, at "
                   "most 8192). The engine keeps about the measured round trip times the read "
                   "rate in flight, ramping up from 2 per connection")
      ->check(CLI::Range(0u, 1u << 20))
      ->capture_default_str();
  mount
      ->add_option("--readahead", mount_args->readahead_bytes,
                   "Kernel readahead for the mount, so a whole image comes in one request "
                   "(e.g. 1MiB; 0 keeps the kernel's 128 KiB; at most 1GiB; needs root, else "
                   "ignored)")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30))
      ->capture_default_str();
  mount
      ->add_option("--view-backend", mount_args->view_backend,
                   "What renders MOUNTPOINT/.views files: cuda (batched on the GPU; the mount "
                   "fails when no GPU is usable), cpu, or auto (cuda when a GPU is usable, else "
                   "cpu). Decoding always runs on CPU threads")
      ->check(CLI::IsMember({"auto", "cuda", "cpu"}))
      ->capture_default_str();
  mount
      ->add_option("--view-cache-size", mount_args->view_cache_bytes,
                   "Bytes of rendered .views files kept in memory while readers fetch them "
                   "(e.g. 256MiB); the kernel's page cache keeps them afterwards. A SPEC whose "
                   ".npy files would exceed half of it is refused (its directory does not exist; "
                   "the log says why), so a file, once rendered, is read from memory rather than "
                   "rendered again per READ")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  mount
      ->add_option("--view-max-pixels", mount_args->view_max_pixels,
                   "Largest source image a .views file decodes, in pixels (width x height, read "
                   "from the image's header before anything is allocated); a larger image's "
                   "view fails with EIO and a log line. Default 67108864 (8192x8192); at most "
                   "178956970, where PIL refuses images as decompression bombs")
      ->check(CLI::Range(std::uint64_t{1}, view::kMaxPixelsCeiling))
      ->capture_default_str();
  mount
      ->add_option("--view-render-memory", mount_args->view_render_memory_bytes,
                   "Memory all .views renders in flight may hold at once (decoded pixels, "
                   "working rows and the rendered file; e.g. 1GiB): a render waits for its share "
                   "(EIO after 30 s), and one that alone needs more fails with EIO and a log line")
      ->transform(CLI::AsSizeValue(false))
      ->check(CLI::Range(std::uint64_t{1} << 20, std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();
  mount
      ->add_option("--view-render-ahead", mount_args->view_render_ahead,
                   "Threads that decode and transform the images the prefetch engine predicts "
                   "into the view cache before they are read, while a .views directory of their "
                   "dataset is being read (needs --prefetch auto or plan): a number, 0 to render "
                   "only on read, or auto (one per CPU core)")
      ->check([](const std::string& text) {
        try {
          render_ahead_threads(text);
          return std::string();
        } catch (const std::invalid_argument& e) {
          return std::string(e.what());
        }
      })
      ->capture_default_str();
  mount->add_option(
      "--metrics-listen", mount_args->metrics_listen,
      "Serve the mount's counters for Prometheus at http://ADDRESS/metrics (the same figures as "
      "MOUNTPOINT/.dsfs/stats.json): PORT (on 127.0.0.1 only), HOST:PORT or [IPV6]:PORT, e.g. "
      "9464, or 0.0.0.0:9464 for every interface (anyone who can reach it sees dataset names). "
      "Off unless given; a port in use fails the mount");
  mount->add_option("--log-file", mount_args->log_file,
                    "Where the background daemon logs (default: "
                    "$DSFS_HOME/logs/mount-<mountpoint name>.log)");
  mount->add_flag("--debug-fuse", mount_args->debug_fuse,
                  "Print every FUSE request (libfuse's -d; use with -f)");
  cli::add_global_options(*mount, global);
  mount->callback([mount_args, &global] { run_mount(*mount_args, global); });

  auto umount_args = std::make_shared<UmountArgs>();
  CLI::App* umount =
      app.add_subcommand("umount", "Unmount a dsfs mount and wait until its daemon has exited");
  umount->add_option("MOUNTPOINT", umount_args->mountpoint, "Where dsfs is mounted")->required();
  umount->add_flag("-l,--lazy", umount_args->lazy,
                   "Detach even if files are open there; the daemon exits once they are closed "
                   "(no waiting)");
  umount
      ->add_option("--wait", umount_args->wait_s,
                   "How long to wait for the daemon to exit (e.g. 10s)")
      ->transform(duration_units())
      ->capture_default_str();
  umount->callback([umount_args] { run_umount(*umount_args); });

  auto refresh_args = std::make_shared<RefreshArgs>();
  CLI::App* refresh = app.add_subcommand(
      "refresh",
      "Switch a mount's datasets to their current generation now (after a re-ingest), and show "
      "datasets published or removed since the last check. Files already open keep reading the "
      "generation they were opened in; files opened afterwards read the new one.");
  refresh->add_option("MOUNTPOINT", refresh_args->mountpoint, "Where dsfs is mounted")->required();
  refresh->add_option("DATASET", refresh_args->datasets,
                      "Datasets to refresh (default: every dataset of the mount)");
  refresh->callback([refresh_args] { run_refresh(*refresh_args); });
}

}  // namespace dsfs::fs
