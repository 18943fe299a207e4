// A Granary cluster of several nodes on one machine: network namespaces made by scripts/netns.sh
// (a storage host running Ceph RGW, and N nodes on one bridge), the master on node 1, and a
// granary-worker and a granary-fuse on every node. Daemons join only their node's network
// namespace (nsenter --net), so every FUSE mount lands in this process's mount namespace and the
// test reads all of them. Bytes the under-storage sends are counted on the storage host's link.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/testutil/testutil.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kNodes = 3;
constexpr uint64_t kBlockSize = 256 * 1024;  // master.block_size below
const char* const kPrefix = "grt";         // our own namespaces, apart from the rig's (grp)
const char* const kSubnet = "10.234.0";    // exists only on the bridge netns.sh makes

std::string NodeNs(int n) { return std::string(kPrefix) + "-n" + std::to_string(n); }
std::string NodeIp(int n) { return std::string(kSubnet) + "." + std::to_string(n + 1); }
std::vector<std::string> InNs(const std::string& ns, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {"nsenter", "--net=/run/netns/" + ns, "--"});
  return argv;
}
std::map<std::string, std::string> NetnsEnv() { return {{"NETNS_PREFIX", kPrefix}, {"NETNS_SUBNET", kSubnet}}; }

// What the storage host has sent on its link. (`ip netns exec` mounts the namespace's own /sys.)
uint64_t StorageTxBytes() {
  RunResult r = RunCommand({"ip", "netns", "exec", std::string(kPrefix) + "-storage", "cat",
                            "/sys/class/net/eth0/statistics/tx_bytes"});
  EXPECT_EQ(r.code, 0) << r.out;
  return r.code == 0 ? std::stoull(r.out) : 0;
}


