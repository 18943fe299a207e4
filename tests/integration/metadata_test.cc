// Metadata at scale and across master crashes, through real processes and a real FUSE mount.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <atomic>
#include <set>
#include <thread>

#include "common/metrics.h"

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

// Empty files, fast (no data to write).
void MakeEmptyFiles(const std::string& dir, int n) {
  fs::create_directories(dir);
  for (int i = 0; i < n; ++i) {
    std::string p = dir + "/f" + std::to_string(i) + ".jpg";
    int fd = open(p.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << p;
    close(fd);
  }
}

class MetadataTest : public ::testing::Test {
 protected:
  void Start() {
    std::string why;
    ASSERT_TRUE(cluster_.StartDaemons(&why)) << why;
    RunResult m = cluster_.Cli({"mount", "/ds", "file://" + dir_ / "src"});
    ASSERT_EQ(m.code, 0) << m.out;
    ASSERT_TRUE(cluster_.StartFuse(&why)) << why;
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.Logs();
  }
  std::string Mnt(const std::string& rel) const { return cluster_.mountpoint() + "/ds/" + rel; }

  TempDir dir_;
  LocalCluster cluster_{dir_};
};

TEST_F(MetadataTest, AHundredThousandEntryDirectoryListsCompletelyInBoundedMemory) {
  constexpr int kEntries = 100'000;
  MakeEmptyFiles(dir_ / "src/big", kEntries);
  Start();
  uint64_t fuse_before = metrics::ResidentBytesOf(cluster_.fuse_pid());
  std::set<std::string> seen;
  size_t dups = 0;
  DIR* d = opendir(Mnt("big").c_str());
  ASSERT_NE(d, nullptr);
  ino_t dot = 0, dotdot = 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == ".") dot = e->d_ino;
    if (name == "..") dotdot = e->d_ino;
    if (name == "." || name == "..") continue;
    if (!seen.insert(name).second) ++dups;
  }
  closedir(d);
  // "." and ".." name the directory and its parent (".." from the attributes its lookup cached).
  struct stat self {}, parent {};
  ASSERT_EQ(stat(Mnt("big").c_str(), &self), 0);
  ASSERT_EQ(stat(Mnt("").c_str(), &parent), 0);
  EXPECT_EQ(dot, self.st_ino);
  EXPECT_EQ(dotdot, parent.st_ino);
  EXPECT_EQ(dups, 0u);
  EXPECT_EQ(seen.size(), static_cast<size_t>(kEntries));
  EXPECT_TRUE(seen.count("f0.jpg") && seen.count("f99999.jpg"));
  // Neither process holds the directory as a whole: the master streams it from RocksDB in pages,
  // granary-fuse forwards page by page.
  uint64_t master_rss = metrics::ResidentBytesOf(cluster_.master_pid());
  uint64_t fuse_growth = metrics::ResidentBytesOf(cluster_.fuse_pid()) - std::min(fuse_before, metrics::ResidentBytesOf(cluster_.fuse_pid()));
  if (!kSanitizerBuild) {
    EXPECT_LT(master_rss, 400ull << 20) << "master RSS " << master_rss;
    // What granary-fuse keeps of a listing is bounded by fuse.file_cache_entries (100000 here, as
    // many as the directory has): each file's entry, attributes and open information, about 1 KB a
    // file (common/config.cc), never the listing itself.
    EXPECT_LT(fuse_growth, 160ull << 20) << "granary-fuse grew by " << fuse_growth;
  }
  // A second listing (now from RocksDB only) gives the same entries.
  size_t again = 0;
  for (auto& e : fs::directory_iterator(Mnt("big"))) again += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(again, static_cast<size_t>(kEntries));
}

// A directory whose listing fits one reply costs the master one ReadDir: the kernel's closing
// readdir (at the listing's last offset) is answered from what the master said, not asked again,
// and its opendir and ".." use the attributes its lookup brought; listed again, it has the same
// entries.
TEST_F(MetadataTest, ASmallDirectoryListedAfterItsLookupCostsOneMasterCall) {
  MakeEmptyFiles(dir_ / "src/small", 50);
  Start();
  const std::string kReadDirs = "granary_master_rpc_calls_total{method=\"ReadDir\"}";
  auto list = [&] {
    std::set<std::string> names;
    for (auto& e : fs::directory_iterator(Mnt("small"))) names.insert(e.path().filename().string());
    return names;
  };
  struct stat st {};
  ASSERT_EQ(stat(Mnt("small").c_str(), &st), 0);  // its lookup: the listing below is all that asks
  const std::string kGetAttrs = "granary_master_rpc_calls_total{method=\"GetAttr\"}";
  const double before = cluster_.Metric("master", kReadDirs), attrs_before = cluster_.Metric("master", kGetAttrs);
  EXPECT_EQ(list().size(), 50u);
  const double after = cluster_.Metric("master", kReadDirs), attrs_after = cluster_.Metric("master", kGetAttrs);
  EXPECT_EQ(after - std::max(before, 0.0), 1) << "ReadDir calls for one listing (before " << before << ")";
  // Its opendir and its ".." take the directory's attributes from its lookup.
  EXPECT_EQ(std::max(attrs_after, 0.0) - std::max(attrs_before, 0.0), 0) << "GetAttr calls for one listing";
  EXPECT_EQ(list().size(), 50u);
}

