#include "fuse/open_notes.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace granary::fuse {

OpenNotes::OpenNotes(size_t capacity, Send send) : send_(std::move(send)), listed_(capacity) {
  thread_ = std::thread([this] { Loop(); });
}

OpenNotes::~OpenNotes() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OpenNotes::Listed(uint64_t ino) {
  MutexLock lock(&mu_);
  listed_.Put(ino, true);
}

void OpenNotes::Forget(uint64_t ino) {
  MutexLock lock(&mu_);
  listed_.Erase(ino);
}

bool OpenNotes::Opened(uint64_t ino) {
  bool wake;
  {
    MutexLock lock(&mu_);
    if (listed_.Find(ino) == nullptr) return false;
    listed_.Erase(ino);
    if (pending_.size() >= kMaxPending) {
      ++dropped_;
      return true;
    }
    pending_.push_back(ino);
    wake = pending_.size() == 1 || pending_.size() >= kBatch;  // a batch's clock starts, or it is full
  }
  if (wake) cv_.notify_one();
  return true;
}

uint64_t OpenNotes::sent() const {
  MutexLock lock(&mu_);
  return sent_;
}

uint64_t OpenNotes::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

uint64_t OpenNotes::failed_calls() const {
  MutexLock lock(&mu_);
  return failed_;
}

std::chrono::milliseconds OpenNotes::NextInterval(std::chrono::milliseconds now, uint64_t sent_since_quiet,
                                                  std::chrono::steady_clock::duration quiet) {
  if (quiet >= kFlushMost || sent_since_quiet < kStartNotes) return kFlushEvery;
  return std::min(now * 2, kFlushMost);
}

void OpenNotes::Loop() {
  std::chrono::milliseconds interval = kFlushEvery;
  std::chrono::steady_clock::time_point last_sent;  // of the last call; none yet: a quiet spell
  uint64_t since_quiet = 0;  // notes in the calls since the last quiet spell
  for (;;) {
    std::vector<uint64_t> batch;
    {
      MutexLock lock(&mu_);
      while (!stop_ && pending_.empty()) lock.Wait(&cv_);
      // The first note starts the clock: a batch waits at most the interval, or until it is full.
      const auto first = std::chrono::steady_clock::now();
      const auto quiet = last_sent == std::chrono::steady_clock::time_point{} ? std::chrono::steady_clock::duration(kFlushMost)
                                                                             : first - last_sent;
      if (quiet >= kFlushMost) since_quiet = 0;
      interval = NextInterval(interval, since_quiet, quiet);
      const auto due = first + interval;
      while (!stop_ && pending_.size() < kBatch && lock.WaitUntil(&cv_, due)) {
      }
      if (stop_) return;
      if (pending_.size() <= kBatch) {
        batch.swap(pending_);
      } else {
        batch.assign(pending_.begin(), pending_.begin() + kBatch);
        pending_.erase(pending_.begin(), pending_.begin() + kBatch);
      }
    }
    Status st = send_(batch);  // without the lock: opens go on noting meanwhile
    last_sent = std::chrono::steady_clock::now();
    since_quiet += batch.size();
    MutexLock lock(&mu_);
    if (st.ok()) {
      sent_ += batch.size();
    } else if (failed_++ == 0) {
      spdlog::info("noting {} opens to the master failed ({}); fetch-ahead may start later", batch.size(),
                   st.message());
    }
  }
}

}  // namespace granary::fuse
