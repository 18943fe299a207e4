// The read modes of a FUSE mount (fuse.open: kernel, passthrough, daemon) through real processes
// and a real mount: the bytes through read, pread and mmap, a file that changes in the
// under-storage, reads with no open file (kernel mode), and what passthrough opens hold.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

// Compares a file through the mount against `want` with whole reads, random preads and mmap; ""
// when equal, else what differed.
std::string Mismatch(const std::string& path, const std::string& want, uint32_t seed) {
  std::string got;
  if (!ReadFileChecked(path, &got)) return path + ": read failed: " + strerror(errno);
  if (got != want) return path + ": read returned other bytes";
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) return path + ": open failed";
  std::mt19937 rng(seed);
  std::string buf;
  for (int i = 0; i < 40 && !want.empty(); ++i) {
    size_t off = rng() % want.size();
    size_t len = 1 + rng() % 9000;
    buf.assign(len, '\0');
    ssize_t n = pread(fd, buf.data(), len, static_cast<off_t>(off));
    size_t expect = std::min(len, want.size() - off);
    if (n != static_cast<ssize_t>(expect) || buf.compare(0, expect, want, off, expect) != 0) {
      close(fd);
      return path + ": pread at " + std::to_string(off) + " returned other bytes";
    }
  }
  if (!want.empty()) {
    void* m = mmap(nullptr, want.size(), PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      return path + ": mmap failed: " + strerror(errno);
    }
    bool same = std::memcmp(m, want.data(), want.size()) == 0;
    munmap(m, want.size());
    if (!same) {
      close(fd);
      return path + ": mmap shows other bytes";
    }
  }
  close(fd);
  return "";
}

ClusterOptions ModeOptions(const std::string& mode, std::vector<std::string> more = {}) {
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", mode};
  o.fuse_args.insert(o.fuse_args.end(), more.begin(), more.end());
  return o;
}

double Opens(LocalCluster& c, const char* mode) {
  return c.Metric("fuse", std::string("granary_fuse_opens_total{mode=\"") + mode + "\"}");
}

// Small files (one 64 KiB block), a file of several blocks and an empty file give exactly the
// source's bytes in every mode, cold and warm; each mode serves them the way it says.
class ReadModes : public ::testing::TestWithParam<std::string> {};

