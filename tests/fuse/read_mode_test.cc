#include "fuse/read_mode.h"

#include <gtest/gtest.h>

namespace granary::fuse {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;

TEST(AutoReadMode, SmallFilesThatFitInMemoryGetKernelMode) {
  // ImageNet-like files, 330 MB on a 24 GiB node: the page cache keeps them across epochs.
  EXPECT_FALSE(AutoChoosesPassthrough(3000, 330 * 1000 * 1000, 24 * kGiB));
  EXPECT_FALSE(AutoChoosesPassthrough(0, 0, 24 * kGiB));  // nothing known yet
}

TEST(AutoReadMode, LargeFilesGetPassthrough) {
  EXPECT_TRUE(AutoChoosesPassthrough(10, 10 * 8 * kMiB, 24 * kGiB));
  EXPECT_FALSE(AutoChoosesPassthrough(10, 10 * 8 * kMiB - 10, 24 * kGiB));
}

TEST(AutoReadMode, SmallFilesLargerThanHalfTheMemoryGetPassthrough) {
  // ImageNet, 1.28 M files and 144 GB, on a 64 GiB node: every epoch reads the medium.
  EXPECT_TRUE(AutoChoosesPassthrough(1281167, 144ull * 1000 * 1000 * 1000, 64 * kGiB));
  EXPECT_FALSE(AutoChoosesPassthrough(1000000, 12 * kGiB, 24 * kGiB));  // exactly half: still fits
  EXPECT_TRUE(AutoChoosesPassthrough(1000000, 12 * kGiB + 1, 24 * kGiB));
  EXPECT_FALSE(AutoChoosesPassthrough(1000000, 100 * kGiB, 0));  // memory unknown: the size rule alone
}

}  // namespace
}  // namespace granary::fuse
