// The eviction choice on its own: no disk, no store, just the lists and the rules.
#include "worker/store/eviction.h"

#include <gtest/gtest.h>

#include <set>

namespace granary::worker::store {
namespace {

BlockId Id(uint64_t mount, uint64_t n) { return BlockId{MakeFileKey("m" + std::to_string(mount), "f", "v"), n}; }

struct Fixture {
  LruLists lists;    // replicas
  LruLists elastic;  // elastic copies
  std::map<uint64_t, CachePolicy> policies;
  std::set<std::pair<uint64_t, uint64_t>> busy;  // (mount, n)
  // Block n of `mount`, last used at `seq`.
  void Add(uint64_t mount, uint64_t n, uint64_t seq) { lists[mount].emplace(seq, Id(mount, n)); }
  // An elastic copy: block 1000+n of `mount`.
  void AddElastic(uint64_t mount, uint64_t n, uint64_t seq) { elastic[mount].emplace(seq, Id(mount, 1000 + n)); }
  std::optional<BlockId> Pick(Purpose p, uint64_t for_mount = 0, bool for_elastic = false) {
    VictimQuery q;
    q.purpose = p;
    q.for_mount = for_mount;
    q.for_elastic = for_elastic;
    q.policy = [this](uint64_t m) { return policies.count(m) ? policies[m] : CachePolicy::kLru; };
    q.busy = [this](const BlockId& id) {
      for (const auto& [m, n] : busy) {
        if (Id(m, n) == id) return true;
      }
      return false;
    };
    return PickVictim(elastic, lists, q);
  }
};

TEST(Eviction, TheLeastRecentlyUsedBlockOverAllMountsGoes) {
  Fixture f;
  f.Add(1, 0, 10);
  f.Add(1, 1, 30);
  f.Add(2, 0, 20);
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 1), Id(1, 0));
  EXPECT_EQ(f.Pick(Purpose::kWatermark), Id(1, 0));
  EXPECT_EQ(f.Pick(Purpose::kDemote), Id(1, 0));
  EXPECT_FALSE(Fixture{}.Pick(Purpose::kAdmit, 1).has_value()) << "an empty level has no victim";
}

TEST(Eviction, BusyBlocksAreSkippedUpToTheScanLimit) {
  Fixture f;
  for (uint64_t n = 0; n < 3; ++n) f.Add(1, n, 10 + n);
  f.busy = {{1, 0}, {1, 1}};
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 2), Id(1, 2));
  Fixture g;  // more busy blocks than a pick looks at: nothing, rather than a long scan
  for (uint64_t n = 0; n <= static_cast<uint64_t>(kScanLimit); ++n) {
    g.Add(1, n, n + 1);
    if (n < static_cast<uint64_t>(kScanLimit)) g.busy.insert({1, n});
  }
  EXPECT_FALSE(g.Pick(Purpose::kAdmit, 2).has_value());
}

TEST(Eviction, AShuffleMountNeverEvictsItsOwnBlocksForItsOwn) {
  Fixture f;
  f.policies[1] = CachePolicy::kShuffle;
  f.Add(1, 0, 1);  // the oldest of all, but of the shuffle mount
  f.Add(2, 0, 5);
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 1), Id(2, 0)) << "another dataset's block makes room";
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 2), Id(1, 0)) << "another dataset may replace the shuffle mount's blocks";
  f.lists.erase(2);
  EXPECT_FALSE(f.Pick(Purpose::kAdmit, 1).has_value()) << "a full shuffle dataset admits nothing of its own";
}

TEST(Eviction, TheWatermarkLeavesShuffleMountsAloneButDemotionMovesThem) {
  Fixture f;
  f.policies[1] = CachePolicy::kShuffle;
  f.Add(1, 0, 1);
  f.Add(2, 0, 5);
  EXPECT_EQ(f.Pick(Purpose::kWatermark), Id(2, 0));
  EXPECT_EQ(f.Pick(Purpose::kDemote), Id(1, 0));
  f.lists.erase(2);
  EXPECT_FALSE(f.Pick(Purpose::kWatermark).has_value());
}

TEST(Eviction, ElasticCopiesGoFirstWhateverThePolicy) {
  Fixture f;
  f.Add(1, 0, 1);          // the oldest block of all is a replica
  f.AddElastic(1, 0, 50);  // the newest is an elastic copy
  f.AddElastic(2, 0, 40);
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 3), Id(2, 1000)) << "the oldest elastic copy, before any replica";
  EXPECT_EQ(f.Pick(Purpose::kWatermark), Id(2, 1000));
  EXPECT_EQ(f.Pick(Purpose::kDemote), Id(2, 1000));
  f.policies[1] = CachePolicy::kShuffle;
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 1), Id(2, 1000)) << "a shuffle mount's replica replaces elastic copies first";
  f.elastic.erase(2);
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 1), Id(1, 1000)) << "even its own: replicas outrank elastic copies";
  f.elastic.clear();
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 3), Id(1, 0)) << "with no elastic copy left, a replica goes";
}

TEST(Eviction, AnElasticCopyNeverReplacesAReplica) {
  Fixture f;
  f.Add(1, 0, 1);
  f.Add(2, 0, 2);
  EXPECT_FALSE(f.Pick(Purpose::kAdmit, 1, /*for_elastic=*/true).has_value());
  f.AddElastic(2, 0, 10);
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 1, true), Id(2, 1000)) << "an lru elastic copy replaces an older one";
}

TEST(Eviction, AShuffleMountsElasticCopiesHoldTheirSubset) {
  Fixture f;
  f.policies[1] = CachePolicy::kShuffle;
  f.AddElastic(1, 0, 1);
  f.Add(2, 0, 5);
  EXPECT_FALSE(f.Pick(Purpose::kAdmit, 1, true).has_value()) << "its own elastic copies stay for its own new ones";
  EXPECT_FALSE(f.Pick(Purpose::kWatermark).has_value() && *f.Pick(Purpose::kWatermark) == Id(1, 1000))
      << "the watermark leaves a shuffle mount's elastic copies alone";
  EXPECT_EQ(f.Pick(Purpose::kWatermark), Id(2, 0));
  EXPECT_EQ(f.Pick(Purpose::kAdmit, 2, true), Id(1, 1000)) << "another dataset's elastic copy may replace them";
}

}  // namespace
}  // namespace granary::worker::store
