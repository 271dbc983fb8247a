#pragma once
// Clang's thread-safety analysis (-Wthread-safety): which mutex guards which field, checked at
// compile time in the clang builds (TSan, fuzz, and any build with CXX=clang++). Under GCC the
// macros expand to nothing and Mutex is a plain std::mutex.
//
// Use dsfs::Mutex and dsfs::MutexLock where a class guards fields with a mutex and only takes it
// in scopes (no condition variable waits on it: the analysis cannot follow std::unique_lock
// through a wait; those classes say in a comment which mutex guards what).
#include <mutex>

#if defined(__clang__)
#define DSFS_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DSFS_THREAD_ANNOTATION(x)
#endif

#define DSFS_CAPABILITY(name) DSFS_THREAD_ANNOTATION(capability(name))
#define DSFS_SCOPED_CAPABILITY DSFS_THREAD_ANNOTATION(scoped_lockable)
#define DSFS_GUARDED_BY(mutex) DSFS_THREAD_ANNOTATION(guarded_by(mutex))
#define DSFS_PT_GUARDED_BY(mutex) DSFS_THREAD_ANNOTATION(pt_guarded_by(mutex))
#define DSFS_REQUIRES(...) DSFS_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define DSFS_EXCLUDES(...) DSFS_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define DSFS_ACQUIRE(...) DSFS_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define DSFS_RELEASE(...) DSFS_THREAD_ANNOTATION(release_capability(__VA_ARGS__))

namespace dsfs {

// A std::mutex the analysis knows as a capability. Thread safety: it is the synchronization.
class DSFS_CAPABILITY("mutex") Mutex {
 public:
  void lock() DSFS_ACQUIRE() { mutex_.lock(); }
  void unlock() DSFS_RELEASE() { mutex_.unlock(); }

 private:
  std::mutex mutex_;
};

// Holds a Mutex for its scope (std::lock_guard, annotated).
class DSFS_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) DSFS_ACQUIRE(mutex) : mutex_(mutex) { mutex_.lock(); }
  ~MutexLock() DSFS_RELEASE() { mutex_.unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace dsfs
