// ReadStreams (fuse/open_file.h): which READs of an open are random ones, the mark that lets a
// random reader's piece at a block's start be read range first instead of fetched whole.
#include <gtest/gtest.h>

#include <random>

#include "fuse/open_file.h"

namespace granary::fuse {
namespace {

constexpr uint64_t kMiB = 1 << 20;

TEST(ReadStreams, ASequentialReaderIsNeverRandomEvenReordered) {
  ReadStreams s;
  EXPECT_FALSE(s.Note(0, kMiB));
  // The kernel's readahead READs, a few processed out of order by the FUSE threads.
  for (uint64_t i : {2, 1, 3, 5, 4, 6, 7, 9, 8, 10}) EXPECT_FALSE(s.Note(i * kMiB, kMiB)) << i;
}

TEST(ReadStreams, UpToFourSequentialReadersOfOneFileAreNotRandom) {
  ReadStreams s;
  const uint64_t starts[] = {0, 100 * kMiB, 200 * kMiB, 300 * kMiB};
  s.Note(0, kMiB);
  for (int i = 1; i < 4; ++i) EXPECT_TRUE(s.Note(starts[i], kMiB)) << "a new stream's first READ is a jump";
  for (uint64_t step = 1; step < 20; ++step) {
    for (uint64_t start : starts) EXPECT_FALSE(s.Note(start + step * kMiB, kMiB)) << start << " " << step;
  }
}

TEST(ReadStreams, RandomWindowsAreRandom) {
  ReadStreams s;
  std::mt19937_64 rng(3);
  EXPECT_FALSE(s.Note(0, 4096)) << "nothing seen yet: not random";
  int random = 0;
  for (int i = 0; i < 1000; ++i) random += s.Note((rng() % (100000 * kMiB / 4096)) * 4096, 4096);
  EXPECT_GT(random, 990) << "windows over 100 GB rarely land within 4 MiB of the last four";
}

TEST(ReadStreams, NothingIsRandomWithoutAHistory) {
  EXPECT_FALSE(ReadStreams().Note(77 * kMiB, 4096)) << "an OpenFile made for one READ marks nothing";
}

}  // namespace
}  // namespace granary::fuse
