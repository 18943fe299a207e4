// Backoff: the pause before each retry — one policy for every retry loop in Granary.
//
// A loop that retries asks Next() for the pause before each retry: it starts at `initial` and
// doubles up to `max`. With `jitter` ("full jitter", as the AWS SDKs do) each pause is drawn
// uniformly from [0, that bound], so clients that failed together do not retry together. The
// loop's deadline stays the caller's: SleepBefore(deadline) sleeps the next pause unless it would
// end at or after `deadline`, and then returns false without sleeping (the caller gives up with the
// last error it had). Reset() starts the schedule again (a leader named in an answer is asked at
// once, and its next failure waits from `initial`).
//
// The schedules in use, each defined once here so a reader can compare them:
//   kUnderStorageRetry  S3, OSS and NFS requests (ufs/): 200 ms doubling to 5 s, jittered; bounded
//                       by the mount's max_attempts and retry_deadline (docs/configuration.md)
//   kMasterFailover     a call waiting for a master to come back or lead (rpc::CallWithFailover):
//                       20 ms doubling to 500 ms, bounded by rpc.master_wait
//   kWorkerWait         granary-fuse waiting for a worker that can serve a read: 50 ms doubling to
//                       1 s, bounded by fuse.worker_wait
//   kUploadRetry        a write=back upload that failed: 1 s doubling to 60 s, with no bound (its
//                       bytes stay staged until it succeeds)
//
// Not thread-safe: one Backoff per loop (or per retried thing).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>

namespace granary {

struct BackoffPolicy {
  std::chrono::milliseconds initial;
  std::chrono::milliseconds max;
  bool jitter = false;
};

inline constexpr BackoffPolicy kUnderStorageRetry{std::chrono::milliseconds(200), std::chrono::milliseconds(5000), true};
inline constexpr BackoffPolicy kMasterFailover{std::chrono::milliseconds(20), std::chrono::milliseconds(500), false};
inline constexpr BackoffPolicy kWorkerWait{std::chrono::milliseconds(50), std::chrono::milliseconds(1000), false};
inline constexpr BackoffPolicy kUploadRetry{std::chrono::milliseconds(1000), std::chrono::milliseconds(60000), false};

class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy) : policy_(policy), bound_(policy.initial) {}

  // The pause before the next retry; the one after it is twice as long (at most `max`).
  std::chrono::milliseconds Next() {
    std::chrono::milliseconds pause = bound_;
    if (policy_.jitter) {
      // Seeded once per thread, on its first jittered pause: a random_device per call costs a
      // system call.
      thread_local std::mt19937_64 rng(std::random_device{}());
      pause = std::chrono::milliseconds(std::uniform_int_distribution<int64_t>(0, bound_.count())(rng));
    }
    bound_ = std::min(policy_.max, bound_ * 2);
    ++retries_;
    return pause;
  }

  // Sleeps the next pause, unless it would end at or after `deadline`: then false, at once.
  template <typename Clock, typename Duration>
  bool SleepBefore(std::chrono::time_point<Clock, Duration> deadline) {
    auto pause = Next();
    if (Clock::now() + pause >= deadline) return false;
    std::this_thread::sleep_for(pause);
    return true;
  }

  // From `initial` again.
  void Reset() { bound_ = policy_.initial; }
  // How many pauses were asked for.
  uint32_t retries() const { return retries_; }

 private:
  BackoffPolicy policy_;
  std::chrono::milliseconds bound_;
  uint32_t retries_ = 0;
};

}  // namespace granary
