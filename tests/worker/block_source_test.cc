#include "worker/block_source.h"

#include <fcntl.h>
#include <sys/ioctl.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <fstream>
#include <thread>

#include "proto/granary.pb.h"
#include "rpc/local_wire.h"
#include "rpc/wire.h"
#include "ufs/local_ufs.h"
#include "worker/block_buffers.h"
#include "worker/local_server.h"
#include "tests/testutil/fault_ufs.h"
#include "tests/testutil/testutil.h"

namespace granary::worker {
namespace {

class Fakes : public MountResolver, public BlockReporter {
 public:
  StatusOr<MountHandle> GetMount(uint64_t id) override {
    if (id != 1) return NotFoundError("mount " + std::to_string(id) + " does not exist");
    MountHandle m{ufs->uri(), ufs, std::nullopt};
    m.block_size = block_size;
    return m;
  }
  void BlockAdded(const BlockMeta&) override { added++; }
  void BlockRemoved(const BlockMeta&) override { removed++; }
  std::shared_ptr<testing::FaultUfs> ufs;
  uint64_t block_size = 65536;  // the mount's
  std::atomic<int> added{0}, removed{0};
};

class BlockSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = testing::RandomBytes(300000, 5);
    testing::WriteFile(dir_ / "src/f.bin", data_);
    auto local = LocalUfs::Open(dir_ / "src");
    ASSERT_TRUE(local.ok());
    fakes_.ufs = std::make_shared<testing::FaultUfs>(*local);
    version_ = fakes_.ufs->Stat("f.bin")->version;
    OpenStore(1 << 30);
  }
  void OpenStore(uint64_t quota) {
    source_.reset();
    store_ = std::move(BlockStore::Open(dir_ / "cache", quota).value());
    source_ = std::make_unique<BlockSource>(store_.get(), &fakes_, &fakes_);
  }
  BlockRequest Req(uint64_t index, uint64_t offset, uint64_t length) {
    return BlockRequest{1, "f.bin", version_, data_.size(), 65536, index, offset, length};
  }

  testing::TempDir dir_;
  std::string data_, version_;
  Fakes fakes_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<BlockSource> source_;
};

TEST_F(BlockSourceTest, MissThenHit) {
  std::string out;
  bool hit = true;
  ASSERT_TRUE(source_->Read(Req(2, 100, 1000), &out, &hit).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(out, data_.substr(2 * 65536 + 100, 1000));
  ASSERT_TRUE(source_->Read(Req(2, 0, 65536), &out, &hit).ok());
  EXPECT_TRUE(hit);
  EXPECT_EQ(out, data_.substr(2 * 65536, 65536));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1);
  EXPECT_EQ(fakes_.added.load(), 1);
  // The last block is short; a request past its end is clipped.
  ASSERT_TRUE(source_->Read(Req(4, 0, 65536), &out, &hit).ok());
  EXPECT_EQ(out, data_.substr(4 * 65536));
  EXPECT_EQ(source_->Read(Req(5, 0, 10), &out, &hit).code(), Code::kInvalidArgument);
}

