#include "tools/stop_signal.h"

namespace dsfs::tools {
namespace {

std::atomic<bool> g_stop_signalled{false};
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

extern "C" void on_stop_signal(int signal_number) {
  g_stop_signal.store(signal_number);
  g_stop_signalled.store(true);
}

}  // namespace

StopSignalGuard::StopSignalGuard() {
  g_stop_signalled = false;
  g_stop_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &action, &previous_int_);
  sigaction(SIGTERM, &action, &previous_term_);
}

StopSignalGuard::~StopSignalGuard() {
  sigaction(SIGINT, &previous_int_, nullptr);
  sigaction(SIGTERM, &previous_term_, nullptr);
}

const std::atomic<bool>& StopSignalGuard::stopped() {
  return g_stop_signalled;
}

int StopSignalGuard::signal_number() {
  return g_stop_signal.load();
}

}  // namespace dsfs::tools