class ClusterTest : public ::testing::Test {
 protected:
  // One cluster for the suite: RGW takes ~20 s to start.
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string why;
    up_ = Start(&why);
    if (!up_) why_ = why;
  }
  static void TearDownTestSuite() {
    for (auto& p : fuse_) {
      if (p) p->Stop(SIGTERM, std::chrono::seconds(10));
    }
    UnmountAllBelow(dir_->path());
    fuse_.clear();
    workers_.clear();
    master_.reset();
    RunCommand(InNs(std::string(kPrefix) + "-storage", {"bash", SourceDir() + "/scripts/s3-server.sh", "stop", *dir_ / "rgw"}));
    RunCommand({"bash", SourceDir() + "/scripts/netns.sh", "down"}, NetnsEnv());
    delete dir_;
    dir_ = nullptr;
    // Nothing of this run is left for the next (GTEST_REPEAT sets the suite up again).
    files_.clear();
    dataset_bytes_ = 0;
    worker_addr_.clear();
    up_ = false;
    why_.clear();
  }
  void SetUp() override { ASSERT_TRUE(up_) << why_; }

  static bool Start(std::string* why) {
    RunResult net = RunCommand({"bash", SourceDir() + "/scripts/netns.sh", "up", std::to_string(kNodes), "10gbit"}, NetnsEnv());
    if (net.code != 0) return *why = "netns.sh up failed:\n" + net.out, false;
    std::string storage_ns = std::string(kPrefix) + "-storage";
    RunResult rgw = RunCommand(InNs(storage_ns, {"bash", SourceDir() + "/scripts/s3-server.sh", "start", *dir_ / "rgw"}),
                               {{"S3_BIND", std::string(kSubnet) + ".1"}}, std::chrono::seconds(180));
    std::istringstream in(rgw.out.substr(std::min(rgw.out.size(), rgw.out.rfind("READY"))));
    std::string ready, ak, sk;
    in >> ready >> endpoint_ >> ak >> sk;
    if (rgw.code != 0 || ready != "READY") return *why = "RGW did not start:\n" + rgw.out, false;
    WriteFile(*dir_ / "ak", ak);
    WriteFile(*dir_ / "sk", sk);
    chmod((*dir_ / "ak").c_str(), 0600);
    chmod((*dir_ / "sk").c_str(), 0600);

    // The dataset: small "images" and a few multi-block "shards".
    nlohmann::json objects = nlohmann::json::array();
    for (int i = 0; i < 40; ++i) {
      std::string name = "img/" + std::to_string(i % 4) + "/" + std::to_string(i) + ".jpg";
      files_[name] = RandomBytes(100'000 + 3'000 * i, 100 + i);
    }
    for (int i = 0; i < 4; ++i) files_["shards/shard-" + std::to_string(i)] = RandomBytes(2'500'000 + 77 * i, 200 + i);
    for (const auto& [name, data] : files_) {
      WriteFile(*dir_ / ("src/" + name), data);
      objects.push_back({{"key", "ds/" + name}, {"file", *dir_ / ("src/" + name)}});
      dataset_bytes_ += data.size();
    }
    WriteFile(*dir_ / "spec.json", nlohmann::json{{"bucket", "cluster"}, {"objects", objects}}.dump());
    RunResult put = RunCommand(InNs(storage_ns, {"/usr/bin/python3", SourceDir() + "/tests/integration/s3_put.py", endpoint_,
                                                 ak, sk, *dir_ / "spec.json"}),
                               {}, std::chrono::seconds(300));
    if (put.code != 0) return *why = "upload failed:\n" + put.out, false;

    master_ = std::make_unique<Process>(
        InNs(NodeNs(1), {Bin("granary-master"), "--master.listen", NodeIp(1) + ":0", "--master.data_dir", *dir_ / "master",
                         "--master.block_size", "256Ki", "--master.worker_timeout", "30s", "--ready-file",
                         *dir_ / "master.addr", "--rpc.allow_unauthenticated", "true", "--ufs.secrets_dir", dir_->path()}),
        *dir_ / "master.log");
    master_addr_ = WaitForReadyFile(*dir_ / "master.addr", master_.get());
    if (master_addr_.empty()) return *why = "master did not start:\n" + master_->Log(), false;
    for (int n = 1; n <= kNodes; ++n) {
      if (!StartWorker(n, NodeIp(n) + ":0", why)) return false;
    }
    RunResult m = Cli({"mount", "/ds", "s3://cluster/ds", "-o", "endpoint=" + endpoint_, "-o",
                       "access_key_file=" + *dir_ / "ak", "-o", "secret_key_file=" + *dir_ / "sk"});
    if (m.code != 0) return *why = "mount failed:\n" + m.out, false;
    for (int n = 1; n <= kNodes; ++n) {
      std::string node = *dir_ / ("node" + std::to_string(n));
      mkdir((node + "/mnt").c_str(), 0755);
      fuse_.push_back(std::make_unique<Process>(
          InNs(NodeNs(n), {Bin("granary-fuse"), "--master.address", master_addr_, "--fuse.worker", worker_addr_[n],
                           "--fuse.mountpoint", node + "/mnt", "--ready-file", node + "/fuse.addr",
                           "--fuse.keep_cache", "false", "--fuse.open", "daemon"}),  // every epoch reaches the workers
          node + "/fuse.log"));
      if (WaitForReadyFile(node + "/fuse.addr", fuse_.back().get()).empty() || !IsMounted(node + "/mnt")) {
        return *why = "fuse on node " + std::to_string(n) + " did not mount:\n" + fuse_.back()->Log(), false;
      }
    }
    // Every worker places blocks over the same membership before anything is read.
    if (!WaitFor([&] { return PeersKnown() == std::vector<uint64_t>(kNodes, kNodes); })) {
      return *why = "workers never learnt of each other:\n" + Cli({"report", "--json"}).out, false;
    }
    return true;
  }

  // Worker `n` (its directory node<n>), in node `ns`'s namespace (0: node n's).
  static bool StartWorker(int n, const std::string& listen, std::string* why, const std::string& quota = "1Gi",
                          int ns = 0) {
    std::string node = *dir_ / ("node" + std::to_string(n));
    fs::create_directories(node);
    unlink((node + "/worker.addr").c_str());
    workers_[n] = std::make_unique<Process>(
        InNs(NodeNs(ns ? ns : n), {Bin("granary-worker"), "--master.address", master_addr_, "--worker.listen", listen,
                         "--worker.heartbeat_interval", "200ms", "--worker.cache_dir", node + "/cache",
                         "--worker.cache_quota", quota, "--ready-file", node + "/worker.addr",
                         // Peer calls never reach their deadline here: a vanished peer must be noticed
                         // by connect timeouts and keepalive (see VanishedWorker... below).
                         "--rpc.timeout", "1h", "--rpc.allow_unauthenticated", "true", "--ufs.secrets_dir", dir_->path()}),
        node + "/worker.log");
    worker_addr_[n] = WaitForReadyFile(node + "/worker.addr", workers_[n].get());
    if (worker_addr_[n].empty()) return *why = "worker " + std::to_string(n) + " did not start:\n" + workers_[n]->Log(), false;
    return true;
  }

  static RunResult Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {Bin("granary"), "--master", master_addr_});
    return RunCommand(InNs(NodeNs(1), args), {{"GRANARY_HOME", *dir_ / "home"}});
  }
  static nlohmann::json Report() {
    RunResult r = Cli({"report", "--json"});
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return r.code == 0 && !j.is_discarded() ? j : nlohmann::json();
  }
  // The `peers` gauge of every live worker, ordered by address.
  static std::vector<uint64_t> PeersKnown() {
    std::vector<uint64_t> v;
    auto j = Report();
    if (j.is_null()) return v;
    for (const auto& w : j["workers"]) {
      if (w["alive"]) v.push_back(w["peers"]);
    }
    return v;
  }
  static uint64_t DatasetBlocks() {
    uint64_t n = 0;
    for (const auto& [name, data] : files_) n += (data.size() + kBlockSize - 1) / kBlockSize;
    return n;
  }
  // Sum of a counter over the workers in the report.
  static uint64_t Sum(const nlohmann::json& report, const char* key) {
    uint64_t s = 0;
    for (const auto& w : report["workers"]) s += w[key].get<uint64_t>();
    return s;
  }
  // A test that starts from nothing cached makes it so, whatever the tests before it left (issue
  // 56): every mounted dataset freed, then no block on any worker (a block of a dataset freed or
  // unmounted earlier that came back would show here: the free is final, docs/semantics.md).
  static void StartFromNothingCached() {
    nlohmann::json report = Report();
    ASSERT_FALSE(report.is_null());
    for (const auto& m : report["mounts"]) {
      RunResult r = Cli({"free", m["path"].get<std::string>()});
      ASSERT_EQ(r.code, 0) << r.out;
    }
    ASSERT_TRUE(WaitFor([&] { return Sum(Report(), "blocks") == 0; })) << Report().dump(1);
  }

  // Reads every file of the dataset (or the first `limit`) through node `n`'s mount (in a shuffled
  // order when `seed`), and counts files whose bytes differ or that failed.
  static void ReadEpoch(int n, unsigned seed, std::atomic<int>* bad, const std::string& mount = "ds",
                        size_t limit = SIZE_MAX) {
    std::vector<std::string> names;
    for (const auto& [name, data] : files_) names.push_back(name);
    std::shuffle(names.begin(), names.end(), std::mt19937(seed));
    if (names.size() > limit) names.resize(limit);
    for (const auto& name : names) {
      std::string got;
      bool ok = ReadFileChecked(*dir_ / ("node" + std::to_string(n) + "/mnt/" + mount + "/" + name), &got);
      if (!ok || got != files_[name]) {
        ++*bad;
        ADD_FAILURE() << "node " << n << " read " << name << (ok ? ": wrong bytes" : ": error");
      }
    }
  }

  static TempDir* dir_;
  static bool up_;
  static std::string why_, endpoint_, master_addr_;
  static std::map<int, std::string> worker_addr_;
  static std::unique_ptr<Process> master_;
  static std::map<int, std::unique_ptr<Process>> workers_;
  static std::vector<std::unique_ptr<Process>> fuse_;
  static std::map<std::string, std::string> files_;
  static uint64_t dataset_bytes_;
};
TempDir* ClusterTest::dir_ = nullptr;
bool ClusterTest::up_ = false;
std::string ClusterTest::why_, ClusterTest::endpoint_, ClusterTest::master_addr_;
std::map<int, std::string> ClusterTest::worker_addr_;
std::unique_ptr<Process> ClusterTest::master_;
std::map<int, std::unique_ptr<Process>> ClusterTest::workers_;
std::vector<std::unique_ptr<Process>> ClusterTest::fuse_;
std::map<std::string, std::string> ClusterTest::files_;
uint64_t ClusterTest::dataset_bytes_ = 0;