// The zero-copy path: a missed block, once fetched and kept, is answered as a lease on its cache
// file, as a hit is, not as bytes; a block that could not be kept comes back as bytes.
TEST_F(BlockSourceTest, AMissedBlockOnceKeptIsAnsweredAsALease) {
  std::string out;
  BlockLease lease;
  bool hit = true;
  ReadSource source = ReadSource::kCache;
  ASSERT_TRUE(source_->ReadOrLease(Req(1, 0, 65536), &out, &lease, &hit, &source).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(source, ReadSource::kUnderStorage);
  EXPECT_TRUE(out.empty());
  ASSERT_GE(lease.fd, 0);
  ASSERT_EQ(lease.length, 65536u);
  std::string got(lease.length, '\0');
  ASSERT_EQ(pread(lease.fd, got.data(), got.size(), static_cast<off_t>(lease.data_offset)),
            static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, data_.substr(65536, 65536));
  lease.Reset();

  OpenStore(1000);  // too small to keep anything
  ASSERT_TRUE(source_->ReadOrLease(Req(1, 0, 65536), &out, &lease, &hit, &source).ok());
  EXPECT_EQ(lease.fd, -1);
  EXPECT_EQ(out, data_.substr(65536, 65536));
}

// A request's sizes are checked before anything is allocated for them: a block size other than the
// mount's, a block past the file's end or a path too long is INVALID_ARGUMENT, whatever the sizes.
TEST_F(BlockSourceTest, SizesARequestNamesAreCheckedBeforeAnyAllocation) {
  std::string out;
  bool hit;
  BlockLease lease;
  auto bad = [&](BlockRequest r, const char* what) {
    EXPECT_EQ(source_->Read(r, &out, &hit).code(), Code::kInvalidArgument) << what;
    EXPECT_EQ(source_->ReadOrLease(r, &out, &lease, &hit).code(), Code::kInvalidArgument) << what;
    EXPECT_LE(out.capacity(), 65536u) << what;
    EXPECT_FALSE(source_->Load(r, 1).ok()) << what;
  };
  BlockRequest huge = Req(0, 0, 1ull << 40);
  huge.block_size = 1ull << 40;  // the 40-byte local socket message that aborted a worker
  huge.file_size = 1ull << 41;
  bad(huge, "a block size of 1 TiB");
  BlockRequest other = Req(0, 0, 65536);
  other.block_size = 512ull << 20;  // 512 MiB blocks of a 1 GiB file, over gRPC
  other.file_size = 1ull << 30;
  bad(other, "a block size other than the mount's");
  BlockRequest smaller = Req(1, 0, 4096);
  smaller.block_size = 4096;  // would cache bytes 4096.. under the key of block 1 of 64 KiB blocks
  bad(smaller, "a smaller block size than the mount's");
  bad(Req(~0ull / 65536, 0, 65536), "a block index far past the end");
  BlockRequest wrap = Req(3, 0, 65536);
  wrap.file_size = ~0ull;
  wrap.index = ~0ull;
  bad(wrap, "an index whose offset overflows");
  BlockRequest empty = Req(0, 0, 10);
  empty.file_size = 0;
  bad(empty, "an empty file has no block 0");
  BlockRequest long_path = Req(0, 0, 10);
  long_path.ufs_path = std::string(5000, 'a');
  bad(long_path, "a path longer than PATH_MAX");
  // A mount made before mounts kept their block size: any size in master.block_size's range.
  fakes_.block_size = 0;
  BlockRequest legacy = Req(0, 0, 100);
  legacy.block_size = 512ull << 20;
  bad(legacy, "above 256 MiB");
  ASSERT_TRUE(source_->Read(Req(0, 0, 100), &out, &hit).ok());
  EXPECT_EQ(out, data_.substr(0, 100));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1) << "no refused request reached the under-storage";
}

// A request that claims a smaller file caches a short block; the whole block, read for a request
// with the file's real size, replaces it, and no read ever gets bytes past what was fetched.
TEST_F(BlockSourceTest, AShortBlockFromAFalseFileSizeGivesWayToTheWholeOne) {
  std::string out;
  bool hit;
  BlockRequest lie = Req(1, 0, 65536);
  lie.file_size = 65536 + 100;  // block 1 claimed to be 100 bytes
  ASSERT_TRUE(source_->Read(lie, &out, &hit).ok());
  EXPECT_EQ(out, data_.substr(65536, 100));
  ASSERT_TRUE(source_->Read(Req(1, 0, 65536), &out, &hit).ok());
  EXPECT_EQ(out, data_.substr(65536, 65536));
  ASSERT_TRUE(source_->Read(Req(1, 100, 65436), &out, &hit).ok());
  EXPECT_TRUE(hit) << "the whole block replaced the short one in the cache";
  EXPECT_EQ(out, data_.substr(65536 + 100, 65436));
}

TEST_F(BlockSourceTest, ConcurrentMissesFetchOnce) {
  fakes_.ufs->CloseGate();
  constexpr int kReaders = 8;
  std::vector<std::thread> ts;
  std::atomic<int> good{0};
  for (int i = 0; i < kReaders; ++i) {
    ts.emplace_back([&, i] {
      std::string out;
      bool hit;
      if (source_->Read(Req(1, i * 100, 100), &out, &hit).ok() && out == data_.substr(65536 + i * 100, 100)) good++;
    });
  }
  // Every reader but the one fetching joins the in-flight fetch before the under-storage answers.
  ASSERT_TRUE(testing::WaitFor([&] { return source_->counters().coalesced.load() == kReaders - 1; }));
  fakes_.ufs->OpenGate();
  for (auto& t : ts) t.join();
  EXPECT_EQ(good.load(), kReaders);
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1);
}

