// ThreadPool: threads running posted tasks in order of posting, for work that may block for long
// (calls to the under-storage) and must not run on threads that serve other calls (gRPC's callback
// threads). It grows a thread whenever a task finds none idle, up to `max_threads` (so tasks that
// wait on each other, such as callers behind one slow listing, do not hold up the rest), and a
// thread idle for `idle` ends, down to `min_threads`. The destructor runs every task already
// posted, then joins. Thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

namespace granary {

class ThreadPool {
 public:
  ThreadPool(size_t min_threads, size_t max_threads, std::chrono::milliseconds idle = std::chrono::seconds(60))
      : min_(min_threads), max_(std::max<size_t>(1, max_threads)), idle_timeout_(idle) {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < min_; ++i) SpawnLocked();
  }
  ~ThreadPool() {
    std::map<std::thread::id, std::thread> threads;
    {
      MutexLock lock(&mu_);
      stop_ = true;
      threads.swap(threads_);
      for (auto& t : exited_) threads.emplace(t.get_id(), std::move(t));
      exited_.clear();
    }
    cv_.notify_all();
    for (auto& [id, t] : threads) {
      if (t.joinable()) t.join();
    }
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> task) EXCLUDES(mu_) {
    std::vector<std::thread> ended;
    {
      MutexLock lock(&mu_);
      tasks_.push_back(std::move(task));
      if (idle_ < tasks_.size() && threads_.size() < max_) SpawnLocked();
      ended.swap(exited_);
    }
    cv_.notify_one();
    for (auto& t : ended) t.join();  // threads that ended for idleness: reaped here
  }

  size_t threads() const EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return threads_.size();
  }

 private:
  void SpawnLocked() REQUIRES(mu_) {
    std::thread t([this] { Run(); });
    std::thread::id id = t.get_id();
    threads_.emplace(id, std::move(t));
  }

  void Run() EXCLUDES(mu_) {
    for (;;) {
      std::function<void()> task;
      {
        MutexLock lock(&mu_);
        ++idle_;
        bool timed_out = false;
        while (!stop_ && tasks_.empty() && !timed_out) timed_out = !lock.WaitFor(&cv_, idle_timeout_);
        --idle_;
        if (tasks_.empty()) {
          if (stop_) return;  // the destructor joins this thread
          if (threads_.size() > min_) {
            // Idle for long: end; the next Post joins this thread.
            auto self = threads_.find(std::this_thread::get_id());
            exited_.push_back(std::move(self->second));
            threads_.erase(self);
            return;
          }
          continue;
        }
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  const size_t min_, max_;
  const std::chrono::milliseconds idle_timeout_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  size_t idle_ GUARDED_BY(mu_) = 0;  // threads waiting for a task
  bool stop_ GUARDED_BY(mu_) = false;
  std::map<std::thread::id, std::thread> threads_ GUARDED_BY(mu_);
  std::vector<std::thread> exited_ GUARDED_BY(mu_);  // ended for idleness, not yet joined
};

}  // namespace granary
