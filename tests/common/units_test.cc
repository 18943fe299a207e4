#include "common/tiers.h"
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

// Found by tests/fuzz/config_fuzz.cc: numbers past int64 went through llround() (undefined) and came
// back negative: a sync interval of "1322...2ms" read as "never".
TEST(Units, HugeNumbersAreRefusedNeverWrapped) {
  EXPECT_FALSE(ParseDuration("1322222222222222222222222222222222222222222ms").ok());
  EXPECT_FALSE(ParseDuration(std::string(400, '9') + "h").ok());  // inf
  EXPECT_FALSE(ParseDuration("1000000000000000000s").ok());
  EXPECT_EQ(ParseDuration("1000000000000s")->count(), 1'000'000'000'000'000LL);
  EXPECT_FALSE(ParseBytes("9223372036854775808").ok());
  EXPECT_FALSE(ParseBytes("16000Pi").ok());
  EXPECT_FALSE(ParseBytes(std::string(400, '9')).ok());
  EXPECT_EQ(*ParseBytes("8Pi"), 8ull << 50);
  EXPECT_FALSE(ParseSyncInterval("1322222222222222222222222222222222222222222ms").ok());
}

TEST(Units, Bools) {
  EXPECT_TRUE(*ParseBool("yes"));
  EXPECT_FALSE(*ParseBool("Off"));
  EXPECT_FALSE(ParseBool("maybe").ok());
}

}  // namespace
}  // namespace granary
