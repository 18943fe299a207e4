#include "fuse/file_cache.h"

#include <gtest/gtest.h>

namespace granary::fuse {
namespace {

rpc::FileInfo Info(const std::string& version) {
  rpc::FileInfo f;
  f.set_version(version);
  return f;
}

TEST(FileCache, ExpiresAfterTtl) {
  std::chrono::steady_clock::time_point now{};
  FileCache c(10, std::chrono::seconds(60), [&] { return now; });
  c.Put(5, Info("v1"));
  ASSERT_TRUE(c.Get(5).has_value());
  EXPECT_EQ(c.Get(5)->version(), "v1");
  now += std::chrono::seconds(61);
  EXPECT_FALSE(c.Get(5).has_value());
  EXPECT_EQ(c.size(), 0u);
}

TEST(FileCache, StaysWithinCapacityDroppingTheOldest) {
  std::chrono::steady_clock::time_point now{};
  FileCache c(100, std::chrono::hours(1), [&] { return now; });
  for (uint64_t i = 0; i < 1000; ++i) {
    c.Put(i, Info(std::to_string(i)));
    ASSERT_LE(c.size(), 100u);
  }
  EXPECT_TRUE(c.Get(999).has_value());
  EXPECT_FALSE(c.Get(0).has_value());
  c.Put(999, Info("new"));  // replacing keeps one entry
  EXPECT_EQ(c.Get(999)->version(), "new");
}

TEST(FileCache, ZeroCapacityDisables) {
  FileCache c(0, std::chrono::hours(1));
  c.Put(1, Info("v"));
  EXPECT_FALSE(c.Get(1).has_value());
}

// The lookup cache is the same mechanism over names: it says how old an answer is, so the kernel
// can be given what is left of its timeouts.
TEST(EntryCache, GivesTheAgeOfAnAnswerAndForgetsItAfterTtl) {
  std::chrono::steady_clock::time_point now{};
  EntryCache c(10, std::chrono::seconds(60), [&] { return now; });
  rpc::Attr a;
  a.set_ino(42);
  c.Put(EntryKey(1, "img.jpg"), a);
  now += std::chrono::seconds(20);
  std::chrono::milliseconds age{};
  auto got = c.Get(EntryKey(1, "img.jpg"), &age);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->ino(), 42u);
  EXPECT_EQ(age, std::chrono::seconds(20));
  EXPECT_FALSE(c.Get(EntryKey(2, "img.jpg")).has_value()) << "another directory's name";
  now += std::chrono::seconds(41);
  EXPECT_FALSE(c.Get(EntryKey(1, "img.jpg")).has_value());
  EntryCache off(10, std::chrono::seconds(0), [&] { return now; });
  off.Put("1/x", a);
  EXPECT_FALSE(off.Get("1/x").has_value()) << "a zero timeout caches nothing";
}

}  // namespace
}  // namespace granary::fuse
