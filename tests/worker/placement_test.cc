// The one rendezvous ranking: reads (RankForBlock) and loads (RankOf) must agree on every block.
#include "worker/placement.h"

#include <gtest/gtest.h>

#include <random>
#include <map>

namespace granary::worker {
namespace {

BlockId Block(std::mt19937_64& rng) {
  BlockId id;
  for (auto& b : id.key) b = static_cast<uint8_t>(rng());
  id.index = rng() % 1000;
  return id;
}

TEST(Placement, ReadsAndLoadsRankAlike) {
  std::mt19937_64 rng(11);
  std::vector<PeerRef> members;
  for (uint64_t i = 1; i <= 7; ++i) members.push_back({i * 10, "10.0.0." + std::to_string(i) + ":7100"});
  for (int n = 0; n < 2000; ++n) {
    BlockId id = Block(rng);
    std::vector<PeerRef> ranked = RankForBlock(id, members);
    ASSERT_EQ(ranked.size(), members.size());
    for (size_t pos = 0; pos < ranked.size(); ++pos) EXPECT_EQ(RankOf(id, members, ranked[pos].id), pos);
  }
  EXPECT_EQ(RankOf(Block(rng), members, 999), kNotRanked);
}

TEST(Placement, IdsDoNotMatterAndHomesSpreadEvenly) {
  std::mt19937_64 rng(5);
  std::vector<PeerRef> a, b;
  for (uint64_t i = 0; i < 4; ++i) {
    a.push_back({i + 1, "node" + std::to_string(i)});
    b.push_back({100 - i, "node" + std::to_string(i)});  // other ids, same addresses
  }
  std::map<std::string, int> homes;
  for (int n = 0; n < 4000; ++n) {
    BlockId id = Block(rng);
    EXPECT_EQ(RankForBlock(id, a)[0].address, RankForBlock(id, b)[0].address);
    homes[RankForBlock(id, a)[0].address]++;
  }
  for (const auto& [addr, count] : homes) EXPECT_NEAR(count, 1000, 150) << addr;
}

}  // namespace
}  // namespace granary::worker