TEST_F(MetadataTest, KillNineMasterDuringReadsAndListingLosesNothing) {
  for (int i = 0; i < 20; ++i) WriteFile(dir_ / ("src/imgs/x" + std::to_string(i) + ".jpg"), RandomBytes(200000, i));
  MakeEmptyFiles(dir_ / "src/wide", 30'000);
  Start();
  // Open one file and look up the others, so their metadata is cached in the kernel and granary-fuse.
  int fd = open(Mnt("imgs/x0.jpg").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string head(1000, '\0');
  ASSERT_EQ(pread(fd, head.data(), head.size(), 0), 1000);
  for (int i = 1; i < 20; ++i) {
    std::string got;
    ASSERT_TRUE(ReadFileChecked(Mnt("imgs/x" + std::to_string(i) + ".jpg"), &got));
  }
  // Start listing the wide directory in the background, and kill -9 the master while it lists.
  std::atomic<bool> listing_done{false};
  std::thread lister([&] {
    std::error_code ec;
    for (auto it = fs::directory_iterator(Mnt("wide"), ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    }
    listing_done = true;
  });
  // Wait until the listing is being written (RocksDB's log grows), then kill.
  auto wal_bytes = [&] {
    uint64_t n = 0;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir_ / "master", ec)) {
      if (e.path().extension() == ".log") n += e.file_size(ec);
    }
    return n;
  };
  uint64_t wal_before = wal_bytes();
  ASSERT_TRUE(WaitFor([&] { return wal_bytes() > wal_before + 256 * 1024 || listing_done; }));
  bool mid_listing = !listing_done;
  cluster_.KillMaster();
  RecordProperty("killed_mid_listing", mid_listing ? "yes" : "no");
  // With the master down: the open file reads on, and files whose metadata is cached still open.
  std::string rest(199000, '\0');
  ASSERT_EQ(pread(fd, rest.data(), rest.size(), 1000), 199000);
  EXPECT_EQ(head + rest, RandomBytes(200000, 0));
  close(fd);
  for (int i = 1; i < 20; ++i) {
    std::string got;
    EXPECT_TRUE(ReadFileChecked(Mnt("imgs/x" + std::to_string(i) + ".jpg"), &got)) << i;
    EXPECT_EQ(got, RandomBytes(200000, i)) << i;
  }
  lister.join();
  // Restart: the namespace comes back from RocksDB, the listing completes without duplicates, the
  // worker re-registers with its blocks.
  std::string why;
  ASSERT_TRUE(cluster_.RestartMaster(&why)) << why;
  std::set<std::string> names;
  size_t dups = 0;
  ASSERT_TRUE(WaitFor([&] {
    names.clear();
    dups = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(Mnt("wide"), ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
      if (!names.insert(it->path().filename()).second) ++dups;
    }
    return !ec && names.size() == 30'000;
  })) << names.size() << " entries";
  EXPECT_EQ(dups, 0u);
  RunResult ls = cluster_.Cli({"ls", "/ds/imgs"});
  EXPECT_EQ(ls.code, 0) << ls.out;
  EXPECT_NE(ls.out.find("x19.jpg"), std::string::npos) << ls.out;
  nlohmann::json r;
  ASSERT_TRUE(WaitFor([&] {
    r = cluster_.Report();
    return !r.is_null() && !r["mounts"].empty() && r["mounts"][0]["cached_blocks"].get<uint64_t>() >= 20;
  })) << r.dump(2);
}

TEST_F(MetadataTest, KillNineMasterDuringABulkLoadThenLoadAgainCompletes) {
  if (access(Bin("granary-meta-bench").c_str(), X_OK) != 0) GTEST_SKIP() << "built without bench/ (the load client)";
  for (int d = 0; d < 40; ++d) MakeEmptyFiles(dir_ / ("src/d" + std::to_string(d)), 1000);
  Start();
  auto wal_bytes = [&] {
    uint64_t n = 0;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(dir_ / "master", ec)) {
      if (e.path().extension() == ".log") n += e.file_size(ec);
    }
    return n;
  };
  uint64_t wal_before = wal_bytes();
  auto load = std::make_unique<Process>(
      std::vector<std::string>{Bin("granary-meta-bench"), "--master", cluster_.master_address(), "--load", "/ds"},
      dir_ / "load1.log");
  ASSERT_TRUE(WaitFor([&] { return wal_bytes() > wal_before + 512 * 1024 || !load->Running(); }));
  bool mid_load = load->Running();
  cluster_.KillMaster();
  load->Wait();
  RecordProperty("killed_mid_load", mid_load ? "yes" : "no");
  std::string why;
  ASSERT_TRUE(cluster_.RestartMaster(&why)) << why;
  Process again({Bin("granary-meta-bench"), "--master", cluster_.master_address(), "--load", "/ds"}, dir_ / "load2.log");
  ASSERT_EQ(again.Wait(), 0) << again.Log();
  // Killed in the middle, the second load resumes after the first one's last written page and
  // lists only the rest; a first load that had ended leaves nothing to resume.
  auto second = nlohmann::json::parse(again.Log().substr(0, again.Log().find('\n')), nullptr, false);
  ASSERT_TRUE(second.is_object()) << again.Log();
  if (mid_load && second["resumed"].get<bool>()) {
    EXPECT_LT(second["files"].get<uint64_t>(), 40'000u) << again.Log();
  } else {
    EXPECT_EQ(second["files"].get<uint64_t>(), 40'000u) << again.Log();
  }
  // Everything is there once, served without listing the under-storage again.
  fs::rename(dir_ / "src", dir_ / "src-away");
  size_t files = 0, dups = 0;
  for (int d = 0; d < 40; ++d) {
    std::set<std::string> names;
    for (auto& e : fs::directory_iterator(Mnt("d" + std::to_string(d)))) {
      if (!names.insert(e.path().filename()).second) ++dups;
      ++files;
    }
  }
  fs::rename(dir_ / "src-away", dir_ / "src");
  EXPECT_EQ(files, 40'000u);
  EXPECT_EQ(dups, 0u);
}

}  // namespace
}  // namespace granary::testing
