// Standby masters (issue 32): three granary-masters elect a leader through a real 3-member etcd
// (scripts/etcd.sh); a worker, granary-fuse and the CLI are given the three addresses. The leader
// is killed with -9, twice, while a reader reads every file through the FUSE mount over and over:
// a standby takes over with the same namespace (the kernel's inode numbers keep working), the reader
// sees no error and no wrong byte, the killed master comes back as a standby and catches up.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <map>
#include <sstream>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/testutil/testutil.h"

namespace granary::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr int kFiles = 60;

class FailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RunResult r = RunCommand({"bash", SourceDir() + "/scripts/etcd.sh", "start", dir_ / "etcd", "3"}, {}, seconds(60));
    const size_t at = r.out.rfind("READY ");
    ASSERT_TRUE(r.code == 0 && at != std::string::npos) << "etcd did not start:\n" << r.out;
    etcd_ = r.out.substr(at + 6);
    etcd_ = etcd_.substr(0, etcd_.find('\n'));
    for (int i = 0; i < kFiles; ++i) {
      std::string name = "src/d" + std::to_string(i % 4) + "/f" + std::to_string(i);
      files_[name.substr(4)] = RandomBytes(20000 + 997 * i, i);
      WriteFile(dir_ / name, files_[name.substr(4)]);
    }
    for (int i = 0; i < 3; ++i) {
      std::string why;
      ASSERT_TRUE(StartMaster(i, "127.0.0.1:0", &why)) << why;
    }
    for (int i = 0; i < 3; ++i) list_ += (i ? "," : "") + addr_[i];
  }
  void TearDown() override {
    cluster_.reset();
    for (auto& m : masters_) m.reset();
    RunCommand({"bash", SourceDir() + "/scripts/etcd.sh", "stop", dir_ / "etcd"});
  }
  bool StartMaster(int i, const std::string& listen, std::string* why) {
    std::string n = std::to_string(i);
    unlink((dir_ / ("m" + n + ".addr")).c_str());
    masters_[i] = std::make_unique<Process>(
        std::vector<std::string>{Bin("granary-master"), "--master.listen", listen, "--master.data_dir",
                                 dir_ / ("m" + n), "--master.block_size", "64Ki", "--master.etcd_endpoints", etcd_,
                                 "--master.election_ttl", "2s", "--master.metrics_listen", "off",
                                 "--ufs.local_roots", dir_.path(), "--ready-file", dir_ / ("m" + n + ".addr")},
        dir_ / ("m" + n + ".log"));
    addr_[i] = WaitForReadyFile(dir_ / ("m" + n + ".addr"), masters_[i].get());
    if (addr_[i].empty()) *why = "master " + n + " did not start:\n" + masters_[i]->Log();
    return !addr_[i].empty();
  }
  // `granary report --json`'s master section, asked of the cluster ({} when no master answers).
  nlohmann::json Master() {
    RunResult r = RunCommand({Bin("granary"), "--master", list_, "report", "--json"}, {{"GRANARY_HOME", dir_ / "home"}},
                             seconds(60));
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    if (r.code != 0 || j.is_discarded() || !j.contains("master")) return nlohmann::json::object();
    return j["master"];
  }
  // Which master (0..2) leads, once one does and `standbys` standbys are in sync with it.
  int WaitForLeader(size_t standbys, std::chrono::milliseconds timeout = seconds(60)) {
    int leader = -1;
    WaitFor([&] {
      nlohmann::json m = Master();
      if (!m.contains("leader") || !m.contains("standbys")) return false;
      size_t in_sync = 0;
      for (const auto& s : m["standbys"]) in_sync += s["in_sync"].get<bool>() ? 1 : 0;
      if (in_sync < standbys) return false;
      for (int i = 0; i < 3; ++i) {
        if (m["leader"] == addr_[i]) leader = i;
      }
      return leader >= 0;
    }, timeout);
    return leader;
  }
  std::map<std::string, uint64_t> Inodes() {
    std::map<std::string, uint64_t> out;
    for (const auto& [name, bytes] : files_) {
      struct stat st{};
      if (stat((cluster_->mountpoint() + "/data/" + name).c_str(), &st) == 0) out[name] = st.st_ino;
    }
    return out;
  }

  TempDir dir_;
  std::string etcd_;
  std::map<std::string, std::string> files_;
  std::unique_ptr<Process> masters_[3];
  std::string addr_[3];
  std::string list_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(FailoverTest, AStandbyTakesOverWithTheSameNamespaceAndNoReaderNotices) {
  int leader = WaitForLeader(2);
  ASSERT_GE(leader, 0) << "no leader with two standbys in sync:\n" << masters_[0]->Log() << masters_[1]->Log();
  ClusterOptions opts;
  opts.masters = list_;
  // Every stat and open asks the master (no kernel or granary-fuse metadata caching), so the reader
  // is exposed to each failover. GRANARY_FAILOVER_FUSE_ARGS adds arguments (a check that this test
  // fails when granary-fuse does not wait out a failover: --rpc.master_wait 0s).
  opts.fuse_args = {"--fuse.entry_timeout", "0s", "--fuse.attr_timeout", "0s", "--fuse.file_cache_entries", "0"};
  if (const char* extra = std::getenv("GRANARY_FAILOVER_FUSE_ARGS")) {
    std::istringstream in(extra);
    for (std::string a; in >> a;) opts.fuse_args.push_back(a);
  }
  cluster_ = std::make_unique<LocalCluster>(dir_, opts);
  std::string why;
  ASSERT_TRUE(cluster_->StartDaemons(&why)) << why;
  ASSERT_TRUE(cluster_->StartFuse(&why)) << why;
  RunResult m = cluster_->Cli({"mount", "/data", "file://" + dir_ / "src"});
  ASSERT_EQ(m.code, 0) << m.out;
  const std::map<std::string, uint64_t> inodes = Inodes();
  ASSERT_EQ(inodes.size(), files_.size());

  // A reader that reads every file, over and over, and checks every byte and inode.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, errors{0}, wrong{0};
  std::string first_error;
  std::mutex error_mu;
  std::thread reader([&] {
    while (!stop) {
      for (const auto& [name, bytes] : files_) {
        std::string path = cluster_->mountpoint() + "/data/" + name, got;
        struct stat st{};
        bool ok = stat(path.c_str(), &st) == 0 && ReadFileChecked(path, &got);
        if (!ok) {
          ++errors;
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.empty()) first_error = name + ": " + std::strerror(errno);
        } else if (got != bytes || st.st_ino != inodes.at(name)) {
          ++wrong;
        }
        ++reads;
      }
    }
  });

  for (int round = 0; round < 2; ++round) {
    uint64_t before = reads;
    ASSERT_TRUE(WaitFor([&] { return reads > before + kFiles; }, seconds(60))) << "the reader is stuck";
    auto killed_at = std::chrono::steady_clock::now();
    masters_[leader]->Stop(SIGKILL);
    int next = WaitForLeader(1);
    ASSERT_GE(next, 0) << "no standby took over:\n" << masters_[(leader + 1) % 3]->Log();
    ASSERT_NE(next, leader);
    double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    std::printf("failover %d: %s -> %s in %.1f s\n", round, addr_[leader].c_str(), addr_[next].c_str(), took);
    // The killed master comes back on its address and data as a standby, and catches up.
    ASSERT_TRUE(StartMaster(leader, addr_[leader], &why)) << why;
    ASSERT_EQ(WaitForLeader(2), next) << "the restarted master did not catch up as a standby:\n" << masters_[leader]->Log();
    before = reads;
    ASSERT_TRUE(WaitFor([&] { return reads > before + kFiles; }, seconds(60))) << "the reader is stuck";
    leader = next;
  }
  stop = true;
  reader.join();
  EXPECT_EQ(errors, 0u) << first_error;
  EXPECT_EQ(wrong, 0u);
  EXPECT_GT(reads, 4u * kFiles);

  // Everything the old leaders wrote is there: the mount, its inodes; the new leader writes.
  EXPECT_EQ(Inodes(), inodes);
  RunResult mounts = cluster_->Cli({"mounts"});
  EXPECT_NE(mounts.out.find("/data"), std::string::npos) << mounts.out;
  RunResult again = cluster_->Cli({"mount", "/more", "file://" + dir_ / "src/d1"});
  EXPECT_EQ(again.code, 0) << again.out;
  std::string got;
  EXPECT_TRUE(ReadFileChecked(cluster_->mountpoint() + "/more/f1", &got));
  EXPECT_EQ(got, files_["d1/f1"]);
  // The worker kept its membership across both failovers (it never had to register again).
  nlohmann::json report = cluster_->Report();
  ASSERT_TRUE(report.contains("workers")) << report.dump();
  EXPECT_EQ(report["workers"].size(), 1u);
}

}  // namespace
}  // namespace granary::testing
