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

std::shared_ptr<const SourceFile> Fake() { return std::make_shared<const SourceFile>(-1, 0, 0, 0); }

TEST(SourceReads, NothingIsReadHereBeforeTheWorkerAnsweredFromTheSource) {
  SourceReads r;
  EXPECT_TRUE(r.Wants("f"));
  EXPECT_EQ(r.Direct("f", 0), nullptr);
  // An answer from the cache (or a block fetched and kept) reads nothing here either.
  r.FromWorker("f", 0);
  EXPECT_EQ(r.Direct("f", 0), nullptr);
  // An answer from the source without a file, not asked for: nothing to read with, nothing learnt.
  r.FromSource("f", 0, nullptr, false);
  EXPECT_EQ(r.Direct("f", 0), nullptr);
  EXPECT_EQ(r.files(), 0u);
  EXPECT_TRUE(r.Wants("f"));
  // Asked for, and none came (an object store): not asked again, and still nothing read here.
  r.FromSource("f", 0, nullptr, true);
  EXPECT_FALSE(r.Wants("f"));
  EXPECT_EQ(r.Direct("f", 0), nullptr);
  r.FromSource("f", 0, nullptr, false);
  EXPECT_EQ(r.Direct("f", 0), nullptr);
  // Forgotten (its version changed): asked again.
  r.Forget("f");
  EXPECT_TRUE(r.Wants("f"));
}

TEST(SourceReads, ABlockAnsweredFromTheSourceTwiceIsReadHereThenAskedAgain) {
  SourceReads r;
  auto f = Fake();
  r.FromSource("f", 3, f, true);
  EXPECT_FALSE(r.Wants("f"));
  // The worker sees a block's second touch too (it fills the block on it).
  EXPECT_EQ(r.Direct("f", 3), nullptr);
  r.FromSource("f", 3, nullptr, false);
  for (uint32_t i = 0; i < SourceReads::kDirectReads; ++i) EXPECT_EQ(r.Direct("f", 3), f) << i;
  // The worker sees the next one: its fill policy counts the touch.
  EXPECT_EQ(r.Direct("f", 3), nullptr);
  r.FromSource("f", 3, nullptr, false);  // still not cached: 8 more
  EXPECT_EQ(r.Direct("f", 3), f);
  // Another block of the file is asked of the worker first, twice, with the file already held.
  EXPECT_EQ(r.Direct("f", 4), nullptr);
  r.FromSource("f", 4, nullptr, false);
  EXPECT_EQ(r.Direct("f", 4), nullptr);
  r.FromSource("f", 4, nullptr, false);
  EXPECT_EQ(r.Direct("f", 4), f);
  // Once the worker answers a block from its cache, it is not read here.
  r.FromWorker("f", 4);
  EXPECT_EQ(r.Direct("f", 4), nullptr);
  // Another version of the file is another key.
  EXPECT_TRUE(r.Wants("f2"));
  r.Forget("f");
  EXPECT_EQ(r.Direct("f", 3), nullptr);
  EXPECT_TRUE(r.Wants("f"));
}

TEST(SourceReads, ABlocksDirectReadsLastAtMostASecond) {
  SourceReads::Clock::time_point now{};
  SourceReads r([&] { return now; });
  auto f = Fake();
  r.FromSource("f", 0, f, true);
  r.FromSource("f", 0, nullptr, false);
  EXPECT_EQ(r.Direct("f", 0), f);
  now += SourceReads::kDirectFor - std::chrono::milliseconds(1);
  EXPECT_EQ(r.Direct("f", 0), f);
  now += std::chrono::milliseconds(1);
  EXPECT_EQ(r.Direct("f", 0), nullptr) << "the next epoch asks the worker, which may have filled the block";
  EXPECT_EQ(r.Direct("f", 0), nullptr);
  r.FromSource("f", 0, nullptr, false);  // still answered from the source: 8 more
  EXPECT_EQ(r.Direct("f", 0), f);
}

TEST(SourceReads, FilesAndBlocksAreBounded) {
  SourceReads r;
  auto f = Fake();
  for (size_t i = 0; i < SourceReads::kMaxFiles + 10; ++i) {
    r.FromSource("f" + std::to_string(i), 0, f, true);
    r.FromSource("f" + std::to_string(i), 0, nullptr, false);
  }
  EXPECT_EQ(r.files(), SourceReads::kMaxFiles);
  EXPECT_EQ(r.Direct("f0", 0), nullptr);  // the least recently used went first
  EXPECT_EQ(r.Direct("f" + std::to_string(SourceReads::kMaxFiles + 9), 0), f);
  SourceReads b;
  for (uint64_t i = 0; i < SourceReads::kMaxBlocks + 5; ++i) {
    b.FromSource("g", i, i == 0 ? f : nullptr, i == 0);
    b.FromSource("g", i, nullptr, false);
  }
  EXPECT_EQ(b.Direct("g", 0), f);
  EXPECT_EQ(b.Direct("g", SourceReads::kMaxBlocks + 4), nullptr);  // past the bound: the worker
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
  r.FromSource("busy", 0, nullptr, false);  // read again: not idle
  r.Trim();
  EXPECT_EQ(r.files(), 3u);
  now += std::chrono::seconds(1);
  r.Trim();
  EXPECT_EQ(r.files(), 1u);
  EXPECT_TRUE(r.Wants("idle"));
  EXPECT_EQ(r.Direct("busy", 0), nullptr);   // its grant (kDirectFor) ran out: the worker is asked
  r.FromSource("busy", 0, nullptr, false);
  EXPECT_NE(r.Direct("busy", 0), nullptr);   // the file is still held
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

TEST(SourceReads, MatchesAModelOverRandomOperations) {
  for (int seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    SourceReads::Clock::time_point now{};
    SourceReads r([&] { return now; });  // time stands still: only the counts end direct reads
    auto f = Fake();
    std::map<std::pair<int, uint64_t>, uint32_t> left;     // (file, block) -> direct reads left
    std::map<std::pair<int, uint64_t>, uint32_t> answers;  // (file, block) -> answers from the source
    std::map<int, bool> held;                           // file -> has a descriptor
    std::map<int, bool> known;                          // file -> remembered (held, or asked in vain)
    for (int op = 0; op < 3000; ++op) {
      const int file = static_cast<int>(rng() % 4);
      const uint64_t block = rng() % 6;
      const std::string key = "k" + std::to_string(file);
      switch (rng() % 5) {
        case 0: {
          const bool with = rng() % 2 == 0;
          const bool asked = rng() % 2 == 0;
          r.FromSource(key, block, with ? f : nullptr, asked);
          if (with) held[file] = true;
          if (with || asked) known[file] = true;
          if (held[file] && ++answers[{file, block}] >= 2) left[{file, block}] = SourceReads::kDirectReads;
          break;
        }
        case 1:
          r.FromWorker(key, block);
          left.erase({file, block});
          answers.erase({file, block});
          break;
        case 2:
          if (rng() % 10 == 0) {
            r.Forget(key);
            held.erase(file);
            known.erase(file);
            for (uint64_t b = 0; b < 6; ++b) {
              left.erase({file, b});
              answers.erase({file, b});
            }
          }
          break;
        default: {
          auto it = left.find({file, block});
          const bool expect = it != left.end() && held[file];
          ASSERT_EQ(r.Direct(key, block) != nullptr, expect) << "seed " << seed << " op " << op;
          if (expect && --it->second == 0) left.erase(it);
        }
      }
      ASSERT_EQ(r.Wants(key), !known[file]) << "seed " << seed << " op " << op;
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
