#include "worker/block_store.h"
#include "worker/store/block_file.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "tests/testutil/testutil.h"

namespace granary::worker {
namespace {

// Block `index` of `file`, whose blocks are all `len` bytes long (it starts at index x len).
BlockMeta Meta(const std::string& file, uint64_t index, uint64_t len) {
  return BlockMeta{BlockId{MakeFileKey("file:///d", file, "v1"), index}, 1, len, index * len};
}

// Found by tests/fuzz/key_path_fuzz.cc: "<key>-06.m" parsed as block 6's sidecar beside "<key>-6.m".
// Only the names the store makes are its own.
TEST(BlockFile, OnlyCanonicalNamesParse) {
  const FileKey key = MakeFileKey("s3://b", "a/b", "v");
  const std::string hex = FileKeyHex(key);
  FileKey k{};
  uint64_t index = 0;
  bool sidecar = false;
  ASSERT_TRUE(store::ParseName(hex + "-6.m", &k, &index, &sidecar));
  EXPECT_TRUE(sidecar);
  EXPECT_EQ(index, 6u);
  EXPECT_EQ(k, key);
  EXPECT_TRUE(store::ParseName(hex + "-0.m", &k, &index, &sidecar));
  EXPECT_EQ(index, 0u);
  EXPECT_FALSE(store::ParseName(hex + "-06.m", &k, &index, &sidecar));
  EXPECT_FALSE(store::ParseName(hex + "-00.m", &k, &index, &sidecar));
  EXPECT_FALSE(store::ParseName(hex + "-+6.m", &k, &index, &sidecar));
  std::string upper = hex;
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  if (upper != hex) {
    EXPECT_FALSE(store::ParseName(upper, &k, &index, &sidecar));
  }
  EXPECT_TRUE(store::ParseName(hex, &k, &index, &sidecar));
  EXPECT_FALSE(sidecar);
}

// Large blocks go to the cache medium around the page cache (O_DIRECT), their unaligned tail and
// unaligned buffers through it; the bytes read back are the bytes written either way, beside
// another block written through the page cache, on the disk's file system and on tmpfs (which may
// refuse O_DIRECT: then all of it is buffered).
TEST(BlockFile, LargeBlocksAreWrittenAroundThePageCache) {
  constexpr size_t kBlock = 4 << 20;
  constexpr size_t kLen = kBlock + 1000;  // a last block: 4 MiB and a tail
  std::unique_ptr<char, decltype(&std::free)> buf(static_cast<char*>(std::aligned_alloc(4096, kLen + 4096)), &std::free);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < kLen; ++i) buf.get()[i] = static_cast<char>(rng());
  const std::string first(kBlock, 'a');
  for (const std::string& base : {std::string(), std::string("/dev/shm")}) {
    SCOPED_TRACE(base.empty() ? "the test directory" : base);
    std::unique_ptr<testing::TempDir> dir = base.empty() ? std::make_unique<testing::TempDir>()
                                                         : std::make_unique<testing::TempDir>(base);
    struct statfs fs {};
    ASSERT_EQ(statfs(dir->path().c_str(), &fs), 0);
    const bool tmpfs = fs.f_type == TMPFS_MAGIC;
    const std::string path = *dir / "data";
    ASSERT_TRUE(store::WriteData(path, 0, first, /*direct=*/false).ok());  // block 0, buffered
    ASSERT_TRUE(store::WriteData(path, kBlock, std::string_view(buf.get(), kLen), /*direct=*/true).ok());
    // An unaligned buffer is written through the page cache.
    const std::string odd_path = *dir / "odd";
    ASSERT_TRUE(store::WriteData(odd_path, 0, std::string_view(buf.get() + 1, kBlock), /*direct=*/true).ok());
    auto resident = [](const std::string& p, size_t off, size_t len) {
      int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
      struct stat st {};
      fstat(fd, &st);
      void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
      close(fd);
      std::vector<unsigned char> vec((static_cast<size_t>(st.st_size) + 4095) / 4096);
      mincore(m, static_cast<size_t>(st.st_size), vec.data());
      munmap(m, static_cast<size_t>(st.st_size));
      size_t n = 0;
      for (size_t pg = off / 4096; pg < (off + len + 4095) / 4096; ++pg) n += vec[pg] & 1;
      return n;
    };
    if (!tmpfs) {
      EXPECT_EQ(resident(path, kBlock, kBlock), 0u) << "the aligned part went through the page cache";
      EXPECT_EQ(resident(path, 2 * kBlock, 1000), 1u) << "the tail is written through the page cache";
      EXPECT_EQ(resident(odd_path, 0, kBlock), kBlock / 4096);
    }
    std::string back(kBlock + kLen, '\0');
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pread(fd, back.data(), back.size(), 0), static_cast<ssize_t>(back.size()));
    close(fd);
    EXPECT_EQ(back.substr(0, kBlock), first);
    EXPECT_TRUE(back.compare(kBlock, kLen, buf.get(), kLen) == 0) << "the direct block's bytes differ";
    std::string odd(kBlock, '\0');
    fd = open(odd_path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_EQ(pread(fd, odd.data(), odd.size(), 0), static_cast<ssize_t>(odd.size()));
    close(fd);
    EXPECT_TRUE(odd.compare(0, kBlock, buf.get() + 1, kBlock) == 0);
  }
}

// A free must not be undone by bytes already on their way when it ran (cluster_test once found a
// block of a freed dataset cached again: a load batch finished fetching it after the free). A Put
// with a ticket taken before a free that covers its block caches nothing; frees of other files or
// mounts, and frees before the ticket, do not count; the frees are remembered past many others.
TEST(BlockStore, AFreeWinsOverBytesThatWereOnTheirWay) {
  testing::TempDir dir;
  auto opened = BlockStore::Open(dir / "cache", 1 << 30);
  ASSERT_TRUE(opened.ok());
  BlockStore* store = opened->get();
  const std::string data = testing::RandomBytes(70000, 3);
  const BlockMeta a = Meta("a", 0, data.size()), b = Meta("b", 0, data.size());

  uint64_t ticket = store->FreeTicket();
  EXPECT_EQ(store->Free({a.id.key}), 0u);  // nothing cached yet: the free still counts
  EXPECT_TRUE(store->FreedSince(ticket, a));
  EXPECT_FALSE(store->FreedSince(ticket, b));
  EXPECT_EQ(store->Put(a, data, ticket).code(), Code::kAborted);
  EXPECT_FALSE(store->Contains(a.id)) << "a freed block came back";
  EXPECT_TRUE(store->Put(b, data, ticket).ok()) << "a free of another file kept this one out";
  EXPECT_TRUE(store->Contains(b.id));
  // Taken after the free: cached.
  EXPECT_TRUE(store->Put(a, data, store->FreeTicket()).ok());
  EXPECT_TRUE(store->Contains(a.id));
  // A mount's free covers its blocks, not another mount's.
  BlockMeta other = Meta("c", 0, data.size());
  other.mount_id = 2;
  ticket = store->FreeTicket();
  EXPECT_EQ(store->FreeMount(1), 2u);
  EXPECT_TRUE(store->Put(other, data, ticket).ok());
  EXPECT_EQ(store->Put(b, data, ticket).code(), Code::kAborted);
  EXPECT_FALSE(store->Contains(b.id));
  // A ticket older than every remembered free counts as freed; one after them does not.
  ticket = store->FreeTicket();
  for (int i = 0; i < 300; ++i) store->Free({Meta("x" + std::to_string(i), 0, 1).id.key});
  EXPECT_TRUE(store->FreedSince(ticket, b)) << "a ticket behind forgotten frees passed";
  EXPECT_EQ(store->Put(b, data, ticket).code(), Code::kAborted);
  EXPECT_TRUE(store->Put(b, data).ok()) << "no ticket: only the frees during the Put count";
  EXPECT_TRUE(store->Contains(b.id));
}

// A Put writes its sidecar at the block's own name before the index takes the block; a free
// that came meanwhile wins. A free at a random moment of each Put (before it, during its write, or
// after it): afterwards no sidecar of the block is left on disk, and a restarted store finds
// nothing, nothing corrupt.
TEST(BlockStore, APutThatAFreeOvertookLeavesNoSidecarBehind) {
  testing::TempDir dir;
  const std::string data = testing::RandomBytes(3 << 20, 11);  // a write that takes a while
  std::mt19937_64 rng(5);
  int overtaken = 0, done_first = 0;
  {
    auto store = std::move(BlockStore::Open(dir / "cache", 1ull << 32).value());
    for (int round = 0; round < 60; ++round) {
      const BlockMeta m = Meta("race" + std::to_string(round), 0, data.size());
      const uint64_t ticket = store->FreeTicket();
      Status put;
      std::thread t([&] { put = store->Put(m, data, ticket); });
      for (uint64_t spin = rng() % 4000000; spin > 0; --spin) asm volatile("");  // a random moment
      store->Free({m.id.key});
      t.join();
      (put.code() == Code::kAborted ? overtaken : done_first)++;
      EXPECT_FALSE(store->Contains(m.id)) << "round " << round;
      EXPECT_NE(access(store::SidecarPath(dir / "cache", m.id.key, 0).c_str(), F_OK), 0)
          << "round " << round << ": a sidecar outlived its free (" << put.message() << ")";
    }
  }
  auto store = std::move(BlockStore::Open(dir / "cache", 1ull << 32).value());
  EXPECT_EQ(store->Stats().blocks, 0u);
  EXPECT_EQ(store->Stats().corrupt, 0u);
  std::printf("frees that overtook the Put: %d, that came after it: %d\n", overtaken, done_first);
}

// Issue 56: a free is final across the cluster. A model of the master and three workers: frees
// and unmounts (stamped by the master, reaching the workers one by one, in any order), load and
// fetch-ahead batches (stamped when their files were read, reaching each worker late, their bytes
// landing later still) and demand reads, interleaved at random. Whatever the order, at the end
// every cached block was fetched by something that began after the last free covering it: a batch
// stamped after it, or a read that started on its worker after the free got there.
TEST(BlockStore, NoFreeIsUndoneByAnyBatchOrReadThatBeganBeforeIt) {
  testing::TempDir dir;
  constexpr int kWorkers = 3, kFiles = 6, kMounts = 2;
  std::vector<std::unique_ptr<BlockStore>> workers;
  for (int w = 0; w < kWorkers; ++w) {
    auto opened = BlockStore::Open(dir / ("w" + std::to_string(w)), 1 << 30);
    ASSERT_TRUE(opened.ok());
    workers.push_back(std::move(opened).value());
  }
  const std::string data(4096, 'x');
  auto meta = [&](uint64_t mount, int file) {
    BlockMeta m = Meta("m" + std::to_string(mount) + "/f" + std::to_string(file), 0, data.size());
    m.mount_id = mount;
    return m;
  };
  std::mt19937_64 rng(56);
  uint64_t stamp = 1000;                    // the master's free stamp
  std::vector<uint64_t> mount_of(kMounts);  // each dataset's current mount id (a remount: a new one)
  for (int m = 0; m < kMounts; ++m) mount_of[m] = m + 1;
  uint64_t next_mount = kMounts + 1;
  // The latest stamp of a free that covered each block (by mount id and file), as the master sent it.
  std::map<std::pair<uint64_t, int>, uint64_t> freed_at;
  // What each worker has applied: the stamp of its latest free covering the block.
  std::vector<std::map<std::pair<uint64_t, int>, uint64_t>> applied(kWorkers);
  // Who cached each block on each worker: the begin stamp of the fetch that did.
  std::vector<std::map<std::pair<uint64_t, int>, uint64_t>> cached_by(kWorkers);
  struct Event {
    uint64_t at;
    std::function<void()> run;
  };
  std::vector<Event> events;  // kept sorted by `at` as they are added
  uint64_t now = 0;
  auto later = [&](uint64_t delay, std::function<void()> fn) { events.push_back({now + delay, std::move(fn)}); };
  int batch_puts = 0;  // blocks a batch cached (the mechanism must not refuse them all)
  auto put = [&](int w, uint64_t mount, int file, uint64_t ticket, uint64_t began, bool batch) {
    // Only a Put that caches the block counts as who cached it (a Put of a block cached already
    // answers OK too, and must not hide who did).
    const bool had = workers[w]->Contains(meta(mount, file).id);
    Status st = workers[w]->Put(meta(mount, file), data, ticket);
    if (st.ok() && !had) {
      cached_by[w][{mount, file}] = began;
      batch_puts += batch;
    }
    if (st.ok() || st.code() == Code::kAborted) return;
    ADD_FAILURE() << st.ToString();
  };
  for (int step = 0; step < 3000; ++step) {
    now = step;
    // Due events first, in the order they fell due.
    std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.at < b.at; });
    while (!events.empty() && events.front().at <= now) {
      auto fn = std::move(events.front().run);
      events.erase(events.begin());
      fn();
    }
    const int m = static_cast<int>(rng() % kMounts), file = static_cast<int>(rng() % kFiles);
    const uint64_t mount = mount_of[m];
    switch (rng() % 5) {
      case 0: {  // granary free of one file: stamped, sent to every worker in turn
        const uint64_t s = ++stamp;
        freed_at[{mount, file}] = s;
        for (int w = 0; w < kWorkers; ++w) {
          later(rng() % 40, [&, w, s, mount, file] {
            workers[w]->Free({meta(mount, file).id.key}, s);
            auto& a = applied[w][{mount, file}];
            a = std::max(a, s);
          });
        }
        break;
      }
      case 1: {  // an unmount (its jobs cancelled; in-flight batches keep going) and a remount
        if (rng() % 8 != 0) break;
        const uint64_t s = ++stamp;
        for (int f = 0; f < kFiles; ++f) freed_at[{mount, f}] = s;
        mount_of[m] = next_mount++;
        for (int w = 0; w < kWorkers; ++w) {
          later(rng() % 40, [&, w, s, mount] {
            workers[w]->FreeMount(mount, s);
            for (int f = 0; f < kFiles; ++f) applied[w][{mount, f}] = std::max(applied[w][{mount, f}], s);
          });
        }
        break;
      }
      case 2:
      case 3: {  // a load or fetch-ahead batch: stamped now, arriving late, its bytes later still
        const uint64_t s = stamp;
        for (int w = 0; w < kWorkers; ++w) {
          later(rng() % 40, [&, w, s, mount, file] {
            const uint64_t ticket = workers[w]->FreeTicketAt(s);
            later(rng() % 40, [&, w, s, mount, file, ticket] { put(w, mount, file, ticket, s, true); });
          });
        }
        break;
      }
      default: {  // a reader's miss on one worker: begins when its worker has applied what it has
        const int w = static_cast<int>(rng() % kWorkers);
        const uint64_t ticket = workers[w]->FreeTicket();
        const uint64_t began = applied[w].count({mount, file}) ? applied[w][{mount, file}] : 0;
        later(rng() % 40, [&, w, mount, file, ticket, began] { put(w, mount, file, ticket, began, false); });
      }
    }
  }
  now = ~uint64_t{0} / 2;
  std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.at < b.at; });
  while (!events.empty()) {
    auto fn = std::move(events.front().run);
    events.erase(events.begin());
    fn();
  }
  int checked = 0;
  for (int w = 0; w < kWorkers; ++w) {
    for (const auto& [block, s] : freed_at) {
      if (!workers[w]->Contains(meta(block.first, block.second).id)) continue;
      ++checked;
      ASSERT_TRUE(cached_by[w].count(block));
      EXPECT_GE(cached_by[w][block], s) << "worker " << w << " keeps block " << block.first << "/" << block.second
                                        << " freed at stamp " << s << ", fetched by something that began at "
                                        << cached_by[w][block];
    }
  }
  EXPECT_GT(checked, 0) << "the model never re-cached a freed block: it checks nothing";
  EXPECT_GT(batch_puts, 100) << "batches cached (almost) nothing: a stamp refuses more than the frees after it";
}

