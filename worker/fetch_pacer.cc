#include "worker/fetch_pacer.h"

#include <algorithm>
#include <cmath>

namespace granary::worker {

FetchPacer::FetchPacer(Clock clock) : clock_(std::move(clock)) {
  if (!clock_) clock_ = [] { return std::chrono::steady_clock::now(); };
  window_start_ = clock_();
}

void FetchPacer::RollLocked(std::chrono::steady_clock::time_point now) {
  // Close every window that ended before `now`: the first with its bytes, the rest (idle) with none.
  while (now - window_start_ >= kWindow) {
    bw_[bw_next_] = static_cast<double>(window_bytes_) / std::chrono::duration<double>(kWindow).count();
    bw_next_ = (bw_next_ + 1) % kBandwidthWindows;
    window_bytes_ = 0;
    window_start_ += kWindow;
    if (now - window_start_ > kWindow * kBandwidthWindows) {  // idle longer than the whole history
      bw_.fill(0);
      window_start_ = now;
      RestartLocked();
      break;
    }
  }
}

void FetchPacer::Record(uint64_t bytes, double seconds) {
  auto now = clock_();
  bool grew;
  {
    MutexLock lock(&mu_);
    const uint32_t before = TargetLocked(kMaxCap);
    RollLocked(now);
    window_bytes_ += bytes;
    measured_ = true;
    mean_bytes_ = mean_bytes_ == 0 ? static_cast<double>(bytes) : 0.9 * mean_bytes_ + 0.1 * static_cast<double>(bytes);
    int64_t second = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
    if (second != lat_slot_) {
      // Slots of seconds that passed with no fetch hold nothing.
      if (lat_slot_ < 0 || second - lat_slot_ >= static_cast<int64_t>(kLatencySlots)) {
        lat_.fill(0);
      } else {
        for (int64_t s = lat_slot_ + 1; s <= second; ++s) lat_[s % kLatencySlots] = 0;
      }
      lat_slot_ = second;
    }
    double& slot = lat_[second % kLatencySlots];
    if (seconds > 0 && (slot == 0 || seconds < slot)) slot = seconds;
    if (starting_) StartupLocked(now, bytes, seconds);
    grew = TargetLocked(kMaxCap) > before;
    if (grew) GrantLocked();  // more slots for the waiting fetch-aheads; else nobody can go on
  }
}

void FetchPacer::RestartLocked() {
  starting_ = true;
  start_window_ = kStartInflight;
  round_open_ = false;
  round_bytes_ = 0;
  round_full_ = false;
  full_bw_ = 0;
  flat_rounds_ = 0;
}

bool FetchPacer::FullLocked() const {
  return !waiters_.empty() || ahead_ + demand_ >= start_window_;
}

void FetchPacer::StartupLocked(std::chrono::steady_clock::time_point now, uint64_t bytes, double seconds) {
  // The fetch is still counted in flight (its caller releases its slot after Record).
  const bool full = FullLocked();
  round_full_ = round_full_ || full;
  // Grow only while the window is what limits: readers with fewer misses than the window leave it
  // where it is (TCP grows its window only while it is full, for the same reason).
  if (full && seconds <= kStartupDelay * LatencyLocked()) start_window_ = std::min(start_window_ + 1, kMaxCap);
  if (!round_open_) {
    round_open_ = true;
    round_start_ = now;
    round_bytes_ = bytes;
    return;
  }
  round_bytes_ += bytes;
  const auto started = now - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(seconds));
  if (started < round_start_) return;  // in flight when the round began: the round goes on
  const double span = std::chrono::duration<double>(now - round_start_).count();
  const double bw = span > 0 ? static_cast<double>(round_bytes_) / span : 0;
  if (bw >= 1.25 * full_bw_) {
    full_bw_ = bw;
    flat_rounds_ = 0;
  } else if (round_full_ && ++flat_rounds_ >= kStartupFlatRounds) {
    starting_ = false;  // the link (or the store) is full: the formula's target from here on
  }
  round_start_ = now;
  round_bytes_ = 0;
  round_full_ = full;
}

void FetchPacer::DemandStarted() {
  MutexLock lock(&mu_);
  ++demand_;
}

void FetchPacer::DemandDone() {
  MutexLock lock(&mu_);
  --demand_;
  GrantLocked();  // one slot free: one waiter
}

uint32_t FetchPacer::TargetLocked(uint32_t cap) const { return Clamped(RawTargetLocked(), cap); }

uint32_t FetchPacer::Clamped(uint32_t raw, uint32_t cap) {
  cap = std::max<uint32_t>(cap, 1);
  return std::clamp(raw, std::min(kMinInflight, cap), cap);
}

