// KernelReads (fuse/kernel_reads.h) and DaemonPages (fuse/daemon_pages.h) without a kernel: a fake
// master whose file versions the test changes, and a fake clock. The model test has several
// processes read files through while the under-storage changes and checks the promise kernel mode
// makes: a process reading a file through never gets two versions, and a process starting on a
// file gets a version no older than one confirm interval.
#include "fuse/kernel_reads.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>

#include "fuse/daemon_pages.h"

namespace granary::fuse {
namespace {

struct FakeMaster {
  std::map<uint64_t, int> version;  // kino -> current version number
  int asks = 0;
  bool down = false;
  std::chrono::milliseconds age{0};  // how old its answers are (a listing's information)
  KernelReads::AskMaster Ask() {
    return [this](uint64_t kino, std::chrono::milliseconds* answer_age) -> StatusOr<rpc::FileInfo> {
      asks++;
      if (down) return UnavailableError("master down");
      *answer_age = age;
      rpc::FileInfo f;
      f.mutable_attr()->set_ino(kino);
      f.set_version("v" + std::to_string(version[kino]));
      return f;
    };
  }
};

struct Fixture {
  FakeMaster master;
  std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now();
  KernelReads reads{1000, std::chrono::seconds(1), [this] { return now; }};
  std::string Version(uint64_t kino, uint64_t off, pid_t pid, bool* new_version = nullptr) {
    auto r = reads.FileFor(kino, off, pid, master.Ask());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return "";
    if (new_version) *new_version = r->new_version;
    return r->file->info.version();
  }
};

TEST(KernelReads, TheMasterIsAskedAtMostOncePerConfirmInterval) {
  Fixture f;
  EXPECT_EQ(f.Version(7, 0, 1), "v0");
  EXPECT_EQ(f.Version(7, 4096, 1), "v0");
  EXPECT_EQ(f.Version(7, 0, 2), "v0");
  EXPECT_EQ(f.master.asks, 1);
  f.now += std::chrono::milliseconds(1001);
  EXPECT_EQ(f.Version(7, 8192, 1), "v0");
  EXPECT_EQ(f.master.asks, 2);
}

TEST(KernelReads, AProcessMidFileStaysOnItsVersionAndMovesAtOffsetZero) {
  Fixture f;
  EXPECT_EQ(f.Version(7, 0, 1), "v0");
  f.master.version[7] = 1;
  f.now += std::chrono::seconds(2);
  bool fresh = false;
  EXPECT_EQ(f.Version(7, 4096, 1, &fresh), "v0");  // mid-file: stays (its blocks fail ESTALE if gone)
  EXPECT_TRUE(fresh);                               // and the kernel's pages of v0 are dropped
  EXPECT_EQ(f.Version(7, 0, 2), "v1");              // another process starting on it: the newest
  EXPECT_EQ(f.Version(7, 0, 1), "v1");              // process 1 starting again: the newest
  EXPECT_EQ(f.Version(7, 8192, 1, &fresh), "v1");
  EXPECT_FALSE(fresh);
}

TEST(KernelReads, UnconfirmMakesTheNextReadAskTheMaster) {
  Fixture f;
  f.Version(7, 0, 1);
  f.master.version[7] = 1;
  f.reads.Unconfirm(7);
  EXPECT_EQ(f.Version(7, 0, 1), "v1");
  EXPECT_EQ(f.master.asks, 2);
}

TEST(KernelReads, AMasterErrorIsTheReadsAndNothingIsRemembered) {
  Fixture f;
  f.master.down = true;
  EXPECT_FALSE(f.reads.FileFor(7, 0, 1, f.master.Ask()).ok());
  f.master.down = false;
  EXPECT_EQ(f.Version(7, 0, 1), "v0");
}

TEST(KernelReads, CapacityZeroRemembersNothing) {
  FakeMaster master;
  KernelReads reads(0, std::chrono::seconds(1));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(reads.FileFor(7, 0, 1, master.Ask()).ok());
  EXPECT_EQ(master.asks, 3);
}

TEST(KernelReads, ModelProcessesReadingThroughNeverSeeTwoVersions) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Fixture f;
    std::mt19937 rng(seed);
    struct Reader {
      bool reading = false;
      std::string version;
    };
    std::map<std::pair<uint64_t, pid_t>, Reader> readers;
    std::map<uint64_t, std::chrono::steady_clock::time_point> changed;  // when each file last changed
    for (int step = 0; step < 3000; ++step) {
      uint64_t kino = 1 + rng() % 3;
      pid_t pid = static_cast<pid_t>(1 + rng() % 4);
      int what = static_cast<int>(rng() % 20);
      if (what == 0) {
        f.master.version[kino]++;
        changed[kino] = f.now;
      } else if (what == 1) {
        f.now += std::chrono::milliseconds(rng() % 700);
      } else {
        Reader& r = readers[{kino, pid}];
        bool start = !r.reading || rng() % 4 == 0;
        std::string v = f.Version(kino, start ? 0 : 4096 * (1 + rng() % 100), pid);
        if (start) {
          // No older than the store's version of one confirm interval ago.
          int got = std::stoi(v.substr(1));
          if (f.now - changed[kino] > std::chrono::seconds(1)) {
            ASSERT_EQ(got, f.master.version[kino]);
          }
          r.reading = true;
          r.version = v;
        } else {
          ASSERT_EQ(v, r.version) << "process " << pid << " got two versions of inode " << kino;
        }
      }
    }
  }
}

TEST(DaemonPages, KeepsPagesOnlyForTheVersionLastOpened) {
  DaemonPages pages(100);
  EXPECT_FALSE(pages.Open(1, "v1", true));  // first open: nothing known of the pages
  EXPECT_TRUE(pages.Open(1, "v1", true));
  EXPECT_FALSE(pages.Open(1, "v2", true));  // another version: drop them
  EXPECT_FALSE(pages.Open(1, "v1", true));
  EXPECT_TRUE(pages.Open(1, "v1", true));
  EXPECT_FALSE(pages.Open(1, "v1", false));  // fuse.keep_cache off
  pages.Forget(1);                            // the store changed under a reader
  EXPECT_FALSE(pages.Open(1, "v1", true));
  DaemonPages none(0);
  EXPECT_FALSE(none.Open(1, "v1", true));
  EXPECT_FALSE(none.Open(1, "v1", true));
}

// Information from a listing counts as confirmed when it was listed, not when it was first used:
// the master is asked again a confirm interval after the listing.
TEST(KernelReads, AListingsInformationCountsFromWhenItWasListed) {
  Fixture f;
  f.master.age = std::chrono::milliseconds(900);  // listed 0.9 s ago; confirm_every is 1 s
  EXPECT_EQ(f.Version(7, 0, 1), "v0");
  EXPECT_EQ(f.master.asks, 1);
  f.master.age = std::chrono::milliseconds(0);
  f.now += std::chrono::milliseconds(50);
  EXPECT_EQ(f.Version(7, 4096, 1), "v0");
  EXPECT_EQ(f.master.asks, 1);  // 0.95 s old: still good
  f.now += std::chrono::milliseconds(100);
  f.master.version[7] = 1;
  EXPECT_EQ(f.Version(7, 0, 1), "v1");  // 1.05 s after the listing: asked, and a new version
  EXPECT_EQ(f.master.asks, 2);
}

}  // namespace
}  // namespace granary::fuse
