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

}  // namespace
}  // namespace granary::fuse
