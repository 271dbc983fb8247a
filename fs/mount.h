#pragma once
// Mounting: checks before a mount, the leases that keep the mounted generations from being
// collected, loading the datasets' snapshots, the FUSE session, and an in-process RAII mount
// (used by tests and by anything embedding dsfs).
#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fs/filesystem.h"
#include "prefetch/dataset_snapshot.h"
#include "src/catalog/keys.h"
#include "src/store/client.h"
#include "src/store/thread_annotations.h"

struct fuse_session;

namespace dsfs::fs {

inline constexpr unsigned kDefaultThreads = 16;
// The filesystem type the kernel reports for a dsfs mount (`-o subtype=dsfs`).
inline constexpr std::string_view kMountType = "fuse.dsfs";

// One line of /proc/self/mountinfo, the fields dsfs needs.
struct MountInfo {
  std::string mount_point;  // unescaped
  std::string fs_type;      // e.g. "fuse.dsfs"
  std::string source;       // e.g. "dsfs"
  std::string device;       // "major:minor"
};

// Parses mountinfo text; lines it cannot parse are skipped.
std::vector<MountInfo> parse_mountinfo(std::string_view text);
// Undoes the kernel's octal escapes (\040 for a space, ...).
std::string unescape_mountinfo_field(std::string_view field);
// The mount at exactly `real_path` (the most recent one if stacked), from /proc/self/mountinfo.
std::optional<MountInfo> find_mount(const std::filesystem::path& real_path);

// Checks that `path` is an existing directory with nothing mounted on it and returns its
// canonical form; throws std::runtime_error saying what is wrong otherwise.
std::filesystem::path check_mountpoint(const std::filesystem::path& path);

// How long a mount's lease on a generation lasts without a refresh (a crashed mount pins its
// generations this long at most); it is refreshed every third of that.
inline constexpr std::chrono::milliseconds kDefaultLeaseTtl{60000};

// A mount's leases on the generations it serves (catalog::pin_generation), so garbage collection
// keeps them however many times the datasets are re-ingested. load_datasets pins each dataset
// before loading it; start_refreshing() renews every lease every ttl/3 from a background thread
// (a failure, e.g. Redis down, is logged and retried, never fatal); release() or the destructor
// unpins them. A mount that dies without releasing stops renewing and its leases expire.
// Everything goes through `client` (the mount's), which must outlive this object: a refresh or
// a release that cannot reach Redis fails after the client's retry budget.
class GenerationLeases {
 public:
  GenerationLeases(store::Client& client, catalog::KeySchema keys,
                   std::chrono::milliseconds ttl = kDefaultLeaseTtl);
  ~GenerationLeases();  // release()
  GenerationLeases(const GenerationLeases&) = delete;
  GenerationLeases& operator=(const GenerationLeases&) = delete;

  // Pins the current generation of `name` (catalog::pin_current_generation) and returns its
  // info; the lease is then renewed and released by this object.
  catalog::DatasetInfo pin_current(const std::string& name);
  // Unpins the lease pin_current took on `name` (a dataset the mount then failed to load), so
  // nothing keeps it pinned; a no-op for a name not pinned. Throws store errors.
  void unpin(const std::string& name);
  // Unpins the lease on generation `generation` of `name` (a generation the mount stopped
  // serving); a no-op if there is none. Throws store errors (the lease then is no longer
  // renewed and expires by itself).
  void unpin(const std::string& name, uint64_t generation);
  // Stops renewing that lease without telling Redis (it expires after the ttl).
  void forget(const std::string& name, uint64_t generation);
  // Starts renewing. Call once this process will not fork any more: threads do not survive it.
  void start_refreshing();
  // Stops renewing and unpins every lease, best effort: a failure is logged and that lease
  // expires after ttl instead. Idempotent.
  void release();

  const std::string& reader_id() const { return reader_id_; }
  // Refresh rounds completed (every lease renewed), for tests.
  uint64_t refreshes() const;
  // Refresh rounds that failed (Redis away), for tests.
  uint64_t refresh_failures() const;

 private:
  struct Lease {
    std::string name;
    uint64_t generation = 0;
  };
  void refresh_loop(std::stop_token stop);
  // Renews every lease once; throws if Redis cannot be reached.
  void refresh_all();

