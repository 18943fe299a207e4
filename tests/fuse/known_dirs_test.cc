// KnownDirs (fuse/known_dirs.h): a directory made here answers "missing" for names it did not put
// there, and only while fresh.
#include "fuse/known_dirs.h"

#include <gtest/gtest.h>

namespace granary::fuse {
namespace {

using Clock = KnownDirs::Clock;

TEST(KnownDirs, MissingOnlyInAFreshDirectoryMadeHereForNamesNotPutThere) {
  KnownDirs k;
  const Clock::time_point t0 = Clock::now();
  EXPECT_FALSE(k.Missing(7, "a", t0)) << "a directory it was never told about";
  k.Made(7, t0);
  EXPECT_TRUE(k.Missing(7, "a", t0));
  k.Added(7, "a");
  EXPECT_FALSE(k.Missing(7, "a", t0)) << "a name this node put there";
  EXPECT_TRUE(k.Missing(7, "b", t0 + std::chrono::milliseconds(999)));
  EXPECT_FALSE(k.Missing(7, "b", t0 + KnownDirs::kFresh)) << "answered after its second";
  EXPECT_FALSE(k.Missing(7, "b", t0)) << "an expired directory came back";
  k.Made(8, t0);
  k.Forget(8);
  EXPECT_FALSE(k.Missing(8, "x", t0));
  k.Added(9, "x");  // not made here: nothing known
  EXPECT_FALSE(k.Missing(9, "y", t0));
}

TEST(KnownDirs, BoundedInDirectoriesAndNames) {
  KnownDirs k;
  const Clock::time_point t0 = Clock::now();
  for (uint64_t d = 1; d <= KnownDirs::kMaxDirs; ++d) k.Made(d, t0);
  EXPECT_TRUE(k.Missing(1, "x", t0));
  k.Made(KnownDirs::kMaxDirs + 1, t0);  // full: everything is forgotten first
  EXPECT_FALSE(k.Missing(1, "x", t0));
  EXPECT_TRUE(k.Missing(KnownDirs::kMaxDirs + 1, "x", t0));
  k.Made(5, t0);
  for (size_t i = 0; i <= KnownDirs::kMaxNames; ++i) k.Added(5, "n" + std::to_string(i));
  EXPECT_FALSE(k.Missing(5, "never-made", t0)) << "a directory past kMaxNames names is still answered";
}

}  // namespace
}  // namespace granary::fuse
