// ReadEvidence: what starts a fetch-ahead and how far it reaches (master/fetch_ahead.h).
#include "master/fetch_ahead.h"

#include <gtest/gtest.h>

namespace granary::master {
namespace {

using Dirs = std::vector<std::string>;

TEST(ReadEvidence, OneFileOrAFewStartNothing) {
  ReadEvidence e{FetchAheadOptions{}};
  EXPECT_TRUE(e.Opened(1, 100, "README"));
  EXPECT_FALSE(e.Ready());
  for (uint64_t i = 0; i < 14; ++i) EXPECT_TRUE(e.Opened(10 + i, 1000, "train/n01/" + std::to_string(i)));
  EXPECT_EQ(e.files(), 15u);
  EXPECT_FALSE(e.Ready()) << "15 files are no epoch yet";
  EXPECT_TRUE(e.Opened(99, 1000, "train/n01/x"));
  EXPECT_TRUE(e.Ready());
  EXPECT_EQ(e.scope(), (Dirs{"train", "n01"})) << "a lone README does not widen the scope";
  EXPECT_EQ(e.bytes(), 100u + 15 * 1000);
}

TEST(ReadEvidence, TheSameFileAgainIsNoEvidence) {
  ReadEvidence e{FetchAheadOptions{}};
  for (int i = 0; i < 40; ++i) e.Opened(7, 1000, "a/b/f");
  EXPECT_EQ(e.files(), 1u);
  EXPECT_FALSE(e.Ready());
}

TEST(ReadEvidence, TheScopeWidensAsReadersReachSiblingDirectories) {
  ReadEvidence e{FetchAheadOptions{}};
  uint64_t ino = 1;
  for (int i = 0; i < 16; ++i) e.Opened(ino++, 1, "train/n01/" + std::to_string(i));
  EXPECT_EQ(e.scope(), (Dirs{"train", "n01"}));
  e.Opened(ino++, 1, "train/n02/a");  // one file in a sibling: not yet
  EXPECT_EQ(e.scope(), (Dirs{"train", "n01"}));
  e.Opened(ino++, 1, "train/n02/b");  // two: the scope covers both
  EXPECT_EQ(e.scope(), (Dirs{"train"}));
  e.Opened(ino++, 1, "val/x");
  e.Opened(ino++, 1, "val/y");
  EXPECT_EQ(e.scope(), Dirs{}) << "the mount itself";
}

TEST(ReadEvidence, ResetForgetsEverything) {
  ReadEvidence e{FetchAheadOptions{}};
  for (uint64_t i = 0; i < 20; ++i) e.Opened(i, 10, "d/" + std::to_string(i));
  ASSERT_TRUE(e.Ready());
  e.Reset();
  EXPECT_EQ(e.files(), 0u);
  EXPECT_EQ(e.bytes(), 0u);
  EXPECT_FALSE(e.Ready());
  EXPECT_TRUE(e.Opened(3, 10, "d/3")) << "a file of the last epoch is new evidence again";
}

TEST(ReadEvidence, OptionsSetTheThresholds) {
  FetchAheadOptions o;
  o.start_files = 3;
  o.dir_files = 1;
  ReadEvidence e{o};
  e.Opened(1, 1, "a/x");
  e.Opened(2, 1, "b/y");
  EXPECT_FALSE(e.Ready());
  e.Opened(3, 1, "a/z");
  EXPECT_TRUE(e.Ready());
  EXPECT_EQ(e.scope(), Dirs{});
}

}  // namespace
}  // namespace granary::master
