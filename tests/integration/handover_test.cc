// A restart of granary-fuse or of the worker never breaks a reader (fuse/handover.h): a reader
// that keeps files open and reads them through read, pread and mmap, and opens others anew, goes
// on with no error and only the source's bytes across an upgrade of granary-fuse, a kill -9 and
// restart of it, ten of those in a row, and kill -9 and restart of the worker; in every read mode.
// The mount is the same mount throughout (one entry, same device), and nothing is left behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

// The reader (tests/integration/reader.py) as a process.
class Reader {
 public:
  Reader(const TempDir& dir, const std::string& mount, const std::vector<std::string>& files, bool mmap = true,
         const std::string& name = "reader")
      : dir_(dir), name_(name) {
    std::string list;
    for (const auto& f : files) list += f + ",";
    std::vector<std::string> argv{"python3", SourceDir() + "/tests/integration/reader.py", "--mount", mount,
                                  "--source", dir / "src", "--files", list, "--status", dir / (name + ".json"),
                                  "--stop", dir / (name + ".stop")};
    if (!mmap) argv.push_back("--no-mmap");
    p_ = std::make_unique<Process>(argv, dir / (name + ".log"));
  }
  ~Reader() {
    WriteFile(dir_ / (name_ + ".stop"), "");
    p_->Wait(std::chrono::seconds(30));
  }
  nlohmann::json Status() {
    auto j = nlohmann::json::parse(ReadFile(dir_ / (name_ + ".json")), nullptr, false);
    return j.is_discarded() ? nlohmann::json() : j;
  }
  uint64_t Rounds() {
    auto j = Status();
    return j.is_object() ? j["rounds"].get<uint64_t>() : 0;
  }
  // Waits until the reader has done `more` rounds beyond now (it is reading through the mount).
  bool Progress(uint64_t more = 3) {
    uint64_t start = Rounds();
    return WaitFor([&] { return Rounds() >= start + more || !p_->Running(); }, std::chrono::seconds(120)) &&
           p_->Running();
  }
  // Stops the reader; its final status.
  nlohmann::json Finish() {
    WriteFile(dir_ / (name_ + ".stop"), "");
    int code = p_->Wait(std::chrono::seconds(60));
    auto j = Status();
    j["exit"] = code;
    j["log"] = p_->Log();
    return j;
  }

 private:
  const TempDir& dir_;
  const std::string name_;
  std::unique_ptr<Process> p_;
};

// How many mounts sit on `mp` (a stacked mount would make two).
int MountsAt(const std::string& mp) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.find(" " + mp + " ") != std::string::npos) ++n;
  }
  return n;
}

dev_t DeviceOf(const std::string& mp) {
  struct stat st {};
  return stat(mp.c_str(), &st) == 0 ? st.st_dev : 0;
}

std::vector<std::string> MakeDataset(const TempDir& dir) {
  std::vector<std::string> names;
  for (int i = 0; i < 6; ++i) {
    std::string n = "img" + std::to_string(i) + ".jpg";
    WriteFile(dir / ("src/" + n), RandomBytes(20000 + i * 7000, i));
    names.push_back(n);
  }
  WriteFile(dir / "src/big.bin", RandomBytes(64 * 1024 * 4 + 99, 77));
  names.push_back("big.bin");
  return names;
}

// The warnings and errors of every granary-fuse the test started (fuse.log, fuse2.log, ...), and
// of the keeper.
std::string FuseWarnings(const TempDir& dir) {
  std::string out;
  for (int i = 1; i < 100; ++i) {
    std::string path = dir / (i == 1 ? std::string("fuse.log") : "fuse" + std::to_string(i) + ".log");
    if (access(path.c_str(), F_OK) != 0) continue;
    std::istringstream in(ReadFile(path));
    std::string line;
    while (std::getline(in, line)) {
      if (line.find(" W ") != std::string::npos || line.find(" E ") != std::string::npos) out += line + "\n";
    }
  }
  return out + ReadFile(dir / "fuse.sock.keeper.log");
}

std::string FinalVerdict(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("errors")) return "the reader left no status: " + j.dump();
  if (j["errors"].get<int>() != 0 || j["exit"].get<int>() != 0) return "the reader saw errors: " + j.dump();
  return "";
}