// Issue 54 #4, the race found: a reader's fetch was on its way when the dataset was freed (its Put
// rightly refused), and a load started after the free joined that fetch in flight. The load then
// failed "fetched but not kept: the cache has no room" with the cache all but empty. Now the
// load's own Put, whose ticket is from after the free, keeps the block.
TEST_F(BlockSourceTest, ALoadThatJoinedAFetchAFreeOvertookKeepsTheBlock) {
  fakes_.ufs->CloseGate();
  std::thread reader([&] {
    std::string out;
    bool hit;
    EXPECT_TRUE(source_->Read(Req(1, 0, 65536), &out, &hit).ok());
    EXPECT_EQ(out, data_.substr(65536, 65536)) << "the reader still gets its bytes";
  });
  ASSERT_TRUE(testing::WaitFor([&] { return fakes_.ufs->reads_started.load() == 1; }));
  store_->FreeMount(1);  // while the reader's bytes are on their way
  StatusOr<BlockSource::LoadOutcome> loaded = InternalError("not run");
  std::thread loader([&] { loaded = source_->Load(Req(1, 0, 65536), 1); });
  ASSERT_TRUE(testing::WaitFor([&] { return source_->counters().coalesced.load() == 1; }))
      << "the load did not join the fetch in flight";
  fakes_.ufs->OpenGate();
  reader.join();
  loader.join();
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(*loaded, BlockSource::LoadOutcome::kFetched);
  EXPECT_TRUE(source_->IsCached(Req(1, 0, 65536))) << "the load, begun after the free, keeps the block";
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1) << "fetched once";
}

TEST_F(BlockSourceTest, CorruptCachedBlockIsRefetchedNeverServed) {
  std::string out;
  bool hit;
  ASSERT_TRUE(source_->Read(Req(0, 0, 65536), &out, &hit).ok());
  BlockId id{MakeFileKey(fakes_.ufs->uri(), "f.bin", version_), 0};
  testing::DamageOnDisk(store_->PathOf(id), 10, 1);  // the data file holds only data
  ASSERT_TRUE(source_->Read(Req(0, 0, 65536), &out, &hit).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(out, data_.substr(0, 65536));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 2);
  EXPECT_EQ(fakes_.removed.load(), 1);
  EXPECT_EQ(store_->Stats().corrupt, 1u);
  ASSERT_TRUE(source_->Read(Req(0, 0, 65536), &out, &hit).ok());
  EXPECT_TRUE(hit) << "the refetched block is cached again";
}

TEST_F(BlockSourceTest, UnderStorageErrorsPassThroughAndCacheNothing) {
  fakes_.ufs->FailNext(1, UnavailableError("connection reset"));
  std::string out;
  bool hit;
  Status s = source_->Read(Req(0, 0, 10), &out, &hit);
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(store_->Stats().blocks, 0u);
  // A changed file: the listed version is refused by the under-storage.
  testing::WriteFile(dir_ / "src/f.bin", testing::RandomBytes(300000, 6));
  EXPECT_TRUE(source_->Read(Req(0, 0, 10), &out, &hit).IsVersionChanged());
  EXPECT_EQ(store_->Stats().blocks, 0u);
  EXPECT_EQ(fakes_.added.load(), 0);
  BlockRequest bad = Req(0, 0, 10);
  bad.mount_id = 9;
  EXPECT_EQ(source_->Read(bad, &out, &hit).code(), Code::kNotFound);
}

TEST_F(BlockSourceTest, ServesUncachedWhenTheCacheIsTooSmall) {
  OpenStore(4096);  // not even one block fits
  std::string out;
  bool hit;
  ASSERT_TRUE(source_->Read(Req(3, 5, 50), &out, &hit).ok());
  EXPECT_EQ(out, data_.substr(3 * 65536 + 5, 50));
  EXPECT_EQ(store_->Stats().blocks, 0u);
  EXPECT_EQ(fakes_.added.load(), 0);
}

}  // namespace
}  // namespace granary::worker

namespace granary::worker {
namespace {

TEST_F(BlockSourceTest, ABlockThatCannotBeCachedIsFetchedOnceForItsNextRequests) {
  OpenStore(4096);  // too small for any block
  std::string out;
  bool hit = true;
  ASSERT_TRUE(source_->Read(Req(0, 0, 1000), &out, &hit).ok());
  ASSERT_TRUE(source_->Read(Req(0, 1000, 60000), &out, &hit).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(out, data_.substr(1000, 60000));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1);
  EXPECT_EQ(source_->counters().buffered.load(), 1u);
  EXPECT_EQ(fakes_.added.load(), 0);
}

}  // namespace
}  // namespace granary::worker