// Every node reads the same cold dataset at the same moment: the under-storage sends each byte
// once (the workers' own count, and the storage link's, which adds only protocol headers), every
// node sees identical bytes, and a second epoch reads nothing from the under-storage. With room
// (cache.elastic, the default), every node ends the epoch with the whole dataset in its own cache:
// one replica of each block (cache.replicas 1) and elastic copies on the other nodes, so the
// warm epoch asks no peer.
TEST_F(ClusterTest, AColdDatasetReadByEveryNodeAtOnceIsFetchedOnce) {
  uint64_t tx0 = StorageTxBytes();
  std::atomic<int> bad{0};
  std::vector<std::thread> readers;
  for (int n = 1; n <= kNodes; ++n) {
    for (int t = 0; t < 2; ++t) readers.emplace_back([n, &bad] { ReadEpoch(n, 0, &bad); });  // all in one order
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
  uint64_t cold_link = StorageTxBytes() - tx0;
  // The report follows the workers' heartbeats (sent early when a cache changed): wait for the
  // epoch's last ones.
  EXPECT_TRUE(WaitFor([&] { return Sum(Report(), "blocks") == kNodes * DatasetBlocks(); })) << Report().dump(1);
  auto r = Report();
  std::printf("cold epoch on %d nodes: storage link %.3f x the dataset, under-storage reads %.3f x\n", kNodes,
              double(cold_link) / double(dataset_bytes_), double(Sum(r, "ufs_bytes")) / double(dataset_bytes_));
  EXPECT_EQ(Sum(r, "ufs_bytes"), dataset_bytes_) << r.dump(1);
  EXPECT_LE(cold_link, dataset_bytes_ * 110 / 100) << "the storage link carried " << cold_link << " bytes";
  EXPECT_GE(cold_link, dataset_bytes_);
  EXPECT_GT(Sum(r, "peer_reads"), 0u);
  for (const auto& w : r["workers"]) EXPECT_EQ(w["blocks"].get<uint64_t>(), DatasetBlocks()) << "every node is whole";
  ASSERT_EQ(r["mounts"].size(), 1u);
  EXPECT_EQ(r["mounts"][0]["cached_bytes"].get<uint64_t>(), dataset_bytes_);
  EXPECT_EQ(r["mounts"][0]["replica_bytes"].get<uint64_t>(), dataset_bytes_) << "one replica of each block";
  EXPECT_EQ(r["mounts"][0]["elastic_bytes"].get<uint64_t>(), (kNodes - 1) * dataset_bytes_);
  RunResult du = Cli({"du", "/ds", "--json"});
  ASSERT_EQ(du.code, 0) << du.out;
  auto dj = nlohmann::json::parse(du.out, nullptr, false);
  ASSERT_FALSE(dj.is_discarded()) << du.out;
  EXPECT_EQ(dj["total"]["replica_bytes"].get<uint64_t>(), dataset_bytes_);
  EXPECT_EQ(dj["total"]["elastic_bytes"].get<uint64_t>(), (kNodes - 1) * dataset_bytes_);

  // Warm, shuffled, every node: the under-storage sends nothing, and no node asks a peer.
  tx0 = StorageTxBytes();
  uint64_t peer_reads = Sum(r, "peer_reads");
  readers.clear();
  for (int n = 1; n <= kNodes; ++n) readers.emplace_back([n, &bad] { ReadEpoch(n, 7 + n, &bad); });
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
  // Counters from heartbeats sent after the epoch ended, so an unwanted fetch or peer read shows.
  const int64_t ended = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::system_clock::now().time_since_epoch()).count();
  EXPECT_TRUE(WaitFor([&] {
    r = Report();
    for (const auto& w : r["workers"]) {
      if (w["alive"] && w["last_heartbeat_ns"].get<int64_t>() <= ended) return false;
    }
    return true;
  }, std::chrono::seconds(30))) << r.dump(1);
  EXPECT_EQ(Sum(r, "ufs_bytes"), dataset_bytes_);
  EXPECT_EQ(Sum(r, "peer_reads"), peer_reads) << "a warm epoch is local on every node";
  EXPECT_LT(StorageTxBytes() - tx0, 64u * 1024);  // ARP and the like, no data
}

