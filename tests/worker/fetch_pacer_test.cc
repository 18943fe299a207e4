// FetchPacer with a fake clock: the target follows measured bandwidth x latency, stays within its
// bounds, and fetch-ahead yields its slots to demand misses.
#include "worker/fetch_pacer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "tests/testutil/testutil.h"

namespace granary::worker {
namespace {

using namespace std::chrono_literals;

class FakeClock {
 public:
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::time_point(100s);
  FetchPacer::Clock fn() {
    return [this] { return now; };
  }
};

TEST(FetchPacer, StartsAtItsStartValueWithinTheCap) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  EXPECT_EQ(p.Target(64), FetchPacer::kStartInflight);
  EXPECT_EQ(p.Target(3), 3u);  // the mount's cap wins
  EXPECT_EQ(p.Target(1), 1u);
}

TEST(FetchPacer, TargetIsTwiceTheBandwidthDelayProduct) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  // 100 KB requests taking 20 ms, 25 of them completing per 250 ms window: 10 MB/s.
  for (int w = 0; w < 3; ++w) {
    for (int i = 0; i < 25; ++i) p.Record(100000, 0.020);
    clock.now += FetchPacer::kWindow;
  }
  // 2 x 10 MB/s x 20 ms / 100 KB = 4... the window counted 2.5 MB per 0.25 s = 10 MB/s.
  EXPECT_EQ(p.Target(256), 4u);
  // Ten times the bandwidth at the same latency: ten times the requests in flight.
  for (int w = 0; w < 3; ++w) {
    for (int i = 0; i < 250; ++i) p.Record(100000, 0.020);
    clock.now += FetchPacer::kWindow;
  }
  EXPECT_EQ(p.Target(256), 40u);
  EXPECT_EQ(p.Target(16), 16u);  // capped
  FetchPacer::Snapshot s = p.Get();
  EXPECT_NEAR(s.bandwidth, 100e6, 1e6);
  EXPECT_NEAR(s.latency, 0.020, 1e-9);
}

// A cold start ramps per round trip, not per window: with fetches of 100 KB taking 20 ms, what
// completed since the window opened (never counted over less than a round trip) sets the target.
TEST(FetchPacer, AColdStartRampsPerRoundTrip) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  p.Record(100000, 0.020);  // the first fetch opens the window: 100 KB per 20 ms = 5 MB/s
  EXPECT_EQ(p.Target(256), FetchPacer::kMinInflight);
  for (int i = 0; i < 7; ++i) p.Record(100000, 0.020);  // 8 fetches' worth in one round trip
  EXPECT_EQ(p.Target(256), 16u);  // 2 x 8 x 100 KB / 20 ms x 20 ms / 100 KB
  clock.now += 20ms;
  for (int i = 0; i < 16; ++i) p.Record(100000, 0.020);  // the 16 it allowed: 24 in 20 ms
  EXPECT_EQ(p.Target(256), 48u);
  clock.now += 20ms;
  for (int i = 0; i < 48; ++i) p.Record(100000, 0.020);  // 72 in 40 ms: 180 MB/s
  EXPECT_EQ(p.Target(256), 72u);
  EXPECT_EQ(p.Target(32), 32u);  // the mount's cap still wins
  // Dividing by the whole 250 ms window, as before, made this 72 x 100 KB / 0.25 s = 28.8 MB/s:
  // a target of 12 after 40 ms, and 4 after the first round trip.
}

TEST(FetchPacer, LatencyIsTheShortestRecentFetchAndAgesOut) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  p.Record(100000, 0.005);
  p.Record(100000, 0.050);
  EXPECT_NEAR(p.Get().latency, 0.005, 1e-9);
  clock.now += 11s;  // older than the 10 s the latency is remembered for
  p.Record(100000, 0.030);
  EXPECT_NEAR(p.Get().latency, 0.030, 1e-9);
}

TEST(FetchPacer, ALocalStoreNeedsFewRequestsInFlight) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  for (int w = 0; w < 3; ++w) {
    for (int i = 0; i < 100; ++i) p.Record(4 << 20, 0.002);  // 4 MiB in 2 ms
    clock.now += FetchPacer::kWindow;
  }
  // 1.6 GB/s x 2 ms / 4 MiB = 0.8 -> 2 with the gain; never below kMinInflight.
  EXPECT_EQ(p.Target(256), FetchPacer::kMinInflight);
}

TEST(FetchPacer, DemandMissesTakeSlotsFromFetchAhead) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  const uint32_t cap = 3;
  ASSERT_TRUE(p.AcquireAhead(cap, nullptr));
  ASSERT_TRUE(p.AcquireAhead(cap, nullptr));
  p.DemandStarted();  // 2 ahead + 1 demand = the cap: no third ahead slot
  std::atomic<int> polls{0};
  EXPECT_FALSE(p.AcquireAhead(cap, [&] { return ++polls > 2; }));  // gave up: stopped
  p.ReleaseAhead();  // 1 ahead + 1 demand: one slot free
  EXPECT_TRUE(p.AcquireAhead(cap, nullptr));
  EXPECT_EQ(p.Get().ahead_inflight, 2u);
  EXPECT_EQ(p.Get().demand_inflight, 1u);
  // A waiting fetch-ahead gets its slot when the demand miss ends.
  std::atomic<bool> got{false};
  std::thread t([&] { got = p.AcquireAhead(cap, nullptr); });
  p.DemandDone();
  t.join();
  EXPECT_TRUE(got);
  EXPECT_EQ(p.Get().ahead_inflight, 3u);
  EXPECT_EQ(p.Get().demand_inflight, 0u);
}