namespace granary::worker {
namespace {

// Range first: a read starting inside a large cold block waits for its own bytes (a ranged read);
// the whole block follows in the background on its second touch, and only when the cache has free
// room for it. A read at a block's start (a sequential reader) fetches the whole block.
class RangeFirstTest : public BlockSourceTest {
 protected:
  static constexpr uint64_t kBlock = 4 << 20;
  void SetUp() override {
    BlockSourceTest::SetUp();
    big_ = testing::RandomBytes(5 << 20, 9);
    testing::WriteFile(dir_ / "src/big.bin", big_);
    big_version_ = fakes_.ufs->Stat("big.bin")->version;
    fakes_.block_size = kBlock;
  }
  BlockRequest Big(uint64_t index, uint64_t offset, uint64_t length) {
    return BlockRequest{1, "big.bin", big_version_, big_.size(), kBlock, index, offset, length};
  }
  std::string big_, big_version_;
};

TEST_F(RangeFirstTest, ASmallReadGetsItsRangeThenTheBlockFollowsOnItsSecondTouch) {
  std::string out;
  bool hit = true;
  ASSERT_TRUE(source_->Read(Big(0, 123457, 4096), &out, &hit).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(out, big_.substr(123457, 4096));
  EXPECT_EQ(source_->counters().range_reads.load(), 1u);
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1) << "the first touch reads its range only";
  ASSERT_TRUE(source_->Read(Big(0, 3000000, 700000), &out, &hit).ok());  // up to 1 MiB: still a range
  EXPECT_EQ(out, big_.substr(3000000, 700000));
  EXPECT_EQ(source_->counters().range_reads.load(), 2u);
  // The second touch brings the whole block in the background; then reads of it are hits.
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
  ASSERT_TRUE(source_->Read(Big(0, 2000000, 65536), &out, &hit).ok());
  EXPECT_TRUE(hit);
  EXPECT_EQ(out, big_.substr(2000000, 65536));
  // A large read of a cold block is not range first: the whole block, as before.
  ASSERT_TRUE(source_->Read(Big(1, 0, 1 << 20), &out, &hit).ok());
  EXPECT_EQ(out, big_.substr(kBlock, 1 << 20));
  EXPECT_EQ(source_->counters().range_reads.load(), 2u);
  EXPECT_TRUE(source_->IsCached(Big(1, 0, kBlock)));
}

// The fill a second touch starts yields to the readers: a range read of the block meanwhile reads
// its range rather than waiting for the whole block.
TEST_F(RangeFirstTest, ARangeReadDoesNotWaitBehindTheBlocksFill) {
  fakes_.ufs->CloseGate(kBlock);  // whole-block reads wait; ranges pass
  std::string out;
  bool hit;
  ASSERT_TRUE(source_->Read(Big(0, 4096, 4096), &out, &hit).ok());
  ASSERT_TRUE(source_->Read(Big(0, 8192, 4096), &out, &hit).ok());  // the second touch: the fill starts
  ASSERT_TRUE(testing::WaitFor([&] { return fakes_.ufs->reads_started.load() == 3; })) << "the fill reached the store";
  std::atomic<bool> done{false};
  std::string third;
  std::thread reader([&] {
    bool h = true;
    if (source_->Read(Big(0, 3000000, 4096), &third, &h).ok() && !h) done = true;
  });
  bool answered = testing::WaitFor([&] { return done.load(); });
  fakes_.ufs->OpenGate();
  reader.join();
  EXPECT_TRUE(answered) << "the range read waited for the block's fill";
  EXPECT_EQ(third, big_.substr(3000000, 4096));
  EXPECT_EQ(source_->counters().range_reads.load(), 3u);
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 4);
}

// A random reader's window that crosses into a block reaches it at offset 0: marked random, it is a
// range, not a sequential reader's block start (which fetches the block whole).
TEST_F(RangeFirstTest, ARandomReadAtABlocksStartIsARangeToo) {
  std::string out;
  bool hit;
  BlockRequest r = Big(0, 0, 65536);
  r.random = true;
  ASSERT_TRUE(source_->Read(r, &out, &hit).ok());
  EXPECT_EQ(out, big_.substr(0, 65536));
  EXPECT_EQ(source_->counters().range_reads.load(), 1u);
  EXPECT_FALSE(source_->IsCached(Big(0, 0, kBlock))) << "fetched whole on its first touch";
}

// A sequential reader's READ that begins inside a block (the kernel's readahead sent it before the
// READ holding the block's start, or READs of ~1 MiB fall across blocks) is marked continuing: the
// block is fetched whole and kept, never read as a range first and then again whole (storage sent
// twice for those bytes).
TEST_F(RangeFirstTest, AContinuingReadInsideABlockFetchesTheBlockWhole) {
  std::string out;
  bool hit = true;
  BlockRequest r = Big(0, 442368, 1032192);
  r.continues = true;
  ASSERT_TRUE(source_->Read(r, &out, &hit).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(out, big_.substr(442368, 1032192));
  EXPECT_EQ(source_->counters().range_reads.load(), 0u);
  EXPECT_TRUE(source_->IsCached(Big(0, 0, kBlock))) << "the block was not kept whole";
  ASSERT_TRUE(source_->Read(Big(0, 0, 442368), &out, &hit).ok());  // the READ holding its start
  EXPECT_TRUE(hit);
  EXPECT_EQ(out, big_.substr(0, 442368));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1) << "the block's bytes were read from the store twice";
  // Marked random as well, a read is a random reader's: range first.
  BlockRequest random = Big(1, 4096, 4096);
  random.continues = true;
  random.random = true;
  ASSERT_TRUE(source_->Read(random, &out, &hit).ok());
  EXPECT_EQ(out, big_.substr(kBlock + 4096, 4096));
  EXPECT_EQ(source_->counters().range_reads.load(), 1u);
}

// granary-fuse's own reads of the source (fuse/source_reads.h) reach the worker as touches: nothing
// is read for them, and a block touched twice (by reads here or there) is filled as range first
// fills it; a cached block's touches do nothing.
TEST_F(RangeFirstTest, TouchesReportedByGranaryFuseFillABlockTouchedTwice) {
  EXPECT_FALSE(source_->Touched(Big(0, 4096, 4096)));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 0) << "a touch reads nothing";
  EXPECT_TRUE(source_->Touched(Big(0, 8192, 4096))) << "the second touch queues the fill";
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
  std::string out;
  bool hit = false;
  ASSERT_TRUE(source_->Read(Big(0, 2000000, 4096), &out, &hit).ok());
  EXPECT_TRUE(hit);
  EXPECT_EQ(out, big_.substr(2000000, 4096));
  EXPECT_FALSE(source_->Touched(Big(0, 4096, 4096)));
  EXPECT_FALSE(source_->Touched(Big(0, 4096, 4096))) << "a cached block is not filled again";
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1) << "the fill only: touches and the hit read nothing";
  // A read answered range first and a touch make two touches as well.
  ASSERT_TRUE(source_->Read(Big(1, 4096, 4096), &out, &hit).ok());
  EXPECT_TRUE(source_->Touched(Big(1, 8192, 4096)));
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(1, 0, kBlock)); }));
}

