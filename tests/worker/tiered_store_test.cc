// The tiered block store: placement, watermarks, demotion, promotion, policies, pins, free, restart,
// and a property test against a simple model over random operation sequences.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>

#include "tests/testutil/testutil.h"
#include "worker/block_store.h"

namespace granary::worker {
namespace {

constexpr uint64_t kData = 8192;                          // data bytes per test block
const uint64_t kFile = BlockFileBytes(kData);     // bytes on disk per test block

BlockMeta Meta(uint64_t mount, int file, uint64_t len = kData) {
  return BlockMeta{BlockId{MakeFileKey("file:///m" + std::to_string(mount), "f" + std::to_string(file), "v1"), 0},
                   mount, len};
}
std::string Content(uint64_t mount, int file) {
  return testing::RandomBytes(kData, static_cast<int>(mount * 100003 + static_cast<uint64_t>(file)));
}

TierLevel Level(const std::string& medium, const std::string& path, uint64_t blocks, double high, double low) {
  TierLevel l;
  l.medium = medium;
  l.paths = {path};
  l.quotas = {blocks * kFile};
  l.high = high;
  l.low = low;
  return l;
}

// A MEM level in /dev/shm (tmpfs) and an SSD level on disk.
struct TwoLevels {
  testing::TempDir mem{"/dev/shm"};
  testing::TempDir ssd;
  StoreOptions Options(uint64_t mem_blocks, uint64_t ssd_blocks, double high = 0.9, double low = 0.5) const {
    StoreOptions o;
    o.levels = {Level("MEM", mem / "c", mem_blocks, high, low), Level("SSD", ssd / "c", ssd_blocks, high, low)};
    o.background = false;
    return o;
  }
};

bool ReadsBack(BlockStore& s, uint64_t mount, int file) {
  std::string out(kData, '\0');
  auto n = s.Read(Meta(mount, file).id, 0, kData, out.data());
  return n.ok() && *n == kData && out == Content(mount, file);
}

TEST(TieredStore, NewBlocksGoToTheFastestLevelWithRoom) {
  TwoLevels d;
  auto s = std::move(BlockStore::Open(d.Options(4, 8, 1.0, 1.0)).value());
  for (int f = 0; f < 6; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
  for (int f = 0; f < 4; ++f) EXPECT_EQ(s->LevelOf(Meta(1, f).id), 0) << f;
  for (int f = 4; f < 6; ++f) EXPECT_EQ(s->LevelOf(Meta(1, f).id), 1) << f;
  auto st = s->Stats();
  ASSERT_EQ(st.tiers.size(), 2u);
  EXPECT_EQ(st.tiers[0].medium, "MEM");
  EXPECT_EQ(st.tiers[0].used, 4 * kFile);
  EXPECT_EQ(st.tiers[1].used, 2 * kFile);
  for (int f = 0; f < 6; ++f) EXPECT_TRUE(ReadsBack(*s, 1, f));
  st = s->Stats();
  EXPECT_EQ(st.tiers[0].hits, 4u);
  EXPECT_EQ(st.tiers[1].hits, 2u);
  EXPECT_EQ(st.tiers[0].misses, 2u);  // the two reads served by SSD missed MEM
}

TEST(TieredStore, ReserverDemotesAboveHighDownToLowAndEvictsAtTheBottom) {
  TwoLevels d;
  auto opts = d.Options(10, 10, 0.8, 0.5);
  opts.promote = false;
  auto s = std::move(BlockStore::Open(opts).value());
  std::vector<BlockMeta> removed;
  s->SetRemovedListener([&](const BlockMeta& m) { removed.push_back(m); });
  for (int f = 0; f < 10; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
  s->Reserve();
  auto st = s->Stats();
  EXPECT_LE(st.tiers[0].used, 5 * kFile) << "MEM is brought down to low";
  EXPECT_EQ(st.tiers[0].demotions, 5u);
  EXPECT_EQ(st.tiers[1].used, 5 * kFile);
  // The oldest blocks went down.
  for (int f = 0; f < 5; ++f) EXPECT_EQ(s->LevelOf(Meta(1, f).id), 1) << f;
  for (int f = 0; f < 10; ++f) EXPECT_TRUE(ReadsBack(*s, 1, f)) << f;
  // Fill both levels past high: MEM demotes into SSD, SSD evicts down to low.
  for (int f = 10; f < 20; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
  s->Reserve();
  st = s->Stats();
  EXPECT_LE(st.tiers[0].used, 8 * kFile);
  EXPECT_LE(st.tiers[1].used, 8 * kFile);
  EXPECT_GT(st.tiers[1].evictions, 0u);
  EXPECT_EQ(removed.size(), st.tiers[1].evictions);
  for (const auto& t : st.tiers) EXPECT_LE(t.used, t.capacity);
}

TEST(TieredStore, ReadFromALowerLevelIsPromoted) {
  TwoLevels d;
  auto s = std::move(BlockStore::Open(d.Options(4, 8, 0.9, 0.5)).value());
  for (int f = 0; f < 6; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
  s->Reserve();  // MEM at 4/4 > 0.9: two demoted to reach 0.5
  ASSERT_EQ(s->LevelOf(Meta(1, 0).id), 1);
  EXPECT_TRUE(ReadsBack(*s, 1, 0));
  s->Reserve();
  EXPECT_EQ(s->LevelOf(Meta(1, 0).id), 0);
  EXPECT_EQ(s->Stats().tiers[0].promotions, 1u);
  EXPECT_TRUE(ReadsBack(*s, 1, 0));
}

TEST(TieredStore, PinnedBlocksAreNeverEvictedAndFreeRemoves) {
  testing::TempDir dir;
  StoreOptions o;
  o.levels = {Level("SSD", dir / "c", 4, 1.0, 1.0)};
  o.background = false;
  auto s = std::move(BlockStore::Open(o).value());
  ASSERT_TRUE(s->Pin({Meta(1, 0).id.key, Meta(1, 1).id.key}, true).ok());
  for (int f = 0; f < 20; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok()) << f;
  EXPECT_TRUE(ReadsBack(*s, 1, 0));
  EXPECT_TRUE(ReadsBack(*s, 1, 1));
  EXPECT_EQ(s->Stats().pinned_blocks, 2u);
  // Everything pinned: a new block cannot be admitted.
  ASSERT_TRUE(s->Pin({Meta(1, 18).id.key, Meta(1, 19).id.key}, true).ok());
  EXPECT_EQ(s->Stats().pinned_blocks, 4u);  // kept as pins come and go, not counted by Stats()
  EXPECT_EQ(s->Put(Meta(1, 30), Content(1, 30)).code(), Code::kResourceExhausted);
  EXPECT_EQ(s->Stats().rejected, 1u);
  // Unpinned blocks become evictable again; free removes blocks at once.
  ASSERT_TRUE(s->Pin({Meta(1, 18).id.key}, false).ok());
  EXPECT_EQ(s->Stats().pinned_blocks, 3u);
  EXPECT_TRUE(s->Put(Meta(1, 30), Content(1, 30)).ok());
  EXPECT_FALSE(s->Contains(Meta(1, 18).id));
  EXPECT_EQ(s->Free({Meta(1, 0).id.key, Meta(1, 30).id.key}), 2u);
  EXPECT_EQ(s->Stats().pinned_blocks, 2u);  // a pinned block freed is no longer counted
  EXPECT_FALSE(s->Contains(Meta(1, 0).id));
  EXPECT_FALSE(s->Contains(Meta(1, 30).id));
  // Pins survive a restart.
  s.reset();
  s = std::move(BlockStore::Open(o).value());
  EXPECT_EQ(s->Stats().pinned_blocks, 2u);
}

TEST(TieredStore, MemLevelMustBeOnTmpfs) {
  testing::TempDir dir;  // ext4 here, never tmpfs in CI's /tmp
  StoreOptions o;
  o.levels = {Level("MEM", dir / "c", 4, 1.0, 1.0)};
  o.background = false;
  auto s = BlockStore::Open(o);
  if (s.ok()) GTEST_SKIP() << "TMPDIR is on tmpfs";
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("tmpfs"), std::string::npos) << s.status().message();
}

TEST(TieredStore, RestartKeepsEveryLevelAndDropsAnInterruptedMovesSecondCopy) {
  TwoLevels d;
  auto o = d.Options(4, 8, 1.0, 1.0);
  std::string dup_src, dup_sidecar, half_src;
  {
    auto s = std::move(BlockStore::Open(o).value());
    for (int f = 0; f < 8; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
    dup_src = s->PathOf(Meta(1, 0).id);
    dup_sidecar = s->SidecarPathOf(Meta(1, 0).id);
    half_src = s->PathOf(Meta(1, 1).id);
  }
  // A crash between a move's copy of the data and its sidecar's rename leaves a data file alone.
  std::string half_hex = FileKeyHex(Meta(1, 1).id.key);
  std::string other = (half_src.find(d.ssd.path()) == 0 ? d.mem.path() : d.ssd.path()) + "/c/blocks/" +
                      half_hex.substr(0, 2);
  std::filesystem::create_directories(other);
  std::filesystem::copy_file(half_src, other + "/" + half_hex);
  // A crash between a move's commit and its removal of the source leaves the block in two levels.
  std::string hex = FileKeyHex(Meta(1, 0).id.key);
  std::string dup = d.ssd / ("c/blocks/" + hex.substr(0, 2));
  std::filesystem::create_directories(dup);
  std::filesystem::copy_file(dup_src, dup + "/" + hex);
  std::filesystem::copy_file(dup_sidecar, dup + "/" + hex + "-0.m");
  auto s = std::move(BlockStore::Open(o).value());
  auto st = s->Stats();
  EXPECT_EQ(st.blocks, 8u);
  EXPECT_EQ(st.corrupt, 0u);
  EXPECT_EQ(st.tiers[0].blocks, 4u);
  EXPECT_EQ(st.tiers[1].used, 4 * kFile) << "the second copy is not counted";
  for (int f = 0; f < 8; ++f) EXPECT_TRUE(ReadsBack(*s, 1, f)) << f;
  EXPECT_EQ(s->Scrub(), 0u);
  EXPECT_NE(access((other + "/" + half_hex).c_str(), F_OK), 0) << "a data file without sidecar is debris";
  EXPECT_EQ(s->PathOf(Meta(1, 1).id), half_src);
}

TEST(TieredStore, ScrubFindsAndDropsCorruptBlocks) {
  testing::TempDir dir;
  StoreOptions o;
  o.levels = {Level("SSD", dir / "c", 8, 1.0, 1.0)};
  o.background = false;
  auto s = std::move(BlockStore::Open(o).value());
  for (int f = 0; f < 4; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
  testing::DamageOnDisk(s->PathOf(Meta(1, 2).id), 77);  // the data file holds only data
  EXPECT_EQ(s->Scrub(), 1u);
  EXPECT_FALSE(s->Contains(Meta(1, 2).id));
  EXPECT_EQ(s->Stats().corrupt, 1u);
  EXPECT_EQ(s->Stats().tiers[0].hits, 0u) << "the scrub is not a read";
}

// The continuous scrub (StoreOptions::scrub_bandwidth) keeps verifying blocks after the start-up
// pass: damage that no read through the store touches (a file only the kernel reads, in
// passthrough) is found and the block dropped, and a clean cache is verified over and over.
TEST(TieredStore, ContinuousScrubFindsDamageNoReadTouches) {
  testing::TempDir dir;
  StoreOptions o;
  o.levels = {Level("SSD", dir / "c", 8, 1.0, 1.0)};
  o.background = true;
  o.reserve_interval = std::chrono::milliseconds(5);
  o.scrub_bandwidth = 64ull << 20;
  auto s = std::move(BlockStore::Open(o).value());
  for (int f = 0; f < 4; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
  // Written back, as the kernel does within half a minute: the scrub skips blocks whose pages never
  // reached the disk.
  for (int f = 0; f < 4; ++f) {
    int fd = open(s->PathOf(Meta(1, f).id).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(fdatasync(fd), 0);
    close(fd);
  }
  ASSERT_TRUE(testing::WaitFor([&] { return s->Stats().scrubbed >= 8; })) << "the scrub does not go on";
  EXPECT_EQ(s->Stats().corrupt, 0u);
  testing::DamageOnDisk(s->PathOf(Meta(1, 3).id), 100);
  ASSERT_TRUE(testing::WaitFor([&] { return s->Stats().corrupt == 1; })) << "the damage was not found";
  EXPECT_FALSE(s->Contains(Meta(1, 3).id));
  EXPECT_EQ(s->Stats().tiers[0].hits, 0u) << "the scrub is not a read";
}

// Hit ratio over shuffled epochs of a dataset twice the cache: lru keeps missing, shuffle holds
// the fraction that fits.
// With `levels` 2 the cache is a MEM level holding a quarter of it above an SSD level.
double ShuffledHitRatio(CachePolicy policy, int dataset, int cache_blocks, int epochs, double* last_epoch,
                        int levels = 1) {
  testing::TempDir dir;
  TwoLevels two;
  StoreOptions o;
  if (levels == 2) {
    o = two.Options(static_cast<uint64_t>(cache_blocks / 4), static_cast<uint64_t>(cache_blocks - cache_blocks / 4),
                    0.95, 0.7);
  } else {
    o.levels = {Level("SSD", dir / "c", static_cast<uint64_t>(cache_blocks), 0.95, 0.7)};
  }
  o.policy = policy;
  o.background = false;
  auto s = std::move(BlockStore::Open(o).value());
  std::mt19937 rng(7);
  std::vector<int> order(static_cast<size_t>(dataset));
  for (int i = 0; i < dataset; ++i) order[static_cast<size_t>(i)] = i;
  uint64_t hits = 0, reads = 0;
  std::string buf(kData, '\0'), data(kData, 'x');
  for (int e = 0; e < epochs; ++e) {
    std::shuffle(order.begin(), order.end(), rng);
    uint64_t eh = 0;
    for (int f : order) {
      if (s->Read(Meta(1, f).id, 0, kData, buf.data()).ok()) {
        ++eh;
      } else {
        (void)s->Put(Meta(1, f), data);
      }
      if (f % 16 == 0) s->Reserve();
    }
    if (e > 0) {
      hits += eh;
      reads += static_cast<uint64_t>(dataset);
    }
    *last_epoch = static_cast<double>(eh) / dataset;
  }
  return static_cast<double>(hits) / static_cast<double>(reads);
}

TEST(TieredStore, ShufflePolicyHoldsTheFractionThatFits) {
  double last;
  double lru = ShuffledHitRatio(CachePolicy::kLru, 400, 200, 4, &last);
  double shuffle = ShuffledHitRatio(CachePolicy::kShuffle, 400, 200, 4, &last);
  EXPECT_GE(shuffle, 0.95 * 0.5) << "shuffle from epoch 2 on";
  EXPECT_GE(last, 0.95 * 0.5);
  EXPECT_LT(lru, shuffle);
}

// The same across two levels: the reserver's demotions from MEM into a full SSD level neither
// evict the dataset's blocks from MEM nor drop them at the bottom (watermark low), so the levels
// together hold a fixed subset.
TEST(TieredStore, ShufflePolicyHoldsTheFractionThatFitsAcrossTwoLevels) {
  double last;
  double lru = ShuffledHitRatio(CachePolicy::kLru, 400, 200, 4, &last, 2);
  double shuffle = ShuffledHitRatio(CachePolicy::kShuffle, 400, 200, 4, &last, 2);
  EXPECT_GE(shuffle, 0.95 * 0.5) << "shuffle from epoch 2 on";
  EXPECT_GE(last, 0.95 * 0.5);
  EXPECT_LT(lru, shuffle);
}

TEST(TieredStore, AnotherDatasetMayReplaceAShuffleDatasetsBlocks) {
  testing::TempDir dir;
  StoreOptions o;
  o.levels = {Level("SSD", dir / "c", 4, 1.0, 1.0)};
  o.policy = CachePolicy::kShuffle;
  o.background = false;
  auto s = std::move(BlockStore::Open(o).value());
  for (int f = 0; f < 4; ++f) ASSERT_TRUE(s->Put(Meta(1, f), Content(1, f)).ok());
  EXPECT_EQ(s->Put(Meta(1, 9), Content(1, 9)).code(), Code::kResourceExhausted) << "its own blocks stay";
  EXPECT_TRUE(s->Put(Meta(2, 0), Content(2, 0)).ok()) << "another dataset's block replaces one";
  EXPECT_EQ(s->Stats().blocks, 4u);
  s->SetMountPolicy(3, CachePolicy::kLru);
  EXPECT_TRUE(s->Put(Meta(3, 0), Content(3, 0)).ok());
  EXPECT_TRUE(s->Put(Meta(3, 1), Content(3, 1)).ok());
}

// An elastic copy on any level goes before a replica on any level, and an elastic copy takes only
// free room or another elastic copy's.
TEST(TieredStore, ElasticCopiesGoFirstFromEveryLevel) {
  TwoLevels d;
  auto s = std::move(BlockStore::Open(d.Options(1, 2, 1.0, 1.0)).value());
  BlockMeta e = Meta(1, 0);
  e.elastic = true;
  ASSERT_TRUE(s->Put(e, Content(1, 0)).ok());
  ASSERT_EQ(s->LevelOf(e.id), 0) << "the fastest level with room";
  ASSERT_TRUE(s->Put(Meta(1, 1), Content(1, 1)).ok());
  ASSERT_TRUE(s->Put(Meta(1, 2), Content(1, 2)).ok());
  BlockMeta e2 = Meta(1, 5);
  e2.elastic = true;
  EXPECT_EQ(s->Put(e2, Content(1, 5)).code(), Code::kOk) << "an elastic copy replaces an older elastic copy";
  EXPECT_FALSE(s->Contains(e.id));
  EXPECT_TRUE(s->Contains(Meta(1, 1).id) && s->Contains(Meta(1, 2).id));
  ASSERT_TRUE(s->Put(Meta(1, 3), Content(1, 3)).ok());
  EXPECT_FALSE(s->Contains(e2.id)) << "the elastic copy in MEM went, not a replica in SSD";
  EXPECT_TRUE(s->Contains(Meta(1, 1).id) && s->Contains(Meta(1, 2).id));
  EXPECT_EQ(s->Stats().elastic_blocks, 0u);
  BlockMeta e3 = Meta(1, 6);
  e3.elastic = true;
  EXPECT_EQ(s->Put(e3, Content(1, 6)).code(), Code::kResourceExhausted) << "an elastic copy never replaces a replica";
  EXPECT_FALSE(s->CanAdmit(e3));
  EXPECT_TRUE(s->CanAdmit(Meta(1, 7))) << "a replica may replace an lru replica";
  // The per-mount usage the master sums (held, elastic, home) follows every change.
  auto usage = [&] {
    MountUsage u = s->Stats().mounts[1];
    return std::make_tuple(u.blocks, u.bytes, u.elastic_blocks, u.elastic_bytes, u.home_blocks, u.home_bytes);
  };
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{3}, 3 * kData, uint64_t{0}, uint64_t{0}, uint64_t{3}, 3 * kData)) << "a lone worker is every block's home";
  // Classify turns replicas into elastic copies and back, and moves homes; MakeReplica one of them.
  auto changed = s->Classify([](const BlockMeta& m) -> BlockStore::Kind {
    bool elastic = m.id == Meta(1, 1).id || m.id == Meta(1, 2).id;
    return {elastic, !elastic && m.id != Meta(1, 3).id};
  });
  EXPECT_EQ(changed.size(), 3u);
  EXPECT_EQ(s->Stats().elastic_blocks, 2u);
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{3}, 3 * kData, uint64_t{2}, 2 * kData, uint64_t{0}, uint64_t{0}));
  EXPECT_TRUE(s->MakeReplica(Meta(1, 1).id, /*home=*/false));
  EXPECT_FALSE(s->MakeReplica(Meta(1, 1).id, false)) << "a replica already";
  EXPECT_EQ(s->Stats().elastic_blocks, 1u);
  ASSERT_TRUE(s->Put(Meta(1, 8), Content(1, 8)).ok());
  EXPECT_FALSE(s->Contains(Meta(1, 2).id)) << "the block made elastic went first";
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{3}, 3 * kData, uint64_t{0}, uint64_t{0}, uint64_t{1}, kData)) << "only the new block is home";
  EXPECT_TRUE(ReadsBack(*s, 1, 1) && ReadsBack(*s, 1, 3) && ReadsBack(*s, 1, 8));
  EXPECT_EQ(s->Free({Meta(1, 1).id.key, Meta(1, 3).id.key, Meta(1, 8).id.key}), 3u);
  EXPECT_EQ(s->Stats().mounts.count(1), 0u) << "nothing held: no entry";
}

// ---- property test ----------------------------------------------------------------------------
//
// Random sequences of Put, Read, Pin, Unpin, Free, Reserve and restart against a model that knows
// each block's bytes and which blocks are pinned. A third of the files are put as elastic copies.
// After every step: no level above its quota, the store's block count matches its listing, every
// pinned block that was cached still is, and every read returns the model's bytes or NOT_FOUND
// (never other bytes, never DATA_LOSS). Around every Put: an elastic copy's Put evicted no replica,
// and a replica's Put evicted a replica only when no unpinned elastic copy was left.
class TieredStoreProperty : public ::testing::TestWithParam<int> {};

TEST_P(TieredStoreProperty, AgreesWithTheModel) {
  const int seed = GetParam();
  std::mt19937 rng(static_cast<unsigned>(seed));
  TwoLevels d;
  auto o = d.Options(6, 10, 0.8, 0.5);
  o.policy = seed % 2 ? CachePolicy::kShuffle : CachePolicy::kLru;
  auto s = std::move(BlockStore::Open(o).value());
  std::set<int> pinned;               // files pinned
  std::set<int> pinned_cached;        // pinned files whose block must stay cached
  const int kFiles = 40;
  auto pick = [&] { return static_cast<int>(rng() % kFiles); };
  std::unordered_map<FileKey, int, FileKeyHash> file_of;
  for (int f = 0; f < kFiles; ++f) file_of[Meta(1 + static_cast<uint64_t>(f % 2), f).id.key] = f;
  for (int step = 0; step < 600; ++step) {
    int op = static_cast<int>(rng() % 100);
    int f = pick();
    uint64_t mount = 1 + static_cast<uint64_t>(f % 2);
    SCOPED_TRACE("seed " + std::to_string(seed) + " step " + std::to_string(step) + " op " + std::to_string(op) +
                 " file " + std::to_string(f));
    if (op < 45) {
      BlockMeta m = Meta(mount, f);
      m.elastic = f % 3 == 0;
      auto cached = [&] {  // file -> whether it is cached as an elastic copy
        std::map<uint64_t, bool> now;
        for (const auto& b : s->List()) now[static_cast<uint64_t>(file_of.at(b.id.key))] = b.elastic;
        return now;
      };
      std::map<uint64_t, bool> before = cached();
      Status st = s->Put(m, Content(mount, f));
      ASSERT_TRUE(st.ok() || st.code() == Code::kResourceExhausted) << st.ToString();
      std::map<uint64_t, bool> after = cached();
      bool replica_evicted = false, elastic_left = false;
      for (const auto& [file, elastic] : before) {
        if (pinned.count(static_cast<int>(file))) continue;
        if (!after.count(file) && !elastic) replica_evicted = true;
        if (after.count(file) && elastic) elastic_left = true;
      }
      if (m.elastic) {
        ASSERT_FALSE(replica_evicted) << "an elastic copy evicted a replica";
      }
      ASSERT_FALSE(replica_evicted && elastic_left) << "a replica went while an elastic copy stayed";
      if (st.ok() && pinned.count(f) && s->Contains(Meta(mount, f).id)) pinned_cached.insert(f);
    } else if (op < 80) {
      std::string out(kData, '\0');
      auto n = s->Read(Meta(mount, f).id, 0, kData, out.data());
      if (n.ok()) {
        ASSERT_EQ(out, Content(mount, f));
      } else {
        ASSERT_EQ(n.status().code(), Code::kNotFound) << n.status().ToString();
        ASSERT_FALSE(pinned_cached.count(f)) << "a pinned block was lost";
      }
    } else if (op < 86) {
      ASSERT_TRUE(s->Pin({Meta(mount, f).id.key}, true).ok());
      pinned.insert(f);
      if (s->Contains(Meta(mount, f).id)) pinned_cached.insert(f);
    } else if (op < 91) {
      ASSERT_TRUE(s->Pin({Meta(mount, f).id.key}, false).ok());
      pinned.erase(f);
      pinned_cached.erase(f);
    } else if (op < 94) {
      s->Free({Meta(mount, f).id.key});
      ASSERT_FALSE(s->Contains(Meta(mount, f).id));
      pinned_cached.erase(f);
    } else if (op < 99) {
      s->Reserve();
      auto st = s->Stats();
      // (shuffle blocks may stay above high when the level below holds only their own dataset)
      for (size_t t = 0; o.policy == CachePolicy::kLru && t + 1 < st.tiers.size(); ++t) {
        // Above the last level, only pinned blocks can keep a level above high after a pass.
        uint64_t pinned_bytes = 0;
        for (int p : pinned_cached) {
          if (s->LevelOf(Meta(1 + static_cast<uint64_t>(p % 2), p).id) == static_cast<int>(t)) pinned_bytes += kFile;
        }
        ASSERT_LE(st.tiers[t].used, std::max<uint64_t>(static_cast<uint64_t>(0.8 * static_cast<double>(st.tiers[t].capacity)), pinned_bytes + kFile))
            << "level " << t << " stays above its high watermark";
      }
    } else {
      s.reset();
      s = std::move(BlockStore::Open(o).value());
    }
    auto st = s->Stats();
    for (const auto& t : st.tiers) ASSERT_LE(t.used, t.capacity) << t.medium << " over its quota";
    ASSERT_EQ(st.blocks, s->List().size());
    for (int p : pinned_cached) {
      ASSERT_TRUE(s->Contains(Meta(1 + static_cast<uint64_t>(p % 2), p).id)) << "pinned file " << p << " evicted";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, TieredStoreProperty, ::testing::Range(1, 9));

// Readers, writers, frees and the background reserver at once: a read returns the right bytes or
// NOT_FOUND, never DATA_LOSS (a block is never removed or moved under its reader), and no level
// ever exceeds its quota.
TEST(TieredStore, ConcurrentReadersNeverLoseTheirBlock) {
  TwoLevels d;
  auto o = d.Options(6, 10, 0.7, 0.4);
  o.background = true;
  o.reserve_interval = std::chrono::milliseconds(1);
  auto s = std::move(BlockStore::Open(o).value());
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0}, ok_reads{0}, over{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t + 1));
      std::string out(kData, '\0');
      while (!stop) {
        int f = static_cast<int>(rng() % 30);
        if (rng() % 3 == 0) {
          Status st = s->Put(Meta(1, f), Content(1, f));
          // ABORTED: another thread freed the file while this Put wrote it (the free wins).
          if (!st.ok() && st.code() != Code::kResourceExhausted && st.code() != Code::kAborted) bad++;
        } else {
          auto n = s->Read(Meta(1, f).id, 0, kData, out.data());
          if (n.ok()) {
            ok_reads++;
            if (out != Content(1, f)) bad++;
          } else if (n.status().code() != Code::kNotFound) {
            bad++;
          }
        }
        if (rng() % 50 == 0) s->Free({Meta(1, f).id.key});
      }
    });
  }
  ts.emplace_back([&] {
    while (!stop) {
      for (const auto& t : s->Stats().tiers) {
        if (t.used > t.capacity) over++;
      }
    }
  });
  EXPECT_TRUE(testing::WaitFor([&] { return ok_reads > 3000; }, std::chrono::seconds(60)));
  stop = true;
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0) << "wrong bytes or unexpected errors";
  EXPECT_EQ(over.load(), 0) << "a level went over its quota";
  auto st = s->Stats();
  EXPECT_GT(st.tiers[0].demotions, 0u);
  EXPECT_EQ(st.corrupt, 0u);
}

}  // namespace
}  // namespace granary::worker
