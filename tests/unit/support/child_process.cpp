#include "tests/unit/support/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace dsfs::test {
namespace {

// Resolved before fork: between fork and exec only async-signal-safe calls are allowed, and
// tests fork while other threads (FUSE, pools) run.
std::string find_program(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path_env = std::getenv("PATH");
  std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find(':', begin);
    if (end == std::string::npos) end = path.size();
    const std::string dir = end > begin ? path.substr(begin, end - begin) : ".";
    const std::string candidate = dir + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0 && !std::filesystem::is_directory(candidate)) {
      return candidate;
    }
    begin = end + 1;
  }
  throw std::runtime_error("cannot run " + name + ": not found on PATH");
}

// One thread that lives as long as the test binary and runs what it is given, in order.
// PR_SET_PDEATHSIG fires when the *thread* that forked a child exits, so forking on a
// short-lived thread (a worker of the code under test calling a test hook) would kill the child
// with it; forking here ties every child to the test binary as a whole.
class LastingThread {
 public:
  static LastingThread& instance() {
    // Never destroyed: the detached thread may still wait on it while the binary exits.
    static LastingThread* const thread = new LastingThread();
    return *thread;
  }

  // Runs `task` there and waits for it; rethrows what it threw.
  void run(std::function<void()> task) {
    std::packaged_task<void()> packaged(std::move(task));
    std::future<void> done = packaged.get_future();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(packaged));
    }
    ready_.notify_one();
    done.get();
  }

 private:
  LastingThread() {
    std::thread([this] { loop(); }).detach();
  }

  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock lock(mutex_);
        ready_.wait(lock, [this] { return !queue_.empty(); });
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();
    }
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::packaged_task<void()>> queue_;
};

struct Spawned {
  pid_t pid = 0;
  int exec_error = 0;  // errno of a failed exec; 0 once the program runs
};

// Forks and execs `program`; returns once the exec has succeeded or failed.
Spawned spawn(const std::string& program, char* const* argv) {
  // The child reports a failed exec through this close-on-exec pipe; EOF means exec worked.
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(report[0]);
    ::close(report[1]);
    throw std::runtime_error("cannot fork for " + program);
  }
  if (pid == 0) {
    ::close(report[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the test binary already died
    ::execv(program.c_str(), argv);
    const int error = errno;
    [[maybe_unused]] const ssize_t ignored = ::write(report[1], &error, sizeof error);
    ::_exit(127);
  }
  ::close(report[1]);
  Spawned spawned{.pid = pid};
  int error = 0;
  ssize_t n;
  do {
    n = ::read(report[0], &error, sizeof error);
  } while (n < 0 && errno == EINTR);
  ::close(report[0]);
  if (n > 0) spawned.exec_error = error;
  return spawned;
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> args) {
  if (args.empty()) throw std::invalid_argument("ChildProcess needs a program");
  const std::string program = find_program(args[0]);
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  Spawned spawned;
  LastingThread::instance().run([&] { spawned = spawn(program, argv.data()); });
  pid_ = spawned.pid;
  if (spawned.exec_error != 0) {
    terminate();
    throw std::runtime_error("cannot run " + program + ": " + ::strerror(spawned.exec_error));
  }
}

bool ChildProcess::exited() {
  if (pid_ <= 0) return true;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = 0;
  return true;
}

void ChildProcess::signal(int signo) {
  if (pid_ > 0) ::kill(pid_, signo);
}

void ChildProcess::terminate(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  ::kill(pid_, SIGCONT);  // a stopped child would not act on SIGTERM until continued
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (!exited()) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);  // a hung child must not hang the test binary
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = 0;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace dsfs::test
