// ThreadPool: tasks that wait on each other all run (the pool grows while every thread is busy),
// it shrinks back when idle, and the destructor runs what was posted.
#include "common/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace granary {
namespace {

bool Eventually(const std::function<bool()>& cond, std::chrono::seconds limit = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

TEST(ThreadPool, GrowsForTasksThatWaitOnEachOtherAndShrinksWhenIdle) {
  ThreadPool pool(1, 16, std::chrono::milliseconds(50));
  std::mutex mu;
  std::condition_variable cv;
  int started = 0;
  std::atomic<int> done{0};
  constexpr int kTasks = 8;
  for (int i = 0; i < kTasks; ++i) {
    pool.Post([&] {
      std::unique_lock<std::mutex> lock(mu);
      ++started;
      cv.notify_all();
      // Each task waits for all of them: only a pool that grew to kTasks threads finishes.
      if (cv.wait_for(lock, std::chrono::seconds(30), [&] { return started == kTasks; })) ++done;
    });
  }
  ASSERT_TRUE(Eventually([&] { return done.load() == kTasks; })) << done.load() << " of " << kTasks;
  EXPECT_LE(pool.threads(), 16u);
  EXPECT_TRUE(Eventually([&] { return pool.threads() == 1; })) << pool.threads() << " threads after idling";
  pool.Post([&] { ++done; });  // a pool shrunk back still runs tasks
  EXPECT_TRUE(Eventually([&] { return done.load() == kTasks + 1; }));
}

TEST(ThreadPool, NeverMoreThanItsMaximum) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(0, 2);
    std::atomic<bool> go{false};
    for (int i = 0; i < 6; ++i) {
      pool.Post([&] {
        while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ++ran;
      });
    }
    EXPECT_EQ(pool.threads(), 2u);
    go = true;
  }  // the destructor runs every task posted
  EXPECT_EQ(ran.load(), 6);
}

}  // namespace
}  // namespace granary
