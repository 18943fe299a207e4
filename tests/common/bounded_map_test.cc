#include "common/bounded_map.h"

#include <gtest/gtest.h>

#include <string>

namespace granary {
namespace {

TEST(BoundedMap, KeepsAtMostItsCapacityForgettingTheOldestHalf) {
  BoundedMap<int, std::string> m(10);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(m.TryEmplace(i, std::to_string(i)).second);
  EXPECT_EQ(m.size(), 10u);
  // Full: the next insert drops the oldest entries down to half the capacity first.
  ASSERT_TRUE(m.TryEmplace(10, "10").second);
  EXPECT_EQ(m.size(), 6u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(m.Find(i), nullptr) << i;
  for (int i = 5; i <= 10; ++i) {
    ASSERT_NE(m.Find(i), nullptr) << i;
    EXPECT_EQ(*m.Find(i), std::to_string(i));
  }
  for (int i = 0; i < 1000; ++i) {
    m.TryEmplace(100 + i, "x");
    ASSERT_LE(m.size(), 10u);
  }
  EXPECT_NE(m.Find(1099), nullptr);
}

TEST(BoundedMap, TryEmplaceKeepsAnExistingEntryAndPutRenewsIt) {
  BoundedMap<int, std::string> m(4);
  m.TryEmplace(1, "a");
  auto [v, fresh] = m.TryEmplace(1, "b");
  EXPECT_FALSE(fresh);
  EXPECT_EQ(*v, "a");
  *v = "changed";  // the pointer is the entry
  EXPECT_EQ(*m.Find(1), "changed");
  m.TryEmplace(2, "b");
  m.TryEmplace(3, "c");
  m.Put(1, "renewed");  // now the newest: it outlives 2 and 3
  m.TryEmplace(4, "d");
  m.TryEmplace(5, "e");  // full: drops the two oldest, 2 and 3
  EXPECT_EQ(m.Find(2), nullptr);
  EXPECT_EQ(m.Find(3), nullptr);
  ASSERT_NE(m.Find(1), nullptr);
  EXPECT_EQ(*m.Find(1), "renewed");
  m.Erase(1);
  EXPECT_EQ(m.Find(1), nullptr);
  EXPECT_EQ(m.size(), 2u);
}

TEST(BoundedMap, ZeroCapacityKeepsNothingAndANewCapacityApplies) {
  BoundedMap<int, int> m(0);
  EXPECT_EQ(m.TryEmplace(1, 1).first, nullptr);
  m.Put(2, 2);
  EXPECT_EQ(m.size(), 0u);
  m.SetCapacity(2);
  EXPECT_TRUE(m.TryEmplace(1, 1).second);
  EXPECT_TRUE(m.TryEmplace(2, 2).second);
  EXPECT_TRUE(m.TryEmplace(3, 3).second);
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m.Find(1), nullptr);
}

}  // namespace
}  // namespace granary
