#include "ufs/mount_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "tests/testutil/testutil.h"

namespace granary {
namespace {

TEST(MountTable, OpensOnceOutsideTheCallerAndForgetsOnErase) {
  testing::TempDir dir;
  testing::WriteFile(dir / "src/a", "x");
  std::atomic<int> loads{0};
  MountTable table([&](uint64_t id) -> StatusOr<MountTable::Source> {
    ++loads;
    if (id == 9) return NotFoundError("mount 9 is gone");
    return MountTable::Source{"file://" + dir / "src", {{"cache.replicas", "2"}, {"metadata.sync_interval", "5s"}}};
  });
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      auto m = table.Get(1);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_EQ(m->cache.replicas, 2u);
      EXPECT_EQ(m->cache.metadata_sync_ms, 5000);
      EXPECT_TRUE(m->ufs->Stat("a").ok());
    });
  }
  for (auto& t : readers) t.join();
  int after_first = loads.load();
  EXPECT_GE(after_first, 1);
  bool opened_now = true;
  ASSERT_TRUE(table.Get(1, &opened_now).ok());
  EXPECT_FALSE(opened_now);
  EXPECT_EQ(loads.load(), after_first) << "a mount is opened once, then served from the table";
  EXPECT_EQ(table.Get(9).status().code(), Code::kNotFound);
  table.Erase(1);
  ASSERT_TRUE(table.Get(1, &opened_now).ok());
  EXPECT_TRUE(opened_now);
}

TEST(MountTable, OpenMountAppliesTheOptionRules) {
  EXPECT_EQ(OpenMount("file:///tmp", {{"cache.replicas", "0"}}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(OpenMount("file:///tmp", {{"secret_key", "x"}}).status().code(), Code::kInvalidArgument);
  auto ok = OpenMount("file:///tmp", {{"cache.policy", "shuffle"}});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->cache.policy, CachePolicy::kShuffle);
}

}  // namespace
}  // namespace granary