// kill -9 of a worker while the other nodes read: no reader sees an error or a wrong byte; the
// dead worker's blocks are fetched again by stand-ins. The worker then comes back. The readers use
// a second mount of the same bucket without elastic copies (cache.elastic=false), so every epoch
// keeps asking the worker that is killed (with elastic copies, a warm node asks no one).
TEST_F(ClusterTest, KillingAWorkerMidReadCostsReadersNothing) {
  ASSERT_NO_FATAL_FAILURE(StartFromNothingCached());
  RunResult m = Cli({"mount", "/ds-remote", "s3://cluster/ds", "-o", "endpoint=" + endpoint_, "-o",
                     "access_key_file=" + *dir_ / "ak", "-o", "secret_key_file=" + *dir_ / "sk", "-o",
                     "cache.elastic=false"});
  ASSERT_EQ(m.code, 0) << m.out;
  // Every open drops the kernel's cached pages of the file (fuse.keep_cache false), so each epoch
  // goes to the workers.
  std::atomic<int> bad{0};
  std::atomic<bool> stop{false};
  std::atomic<int> epochs{0};
  std::vector<std::thread> readers;
  for (int n : {1, 3}) {
    readers.emplace_back([n, &bad, &stop, &epochs] {
      for (unsigned e = 0; !stop; ++e) {
        ReadEpoch(n, 100 + e, &bad, "ds-remote");
        ++epochs;
      }
    });
  }
  ASSERT_TRUE(WaitFor([&] { return epochs.load() >= 1; }));
  workers_[2]->Stop(SIGKILL);
  int at_kill = epochs.load();
  ASSERT_TRUE(WaitFor([&] { return epochs.load() >= at_kill + 4 || bad.load() > 0; }, std::chrono::seconds(120)));
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0);
  uint64_t failovers = 0;
  EXPECT_TRUE(WaitFor([&] {  // counters travel with the workers' heartbeats
    failovers = 0;
    auto r = Report();
    for (const auto& w : r["workers"]) {
      if (w["alive"]) failovers += w["peer_failovers"].get<uint64_t>();
    }
    return failovers >= 1;
  })) << Report().dump(1);

  // Node 2's own reader, with its worker dead: granary-fuse sends its reads to another live worker.
  std::atomic<int> bad_local{0};
  ReadEpoch(2, 77, &bad_local, "ds-remote");
  EXPECT_EQ(bad_local.load(), 0) << "reads on the dead worker's node failed";

  // The worker restarts on its address with its cache, and the cluster takes it back.
  std::string why;
  ASSERT_TRUE(StartWorker(2, worker_addr_[2], &why)) << why;
  EXPECT_TRUE(WaitFor([&] { return PeersKnown() == std::vector<uint64_t>(kNodes, kNodes); })) << Report().dump(1);
  std::atomic<int> bad2{0};
  ReadEpoch(2, 5, &bad2, "ds-remote");
  EXPECT_EQ(bad2.load(), 0);
  // What the others fetched while standing in for worker 2 are elastic copies, and the restarted
  // worker's cache is classified again: no block has more than one replica (cache.replicas 1).
  ReadEpoch(1, 6, &bad2, "ds-remote");  // every block cached at its home
  uint64_t replica = 0;
  EXPECT_TRUE(WaitFor([&] {
    replica = 0;
    auto r = Report();  // (kept: a range over a temporary's member would dangle)
    for (const auto& mr : r["mounts"]) replica += mr["replica_bytes"].get<uint64_t>();
    return replica == dataset_bytes_;
  })) << replica << " bytes of replicas for a " << dataset_bytes_ << "-byte dataset\n" << Report().dump(1);
}

// kill -9 of a worker while fetch-ahead is fetching (its bandwidth capped so that it is still at
// work): the readers of two other nodes read every file whole and right, and the worker comes back.
TEST_F(ClusterTest, AWorkerKilledMidFetchAheadCostsReadersNothing) {
  ASSERT_NO_FATAL_FAILURE(StartFromNothingCached());
  RunResult m = Cli({"mount", "/ds-ahead", "s3://cluster/ds", "-o", "endpoint=" + endpoint_, "-o",
                     "access_key_file=" + *dir_ / "ak", "-o", "secret_key_file=" + *dir_ / "sk", "-o",
                     "cache.elastic=false", "-o", "cache.fetch_ahead.bandwidth=1500000"});
  ASSERT_EQ(m.code, 0) << m.out;
  const uint64_t ahead0 = Sum(Report(), "ahead_bytes");
  // 20 files read on node 1 are the evidence (fetch-ahead starts past 16 distinct files); at the
  // cap, the rest of the 14 MB dataset takes it several seconds.
  std::atomic<int> bad{0};
  ReadEpoch(1, 11, &bad, "ds-ahead", 20);
  ASSERT_EQ(bad.load(), 0);
  ASSERT_TRUE(WaitFor([&] { return Sum(Report(), "ahead_bytes") > ahead0; }, std::chrono::seconds(60)))
      << Report().dump(1);
  workers_[2]->Stop(SIGKILL);
  std::vector<std::thread> readers;
  for (int n : {1, 3}) readers.emplace_back([n, &bad] { ReadEpoch(n, 20 + n, &bad, "ds-ahead"); });
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0) << "a reader saw an error or a wrong byte";
  std::string why;
  ASSERT_TRUE(StartWorker(2, worker_addr_[2], &why)) << why;
  EXPECT_TRUE(WaitFor([&] { return PeersKnown() == std::vector<uint64_t>(kNodes, kNodes); })) << Report().dump(1);
  std::atomic<int> bad2{0};
  ReadEpoch(2, 31, &bad2, "ds-ahead");
  EXPECT_EQ(bad2.load(), 0);
  // The fetch-ahead job ends (whatever its outcome with a worker gone), and leaves nothing behind
  // for the next test: its blocks are freed before the mount goes.
  EXPECT_TRUE(WaitFor([&] {
    RunResult r = Cli({"jobs", "--json"});
    auto jobs = nlohmann::json::parse(r.out, nullptr, false);
    if (r.code != 0 || !jobs.is_array()) return false;
    for (const auto& j : jobs) {
      const std::string state = j.value("state", "");
      if (j.value("fetch_ahead", false) && state != "succeeded" && state != "failed" && state != "cancelled") {
        return false;
      }
    }
    return true;
  }, std::chrono::seconds(60))) << Cli({"jobs", "--json"}).out;
  ASSERT_EQ(Cli({"free", "/ds-ahead"}).code, 0);
  ASSERT_EQ(Cli({"unmount", "/ds-ahead"}).code, 0);
}

