// The whole read path through real processes and a real FUSE mount.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <map>
#include <memory>
#include <vector>
#include <random>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

// A source tree with the shapes that break filesystems.
void MakeDataset(const std::string& root) {
  WriteFile(root + "/a/b/c/deep.txt", "deep\n");
  WriteFile(root + "/empty.bin", "");
  WriteFile(root + "/many-blocks.bin", RandomBytes(64 * 1024 * 17 + 123, 7));  // 18 blocks of 64Ki
  WriteFile(root + "/exact-block.bin", RandomBytes(64 * 1024, 8));
  WriteFile(root + "/with space/naïve café ü 日本.txt", "unicode\n");
  for (int i = 0; i < 30; ++i) WriteFile(root + "/class_" + std::to_string(i % 3) + "/img" + std::to_string(i) + ".jpg", RandomBytes(1000 + i * 977, i));
  fs::create_directories(root + "/empty-dir");
  chmod((root + "/a/b/c/deep.txt").c_str(), 0640);
}

struct Node {
  bool dir;
  uint64_t size;
  int64_t mtime_ns;
  unsigned mode;
};

std::map<std::string, Node> Walk(const std::string& root) {
  std::map<std::string, Node> out;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    struct stat st;
    EXPECT_EQ(stat(it->path().c_str(), &st), 0) << it->path();
    out[fs::relative(it->path(), root).string()] =
        Node{S_ISDIR(st.st_mode), S_ISDIR(st.st_mode) ? 0 : static_cast<uint64_t>(st.st_size),
             static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec, st.st_mode & 0777};
  }
  return out;
}

class ReadPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MakeDataset(dir_ / "src");
    std::string why;
    ASSERT_TRUE(cluster_.StartDaemons(&why)) << why;
    RunResult m = cluster_.Cli({"mount", "/ds", "file://" + dir_ / "src"});
    ASSERT_EQ(m.code, 0) << m.out;
    ASSERT_TRUE(cluster_.StartFuse(&why)) << why;
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.Logs();
  }
  std::string Mnt(const std::string& rel = "") const { return cluster_.mountpoint() + "/ds" + (rel.empty() ? "" : "/" + rel); }

  TempDir dir_;
  LocalCluster cluster_{dir_};
};