// A worker process that just started remembers no free: load batches the master stamped before
// its first registration cache nothing (a free of theirs may have come before it ran); later ones do.
TEST(BlockStore, ARestartedWorkerKeepsNothingOfBatchesOlderThanItsRegistration) {
  testing::TempDir dir;
  auto opened = BlockStore::Open(dir / "cache", 1 << 30);
  ASSERT_TRUE(opened.ok());
  BlockStore* store = opened->get();
  const std::string data(4096, 'y');
  store->SetFreeFloor(100);
  store->SetFreeFloor(500);  // only the first registration counts
  EXPECT_EQ(store->Put(Meta("old", 0, data.size()), data, store->FreeTicketAt(99)).code(), Code::kAborted);
  EXPECT_TRUE(store->Put(Meta("new", 0, data.size()), data, store->FreeTicketAt(100)).ok());
  EXPECT_TRUE(store->Put(Meta("later", 0, data.size()), data, store->FreeTicketAt(400)).ok());
  EXPECT_TRUE(store->Put(Meta("read", 0, data.size()), data, store->FreeTicket()).ok()) << "a reader's miss";
  // A free stamped 200 here: batches from before it keep out what it covers, and only that.
  store->Free({Meta("x", 0, 1).id.key}, 200);
  EXPECT_EQ(store->Put(Meta("x", 0, data.size()), data, store->FreeTicketAt(150)).code(), Code::kAborted);
  EXPECT_TRUE(store->Put(Meta("y", 0, data.size()), data, store->FreeTicketAt(150)).ok());
  EXPECT_TRUE(store->Put(Meta("x", 0, data.size()), data, store->FreeTicketAt(200)).ok());
}

