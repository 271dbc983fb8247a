#include "src/store/embedded_server.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "src/store/connection.h"
#include "src/store/errors.h"

extern char** environ;

namespace dsfs::store {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kReadyTimeout = 10s;
// A large AOF takes a while to load; a live server that says LOADING gets this long instead.
constexpr auto kLoadingTimeout = 120s;
constexpr auto kStopTimeout = 30s;
constexpr auto kLockTimeout = 60s;

struct Layout {
  fs::path dir;
  fs::path socket;
  fs::path pid_file;
  fs::path log_file;
  fs::path config;
  fs::path data_dir;
  fs::path lock_file;
};

Layout layout_of(const fs::path& home) {
  const fs::path dir = home / "redis";
  return Layout{.dir = dir,
                .socket = dir / "redis.sock",
                .pid_file = dir / "redis.pid",
                .log_file = dir / "redis.log",
                .config = dir / "redis.conf",
                .data_dir = dir / "data",
                .lock_file = dir / "start.lock"};
}

// An exclusive flock on a file, so that two dsfs processes starting the server at the same time
// do not start two. The descriptor is close-on-exec: a redis-server that inherited it would hold
// the lock for its whole life.
class FileLock {
 public:
  explicit FileLock(const fs::path& path)
      : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    if (fd_ < 0) {
      throw std::runtime_error(fmt::format(
          "cannot open lock file {}: {} (set DSFS_HOME to a writable directory, or give --redis "
          "URL)",
          path.string(), std::strerror(errno)));
    }
    const auto deadline = Clock::now() + kLockTimeout;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK && errno != EINTR) {
        const int error = errno;
        ::close(fd_);
        throw std::runtime_error(
            fmt::format("cannot lock {}: {}", path.string(), std::strerror(error)));
      }
      if (Clock::now() >= deadline) {
        ::close(fd_);
        throw std::runtime_error(fmt::format(
            "another dsfs process has held {} for over a minute; is it stuck?", path.string()));
      }
      std::this_thread::sleep_for(50ms);
    }
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock() { ::close(fd_); }  // closing releases the lock

 private:
  int fd_;
};

// Quotes a value for redis.conf (sdssplitargs syntax), so paths with spaces work.
std::string quote_config_value(const std::string& value) {
  std::string quoted = "\"";
  for (const char c : value) {
    if (c == '"' || c == '\\') quoted.push_back('\\');
    quoted.push_back(c);
  }
  quoted.push_back('"');
  return quoted;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string last_lines(const fs::path& path, size_t count) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(std::move(line));
    if (lines.size() > count) lines.pop_front();
  }
  std::string text;
  for (const auto& line : lines) text += "\n  " + line;
  return text;
}

