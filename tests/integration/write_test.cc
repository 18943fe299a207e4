// Writes through a real mount (mount option write=through|back; docs/semantics.md, "Writes"): every
// supported call, the refusals, granary-fuse and the worker killed mid-write, the store failing,
// a full staging disk, and what the report and /metrics show. The under-storage is a local
// directory here; tests/integration/s3_test.cc runs the same calls on Ceph RGW.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

// Writes `data` to `path` with open(O_CREAT|O_TRUNC), write and close; the errno of the first call
// that failed (0: none).
int WriteWhole(const std::string& path, const std::string& data, bool fsync_first = false) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return errno;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, std::min<size_t>(data.size() - done, 1 << 20));
    if (n < 0) {
      int err = errno;
      close(fd);
      return err;
    }
    done += static_cast<size_t>(n);
  }
  if (fsync_first && fsync(fd) != 0) {
    int err = errno;
    close(fd);
    return err;
  }
  return close(fd) == 0 ? 0 : errno;
}

struct Modes {
  const char* write;  // mount option write=
  const char* open;   // fuse.open
};

class WriteCalls : public ::testing::TestWithParam<Modes> {};

// Every supported call, through the mount, in each write mode and read mode; what the store holds
// afterwards; the refusals.
TEST_P(WriteCalls, EverySupportedCallLandsWholeInTheStore) {
  TempDir dir;
  fs::create_directories(dir / "src/existing");
  WriteFile(dir / "src/existing/old.bin", "old bytes");
  fs::create_directories(dir / "ro");
  WriteFile(dir / "ro/r.txt", "read only");
  ClusterOptions opts;
  opts.fuse_args = {"--fuse.open", GetParam().open};
  LocalCluster c(dir, opts);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  RunResult m = c.Cli({"mount", "/w", "file://" + dir / "src", "-o", std::string("write=") + GetParam().write});
  ASSERT_EQ(m.code, 0) << m.out;
  ASSERT_EQ(c.Cli({"mount", "/r", "file://" + dir / "ro"}).code, 0);
  const std::string mnt = c.mountpoint();
  const bool back = std::string(GetParam().write) == "back";
  // The store has `rel` with `data` (write=back: once uploaded).
  auto in_store = [&](const std::string& rel, const std::string& data) {
    return WaitFor([&] { return fs::exists(dir / ("src/" + rel)) && ReadFile(dir / ("src/" + rel)) == data; },
                   std::chrono::seconds(back ? 30 : 1));
  };

  // A new file, several parts of it (a multi-block file: the block size is 64Ki here).
  const std::string big = RandomBytes(3'000'000, 7);
  ASSERT_EQ(WriteWhole(mnt + "/w/ckpt.pt", big), 0);
  if (!back) {
    EXPECT_EQ(ReadFile(dir / "src/ckpt.pt"), big) << "write=through: whole in the store when close() returns";
  }
  EXPECT_TRUE(in_store("ckpt.pt", big));
  EXPECT_EQ(Sha256File(mnt + "/w/ckpt.pt"), Sha256File(dir / "src/ckpt.pt")) << "read back through the mount";
  struct stat st;
  ASSERT_EQ(stat((mnt + "/w/ckpt.pt").c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), big.size());
  for (const auto& e : fs::directory_iterator(dir / "src")) {
    EXPECT_EQ(e.path().filename().string().rfind(".granary-writing-", 0), std::string::npos)
        << "a temporary file left in the store: " << e.path();
  }

  // Replaced whole (O_TRUNC), an empty file, a file made durable with fsync before close.
  ASSERT_EQ(WriteWhole(mnt + "/w/existing/old.bin", "new bytes, longer than before"), 0);
  EXPECT_TRUE(in_store("existing/old.bin", "new bytes, longer than before"));
  EXPECT_EQ(ReadFile(mnt + "/w/existing/old.bin"), "new bytes, longer than before");
  ASSERT_EQ(WriteWhole(mnt + "/w/empty", ""), 0);
  EXPECT_TRUE(in_store("empty", ""));
  ASSERT_EQ(WriteWhole(mnt + "/w/synced.bin", "synced", /*fsync_first=*/true), 0);
  EXPECT_EQ(ReadFile(dir / "src/synced.bin"), "synced") << "fsync returns once the file is in the store, in both modes";

  // Directories, renames, removals.
  ASSERT_EQ(mkdir((mnt + "/w/out").c_str(), 0755), 0) << strerror(errno);
  EXPECT_TRUE(fs::is_directory(dir / "src/out"));
  EXPECT_EQ(mkdir((mnt + "/w/out").c_str(), 0755), -1);
  EXPECT_EQ(errno, EEXIST);
  ASSERT_EQ(rename((mnt + "/w/ckpt.pt").c_str(), (mnt + "/w/out/final.pt").c_str()), 0) << strerror(errno);
  EXPECT_FALSE(fs::exists(dir / "src/ckpt.pt"));
  EXPECT_EQ(Sha256File(dir / "src/out/final.pt"), Sha256File(mnt + "/w/out/final.pt")) << c.Logs();
  EXPECT_EQ(ReadFile(mnt + "/w/out/final.pt"), big);
  EXPECT_FALSE(fs::exists(mnt + "/w/ckpt.pt"));
  EXPECT_EQ(rmdir((mnt + "/w/out").c_str()), -1);
  EXPECT_EQ(errno, ENOTEMPTY);
  ASSERT_EQ(unlink((mnt + "/w/out/final.pt").c_str()), 0) << strerror(errno);
  EXPECT_FALSE(fs::exists(dir / "src/out/final.pt"));
  ASSERT_EQ(rmdir((mnt + "/w/out").c_str()), 0) << strerror(errno);
  EXPECT_FALSE(fs::exists(dir / "src/out"));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(mnt + "/w")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"empty", "existing", "synced.bin"}));

  // Refusals: an append or a write into part of an existing file (EOPNOTSUPP, with a log line
  // saying what to do), a truncate of a closed file; anything below a read-only mount (EROFS).
  int fd = open((mnt + "/w/synced.bin").c_str(), O_WRONLY | O_APPEND);
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(truncate((mnt + "/w/synced.bin").c_str(), 2), -1);
  EXPECT_EQ(errno, EOPNOTSUPP);
  EXPECT_EQ(ReadFile(dir / "src/synced.bin"), "synced") << "a refused call changed the store";
  EXPECT_EQ(WriteWhole(mnt + "/r/new.txt", "x"), EROFS);
  EXPECT_EQ(WriteWhole(mnt + "/r/r.txt", "x"), EROFS);
  EXPECT_EQ(mkdir((mnt + "/r/d").c_str(), 0755), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(unlink((mnt + "/r/r.txt").c_str()), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(ReadFile(dir / "ro/r.txt"), "read only");
  EXPECT_NE(ReadFile(dir / "fuse.log").find("Granary writes whole files"), std::string::npos)
      << "the refusal's log line says what to do";

  // What was written is cached: the report counts it and reading it back is a hit.
  if (!back) {
    nlohmann::json r;
    ASSERT_TRUE(WaitFor([&] {
      r = c.Report();
      for (const auto& mj : r["mounts"]) {
        if (mj["path"] == "/w" && mj["cached_bytes"].get<uint64_t>() >= 29) return true;
      }
      return false;
    })) << r.dump(2);
  }
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

INSTANTIATE_TEST_SUITE_P(Modes, WriteCalls,
                         ::testing::Values(Modes{"through", "daemon"}, Modes{"back", "daemon"},
                                           Modes{"through", "kernel"}, Modes{"back", "passthrough"}),
                         [](const auto& info) {
                           return std::string(info.param.write) + "_" + info.param.open;
                         });

// write=through streams the part written in order while the writer goes on; a write behind what
// was streamed (here: the first bytes, rewritten at the end, as a zip writer patches a header far
// back) drops that upload and close() uploads the whole file: the store has exactly what was
// written, either way. A store that can take the staging file whole (a local folder on the
// staging filesystem: UnderFileSystem::Adopt) is never streamed to, so the store here is a folder
// on another filesystem (/dev/shm), as an NFS or object store would be.
TEST(Writes, ThroughModeStreamsAndAWriteBehindItStillLandsWhole) {
  TempDir dir;
  char shm[] = "/dev/shm/granary-stream-XXXXXX";
  if (mkdtemp(shm) == nullptr) GTEST_SKIP() << "no /dev/shm: " << strerror(errno);
  struct Cleanup {
    std::string path;
    ~Cleanup() { fs::remove_all(path); }
  } cleanup{shm};
  struct stat a {}, b {};
  ASSERT_EQ(stat(shm, &a), 0);
  ASSERT_EQ(stat(dir.path().c_str(), &b), 0);
  if (a.st_dev == b.st_dev) GTEST_SKIP() << "/dev/shm is on the test folder's filesystem: the store would adopt";
  const std::string src = std::string(shm) + "/src";
  fs::create_directories(src);
  LocalCluster c(dir, [&] {
    ClusterOptions o;
    o.extra_args = {"--ufs.local_roots", dir.path() + "," + shm};
    return o;
  }());
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  RunResult m = c.Cli({"mount", "/w", "file://" + src, "-o", "write=through"});
  ASSERT_EQ(m.code, 0) << m.out;
  for (bool rewrite_head : {false, true}) {
    SCOPED_TRACE(rewrite_head ? "head rewritten" : "in order");
    std::string data = RandomBytes(96 << 20, rewrite_head ? 2 : 1);
    const std::string path = c.mountpoint() + "/w/stream" + std::to_string(rewrite_head) + ".bin";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    for (size_t off = 0; off < data.size(); off += 1 << 20) {
      ASSERT_EQ(pwrite(fd, data.data() + off, 1 << 20, static_cast<off_t>(off)), 1 << 20);
    }
    if (rewrite_head) {
      std::string head(4096, 'H');
      ASSERT_EQ(pwrite(fd, head.data(), head.size(), 0), static_cast<ssize_t>(head.size()));
      data.replace(0, head.size(), head);
    }
    ASSERT_EQ(close(fd), 0) << strerror(errno);
    WriteFile(dir / "expected.bin", data);
    EXPECT_EQ(Sha256File(src + "/stream" + std::to_string(rewrite_head) + ".bin"), Sha256File(dir / "expected.bin"));
  }
  EXPECT_NE(ReadFile(dir / "worker.log").find("dropped"), std::string::npos) << "the rewrite did not drop the stream";
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// A writer killed with its granary-fuse: the file was never acknowledged and the store keeps its
// previous version (never a partial file); after the restart the file can be written again.
TEST(Writes, GranaryFuseKilledMidWriteLeavesThePreviousVersionWhole) {
  for (const char* mode : {"through", "back"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    fs::create_directories(dir / "src");
    WriteFile(dir / "src/ckpt.pt", "version one");
    LocalCluster c(dir);
    std::string why;
    ASSERT_TRUE(c.StartDaemons(&why)) << why;
    ASSERT_TRUE(c.StartFuse(&why)) << why;
    ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "src", "-o", std::string("write=") + mode}).code, 0);
    // A writer that writes 4 MiB, says so, and goes on writing until it is told to stop.
    WriteFile(dir / "writer.py",
              "import os, sys, time\n"
              "f = open(sys.argv[1], 'wb')\n"
              "f.write(os.urandom(4 << 20)); f.flush()\n"
              "open(sys.argv[2], 'w').write('started')\n"
              "try:\n"
              "    while not os.path.exists(sys.argv[3]):\n"
              "        f.write(os.urandom(64 << 10)); f.flush(); time.sleep(0.01)\n"
              "    f.close()\n"
              "    print('closed')\n"
              "except OSError as e:\n"
              "    print('error', e.errno)\n");
    Process writer({"/usr/bin/python3", dir / "writer.py", c.mountpoint() + "/w/ckpt.pt", dir / "started", dir / "stop"},
                   dir / "writer.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(dir / "started") || !writer.Running(); })) << writer.Log();
    ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << why;
    WriteFile(dir / "stop", "");
    ASSERT_TRUE(WaitFor([&] { return !writer.Running(); })) << writer.Log();
    EXPECT_NE(writer.Log().find("error"), std::string::npos) << "the interrupted file was acknowledged:\n"
                                                              << writer.Log();
    // The worker dropped the session: nothing staged remains, the store has the old version.
    EXPECT_TRUE(WaitFor([&] { return c.Metric("worker", "granary_worker_write_sessions") == 0; }));
    EXPECT_EQ(ReadFile(dir / "src/ckpt.pt"), "version one");
    for (const auto& e : fs::directory_iterator(dir / "src")) {
      EXPECT_EQ(e.path().filename().string(), "ckpt.pt") << "left in the store: " << e.path();
    }
    ASSERT_EQ(WriteWhole(c.mountpoint() + "/w/ckpt.pt", "version two"), 0);
    EXPECT_TRUE(WaitFor([&] { return ReadFile(dir / "src/ckpt.pt") == "version two"; }));
    EXPECT_TRUE(c.StopAll(&why)) << why;
  }
}

// The worker killed while a file is being written (both modes): granary-fuse keeps the bytes it
// staged (its descriptor of the staging file outlives the worker's session), starts a new session
// with the restarted worker at close, and the file lands whole.
TEST(Writes, AWorkerKilledMidWriteLosesNothingOnceItIsBack) {
  for (const char* mode : {"through", "back"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    fs::create_directories(dir / "src");
    LocalCluster c(dir);
    std::string why;
    ASSERT_TRUE(c.StartDaemons(&why)) << why;
    ASSERT_TRUE(c.StartFuse(&why)) << why;
    ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "src", "-o", std::string("write=") + mode}).code, 0);
    const std::string data = RandomBytes(6 << 20, 8);
    int fd = open((c.mountpoint() + "/w/ckpt.pt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0) << strerror(errno);
    ASSERT_EQ(write(fd, data.data(), 3 << 20), 3 << 20);
    c.KillWorker();
    ASSERT_TRUE(c.RestartWorker(&why)) << why;
    ASSERT_EQ(write(fd, data.data() + (3 << 20), 3 << 20), 3 << 20);
    ASSERT_EQ(close(fd), 0) << strerror(errno) << "\n" << c.Logs();
    EXPECT_TRUE(WaitFor([&] { return fs::exists(dir / "src/ckpt.pt") && ReadFile(dir / "src/ckpt.pt") == data; }))
        << c.Logs();
    EXPECT_TRUE(c.StopAll(&why)) << why;
  }
}

// A write needs the worker's local socket whatever the reads use: with fuse.zero_copy=false (every
// read over gRPC, so no read ever asks for the socket) a file is written as with the default.
TEST(Writes, AWriteFindsTheLocalSocketWhenReadsDoNotUseIt) {
  TempDir dir;
  fs::create_directories(dir / "src");
  WriteFile(dir / "src/in.bin", RandomBytes(100'000, 3));
  ClusterOptions opts;
  opts.fuse_args = {"--fuse.zero_copy", "false"};
  LocalCluster c(dir, opts);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "src", "-o", "write=through"}).code, 0);
  EXPECT_EQ(ReadFile(c.mountpoint() + "/w/in.bin"), ReadFile(dir / "src/in.bin"));
  const std::string data = RandomBytes(300'000, 4);
  ASSERT_EQ(WriteWhole(c.mountpoint() + "/w/out.bin", data), 0) << c.Logs();
  EXPECT_EQ(ReadFile(dir / "src/out.bin"), data);
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// The checkpoint pattern (write a temporary name, close, rename it over the final one) while the
// upload may still be pending (write=back), and a file removed while it is open for writing: the
// store ends as the namespace says, whatever order the upload and the rename or unlink come in.
TEST(Writes, RenameOrUnlinkWhileTheUploadIsPendingEndsAsTheNamespaceSays) {
  TempDir dir;
  fs::create_directories(dir / "src");
  WriteFile(dir / "src/final.pt", "the previous checkpoint");
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "src", "-o", "write=back"}).code, 0);
  const std::string data = RandomBytes(64 << 20, 12);
  ASSERT_EQ(WriteWhole(c.mountpoint() + "/w/tmp.pt", data), 0);
  ASSERT_EQ(rename((c.mountpoint() + "/w/tmp.pt").c_str(), (c.mountpoint() + "/w/final.pt").c_str()), 0)
      << strerror(errno);
  EXPECT_TRUE(WaitFor([&] {
    return !fs::exists(dir / "src/tmp.pt") && c.Metric("worker", "granary_worker_writeback_backlog_files") == 0 &&
           ReadFile(dir / "src/final.pt") == data;
  })) << c.Logs();
  EXPECT_EQ(Sha256File(c.mountpoint() + "/w/final.pt"), Sha256File(dir / "src/final.pt"));
  EXPECT_FALSE(fs::exists(c.mountpoint() + "/w/tmp.pt"));

  // Removed while open for writing: the store does not get it back at the close.
  int fd = open((c.mountpoint() + "/w/gone.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  ASSERT_EQ(write(fd, "bytes", 5), 5);
  ASSERT_EQ(unlink((c.mountpoint() + "/w/gone.bin").c_str()), 0) << strerror(errno);
  close(fd);
  EXPECT_TRUE(WaitFor([&] { return c.Metric("worker", "granary_worker_writeback_backlog_files") == 0; }));
  EXPECT_FALSE(fs::exists(dir / "src/gone.bin"));
  EXPECT_FALSE(fs::exists(c.mountpoint() + "/w/gone.bin"));
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// write=back: a file whose upload fails stays staged (the report and /metrics show the backlog),
// survives a kill -9 of the worker, and is uploaded whole once the store takes it.
TEST(Writes, BackModeBacklogSurvivesAWorkerKillAndIsUploaded) {
  TempDir dir;
  fs::create_directories(dir / "src/sub");
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "src", "-o", "write=back"}).code, 0);
  // The store loses the directory behind Granary's back once the file is open: its upload fails
  // until the directory is back.
  int fd = open((c.mountpoint() + "/w/sub/late.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  fs::remove_all(dir / "src/sub");
  const std::string data = RandomBytes(2'000'000, 3);
  ASSERT_EQ(write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(close(fd), 0) << "write=back acknowledges once staged: " << strerror(errno);
  EXPECT_TRUE(WaitFor([&] { return c.Metric("worker", "granary_worker_upload_failures_total") >= 1; })) << c.Logs();
  EXPECT_EQ(c.Metric("worker", "granary_worker_writeback_backlog_files"), 1);
  EXPECT_EQ(c.Metric("worker", "granary_worker_writeback_backlog_bytes"), static_cast<double>(data.size()));
  // An fsync of such a file would wait for the upload (WriteSessions::kSyncWait) and fail: not
  // exercised here, it takes a minute.
  RunResult report;
  EXPECT_TRUE(WaitFor([&] {  // as of the worker's next heartbeat
    report = c.Cli({"report"});
    return report.out.find("write-back backlog 1 files") != std::string::npos;
  })) << report.out;

  c.KillWorker();
  fs::create_directories(dir / "src/sub");
  ASSERT_TRUE(c.RestartWorker(&why)) << why;
  EXPECT_TRUE(WaitFor([&] { return fs::exists(dir / "src/sub/late.bin"); })) << c.Logs();
  EXPECT_EQ(ReadFile(dir / "src/sub/late.bin"), data);
  EXPECT_TRUE(WaitFor([&] { return c.Metric("worker", "granary_worker_writeback_backlog_files") == 0; }));
  EXPECT_EQ(Sha256File(c.mountpoint() + "/w/sub/late.bin"), Sha256File(dir / "src/sub/late.bin"));
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// write=through with the store failing: close() answers EIO (the cause logged) and the store keeps
// nothing of the file.
TEST(Writes, ThroughModeCloseFailsWithEioWhenTheStoreFails) {
  TempDir dir;
  fs::create_directories(dir / "src/sub");
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "src", "-o", "write=through"}).code, 0);
  int fd = open((c.mountpoint() + "/w/sub/x.bin").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << strerror(errno);
  fs::remove_all(dir / "src/sub");  // the store fails the upload
  ASSERT_EQ(write(fd, "bytes", 5), 5);
  EXPECT_EQ(close(fd), -1);
  EXPECT_EQ(errno, EIO);
  EXPECT_FALSE(fs::exists(dir / "src/sub"));
  EXPECT_NE(ReadFile(dir / "fuse.log").find("the file is not committed"), std::string::npos);
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// A staging disk that fills up gives the writer ENOSPC, and nothing of the file reaches the store.
TEST(Writes, AFullStagingDiskGivesTheWriterEnospc) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to mount a small tmpfs";
  TempDir dir;
  fs::create_directories(dir / "src");
  fs::create_directories(dir / "staging");
  ASSERT_EQ(mount("tmpfs", (dir / "staging").c_str(), "tmpfs", 0, "size=2m,mode=0700"), 0) << strerror(errno);
  struct Unmount {
    std::string path;
    ~Unmount() { umount2(path.c_str(), MNT_DETACH); }
  } unmount{dir / "staging"};
  ClusterOptions opts;
  opts.worker_args = {"--worker.staging_dir", dir / "staging"};
  {
    LocalCluster c(dir, opts);
    std::string why;
    ASSERT_TRUE(c.StartDaemons(&why)) << why;
    ASSERT_TRUE(c.StartFuse(&why)) << why;
    ASSERT_EQ(c.Cli({"mount", "/w", "file://" + dir / "src", "-o", "write=back"}).code, 0);
    EXPECT_EQ(WriteWhole(c.mountpoint() + "/w/big.bin", RandomBytes(4 << 20, 5)), ENOSPC) << ReadFile(dir / "fuse.log");
    EXPECT_FALSE(fs::exists(dir / "src/big.bin"));
    // Room again: the next write goes through.
    EXPECT_EQ(WriteWhole(c.mountpoint() + "/w/small.bin", "fits"), 0);
    EXPECT_TRUE(WaitFor([&] { return ReadFile(dir / "src/small.bin") == "fits"; }));
    EXPECT_TRUE(c.StopAll(&why)) << why;
  }
}

// ---- Issue 50: writes as an attacker on the node and as a careless user would make them ----

// Starts `c` and mounts `dir`/src at /w with write=`mode`; false, saying why, when it could not.
bool ServeWritable(LocalCluster& c, const TempDir& dir, const std::string& mode, std::string* why) {
  if (!c.StartDaemons(why) || !c.StartFuse(why)) return false;
  RunResult m = c.Cli({"mount", "/w", "file://" + dir / "src", "-o", "write=" + mode});
  if (m.code != 0) *why = "granary mount: " + m.out;
  return m.code == 0;
}

// A Python writer run as `uid` (gid the same): opens argv[1] ('w+b'), writes argv[2], says
// "started" in argv[3], waits for argv[4] to exist, writes argv[5], reads the whole file back
// through the same open (O_RDWR) and prints it with the outcome of close().
constexpr char kUserWriter[] =
    "import os, sys, time\n"
    "uid = int(sys.argv[6]); os.setgroups([]); os.setgid(uid); os.setuid(uid)\n"
    "try:\n"
    "    f = open(sys.argv[1], 'w+b')\n"
    "    f.write(sys.argv[2].encode()); f.flush()\n"
    "    open(sys.argv[3], 'w').write('started')\n"
    "    while not os.path.exists(sys.argv[4]): time.sleep(0.01)\n"
    "    f.write(sys.argv[5].encode()); f.flush()\n"
    "    f.seek(0); back = f.read()\n"
    "    f.close()\n"
    "    print('closed', back.decode(errors='replace'))\n"
    "except OSError as e:\n"
    "    print('error', e.errno, e)\n";

// A directory below `dir` owned by `uid`, mode 0700 (its parents traversable by everyone).
void OwnedDir(const std::string& path, uid_t uid) {
  fs::create_directories(path);
  ASSERT_EQ(chown(path.c_str(), uid, uid), 0);
  ASSERT_EQ(chmod(path.c_str(), 0700), 0);
}

// Finding 3: write handles restarted at 1 after a hand-over and were looked up by number only:
// writer A (uid 65534), open across the upgrade, wrote into writer B's (uid 1001) staging file.
// Now A's file goes on in the successor and nobody's handle names another's file.
TEST(WritesAsAnotherUser, WritersOpenAcrossAnUpgradeKeepWritingTheirOwnFiles) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: the writers are played by setuid";
  for (const char* mode : {"through", "back"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
    fs::create_directories(dir / "src");
    ASSERT_EQ(chmod((dir / "src").c_str(), 0755), 0);
    OwnedDir(dir / "src/a", 65534);
    OwnedDir(dir / "src/b", 1001);
    WriteFile(dir / "writer.py", kUserWriter);
    fs::create_directories(dir / "sig");  // where the writers say they started
    ASSERT_EQ(chmod((dir / "sig").c_str(), 01777), 0);
    LocalCluster c(dir);
    std::string why;
    ASSERT_TRUE(ServeWritable(c, dir, mode, &why)) << why;
    const std::string w = c.mountpoint() + "/w";
    Process a({"/usr/bin/python3", dir / "writer.py", w + "/a/fa.bin", "A-first;", dir / "sig/a.started", dir / "sig/go",
               "A-second", "65534"},
              dir / "a.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(dir / "sig/a.started") || !a.Running(); })) << a.Log();
    ASSERT_TRUE(c.UpgradeFuse(&why)) << why;
    Process b({"/usr/bin/python3", dir / "writer.py", w + "/b/fb.bin", "B-private;", dir / "sig/b.started", dir / "sig/go",
               "B-second", "1001"},
              dir / "b.log");
    ASSERT_TRUE(WaitFor([&] { return fs::exists(dir / "sig/b.started") || !b.Running(); })) << b.Log();
    WriteFile(dir / "sig/go", "");
    EXPECT_EQ(a.Wait(), 0) << a.Log();
    EXPECT_EQ(b.Wait(), 0) << b.Log();
    EXPECT_NE(a.Log().find("closed A-first;A-second"), std::string::npos) << a.Log() << c.Logs();
    EXPECT_NE(b.Log().find("closed B-private;B-second"), std::string::npos) << b.Log();
    EXPECT_TRUE(WaitFor([&] { return ReadFile(dir / "src/a/fa.bin") == "A-first;A-second"; })) << c.Logs();
    EXPECT_TRUE(WaitFor([&] { return ReadFile(dir / "src/b/fb.bin") == "B-private;B-second"; })) << c.Logs();
    struct stat st;
    ASSERT_EQ(stat((dir / "src/a/fa.bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u) << "the file is its writer's";
    ASSERT_EQ(stat((dir / "src/b/fb.bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 1001u);
    EXPECT_TRUE(c.StopAll(&why)) << why;
  }
}

// Findings 1 and 7 through the mount: a user's files and directories are the user's, with the modes
// asked and chmod/utime kept; a directory the user swaps for a link to a root-owned one leads nowhere.
TEST(WritesAsAnotherUser, OwnersModesAndNoLinkFollowed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: the writer is played by setuid";
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  fs::create_directories(dir / "src");
  ASSERT_EQ(chmod((dir / "src").c_str(), 0755), 0);
  OwnedDir(dir / "src/home", 65534);
  OwnedDir(dir / "src/home/sub", 65534);
  fs::create_directories(dir / "outside");
  WriteFile(dir / "outside/victim", "root's");
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(ServeWritable(c, dir, "through", &why)) << why;
  const std::string home = c.mountpoint() + "/w/home";
  ASSERT_TRUE(fs::is_directory(home + "/sub"));  // listed as a directory
  // The user swaps sub for a link to a root-owned directory (in the store, behind the mount).
  fs::remove(dir / "src/home/sub");
  fs::create_directory_symlink(dir / "outside", dir / "src/home/sub");
  ASSERT_EQ(lchown((dir / "src/home/sub").c_str(), 65534, 65534), 0);
  WriteFile(dir / "user.py",
            "import os, sys\n"
            "os.setgroups([]); os.setgid(65534); os.setuid(65534); os.umask(0o022)\n"
            "h = sys.argv[1]\n"
            "fd = os.open(h + '/mine.bin', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640); os.write(fd, b'mine'); os.close(fd)\n"
            "os.mkdir(h + '/d', 0o750)\n"
            "fd = os.open(h + '/d/ro.bin', os.O_WRONLY | os.O_CREAT, 0o666); os.write(fd, b'x'); os.close(fd)\n"
            "os.chmod(h + '/d/ro.bin', 0o600)\n"
            "os.utime(h + '/d/ro.bin', ns=(1700000000000000005, 1700000000000000005))\n"
            "for what, call in [('create', lambda: open(h + '/sub/planted', 'wb').close()),\n"
            "                   ('unlink', lambda: os.unlink(h + '/sub/victim')),\n"
            "                   ('mkdir', lambda: os.mkdir(h + '/sub/d', 0o777)),\n"
            "                   ('rename', lambda: os.rename(h + '/mine.bin', h + '/sub/victim'))]:\n"
            "    try:\n"
            "        call(); print(what, 'DONE')\n"
            "    except OSError as e:\n"
            "        print(what, 'refused', e.errno)\n");
  RunResult r = RunCommand({"/usr/bin/python3", dir / "user.py", home});
  ASSERT_EQ(r.code, 0) << r.out << c.Logs();
  EXPECT_EQ(r.out.find("DONE"), std::string::npos) << "a write went through a link:\n" << r.out;
  EXPECT_EQ(ReadFile(dir / "outside/victim"), "root's");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "outside"), fs::directory_iterator()), 1)
      << "something was made outside the source";
  struct stat st;
  ASSERT_EQ(stat((dir / "src/home/mine.bin").c_str(), &st), 0) << r.out;
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_EQ(stat((dir / "src/home/d").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(stat((dir / "src/home/d/ro.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "chmod was not kept";
  EXPECT_EQ(st.st_mtim.tv_sec, 1'700'000'000) << "utime was not kept";
  // And the mount shows what the store has.
  ASSERT_EQ(stat((home + "/d/ro.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// Finding 8: a writer killed mid-write replaced the previous file with its partial bytes. FUSE sends
// a FLUSH for a killed process too; granary-fuse tells it by the process's exit and commits nothing.
TEST(Writes, AWriterKilledMidWriteLeavesThePreviousVersionAndNoNewName) {
  for (const char* mode : {"through", "back"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    fs::create_directories(dir / "src");
    WriteFile(dir / "src/ckpt.pt", "version one");
    LocalCluster c(dir);
    std::string why;
    ASSERT_TRUE(ServeWritable(c, dir, mode, &why)) << why;
    WriteFile(dir / "killed.py",
              "import os, sys, time\n"
              "f = open(sys.argv[1], 'wb')\n"
              "f.write(os.urandom(3 << 20)); f.flush()\n"
              "open(sys.argv[2], 'w').write('started')\n"
              "time.sleep(600)\n");
    for (const char* name : {"ckpt.pt", "fresh.bin"}) {
      SCOPED_TRACE(name);
      const std::string started = dir / (std::string(name) + ".started");
      Process writer({"/usr/bin/python3", dir / "killed.py", c.mountpoint() + "/w/" + name, started},
                     dir / (std::string(name) + ".log"));
      ASSERT_TRUE(WaitFor([&] { return fs::exists(started) || !writer.Running(); })) << writer.Log();
      writer.Stop(SIGKILL);
      // Nothing was committed: the session ends (no backlog, no upload), the store keeps what it had.
      EXPECT_TRUE(WaitFor([&] { return c.Metric("worker", "granary_worker_write_sessions") == 0; })) << c.Logs();
      EXPECT_EQ(c.Metric("worker", "granary_worker_writeback_backlog_files"), 0);
      EXPECT_EQ(ReadFile(dir / "src/ckpt.pt"), "version one");
      EXPECT_FALSE(fs::exists(dir / "src/fresh.bin"));
      EXPECT_EQ(ReadFile(c.mountpoint() + "/w/ckpt.pt"), "version one");
      EXPECT_TRUE(WaitFor([&] { return !fs::exists(c.mountpoint() + "/w/fresh.bin"); }))
          << "the killed writer's new name is still listed";
    }
    // A writer that ends normally without close() commits (exit closes its files).
    WriteFile(dir / "exits.py", "import os, sys\nf = open(sys.argv[1], 'wb'); f.write(b'no close'); f.flush(); os._exit(0)\n");
    ASSERT_EQ(RunCommand({"/usr/bin/python3", dir / "exits.py", c.mountpoint() + "/w/exits.bin"}).code, 0);
    EXPECT_TRUE(WaitFor([&] { return ReadFile(dir / "src/exits.bin") == "no close"; }, std::chrono::seconds(30)));
    EXPECT_TRUE(c.StopAll(&why)) << why;
  }
}

// Finding 6: a commit that failed (a read-only source) left a 0-byte entry listed, which rm then
// refused with EROFS. The name is taken back; the writer's close() says EIO.
TEST(Writes, AFailedCommitLeavesNoEntry) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root for a read-only bind mount";
  TempDir dir;
  fs::create_directories(dir / "src");
  WriteFile(dir / "src/kept.txt", "kept");
  ASSERT_EQ(mount((dir / "src").c_str(), (dir / "src").c_str(), nullptr, MS_BIND, nullptr), 0) << strerror(errno);
  struct Unbind {
    std::string path;
    ~Unbind() { umount2(path.c_str(), MNT_DETACH); }
  } unbind{dir / "src"};
  ASSERT_EQ(mount(nullptr, (dir / "src").c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr), 0)
      << strerror(errno);
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(ServeWritable(c, dir, "through", &why)) << why;
  EXPECT_EQ(WriteWhole(c.mountpoint() + "/w/new.bin", "bytes"), EIO);
  EXPECT_TRUE(WaitFor([&] { return !fs::exists(c.mountpoint() + "/w/new.bin"); })) << "a 0-byte entry stayed listed";
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(c.mountpoint() + "/w")) names.insert(e.path().filename().string());
  EXPECT_EQ(names, std::set<std::string>{"kept.txt"});
  EXPECT_EQ(ReadFile(c.mountpoint() + "/w/kept.txt"), "kept");
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

// Issue 50, finding 9: tar, cp -p and shutil set mode, owner and times on each file before closing
// it. granary-fuse keeps them for the file's commit (no master round trip each) and the store gets
// them with the file, in both modes; a stat through the mount shows them at once. A user's chmod of
// its own file open for writing works the same; a chown to another user is still refused.
TEST(Writes, AttributesSetBeforeCloseReachTheStoreWithTheFile) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: the second writer is played by setuid";
  for (const char* mode : {"through", "back"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
    fs::create_directories(dir / "src");
    ASSERT_EQ(chmod((dir / "src").c_str(), 0755), 0);
    OwnedDir(dir / "src/user", 65534);
    LocalCluster c(dir);
    std::string why;
    ASSERT_TRUE(ServeWritable(c, dir, mode, &why)) << why;
    const std::string w = c.mountpoint() + "/w";
    // What tar x does for each file: create, write, utimensat, fchown, fchmod, close.
    WriteFile(dir / "tar_like.py",
              "import os, sys\n"
              "p = sys.argv[1]\n"
              "fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
              "os.write(fd, b'tar bytes')\n"
              "os.utime(fd, ns=(1600000000000000000, 1500000000123456789))\n"
              "os.fchown(fd, 1234, 4321)\n"
              "os.fchmod(fd, 0o640)\n"
              "st = os.fstat(fd)\n"
              "print('open', oct(st.st_mode & 0o7777), st.st_uid, st.st_gid, st.st_mtime_ns)\n"
              "os.close(fd)\n"
              "g = p + '.after'  # as Python's tarfile and shutil.copy2 do: by path, after the close\n"
              "with open(g, 'wb') as f: f.write(b'after bytes')\n"
              "os.chmod(g, 0o600); os.utime(g, ns=(1400000000000000000, 1400000000000000000))\n"
              "if len(sys.argv) > 2:\n"
              "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
              "    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)\n"
              "    os.write(fd, b'user bytes')\n"
              "    os.fchmod(fd, 0o604)\n"
              "    try:\n"
              "        os.fchown(fd, 0, 0); print('chown DONE')\n"
              "    except OSError as e:\n"
              "        print('chown refused', e.errno)\n"
              "    os.close(fd)\n");
    RunResult r = RunCommand({"/usr/bin/python3", dir / "tar_like.py", w + "/f.bin", w + "/user/u.bin"});
    ASSERT_EQ(r.code, 0) << r.out << c.Logs();
    EXPECT_NE(r.out.find("open 0o640 1234 4321 1500000000123456789"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("chown refused 1"), std::string::npos) << r.out;  // EPERM, from the kernel's check
    struct stat st {};
    ASSERT_TRUE(WaitFor([&] { return ReadFile(dir / "src/f.bin") == "tar bytes"; })) << c.Logs();
    ASSERT_EQ(stat((dir / "src/f.bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 07777, 0640u);
    EXPECT_EQ(st.st_uid, 1234u);
    EXPECT_EQ(st.st_gid, 4321u);
    EXPECT_EQ(static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec, 1500000000123456789LL);
    ASSERT_TRUE(WaitFor([&] { return ReadFile(dir / "src/f.bin.after") == "after bytes"; })) << c.Logs();
    EXPECT_TRUE(WaitFor([&] {
      struct stat a {};
      return stat((dir / "src/f.bin.after").c_str(), &a) == 0 && (a.st_mode & 07777) == 0600u &&
             a.st_mtim.tv_sec == 1'400'000'000;
    })) << "chmod and utime after the close were not kept\n" << c.Logs();
    ASSERT_TRUE(WaitFor([&] { return ReadFile(dir / "src/user/u.bin") == "user bytes"; })) << c.Logs();
    ASSERT_EQ(stat((dir / "src/user/u.bin").c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, 65534u);
    EXPECT_EQ(st.st_mode & 07777, 0604u);
    // The mount shows the store's (once the upload is in, for write=back: polled).
    EXPECT_TRUE(WaitFor([&] {
      struct stat m {};
      return stat((w + "/f.bin").c_str(), &m) == 0 && m.st_uid == 1234u && (m.st_mode & 0777) == 0640u &&
             m.st_mtim.tv_sec == 1'500'000'000;
    })) << c.Logs();
    EXPECT_TRUE(c.StopAll(&why)) << why;
  }
}

// A directory this node made answers lookups of names it did not make there without the master
// (fuse/known_dirs.h) — for a second at most: a file put there behind the mount (a mount that syncs
// at every lookup) is seen after it.
TEST(Writes, ANewDirectoryStillShowsAFileMadeBehindTheMount) {
  TempDir dir;
  fs::create_directories(dir / "src");
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why) && c.StartFuse(&why)) << why;
  RunResult m = c.Cli({"mount", "/w", "file://" + dir / "src", "-o", "write=back", "-o", "metadata.sync_interval=always"});
  ASSERT_EQ(m.code, 0) << m.out;
  const std::string d = c.mountpoint() + "/w/new";
  ASSERT_EQ(mkdir(d.c_str(), 0755), 0) << strerror(errno);
  ASSERT_EQ(WriteWhole(d + "/mine.bin", "mine"), 0);
  EXPECT_FALSE(fs::exists(d + "/nothing"));
  ASSERT_TRUE(WaitFor([&] { return fs::is_directory(dir / "src/new"); })) << c.Logs();
  WriteFile(dir / "src/new/theirs.bin", "theirs");  // another writer of the store
  EXPECT_TRUE(WaitFor([&] { return ReadFile(d + "/theirs.bin") == "theirs"; })) << "never seen through the mount";
  EXPECT_EQ(ReadFile(d + "/mine.bin"), "mine");
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

}  // namespace
}  // namespace granary::testing