double FetchPacer::LatencyLocked() const {
  double lat = 0;
  for (double l : lat_) {
    if (l > 0 && (lat == 0 || l < lat)) lat = l;
  }
  return lat;
}

uint32_t FetchPacer::RawTargetLocked() const {
  const double lat = LatencyLocked();
  double bw = *std::max_element(bw_.begin(), bw_.end());
  if (window_bytes_ > 0 && lat > 0) {
    // The open window counts too once it shows more than the closed ones: its bytes over the time
    // it has been open, but never less than one round trip. Every fetch completed within a round
    // trip was in flight at its start (none is shorter than `lat`), so this is at most the fetches
    // in flight then, per round trip: the target at most doubles per round trip, as TCP's slow
    // start does. Dividing by the whole window instead held a cold start at kMinInflight for most
    // of a window (a few completions / 250 ms), while 8 readers' demand misses took every slot.
    const double window = std::chrono::duration<double>(kWindow).count();
    const double open = std::chrono::duration<double>(clock_() - window_start_).count();
    bw = std::max(bw, static_cast<double>(window_bytes_) / std::clamp(open, std::min(lat, window), window));
  }
  uint32_t target = 0;
  if (measured_ && bw > 0 && lat > 0 && mean_bytes_ > 0) {
    double t = std::ceil(2.0 * bw * lat / mean_bytes_);
    target = static_cast<uint32_t>(std::min<double>(t, 1 << 20));
  }
  if (starting_) target = std::max(target, start_window_);
  return target;
}

uint32_t FetchPacer::Target(uint32_t cap) const {
  MutexLock lock(&mu_);
  return TargetLocked(cap);
}

void FetchPacer::GrantLocked() {
  if (waiters_.empty()) return;
  const uint32_t raw = RawTargetLocked();
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    Waiter* w = *it;
    if (ahead_ + demand_ >= Clamped(raw, w->cap)) {
      if (w->cap >= kMaxCap) return;  // nobody behind can have a larger target
      ++it;
      continue;
    }
    ++ahead_;
    w->granted = true;
    // Under the lock: once it is unlocked the waiter may return (a timed wake-up that finds the
    // grant) and its condition variable be gone.
    w->cv.notify_one();
    it = waiters_.erase(it);
  }
}

bool FetchPacer::AcquireAhead(uint32_t cap, const std::function<bool()>& stop) {
  MutexLock lock(&mu_);
  if (stop && stop()) return false;
  RollLocked(clock_());
  if (waiters_.empty() && ahead_ + demand_ < TargetLocked(cap)) {
    ++ahead_;
    return true;
  }
  Waiter w;
  w.cap = cap;
  waiters_.push_back(&w);
  GrantLocked();  // a larger cap than the waiters' may go past them at once
  for (;;) {
    if (w.granted) {
      if (stop && stop()) {  // granted after its batch was cancelled: the slot goes on
        --ahead_;
        GrantLocked();
        return false;
      }
      return true;
    }
    // A grant usually wakes it; the timeout checks `stop` and lets the target's windows roll
    // (a fetch that never completes records nothing): every 200 ms for the first in line, every
    // second for the others (hundreds may wait; each wake-up costs a switch).
    lock.WaitFor(&w.cv, std::chrono::milliseconds(waiters_.front() == &w ? 200 : 1000));
    if (w.granted) continue;
    if (stop && stop()) {
      waiters_.erase(std::find(waiters_.begin(), waiters_.end(), &w));
      GrantLocked();  // its place may have been what held the others back
      return false;
    }
    if (waiters_.front() == &w) {  // the others wait for grants (and look at `stop` once a second)
      RollLocked(clock_());
      GrantLocked();
    }
  }
}

bool FetchPacer::WithinTarget(uint32_t cap) {
  MutexLock lock(&mu_);
  RollLocked(clock_());
  return ahead_ + demand_ <= TargetLocked(cap);
}

void FetchPacer::ReleaseAhead() {
  MutexLock lock(&mu_);
  --ahead_;
  GrantLocked();
}

size_t FetchPacer::Waiting() const {
  MutexLock lock(&mu_);
  return waiters_.size();
}

FetchPacer::Snapshot FetchPacer::Get() const {
  MutexLock lock(&mu_);
  Snapshot s;
  s.target = TargetLocked(kMaxCap);
  s.ahead_inflight = ahead_;
  s.demand_inflight = demand_;
  s.bandwidth = *std::max_element(bw_.begin(), bw_.end());
  s.latency = LatencyLocked();
  s.starting = starting_;
  return s;
}

}  // namespace granary::worker