// `granary load --replicas 2` on the whole cluster: one job whose batches every worker shares;
// each block is fetched from the storage once (counted on its link) and kept on exactly two
// workers; a second load sends nothing.
TEST_F(ClusterTest, LoadWithReplicasSpreadsCopiesOverTheWorkers) {
  ASSERT_NO_FATAL_FAILURE(StartFromNothingCached());
  ASSERT_TRUE(WaitFor([&] { return PeersKnown() == std::vector<uint64_t>(kNodes, kNodes); }));
  uint64_t tx0 = StorageTxBytes();
  RunResult load = RunCommand(InNs(NodeNs(1), {Bin("granary"), "--master", master_addr_, "load", "/ds", "--replicas",
                                               "2", "--json"}),
                              {}, std::chrono::seconds(300));
  ASSERT_EQ(load.code, 0) << load.out;
  auto j = nlohmann::json::parse(load.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << load.out;
  EXPECT_EQ(j["files_done"].get<uint64_t>(), files_.size());
  EXPECT_EQ(j["blocks_fetched"].get<uint64_t>() + j["blocks_cached"].get<uint64_t>(), 2 * DatasetBlocks());
  uint64_t link = StorageTxBytes() - tx0;
  EXPECT_GE(link, dataset_bytes_);
  EXPECT_LE(link, dataset_bytes_ * 110 / 100) << "each block crossed the storage link once";
  ASSERT_TRUE(WaitFor([&] { return Sum(Report(), "blocks") == 2 * DatasetBlocks(); })) << Report().dump(1);
  auto r = Report();
  EXPECT_EQ(r["mounts"][0]["cached_bytes"].get<uint64_t>(), dataset_bytes_);
  int loaded_on = 0;
  for (const auto& w : r["workers"]) loaded_on += w["alive"] && w["loaded_blocks"].get<uint64_t>() > 0;
  EXPECT_EQ(loaded_on, kNodes) << "the job was split across every worker";

  tx0 = StorageTxBytes();
  RunResult again = RunCommand(InNs(NodeNs(1), {Bin("granary"), "--master", master_addr_, "load", "/ds", "--replicas",
                                                "2", "--json"}),
                               {}, std::chrono::seconds(300));
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_EQ(nlohmann::json::parse(again.out)["bytes_fetched"], 0);
  EXPECT_LT(StorageTxBytes() - tx0, 64u * 1024);
}

// A worker whose host vanishes without closing its connections (its link cut: no RST, no FIN):
// reads that need it fail over within seconds — a connect timeout for new connections, keepalive
// for open ones — not at the call deadline (1 h for these workers).
TEST_F(ClusterTest, AVanishedWorkerCostsSecondsNotTheCallDeadline) {
  struct LinkBack {
    ~LinkBack() { RunCommand({"ip", "-n", NodeNs(2), "link", "set", "eth0", "up"}); }
  } link_back;
  // Node 1 reads everything once, so its worker has live connections to nodes 2 and 3.
  std::atomic<int> bad{0};
  ReadEpoch(1, 11, &bad);
  ASSERT_EQ(bad.load(), 0);
  ASSERT_EQ(RunCommand({"ip", "-n", NodeNs(2), "link", "set", "eth0", "down"}).code, 0);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    ReadEpoch(1, 12, &bad);  // blocks whose home is node 2 go to the next worker
    done = true;
  });
  bool finished = WaitFor([&] { return done.load(); }, std::chrono::seconds(120));
  if (!finished) RunCommand({"ip", "-n", NodeNs(2), "link", "set", "eth0", "up"});  // let the reader end
  reader.join();
  EXPECT_TRUE(finished) << "a read waited for the vanished worker's call deadline";
  EXPECT_EQ(bad.load(), 0);
}