// A readahead hint and a touch that waited in granary-fuse's queue past a free of their file
// fetch nothing and cache nothing (issue 53: a freed block came back); asked after it, they do.
TEST_F(RangeFirstTest, HintsAndTouchesAskedBeforeAFreeBringNothingBack) {
  const auto asked = std::chrono::steady_clock::now();
  store_->FreeMount(1);
  BlockRequest hint = Big(0, 0, 0);
  hint.asked_at = asked;
  ASSERT_TRUE(source_->Prefetch(hint));
  BlockRequest touch = Big(1, 4096, 4096);
  touch.asked_at = asked;
  EXPECT_FALSE(source_->Touched(touch));
  ASSERT_TRUE(source_->Touched(touch)) << "the second touch queues the fill";
  ASSERT_TRUE(testing::WaitFor([&] { return source_->counters().hints_freed.load() == 2; }));
  EXPECT_FALSE(source_->IsCached(Big(0, 0, kBlock)));
  EXPECT_FALSE(source_->IsCached(Big(1, 0, kBlock)));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 0) << "a hint freed since it was asked fetches nothing";
  // Asked now, after the free: fetched and kept.
  hint.asked_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(source_->Prefetch(hint));
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
  EXPECT_EQ(source_->counters().hints_freed.load(), 2u);
}

// The bitmap the worker sends with a source file (LocalResponse.source_cached): bit i of byte i / 8
// for block i, as fuse/source_reads.cc reads it.
TEST_F(RangeFirstTest, CachedBlocksSaysWhichBlocksAreCached) {
  EXPECT_EQ(source_->CachedBlocks(Big(0, 0, 0), 4096), std::string(1, '\0'));
  std::string out;
  bool hit;
  ASSERT_TRUE(source_->Read(Big(1, 0, 4096), &out, &hit).ok());  // a block's start: fetched whole, kept
  EXPECT_EQ(source_->CachedBlocks(Big(0, 0, 0), 4096), std::string(1, '\x02'));
  EXPECT_EQ(source_->CachedBlocks(Big(0, 0, 0), 1), std::string(1, '\0')) << "only the first block asked";
}

