// RateLimiter: a token bucket that paces a flow of bytes to `rate` bytes per second.
//
// Acquire(n) returns once n bytes may go: the bucket holds at most one second's worth (so an idle
// period does not become a burst), and a request larger than that simply waits its full share.
// rate 0 means unlimited. Thread-safe: concurrent callers are served in turn, and their waits add up,
// so N threads together never exceed the rate. Waits end early, returning false, once Stop() is
// called (a job cancelled or a server shutting down).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>

#include "common/thread_annotations.h"

namespace granary {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimiter(uint64_t bytes_per_second) : rate_(bytes_per_second), next_(Clock::now()) {}

  // Blocks until `bytes` may pass; false when stopped meanwhile.
  bool Acquire(uint64_t bytes) EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  uint64_t rate() const { return rate_; }

 private:
  const uint64_t rate_;
  Mutex mu_;
  std::condition_variable cv_;
  Clock::time_point next_ GUARDED_BY(mu_);  // when the bucket is empty again (debt paid)
  bool stopped_ GUARDED_BY(mu_) = false;
};

}  // namespace granary