class Handover : public ::testing::TestWithParam<std::string> {};

// (a) an upgrade, (b) kill -9 and restart, (c) ten more of those, alternating.
TEST_P(Handover, AReaderSeesNoErrorAcrossUpgradesAndCrashes) {
  const std::string mode = GetParam();
  TempDir dir;
  auto names = MakeDataset(dir);
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", mode};
  o.keep_cache = mode != "daemon";
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_EQ(c.Cli({"load", "/ds"}).code, 0);  // wholly cached: passthrough opens on cache files
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  dev_t dev = DeviceOf(c.mountpoint());
  ASSERT_NE(dev, 0u);
  Reader reader(dir, c.mountpoint() + "/ds", names);
  ASSERT_TRUE(reader.Progress()) << reader.Finish().dump();

  ASSERT_TRUE(c.UpgradeFuse(&why)) << why;
  ASSERT_TRUE(reader.Progress()) << "after the upgrade: " << reader.Finish().dump();
  // The predecessor kept its backing files' leases until the successor said it held its own.
  const std::string log = ReadFile(dir / "fuse.log");
  EXPECT_EQ(log.find("did not say it leased"), std::string::npos) << log;
  if (mode == "passthrough") {
    EXPECT_TRUE(std::regex_search(log, std::regex("handed \\S+ over \\(\\d+ open files, [1-9]\\d* backing files\\)")))
        << "the upgrade handed no backing file over: " << log;
  }
  ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << why;
  ASSERT_TRUE(reader.Progress()) << "after the crash: " << reader.Finish().dump();
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(i % 2 == 0 ? c.CrashAndRestartFuse(&why) : c.UpgradeFuse(&why)) << "round " << i << ": " << why;
    ASSERT_TRUE(reader.Progress(2)) << "round " << i << ": " << reader.Finish().dump();
  }
  nlohmann::json verdict = reader.Finish();
  EXPECT_EQ(FinalVerdict(verdict), "");
  EXPECT_GT(verdict["rounds"].get<uint64_t>(), 10u);
  EXPECT_EQ(MountsAt(c.mountpoint()), 1) << "a stacked or dead mount was left";
  EXPECT_EQ(DeviceOf(c.mountpoint()), dev) << "the mount point is not the same mount";
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_open_mode{mode=\"" + mode + "\",fallback=\"0\"}"), 1) << c.Logs();
  ASSERT_TRUE(c.StopAll(&why)) << why;
  EXPECT_EQ(MountsAt(c.mountpoint()), 0);
  // The keeper let go of the connection when the mount ended, stopped, and took its log along.
  EXPECT_TRUE(WaitFor([&] { return access((dir / "fuse.sock.keeper.log").c_str(), F_OK) != 0; }))
      << ReadFile(dir / "fuse.sock.keeper.log");
}

INSTANTIATE_TEST_SUITE_P(Modes, Handover, ::testing::Values("kernel", "passthrough", "daemon"),
                         [](const auto& info) { return info.param; });