// A hint that waited in granary-fuse's queue is taken as asked when it was queued: a free that ran
// here after that keeps its block out, whenever the hint arrives (issue 53: a readahead of the
// last epoch brought a freed block back); one asked after the free caches. A hint asked before
// this process registered counts as freed.
TEST(BlockStore, AHintAskedBeforeAFreeCachesNothingItCovers) {
  testing::TempDir dir;
  auto opened = BlockStore::Open(dir / "cache", 1 << 30);
  ASSERT_TRUE(opened.ok());
  BlockStore* store = opened->get();
  const std::string data(4096, 'h');
  const auto before_start = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  store->SetFreeFloor(10);
  const auto asked = std::chrono::steady_clock::now();  // after the registration, before the free
  EXPECT_TRUE(store->Put(Meta("y", 0, data.size()), data, store->FreeTicketAsOf(asked)).ok()) << "no free since";
  store->Free({Meta("x", 0, 1).id.key}, 20);
  const auto after = std::chrono::steady_clock::now() + std::chrono::milliseconds(1);
  EXPECT_EQ(store->Put(Meta("x", 0, data.size()), data, store->FreeTicketAsOf(asked)).code(), Code::kAborted);
  EXPECT_FALSE(store->Contains(Meta("x", 0, data.size()).id)) << "a freed block came back";
  EXPECT_TRUE(store->Put(Meta("z", 0, data.size()), data, store->FreeTicketAsOf(asked)).ok())
      << "a free of another file kept this one out";
  EXPECT_TRUE(store->Put(Meta("x", 0, data.size()), data, store->FreeTicketAsOf(after)).ok()) << "asked after the free";
  EXPECT_EQ(store->Put(Meta("w", 0, data.size()), data, store->FreeTicketAsOf(before_start)).code(), Code::kAborted)
      << "asked before this worker registered: frees it never heard of may cover it";
}

