// SourceReads (fuse/source_reads.h): which reads granary-fuse makes of a local under-storage's file
// itself, checked rule by rule and against a reference model; SourceFile's reads of a real file,
// and what they do when the file changes under them.
#include "fuse/source_reads.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/testutil/testutil.h"

namespace granary::fuse {
namespace {

// A SourceFile over `path` with the stat it has now, as the worker would send it.
std::shared_ptr<const SourceFile> Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << path;
  struct stat st {};
  EXPECT_EQ(fstat(fd, &st), 0);
  const int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return std::make_shared<const SourceFile>(fd, static_cast<uint64_t>(st.st_size), mtime,
                                            static_cast<uint64_t>(st.st_ino));
}

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A file no read touches, with the worker's cached blocks (`cached`: bit i of byte i / 8).
std::shared_ptr<const SourceFile> Fake(std::string cached = std::string(2, '\0')) {
  return std::make_shared<const SourceFile>(-1, 0, 0, 0, std::move(cached));
}

TEST(SourceReads, NothingIsReadHereBeforeTheWorkerSentTheFile) {
  SourceReads r;
  EXPECT_TRUE(r.Wants("f"));
  EXPECT_EQ(r.Direct("f", 0, true).file, nullptr);
  // An answer from the cache (or a block fetched and kept) reads nothing here either.
  r.FromWorker("f", 0);
  EXPECT_EQ(r.Direct("f", 0, true).file, nullptr);
  // An answer from the source without a file, not asked for: nothing to read with, nothing learnt.
  r.FromSource("f", 0, nullptr, false);
  EXPECT_EQ(r.Direct("f", 0, true).file, nullptr);
  EXPECT_EQ(r.files(), 0u);
  EXPECT_TRUE(r.Wants("f"));
  // Asked for, and none came (an object store): not asked again, and still nothing read here.
  r.FromSource("f", 0, nullptr, true);
  EXPECT_FALSE(r.Wants("f"));
  EXPECT_EQ(r.Direct("f", 0, true).file, nullptr);
  r.FromSource("f", 0, nullptr, false);
  EXPECT_EQ(r.Direct("f", 0, true).file, nullptr);
  // Forgotten (its version changed): asked again.
  r.Forget("f");
  EXPECT_TRUE(r.Wants("f"));
}

TEST(SourceReads, OnceTheFileCameRangeFirstReadsOfUncachedBlocksAreReadHere) {
  SourceReads r;
  auto f = Fake(std::string("\x04\x00", 2));  // 16 blocks known, block 2 cached by the worker
  r.FromSource("f", 3, f, true);
  EXPECT_FALSE(r.Wants("f"));
  // The answered block: kDirectReads reads here; the worker saw one touch (its answer), so the
  // first read here is reported (its second: it fills the block), the others are not.
  SourceReads::Grant g = r.Direct("f", 3, true);
  EXPECT_EQ(g.file, f);
  EXPECT_TRUE(g.touch);
  for (uint32_t i = 1; i < SourceReads::kDirectReads; ++i) {
    g = r.Direct("f", 3, true);
    EXPECT_EQ(g.file, f) << i;
    EXPECT_FALSE(g.touch) << i;
  }
  EXPECT_EQ(r.Direct("f", 3, true).file, nullptr) << "the worker is asked again: it may have filled it";
  r.FromSource("f", 3, nullptr, false);  // still not cached: kDirectReads more
  EXPECT_EQ(r.Direct("f", 3, true).file, f);
  // Another uncached block, never asked of the worker: read here, its first two reads reported.
  g = r.Direct("f", 4, true);
  EXPECT_EQ(g.file, f);
  EXPECT_TRUE(g.touch);
  EXPECT_TRUE(r.Direct("f", 4, true).touch);
  EXPECT_FALSE(r.Direct("f", 4, true).touch);
  // Not range first (a read at a block's start: a sequential reader's, which the worker keeps
  // whole; also in a block read here), a block the worker has cached, or one past what it said:
  // asked of the worker.
  EXPECT_EQ(r.Direct("f", 5, false).file, nullptr);
  EXPECT_EQ(r.Direct("f", 4, false).file, nullptr);
  EXPECT_EQ(r.Direct("f", 2, true).file, nullptr);
  EXPECT_EQ(r.Direct("f", 16, true).file, nullptr);
  // The worker answered block 4 from its cache: asked of it from now on.
  r.FromWorker("f", 4);
  EXPECT_EQ(r.Direct("f", 4, true).file, nullptr);
  // ... and block 2, evicted since, from the source: read here again.
  r.FromSource("f", 2, nullptr, false);
  EXPECT_EQ(r.Direct("f", 2, true).file, f);
  // Another version of the file is another key.
  EXPECT_TRUE(r.Wants("f2"));
  r.Forget("f");
  EXPECT_EQ(r.Direct("f", 3, true).file, nullptr);
  EXPECT_TRUE(r.Wants("f"));
}

// A worker that sends no bitmap of its cached blocks predates touch reports (it would take one for
// a readahead hint and fetch the whole block): its grants are read here, and it is told nothing.
TEST(SourceReads, AnOlderWorkerIsSentNoTouches) {
  SourceReads r;
  auto f = Fake(std::string());
  r.FromSource("f", 3, f, true);
  for (uint32_t i = 0; i < SourceReads::kDirectReads; ++i) {
    SourceReads::Grant g = r.Direct("f", 3, true);
    EXPECT_EQ(g.file, f) << i;
    EXPECT_FALSE(g.touch) << i;
  }
  EXPECT_EQ(r.Direct("f", 4, true).file, nullptr) << "without its bitmap, a block it has not answered is asked of it";
}

TEST(SourceReads, OnlyReadsTheWorkerWouldAnswerRangeFirstAreReadHere) {
  const uint64_t mib = 1024 * 1024, bs = 4 * mib;
  EXPECT_TRUE(SourceReads::IsRangeFirst(bs, bs, 4096, 4096));
  EXPECT_TRUE(SourceReads::IsRangeFirst(bs, bs, 1, mib));
  EXPECT_FALSE(SourceReads::IsRangeFirst(bs, bs, 0, 4096)) << "a block's start: a sequential reader";
  EXPECT_FALSE(SourceReads::IsRangeFirst(bs, bs, 4096, mib + 1)) << "more than 1 MiB";
  EXPECT_FALSE(SourceReads::IsRangeFirst(bs, mib, 4096, mib / 2 + 1)) << "more than half a short last block";
  EXPECT_FALSE(SourceReads::IsRangeFirst(mib / 2, mib / 2, 4096, 4096)) << "a small block is fetched whole";
  EXPECT_FALSE(SourceReads::IsRangeFirst(bs, bs, 4096, mib, false, true)) << "a sequential stream's next READ";
  EXPECT_TRUE(SourceReads::IsRangeFirst(bs, bs, 0, 4096, true, true)) << "random wins";
}

TEST(SourceReads, ABlocksDirectReadsLastAtMostASecond) {
  SourceReads::Clock::time_point now{};
  SourceReads r([&] { return now; });
  auto f = Fake();
  r.FromSource("f", 0, f, true);
  EXPECT_EQ(r.Direct("f", 0, true).file, f);
  EXPECT_EQ(r.Direct("f", 1, true).file, f);
  now += SourceReads::kDirectFor - std::chrono::milliseconds(1);
  EXPECT_EQ(r.Direct("f", 0, true).file, f);
  EXPECT_EQ(r.Direct("f", 1, true).file, f);
  now += std::chrono::milliseconds(1);
  EXPECT_EQ(r.Direct("f", 0, true).file, nullptr) << "the next epoch asks the worker, which may have filled the block";
  EXPECT_EQ(r.Direct("f", 0, true).file, nullptr);
  EXPECT_EQ(r.Direct("f", 1, true).file, nullptr);
  r.FromSource("f", 0, nullptr, false);  // still answered from the source: kDirectReads more
  EXPECT_EQ(r.Direct("f", 0, true).file, f);
}

TEST(SourceReads, FilesAndBlocksAreBounded) {
  SourceReads r;
  auto f = Fake();
  for (size_t i = 0; i < SourceReads::kMaxFiles + 10; ++i) r.FromSource("f" + std::to_string(i), 0, f, true);
  EXPECT_EQ(r.files(), SourceReads::kMaxFiles);
  EXPECT_EQ(r.Direct("f0", 0, true).file, nullptr);  // the least recently used went first
  EXPECT_EQ(r.Direct("f" + std::to_string(SourceReads::kMaxFiles + 9), 0, true).file, f);
  SourceReads b;
  auto big = Fake(std::string(SourceReads::kMaxBlocks / 8 + 100, '\0'));  // more blocks than kept
  b.FromSource("g", 0, big, true);
  for (uint64_t i = 0; i < SourceReads::kMaxBlocks; ++i) EXPECT_EQ(b.Direct("g", i, true).file, big) << i;
  EXPECT_EQ(b.Direct("g", SourceReads::kMaxBlocks, true).file, nullptr);  // past the bound: the worker
  b.FromSource("g", SourceReads::kMaxBlocks + 4, nullptr, false);
  EXPECT_EQ(b.Direct("g", SourceReads::kMaxBlocks + 4, true).file, nullptr);
}

// A held descriptor keeps a deleted file's space and the source's file system busy: a file not read
// for kIdle is let go. A worker that sent no file (perhaps an error that has passed) is asked again
// after kAskAgain.
TEST(SourceReads, IdleFilesAreLetGoAndAWorkerThatSentNoneIsAskedAgain) {
  SourceReads::Clock::time_point now{};
  SourceReads r([&] { return now; });
  auto f = Fake();
  std::weak_ptr<const SourceFile> weak = f;
  r.FromSource("busy", 0, f, true);
  r.FromSource("idle", 0, std::move(f), true);
  r.FromSource("none", 0, nullptr, true);
  EXPECT_FALSE(r.Wants("none"));
  now += SourceReads::kIdle - std::chrono::seconds(1);
  r.FromSource("busy", 0, nullptr, false);  // answered again: not idle
  r.Trim();
  EXPECT_EQ(r.files(), 3u);
  now += std::chrono::seconds(1);
  r.Trim();
  EXPECT_EQ(r.files(), 1u);
  EXPECT_TRUE(r.Wants("idle"));
  r.FromSource("busy", 0, nullptr, false);  // its grant ran out (kDirectFor): the worker answers again
  EXPECT_NE(r.Direct("busy", 0, true).file, nullptr);  // the file is still held
  EXPECT_FALSE(weak.expired());
  now += SourceReads::kIdle;
  r.Trim();
  EXPECT_EQ(r.files(), 0u);
  EXPECT_TRUE(weak.expired()) << "the descriptor is closed once no read holds it";
  r.FromSource("none", 0, nullptr, true);
  EXPECT_FALSE(r.Wants("none"));
  now += SourceReads::kAskAgain;
  EXPECT_TRUE(r.Wants("none"));
}

// The rules above against a plain model of them, over random sequences of answers and reads.
TEST(SourceReads, MatchesAModelOverRandomOperations) {
  constexpr uint64_t kBlocks = 12;  // of which the worker's bitmap names the first 8
  for (int seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    SourceReads::Clock::time_point now{};
    SourceReads r([&] { return now; });  // time stands still: only the counts end direct reads
    struct Block {
      uint32_t reads = 0, touches = 0;
    };
    struct File {
      bool known = false, held = false;
      std::vector<bool> cached;
      std::map<uint64_t, Block> left;
    };
    std::map<int, File> model;
    for (int op = 0; op < 3000; ++op) {
      const int fi = static_cast<int>(rng() % 4);
      const uint64_t block = rng() % kBlocks;
      const std::string key = "k" + std::to_string(fi);
      File& m = model[fi];
      switch (rng() % 6) {
        case 0: {
          const bool with = rng() % 3 == 0;
          const bool asked = rng() % 2 == 0;
          std::string bits(1, static_cast<char>(rng() & 0xff));
          r.FromSource(key, block, with ? Fake(bits) : nullptr, asked);
          if (!m.known && !with && !asked) break;
          m.known = true;
          if (with) {
            m.held = true;
            m.cached.assign(8, false);
            for (int i = 0; i < 8; ++i) m.cached[i] = (static_cast<uint8_t>(bits[0]) >> i) & 1;
          }
          if (!m.held) break;
          if (block < m.cached.size()) m.cached[block] = false;
          m.left[block] = Block{SourceReads::kDirectReads, 1};
          break;
        }
        case 1:
          r.FromWorker(key, block);
          m.left.erase(block);
          if (block < m.cached.size()) m.cached[block] = true;
          break;
        case 2:
          if (rng() % 10 == 0) {
            r.Forget(key);
            model.erase(fi);
          }
          break;
        default: {
          const bool rf = rng() % 4 != 0;
          SourceReads::Grant g = r.Direct(key, block, rf);
          bool expect = false, touch = false;
          if (m.held && rf) {
            auto it = m.left.find(block);
            if (it == m.left.end() && rf && block < m.cached.size() && !m.cached[block]) {
              it = m.left.emplace(block, Block{SourceReads::kDirectReads, 0}).first;
            }
            if (it != m.left.end() && it->second.reads > 0) {
              expect = true;
              --it->second.reads;
              touch = it->second.touches < 2;
              if (touch) ++it->second.touches;
            }
          }
          ASSERT_EQ(g.file != nullptr, expect) << "seed " << seed << " op " << op;
          ASSERT_EQ(g.touch, touch) << "seed " << seed << " op " << op;
        }
      }
      ASSERT_EQ(r.Wants(key), !model[fi].known) << "seed " << seed << " op " << op;
    }
  }
}

TEST(SourceFile, ReadsTheFileAndFailsOnceItChanged) {
  testing::TempDir dir;
  const std::string path = dir / "data.bin";
  std::string bytes(100000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  Write(path, bytes);
  auto f = Open(path);
  std::string got(5000, '\0');
  ASSERT_TRUE(f->Read(40000, got.size(), got.data()).ok());
  EXPECT_EQ(got, bytes.substr(40000, 5000));
  // Past the end: fewer bytes than asked is a changed file, never a short answer.
  EXPECT_TRUE(f->Read(99000, 5000, got.data()).IsVersionChanged());
  // Rewritten in place (same size, another modification time): the next read fails.
  struct timespec t[2] = {{0, UTIME_OMIT}, {1, 0}};
  int fd = open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, "xyz", 3, 10), 3);
  ASSERT_EQ(futimens(fd, t), 0);  // a distinct mtime even on a coarse clock
  close(fd);
  EXPECT_TRUE(f->Read(0, 100, got.data()).IsVersionChanged());
}

TEST(SourceFile, AFileReplacedByARenameFailsAsTheWorkersReadWould) {
  testing::TempDir dir;
  const std::string path = dir / "data.bin";
  Write(path, std::string(4096, 'a'));
  auto f = Open(path);
  Write(dir / "new.bin", std::string(4096, 'b'));
  ASSERT_EQ(rename((dir / "new.bin").c_str(), path.c_str()), 0);
  std::string got(4096, '\0');
  EXPECT_TRUE(f->Read(0, got.size(), got.data()).IsVersionChanged()) << "the old file has no link left";
}

}  // namespace
}  // namespace granary::fuse
