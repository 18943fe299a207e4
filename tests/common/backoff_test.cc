// Backoff: the one retry schedule (common/backoff.h).
#include "common/backoff.h"

#include <gtest/gtest.h>

#include <chrono>

namespace granary {
namespace {

using std::chrono::milliseconds;

TEST(BackoffTest, DoublesUpToItsMaximumAndStartsAgainOnReset) {
  Backoff b({milliseconds(20), milliseconds(100), false});
  EXPECT_EQ(b.Next(), milliseconds(20));
  EXPECT_EQ(b.Next(), milliseconds(40));
  EXPECT_EQ(b.Next(), milliseconds(80));
  EXPECT_EQ(b.Next(), milliseconds(100));
  EXPECT_EQ(b.Next(), milliseconds(100));
  EXPECT_EQ(b.retries(), 5u);
  b.Reset();
  EXPECT_EQ(b.Next(), milliseconds(20));
}

TEST(BackoffTest, AJitteredPauseStaysWithinItsBoundAndVaries) {
  bool varied = false;
  milliseconds first{-1};
  for (int trial = 0; trial < 50; ++trial) {
    Backoff b(kUnderStorageRetry);
    milliseconds bound = kUnderStorageRetry.initial;
    for (int i = 0; i < 8; ++i) {
      milliseconds p = b.Next();
      EXPECT_GE(p.count(), 0);
      EXPECT_LE(p, bound);
      bound = std::min(kUnderStorageRetry.max, bound * 2);
      if (i == 0) {
        if (first.count() >= 0 && p != first) varied = true;
        first = p;
      }
    }
  }
  EXPECT_TRUE(varied) << "50 first pauses drawn from [0, 200 ms] were all the same";
}

TEST(BackoffTest, NoSleepThatWouldEndPastTheDeadline) {
  Backoff b({milliseconds(60'000), milliseconds(60'000), false});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(b.SleepBefore(start + milliseconds(1000)));  // a minute's pause does not fit in a second
  EXPECT_LT(std::chrono::steady_clock::now() - start, milliseconds(30'000)) << "it slept anyway";
  Backoff quick({milliseconds(1), milliseconds(1), false});
  EXPECT_TRUE(quick.SleepBefore(std::chrono::steady_clock::now() + milliseconds(60'000)));
}

}  // namespace
}  // namespace granary