// The JSON objects among a log's lines.
std::vector<nlohmann::json> JsonLines(const std::string& log) {
  std::vector<nlohmann::json> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

// `granary stats` on node 2 while that node reads the dataset: over a window holding the whole
// read, the counts add up to it (files, bytes, and every byte with one source).
TEST_F(ClusterTest, StatsOfANodeAddUpToWhatItsReaderDid) {
  std::string node = *dir_ / "node2";
  Process stats(InNs(NodeNs(2), {Bin("granary"), "stats", node + "/mnt", "--interval", "300ms", "--json"}),
                *dir_ / "stats2.log", {{"GRANARY_HOME", *dir_ / "home"}});
  ASSERT_TRUE(WaitFor([&] { return JsonLines(stats.Log()).size() >= 1 || !stats.Running(); })) << stats.Log();
  size_t first = JsonLines(stats.Log()).size();
  std::atomic<int> bad{0};
  ReadEpoch(2, 3, &bad);
  EXPECT_EQ(bad.load(), 0);
  const size_t done = JsonLines(stats.Log()).size();  // lines printed by the time the read ended
  ASSERT_TRUE(WaitFor([&] { return JsonLines(stats.Log()).size() >= done + 2; })) << stats.Log();
  stats.Stop(SIGINT);
  auto lines = JsonLines(stats.Log());
  double files = 0, bytes = 0, by_source = 0;
  for (size_t i = first; i < lines.size(); ++i) {
    files += lines[i]["fuse"]["files"].get<double>();
    bytes += lines[i]["fuse"]["read_bytes"].get<double>();
    by_source += lines[i]["read"]["local_bytes"].get<double>() + lines[i]["read"]["peer_bytes"].get<double>() +
                 lines[i]["read"]["under_storage_bytes"].get<double>();
    EXPECT_EQ(lines[i]["cache"]["workers"], 1) << "one node's view";
  }
  std::string per_line;
  for (const auto& l : lines) per_line += std::to_string(l["fuse"]["files"].get<double>()) + " ";
  EXPECT_EQ(files, files_.size()) << "from line " << first << " of " << per_line;
  EXPECT_EQ(bytes, dataset_bytes_) << stats.Log();
  EXPECT_EQ(by_source, dataset_bytes_) << "every byte has one source";
}

// Writes from two nodes to one name (write=through, on RGW): both writers' bytes are staged on their
// own nodes; each close replaces the object whole, and the last close wins. A reader on a third
// node sees, at every moment, nothing, one writer's whole file or the other's — never a mix — and
// after the last close it sees the last writer's bytes (close-to-open: nothing of a writable mount
// is cached).
TEST_F(ClusterTest, TwoNodesWriteOneNameAndTheLastCloseWinsWhole) {
  RunResult m = Cli({"mount", "/out", "s3://cluster/out", "-o", "endpoint=" + endpoint_, "-o",
                     "access_key_file=" + *dir_ / "ak", "-o", "secret_key_file=" + *dir_ / "sk", "-o", "write=through"});
  ASSERT_EQ(m.code, 0) << m.out;
  const std::string a = RandomBytes(3 << 20, 101), b = RandomBytes(3 << 20, 102);
  auto path = [&](int n) { return *dir_ / ("node" + std::to_string(n) + "/mnt/out/ckpt.pt"); };
  auto logs = [&] { return fuse_[0]->LogTail() + "\n" + fuse_[1]->LogTail() + "\n" + master_->LogTail(); };
  int fa = open(path(1).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fa, 0) << strerror(errno) << "\n" << logs();
  int fb = open(path(2).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fb, 0) << strerror(errno) << "\n" << logs();
  // What node 3 may see of the file at any moment.
  auto seen_ok = [&](std::string* what) {
    std::string got;
    if (!ReadFileChecked(path(3), &got)) return *what = "a read error", false;
    if (got.empty() || got == a || got == b) return true;
    return *what = "a mix of " + std::to_string(got.size()) + " bytes", false;
  };
  std::string what;
  for (size_t off = 0; off < a.size(); off += 1 << 20) {
    ASSERT_EQ(pwrite(fa, a.data() + off, 1 << 20, static_cast<off_t>(off)), 1 << 20);
    ASSERT_EQ(pwrite(fb, b.data() + off, 1 << 20, static_cast<off_t>(off)), 1 << 20);
    EXPECT_TRUE(seen_ok(&what)) << "node 3 saw " << what << " while the file was written";
  }
  ASSERT_EQ(close(fa), 0) << strerror(errno);
  std::string got;
  ASSERT_TRUE(ReadFileChecked(path(3), &got));
  EXPECT_TRUE(got == a) << "after the first close node 3 must see its bytes whole (" << got.size() << " bytes)";
  ASSERT_EQ(close(fb), 0) << strerror(errno);
  ASSERT_TRUE(ReadFileChecked(path(3), &got));
  EXPECT_TRUE(got == b) << "the last close wins, whole (" << got.size() << " bytes)";
  ASSERT_TRUE(ReadFileChecked(path(1), &got));
  EXPECT_TRUE(got == b) << "the first writer's node sees the last version too";
  ASSERT_EQ(Cli({"unmount", "/out"}).code, 0);
}

// `granary info` on a file partly cached across the workers (a mount without elastic copies, so
// each block read lands on its home only) shows each cached block on exactly one worker, which
// blocks are on this node, and agrees with the master's du.
TEST_F(ClusterTest, InfoShowsWhereEachBlockOfAPartlyCachedFileIs) {
  ASSERT_NO_FATAL_FAILURE(StartFromNothingCached());
  RunResult m = Cli({"mount", "/ds-info", "s3://cluster/ds", "-o", "endpoint=" + endpoint_, "-o",
                     "access_key_file=" + *dir_ / "ak", "-o", "secret_key_file=" + *dir_ / "sk", "-o",
                     "cache.elastic=false"});
  ASSERT_EQ(m.code, 0) << m.out;
  const std::string name = "shards/shard-1";
  const std::string& want = files_[name];
  std::string local = *dir_ / ("node1/mnt/ds-info/" + name);
  int fd = open(local.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  for (uint64_t b = 0; b < 6; ++b) {  // 6 of the file's 10 blocks
    std::string buf(1000, '\0');
    ASSERT_EQ(pread(fd, buf.data(), buf.size(), static_cast<off_t>(b * kBlockSize)), 1000);
    EXPECT_EQ(buf, want.substr(b * kBlockSize, 1000));
  }
  close(fd);
  nlohmann::json info;
  ASSERT_TRUE(WaitFor([&] {
    RunResult r = RunCommand(InNs(NodeNs(1), {Bin("granary"), "--master", master_addr_, "info", local, "--json"}),
                             {{"GRANARY_HOME", *dir_ / "home"}});
    info = nlohmann::json::parse(r.out, nullptr, false);
    if (r.code != 0 || !info.is_object()) return false;
    RunResult du = Cli({"du", "/ds-info/" + name, "--json"});
    auto dj = nlohmann::json::parse(du.out, nullptr, false);
    return du.code == 0 && dj.is_object() && info["cached_bytes"] == dj["total"]["cached_bytes"];
  })) << info.dump(1) << Cli({"du", "/ds-info/" + name, "--json"}).out;
  EXPECT_EQ(info["path"], "/ds-info/" + name);
  EXPECT_EQ(info["blocks"].get<uint64_t>(), (want.size() + kBlockSize - 1) / kBlockSize);
  EXPECT_EQ(info["local_worker"], worker_addr_[1]);
  EXPECT_EQ(info["workers_failed"], 0) << "every worker answered the master";
  std::set<std::string> holders;
  uint64_t cached = 0, on_node1 = 0;
  for (const auto& b : info["block_list"]) {
    if (b["index"].get<uint64_t>() < 6) {
      EXPECT_TRUE(b["cached"].get<bool>()) << b.dump();
    }
    if (!b["cached"].get<bool>()) continue;
    ++cached;
    ASSERT_EQ(b["holders"].size(), 1u) << "one replica, no elastic copy: " << b.dump();
    const auto& h = b["holders"][0];
    EXPECT_EQ(h["kind"], "replica");
    holders.insert(h["worker"].get<std::string>());
    bool here = h["worker"] == worker_addr_[1];
    EXPECT_EQ(h["local"].get<bool>(), here);
    EXPECT_EQ(b["local"].get<bool>(), here);
    on_node1 += here;
  }
  EXPECT_EQ(info["cached_blocks"].get<uint64_t>(), cached);
  EXPECT_EQ(info["local_blocks"].get<uint64_t>(), on_node1);
  // The homes are a rendezvous hash of each block's key, which names the object's version (new in
  // every run): all 6 blocks on one of the 3 workers happens in about 1 run of 250 (seen in CI).
  // The checks above hold for whichever workers hold them; the spread itself is not asserted.
  if (holders.size() < 2) std::printf("note: all %llu cached blocks have one home this run\n", (unsigned long long)cached);
  RunResult text = RunCommand(InNs(NodeNs(1), {Bin("granary"), "--master", master_addr_, "info", "/ds-info/" + name}));
  EXPECT_EQ(text.code, 0) << text.out;
  EXPECT_NE(text.out.find("not cached"), std::string::npos) << text.out;
  // A directory: its cached share and how many files are wholly on this node.
  RunResult dir = RunCommand(InNs(NodeNs(1), {Bin("granary"), "--master", master_addr_, "info", *dir_ / "node1/mnt/ds-info/shards", "--json"}),
                             {{"GRANARY_HOME", *dir_ / "home"}});
  ASSERT_EQ(dir.code, 0) << dir.out;
  auto dj = nlohmann::json::parse(dir.out, nullptr, false);
  ASSERT_TRUE(dj.is_object()) << dir.out;
  EXPECT_EQ(dj["files"], 4);
  EXPECT_EQ(dj["cached_bytes"], info["cached_bytes"]);
  EXPECT_EQ(dj["files_wholly_local"], 0) << "no shard is whole on node 1";
  ASSERT_EQ(Cli({"unmount", "/ds-info"}).code, 0);
}

// Every metric the Grafana dashboard (deploy/grafana) queries is served by a daemon: a scrape of
// the master, every worker and every granary-fuse of the cluster.
TEST_F(ClusterTest, TheDashboardQueriesOnlyMetricsTheDaemonsServe) {
  std::set<std::string> served;
  auto scrape = [&](int n, int port) {
    RunResult r = RunCommand(InNs(NodeNs(n), {"/usr/bin/python3", "-c",
                                              "import sys,urllib.request;sys.stdout.write(urllib.request.urlopen("
                                              "'http://127.0.0.1:" + std::to_string(port) + "/metrics').read().decode())"}));
    EXPECT_EQ(r.code, 0) << "node " << n << " port " << port << ": " << r.out;
    std::istringstream in(r.out);
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("# TYPE ", 0) == 0) {
        std::istringstream t(line.substr(7));
        std::string name, type;
        t >> name >> type;
        served.insert(name);
        if (type == "histogram") {
          for (const char* s : {"_bucket", "_sum", "_count"}) served.insert(name + s);
        }
      } else if (!line.empty() && line[0] != '#') {
        served.insert(line.substr(0, line.find_first_of("{ ")));
      }
    }
  };
  scrape(1, 19996);  // master.metrics_listen's default
  for (int n = 1; n <= kNodes; ++n) {
    scrape(n, 29996);  // worker
    scrape(n, 29997);  // granary-fuse
  }
  auto dash = nlohmann::json::parse(ReadFile(SourceDir() + "/deploy/grafana/granary-dashboard.json"), nullptr, false);
  ASSERT_TRUE(dash.is_object());
  std::regex metric(R"(\b((granary|process)_[a-z0-9_]+))");
  int exprs = 0;
  std::set<std::string> used;
  for (const auto& p : dash["panels"]) {
    for (const auto& t : p["targets"]) {
      std::string e = t["expr"];
      ++exprs;
      for (std::sregex_iterator it(e.begin(), e.end(), metric), end; it != end; ++it) used.insert((*it)[1]);
    }
  }
  std::string q = dash["templating"]["list"][1]["query"];
  for (std::sregex_iterator it(q.begin(), q.end(), metric), end; it != end; ++it) used.insert((*it)[1]);
  EXPECT_GE(exprs, 20);
  for (const auto& name : used) EXPECT_TRUE(served.count(name)) << name << " is in the dashboard but no daemon serves it";
  for (const char* must : {"granary_fuse_mount_read_bytes_total", "granary_worker_cache_high_watermark_ratio",
                           "granary_worker_ufs_retries_total", "granary_load_job_progress_ratio",
                           "granary_fuse_operation_duration_seconds_bucket"}) {
    EXPECT_TRUE(used.count(must)) << must << " should be on the dashboard";
  }
}

