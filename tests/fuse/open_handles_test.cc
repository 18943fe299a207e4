// OpenHandles (fuse/open_handles.h): the rules of the handles granary-fuse gives the kernel, checked
// one by one, against a reference model over random operations, and from several threads.
#include "fuse/open_handles.h"

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <vector>

namespace granary::fuse {
namespace {

constexpr uint64_t kRoot = 1000;  // the master inode shown as the kernel's root (1)

uint64_t ToKernel(uint64_t ino) { return ino == kRoot ? 1 : ino; }

std::shared_ptr<OpenFile> FileOf(uint64_t master_ino) {
  auto of = std::make_shared<OpenFile>();
  of->info.mutable_attr()->set_ino(master_ino);
  return of;
}

TEST(OpenHandles, NumbersCarryTheEpochAndFollowEachOther) {
  OpenHandles h(5, ToKernel);
  const uint64_t a = h.Add(FileOf(7));
  const uint64_t b = h.Add(FileOf(7));
  EXPECT_EQ(a, uint64_t{6} << 40);
  EXPECT_EQ(b, a + 1);
  // Another seed (a predecessor's epoch) never gives the same numbers.
  OpenHandles other(6, ToKernel);
  EXPECT_NE(other.Add(FileOf(7)) >> 40, a >> 40);
}

TEST(OpenHandles, AHandleIsFoundOnlyWithItsInode) {
  OpenHandles h(1, ToKernel);
  auto of = FileOf(7);
  const uint64_t fh = h.Add(of);
  EXPECT_EQ(h.Find(fh, 7), of);
  EXPECT_EQ(h.Find(fh, 8), nullptr);
  EXPECT_EQ(h.Find(fh + 1, 7), nullptr);
  EXPECT_EQ(h.Take(fh, 8), nullptr) << "a number with another inode is not ours to end";
  EXPECT_EQ(h.size(), 1u);
  EXPECT_EQ(h.Take(fh, 7), of);
  EXPECT_EQ(h.Find(fh, 7), nullptr);
  EXPECT_EQ(h.size(), 0u);
}

TEST(OpenHandles, TheRootIsFoundByTheKernelsNumber) {
  OpenHandles h(1, ToKernel);
  const uint64_t fh = h.Add(FileOf(kRoot));
  EXPECT_NE(h.Find(fh, 1), nullptr);
  EXPECT_EQ(h.Find(fh, kRoot), nullptr);
}

TEST(OpenHandles, AForeignNumberIsAdoptedUntilReleasedAndBounded) {
  OpenHandles h(1, ToKernel);
  const uint64_t foreign = (uint64_t{99} << 40) + 3;  // a dead predecessor's
  EXPECT_EQ(h.Find(foreign, 7), nullptr);
  auto rebuilt = FileOf(7);
  h.Adopt(foreign, rebuilt);
  EXPECT_EQ(h.Find(foreign, 7), rebuilt);
  h.Adopt(foreign, FileOf(7));  // a second read with the same number keeps the first rebuild
  EXPECT_EQ(h.Find(foreign, 7), rebuilt);
  EXPECT_EQ(h.Take(foreign, 7), rebuilt);
  EXPECT_EQ(h.size(), 0u);
}

TEST(OpenHandles, AHandOverGoesOnWithThePredecessorsNumbering) {
  OpenHandles before(3, ToKernel);
  const uint64_t a = before.Add(FileOf(7));
  const uint64_t b = before.Add(FileOf(8));
  std::map<uint64_t, uint64_t> carried;  // fh -> master ino
  const uint64_t next = before.ForEach([&](uint64_t fh, const OpenFile& of) { carried[fh] = of.info.attr().ino(); });
  EXPECT_EQ(carried, (std::map<uint64_t, uint64_t>{{a, 7}, {b, 8}}));
  EXPECT_EQ(next, b + 1);

  OpenHandles after(77, ToKernel);  // the successor's own epoch, until told
  after.ContinueFrom(next);
  for (const auto& [fh, ino] : carried) after.Restore(fh, FileOf(ino), /*continue_numbering=*/true);
  EXPECT_NE(after.Find(a, 7), nullptr);
  EXPECT_NE(after.Find(b, 8), nullptr);
  EXPECT_EQ(after.Add(FileOf(9)), next);

  // A keeper's handles (a crash) keep this process's own epoch.
  OpenHandles crashed(77, ToKernel);
  crashed.Restore(a, FileOf(7), /*continue_numbering=*/false);
  EXPECT_EQ(crashed.Add(FileOf(9)) >> 40, uint64_t{78});
  EXPECT_NE(crashed.Find(a, 7), nullptr);
}

// Random operations against a reference map: every answer as the model says, every number given
// unique and of this epoch.
TEST(OpenHandles, ModelOverRandomOperations) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    OpenHandles h(seed, ToKernel);
    std::map<uint64_t, uint64_t> model;  // fh -> kernel ino
    std::set<uint64_t> given;
    std::vector<uint64_t> numbers;  // ours and foreign ones, to pick from
    for (int step = 0; step < 3000; ++step) {
      const uint64_t ino = 2 + rng() % 6;
      const uint64_t fh = numbers.empty() || rng() % 4 == 0 ? (uint64_t{999} << 40) + rng() % 50
                                                              : numbers[rng() % numbers.size()];
      switch (rng() % 4) {
        case 0: {
          const uint64_t n = h.Add(FileOf(ino));
          ASSERT_TRUE(given.insert(n).second) << "number given twice: " << n;
          ASSERT_EQ(n >> 40, (seed & 0x7fffff) + 1);
          model[n] = ino;
          numbers.push_back(n);
          break;
        }
        case 1: {
          auto got = h.Find(fh, ino);
          auto it = model.find(fh);
          ASSERT_EQ(got != nullptr, it != model.end() && it->second == ino) << "seed " << seed << " step " << step;
          break;
        }
        case 2: {
          auto got = h.Take(fh, ino);
          auto it = model.find(fh);
          const bool there = it != model.end() && it->second == ino;
          ASSERT_EQ(got != nullptr, there) << "seed " << seed << " step " << step;
          if (there) model.erase(it);
          break;
        }
        case 3:
          h.Adopt(fh, FileOf(ino));
          model.emplace(fh, ino);  // kept unless the number is in use
          numbers.push_back(fh);
          break;
      }
      ASSERT_EQ(h.size(), model.size());
    }
  }
}

// Opens and releases from several threads (granary-fuse's session threads): no handle lost or
// seen twice, and one thread's handles are never found with another's inode.
TEST(OpenHandles, ConcurrentOpensAndReleases) {
  OpenHandles h(9, ToKernel);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const uint64_t ino = 10 + static_cast<uint64_t>(t);
      std::vector<uint64_t> mine;
      for (int i = 0; i < 20000; ++i) {
        if (mine.size() < 8 || i % 3 != 0) {
          mine.push_back(h.Add(FileOf(ino)));
        } else {
          const uint64_t fh = mine.back();
          mine.pop_back();
          if (h.Find(fh, ino + 1) != nullptr) wrong++;
          if (h.Take(fh, ino) == nullptr) wrong++;
        }
      }
      for (uint64_t fh : mine) {
        if (h.Take(fh, ino) == nullptr) wrong++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(h.size(), 0u);
}

}  // namespace
}  // namespace granary::fuse