TEST_F(RangeFirstTest, NoRoomNoWholeBlock) {
  OpenStore(2 << 20);  // a 4 MiB block never fits
  std::string out;
  bool hit;
  for (int i = 1; i <= 2; ++i) {
    ASSERT_TRUE(source_->Read(Big(0, 4096 * i, 4096), &out, &hit).ok());
    EXPECT_FALSE(hit);
    EXPECT_EQ(out, big_.substr(4096 * i, 4096));
  }
  EXPECT_EQ(source_->counters().range_reads.load(), 2u);
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 2) << "only the two ranges were read";
  EXPECT_FALSE(source_->IsCached(Big(0, 0, kBlock)));
}

// Streaming: a sequential reader's ranges of a cold large block are answered as they land, before
// the whole block has come; a range past what landed waits for it; the block is then cached and
// reported once, fetched once.
TEST_F(RangeFirstTest, ARangeOfAColdBlockIsAnsweredAsItLands) {
  fakes_.ufs->SplitStreams(1 << 20);  // 1 MiB lands, then the fetch waits
  std::string first, second, past;
  bool hit = true;
  ReadSource source = ReadSource::kCache;
  ASSERT_TRUE(source_->Read(Big(0, 0, 128 << 10), &first, &hit, &source).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(source, ReadSource::kUnderStorage);
  EXPECT_EQ(first, big_.substr(0, 128 << 10));
  ASSERT_TRUE(source_->Read(Big(0, 512 << 10, 512 << 10), &second, &hit).ok());
  EXPECT_EQ(second, big_.substr(512 << 10, 512 << 10));
  EXPECT_EQ(fakes_.ufs->streams_split.load(), 1) << "both answered while the fetch waited halfway";
  EXPECT_FALSE(source_->IsCached(Big(0, 0, kBlock)));
  std::atomic<bool> done{false};
  std::thread reader([&] {
    bool h = true;
    if (source_->Read(Big(0, 2 << 20, 4096 * 16), &past, &h).ok()) done = true;
  });
  // It joined the fetch (the second read was the first to join).
  ASSERT_TRUE(testing::WaitFor([&] { return source_->counters().coalesced.load() == 2; }));
  fakes_.ufs->OpenStreamGate();
  reader.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(past, big_.substr(2 << 20, 4096 * 16));
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
  EXPECT_EQ(fakes_.ufs->reads_started.load(), 1);
  EXPECT_EQ(fakes_.added.load(), 1);
  EXPECT_EQ(source_->counters().streamed.load(), 3u);
  // A read of a cached block is a hit, as before.
  ASSERT_TRUE(source_->Read(Big(0, 3 << 20, 4096), &past, &hit).ok());
  EXPECT_TRUE(hit);
  EXPECT_EQ(past, big_.substr(3 << 20, 4096));
}

// The local socket's reads of a streamed block get views of the fetch's buffer (SharedBytes), not
// copies: the bytes are right, `out` stays empty, and the view outlives the fetch — the buffer is
// not given back for another block's fetch while a view holds it.
TEST_F(RangeFirstTest, AStreamedRangeIsAViewOfTheFetchsBufferThatOutlivesTheFetch) {
  fakes_.ufs->SplitStreams(1 << 20);  // 1 MiB lands, then the fetch waits
  std::string out = "stale";
  BlockLease lease;
  bool hit = true;
  ReadSource source = ReadSource::kCache;
  SharedBytes shared;
  ASSERT_TRUE(source_->ReadOrLease(Big(0, 0, 256 << 10), &out, &lease, &hit, &source, &shared).ok());
  EXPECT_FALSE(hit);
  EXPECT_EQ(source, ReadSource::kUnderStorage);
  EXPECT_LT(lease.fd, 0);
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(shared.keep);
  EXPECT_TRUE(shared.bytes == std::string_view(big_).substr(0, 256 << 10));
  fakes_.ufs->OpenStreamGate();
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
  // Another file's 4 MiB block streamed meanwhile: a freed 4 MiB buffer would be taken again for it
  // (worker/block_buffers.h) and overwritten.
  const std::string other = testing::RandomBytes(kBlock, 10);
  testing::WriteFile(dir_ / "src/other.bin", other);
  BlockRequest r{1, "other.bin", fakes_.ufs->Stat("other.bin")->version, kBlock, kBlock, 0, 0, 4096};
  SharedBytes second;
  ASSERT_TRUE(source_->ReadOrLease(r, &out, &lease, &hit, &source, &second).ok());
  EXPECT_TRUE(second.bytes == std::string_view(other).substr(0, 4096));
  EXPECT_TRUE(shared.bytes == std::string_view(big_).substr(0, 256 << 10)) << "the view held its buffer";
}

// A streamed fetch that fails after its front landed: what landed was served; a range past it gets
// the failure, and nothing is cached.
TEST_F(RangeFirstTest, AStreamThatFailsHalfwayFailsOnlyWhatHadNotLanded) {
  fakes_.ufs->SplitStreams(1 << 20, UnavailableError("connection reset"));
  std::string out;
  bool hit;
  ASSERT_TRUE(source_->Read(Big(0, 0, 128 << 10), &out, &hit).ok());
  EXPECT_EQ(out, big_.substr(0, 128 << 10));
  Status past;
  std::thread reader([&] { past = source_->Read(Big(0, 2 << 20, 4096 * 16), &out, &hit); });
  ASSERT_TRUE(testing::WaitFor([&] { return source_->counters().coalesced.load() == 1; }));
  fakes_.ufs->OpenStreamGate();
  reader.join();
  EXPECT_EQ(past.code(), Code::kUnavailable) << past.message();
  EXPECT_FALSE(source_->IsCached(Big(0, 0, kBlock)));
  // The next read fetches again.
  fakes_.ufs->SplitStreams(0);
  ASSERT_TRUE(source_->Read(Big(0, 0, 4096), &out, &hit).ok());
  EXPECT_EQ(out, big_.substr(0, 4096));
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
}


}  // namespace
}  // namespace granary::worker

