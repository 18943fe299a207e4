#include "common/keys.h"

#include <gtest/gtest.h>

namespace granary {
namespace {

TEST(Keys, BigEndianSortsNumericallyAndRoundTrips) {
  for (uint64_t v : {0ull, 1ull, 255ull, 256ull, 0x0102030405060708ull, ~0ull}) {
    std::string s = Be64(v);
    ASSERT_EQ(s.size(), 8u);
    EXPECT_EQ(GetBe64(s.data()), v);
    EXPECT_EQ(GetBe64("x" + s, 1), v);
  }
  EXPECT_LT(Be64(255), Be64(256));  // byte order is numeric order (RocksDB keys)
  EXPECT_LT(Be64(1ull << 32), Be64((1ull << 32) + 1));
  EXPECT_EQ(GetBe64(std::string_view("short"), 0), 0u);
}

TEST(Keys, FileKeyBytesRoundTrip) {
  FileKey k = MakeFileKey("s3://b", "a/b.jpg", "etag");
  FileKey back{};
  ASSERT_TRUE(FileKeyFromBytes(FileKeyBytes(k), &back));
  EXPECT_EQ(back, k);
  EXPECT_FALSE(FileKeyFromBytes(std::string(15, 'x'), &back));
  EXPECT_FALSE(FileKeyFromBytes(std::string(17, 'x'), &back));
}

}  // namespace
}  // namespace granary
