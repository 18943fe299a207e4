// Lock annotations the compiler checks (clang's -Wthread-safety; no-ops elsewhere), and the mutex
// type that carries them. A member written `T x_ GUARDED_BY(mu_);` may be touched only with mu_
// held; a function marked REQUIRES(mu_) may be called only with it held, EXCLUDES(mu_) only
// without. The build checks the annotated modules with clang (scripts/thread-safety.sh, run by the
// README's test command), so a comment about locking that the code contradicts fails the build.
//
//   granary::Mutex mu_;
//   int n_ GUARDED_BY(mu_) = 0;
//   void Add() EXCLUDES(mu_) { granary::MutexLock lock(&mu_); ++n_; }
//   void Wait() { granary::MutexLock lock(&mu_); while (n_ == 0) lock.Wait(&cv_); }
#pragma once

#include <condition_variable>
#include <mutex>

// gRPC includes absl/base/internal/thread_annotations.h, which defines five of these names too
// (GUARDED_BY, PT_GUARDED_BY, ACQUIRED_BEFORE, ACQUIRED_AFTER, NO_THREAD_SAFETY_ANALYSIS: the
// same attributes under clang, no-ops elsewhere). Include it first and define ours only where it
// has not: its include guard makes any later inclusion a no-op, so the order of includes no longer
// matters and nothing is redefined.
#if defined(__has_include)
#if __has_include(<absl/base/internal/thread_annotations.h>)
#include <absl/base/internal/thread_annotations.h>
#endif
#endif

#if defined(__clang__)
#define GRANARY_TSA(x) __attribute__((x))
#else
#define GRANARY_TSA(x)
#endif

#define CAPABILITY(x) GRANARY_TSA(capability(x))
#define SCOPED_CAPABILITY GRANARY_TSA(scoped_lockable)
#ifndef GUARDED_BY
#define GUARDED_BY(x) GRANARY_TSA(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) GRANARY_TSA(pt_guarded_by(x))
#endif
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) GRANARY_TSA(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) GRANARY_TSA(acquired_after(__VA_ARGS__))
#endif
#define REQUIRES(...) GRANARY_TSA(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) GRANARY_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) GRANARY_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) GRANARY_TSA(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) GRANARY_TSA(locks_excluded(__VA_ARGS__))
#define RETURN_CAPABILITY(x) GRANARY_TSA(lock_returned(x))
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS GRANARY_TSA(no_thread_safety_analysis)
#endif

namespace granary {

// std::mutex with the capability the analysis tracks.
class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // True with the mutex held; false (not held) when another thread holds it.
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }
  // For code the analysis cannot follow (a condition variable's wait): the mutex underneath.
  std::mutex& native() { return mu_; }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope. Wait() and WaitFor() wait on a condition variable with it (the
// mutex is released while waiting and held again on return); write the condition as a loop in the
// caller, where the analysis sees the lock held:  while (!ready_) lock.Wait(&cv_);
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : lock_(mu->native()) {}
  ~MutexLock() RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Wait(std::condition_variable* cv) { cv->wait(lock_); }
  // False when the time ran out.
  template <typename Duration>
  bool WaitFor(std::condition_variable* cv, Duration d) {
    return cv->wait_for(lock_, d) == std::cv_status::no_timeout;
  }
  template <typename TimePoint>
  bool WaitUntil(std::condition_variable* cv, TimePoint t) {
    return cv->wait_until(lock_, t) == std::cv_status::no_timeout;
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace granary