// True when pid is a live (not zombie) redis-server: a pid file can outlive its server and its
// pid can be reused by an unrelated process.
bool is_live_redis_process(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  const std::string comm = read_file(fs::path("/proc") / std::to_string(pid) / "comm");
  if (!comm.starts_with("redis-server")) return false;
  // /proc/PID/stat: "pid (comm) STATE ..."; a zombie has exited already.
  const std::string stat = read_file(fs::path("/proc") / std::to_string(pid) / "stat");
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

int read_pid_file(const fs::path& path) {
  std::ifstream in(path);
  int pid = 0;
  if (!(in >> pid)) return 0;
  return pid;
}

RedisEndpoint socket_endpoint(const fs::path& socket) {
  RedisEndpoint endpoint;
  endpoint.transport = RedisEndpoint::Transport::kUnix;
  endpoint.socket_path = socket.string();
  return endpoint;
}

enum class Health { kReady, kLoading, kUnreachable };

// Whether the server on `socket` answers PING; fills *pid from INFO when it does.
Health probe(const fs::path& socket, int* pid = nullptr) {
  std::error_code ignored;
  if (!fs::exists(socket, ignored)) return Health::kUnreachable;
  try {
    Connection conn(socket_endpoint(socket),
                    ConnectOptions{.connect_timeout = 500ms, .io_timeout = 2000ms});
    if (pid) {
      const Reply info = conn.command({"INFO", "server"});
      const std::string_view text = info.str();
      constexpr std::string_view kField = "process_id:";
      if (const size_t at = text.find(kField); at != std::string_view::npos) {
        const std::string_view digits = text.substr(at + kField.size());
        std::from_chars(digits.data(), digits.data() + digits.size(), *pid);
      }
    }
    return Health::kReady;
  } catch (const ConnectionError& e) {
    return std::string_view(e.what()).find("LOADING") != std::string_view::npos
               ? Health::kLoading
               : Health::kUnreachable;
  } catch (const ReplyError&) {
    return Health::kUnreachable;
  }
}

fs::path find_redis_server() {
  if (const char* chosen = std::getenv("DSFS_REDIS_SERVER"); chosen && *chosen) {
    if (::access(chosen, X_OK) != 0) {
      throw std::runtime_error(
          fmt::format("DSFS_REDIS_SERVER={} is not an executable redis-server", chosen));
    }
    return chosen;
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    if (dir.empty()) continue;
    const fs::path candidate = fs::path(dir) / "redis-server";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw std::runtime_error(
      "redis-server was not found on PATH: install Debian's redis-server package "
      "(apt-get install redis-server), or name a running Redis with --redis URL");
}

void write_config(const Layout& layout) {
  const std::string config = fmt::format(
      "# Generated by dsfs on every `dsfs server start`; edits here are overwritten.\n"
      "# Unix socket only: no TCP port, only this user can connect.\n"
      "port 0\n"
      "unixsocket {}\n"
      "unixsocketperm 700\n"
      "dir {}\n"
      "# Append-only file plus RDB snapshots: data survives stop/start and crashes.\n"
      "appendonly yes\n"
      "appendfsync everysec\n"
      "save 3600 1 300 100 60 10000\n"
      "daemonize yes\n"
      "pidfile {}\n"
      "logfile {}\n"
      "loglevel notice\n"
      "# Dataset objects are large: allow big bulk strings and pipelines.\n"
      "proto-max-bulk-len 512mb\n"
      "client-query-buffer-limit 1gb\n",
      quote_config_value(layout.socket.string()), quote_config_value(layout.data_dir.string()),
      quote_config_value(layout.pid_file.string()), quote_config_value(layout.log_file.string()));
  const fs::path temporary = layout.config.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << config;
    if (!out.flush()) {
      throw std::runtime_error(fmt::format("cannot write {}", temporary.string()));
    }
  }
  fs::rename(temporary, layout.config);
}

// Runs redis-server with the config; it daemonizes, so the child we spawn exits at once.
void spawn_redis_server(const fs::path& binary, const Layout& layout) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // Errors printed before the log file is opened (a bad config) land in the log too.
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, layout.log_file.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  // The daemon must not keep the caller's descriptors (a FUSE device, open files) alive.
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  std::string binary_arg = binary.string();
  std::string config_arg = layout.config.string();
  char* argv[] = {binary_arg.data(), config_arg.data(), nullptr};
  pid_t child = 0;
  const int error = ::posix_spawn(&child, binary.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    throw std::runtime_error(
        fmt::format("cannot run {}: {}", binary.string(), std::strerror(error)));
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error(fmt::format("redis-server failed to start; the end of {}:{}",
                                         layout.log_file.string(),
                                         last_lines(layout.log_file, 15)));
  }
}

void remove_stale_files(const Layout& layout) {
  std::error_code ignored;
  fs::remove(layout.pid_file, ignored);
  fs::remove(layout.socket, ignored);
}

bool wait_for_exit(int pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (is_live_redis_process(pid)) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

}  // namespace

EmbeddedServer::EmbeddedServer(std::filesystem::path home) : home_(std::move(home)) {
  if (home_.empty()) throw std::invalid_argument("the dsfs home directory must not be empty");
  home_ = fs::absolute(home_);
}

std::filesystem::path EmbeddedServer::default_home() {
  if (const char* home = std::getenv("DSFS_HOME"); home && *home) return home;
  if (const char* user_home = std::getenv("HOME"); user_home && *user_home) {
    return fs::path(user_home) / ".local" / "share" / "dsfs";
  }
  if (const passwd* entry = ::getpwuid(::getuid()); entry && entry->pw_dir) {
    return fs::path(entry->pw_dir) / ".local" / "share" / "dsfs";
  }
  throw std::runtime_error("cannot find a home directory: set DSFS_HOME");
}

RedisEndpoint EmbeddedServer::endpoint() const {
  return socket_endpoint(layout_of(home_).socket);
}