namespace granary::worker {
namespace {

// The local socket's pipe for fetch buffers (LocalRequest.stream_pipe, worker/local_server.h),
// spoken as granary-fuse speaks it: a range of a block streamed as it lands comes in the pipe
// (in_pipe, no bytes after the answer), a small one and one on a connection without a pipe come
// inline, a pipe not drained gets nothing more, and a descriptor that is not a pipe's write end is
// refused.
class LocalServerPipeTest : public RangeFirstTest {
 protected:
  void SetUp() override {
    RangeFirstTest::SetUp();
    auto s = LocalServer::Start((dir_ / "w.sock"), source_.get());
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  int Connect() {
    auto c = ConnectUnix((dir_ / "w.sock"));
    EXPECT_TRUE(c.ok());
    return c.ok() ? *c : -1;
  }
  // Sends stream_pipe with `fd`; the answer's status.
  Status GivePipe(int conn, int fd) {
    rpc::LocalRequest lr;
    lr.set_stream_pipe(true);
    EXPECT_TRUE(SendFrame(conn, lr, fd).ok());
    rpc::LocalResponse resp;
    int stray = -1;
    EXPECT_TRUE(RecvFrame(conn, &resp, &stray).ok());
    return rpc::StatusOf(resp);
  }
  // A connection that gave the worker the write end of a 1 MiB pipe; its read end in *read_end.
  // -1 (and a failure) when any step failed.
  int ConnectWithPipe(int* read_end) {
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return ADD_FAILURE() << "pipe2", -1;
    EXPECT_GT(fcntl(p[1], F_SETPIPE_SZ, 1 << 20), 0);
    const int conn = Connect();
    Status given = GivePipe(conn, p[1]);
    EXPECT_TRUE(given.ok()) << given.ToString();
    close(p[1]);
    *read_end = p[0];
    return given.ok() ? conn : -1;
  }
  rpc::LocalResponse ReadBig(int conn, uint64_t index, uint64_t offset, uint64_t length) {
    rpc::LocalRequest lr;
    const BlockRequest b = Big(index, offset, length);
    rpc::ReadBlockRequest* r = lr.mutable_read();
    r->set_mount_id(b.mount_id);
    r->set_ufs_path(b.ufs_path);
    r->set_version(b.version);
    r->set_file_size(b.file_size);
    r->set_block_size(b.block_size);
    r->set_index(b.index);
    r->set_offset(b.offset);
    r->set_length(b.length);
    r->set_continues(offset != 0);
    EXPECT_TRUE(SendFrame(conn, lr).ok());
    rpc::LocalResponse resp;
    int fd = -1;
    EXPECT_TRUE(RecvFrame(conn, &resp, &fd).ok());
    if (fd >= 0) close(fd);
    return resp;
  }
  std::unique_ptr<LocalServer> server_;
};

TEST_F(LocalServerPipeTest, AStreamedRangeComesInThePipeWhenTheClientGaveOne) {
  fakes_.ufs->SplitStreams(2 << 20);  // 2 MiB lands, then the fetch waits: every read below streams
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  ASSERT_GT(fcntl(p[1], F_SETPIPE_SZ, 1 << 20), 0);
  const int conn = Connect();
  // The read end is not a pipe's write end: refused, and the connection goes on without a pipe.
  EXPECT_EQ(GivePipe(conn, p[0]).code(), Code::kInvalidArgument);
  ASSERT_TRUE(GivePipe(conn, p[1]).ok());
  close(p[1]);

  rpc::LocalResponse r = ReadBig(conn, 0, 0, 256 << 10);
  ASSERT_EQ(r.code(), 0) << r.message();
  EXPECT_TRUE(r.in_pipe());
  EXPECT_TRUE(r.data().empty());
  ASSERT_EQ(r.length(), 256u << 10);
  std::string got(r.length(), '\0');
  for (size_t done = 0; done < got.size();) {
    ssize_t n = read(p[0], got.data() + done, got.size() - done);
    ASSERT_GT(n, 0);
    done += static_cast<size_t>(n);
  }
  EXPECT_TRUE(got == big_.substr(0, 256 << 10));

  // Small: inline, as before.
  r = ReadBig(conn, 0, 256 << 10, 4096);
  EXPECT_FALSE(r.in_pipe());
  EXPECT_TRUE(r.data() == big_.substr(256 << 10, 4096));

  // Into the pipe again, then a request without draining it: the worker puts nothing more there.
  r = ReadBig(conn, 0, 260 << 10, 128 << 10);
  ASSERT_TRUE(r.in_pipe());
  r = ReadBig(conn, 0, 388 << 10, 128 << 10);
  EXPECT_FALSE(r.in_pipe()) << "the pipe still held the last range";
  EXPECT_TRUE(r.data() == big_.substr(388 << 10, 128 << 10));
  int queued = 0;
  ASSERT_EQ(ioctl(p[0], FIONREAD, &queued), 0);
  EXPECT_EQ(queued, 128 << 10);
  std::string last(128 << 10, '\0');
  ASSERT_EQ(read(p[0], last.data(), last.size()), static_cast<ssize_t>(last.size()));
  EXPECT_TRUE(last == big_.substr(260 << 10, 128 << 10));

  // A connection that gave no pipe gets the bytes inline.
  const int plain = Connect();
  r = ReadBig(plain, 0, 512 << 10, 256 << 10);
  EXPECT_FALSE(r.in_pipe());
  EXPECT_TRUE(r.data() == big_.substr(512 << 10, 256 << 10));
  fakes_.ufs->OpenStreamGate();
  close(plain);
  close(conn);
  close(p[0]);
}

// A client that closed its pipe's read end: the worker's vmsplice fails (EPIPE, no signal), the
// bytes come inline, and the connection goes on.
TEST_F(LocalServerPipeTest, APipeWhoseReaderIsGoneGetsNothingAndTheBytesComeInline) {
  fakes_.ufs->SplitStreams(2 << 20);
  int read_end = -1;
  const int conn = ConnectWithPipe(&read_end);
  ASSERT_GE(conn, 0);
  close(read_end);
  for (uint64_t off : {uint64_t{0}, uint64_t{256} << 10}) {
    rpc::LocalResponse r = ReadBig(conn, 0, off, 256 << 10);
    ASSERT_EQ(r.code(), 0) << r.message();
    EXPECT_FALSE(r.in_pipe());
    EXPECT_TRUE(r.data() == big_.substr(off, 256 << 10));
  }
  fakes_.ufs->OpenStreamGate();
  close(conn);
}

// The buffer whose bytes went into a pipe is let go once the pipe is drained, even when the
// client sends nothing more on that connection (an idle one must not pin a block's buffer).
TEST_F(LocalServerPipeTest, ADrainedPipeLetsItsBufferGoOnAnIdleConnection) {
  block_buffers::Clear();
  int read_end = -1;
  const int conn = ConnectWithPipe(&read_end);
  ASSERT_GE(conn, 0);
  fakes_.ufs->SplitStreams(1 << 20);
  rpc::LocalResponse r = ReadBig(conn, 0, 0, 256 << 10);
  ASSERT_TRUE(r.in_pipe());
  fakes_.ufs->OpenStreamGate();
  ASSERT_TRUE(testing::WaitFor([&] { return source_->IsCached(Big(0, 0, kBlock)); }));
  EXPECT_EQ(block_buffers::Kept(), 0u) << "the pipe still holds the buffer's pages";
  std::string got(256 << 10, '\0');
  ASSERT_EQ(read(read_end, got.data(), got.size()), static_cast<ssize_t>(got.size()));
  EXPECT_TRUE(got == big_.substr(0, 256 << 10));
  ASSERT_TRUE(testing::WaitFor([&] { return block_buffers::Kept() >= kBlock; }))
      << "the drained pipe's buffer was never given back";
  close(conn);
  close(read_end);
}

}  // namespace
}  // namespace granary::worker