// Many readers at once make libfuse start more threads than it keeps idle; it ends the surplus
// after they answer. An upgrade must still drain (a request read by a thread that ended once
// counted as unanswered for ever, and the successor waited without end).
TEST(Handover, AnUpgradeUnderManyReadersDrains) {
  TempDir dir;
  auto names = MakeDataset(dir);
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", "daemon"};
  o.keep_cache = false;
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_EQ(c.Cli({"load", "/ds"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  std::vector<std::unique_ptr<Reader>> readers;
  for (int i = 0; i < 10; ++i) {
    readers.push_back(std::make_unique<Reader>(dir, c.mountpoint() + "/ds", names, false, "reader" + std::to_string(i)));
  }
  for (auto& r : readers) ASSERT_TRUE(r->Progress()) << r->Finish().dump();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.UpgradeFuse(&why)) << "upgrade " << i << ": " << why;
    for (auto& r : readers) ASSERT_TRUE(r->Progress(2)) << "upgrade " << i << ": " << r->Finish().dump();
  }
  for (auto& r : readers) EXPECT_EQ(FinalVerdict(r->Finish()), "");
  EXPECT_EQ(MountsAt(c.mountpoint()), 1);
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// Passthrough under crashes while backing ids come and go (a short attr_timeout lets idle ones go
// at once): the keeper must never hold an id the kernel has closed, or every open of that file
// after the crash fails with EIO (the link once told the keeper from a thread of its own, after
// the kernel had closed the id). Four readers start at once, so the first opens also race the
// local socket's first probe (they once missed it and were served by granary-fuse, see the next
// test for why that mattered).
TEST(Handover, PassthroughCrashesWhileBackingIdsChange) {
  TempDir dir;
  std::vector<std::string> names;
  for (int i = 0; i < 24; ++i) {
    std::string n = "f" + std::to_string(i) + ".bin";
    WriteFile(dir / ("src/" + n), RandomBytes(3000 + i * 500, 100 + i));
    names.push_back(n);
  }
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", "passthrough", "--fuse.attr_timeout", "1ms"};
  o.keep_cache = true;
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_EQ(c.Cli({"load", "/ds"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  std::vector<std::unique_ptr<Reader>> readers;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> mine(names.begin() + i, names.end());
    mine.insert(mine.end(), names.begin(), names.begin() + i);
    readers.push_back(std::make_unique<Reader>(dir, c.mountpoint() + "/ds", mine, false, "reader" + std::to_string(i)));
  }
  for (auto& r : readers) ASSERT_TRUE(r->Progress()) << r->Finish().dump();
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << "crash " << i << ": " << why;
    for (auto& r : readers) ASSERT_TRUE(r->Progress(2)) << "crash " << i << ": " << r->Finish().dump();
  }
  for (auto& r : readers) EXPECT_EQ(FinalVerdict(r->Finish()), "") << FuseWarnings(dir);
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_open_mode{mode=\"passthrough\",fallback=\"0\"}"), 1) << c.Logs();
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// Passthrough mode serves a file itself when this node's worker does not hold it whole at open
// (here: nothing loaded, files of several blocks), and the kernel then keeps the inode in cached io mode while that open
// lasts, failing any passthrough open of it with EIO. Reader a keeps such opens; reader b reopens
// the same files every round. After kill -9, the restarted granary-fuse must know a's opens (from
// the keeper) and serve b's reopens itself, not with a backing file (the worker holds them whole
// by then): once, every reopen failed with EIO until unmount.
TEST(Handover, PassthroughCrashKeepsDaemonServedOpens) {
  TempDir dir;
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) {
    std::string n = "g" + std::to_string(i) + ".bin";
    WriteFile(dir / ("src/" + n), RandomBytes(150000 + i * 7000, 300 + i));  // 3 blocks: fetched on read
    names.push_back(n);
  }
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", "passthrough"};
  o.keep_cache = true;
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  Reader a(dir, c.mountpoint() + "/ds", names, true, "reader_a");  // keeps g0-g3, reopens g4-g7
  ASSERT_TRUE(a.Progress()) << a.Finish().dump();
  EXPECT_GT(c.Metric("fuse", "granary_fuse_passthrough_misses_total"), 0) << "every open had a backing file";
  std::vector<std::string> rotated(names.begin() + 4, names.end());
  rotated.insert(rotated.end(), names.begin(), names.begin() + 4);
  Reader b(dir, c.mountpoint() + "/ds", rotated, true, "reader_b");  // keeps g4-g7, reopens g0-g3
  ASSERT_TRUE(b.Progress()) << b.Finish().dump();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << "crash " << i << ": " << why;
    ASSERT_TRUE(a.Progress(2)) << "crash " << i << ": " << a.Finish().dump();
    ASSERT_TRUE(b.Progress(2)) << "crash " << i << ": " << b.Finish().dump();
    // b's reopens of a's files were served by the restarted granary-fuse itself.
    EXPECT_GT(c.Metric("fuse", "granary_fuse_passthrough_misses_total"), 0) << "crash " << i;
  }
  EXPECT_EQ(FinalVerdict(a.Finish()), "") << FuseWarnings(dir);
  EXPECT_EQ(FinalVerdict(b.Finish()), "") << FuseWarnings(dir);
  EXPECT_EQ(MountsAt(c.mountpoint()), 1);
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// kill -9 of the worker and its restart 2 s later (what Kubernetes does with a crashed
// container), three times: reads stall, none fails. Daemon mode, no page cache: every read goes to
// the worker.
TEST(WorkerRestart, IsAStallNotAnError) {
  TempDir dir;
  auto names = MakeDataset(dir);
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  Reader reader(dir, c.mountpoint() + "/ds", names, /*mmap=*/false);
  ASSERT_TRUE(reader.Progress()) << reader.Finish().dump();
  for (int i = 0; i < 3; ++i) {
    c.KillWorker();
    // The reader is stalled now; the worker comes back while it waits (fuse.worker_wait).
    uint64_t at = reader.Rounds();
    WaitFor([&] { return reader.Rounds() > at + 1; }, std::chrono::seconds(2));
    ASSERT_TRUE(c.RestartWorker(&why)) << why;
    ASSERT_TRUE(reader.Progress()) << "restart " << i << ": " << reader.Finish().dump() << c.Logs();
  }
  EXPECT_EQ(FinalVerdict(reader.Finish()), "") << c.Logs();
  EXPECT_GT(c.Metric("fuse", "granary_fuse_worker_waits_total"), 0) << "no read waited: the test did not test";
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// A large listing in flight across a hand-over completes with no duplicates or gaps.
TEST(Handover, ListingsInFlightCompleteWhole) {
  TempDir dir;
  for (int d = 0; d < 20; ++d) {
    for (int f = 0; f < 150; ++f) {
      WriteFile(dir / ("src/d" + std::to_string(d) + "/f" + std::to_string(f)), std::to_string(d * 1000 + f));
    }
  }
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", "kernel", "--fuse.attr_timeout", "0s", "--fuse.entry_timeout", "0s"};
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  auto list = [&] { return RunCommand({"ls", "-lRn", "--time-style=+", c.mountpoint() + "/ds"}); };
  RunResult want = list();
  ASSERT_EQ(want.code, 0) << want.out;
  ASSERT_GT(std::count(want.out.begin(), want.out.end(), '\n'), 3000);
  // Listings run back to back in a loop while granary-fuse is handed over and crashes.
  std::atomic<bool> stop{false};
  std::atomic<int> runs{0};
  std::string bad;
  std::thread lister([&] {
    while (!stop) {
      RunResult r = list();
      if (r.code != 0 || r.out != want.out) {
        if (bad.empty()) bad = "exit " + std::to_string(r.code) + "\n" + r.out.substr(0, 2000);
      }
      runs++;
    }
  });
  for (int i = 0; i < 2; ++i) {
    int before = runs;
    bool ok = i % 2 == 0 ? c.UpgradeFuse(&why) : c.CrashAndRestartFuse(&why);
    EXPECT_TRUE(ok) << why;
    if (!ok) break;
    WaitFor([&] { return runs > before; }, std::chrono::seconds(60));
  }
  stop = true;
  lister.join();
  EXPECT_EQ(bad, "");
  EXPECT_GE(runs.load(), 2);
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// A successor with other settings is refused with a clear message; the running one keeps serving.
TEST(Handover, AnIncompatibleSuccessorIsRefused) {
  TempDir dir;
  auto names = MakeDataset(dir);
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  RunResult r = RunCommand({Bin("granary-fuse"), "--master.address", c.master_address(), "--fuse.mountpoint",
                            c.mountpoint(), "--fuse.handover_socket", dir / "fuse.sock", "--fuse.open", "kernel"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("refused the hand-over"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fuse.open"), std::string::npos) << r.out;
  std::string got;
  EXPECT_TRUE(ReadFileChecked(c.mountpoint() + "/ds/" + names[0], &got));
  EXPECT_EQ(got, ReadFile(dir / ("src/" + names[0])));
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// The fuse module's enable_uring parameter, set for one test and put back after it (FUSE over
// io_uring, fuse.transport uring; fuse/uring.h). Absent before Linux 6.14.
class EnableUring {
 public:
  explicit EnableUring(bool on) {
    std::ifstream in(kPath);
    if (!in || !(in >> old_)) return;
    std::ofstream out(kPath);
    out << (on ? "Y" : "N");
    ok_ = static_cast<bool>(out.flush());
  }
  ~EnableUring() {
    if (!ok_) return;
    std::ofstream out(kPath);
    out << old_;
  }
  bool ok() const { return ok_; }

 private:
  static constexpr const char* kPath = "/sys/module/fuse/parameters/enable_uring";
  std::string old_;
  bool ok_ = false;
};

// fuse.transport uring: requests come through the ring (the metrics say so and count them), every
// byte is the source's, and an upgrade hands the connection over with its ring: the successor
// registers its entries before the predecessor lets go of its own. The upgrades happen between
// readers: on Linux 6.18 a request the kernel puts in an entry while its server lets go of it is
// never answered (fuse/uring.h), so an upgrade under load is not yet without risk over io_uring,
// nor is a crash while requests are in flight.
TEST(Uring, ReadersAreServedThroughTheRingAcrossUpgrades) {
  EnableUring uring(true);
  if (!uring.ok()) GTEST_SKIP() << "no writable /sys/module/fuse/parameters/enable_uring (Linux >= 6.14, root)";
  TempDir dir;
  auto names = MakeDataset(dir);
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", "daemon", "--fuse.transport", "uring", "--fuse.uring_depth", "2"};
  o.keep_cache = false;
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  // Three upgrades, then a crash (kill -9) between readers: the keeper's copy of the state says the
  // connection uses io_uring, so the next granary-fuse registers entries before anything else.
  for (int i = 0; i < 5; ++i) {
    if (i > 0 && i < 4) {
      ASSERT_TRUE(c.UpgradeFuse(&why)) << "upgrade " << i << ": " << why;
    } else if (i == 4) {
      ASSERT_TRUE(c.CrashAndRestartFuse(&why)) << why;
    }
    Reader reader(dir, c.mountpoint() + "/ds", names, true, "reader" + std::to_string(i));
    ASSERT_TRUE(reader.Progress()) << "after upgrade " << i << ": " << reader.Finish().dump();
    EXPECT_EQ(FinalVerdict(reader.Finish()), "") << "after upgrade " << i;
    EXPECT_EQ(c.Metric("fuse", "granary_fuse_transport{transport=\"uring\"}"), 1) << c.Logs();
    EXPECT_GT(c.Metric("fuse", "granary_fuse_uring_requests_total"), 0) << c.Logs();
  }
  EXPECT_EQ(MountsAt(c.mountpoint()), 1);
  EXPECT_EQ(FuseWarnings(dir).find("io_uring"), std::string::npos) << FuseWarnings(dir);
  ASSERT_TRUE(c.StopAll(&why)) << why;
  EXPECT_EQ(MountsAt(c.mountpoint()), 0);
}

// Ten readers (read, pread, mmap; every byte checked) on a mount served through io_uring, loaded in
// the worker's cache so that requests sit in the ring's entries at every moment.
struct UringUnderLoad {
  explicit UringUnderLoad(const TempDir& dir) : names(MakeDataset(dir)), c(dir, Options()) {}
  static ClusterOptions Options() {
    ClusterOptions o;
    o.fuse_args = {"--fuse.open", "daemon", "--fuse.transport", "uring", "--fuse.uring_depth", "2"};
    o.keep_cache = false;
    return o;
  }
  bool Start(const TempDir& dir, std::string* why) {
    if (!c.StartDaemons(why) || c.Cli({"mount", "/ds", "file://" + dir / "src"}).code != 0 ||
        c.Cli({"load", "/ds"}).code != 0 || !c.StartFuse(why)) {
      return false;
    }
    for (int i = 0; i < 10; ++i) {
      readers.push_back(std::make_unique<Reader>(dir, c.mountpoint() + "/ds", names, i % 2 == 0, "reader" + std::to_string(i)));
    }
    return true;
  }
  std::vector<std::string> names;
  LocalCluster c;
  std::vector<std::unique_ptr<Reader>> readers;
};

// Upgrades under load lose nothing over io_uring: the predecessor parks every entry (each keeps
// the next request it gets) and the successor answers what they hold (fuse/uring.h). Without
// parking, a request given to an entry as its server let go of it was never answered.
TEST(Uring, UpgradesUnderLoadLoseNothing) {
  EnableUring uring(true);
  if (!uring.ok()) GTEST_SKIP() << "no writable /sys/module/fuse/parameters/enable_uring (Linux >= 6.14, root)";
  TempDir dir;
  UringUnderLoad t(dir);
  std::string why;
  ASSERT_TRUE(t.Start(dir, &why)) << why;
  for (auto& r : t.readers) ASSERT_TRUE(r->Progress()) << r->Finish().dump();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(t.c.UpgradeFuse(&why)) << "upgrade " << i << ": " << why;
    // Every entry was parked holding a request (the readers', or our own GETATTR): all adopted.
    EXPECT_GT(t.c.Metric("fuse", "granary_fuse_uring_adopted_total"), 0) << t.c.Logs();
    for (auto& r : t.readers) ASSERT_TRUE(r->Progress(2)) << "upgrade " << i << ": " << r->Finish().dump() << t.c.Logs();
    EXPECT_EQ(t.c.Metric("fuse", "granary_fuse_transport{transport=\"uring\"}"), 1) << t.c.Logs();
  }
  for (auto& r : t.readers) EXPECT_EQ(FinalVerdict(r->Finish()), "");
  EXPECT_EQ(MountsAt(t.c.mountpoint()), 1);
  ASSERT_TRUE(t.c.StopAll(&why)) << why;
}

// Crashes (kill -9) under load leave no reader waiting: the successor answers what the dead
// process's entries held (their memory is the keeper's too). Before, every crash left the readers
// whose requests it held waiting until the mount was aborted. What Linux 6.18 still does: a
// request given to an entry in the instant its process dies is failed with ECANCELED (the kernel
// cannot write it to a dead process's ring). So a reader may see that error, and no other, and
// every byte it read is right.
TEST(Uring, CrashesUnderLoadLeaveNoReaderWaiting) {
  EnableUring uring(true);
  if (!uring.ok()) GTEST_SKIP() << "no writable /sys/module/fuse/parameters/enable_uring (Linux >= 6.14, root)";
  TempDir dir;
  UringUnderLoad t(dir);
  std::string why;
  ASSERT_TRUE(t.Start(dir, &why)) << why;
  for (auto& r : t.readers) ASSERT_TRUE(r->Progress()) << r->Finish().dump();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(i == 1 ? t.c.UpgradeFuse(&why) : t.c.CrashAndRestartFuse(&why)) << "event " << i << ": " << why;
    for (auto& r : t.readers) ASSERT_TRUE(r->Progress(2)) << "event " << i << ": " << r->Finish().dump() << t.c.Logs();
    EXPECT_EQ(t.c.Metric("fuse", "granary_fuse_transport{transport=\"uring\"}"), 1) << t.c.Logs();
  }
  for (auto& r : t.readers) {
    nlohmann::json j = r->Finish();
    const auto& errors = j["first_errors"];
    EXPECT_EQ(j["errors"].get<size_t>(), errors.size()) << j.dump();  // each one listed
    for (const auto& e : errors) EXPECT_NE(e.get<std::string>().find("[Errno 125]"), std::string::npos) << j.dump();
    EXPECT_EQ(j["exit"].get<int>() == 0, errors.empty()) << j.dump();
  }
  EXPECT_EQ(MountsAt(t.c.mountpoint()), 1);
  ASSERT_TRUE(t.c.StopAll(&why)) << why;
}

// fuse.transport uring where the kernel does not offer it: a warning that says how to turn it on,
// and the mount served through /dev/fuse.
TEST(Uring, WithoutTheKernelsOfferTheMountIsServedThroughDevFuse) {
  EnableUring uring(false);
  if (!uring.ok()) GTEST_SKIP() << "no writable /sys/module/fuse/parameters/enable_uring (Linux >= 6.14, root)";
  TempDir dir;
  auto names = MakeDataset(dir);
  ClusterOptions o;
  o.fuse_args = {"--fuse.open", "daemon", "--fuse.transport", "uring"};
  o.keep_cache = false;
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "file://" + dir / "src"}).code, 0);
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  for (const auto& n : names) EXPECT_EQ(ReadFile(c.mountpoint() + "/ds/" + n), ReadFile(dir / ("src/" + n))) << n;
  EXPECT_EQ(c.Metric("fuse", "granary_fuse_transport{transport=\"dev\"}"), 1) << c.Logs();
  EXPECT_NE(FuseWarnings(dir).find("enable_uring"), std::string::npos) << FuseWarnings(dir);
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

}  // namespace
}  // namespace granary::testing