EmbeddedServerStatus EmbeddedServer::status() const {
  const Layout layout = layout_of(home_);
  EmbeddedServerStatus status{.running = false,
                              .pid = 0,
                              .socket = layout.socket,
                              .data_dir = layout.data_dir,
                              .log_file = layout.log_file};
  const int pid = read_pid_file(layout.pid_file);
  if (is_live_redis_process(pid)) {
    status.running = true;
    status.pid = pid;
    return status;
  }
  // The pid file may be gone while the server still answers on its socket.
  int answered_pid = 0;
  if (probe(layout.socket, &answered_pid) == Health::kReady) {
    status.running = true;
    status.pid = answered_pid;
  }
  return status;
}

bool EmbeddedServer::start() {
  const Layout layout = layout_of(home_);
  if (layout.socket.string().size() >= sizeof(sockaddr_un{}.sun_path)) {
    throw std::runtime_error(fmt::format(
        "the embedded server's socket path {} is {} bytes, over the {}-byte limit of unix "
        "sockets: set DSFS_HOME to a shorter directory",
        layout.socket.string(), layout.socket.string().size(), sizeof(sockaddr_un{}.sun_path) - 1));
  }
  std::error_code error;
  fs::create_directories(layout.data_dir, error);
  if (error) {
    throw std::runtime_error(
        fmt::format("cannot create {}: {} (set DSFS_HOME to a writable directory)",
                    layout.data_dir.string(), error.message()));
  }
  fs::permissions(layout.dir, fs::perms::owner_all, fs::perm_options::replace, error);

  const FileLock lock(layout.lock_file);
  bool started = false;
  if (!status().running) {
    const fs::path binary = find_redis_server();
    remove_stale_files(layout);
    write_config(layout);
    spdlog::debug("starting {} {}", binary.string(), layout.config.string());
    spawn_redis_server(binary, layout);
    started = true;
  }

  // Ready when it answers PING on the socket (also when it was already running: it may still
  // be loading its data after another process started it).
  const auto start_time = Clock::now();
  for (;;) {
    const Health health = probe(layout.socket);
    if (health == Health::kReady) return started;
    const auto waited = Clock::now() - start_time;
    const bool alive = is_live_redis_process(read_pid_file(layout.pid_file));
    const bool give_up =
        health == Health::kLoading && alive ? waited > kLoadingTimeout : waited > kReadyTimeout;
    if (give_up) {
      throw std::runtime_error(fmt::format(
          "the embedded redis-server did not answer on {} within {} s; the end of {}:{}",
          layout.socket.string(), std::chrono::duration_cast<std::chrono::seconds>(waited).count(),
          layout.log_file.string(), last_lines(layout.log_file, 15)));
    }
    std::this_thread::sleep_for(50ms);
  }
}

bool EmbeddedServer::stop() {
  const Layout layout = layout_of(home_);
  std::error_code ignored;
  if (!fs::exists(layout.dir, ignored)) return false;
  const FileLock lock(layout.lock_file);
  const EmbeddedServerStatus current = status();
  if (!current.running) {
    remove_stale_files(layout);
    return false;
  }

  std::optional<Connection> conn;
  try {
    conn.emplace(endpoint(), ConnectOptions{.connect_timeout = 1000ms, .io_timeout = 60000ms});
  } catch (const std::exception& e) {
    spdlog::debug("cannot talk to the embedded redis-server ({}); sending SIGTERM", e.what());
  }
  if (conn) {
    try {
      // On success the server closes the connection instead of replying.
      const Reply reply = conn->command({"SHUTDOWN", "SAVE"});
      if (reply.is_error()) {
        throw std::runtime_error(
            fmt::format("the embedded redis-server refused to shut down: {} (see {})", reply.str(),
                        layout.log_file.string()));
      }
    } catch (const ConnectionError&) {
      // The expected end of a successful SHUTDOWN.
    }
  } else if (current.pid > 0) {
    // Not answering (still loading, or stuck): SIGTERM makes redis save and exit too.
    ::kill(current.pid, SIGTERM);
  }
  if (!wait_for_exit(current.pid, kStopTimeout)) {
    throw std::runtime_error(
        fmt::format("the embedded redis-server (pid {}) did not exit within {} s; see {}",
                    current.pid, kStopTimeout.count(), layout.log_file.string()));
  }
  remove_stale_files(layout);
  return true;
}

}  // namespace dsfs::store