TEST_P(ReadModes, BytesAreTheSourcesThroughReadPreadAndMmap) {
  const std::string mode = GetParam();
  TempDir dir;
  std::map<std::string, std::string> files;
  for (int i = 0; i < 12; ++i) files["small/img" + std::to_string(i) + ".jpg"] = RandomBytes(1 + i * 5400, i);
  files["big.bin"] = RandomBytes(64 * 1024 * 5 + 77, 99);
  files["empty.bin"] = "";
  for (const auto& [name, bytes] : files) WriteFile(dir / ("src/" + name), bytes);
  LocalCluster c(dir, ModeOptions(mode));
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  for (int pass = 0; pass < 2; ++pass) {  // cold, then warm
    for (const auto& [name, bytes] : files) {
      EXPECT_EQ(Mismatch(c.mountpoint() + "/ds/" + name, bytes, pass * 1000 + name.size()), "") << mode << " pass " << pass;
    }
  }
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_open_mode{mode=\"" + mode + "\",fallback=\"0\"}"), 1) << c.Logs();
  if (mode == "kernel") {
    EXPECT_GE(Opens(c, "kernel"), 1);  // answered ENOSYS once; the kernel opens every file itself after that
    EXPECT_EQ(Opens(c, "daemon"), 0);
    EXPECT_GT(c.Metric("fuse", "granary_fuse_reads_by_inode_total"), 0);
  } else if (mode == "passthrough") {
    EXPECT_GT(Opens(c, "passthrough"), 0);
    // Once cached, every file — one block or several — is opened on its cache data file: no read
    // reaches granary-fuse any more.
    double read_bytes = c.Metric("fuse", "granary_fuse_read_bytes_total");
    double misses = c.Metric("fuse", "granary_fuse_passthrough_misses_total");
    for (const auto& [name, bytes] : files) EXPECT_EQ(Mismatch(c.mountpoint() + "/ds/" + name, bytes, 7), "");
    EXPECT_EQ(c.Metric("fuse", "granary_fuse_read_bytes_total"), read_bytes)
        << "a passthrough read reached granary-fuse";
    EXPECT_EQ(c.Metric("fuse", "granary_fuse_passthrough_misses_total"), misses + 2) << "only the empty file (opened twice)";
  } else {
    EXPECT_GT(Opens(c, "daemon"), 0);
    EXPECT_EQ(Opens(c, "passthrough"), 0);
    EXPECT_EQ(Opens(c, "kernel"), 0);
  }
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// A file rewritten in the under-storage shows its new bytes, whole, after the sync interval and
// attr_timeout (both 0 here) in every mode: never the old pages, never a mix.
TEST_P(ReadModes, AChangedFileShowsItsNewBytes) {
  const std::string mode = GetParam();
  TempDir dir;
  std::string small1 = RandomBytes(40000, 1), big1 = RandomBytes(200000, 2);
  WriteFile(dir / "src/small.bin", small1);
  WriteFile(dir / "src/big.bin", big1);
  LocalCluster c(dir, ModeOptions(mode, {"--fuse.attr_timeout", "0s", "--fuse.entry_timeout", "0s"}));
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src", "-o", "metadata.sync_interval=always"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Mismatch(c.mountpoint() + "/ds/small.bin", small1, 1), "");
    EXPECT_EQ(Mismatch(c.mountpoint() + "/ds/big.bin", big1, 2), "");
  }
  // Same sizes, new bytes and mtimes.
  std::string small2 = RandomBytes(40000, 3), big2 = RandomBytes(200000, 4);
  WriteFile(dir / "src/small.bin", small2);
  WriteFile(dir / "src/big.bin", big2);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Mismatch(c.mountpoint() + "/ds/small.bin", small2, 5), "") << mode << " kept the old version";
    EXPECT_EQ(Mismatch(c.mountpoint() + "/ds/big.bin", big2, 6), "") << mode << " kept the old version";
  }
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// A file read again and again while whole in the local cache (random keys, memmap windows) is
// leased once and read by granary-fuse from the cache's data file (fuse/read_leases.h): the same
// bytes, no worker round trip per READ — also while a `granary free` of it waits for the lease.
// (Not passthrough: its READs never reach granary-fuse.)
class DaemonServedModes : public ::testing::TestWithParam<std::string> {};

