#pragma once
// A redis-server that dsfs runs itself, as a daemon under DSFS_HOME: the embedded single server
// (embedded_server.h) and each node of a local cluster (local_cluster.h). What both need to find
// the binary, write its config, start it, know whether its pid is alive and wait for it to go,
// and to keep two dsfs processes from starting it at once. What a server's directory holds and
// when it counts as ready stay with each caller.
//
// Thread safety: the functions share no state and may be called from any thread; two calls on
// the same files are not serialized (StartLock is how processes and threads take turns).
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <ios>
#include <string>
#include <string_view>

namespace dsfs::store::redis_process {

// An exclusive flock on `path` (created if missing), held until destruction, so that dsfs
// processes (or threads) starting or stopping the same server run one after the other. Waits up
// to `timeout` for another holder, then throws std::runtime_error; also when the file cannot be
// opened, followed by `remedy` (e.g. "set DSFS_HOME to a writable directory"). The descriptor
// is close-on-exec: a redis-server that inherited it would hold the lock for its whole life.
// Thread safety: one object per holder; not shared.
class StartLock {
 public:
  StartLock(const std::filesystem::path& path, std::chrono::milliseconds timeout,
            std::string_view remedy);
  ~StartLock();  // closing releases the lock
  StartLock(const StartLock&) = delete;
  StartLock& operator=(const StartLock&) = delete;

 private:
  int fd_;
};

// $DSFS_REDIS_SERVER when set (throws std::runtime_error if it is not executable), else the
// first redis-server on PATH; throws std::runtime_error saying how to install one otherwise.
std::filesystem::path find_binary();

// Quotes a value for redis.conf (sdssplitargs syntax), so paths with spaces work.
std::string quote_config_value(const std::string& value);

// Writes `text` to path.tmp and renames it over `path`, so a reader never sees half a file.
// Throws std::runtime_error (or std::filesystem::filesystem_error) when it cannot.
void write_file_atomically(const std::filesystem::path& path, const std::string& text);

// Runs `binary config` with stdin from /dev/null and stdout and stderr appended to `log_file`
// (so errors printed before redis opens its own log land there too), none of the caller's other
// descriptors (a FUSE device, a lock file) inherited. The config must say `daemonize yes`: the
// child forks the server and exits at once, which this waits for. Throws std::runtime_error
// (with the end of the log) when it cannot be run or exits non-zero. That the child exited is
// not that the server is up (it may still fail to bind its port): the caller probes it.
void spawn_daemon(const std::filesystem::path& binary, const std::filesystem::path& config,
                  const std::filesystem::path& log_file);

// The pid in a pid file; 0 when missing or unreadable.
int read_pid_file(const std::filesystem::path& path);

// True when pid is a live (not zombie) redis-server: a pid file can outlive its server and its
// pid can be reused by an unrelated process.
bool is_live(int pid);

// Polls until pid is no longer a live redis-server; false if it still is after `timeout`.
bool wait_for_exit(int pid, std::chrono::milliseconds timeout);

// The file's text from byte `from` on; empty when it cannot be read.
std::string read_file(const std::filesystem::path& path, std::streamoff from = 0);

// The last `count` lines of a log, each on a new line indented two spaces, for error messages.
std::string last_lines(const std::filesystem::path& path, size_t count);

}  // namespace dsfs::store::redis_process
