// ThreadPool: a fixed number of threads running posted tasks in order of posting. For work that may
// block for long (calls to the under-storage) and must not run on threads that serve other calls
// (gRPC's callback threads). The destructor runs every task already posted, then joins.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"

namespace granary {

class ThreadPool {
 public:
  explicit ThreadPool(size_t threads) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~ThreadPool() {
    {
      MutexLock lock(&mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Post(std::function<void()> task) EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Run() EXCLUDES(mu_) {
    for (;;) {
      std::function<void()> task;
      {
        MutexLock lock(&mu_);
        while (!stop_ && tasks_.empty()) lock.Wait(&cv_);
        if (tasks_.empty()) return;  // stopping, and nothing left
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  Mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace granary
