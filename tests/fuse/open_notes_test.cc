// OpenNotes: an open of listed information is sent to the master once, in batches; opens of
// information from GetFile, and later opens, are not; a failed call is counted and dropped.
#include "fuse/open_notes.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "tests/testutil/testutil.h"

namespace granary::fuse {
namespace {

using namespace std::chrono_literals;

struct FakeMaster {
  Mutex mu;
  std::vector<std::vector<uint64_t>> calls;  // GUARDED_BY(mu)
  bool down = false;                         // GUARDED_BY(mu)
  OpenNotes::Send Send() {
    return [this](const std::vector<uint64_t>& inos) -> Status {
      MutexLock lock(&mu);
      calls.push_back(inos);
      return down ? UnavailableError("master down") : Status::OK();
    };
  }
  std::vector<uint64_t> Noted() {
    MutexLock lock(&mu);
    std::vector<uint64_t> all;
    for (const auto& c : calls) all.insert(all.end(), c.begin(), c.end());
    std::sort(all.begin(), all.end());
    return all;
  }
  size_t Calls() {
    MutexLock lock(&mu);
    return calls.size();
  }
};

TEST(OpenNotes, AnOpenOfListedInformationIsSentOnce) {
  FakeMaster master;
  OpenNotes notes(100, master.Send());
  notes.Listed(7);
  notes.Listed(8);
  notes.Listed(9);
  EXPECT_TRUE(notes.Opened(7));
  EXPECT_TRUE(notes.Opened(9));
  EXPECT_FALSE(notes.Opened(7));   // its second open: sent already
  EXPECT_FALSE(notes.Opened(42));  // never listed (its open asked GetFile)
  ASSERT_TRUE(testing::WaitFor([&] { return notes.sent() == 2; }));
  EXPECT_EQ(master.Noted(), (std::vector<uint64_t>{7, 9}));
  notes.Forget(8);  // GetFile answered for it since: the master counted that open
  EXPECT_FALSE(notes.Opened(8));
}

TEST(OpenNotes, OpensComeInBatches) {
  FakeMaster master;
  OpenNotes notes(1 << 20, master.Send());
  const uint64_t n = 3 * OpenNotes::kBatch + 5;  // under kMaxPending: nothing dropped
  for (uint64_t i = 1; i <= n; ++i) notes.Listed(i);
  for (uint64_t i = 1; i <= n; ++i) ASSERT_TRUE(notes.Opened(i));
  ASSERT_TRUE(testing::WaitFor([&] { return notes.sent() == n; }));
  EXPECT_EQ(master.Noted().size(), n);
  EXPECT_GE(master.Calls(), n / OpenNotes::kBatch);
  MutexLock lock(&master.mu);
  for (const auto& c : master.calls) EXPECT_LE(c.size(), OpenNotes::kBatch);
}

TEST(OpenNotes, TheIntervalGrowsWhileOpensKeepComingAndStartsOverAfterAQuietSpell) {
  using std::chrono::milliseconds;
  const milliseconds first = OpenNotes::kFlushEvery;
  // Until fetch-ahead's first opens are out, every call comes after kFlushEvery.
  EXPECT_EQ(OpenNotes::NextInterval(first, 0, 0ms), first);
  EXPECT_EQ(OpenNotes::NextInterval(first, OpenNotes::kStartNotes - 1, 1ms), first);
  // Then it doubles, up to kFlushMost.
  EXPECT_EQ(OpenNotes::NextInterval(first, OpenNotes::kStartNotes, 1ms), 2 * first);
  EXPECT_EQ(OpenNotes::NextInterval(OpenNotes::kFlushMost, 1000, 1ms), OpenNotes::kFlushMost);
  EXPECT_EQ(OpenNotes::NextInterval(milliseconds(300), 1000, 1ms), OpenNotes::kFlushMost);
  // A quiet spell starts over.
  EXPECT_EQ(OpenNotes::NextInterval(OpenNotes::kFlushMost, 1000, OpenNotes::kFlushMost), first);

  // A steady stream of opens for 1.6 s: at a fixed kFlushEvery that is 32 calls; growing, ~8.
  FakeMaster master;
  OpenNotes notes(1 << 20, master.Send());
  const auto start = std::chrono::steady_clock::now();
  uint64_t n = 0;
  while (std::chrono::steady_clock::now() - start < 1600ms) {
    notes.Listed(++n);
    ASSERT_TRUE(notes.Opened(n));
    std::this_thread::sleep_for(5ms);  // the stream's pace, not a wait for anything
  }
  ASSERT_TRUE(testing::WaitFor([&] { return notes.sent() == n; }));
  EXPECT_LE(master.Calls(), 20u) << n << " opens";
  // A later open goes out too, in a call of its own.
  const size_t calls = master.Calls();
  notes.Listed(++n);
  ASSERT_TRUE(notes.Opened(n));
  ASSERT_TRUE(testing::WaitFor([&] { return notes.sent() == n; }));
  EXPECT_EQ(master.Calls(), calls + 1);
}

TEST(OpenNotes, AFailedCallIsCountedAndItsFilesDropped) {
  FakeMaster master;
  {
    MutexLock lock(&master.mu);
    master.down = true;
  }
  OpenNotes notes(100, master.Send());
  notes.Listed(5);
  EXPECT_TRUE(notes.Opened(5));
  ASSERT_TRUE(testing::WaitFor([&] { return notes.failed_calls() == 1; }));
  EXPECT_EQ(notes.sent(), 0u);
  EXPECT_FALSE(notes.Opened(5));  // not sent again
}

// A master that does not answer: at most kMaxPending opens wait, the rest are dropped and counted.
TEST(OpenNotes, ASlowMasterNeverMakesItGrow) {
  Mutex mu;
  bool release = false;  // GUARDED_BY(mu)
  std::condition_variable cv;
  OpenNotes notes(1 << 20, [&](const std::vector<uint64_t>&) -> Status {
    MutexLock lock(&mu);
    while (!release) lock.Wait(&cv);
    return Status::OK();
  });
  const uint64_t n = OpenNotes::kMaxPending + 2 * OpenNotes::kBatch + 7;
  for (uint64_t i = 1; i <= n; ++i) notes.Listed(i);
  for (uint64_t i = 1; i <= n; ++i) EXPECT_TRUE(notes.Opened(i));
  // One batch may be in the (stuck) call; kMaxPending more wait; the rest were dropped.
  EXPECT_GE(notes.dropped(), n - OpenNotes::kMaxPending - OpenNotes::kBatch);
  EXPECT_LE(notes.dropped(), n - OpenNotes::kMaxPending);
  {
    MutexLock lock(&mu);
    release = true;
  }
  cv.notify_all();
  ASSERT_TRUE(testing::WaitFor([&] { return notes.sent() + notes.dropped() == n; }));
}

TEST(OpenNotes, NothingIsRememberedPastItsCapacity) {
  FakeMaster master;
  OpenNotes notes(4, master.Send());
  for (uint64_t i = 1; i <= 8; ++i) notes.Listed(i);
  // The oldest were dropped to make room: their opens are not noted (fetch-ahead starts later).
  EXPECT_FALSE(notes.Opened(1));
  EXPECT_TRUE(notes.Opened(8));
}

}  // namespace
}  // namespace granary::fuse