TEST_F(ReadPathTest, TreeAttributesAndBytesMatchTheSource) {
  auto src = Walk(dir_ / "src");
  auto mnt = Walk(Mnt());
  ASSERT_EQ(src.size(), mnt.size());
  for (const auto& [rel, s] : src) {
    auto it = mnt.find(rel);
    ASSERT_NE(it, mnt.end()) << rel << " missing from the mount";
    const Node& m = it->second;
    EXPECT_EQ(m.dir, s.dir) << rel;
    EXPECT_EQ(m.size, s.size) << rel;
    EXPECT_EQ(m.mtime_ns, s.mtime_ns) << rel;
    EXPECT_EQ(m.mode, s.mode & ~0222u) << rel << ": mode minus write bits";
    if (!s.dir) {
      EXPECT_EQ(Sha256File(Mnt(rel)), Sha256File(dir_ / ("src/" + rel))) << rel;
    }
  }
  // The namespace root shows the mount as a directory.
  struct stat st;
  ASSERT_EQ(stat(cluster_.mountpoint().c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

TEST_F(ReadPathTest, UnalignedReadsAcrossBlockBoundaries) {
  std::string want = ReadFile(dir_ / "src/many-blocks.bin");
  int fd = open(Mnt("many-blocks.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (uint64_t off : std::vector<uint64_t>{0, 65535, 65536, 131071, 500000, want.size() - 10}) {
    std::string buf(100000, '\0');
    ssize_t n = pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    ASSERT_GE(n, 0);
    EXPECT_EQ(static_cast<size_t>(n), std::min<size_t>(buf.size(), want.size() - off));
    EXPECT_EQ(buf.substr(0, n), want.substr(off, n)) << "offset " << off;
  }
  char c;
  EXPECT_EQ(pread(fd, &c, 1, static_cast<off_t>(want.size() + 5)), 0) << "read past EOF returns 0";
  close(fd);
}

TEST_F(ReadPathTest, SecondReadIsServedFromTheCache) {
  uint64_t h0, m0, u0;
  ASSERT_TRUE(cluster_.WorkerCounters(&h0, &m0, &u0));
  std::string path = Mnt("many-blocks.bin");
  std::string want = Sha256File(dir_ / "src/many-blocks.bin");
  ASSERT_EQ(Sha256File(path), want);
  uint64_t h1, m1, u1;
  ASSERT_TRUE(WaitFor([&] { return cluster_.WorkerCounters(&h1, &m1, &u1) && u1 >= u0 + 64 * 1024 * 17 + 123; }))
      << "the first read must fetch the whole file from the under-storage";
  // Each of the 18 blocks was fetched once: on a miss, or ahead of the reader (readahead).
  ASSERT_TRUE(WaitFor([&] {
    auto j = cluster_.Report();
    return !j.is_null() && j["workers"][0]["misses"].get<uint64_t>() + j["workers"][0]["prefetched"].get<uint64_t>() >= m0 + 18;
  })) << cluster_.Report().dump(1);
  ASSERT_TRUE(cluster_.WorkerCounters(&h1, &m1, &u1));
  ASSERT_EQ(Sha256File(path), want);
  uint64_t h2, m2, u2;
  ASSERT_TRUE(WaitFor([&] { return cluster_.WorkerCounters(&h2, &m2, &u2) && h2 > h1; })) << "no cache hits seen";
  EXPECT_EQ(u2, u1) << "the second read must not touch the under-storage";
  EXPECT_EQ(m2, m1);
  // The master attributes the cached bytes to the mount.
  RunResult r = cluster_.Cli({"report"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("/ds"), std::string::npos) << r.out;
  // Reads and a level's lookups are named apart (issue 54: "MISSES 0" beside "misses 450").
  EXPECT_NE(r.out.find("READ MISSES"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lookups found"), std::string::npos) << r.out;
}

TEST_F(ReadPathTest, WritesFailWithErofs) {
  auto expect_erofs = [](int rc, const char* what) {
    EXPECT_EQ(rc, -1) << what;
    EXPECT_EQ(errno, EROFS) << what << ": " << strerror(errno);
  };
  expect_erofs(open(Mnt("new.txt").c_str(), O_WRONLY | O_CREAT, 0644), "create");
  expect_erofs(open(Mnt("empty.bin").c_str(), O_WRONLY), "open for write");
  expect_erofs(open(Mnt("empty.bin").c_str(), O_RDWR), "open read-write");
  expect_erofs(mkdir(Mnt("d").c_str(), 0755), "mkdir");
  expect_erofs(unlink(Mnt("empty.bin").c_str()), "unlink");
  expect_erofs(rmdir(Mnt("empty-dir").c_str()), "rmdir");
  expect_erofs(rename(Mnt("empty.bin").c_str(), Mnt("x.bin").c_str()), "rename");
  expect_erofs(truncate(Mnt("exact-block.bin").c_str(), 0), "truncate");
  expect_erofs(chmod(Mnt("exact-block.bin").c_str(), 0777), "chmod");
  expect_erofs(symlink("x", Mnt("link").c_str()), "symlink");
  expect_erofs(setxattr(Mnt("empty.bin").c_str(), "user.k", "v", 1, 0), "setxattr");
  char buf[8];
  EXPECT_EQ(getxattr(Mnt("empty.bin").c_str(), "user.k", buf, sizeof buf), -1);
  EXPECT_EQ(errno, EOPNOTSUPP) << "no extended attributes; the kernel answers for us after the first ask";
  // Nothing changed in the source.
  EXPECT_FALSE(fs::exists(dir_ / "src/new.txt"));
  EXPECT_EQ(fs::file_size(dir_ / "src/exact-block.bin"), 64u * 1024);
}

TEST_F(ReadPathTest, VanishedAndChangedFilesFailCleanly) {
  WriteFile(dir_ / "src/later/gone.bin", RandomBytes(5000, 1));
  WriteFile(dir_ / "src/later/changed.bin", RandomBytes(5000, 2));
  struct stat st;
  ASSERT_EQ(stat(Mnt("later/gone.bin").c_str(), &st), 0);
  ASSERT_EQ(stat(Mnt("later/changed.bin").c_str(), &st), 0);
  fs::remove(dir_ / "src/later/gone.bin");
  WriteFile(dir_ / "src/later/changed.bin", RandomBytes(5000, 3));  // same size, new bytes

  std::string buf(8192, '\0');
  int fd = open(Mnt("later/gone.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read(fd, buf.data(), buf.size()), -1);
  EXPECT_TRUE(errno == ENOENT || errno == EIO) << strerror(errno);
  close(fd);

  fd = open(Mnt("later/changed.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read(fd, buf.data(), buf.size()), -1) << "a changed file must not be served as the listed version";
  EXPECT_EQ(errno, ESTALE) << strerror(errno);
  close(fd);

  // The daemons are still serving.
  EXPECT_EQ(Sha256File(Mnt("a/b/c/deep.txt")), Sha256File(dir_ / "src/a/b/c/deep.txt"));
}

TEST_F(ReadPathTest, CliListsAndStats) {
  RunResult ls = cluster_.Cli({"ls", "/ds"});
  ASSERT_EQ(ls.code, 0) << ls.out;
  EXPECT_NE(ls.out.find("many-blocks.bin"), std::string::npos);
  EXPECT_NE(ls.out.find("with space/"), std::string::npos);
  RunResult st = cluster_.Cli({"stat", "/ds/many-blocks.bin"});
  ASSERT_EQ(st.code, 0) << st.out;
  EXPECT_NE(st.out.find(std::to_string(64 * 1024 * 17 + 123)), std::string::npos) << st.out;
  RunResult mounts = cluster_.Cli({"mounts"});
  EXPECT_NE(mounts.out.find("file://" + dir_ / "src"), std::string::npos) << mounts.out;
  RunResult missing = cluster_.Cli({"stat", "/ds/nope"});
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("/ds/nope does not exist"), std::string::npos) << missing.out;
}

TEST_F(ReadPathTest, StopsCleanlyOnSigterm) {
  ASSERT_EQ(Sha256File(Mnt("exact-block.bin")), Sha256File(dir_ / "src/exact-block.bin"));
  std::string why;
  EXPECT_TRUE(cluster_.StopAll(&why)) << why;
  EXPECT_FALSE(IsMounted(cluster_.mountpoint()));
}

TEST(ReadPathRestart, CacheAndNamespaceSurviveARestart) {
  TempDir dir;
  MakeDataset(dir / "src");
  std::string want = Sha256File(dir / "src/many-blocks.bin");
  {
    LocalCluster c(dir);
    std::string why;
    ASSERT_TRUE(c.StartDaemons(&why)) << why;
    ASSERT_EQ(c.Cli({"mount", "/ds", dir / "src"}).code, 0);
    ASSERT_TRUE(c.StartFuse(&why)) << why;
    ASSERT_EQ(Sha256File(c.mountpoint() + "/ds/many-blocks.bin"), want);
    ASSERT_TRUE(c.StopAll(&why)) << why;
  }
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  ASSERT_EQ(Sha256File(c.mountpoint() + "/ds/many-blocks.bin"), want);
  uint64_t h, m, u;
  ASSERT_TRUE(WaitFor([&] { return c.WorkerCounters(&h, &m, &u) && h >= 18; })) << c.Logs();
  EXPECT_EQ(u, 0u) << "a restarted worker serves its kept cache";
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// A worker killed with -9 stops counting in the report's cached figures once the master has not
// heard from it for master.worker_timeout, and du asks no dead worker. Restarted on its kept cache,
// it counts again from its registration alone: no block is read, no block list is sent.
TEST(ReadPathRestart, ADeadWorkerStopsCountingAndCountsAgainWhenBack) {
  TempDir dir;
  MakeDataset(dir / "src");
  uint64_t bytes = 0;
  for (auto& e : fs::recursive_directory_iterator(dir / "src")) bytes += e.is_regular_file() ? e.file_size() : 0;
  ClusterOptions opts;
  opts.worker_timeout = "2s";
  LocalCluster c(dir, opts);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", dir / "src"}).code, 0);
  RunResult load = c.Cli({"load", "/ds"});
  ASSERT_EQ(load.code, 0) << load.out;
  auto figures = [&](uint64_t* cached, int* alive) {
    auto j = c.Report();
    if (j.is_null() || j["mounts"].empty()) return false;
    *cached = j["mounts"][0]["cached_bytes"].get<uint64_t>();
    *alive = 0;
    for (const auto& w : j["workers"]) *alive += w["alive"].get<bool>();
    return true;
  };
  uint64_t cached = 0;
  int alive = 0;
  ASSERT_TRUE(WaitFor([&] { return figures(&cached, &alive) && cached == bytes; })) << cached << " of " << bytes;

  c.KillWorker();
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitFor([&] { return figures(&cached, &alive) && cached == 0 && alive == 0; }, std::chrono::seconds(60)))
      << cached << " bytes still counted, " << alive << " workers alive\n" << c.Logs();
  std::printf("a dead worker stopped counting after %.1f s (master.worker_timeout 2 s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count());
  RunResult du = c.Cli({"du", "/ds", "--json"});
  ASSERT_EQ(du.code, 0) << du.out;
  auto d = nlohmann::json::parse(du.out, nullptr, false);
  ASSERT_FALSE(d.is_discarded()) << du.out;
  EXPECT_EQ(d["workers"], 0) << du.out;
  EXPECT_EQ(d["total"]["cached_bytes"], 0) << du.out;

  ASSERT_TRUE(c.RestartWorker(&why)) << why;
  EXPECT_TRUE(WaitFor([&] { return figures(&cached, &alive) && cached == bytes && alive == 1; }))
      << cached << " of " << bytes << "\n" << c.Logs();
  du = c.Cli({"du", "/ds", "--json"});
  d = nlohmann::json::parse(du.out, nullptr, false);
  ASSERT_FALSE(d.is_discarded()) << du.out;
  EXPECT_EQ(d["workers"], 1) << du.out;
  EXPECT_EQ(d["total"]["cached_bytes"], bytes) << du.out;
  uint64_t h, m, u;
  ASSERT_TRUE(c.WorkerCounters(&h, &m, &u));
  EXPECT_EQ(h + m + u, 0u) << "the restarted worker read nothing to be counted again";
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

}  // namespace
}  // namespace granary::testing

namespace granary::testing {
namespace {

// Reads every file of `src` through `mnt` (shuffled by `seed`) and compares the bytes.
int ReadTreeMismatches(const std::string& src, const std::string& mnt) {
  int bad = 0;
  for (auto& e : fs::recursive_directory_iterator(src)) {
    if (!e.is_regular_file()) continue;
    std::string rel = fs::relative(e.path(), src).string(), got;
    if (!ReadFileChecked(mnt + "/" + rel, &got) || got != ReadFile(e.path())) {
      ADD_FAILURE() << rel;
      ++bad;
    }
  }
  return bad;
}

uint64_t WorkerField(LocalCluster& c, const char* key) {
  auto j = c.Report();
  return j.is_null() || j["workers"].empty() ? 0 : j["workers"][0][key].get<uint64_t>();
}

// Cached blocks reach the kernel as leased block files (the worker's local socket, spliced), and
// their bytes are exactly the source's; with fuse.zero_copy false every read streams over gRPC.
TEST(ZeroCopy, LocalHitsArePassedAsLeasedFilesWithTheRightBytes) {
  for (bool zero_copy : {true, false}) {
    TempDir dir;
    MakeDataset(dir / "src");
    ClusterOptions opts;
    opts.fuse_args = {"--fuse.zero_copy", zero_copy ? "true" : "false"};
    LocalCluster c(dir, opts);
    std::string why;
    ASSERT_TRUE(c.StartDaemons(&why)) << why;
    ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
    ASSERT_TRUE(c.StartFuse(&why)) << why;
    // Leases are read from the worker's own /metrics, which count a lease before the read that
    // took it returns; `granary report` lags by a heartbeat and raced the reads under load.
    const std::string kLeases = "granary_worker_block_reads_total{source=\"zero_copy\"}";
    EXPECT_EQ(ReadTreeMismatches(dir / "src", c.mountpoint() + "/ds"), 0);  // cold: misses, inline
    double leases_cold = c.Metric("worker", kLeases);
    ASSERT_GE(leases_cold, 0) << "the worker's /metrics did not answer";
    EXPECT_EQ(ReadTreeMismatches(dir / "src", c.mountpoint() + "/ds"), 0);  // warm: hits
    uint64_t leases = static_cast<uint64_t>(c.Metric("worker", kLeases) - leases_cold);
    if (zero_copy) {
      EXPECT_GE(leases, 30u) << "warm reads did not take the zero-copy path";
      EXPECT_FALSE(c.Report()["workers"][0]["local_socket"].get<std::string>().empty());
    } else {
      EXPECT_EQ(leases, 0u);
    }
    ASSERT_TRUE(c.StopAll(&why)) << why;
  }
}

// Sequential reads make granary-fuse hint the next blocks (fuse.readahead_blocks): the worker has
// them cached before the reader asks; a random reader gives no hints.
TEST(Readahead, SequentialReadsWarmTheNextBlocks) {
  TempDir dir;
  std::string data = RandomBytes(64 * 1024 * 40, 3);  // 40 blocks of 64Ki
  WriteFile(dir / "src/seq.bin", data);
  WriteFile(dir / "src/rnd.bin", data);
  ClusterOptions opts;
  opts.fuse_args = {"--fuse.readahead_blocks", "3"};
  LocalCluster c(dir, opts);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;

  int fd = open((c.mountpoint() + "/ds/seq.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string buf(64 * 1024, '\0');
  for (int b = 0; b < 2; ++b) {  // blocks 0 and 1, in order
    ASSERT_EQ(pread(fd, buf.data(), buf.size(), b * 65536), 65536);
    EXPECT_EQ(buf, data.substr(b * 65536, 65536));
  }
  // Blocks 2..4 arrive without being read.
  EXPECT_TRUE(WaitFor([&] { return WorkerField(c, "prefetched") >= 3 && WorkerField(c, "blocks") >= 5; }))
      << c.Report().dump(1);
  // Misses from the worker's own /metrics: the report's copy could hide a miss behind a heartbeat.
  // Block 2 is read with O_DIRECT: exactly one READ of it, none of the kernel's readahead beyond
  // it, which may reach blocks nobody hinted yet (misses, rightly).
  uint64_t hits = 0, misses = 0, ufs = 0, misses_after = 0;
  ASSERT_TRUE(c.WorkerCounters(&hits, &misses, &ufs));
  {
    int dfd = open((c.mountpoint() + "/ds/seq.bin").c_str(), O_RDONLY | O_DIRECT);
    ASSERT_GE(dfd, 0);
    void* p = nullptr;
    ASSERT_EQ(posix_memalign(&p, 4096, 65536), 0);
    std::unique_ptr<char, decltype(&free)> direct(static_cast<char*>(p), &free);
    ASSERT_EQ(pread(dfd, direct.get(), 65536, 2 * 65536), 65536);
    close(dfd);
    EXPECT_EQ(std::string(direct.get(), 65536), data.substr(2 * 65536, 65536));
  }
  ASSERT_TRUE(c.WorkerCounters(&hits, &misses_after, &ufs));
  EXPECT_EQ(misses_after, misses) << "the prefetched block was a miss";
  // The same block through the sequential reader's descriptor, which hints the next ones.
  ASSERT_EQ(pread(fd, buf.data(), buf.size(), 2 * 65536), 65536);
  EXPECT_EQ(buf, data.substr(2 * 65536, 65536));
  close(fd);
  // Reading block 2 hinted block 5: seq.bin's readahead is over once blocks 0..5 are all cached
  // (the report lags a heartbeat, by which time the prefetch was counted).
  EXPECT_TRUE(WaitFor([&] { return WorkerField(c, "blocks") >= 6; })) << c.Report().dump(1);

  fd = open((c.mountpoint() + "/ds/rnd.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const std::string prefetched_metric = "granary_worker_prefetched_blocks_total";
  double prefetched = c.Metric("worker", prefetched_metric);
  for (int b : {17, 3, 29, 11}) {
    ASSERT_EQ(pread(fd, buf.data(), buf.size(), b * 65536), 65536);
    EXPECT_EQ(buf, data.substr(b * 65536, 65536));
  }
  close(fd);
  EXPECT_EQ(c.Metric("worker", prefetched_metric), prefetched) << "random reads hinted blocks";
  // The worker holds exactly the blocks read of rnd.bin.
  RunResult info = c.Cli({"info", "/ds/rnd.bin", "--json"});
  ASSERT_EQ(info.code, 0) << info.out;
  auto ij = nlohmann::json::parse(info.out, nullptr, false);
  ASSERT_TRUE(ij.is_object()) << info.out;
  std::set<uint64_t> held;
  for (const auto& b : ij["block_list"]) {
    if (b["cached"].get<bool>()) held.insert(b["index"].get<uint64_t>());
  }
  EXPECT_EQ(held, (std::set<uint64_t>{3, 11, 17, 29})) << info.out;
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// A file re-opened at the same version is served by the kernel's page cache (no request reaches
// the worker) — in daemon mode through fuse.keep_cache, in kernel mode by the kernel's own opens;
// when the under-storage changes it, the next open drops those pages and reads the new bytes.
// attr_timeout 0 makes every open ask for fresh attributes; the dentry is kept (entry_timeout 60s):
// with entry_timeout 0 the kernel may drop the dentry, and with it the inode and its pages, at the
// first close (FUSE evicts an inode as soon as its last reference goes). The worker's reads are
// counted from its live /metrics: `granary report` carries the last heartbeat's counters, so a
// count taken from it right after the first read could miss some of that read's blocks — which is
// what made this test fail on some machines ("5 where 2 and 4 were expected").
TEST(KeepCache, PagesSurviveReopensUntilTheVersionChanges) {
  for (const char* mode : {"daemon", "kernel"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    WriteFile(dir / "src/f.bin", RandomBytes(300000, 1));
    ClusterOptions opts;
    opts.keep_cache = true;
    opts.fuse_args = {"--fuse.attr_timeout", "0s", "--fuse.entry_timeout", "60s", "--fuse.open", mode};
    LocalCluster c(dir, opts);
    std::string why;
    ASSERT_TRUE(c.StartDaemons(&why)) << why;
    ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src", "-o", "metadata.sync_interval=always"}).code, 0);
    ASSERT_TRUE(c.StartFuse(&why)) << why;
    std::string f = c.mountpoint() + "/ds/f.bin", got;
    ASSERT_TRUE(ReadFileChecked(f, &got));
    EXPECT_EQ(got, ReadFile(dir / "src/f.bin"));
    // The worker's own /metrics, which are live (`granary report` shows the last heartbeat's).
    auto worker_reads = [&] {
      return c.Metric("worker", "granary_worker_cache_misses_total") +
             c.Metric("worker", "granary_worker_block_reads_total{source=\"cache\"}") +
             c.Metric("worker", "granary_worker_block_reads_total{source=\"zero_copy\"}");
    };
    double reads = worker_reads();
    EXPECT_GT(reads, 0);
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(ReadFileChecked(f, &got));
      EXPECT_EQ(got, ReadFile(dir / "src/f.bin"));
    }
    EXPECT_EQ(worker_reads(), reads) << "re-reads should not reach the worker";

    std::string v2 = RandomBytes(300000, 2);  // same size, new bytes and mtime
    WriteFile(dir / "src/f.bin", v2);
    ASSERT_TRUE(ReadFileChecked(f, &got));
    EXPECT_EQ(got, v2) << "the page cache kept the old version";
    ASSERT_TRUE(c.StopAll(&why)) << why;
  }
}

}  // namespace
}  // namespace granary::testing

namespace granary::testing {
namespace {

// fuse.source_reads (fuse/source_reads.h): cold random reads of a local under-storage read by
// granary-fuse from the file itself, with the bytes, the worker's fills and a file changed under
// an open all checked.
class SourceReadsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    want_ = RandomBytes(16 << 20, 41);  // 4 blocks of 4 MiB: reads inside a block go range first
    WriteFile(dir_ / "src/big.bin", want_);
    std::string why;
    ASSERT_TRUE(cluster_.StartDaemons(&why)) << why;
    RunResult m = cluster_.Cli({"mount", "/ds", "file://" + dir_ / "src"});
    ASSERT_EQ(m.code, 0) << m.out;
    ASSERT_TRUE(cluster_.StartFuse(&why)) << why;
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.Logs();
  }
  double SourcePieces() { return cluster_.Metric("fuse", "granary_fuse_read_pieces_total{source=\"source\"}"); }
  static ClusterOptions Options(bool on) {
    ClusterOptions o;
    o.block_size = "4Mi";
    if (!on) o.fuse_args = {"--fuse.source_reads", "false"};
    return o;
  }

  std::string want_;
  TempDir dir_;
  LocalCluster cluster_{dir_, Options(GetParam())};
};

TEST_P(SourceReadsTest, RandomReadsReturnTheSourceBytesAndTheWorkerStillFillsHotBlocks) {
  const bool on = GetParam();
  int fd = open((cluster_.mountpoint() + "/ds/big.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::mt19937_64 rng(5);
  for (int i = 0; i < 400; ++i) {
    const uint64_t off = 4096 + rng() % (want_.size() - 8192);
    std::string buf(4096, '\0');
    ASSERT_EQ(pread(fd, buf.data(), buf.size(), static_cast<off_t>(off)), 4096) << "offset " << off;
    ASSERT_EQ(buf, want_.substr(off, 4096)) << "offset " << off;
  }
  // Reads across a block boundary: two pieces, each the worker's or granary-fuse's own, put
  // together in one reply.
  for (uint64_t b = 1; b < 4; ++b) {
    for (uint64_t before : {uint64_t{4096}, uint64_t{100000}, uint64_t{196608}}) {
      const uint64_t off = b * (4 << 20) - before;
      std::string buf(200000, '\0');
      ASSERT_EQ(pread(fd, buf.data(), buf.size(), static_cast<off_t>(off)), static_cast<ssize_t>(buf.size()));
      ASSERT_EQ(buf, want_.substr(off, buf.size())) << "offset " << off;
    }
  }
  close(fd);
  if (on) {
    EXPECT_GT(SourcePieces(), 0) << "no read was served from the source file by granary-fuse";
  } else {
    EXPECT_EQ(SourcePieces(), 0);
  }
  // Every block was touched again and again: the worker's policy filled them all the same.
  EXPECT_TRUE(WaitFor([&] {
    uint64_t hits = 0, misses = 0, ufs_bytes = 0;
    return cluster_.WorkerCounters(&hits, &misses, &ufs_bytes) && ufs_bytes >= want_.size();
  })) << "the worker did not fill the blocks read at random";
}

// A random READ across a block boundary: with source reads on, both pieces are granary-fuse's own
// (the second starts at the next block's offset 0, but the READ is marked random, so it is not taken
// for a sequential reader's block start), read in place into one reply.
TEST_P(SourceReadsTest, AReadAcrossABlockBoundaryIsPutTogetherFromTwoPieces) {
  int fd = open((cluster_.mountpoint() + "/ds/big.bin").c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  const size_t len = 49 * 4096;
  void* mem = nullptr;
  ASSERT_EQ(posix_memalign(&mem, 4096, len), 0);
  std::unique_ptr<char, decltype(&free)> buf(static_cast<char*>(mem), &free);
  // The first read brings the file (the worker answers it range first).
  ASSERT_EQ(pread(fd, buf.get(), 4096, 64 << 10), 4096);
  ASSERT_EQ(std::string(buf.get(), 4096), want_.substr(64 << 10, 4096));
  const uint64_t off = (8 << 20) - (96 << 10);  // 96 KiB of block 1, then 100 KiB of block 2
  ASSERT_EQ(pread(fd, buf.get(), len, static_cast<off_t>(off)), static_cast<ssize_t>(len));
  EXPECT_EQ(std::string(buf.get(), len), want_.substr(off, len)) << "bytes out of place in the reply";
  close(fd);
  EXPECT_EQ(SourcePieces(), GetParam() ? 2 : 0) << "both pieces of the crossing read are granary-fuse's own";
}

TEST_P(SourceReadsTest, AFileRewrittenUnderAnOpenNeverMixesVersions) {
  // O_DIRECT: each pread is one READ of exactly its range (no page cache, no kernel readahead).
  int fd = open((cluster_.mountpoint() + "/ds/big.bin").c_str(), O_RDONLY | O_DIRECT);
  ASSERT_GE(fd, 0);
  void* mem = nullptr;
  ASSERT_EQ(posix_memalign(&mem, 4096, 4096), 0);
  std::unique_ptr<char, decltype(&free)> buf(static_cast<char*>(mem), &free);
  auto read_at = [&](uint64_t off) { return pread(fd, buf.get(), 4096, static_cast<off_t>(off)); };
  // A read inside block 1 (range first): with source reads on, the worker's answer brings the file,
  // and the next reads inside uncached blocks — block 1 again, and block 3, never asked of the
  // worker — are granary-fuse's own. (Inside a block, never at its start: a read there would fetch
  // the block whole. The worker hears of the touches; block 1's second queues its fill, which may
  // or may not be done when the file changes below.)
  for (uint64_t off : {uint64_t{(4 << 20) + (64 << 10)}, uint64_t{(4 << 20) + (128 << 10)}, uint64_t{(12 << 20) + (32 << 10)}}) {
    ASSERT_EQ(read_at(off), 4096) << "offset " << off;
    ASSERT_EQ(std::string(buf.get(), 4096), want_.substr(off, 4096)) << "offset " << off;
  }
  EXPECT_EQ(SourcePieces(), GetParam() ? 2 : 0) << "the reads after the first are granary-fuse's own";
  // Rewritten in place: same size, other bytes, another modification time.
  std::string changed = want_;
  for (size_t i = 0; i < changed.size(); i += 512) changed[i] = static_cast<char>(changed[i] ^ 0x5a);
  int w = open((dir_ / "src/big.bin").c_str(), O_WRONLY);
  ASSERT_GE(w, 0);
  ASSERT_EQ(pwrite(w, changed.data(), changed.size(), 0), static_cast<ssize_t>(changed.size()));
  struct timespec t[2] = {{0, UTIME_OMIT}, {1, 0}};
  ASSERT_EQ(futimens(w, t), 0);
  close(w);
  std::vector<bool> failed;
  // Block 1 again: with source reads on the source file's change is seen at once and the read goes
  // to the worker; the worker which serves its fill of the old version
  // if it is done and else reads the changed file. Then block 2 from its start (fetched whole).
  for (uint64_t off : {uint64_t{(4 << 20) + (16 << 10)}, uint64_t{(4 << 20) + (256 << 10)}, uint64_t{8 << 20}}) {
    ssize_t n = read_at(off);
    failed.push_back(n < 0);
    if (n < 0) {
      EXPECT_EQ(errno, ESTALE) << "offset " << off;
      continue;
    }
    ASSERT_EQ(n, 4096);
    EXPECT_EQ(std::string(buf.get(), 4096), want_.substr(off, 4096)) << "offset " << off << ": bytes of another version";
  }
  close(fd);
  // With source reads on, the change is seen at the next read, which then goes to the worker: old
  // bytes from its fill, or ESTALE — never the new bytes (checked above).
  EXPECT_TRUE(failed[2]) << "block 2 was fetched from a changed file";
  EXPECT_EQ(SourcePieces(), GetParam() ? 2 : 0);
}

INSTANTIATE_TEST_SUITE_P(OnAndOff, SourceReadsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "On" : "Off"; });

}  // namespace
}  // namespace granary::testing
