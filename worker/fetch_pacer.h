// FetchPacer: how many under-storage fetches a worker's fetch-ahead keeps in flight, and the rule
// that demand misses go first.
//
// Design
// ------
// A store 20 ms away answers each request after a round trip whatever its size, so one fetch at a
// time moves one block per 20 ms; filling the link takes bandwidth × latency bytes in flight (the
// bandwidth-delay product). Neither is known in advance, and both change (another zone, a busy
// store, a capped link), so the pacer measures them from the fetches the worker makes anyway —
// demand misses and fetch-ahead alike — the way BBR paces a TCP sender:
//   - bandwidth: bytes completed per 250 ms window; the estimate is the largest of the last 8
//     windows (2 s), so a pause between reads does not make it forget the link at once, or of the
//     open window's bytes over the time it has been open (at least one round trip), so a cold
//     start need not wait for a whole window;
//   - latency: the shortest fetch of the last 10 s (the round trip with the least queueing: a
//     longer one is the link's queue or a large block's transfer, which the bandwidth covers);
//   - request size: a moving mean of the bytes per fetch.
// Target in flight = 2 × bandwidth × latency / request size (the gain of 2 keeps the link full
// while the estimate catches up: with N in flight over a round trip, the open window measures
// N requests' worth per round trip and allows 2N, so the ramp doubles per round trip (never
// faster: a fetch is never shorter than the round trip, so the fetches that complete within one
// were all in flight at its start) until the link is full, where
// the measured bandwidth stops growing and the target with it). At least kMinInflight, at most the
// caller's cap (the mount's cache.fetch_ahead.inflight).
//
// Slow start. The formula alone ramps slowly from a cold start: a store's fetches take longer than
// its shortest one well before the link is full (RGW on this rig: 41 ms on average at 16 or 32 in
// flight against a 21 ms round trip, its median 24-26 ms), so 2 x bandwidth x shortest latency is
// about what is already in flight, and the cold epoch's first 0.7-0.9 s went by at a third of the
// link (docs/benchmarks.md, session 45). So from a cold start (and after a link idle for the whole
// bandwidth history) the target is at least a window that starts at kStartInflight and grows by one
// for every fetch completing within kStartupDelay x the latency estimate while the pacer is what
// holds fetches back — doubling per round trip while the store answers without queueing, slowing
// as its answers queue (HyStart's delay test, softened) — and ends for good once
// kStartupFlatRounds round trips in a row, each with the pacer the limit, brought less than 25%
// more bandwidth than the best before them (BBR's full-pipe test). A round trip ends when a fetch
// that started after it began completes.
//
// Demand misses go first: a fetch-ahead slot is granted only while fetch-ahead plus demand
// fetches in flight are fewer than the target, so each demand miss in flight takes a slot away
// from fetch-ahead (not the other way round), and a burst of demand misses stops fetch-ahead until
// it drains.
//
// Slots are handed over, not fought for: a fetch-ahead that must wait queues (first come, first
// served) with a condition variable of its own, and whoever frees a slot or raises the target
// grants it to the next waiter(s) and wakes only those. A shared condition variable with
// notify_all on every growth of the target woke every waiting fetch (a load batch has up to 256)
// to find one slot: that herd was a third of a worker's CPU in a cold epoch (docs/benchmarks.md,
// session 34).
//
// Thread-safe. The clock is injectable for tests.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>

#include "common/thread_annotations.h"

namespace granary::worker {

class FetchPacer {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  static constexpr uint32_t kMinInflight = 4;
  static constexpr uint32_t kStartInflight = 8;
  static constexpr uint32_t kMaxCap = 256;  // cache.fetch_ahead.inflight's maximum
  static constexpr std::chrono::milliseconds kWindow{250};
  static constexpr size_t kBandwidthWindows = 8;  // 2 s
  static constexpr size_t kLatencySlots = 10;     // of 1 s each
  static constexpr double kStartupDelay = 1.5;    // a fetch this many latencies long grows no window
  static constexpr int kStartupFlatRounds = 3;

  explicit FetchPacer(Clock clock = nullptr);

  // Every under-storage fetch that completed: its bytes and how long it took.
  void Record(uint64_t bytes, double seconds);

  // A demand miss's fetch starts / ends (it holds a slot fetch-ahead cannot have meanwhile).
  void DemandStarted();
  void DemandDone();

