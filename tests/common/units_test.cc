#include "common/units.h"

#include <gtest/gtest.h>

namespace granary {
namespace {

TEST(Units, ParsesKubernetesStyleSizes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("4Ki"), 4096u);
  EXPECT_EQ(*ParseBytes("512Mi"), 512ull << 20);
  EXPECT_EQ(*ParseBytes("10Gi"), 10ull << 30);
  EXPECT_EQ(*ParseBytes("1.5Gi"), 3ull << 29);
  EXPECT_EQ(*ParseBytes("2G"), 2'000'000'000ull);
  EXPECT_EQ(*ParseBytes(" 1Ti "), 1ull << 40);
}

TEST(Units, RejectsBadSizes) {
  for (const char* bad : {"", "Gi", "12Zi", "-1", "1.2.3Mi", "ten"}) {
    auto r = ParseBytes(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("not a size"), std::string::npos);
  }
}

TEST(Units, FormatsSizes) {
  EXPECT_EQ(FormatBytes(100), "100");
  EXPECT_EQ(FormatBytes(4 << 20), "4Mi");
  EXPECT_EQ(FormatBytes(1536), "1.5Ki");
}

TEST(Units, Durations) {
  EXPECT_EQ(ParseDuration("500ms")->count(), 500);
  EXPECT_EQ(ParseDuration("3s")->count(), 3000);
  EXPECT_EQ(ParseDuration("3")->count(), 3000);
  EXPECT_EQ(ParseDuration("2m")->count(), 120000);
  EXPECT_EQ(ParseDuration("1h")->count(), 3600000);
  EXPECT_FALSE(ParseDuration("3 days").ok());
  EXPECT_EQ(FormatDuration(std::chrono::milliseconds(60000)), "1m");
  EXPECT_EQ(FormatDuration(std::chrono::milliseconds(1500)), "1500ms");
}

TEST(Units, Bools) {
  EXPECT_TRUE(*ParseBool("yes"));
  EXPECT_FALSE(*ParseBool("Off"));
  EXPECT_FALSE(ParseBool("maybe").ok());
}

}  // namespace
}  // namespace granary
