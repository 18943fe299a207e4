// FetchPacer with a fake clock: the target follows measured bandwidth x latency, stays within its
// bounds, and fetch-ahead yields its slots to demand misses.
#include "worker/fetch_pacer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
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

// Readers' misses keep the pacer full (demand fetches take slots whatever the target), so its
// measurements count toward slow start's end.
void KeepFull(FetchPacer& p) {
  for (uint32_t i = 0; i < FetchPacer::kMaxCap; ++i) p.DemandStarted();
}

TEST(FetchPacer, TargetIsTwiceTheBandwidthDelayProduct) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  KeepFull(p);
  // 100 KB requests taking 20 ms, 25 of them completing per 250 ms window: 10 MB/s (after the
  // first window, three more with no more bandwidth end slow start).
  for (int w = 0; w < 6; ++w) {
    for (int i = 0; i < 25; ++i) p.Record(100000, 0.020);
    clock.now += FetchPacer::kWindow;
  }
  EXPECT_FALSE(p.Get().starting);
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

// Holds as many fetch-ahead slots as the target allows (fetches waiting to start take every slot
// freed): the pacer is what holds them back. Returns the fetches in flight.
uint32_t Fill(FetchPacer& p) {
  while (p.Get().ahead_inflight + p.Get().demand_inflight < p.Target(FetchPacer::kMaxCap)) {
    if (!p.AcquireAhead(FetchPacer::kMaxCap, nullptr)) break;
  }
  return p.Get().ahead_inflight + p.Get().demand_inflight;
}

// One round trip of `d`: every fetch in flight completes, spread over it, each taking `took(i)`,
// its slot taken again at once (and the new ones the target allows with it).
void Round(FakeClock& clock, FetchPacer& p, std::chrono::milliseconds d, const std::function<double(uint32_t)>& took) {
  const uint32_t n = p.Get().ahead_inflight;
  const auto start = clock.now;
  for (uint32_t i = 0; i < n; ++i) {
    clock.now = start + d * (i + 1) / n;
    p.Record(100000, took(i));
    p.ReleaseAhead();
    Fill(p);
  }
}

// A cold start ramps per round trip, not per window: with fetches of 100 KB taking 20 ms, what
// completed since the window opened (never counted over less than a round trip) sets the target.
TEST(FetchPacer, AColdStartRampsPerRoundTrip) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  EXPECT_EQ(Fill(p), FetchPacer::kStartInflight);
  uint32_t inflight = FetchPacer::kStartInflight;
  for (int r = 0; r < 3; ++r) {
    Round(clock, p, 20ms, [](uint32_t) { return 0.020; });
    const uint32_t now = p.Get().ahead_inflight;
    EXPECT_GE(now, 2 * inflight) << "round " << r;  // doubles (or more) per round trip
    inflight = now;
  }
  EXPECT_GE(inflight, 64u);
  EXPECT_EQ(p.Target(32), 32u);  // the mount's cap still wins
}

// The store answers some fetches at once and queues others (RGW here: a median of 24 ms, a mean of
// 41 ms, at 16 in flight with a 21 ms round trip): 2 x bandwidth x the shortest latency is then
// about what is in flight already, and the formula alone would not grow. Slow start's window does,
// by one for every fetch that did not queue.
TEST(FetchPacer, SlowStartGrowsPerFetchThatDidNotQueue) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  Fill(p);
  p.Record(100000, 0.020);  // the round trip: 20 ms
  uint32_t inflight = p.Get().ahead_inflight;
  for (int r = 0; r < 3; ++r) {
    // Half the fetches in 24 ms, half queued for 56 ms: 40 ms a round trip on average.
    Round(clock, p, 40ms, [](uint32_t i) { return i % 2 == 0 ? 0.024 : 0.056; });
    const uint32_t now = p.Get().ahead_inflight;
    EXPECT_GE(now, inflight + inflight / 2) << "round " << r;  // the half that did not queue
    EXPECT_TRUE(p.Get().starting);
    inflight = now;
  }
  // Every fetch queued: the window stops growing (the formula's share may still move it a little).
  const uint32_t before = p.Target(FetchPacer::kMaxCap);
  Round(clock, p, 40ms, [](uint32_t) { return 0.056; });
  EXPECT_LE(p.Target(FetchPacer::kMaxCap), before);
}

// Slow start ends once three round trips, each with the pacer full, brought no more bandwidth; the
// target is the formula's from then on.
TEST(FetchPacer, SlowStartEndsWhenTheBandwidthStopsGrowing) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  Fill(p);
  // The link is full at 16 in flight: past that, each round trip takes longer (the queue) and
  // brings the same bytes per second.
  for (int r = 0; r < 8 && p.Get().starting; ++r) {
    const uint32_t n = p.Get().ahead_inflight;
    const auto d = std::chrono::milliseconds(20 * std::max<uint32_t>(n, 16) / 16);
    Round(clock, p, d, [&](uint32_t) { return std::chrono::duration<double>(d).count(); });
  }
  EXPECT_FALSE(p.Get().starting);
  // 2 x 80 MB/s x 20 ms / 100 KB = 32, whatever the window had reached.
  clock.now += FetchPacer::kWindow;
  EXPECT_LE(p.Target(FetchPacer::kMaxCap), 40u);
  EXPECT_GE(p.Target(FetchPacer::kMaxCap), 24u);
}

// Readers with fewer misses than the window (fetch-ahead off, say) grow no window: it would let a
// later fetch-ahead start with more in flight than was ever measured.
TEST(FetchPacer, AWindowNotFullDoesNotGrow) {
  FakeClock clock;
  FetchPacer p(clock.fn());
  for (int r = 0; r < 20; ++r) {
    for (int i = 0; i < 4; ++i) {
      DemandFetch d(&p);
      p.Record(100000, 0.021 + 0.001 * i);  // 4 misses at a time, against a window of 8
    }
    clock.now += 25ms;
  }
  EXPECT_TRUE(p.Get().starting);  // not full: no round counted as flat either
  EXPECT_EQ(p.Target(FetchPacer::kMaxCap), FetchPacer::kStartInflight);
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
  KeepFull(p);
  for (int w = 0; w < 6; ++w) {
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
  // Back to slow start's first window.
  EXPECT_TRUE(p.Get().starting);
  EXPECT_EQ(p.Target(256), FetchPacer::kStartInflight);
}

}  // namespace
}  // namespace granary::worker
