#pragma once
// Child processes for the unit tests (redis-server, a local HTTP server) that never outlive them.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace dsfs::test {

// Runs args[0] (searched on PATH) with `args`. The destructor terminates and reaps it; if the
// test binary dies first (crash, ctest timeout) the kernel sends it SIGTERM (PR_SET_PDEATHSIG),
// so no test leaves a process behind. That signal follows the *thread* that forked, so every
// child is forked on one helper thread that lives as long as the test binary: any thread may
// create, terminate or destroy a ChildProcess, e.g. a hook run on a worker thread that restarts
// a TestRedisServer, and the child outlives that thread.
class ChildProcess {
 public:
  // Throws std::runtime_error naming the program if it cannot be run.
  explicit ChildProcess(std::vector<std::string> args);
  ~ChildProcess() { terminate(); }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // True once it has exited (reaping it); never blocks.
  bool exited();

  // Sends `signo` (e.g. SIGSTOP, SIGCONT) while it runs; a no-op once it has been reaped.
  void signal(int signo);

  // SIGTERM, then SIGKILL if it is still there after `grace`; waits until it is reaped.
  void terminate(std::chrono::milliseconds grace = std::chrono::seconds(10));

 private:
  pid_t pid_ = 0;  // 0 once reaped
};

}  // namespace dsfs::test