  // Waits for a fetch-ahead slot: until fetch-ahead and demand fetches in flight are fewer than
  // min(Target(), cap), after the fetch-aheads that began waiting earlier (a waiter whose cap is
  // full does not hold up one with a larger cap). False when `stop()` became true first (checked
  // while waiting every 200 ms by the first in line, every second by the others).
  bool AcquireAhead(uint32_t cap, const std::function<bool()>& stop);
  void ReleaseAhead();
  // Whether the fetches in flight (fetch-ahead and demand) are within min(Target(), cap): a
  // fetch-ahead holding a slot may keep it for its next fetch.
  bool WithinTarget(uint32_t cap);

  struct Snapshot {
    uint32_t target = 0;            // fetches in flight fetch-ahead and demand may have together
    uint32_t ahead_inflight = 0;
    uint32_t demand_inflight = 0;
    double bandwidth = 0;           // bytes/s, the estimate
    double latency = 0;             // s, the estimate (0: none yet)
    bool starting = true;           // in slow start
  };
  Snapshot Get() const;
  // Fetch-aheads waiting for a slot now.
  size_t Waiting() const;
  // The target for a cap (what AcquireAhead uses).
  uint32_t Target(uint32_t cap) const;

 private:
  void RollLocked(std::chrono::steady_clock::time_point now) REQUIRES(mu_);
  uint32_t TargetLocked(uint32_t cap) const REQUIRES(mu_);
  uint32_t RawTargetLocked() const REQUIRES(mu_);  // before the caller's cap and kMinInflight
  double LatencyLocked() const REQUIRES(mu_);      // the shortest fetch remembered; 0: none
  // Slow start's bookkeeping for a fetch of `bytes` that took `seconds` and completed `now`.
  void StartupLocked(std::chrono::steady_clock::time_point now, uint64_t bytes, double seconds) REQUIRES(mu_);
  void RestartLocked() REQUIRES(mu_);  // back to slow start
  // Whether slow start's window is what holds fetches back now (fetch-aheads wait for a slot, or
  // the fetches in flight fill the window), not the callers having fewer to make.
  bool FullLocked() const REQUIRES(mu_);
  static uint32_t Clamped(uint32_t raw, uint32_t cap);
  // A fetch-ahead waiting for a slot (on AcquireAhead's stack while queued in waiters_).
  struct Waiter {
    uint32_t cap = 0;
    bool granted = false;  // the slot is its (ahead_ counts it already)
    std::condition_variable cv;
  };
  // Grants free slots to the waiters, in the order they came, and wakes each granted one.
  void GrantLocked() REQUIRES(mu_);

  Clock clock_;
  mutable Mutex mu_;
  std::deque<Waiter*> waiters_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point window_start_ GUARDED_BY(mu_);
  uint64_t window_bytes_ GUARDED_BY(mu_) = 0;
  std::array<double, kBandwidthWindows> bw_ GUARDED_BY(mu_){};  // bytes/s of past windows
  size_t bw_next_ GUARDED_BY(mu_) = 0;
  bool measured_ GUARDED_BY(mu_) = false;
  std::array<double, kLatencySlots> lat_ GUARDED_BY(mu_){};  // min seconds per 1 s slot; 0: none
  int64_t lat_slot_ GUARDED_BY(mu_) = -1;                    // the current slot's second
  double mean_bytes_ GUARDED_BY(mu_) = 0;
  uint32_t ahead_ GUARDED_BY(mu_) = 0;
  uint32_t demand_ GUARDED_BY(mu_) = 0;
  // Slow start.
  bool starting_ GUARDED_BY(mu_) = true;
  uint32_t start_window_ GUARDED_BY(mu_) = kStartInflight;  // slow start's window (a floor of the target)
  bool round_open_ GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point round_start_ GUARDED_BY(mu_);
  uint64_t round_bytes_ GUARDED_BY(mu_) = 0;
  bool round_full_ GUARDED_BY(mu_) = false;  // the pacer was the limit at some point of the round
  double full_bw_ GUARDED_BY(mu_) = 0;       // the best round's bandwidth, bytes/s
  int flat_rounds_ GUARDED_BY(mu_) = 0;
};

// Holds a demand slot for its lifetime.
class DemandFetch {
 public:
  explicit DemandFetch(FetchPacer* p) : p_(p) { p_->DemandStarted(); }
  ~DemandFetch() { p_->DemandDone(); }
  DemandFetch(const DemandFetch&) = delete;
  DemandFetch& operator=(const DemandFetch&) = delete;

 private:
  FetchPacer* p_;
};

}  // namespace granary::worker