// The master's stamps went back (a master on a new database; or a forged free far ahead): at the
// next registration batches cache again, and what was under way counts as freed.
TEST(BlockStore, StampsThatWentBackAreForgottenAtTheNextRegistration) {
  testing::TempDir dir;
  auto opened = BlockStore::Open(dir / "cache", 1 << 30);
  ASSERT_TRUE(opened.ok());
  BlockStore* store = opened->get();
  const std::string data(4096, 'z');
  store->SetFreeFloor(10);
  store->Free({Meta("x", 0, 1).id.key}, 1'000'000'000);
  EXPECT_EQ(store->KnownStamp(), 1'000'000'000u);
  const uint64_t under_way = store->FreeTicket();
  EXPECT_EQ(store->Put(Meta("x", 0, data.size()), data, store->FreeTicketAt(20)).code(), Code::kAborted);
  store->SetFreeFloor(30);  // the master now says 30
  EXPECT_EQ(store->KnownStamp(), 30u);
  EXPECT_TRUE(store->Put(Meta("x", 0, data.size()), data, store->FreeTicketAt(30)).ok()) << "a new batch";
  EXPECT_EQ(store->Put(Meta("y", 0, data.size()), data, under_way).code(), Code::kAborted)
      << "bytes fetched before the stamps were dropped";
  EXPECT_TRUE(store->Put(Meta("z", 0, data.size()), data, store->FreeTicket()).ok());
}

TEST(BlockStore, PutReadAndReopen) {
  testing::TempDir dir;
  std::string data = testing::RandomBytes(300000, 1);
  {
    auto store = BlockStore::Open(dir / "cache", 1 << 30);
    ASSERT_TRUE(store.ok());
    std::vector<BlockMeta> evicted;
    ASSERT_TRUE((*store)->Put(Meta("a", 0, data.size()), data).ok());
    std::string out(1000, '\0');
    auto n = (*store)->Read(Meta("a", 0, 0).id, 65530, 1000, out.data());
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(out, data.substr(65530, 1000));
    EXPECT_EQ((*store)->Read(Meta("b", 0, 0).id, 0, 10, out.data()).status().code(), Code::kNotFound);
  }
  auto store = BlockStore::Open(dir / "cache", 1 << 30);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Stats().blocks, 1u);
  std::string out(data.size(), '\0');
  auto n = (*store)->Read(Meta("a", 0, 0).id, 0, data.size() + 100, out.data());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, data.size());
  EXPECT_EQ(out, data);
}

