// RateLimiter and Shutdown: their waits end when they should (both were moved onto the annotated
// Mutex; these pin down the behaviour their waits had).
#include "common/rate_limiter.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/shutdown.h"

namespace granary {
namespace {

TEST(RateLimiterTest, UnlimitedNeverWaits) {
  RateLimiter r(0);
  for (int i = 0; i < 1000; ++i) EXPECT_TRUE(r.Acquire(uint64_t{1} << 40));
}

TEST(RateLimiterTest, AWaiterGoesOnceTheDebtBeforeItIsPaidAndStopEndsItsWait) {
  RateLimiter r(1);  // one byte a second
  // A caller goes once the debt before it is paid: none is, so this hour's worth passes at once...
  ASSERT_TRUE(r.Acquire(3600));
  // ...and the next caller owes it: it waits until stopped (or finds the limiter stopped).
  std::atomic<int> result{-1};
  std::thread waiter([&] { result = r.Acquire(1) ? 1 : 0; });
  r.Stop();
  waiter.join();
  EXPECT_EQ(result.load(), 0);
  EXPECT_FALSE(r.Acquire(1)) << "a stopped limiter lets nothing pass";
}

TEST(ShutdownTest, WaitEndsOnceRequestedAndKeepsTheFirstReason) {
  EXPECT_FALSE(Shutdown::WaitFor(std::chrono::milliseconds(1)));
  EXPECT_FALSE(Shutdown::Requested());
  std::string reason;
  std::thread waiter([&] { reason = Shutdown::Wait(); });
  Shutdown::Request("first");
  Shutdown::Request("second");
  waiter.join();
  EXPECT_EQ(reason, "first");
  EXPECT_TRUE(Shutdown::Requested());
  EXPECT_TRUE(Shutdown::WaitFor(std::chrono::milliseconds(0)));
}

}  // namespace
}  // namespace granary