TEST_P(DaemonServedModes, RepeatedReadsOfACachedFileComeFromAReadLease) {
  const std::string mode = GetParam();
  TempDir dir;
  const std::string want = RandomBytes(16 * 1024 * 1024 + 1234, 7);  // random reads jump MiBs
  WriteFile(dir / "src/db.bin", want);
  LocalCluster c(dir, ModeOptions(mode));
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  const std::string path = c.mountpoint() + "/ds/db.bin";
  std::string got;
  ASSERT_TRUE(ReadFileChecked(path, &got));  // cold: cached by the worker
  ASSERT_EQ(got, want);
  // Blocks read ahead are written to the cache in the background: the lease needs all 5 there.
  ASSERT_TRUE(WaitFor([&] { return c.Metric("worker", "granary_worker_cache_blocks{tier=\"SSD\",level=\"0\"}") >= 5; }))
      << "the file was not cached whole\n" << c.Logs();
  auto random_reads = [&](uint32_t seed) -> std::string {
    int fd = open(path.c_str(), O_RDONLY | O_DIRECT);  // every READ reaches granary-fuse
    if (fd < 0) return std::string("open: ") + strerror(errno);
    void* buf = nullptr;
    if (posix_memalign(&buf, 4096, 8192) != 0) return "posix_memalign";
    std::mt19937 rng(seed);
    std::string err;
    for (int i = 0; i < 200 && err.empty(); ++i) {
      off_t off = static_cast<off_t>((rng() % (want.size() / 4096)) * 4096);
      ssize_t n = pread(fd, buf, 8192, off);
      size_t expect = std::min<size_t>(8192, want.size() - static_cast<size_t>(off));
      if (n != static_cast<ssize_t>(expect) || std::memcmp(buf, want.data() + off, expect) != 0) {
        err = "pread at " + std::to_string(off) + " returned other bytes";
      }
    }
    free(buf);
    close(fd);
    return err;
  };
  EXPECT_EQ(random_reads(1), "");
  // The fourth far jump asked for the lease, after its reply; the READs that came while the worker
  // checked the file's chunks went to it. Once granted, every READ is the lease's. (How many of the
  // first 200 came after the grant depends on the machine's speed: a loaded one may verify the
  // chunks after all of them, so only the second pass is counted.)
  ASSERT_TRUE(WaitFor([&] { return c.Metric("fuse", "granary_fuse_read_leases") == 1; }))
      << "no read lease after 200 random reads\n" << c.Logs();
  const double before = c.Metric("fuse", "granary_fuse_leased_reads_total");
  EXPECT_EQ(random_reads(3), "");
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_leased_reads_total") - before, 200)
      << "a READ of a leased file did not come from the lease (pieces: "
      << c.Metric("fuse", "granary_fuse_read_pieces_total{source=\"zero_copy\"}") << " zero-copy, "
      << c.Metric("fuse", "granary_fuse_read_pieces_total{source=\"source\"}") << " from the source)\n"
      << c.Logs();
  // Freed while leased: the worker lets the blocks go when the lease ends; until then the bytes
  // read are still the file's.
  ASSERT_EQ(c.Cli({"free", "/ds"}).code, 0);
  EXPECT_EQ(random_reads(2), "");
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

INSTANTIATE_TEST_SUITE_P(Modes, ReadModes, ::testing::Values("kernel", "passthrough", "daemon"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Modes, DaemonServedModes, ::testing::Values("kernel", "daemon"),
                         [](const auto& info) { return info.param; });

// Kernel mode: reads come with no open file, so granary-fuse serves them by inode alone — also
// when it keeps nothing about the file (fuse.file_cache_entries 0) and the kernel dropped the pages.
TEST(KernelMode, AReadWithNoOpenFileWorksAfterGranaryFuseForgotTheFile) {
  TempDir dir;
  std::string data = RandomBytes(64 * 1024 * 3 + 5, 11);
  WriteFile(dir / "src/f.bin", data);
  LocalCluster c(dir, ModeOptions("kernel", {"--fuse.file_cache_entries", "0"}));
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  int fd = open((c.mountpoint() + "/ds/f.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string buf(data.size(), '\0');
  ASSERT_EQ(pread(fd, buf.data(), buf.size(), 0), static_cast<ssize_t>(data.size()));
  EXPECT_EQ(buf, data);
  double reads = c.Metric("fuse", "granary_fuse_reads_by_inode_total");
  EXPECT_GT(reads, 0);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);  // the kernel drops its pages
  buf.assign(1000, '\0');
  ASSERT_EQ(pread(fd, buf.data(), buf.size(), 130000), 1000);
  EXPECT_EQ(buf, data.substr(130000, 1000));
  EXPECT_GT(c.Metric("fuse", "granary_fuse_reads_by_inode_total"), reads) << "the re-read never reached granary-fuse";
  close(fd);
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

size_t DataFilesIn(const std::string& cache) {
  size_t n = 0;
  if (!fs::exists(cache + "/blocks")) return 0;
  for (const auto& e : fs::recursive_directory_iterator(cache + "/blocks")) {
    if (e.is_regular_file() && e.path().extension() != ".m") ++n;
  }
  return n;
}

// Whether the superblock of the mount at `mp` is read-only (/proc/self/mountinfo's super options),
// or with `mount_point` true, the mount point itself (its mount options).
bool SuperblockReadOnly(const std::string& mp, bool mount_point = false) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  bool ro = false;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, at, options;
    if (!(f >> id >> parent >> dev >> root >> at >> options) || at != mp) continue;
    if (mount_point) {
      ro = options == "ro" || options.rfind("ro,", 0) == 0;
      continue;
    }
    size_t dash = line.find(" - ");
    std::istringstream tail(line.substr(dash + 3));
    std::string type, source, super;
    tail >> type >> source >> super;
    ro = super == "ro" || super.rfind("ro,", 0) == 0;
  }
  return ro;
}

// Read-only datasets only: after the first passthrough open the superblock is read-only, so a
// passthrough read invalidates no atime and an fstat after it asks granary-fuse nothing. After a
// hand-over and a crash, a dataset mounted writable makes the mount writable at its first lookup,
// and a write there lands.
TEST(Passthrough, TheMountIsReadOnlyUntilAWritableDatasetIsShown) {
  TempDir dir;
  std::string data = RandomBytes(50000, 22);
  WriteFile(dir / "src/img.jpg", data);
  fs::create_directories(dir / "out");
  LocalCluster c(dir, ModeOptions("passthrough"));
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  const std::string mnt = c.mountpoint();
  EXPECT_FALSE(SuperblockReadOnly(mnt)) << "read-only before anything was opened";
  std::string path = mnt + "/ds/img.jpg";
  ASSERT_EQ(Mismatch(path, data, 3), "");
  if (Opens(c, "passthrough") == 0) GTEST_SKIP() << "this kernel serves no passthrough open here";
  ASSERT_TRUE(SuperblockReadOnly(mnt)) << c.Logs();
  EXPECT_FALSE(SuperblockReadOnly(mnt, /*mount_point=*/true))
      << "the mount point must stay rw: copies of it made by propagation follow only the superblock";
  const std::string getattrs = "granary_fuse_operation_duration_seconds_count{op=\"getattr\"}";
  const double before = c.Metric("fuse", getattrs);
  for (int i = 0; i < 5; ++i) {
    int fd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    std::string buf(data.size(), '\0');
    ASSERT_EQ(read(fd, buf.data(), buf.size()), static_cast<ssize_t>(data.size()));
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0);
    EXPECT_EQ(static_cast<size_t>(st.st_size), data.size());
    close(fd);
  }
  EXPECT_EQ(c.Metric("fuse", getattrs), before) << "an fstat after a passthrough read reached granary-fuse";

  // A successor of a hand-over, then a crash and restart: each learns the state from the kernel.
  ASSERT_TRUE(c.UpgradeFuse(&why)) << why;
  ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << why;
  EXPECT_TRUE(SuperblockReadOnly(mnt));
  ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "out", "-o", "write=through"}).code, 0);
  int fd = open((mnt + "/w/new.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << strerror(errno) << "\n" << c.Logs();
  ASSERT_EQ(write(fd, "written", 7), 7);
  ASSERT_EQ(close(fd), 0) << strerror(errno);
  EXPECT_EQ(ReadFile(dir / "out/new.txt"), "written");
  EXPECT_FALSE(SuperblockReadOnly(mnt));
  EXPECT_EQ(Mismatch(path, data, 4), "") << "reads go on";
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// Kernel mode with writes on (the default) and read-only datasets only: the first open goes
// open-free (answered ENOSYS, the superblock read-only first), so later opens, closes and warm
// re-reads send granary-fuse nothing. A dataset mounted writable gets a new connection at the
// mount point at its first lookup: the very first write there lands, while a file and a directory
// opened before go on reading through the old connection until closed, when it ends. Before the
// swap, a hand-over and a crash keep the connection open-free; after it, they keep the writable one.
TEST(KernelMode, ReadOnlyDatasetsOpenNothingUntilAWritableOneIsShown) {
  TempDir dir;
  std::string data = RandomBytes(50000, 23);
  WriteFile(dir / "src/img.jpg", data);
  WriteFile(dir / "src/sub/b.bin", RandomBytes(3000, 24));
  fs::create_directories(dir / "out");
  LocalCluster c(dir, ModeOptions("kernel"));
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  const std::string mnt = c.mountpoint();
  const std::string path = mnt + "/ds/img.jpg";
  ASSERT_EQ(Mismatch(path, data, 5), "");
  const double first_opens = Opens(c, "kernel");
  EXPECT_EQ(first_opens, 1) << "the first open is the one answered ENOSYS";
  EXPECT_TRUE(SuperblockReadOnly(mnt)) << c.Logs();
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_open_free"), 1);
  const std::string releases = "granary_fuse_operation_duration_seconds_count{op=\"release\"}";
  for (int i = 0; i < 5; ++i) ASSERT_EQ(Mismatch(path, data, 6 + i), "");
  EXPECT_EQ(Opens(c, "kernel"), first_opens) << "an open reached granary-fuse on an open-free connection";
  EXPECT_EQ(c.Metric("fuse", releases), 0);
  int probe = open(path.c_str(), O_WRONLY);
  EXPECT_LT(probe, 0);
  EXPECT_EQ(errno, EROFS) << "a write open of a read-only dataset is refused by the kernel";
  if (probe >= 0) close(probe);

  // A hand-over and a crash: each successor finds the connection open-free.
  ASSERT_TRUE(c.UpgradeFuse(&why)) << why;
  ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << why;
  ASSERT_EQ(Mismatch(path, data, 12), "");
  EXPECT_EQ(Opens(c, "kernel"), 0) << "the successor was asked to open";
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_open_free"), 1);

  // Opened before a dataset becomes writable: a file, and a directory (a working directory).
  // (O_CLOEXEC: the granary-fuse processes this test starts must not hold them too.)
  int held = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(held, 0);
  int dir_fd = open((mnt + "/ds").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dir_fd, 0);

  ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "out", "-o", "write=through"}).code, 0);
  int fd = open((mnt + "/w/new.txt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << "the first write after the dataset became writable: " << strerror(errno) << "\n" << c.Logs();
  ASSERT_EQ(write(fd, "written", 7), 7);
  ASSERT_EQ(close(fd), 0) << strerror(errno);
  EXPECT_EQ(ReadFile(dir / "out/new.txt"), "written");
  EXPECT_FALSE(SuperblockReadOnly(mnt));
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_connections_replaced_total"), 1);
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_open_free"), 0);
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_connections_draining"), 1);
  // An existing file rewritten in place (its OPEN with O_TRUNC reaches granary-fuse now).
  WriteFile(mnt + "/w/new.txt", "again");
  EXPECT_EQ(ReadFile(dir / "out/new.txt"), "again");

  // What was opened before reads on through the old connection, across a hand-over and a crash.
  auto held_reads = [&] {
    std::string buf(data.size(), '\0');
    if (pread(held, buf.data(), buf.size(), 0) != static_cast<ssize_t>(data.size())) {
      return std::string("pread: ") + strerror(errno);
    }
    if (buf != data) return std::string("other bytes");
    int via_dir = openat(dir_fd, "sub/b.bin", O_RDONLY | O_CLOEXEC);
    if (via_dir < 0) return std::string("openat in the directory opened before: ") + strerror(errno);
    std::string small(3000, '\0');
    ssize_t n = read(via_dir, small.data(), small.size());
    close(via_dir);
    if (n != 3000) return std::string("read through the directory opened before: ") + strerror(errno);
    return std::string();
  };
  EXPECT_EQ(held_reads(), "");
  ASSERT_TRUE(c.UpgradeFuse(&why)) << why;
  EXPECT_EQ(held_reads(), "") << "after a hand-over\n" << c.Logs();
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_connections_draining"), 1);
  ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << why;
  EXPECT_EQ(held_reads(), "") << "after a crash\n" << c.Logs();
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_connections_draining"), 1);
  EXPECT_EQ(Mismatch(path, data, 13), "") << "new opens read through the new connection";
  WriteFile(mnt + "/w/after.txt", "after");
  EXPECT_EQ(ReadFile(dir / "out/after.txt"), "after");
  EXPECT_FALSE(SuperblockReadOnly(mnt));
  close(held);
  close(dir_fd);
  ASSERT_TRUE(WaitFor([&] { return c.Metric("fuse", "granary_fuse_connections_draining") == 0; }))
      << "the old connection did not end after its last user went\n" << c.Logs();
  EXPECT_EQ(Mismatch(path, data, 14), "");
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// A passthrough open holds its cache file: freeing the dataset leaves it until the file is
// closed, and a worker killed with -9 (and restarted) costs the reader of an open file nothing.
TEST(Passthrough, AnOpenFileKeepsItsCacheFileThroughAFreeAndAWorkerKill) {
  TempDir dir;
  std::string data = RandomBytes(50000, 21);
  WriteFile(dir / "src/img.jpg", data);
  // A closed file keeps its backing file for a reopen for attr_timeout (then the free completes).
  LocalCluster c(dir, ModeOptions("passthrough", {"--fuse.attr_timeout", "1s"}));
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  std::string path = c.mountpoint() + "/ds/img.jpg";
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(Opens(c, "passthrough"), 1) << c.Logs();
  std::string buf(data.size(), '\0');
  ASSERT_EQ(pread(fd, buf.data(), buf.size(), 0), static_cast<ssize_t>(data.size()));
  EXPECT_EQ(buf, data);
  ASSERT_EQ(DataFilesIn(dir / "cache"), 1u);

  RunResult freed = c.Cli({"free", "/ds"});
  ASSERT_EQ(freed.code, 0) << freed.out;
  EXPECT_EQ(DataFilesIn(dir / "cache"), 1u) << "a block under a passthrough open was removed";
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  ASSERT_EQ(pread(fd, buf.data(), buf.size(), 0), static_cast<ssize_t>(data.size()));
  EXPECT_EQ(buf, data);
  close(fd);
  EXPECT_TRUE(WaitFor([&] { return DataFilesIn(dir / "cache") == 0; })) << "the freed block outlived its last open";

  // An open file, then the worker killed: reads, preads and mmap go on from the cache file.
  fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(Opens(c, "passthrough"), 2);
  c.KillWorker();
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) {
    size_t off = rng() % data.size(), len = 1 + rng() % 4000;
    std::string part(len, '\0');
    ssize_t n = pread(fd, part.data(), len, static_cast<off_t>(off));
    size_t expect = std::min(len, data.size() - off);
    ASSERT_EQ(n, static_cast<ssize_t>(expect)) << "pread at " << off << ": " << strerror(errno);
    ASSERT_EQ(part.substr(0, expect), data.substr(off, expect));
  }
  void* m = mmap(nullptr, data.size(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(m, MAP_FAILED);
  EXPECT_EQ(std::memcmp(m, data.data(), data.size()), 0);
  munmap(m, data.size());
  close(fd);
  ASSERT_TRUE(c.RestartWorker(&why)) << why;
  EXPECT_EQ(Mismatch(path, data, 9), "");
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// Without CAP_SYS_ADMIN in the initial user namespace (here: granary-fuse in a user namespace of
// its own, root only there) the kernel refuses backing files: the first open finds out, the mount
// goes on in kernel mode, says so once in its log and in /metrics, and no read fails.
TEST(Passthrough, RefusedBackingFilesFallBackToKernelModeWithoutAnError) {
  TempDir dir;
  std::map<std::string, std::string> files;
  for (int i = 0; i < 6; ++i) files["img" + std::to_string(i) + ".jpg"] = RandomBytes(3000 + i * 7000, 30 + i);
  for (const auto& [name, bytes] : files) WriteFile(dir / ("src/" + name), bytes);
  ClusterOptions o = ModeOptions("passthrough");
  o.fuse_wrapper = {"unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"};
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  // The mount lives in granary-fuse's mount namespace: read it from there.
  std::string script;
  for (const auto& [name, bytes] : files) {
    script += "cmp " + c.mountpoint() + "/ds/" + name + " " + dir / ("src/" + name) + " && ";
  }
  for (int pass = 0; pass < 2; ++pass) {
    RunResult r = RunCommand({"nsenter", "--target", std::to_string(c.fuse_pid()), "--user", "--mount",
                              "--preserve-credentials", "sh", "-c", script + "echo same"});
    EXPECT_EQ(r.code, 0) << r.out << c.Logs();
    EXPECT_NE(r.out.find("same"), std::string::npos) << r.out;
  }
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_open_mode{mode=\"kernel\",fallback=\"1\"}"), 1) << c.Logs();
  EXPECT_EQ(Opens(c, "passthrough"), 0);
  EXPECT_GE(Opens(c, "kernel"), 1);
  EXPECT_NE(ReadFile(dir / "fuse.log").find("refused a backing file"), std::string::npos);
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_errors_total{op=\"read\",errno=\"EIO\"}"), -1) << "a read failed";
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

}  // namespace
}  // namespace granary::testing