TEST(BlockStore, FilesArePrivateAndNamedByHash) {
  testing::TempDir dir;
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  std::vector<BlockMeta> ev;
  ASSERT_TRUE(store->Put(Meta("secret-object-name.jpg", 0, 3), "abc").ok());
  std::string path = store->PathOf(Meta("secret-object-name.jpg", 0, 3).id);
  EXPECT_EQ(path.find("secret"), std::string::npos);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((dir / "cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(BlockStore, CorruptionIsDetectedAndTheBlockDropped) {
  testing::TempDir dir;
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  std::string data = testing::RandomBytes(200000, 2);
  std::vector<BlockMeta> ev;
  auto meta = Meta("a", 0, data.size());
  ASSERT_TRUE(store->Put(meta, data).ok());
  testing::DamageOnDisk(store->PathOf(meta.id), 150000, 0x40);  // the data file holds only data
  std::string out(100, '\0');
  // A range in an untouched chunk still verifies.
  EXPECT_TRUE(store->Read(meta.id, 0, 100, out.data()).ok());
  auto r = store->Read(meta.id, 149990, 100, out.data());
  EXPECT_EQ(r.status().code(), Code::kDataLoss);
  EXPECT_FALSE(store->Contains(meta.id));
  EXPECT_EQ(store->Stats().corrupt, 1u);
}

// A lease hands out the block file itself: the leased range is exactly the block's bytes, the
// block outlives a Free until released, and a corrupt chunk is never leased.
TEST(BlockStore, LeasesVerifyTheRangeAndHoldTheBlockUntilReleased) {
  testing::TempDir dir;
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  std::string data = testing::RandomBytes(300000, 3);
  auto meta = Meta("a", 0, data.size());
  ASSERT_TRUE(store->Put(meta, data).ok());

  auto lease = store->Lease(meta.id, 70000, 200000);
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  ASSERT_GE(lease->fd, 0);
  EXPECT_EQ(lease->length, 200000u);
  EXPECT_EQ(store->Free({meta.id.key}), 1u);
  EXPECT_FALSE(store->Contains(meta.id));  // freed for new readers...
  std::string got(lease->length, '\0');
  ASSERT_EQ(pread(lease->fd, got.data(), got.size(), static_cast<off_t>(lease->data_offset)),
            static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, data.substr(70000, 200000));  // ...but the leased file is still there
  std::string path = store->PathOf(meta.id);
  lease->Reset();
  lease->Reset();  // a second release is a no-op, not another reader's lease
  EXPECT_EQ(store->Stats().blocks, 0u);
  EXPECT_EQ(store->Stats().leases, 1u);

  // Clipped at the block's end; past it, no lease at all.
  ASSERT_TRUE(store->Put(meta, data).ok());
  auto tail = store->Lease(meta.id, 299990, 100);
  ASSERT_TRUE(tail.ok());
  EXPECT_EQ(tail->length, 10u);
  tail->Reset();
  auto past = store->Lease(meta.id, 300000, 100);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(past->fd, -1);

  // One flipped byte in the leased range: DATA_LOSS, and the block is gone.
  testing::DamageOnDisk(store->PathOf(meta.id), 200000, 0x01);
  auto clean = store->Lease(meta.id, 0, 1000);  // another chunk: still fine
  ASSERT_TRUE(clean.ok());
  clean->Reset();
  EXPECT_EQ(store->Lease(meta.id, 199000, 2000).status().code(), Code::kDataLoss);
  EXPECT_FALSE(store->Contains(meta.id));
  EXPECT_EQ(store->Lease(meta.id, 0, 10).status().code(), Code::kNotFound);
}

// Reads that go through a buffer (a range inside chunks) and straight into the caller's (whole
// chunks) give the same bytes; a lease taken unverified (a block put an instant ago) reads nothing,
// so only a verified one notices a flipped byte.
TEST(BlockStore, ReadsOfWholeAndPartChunksAndAnUnverifiedLease) {
  testing::TempDir dir;
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  std::string data = testing::RandomBytes(300000, 4);
  auto meta = Meta("b", 0, data.size());
  ASSERT_TRUE(store->Put(meta, data).ok());
  for (auto [off, len] : std::vector<std::pair<uint64_t, size_t>>{{0, 65536}, {65536, 131072}, {131072, 168928},
                                                                    {1, 10}, {65530, 100}, {200000, 100000}}) {
    std::string got(len, 'x');
    auto n = store->Read(meta.id, off, len, got.data());
    ASSERT_TRUE(n.ok()) << off;
    ASSERT_EQ(*n, len) << off;
    EXPECT_EQ(got, data.substr(off, len)) << off;
  }
  testing::DamageOnDisk(store->PathOf(meta.id), 100, 0x01);
  auto unverified = store->Lease(meta.id, 0, 1000, /*verify=*/false);
  ASSERT_TRUE(unverified.ok()) << unverified.status().message();
  EXPECT_GE(unverified->fd, 0);
  EXPECT_EQ(unverified->length, 1000u);
  unverified->Reset();
  EXPECT_EQ(store->Lease(meta.id, 0, 1000).status().code(), Code::kDataLoss);
  EXPECT_FALSE(store->Contains(meta.id));
}

// cachestat(2) counts dirty pages: a data file is "as written" only while it is exactly the length
// asked about and every page of it is dirty from a write. Flushed pages are clean: they may come
// back from the disk, so they are checked.
// Whether a file just written in the tests' temporary directory reads as written: false without
// cachestat(2) (Linux 6.5) or where $TMPDIR is tmpfs. Five tries: writeback may start at any time.
bool HaveCachestat() {
  testing::TempDir dir;
  std::string page(4096, 'p');
  for (int i = 0; i < 5; ++i) {
    int fd = open((dir / ("probe" + std::to_string(i))).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    bool dirty = fd >= 0 && pwrite(fd, page.data(), page.size(), 0) == 4096 && store::FileAsWritten(fd, 4096);
    if (fd >= 0) close(fd);
    if (dirty) return true;
  }
  return false;
}
constexpr const char* kNoCachestat =
    "no cachestat(2) here (Linux 6.5), or $TMPDIR is tmpfs: every read is checked, none is as written";

// tmpfs never writes pages back, and cachestat(2) reports none of its pages dirty: nothing on a
// MEM level is taken as written (its reads are all checked).
TEST(BlockFile, NothingOnTmpfsReadsAsWritten) {
  struct statfs fs {};
  if (statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "/dev/shm is not tmpfs here";
  testing::TempDir dir("/dev/shm");
  int fd = open((dir / "f").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  std::string data = testing::RandomBytes(110000, 11);
  ASSERT_EQ(pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  EXPECT_FALSE(store::FileAsWritten(fd, data.size()));
  close(fd);
}

TEST(BlockFile, FileAsWrittenOnlyWhileEveryPageOfTheWholeFileIsDirty) {
  if (!HaveCachestat()) GTEST_SKIP() << kNoCachestat;
  testing::TempDir dir;
  std::string data = testing::RandomBytes(300000, 9);
  // A fresh file's pages are dirty until written back, which can start at any moment (the
  // flusher, memory pressure): an attempt that lost that race is tried again on a new file.
  bool seen = false;
  for (int attempt = 0; attempt < 5 && !seen; ++attempt) {
    std::string path = dir / ("f" + std::to_string(attempt));
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(pwrite(fd, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
    seen = store::FileAsWritten(fd, data.size());
    EXPECT_FALSE(store::FileAsWritten(fd, 8192)) << "a part of the file is not the whole";
    EXPECT_FALSE(store::FileAsWritten(fd, data.size() + 1));
    EXPECT_FALSE(store::FileAsWritten(fd, 0));
    ASSERT_EQ(fdatasync(fd), 0);
    EXPECT_FALSE(store::FileAsWritten(fd, data.size())) << "written back: clean pages";
    // Dropped, then one page written again: the others are not in memory at all.
    ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ASSERT_EQ(pwrite(fd, data.data(), 4096, 8192), 4096);
    EXPECT_FALSE(store::FileAsWritten(fd, data.size()));
    // A second block appended: the first one's length is no longer the file's.
    std::string more(4096, 'm');
    ASSERT_EQ(pwrite(fd, more.data(), more.size(), 300000), 4096);
    EXPECT_FALSE(store::FileAsWritten(fd, data.size()));
    close(fd);
  }
  EXPECT_TRUE(seen) << "five freshly written files were never all dirty";
}

// A block this process put is read without checking while its pages are dirty from the Put; one
// found at start is always checked (its pages' writer is not known), as is any block after its
// pages were written back; a byte damaged on the disk is found either way.
TEST(BlockStore, OnlyABlocksOwnDirtyPagesGoUnchecked) {
  if (!HaveCachestat()) GTEST_SKIP() << kNoCachestat;
  testing::TempDir dir;
  std::string data = testing::RandomBytes(110000, 10);  // an image: one block, under the O_DIRECT size
  auto meta = Meta("img", 0, data.size());
  std::string out(data.size(), '\0');
  uint64_t as_written = 0;
  for (int attempt = 0; attempt < 5 && as_written == 0; ++attempt) {  // writeback may start at any time
    auto store = std::move(BlockStore::Open(dir / ("c" + std::to_string(attempt)), 1 << 30).value());
    ASSERT_TRUE(store->Put(meta, data).ok());
    ASSERT_TRUE(store->Read(meta.id, 0, out.size(), out.data()).ok());
    EXPECT_EQ(out, data);
    auto lease = store->Lease(meta.id, 0, data.size());
    ASSERT_TRUE(lease.ok());
    lease->Reset();
    as_written = store->Stats().reads_as_written;
  }
  EXPECT_GE(as_written, 1u) << "no read of a block just put went unchecked";

  // Found at start: its pages are still dirty here, but a plain write into them is caught.
  std::string cache = dir / "c-reopened";
  {
    auto store = std::move(BlockStore::Open(cache, 1 << 30).value());
    ASSERT_TRUE(store->Put(meta, data).ok());
  }
  auto store = std::move(BlockStore::Open(cache, 1 << 30).value());
  {
    std::fstream f(store->PathOf(meta.id), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5000);
    f.put(static_cast<char>(data[5000] ^ 0x01));
  }
  EXPECT_EQ(store->Read(meta.id, 4990, 20, out.data()).status().code(), Code::kDataLoss);
  EXPECT_EQ(store->Stats().reads_as_written, 0u);
  EXPECT_FALSE(store->Contains(meta.id));

  // Put here, then damaged on the disk (written back, so clean): checked and found.
  ASSERT_TRUE(store->Put(meta, data).ok());
  testing::DamageOnDisk(store->PathOf(meta.id), 70000);
  EXPECT_EQ(store->Lease(meta.id, 69999, 2).status().code(), Code::kDataLoss);
  EXPECT_FALSE(store->Contains(meta.id));
}

// StoreOptions::trust_own_writes: a block this process put within it is leased without a check —
// a large block too, written around the page cache and read back from the disk. A copy (what peers
// and re-puts store), a whole-file lease and a block found at start are checked all the same, and
// with no window the lease is too.
TEST(BlockStore, ALeaseWithinTrustOwnWritesGoesUnchecked) {
  testing::TempDir dir;
  std::string data = testing::RandomBytes(4 << 20, 11);  // a 4 MiB block: written with O_DIRECT
  auto meta = Meta("shard", 0, data.size());
  auto open = [&](std::chrono::milliseconds trust) {
    StoreOptions o;
    TierLevel l;
    l.medium = "SSD";
    l.paths = {dir / "c"};
    l.quotas = {1ull << 30};
    l.high = l.low = 1.0;
    o.levels = {l};
    o.background = false;
    o.trust_own_writes = trust;
    return std::move(BlockStore::Open(o).value());
  };
  {
    auto store = open(std::chrono::hours(1));
    ASSERT_TRUE(store->Put(meta, data).ok());
    // Damaged as a failing disk does (written and flushed): within the window the lease reads nothing.
    testing::DamageOnDisk(store->PathOf(meta.id), 3 << 20);
    auto lease = store->Lease(meta.id, 3 << 20, 1 << 20);
    ASSERT_TRUE(lease.ok()) << lease.status().message();
    EXPECT_GE(lease->fd, 0);
    lease->Reset();
    EXPECT_EQ(store->Stats().reads_as_written, 1u);
    std::string out(16, '\0');
    EXPECT_EQ(store->Read(meta.id, 3 << 20, out.size(), out.data()).status().code(), Code::kDataLoss)
        << "a copy is checked: a peer would store it with sums of its own";
    EXPECT_FALSE(store->Contains(meta.id));

    ASSERT_TRUE(store->Put(meta, data).ok());
    testing::DamageOnDisk(store->PathOf(meta.id), 100);
    EXPECT_EQ(store->LeaseFile(meta.id.key, 1, data.size(), /*verify=*/true).status().code(), Code::kDataLoss)
        << "a read lease is checked when granted: it is served for its whole life";
    EXPECT_FALSE(store->Contains(meta.id));
    ASSERT_TRUE(store->Put(meta, data).ok());
    testing::DamageOnDisk(store->PathOf(meta.id), 200);
  }
  // The same cache opened again: the block is found at start, so its writer's trust is gone.
  {
    auto store = open(std::chrono::hours(1));
    EXPECT_EQ(store->Lease(meta.id, 0, 1 << 20).status().code(), Code::kDataLoss);
    EXPECT_FALSE(store->Contains(meta.id));
    EXPECT_EQ(store->Stats().reads_as_written, 0u);
  }
  // No window: a block put and damaged is found by its first lease.
  auto strict = open(std::chrono::milliseconds(0));
  ASSERT_TRUE(strict->Put(meta, data).ok());
  testing::DamageOnDisk(strict->PathOf(meta.id), 100);
  EXPECT_EQ(strict->Lease(meta.id, 0, 1 << 20).status().code(), Code::kDataLoss);
  EXPECT_FALSE(strict->Contains(meta.id));
}

TEST(BlockStore, BadFilesAreDiscardedOnOpen) {
  testing::TempDir dir;
  // One block per way of being broken, and one good block; each its own file.
  struct Paths {
    std::string data, sidecar;
  };
  std::map<std::string, Paths> p;
  {
    auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
    for (const char* name : {"torn_data", "torn_sidecar", "no_sidecar", "no_data", "bad_sum", "good"}) {
      ASSERT_TRUE(store->Put(Meta(name, 0, 5000), std::string(5000, name[0])).ok());
      p[name] = Paths{store->PathOf(Meta(name, 0, 0).id), store->SidecarPathOf(Meta(name, 0, 0).id)};
    }
  }
  truncate(p["torn_data"].data.c_str(), 4200);       // torn data write
  truncate(p["torn_sidecar"].sidecar.c_str(), 40);   // a crash while the sidecar was written
  unlink(p["no_sidecar"].sidecar.c_str());           // a crash before the sidecar was written
  unlink(p["no_data"].data.c_str());                 // (cannot happen by our order; still handled)
  {
    std::fstream f(p["bad_sum"].sidecar, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(72);  // the first chunk checksum
    f.put('\x01');
  }
  testing::WriteFile(dir / "cache/tmp/half-written", "x");  // crash leftover
  testing::WriteFile(dir / "cache/blocks/zz/not-a-block", "junk");
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  EXPECT_EQ(store->Stats().blocks, 1u);
  EXPECT_TRUE(store->Contains(Meta("good", 0, 0).id));
  EXPECT_EQ(store->Stats().used, BlockFileBytes(5000)) << "debris is not counted";
  // Damage: the torn data file, the missing one, the bad checksum. A sidecar cut short is an
  // interrupted write (its block never was), not damage to report.
  EXPECT_EQ(store->Stats().corrupt, 3u);
  for (const auto& [name, paths] : p) {
    if (name == "good") continue;
    EXPECT_NE(access(paths.data.c_str(), F_OK), 0) << name;
    EXPECT_NE(access(paths.sidecar.c_str(), F_OK), 0) << name;
  }
  EXPECT_NE(access((dir / "cache/tmp/half-written").c_str(), F_OK), 0) << "crash leftovers must be removed";
  EXPECT_NE(access((dir / "cache/blocks/zz/not-a-block").c_str(), F_OK), 0);
  EXPECT_EQ(access(p["good"].data.c_str(), F_OK), 0);
  std::string out(5000, '\0');
  ASSERT_TRUE(store->Read(Meta("good", 0, 0).id, 0, 5000, out.data()).ok());
  EXPECT_EQ(out, std::string(5000, 'g'));
}

// A file's blocks share one data file, each at its offset in the file, so the data file of a
// wholly cached file is a copy of it (what the kernel reads in passthrough); sidecars carry each
// block's identity and checksums.
TEST(BlockStore, AFilesBlocksShareADataFileAtTheirOffsets) {
  testing::TempDir dir;
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  const uint64_t bs = 100000;
  std::string file = testing::RandomBytes(250000, 5);
  for (uint64_t i = 0; i < 3; ++i) {
    uint64_t len = std::min<uint64_t>(bs, file.size() - i * bs);
    BlockMeta m{BlockId{MakeFileKey("file:///d", "big", "v1"), i}, 1, len, i * bs};
    ASSERT_TRUE(store->Put(m, std::string_view(file).substr(i * bs, len)).ok());
  }
  FileKey key = MakeFileKey("file:///d", "big", "v1");
  std::string path = store->PathOf(BlockId{key, 0});
  EXPECT_EQ(store->PathOf(BlockId{key, 2}), path);
  EXPECT_EQ(testing::ReadFile(path), file);
  struct stat st;
  ASSERT_EQ(stat(store->SidecarPathOf(BlockId{key, 1}).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(store->Stats().used, BlockFileBytes(100000) * 2 + BlockFileBytes(50000));
  // A read of block 1 is verified against its sidecar and returns its bytes.
  std::string out(1000, '\0');
  ASSERT_TRUE(store->Read(BlockId{key, 1}, 500, 1000, out.data()).ok());
  EXPECT_EQ(out, file.substr(100500, 1000));
  // A zero-copy lease points into the shared file at the block's offset.
  auto zc = store->Lease(BlockId{key, 2}, 10, 100);
  ASSERT_TRUE(zc.ok());
  EXPECT_EQ(zc->data_offset, 200010u);
  zc->Reset();

  // LeaseFile: the whole data file, unread, every block held against Free until the lease ends.
  auto lease = store->LeaseFile(key, 3, file.size());
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  EXPECT_EQ(lease->length, file.size());
  EXPECT_EQ(store->Free({key}), 3u);
  EXPECT_EQ(access(path.c_str(), F_OK), 0) << "a leased file must stay until its lease ends";
  std::string got(file.size(), '\0');
  ASSERT_EQ(pread(lease->fd, got.data(), got.size(), 0), static_cast<ssize_t>(got.size()));
  EXPECT_EQ(got, file);
  lease->Reset();
  EXPECT_NE(access(path.c_str(), F_OK), 0) << "the data file goes with its last block";
  EXPECT_EQ(store->LeaseFile(key, 3, file.size()).status().code(), Code::kNotFound);

  // A file with a block missing is no data file to lease; its other blocks still read.
  for (uint64_t i = 0; i < 3; ++i) {
    uint64_t len = std::min<uint64_t>(bs, file.size() - i * bs);
    BlockMeta m{BlockId{key, i}, 1, len, i * bs};
    ASSERT_TRUE(store->Put(m, std::string_view(file).substr(i * bs, len)).ok());
  }
  ASSERT_TRUE(store->LeaseFile(key, 3, file.size()).ok());  // (and the lease ends at once)
  std::string middle = store->SidecarPathOf(BlockId{key, 1});
  store = nullptr;
  unlink(middle.c_str());  // as if block 1 had been evicted when the worker stopped
  store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  EXPECT_EQ(store->Stats().blocks, 2u);
  EXPECT_EQ(store->LeaseFile(key, 3, file.size()).status().code(), Code::kNotFound);
  ASSERT_TRUE(store->Read(BlockId{key, 2}, 0, 1000, out.data()).ok());
  EXPECT_EQ(out, file.substr(200000, 1000));
  EXPECT_EQ(store->Free({key}), 2u);
  EXPECT_NE(access(path.c_str(), F_OK), 0);
}

// The kernel may hold a data file as a passthrough backing file with no lease left (a
// granary-fuse successor before its re-lease, a worker restarted under a mount): a file whose
// blocks all go is unlinked as it is, never punched, so whoever holds it reads its bytes, not
// zeros. A block that leaves while others stay is punched out (its space comes back).
TEST(BlockStore, ADataFileHeldPastItsLeaseKeepsItsBytesWhenItsBlocksGo) {
  testing::TempDir dir;
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  auto read_all = [](int fd, size_t n) {
    std::string got(n, '\0');
    EXPECT_EQ(pread(fd, got.data(), n, 0), static_cast<ssize_t>(n));
    return got;
  };
  // One block, evicted by a free with no reader left.
  std::string small = testing::RandomBytes(110000, 7);
  FileKey skey = MakeFileKey("file:///d", "small", "v1");
  ASSERT_TRUE(store->Put(BlockMeta{BlockId{skey, 0}, 1, small.size(), 0}, small).ok());
  auto lease = store->LeaseFile(skey, 1, small.size());
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  int held = dup(lease->fd);  // as the kernel's backing file
  lease->Reset();
  EXPECT_EQ(store->Free({skey}), 1u);
  EXPECT_FALSE(store->Contains(BlockId{skey, 0}));
  EXPECT_EQ(read_all(held, small.size()), small) << "a data file's last block must not be punched";
  close(held);

  // Three blocks freed while leased: they leave one by one as the lease ends, none punched.
  const uint64_t bs = 100000;
  std::string big = testing::RandomBytes(250000, 8);
  FileKey bkey = MakeFileKey("file:///d", "big", "v1");
  auto put_big = [&] {
    for (uint64_t i = 0; i < 3; ++i) {
      uint64_t len = std::min<uint64_t>(bs, big.size() - i * bs);
      ASSERT_TRUE(store->Put(BlockMeta{BlockId{bkey, i}, 1, len, i * bs}, std::string_view(big).substr(i * bs, len)).ok());
    }
  };
  put_big();
  lease = store->LeaseFile(bkey, 3, big.size());
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  held = dup(lease->fd);
  EXPECT_EQ(store->Free({bkey}), 3u);
  lease->Reset();
  EXPECT_EQ(store->Stats().blocks, 0u);
  EXPECT_EQ(read_all(held, big.size()), big) << "blocks freed together must not punch each other's file";
  close(held);

  // One block of three goes (found corrupt) from a file never leased whole: its range is punched,
  // the others stay whole.
  FileKey pkey = MakeFileKey("file:///d", "parts", "v1");
  for (uint64_t i = 0; i < 3; ++i) {
    uint64_t len = std::min<uint64_t>(bs, big.size() - i * bs);
    ASSERT_TRUE(store->Put(BlockMeta{BlockId{pkey, i}, 1, len, i * bs}, std::string_view(big).substr(i * bs, len)).ok());
  }
  auto drop_middle = [&](const FileKey& key) {
    testing::DamageOnDisk(store->PathOf(BlockId{key, 0}), 150000);  // in block 1
    std::string out(10, '\0');
    EXPECT_EQ(store->Read(BlockId{key, 1}, 0, out.size(), out.data()).status().code(), Code::kDataLoss);
    EXPECT_FALSE(store->Contains(BlockId{key, 1}));
  };
  std::string path = store->PathOf(BlockId{pkey, 0});
  drop_middle(pkey);
  std::string now = testing::ReadFile(path);
  ASSERT_EQ(now.size(), big.size());
  EXPECT_EQ(now.substr(0, bs), big.substr(0, bs));
  EXPECT_EQ(now.substr(bs, bs), std::string(bs, '\0')) << "a block leaving beside others gives its space back";
  EXPECT_EQ(now.substr(2 * bs), big.substr(2 * bs));

  // The same in a file once leased whole: the kernel may still read it (a granary-fuse crash's
  // gap), so nothing of it is punched; its space comes back with its last block.
  put_big();
  lease = store->LeaseFile(bkey, 3, big.size());
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  held = dup(lease->fd);
  lease->Reset();
  drop_middle(bkey);
  std::string seen = read_all(held, big.size());
  seen[150000] = big[150000];  // the flipped byte itself
  EXPECT_EQ(seen, big) << "a file leased whole must not be punched under its holder";
  EXPECT_EQ(store->Free({bkey}), 2u);
  EXPECT_EQ(read_all(held, big.size()).substr(0, bs), big.substr(0, bs));
  close(held);

  // A file of several blocks found by a restarted worker: the kernel may hold it from before the
  // restart with no lease the new worker knows of, so nothing of it is punched either.
  FileKey rkey = MakeFileKey("file:///d", "restarted", "v1");
  for (uint64_t i = 0; i < 3; ++i) {
    uint64_t len = std::min<uint64_t>(bs, big.size() - i * bs);
    ASSERT_TRUE(store->Put(BlockMeta{BlockId{rkey, i}, 1, len, i * bs}, std::string_view(big).substr(i * bs, len)).ok());
  }
  const std::string rpath = store->PathOf(BlockId{rkey, 0});
  held = open(rpath.c_str(), O_RDONLY);
  ASSERT_GE(held, 0);
  store = nullptr;
  store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  ASSERT_TRUE(store->Contains(BlockId{rkey, 1}));
  drop_middle(rkey);
  seen = read_all(held, big.size());
  seen[150000] = big[150000];
  EXPECT_TRUE(seen == big) << "a file a restarted worker found must not be punched under its holder";
  EXPECT_EQ(store->Free({rkey}), 2u);
  EXPECT_NE(access(rpath.c_str(), F_OK), 0) << "its space comes back with its last block";
  close(held);
}

// A read lease (fuse/read_leases.h) asks LeaseFile to verify: every chunk of every block is
// checked first, and a flipped byte anywhere fails the lease and drops its block.
TEST(BlockStore, AVerifiedFileLeaseChecksEveryChunk) {
  testing::TempDir dir;
  auto store = std::move(BlockStore::Open(dir / "cache", 1 << 30).value());
  const uint64_t bs = 100000;
  std::string file = testing::RandomBytes(250000, 6);
  FileKey key = MakeFileKey("file:///d", "checked", "v1");
  for (uint64_t i = 0; i < 3; ++i) {
    uint64_t len = std::min<uint64_t>(bs, file.size() - i * bs);
    ASSERT_TRUE(store->Put(BlockMeta{BlockId{key, i}, 1, len, i * bs}, std::string_view(file).substr(i * bs, len)).ok());
  }
  ASSERT_TRUE(store->LeaseFile(key, 3, file.size(), /*verify=*/true).ok());
  testing::DamageOnDisk(store->PathOf(BlockId{key, 0}), 230000);  // in block 2
  EXPECT_TRUE(store->LeaseFile(key, 3, file.size()).ok()) << "unverified, as passthrough's";
  auto checked = store->LeaseFile(key, 3, file.size(), /*verify=*/true);
  EXPECT_EQ(checked.status().code(), Code::kDataLoss) << checked.status().message();
  EXPECT_FALSE(store->Contains(BlockId{key, 2}));
  EXPECT_TRUE(store->Contains(BlockId{key, 0}));
}

TEST(BlockStore, QuotaEvictsLeastRecentlyUsed) {
  testing::TempDir dir;
  uint64_t per = BlockFileBytes(10000);
  auto store = std::move(BlockStore::Open(dir / "cache", per * 3).value());
  std::vector<BlockMeta> ev;
  store->SetRemovedListener([&](const BlockMeta& m) { ev.push_back(m); });
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->Put(Meta("f", i, 10000), std::string(10000, 'a' + i)).ok());
  EXPECT_TRUE(ev.empty());
  char c;
  ASSERT_TRUE(store->Read(Meta("f", 0, 0).id, 0, 1, &c).ok());  // 0 is now most recent
  ASSERT_TRUE(store->Put(Meta("f", 3, 10000), std::string(10000, 'd')).ok());
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].id.index, 1u);
  EXPECT_LE(store->Stats().used, per * 3);
  EXPECT_TRUE(store->Contains(Meta("f", 0, 0).id));
  // A block larger than the whole quota is refused, not forced in.
  EXPECT_EQ(store->Put(Meta("g", 0, per * 4), std::string(per * 4, 'x')).code(), Code::kResourceExhausted);
}

TEST(BlockStore, ConcurrentPutsAndReadsStayWithinQuota) {
  testing::TempDir dir;
  uint64_t per = BlockFileBytes(4096);
  auto store = std::move(BlockStore::Open(dir / "cache", per * 8).value());
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 100; ++i) {
        auto m = Meta("f" + std::to_string(t), i % 20, 4096);
        std::string data(4096, static_cast<char>('a' + (i % 20)));
        std::vector<BlockMeta> ev;
        Status s = store->Put(m, data);
        if (!s.ok() && s.code() != Code::kResourceExhausted) bad++;
        std::string out(4096, '\0');
        auto r = store->Read(m.id, 0, 4096, out.data());
        if (r.ok() && out != data) bad++;
        if (store->Stats().used > per * 8) bad++;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace granary::worker
