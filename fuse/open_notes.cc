#include "fuse/open_notes.h"

#include <spdlog/spdlog.h>

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

void OpenNotes::Loop() {
  for (;;) {
    std::vector<uint64_t> batch;
    {
      MutexLock lock(&mu_);
      while (!stop_ && pending_.empty()) lock.Wait(&cv_);
      // The first note starts the clock: a batch waits at most kFlushEvery, or until it is full.
      const auto due = std::chrono::steady_clock::now() + kFlushEvery;
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
