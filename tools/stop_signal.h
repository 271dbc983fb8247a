#pragma once
// SIGINT/SIGTERM turned into a flag that a long-running command polls, while a StopSignalGuard
// lives, so it can stop cleanly and still report. SA_RESETHAND: a second signal kills at once.
#include <csignal>

#include <atomic>

namespace dsfs::tools {

class StopSignalGuard {
 public:
  StopSignalGuard();   // clears the flag and installs the handlers
  ~StopSignalGuard();  // puts the previous handlers back
  StopSignalGuard(const StopSignalGuard&) = delete;
  StopSignalGuard& operator=(const StopSignalGuard&) = delete;

  // Set by the first SIGINT/SIGTERM; stays set after the guard is gone.
  static const std::atomic<bool>& stopped();
  // Which signal set it (0: none), for the conventional 128+N exit status.
  static int signal_number();

 private:
  struct sigaction previous_int_ {};
  struct sigaction previous_term_ {};
};

}  // namespace dsfs::tools
