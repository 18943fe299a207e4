#include "common/rate_limiter.h"

namespace granary {

bool RateLimiter::Acquire(uint64_t bytes) {
  if (rate_ == 0) return true;
  MutexLock lock(&mu_);
  if (stopped_) return false;
  const auto now = Clock::now();
  // At most one second of unused credit is kept.
  if (next_ < now - std::chrono::seconds(1)) next_ = now - std::chrono::seconds(1);
  auto cost = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
      static_cast<double>(bytes) / static_cast<double>(rate_)));
  next_ += cost;
  const auto until = next_ - cost;  // this caller goes once the debt before it is paid
  while (!stopped_ && lock.WaitUntil(&cv_, until)) {
  }
  return !stopped_;
}

void RateLimiter::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

}  // namespace granary
