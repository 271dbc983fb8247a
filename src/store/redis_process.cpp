#include "src/store/redis_process.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace dsfs::store::redis_process {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kPollInterval{50};

}  // namespace

StartLock::StartLock(const fs::path& path, std::chrono::milliseconds timeout,
                     std::string_view remedy)
    : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
  if (fd_ < 0) {
    throw std::runtime_error(fmt::format("cannot open lock file {}: {} ({})", path.string(),
                                         std::strerror(errno), remedy));
  }
  const auto deadline = Clock::now() + timeout;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) {
      const int error = errno;
      ::close(fd_);
      throw std::runtime_error(
          fmt::format("cannot lock {}: {}", path.string(), std::strerror(error)));
    }
    if (Clock::now() >= deadline) {
      ::close(fd_);
      throw std::runtime_error(
          fmt::format("another dsfs process has held {} for over {} s; is it stuck?", path.string(),
                      std::chrono::duration_cast<std::chrono::seconds>(timeout).count()));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

StartLock::~StartLock() {
  ::close(fd_);
}

fs::path find_binary() {
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

std::string quote_config_value(const std::string& value) {
  std::string quoted = "\"";
  for (const char c : value) {
    if (c == '"' || c == '\\') quoted.push_back('\\');
    quoted.push_back(c);
  }
  quoted.push_back('"');
  return quoted;
}

void write_file_atomically(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    if (!out.flush()) throw std::runtime_error(fmt::format("cannot write {}", temporary.string()));
  }
  fs::rename(temporary, path);
}

void spawn_daemon(const fs::path& binary, const fs::path& config, const fs::path& log_file) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_file.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
  std::string binary_arg = binary.string();
  std::string config_arg = config.string();
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
                                         log_file.string(), last_lines(log_file, 15)));
  }
}

int read_pid_file(const fs::path& path) {
  std::ifstream in(path);
  int pid = 0;
  if (!(in >> pid)) return 0;
  return pid;
}

bool is_live(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0 && errno != EPERM) return false;
  const std::string comm = read_file(fs::path("/proc") / std::to_string(pid) / "comm");
  if (!comm.starts_with("redis-server")) return false;
  // /proc/PID/stat: "pid (comm) STATE ..."; a zombie has exited already.
  const std::string stat = read_file(fs::path("/proc") / std::to_string(pid) / "stat");
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() || stat[close + 2] != 'Z';
}

bool wait_for_exit(int pid, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (is_live(pid)) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kPollInterval);
  }
  return true;
}

std::string read_file(const fs::path& path, std::streamoff from) {
  std::ifstream in(path);
  if (from > 0) in.seekg(from);
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

}  // namespace dsfs::store::redis_process