// A fourth worker joins a cluster that has cached the dataset: the blocks it becomes the home of
// are copied from their previous homes (Placement::PreviousHome), not fetched from the store again,
// and the readers get the same bytes. It leaves again at the end (after master.worker_timeout).
TEST_F(ClusterTest, AJoiningWorkerCopiesItsBlocksFromTheirPreviousHomes) {
  ASSERT_NO_FATAL_FAILURE(StartFromNothingCached());
  std::atomic<int> bad{0};
  ReadEpoch(2, 71, &bad);  // every block cached at its home (and node 2 whole)
  ASSERT_EQ(bad.load(), 0);
  std::string why;
  ASSERT_TRUE(StartWorker(4, NodeIp(3) + ":0", &why, "1Gi", /*ns=*/3)) << why;
  struct Leave {  // the cluster is three workers again for the next test, also when this one fails
    ~Leave() {
      // Nothing cached is left on the worker that leaves (the report keeps a lost worker's last
      // counts).
      EXPECT_EQ(Cli({"free", "/ds"}).code, 0);
      EXPECT_TRUE(WaitFor([] { return Sum(Report(), "blocks") == 0; })) << Report().dump(1);
      workers_[4]->Stop(SIGKILL);
      EXPECT_TRUE(WaitFor([] { return PeersKnown() == std::vector<uint64_t>(kNodes, kNodes); },
                          std::chrono::seconds(90)))
          << Report().dump(1);
    }
  } leave;
  ASSERT_TRUE(WaitFor([&] { return PeersKnown() == std::vector<uint64_t>(kNodes + 1, kNodes + 1); }))
      << Report().dump(1);
  const uint64_t tx0 = StorageTxBytes();
  ReadEpoch(1, 72, &bad);
  EXPECT_EQ(bad.load(), 0);
  const uint64_t sent = StorageTxBytes() - tx0;
  EXPECT_LT(sent, 100'000u) << "the store sent " << sent << " bytes: a moved block was fetched again";
  EXPECT_TRUE(WaitFor([&] { return Sum(Report(), "previous_home_blocks") > 0; })) << Report().dump(1);
}

// Every node's cache smaller than the dataset (14 MiB each for a 16 MB dataset; one node's share
// of the replicas is about a third of it, and its low watermark, 10 MB, leaves room for the
// largest share placement can give it): elastic copies give way, the cluster keeps exactly one
// replica of each block (cache.replicas 1), no worker goes over its quota, and the bytes are right.
// Last in the suite: it restarts the workers with the small cache.
TEST_F(ClusterTest, WithoutRoomElasticCopiesGiveWayAndReplicasStayExact) {
  ASSERT_NO_FATAL_FAILURE(StartFromNothingCached());
  for (int n = 1; n <= kNodes; ++n) {
    workers_[n]->Stop(SIGTERM, std::chrono::seconds(10));
    std::string why;
    ASSERT_TRUE(StartWorker(n, worker_addr_[n], &why, "14Mi")) << why;
  }
  ASSERT_TRUE(WaitFor([&] { return PeersKnown() == std::vector<uint64_t>(kNodes, kNodes); })) << Report().dump(1);
  std::atomic<int> bad{0};
  for (unsigned epoch = 0; epoch < 2; ++epoch) {
    std::vector<std::thread> readers;
    for (int n = 1; n <= kNodes; ++n) readers.emplace_back([n, epoch, &bad] { ReadEpoch(n, 40 + 10 * epoch + n, &bad); });
    for (auto& t : readers) t.join();
  }
  EXPECT_EQ(bad.load(), 0);
  uint64_t replica = 0, elastic = 0;
  EXPECT_TRUE(WaitFor([&] {
    replica = elastic = 0;
    auto r = Report();
    for (const auto& mr : r["mounts"]) {
      replica += mr["replica_bytes"].get<uint64_t>();
      elastic += mr["elastic_bytes"].get<uint64_t>();
    }
    return replica == dataset_bytes_;
  })) << replica << " bytes of replicas for a " << dataset_bytes_ << "-byte dataset\n" << Report().dump(1);
  EXPECT_GT(elastic, 0u) << "the room the replicas leave holds elastic copies";
  EXPECT_LT(replica + elastic, kNodes * dataset_bytes_) << "the caches could not all be whole";
  auto r = Report();
  for (const auto& w : r["workers"]) {
    if (!w["alive"]) continue;
    EXPECT_LE(w["used_bytes"].get<uint64_t>(), w["capacity_bytes"].get<uint64_t>()) << w.dump(1);
  }
}

}  // namespace
}  // namespace granary::testing