// Slots are handed to waiters one by one, first come first served; a waiter whose cap is full does
// not hold up one behind it with a larger cap.
TEST(FetchPacer, SlotsGoToWaitersInTheOrderTheyCame) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  const uint32_t cap = 4;
  for (uint32_t i = 0; i < cap; ++i) ASSERT_TRUE(p.AcquireAhead(cap, nullptr));
  Mutex mu;
  std::vector<int> order;  // GUARDED_BY(mu)
  std::vector<std::thread> waiters;
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&, i] {
      EXPECT_TRUE(p.AcquireAhead(cap, nullptr));
      MutexLock lock(&mu);
      order.push_back(i);
    });
    // The next waiter queues only once this one waits (its slot count shows it is not through).
    testing::WaitFor([&] { return p.Waiting() == static_cast<size_t>(i + 1); });
    ASSERT_EQ(p.Waiting(), static_cast<size_t>(i + 1));
  }
  auto granted = [&] {
    MutexLock lock(&mu);
    return order.size();
  };
  for (size_t released = 1; released <= 3; ++released) {
    p.ReleaseAhead();
    testing::WaitFor([&] { return granted() >= released; });
    EXPECT_EQ(granted(), released);  // one release: one waiter through
    EXPECT_EQ(p.Get().ahead_inflight, cap);
  }
  for (auto& t : waiters) t.join();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  // A waiter with a cap of 4 (full) queued first; one with a cap of 6 behind it goes at once.
  std::atomic<bool> small{false}, give_up{false};
  std::thread t([&] { small = p.AcquireAhead(cap, [&] { return give_up.load(); }); });
  testing::WaitFor([&] { return p.Waiting() >= 1; });
  ASSERT_EQ(p.Waiting(), 1u);
  // At once: it looks at `stop` on entry and once granted; its third look, which only waiting
  // (and waking for the timeout) would reach, says stop.
  int looks = 0;
  EXPECT_TRUE(p.AcquireAhead(6, [&] { return looks++ >= 2; }));
  EXPECT_EQ(p.Get().ahead_inflight, 5u);
  give_up = true;
  t.join();  // stopped once the larger cap's slot was taken: its own stayed full
  EXPECT_FALSE(small);
  EXPECT_EQ(p.Waiting(), 0u);
}

// A fetch-ahead keeping its slot for its next fetch may do so while the fetches in flight are
// within the target, and must yield once a demand miss takes the room.
TEST(FetchPacer, AKeptSlotYieldsToADemandMiss) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  const uint32_t cap = 2;
  ASSERT_TRUE(p.AcquireAhead(cap, nullptr));
  ASSERT_TRUE(p.AcquireAhead(cap, nullptr));
  EXPECT_TRUE(p.WithinTarget(cap));  // 2 in flight, target 2: each may keep its slot
  p.DemandStarted();
  EXPECT_FALSE(p.WithinTarget(cap));  // 3 in flight: a holder gives its slot back
  p.ReleaseAhead();
  EXPECT_TRUE(p.WithinTarget(cap));
  p.DemandDone();
  p.ReleaseAhead();
  EXPECT_EQ(p.Get().ahead_inflight, 0u);
}

// A waiter granted a slot after its batch was stopped gives it on instead of fetching with it.
TEST(FetchPacer, AStoppedWaiterPassesItsGrantOn) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  const uint32_t cap = 4;
  for (uint32_t i = 0; i < cap; ++i) ASSERT_TRUE(p.AcquireAhead(cap, nullptr));
  std::atomic<bool> stopped{false};
  std::atomic<int> first{-1}, second{-1};
  std::thread a([&] { first = p.AcquireAhead(cap, [&] { return stopped.load(); }) ? 1 : 0; });
  testing::WaitFor([&] { return p.Waiting() >= 1; });
  std::thread b([&] { second = p.AcquireAhead(cap, nullptr) ? 1 : 0; });
  testing::WaitFor([&] { return p.Waiting() >= 2; });
  EXPECT_EQ(p.Waiting(), 2u);
  stopped = true;
  p.ReleaseAhead();  // granted to the first in line, which is stopped: the second gets it
  a.join();
  b.join();
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(p.Get().ahead_inflight, cap);
}

TEST(FetchPacer, AnIdleLinkIsForgotten) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  for (int i = 0; i < 250; ++i) p.Record(100000, 0.020);
  clock.now += FetchPacer::kWindow;
  EXPECT_GT(p.Target(256), FetchPacer::kStartInflight);
  clock.now += 30s;
  p.Record(100000, 0.020);  // one fetch after a long pause
  clock.now += FetchPacer::kWindow;
  EXPECT_LE(p.Target(256), FetchPacer::kMinInflight);
}

}  // namespace
}  // namespace granary::worker