  store::Client& client_;
  catalog::KeySchema keys_;
  std::chrono::milliseconds ttl_;
  std::string reader_id_;
  mutable Mutex mutex_;
  std::condition_variable_any wake_;  // waits on mutex_ (std::unique_lock<Mutex>)
  std::vector<Lease> leases_ DSFS_GUARDED_BY(mutex_);
  uint64_t refreshes_ DSFS_GUARDED_BY(mutex_) = 0;
  uint64_t refresh_failures_ DSFS_GUARDED_BY(mutex_) = 0;
  std::jthread refresher_;
  bool released_ DSFS_GUARDED_BY(mutex_) = false;
};

// Loads the current generation of each named dataset (every published one when `names` is
// empty) through `client`, which retries within its budget while Redis cannot be reached. With
// `leases`, each generation is pinned before its catalogue is loaded, so no garbage collection
// can delete it while the mount lives. Throws store::ConnectionError (naming the node),
// catalog::DatasetNotFound, or std::runtime_error (a dataset name the mount cannot show). Of all
// datasets (`names` empty), a damaged one (catalog::DatasetDamaged, catalog::ManifestError) or one
// of a newer schema is skipped with a warning naming it and the reason; a named one throws.
std::vector<prefetch::DatasetSnapshot> load_datasets(store::Client& client,
                                                     const catalog::KeySchema& keys,
                                                     const std::vector<std::string>& names,
                                                     GenerationLeases* leases = nullptr);

// Readahead a mount asks for: files up to this size arrive in one READ (the FUSE maximum).
inline constexpr uint64_t kDefaultReadahead = uint64_t{1} << 20;

// Sets the readahead of the mounted filesystem on device `device` (its backing device info in
// sysfs). Best effort: logs and carries on when sysfs refuses (not root, no sysfs).
void set_readahead(dev_t device, uint64_t bytes);

struct SessionOptions {
  std::filesystem::path mountpoint;
  std::vector<std::string> fuse_options;  // extra -o options, one per element
  unsigned threads = kDefaultThreads;
  bool debug = false;  // libfuse's request tracing
};

// A mounted FUSE session serving `filesystem`: mounted by the constructor, unmounted and
// destroyed by the destructor. The filesystem must outlive it; it is told of the session
// (Filesystem::attach_session) while mounted.
class Session {
 public:
  Session(Filesystem& filesystem, SessionOptions options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Serves requests on up to options.threads threads until unmounted, exit() or a signal
  // (with install_signal_handlers). Returns 0, or the signal number that stopped it.
  int run();
  void exit();
  // Unmounts now (the destructor does it otherwise). Idempotent.
  void unmount();
  // SIGINT, SIGTERM and SIGHUP end run() (the destructor then unmounts); until destruction.
  void install_signal_handlers();

  const std::filesystem::path& mountpoint() const { return options_.mountpoint; }

 private:
  SessionOptions options_;
  Filesystem& filesystem_;
  fuse_session* session_ = nullptr;
  bool mounted_ = false;
  bool signal_handlers_ = false;
};

struct MountOptions {
  SessionOptions session;
  FilesystemOptions filesystem;
};

// An in-process mount: the constructor mounts and serves on a background thread; the
// destructor unmounts and waits for the serving threads to finish.
class Mount {
 public:
  Mount(std::shared_ptr<store::Client> client, std::vector<prefetch::DatasetSnapshot> datasets,
        MountOptions options);
  ~Mount();
  Mount(const Mount&) = delete;
  Mount& operator=(const Mount&) = delete;

  Filesystem& filesystem() { return *filesystem_; }
  const std::filesystem::path& mountpoint() const { return session_->mountpoint(); }

 private:
  std::unique_ptr<Filesystem> filesystem_;
  std::unique_ptr<Session> session_;
  std::future<int> loop_;
};

// Held by a mount daemon for its whole life, so `dsfs umount` can wait until it has exited:
// an flock on a file named after the mountpoint in the runtime directory
// ($XDG_RUNTIME_DIR/dsfs, else /tmp/dsfs-UID).
class DaemonLock {
 public:
  static std::filesystem::path path_for(const std::filesystem::path& mountpoint);
  // Takes the lock (throws std::runtime_error if another process holds it) and records pid.
  explicit DaemonLock(const std::filesystem::path& mountpoint);
  ~DaemonLock();
  DaemonLock(const DaemonLock&) = delete;
  DaemonLock& operator=(const DaemonLock&) = delete;
  // Call in the process that keeps serving (after daemonizing) to record its pid.
  void record_pid();

  // Waits until no process holds the lock for `mountpoint`, up to `wait`. Returns true when
  // free (or when there is no lock file: no daemon); false on timeout, with the holder's pid.
  static bool wait_released(const std::filesystem::path& mountpoint, std::chrono::milliseconds wait,
                            int* holder_pid);

 private:
  std::filesystem::path path_;
  std::filesystem::path mountpoint_;
  int fd_ = -1;
};

}  // namespace dsfs::fs
