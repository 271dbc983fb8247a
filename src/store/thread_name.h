#pragma once
// Names a thread for `top -H`, `ps -L`, `perf` and /proc/PID/task/TID/comm, so that the CPU
// each kind of thread takes can be told apart (bench/first_epoch.py records it per name).
#include <pthread.h>

#include <string>

namespace dsfs {

// Names the calling thread `name`, cut to the kernel's 15 bytes. Thread safety: touches only
// the calling thread.
inline void name_this_thread(const std::string& name) {
  ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
}

}  // namespace dsfs
