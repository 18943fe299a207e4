// Fetch-ahead (master/fetch_ahead.h) through real processes and a real FUSE mount: an `ls` and one
// read start nothing; an epoch's reads start a fetch of the rest of the tree, after which the whole
// epoch reads from the cache, byte for byte; a full cache stops it without evicting anything; its
// bandwidth cap holds; a mount with cache.fetch_ahead=false is never fetched ahead.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kDirs = 10;
constexpr int kPerDir = 40;
constexpr size_t kFileSize = 20000;  // one 64 KiB block each

std::vector<std::string> MakeTree(const std::string& root, uint64_t seed) {
  std::vector<std::string> names;
  for (int d = 0; d < kDirs; ++d) {
    for (int i = 0; i < kPerDir; ++i) {
      std::string name = "class" + std::to_string(d) + "/img" + std::to_string(i) + ".jpg";
      WriteFile(root + "/" + name, RandomBytes(kFileSize, seed + d * 1000 + i));
      names.push_back(name);
    }
  }
  std::shuffle(names.begin(), names.end(), std::mt19937(seed));
  return names;
}

nlohmann::json Jobs(LocalCluster& c) {
  RunResult r = c.Cli({"jobs", "--json"});
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  if (r.code != 0 || j.is_discarded() || !j.is_array()) {
    ADD_FAILURE() << "granary jobs --json: " << r.code << " " << r.out;
    return nlohmann::json::array();
  }
  return j;
}

// The fetch-ahead jobs whose path starts with `prefix`.
std::vector<nlohmann::json> AheadJobs(LocalCluster& c, const std::string& prefix) {
  std::vector<nlohmann::json> out;
  for (const auto& j : Jobs(c)) {
    if (!j.value("fetch_ahead", false)) continue;
    for (const auto& p : j["paths"]) {
      if (p.get<std::string>().rfind(prefix, 0) == 0) out.push_back(j);
    }
  }
  return out;
}

class FetchAheadTest : public ::testing::Test {
 protected:
  void Start(ClusterOptions opts = {}) {
    cluster_ = std::make_unique<LocalCluster>(dir_, opts);
    std::string why;
    ASSERT_TRUE(cluster_->StartDaemons(&why)) << why;
    ASSERT_TRUE(cluster_->StartFuse(&why)) << why;
  }
  void Mount(const std::string& at, const std::string& src, std::vector<std::string> opts = {}) {
    std::vector<std::string> args = {"mount", at, "file://" + src};
    for (const auto& o : opts) {
      args.push_back("-o");
      args.push_back(o);
    }
    RunResult m = cluster_->Cli(args);
    ASSERT_EQ(m.code, 0) << m.out;
  }
  void ReadAll(const std::string& root, const std::vector<std::string>& names, const std::string& src) {
    for (const auto& n : names) {
      std::string got;
      ASSERT_TRUE(ReadFileChecked(root + "/" + n, &got)) << n;
      ASSERT_EQ(got, ReadFile(src + "/" + n)) << n << ": wrong bytes";
    }
  }
  // The fetch-ahead job of `prefix` once it has succeeded (null if none did within a minute).
  nlohmann::json EndedAheadJob(const std::string& prefix) {
    nlohmann::json job;
    WaitFor([&] {
      auto jobs = AheadJobs(*cluster_, prefix);
      if (jobs.empty() || jobs[0]["state"] != "succeeded") return false;
      job = jobs[0];
      return true;
    }, std::chrono::seconds(60));
    return job;
  }
  TempDir dir_;
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(FetchAheadTest, AnEpochIsFetchedAheadButAListingOrOneReadStartsNothing) {
  Start();
  const std::string src = dir_ / "src";
  std::vector<std::string> names = MakeTree(src, 1);
  Mount("/ds", src);
  const std::string root = cluster_->mountpoint() + "/ds";

  // A listing with every file's attributes, then one file read: evidence of one file, no job.
  size_t listed = 0;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    struct stat st;
    ASSERT_EQ(stat(it->path().c_str(), &st), 0);
    listed += S_ISREG(st.st_mode);
  }
  ASSERT_EQ(listed, names.size());
  ReadAll(root, {names[0]}, src);
  // `granary info` of the whole tree asks which blocks are cached: no open either.
  RunResult info = cluster_->Cli({"info", "/ds", "--json"});
  ASSERT_EQ(info.code, 0) << info.out;
  EXPECT_EQ(nlohmann::json::parse(info.out, nullptr, false).value("files", 0u), names.size()) << info.out;
  RunResult one = cluster_->Cli({"info", "/ds/" + names[1], "--json"});
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_EQ(nlohmann::json::parse(one.out, nullptr, false).value("cached_blocks", 1u), 0u) << one.out;
  const std::string opened = "granary_fetch_ahead_opened_files{mount=\"/ds\"}";
  // The open's evidence reaches the master in granary-fuse's next batch (fuse/open_notes.h).
  EXPECT_TRUE(testing::WaitFor([&] { return cluster_->Metric("master", opened) >= 1; }));
  EXPECT_EQ(cluster_->Metric("master", opened), 1) << "only an open is evidence, not a lookup or `granary info`";
  EXPECT_TRUE(AheadJobs(*cluster_, "/ds").empty());
  EXPECT_EQ(cluster_->Metric("worker", "granary_worker_fetch_ahead_blocks_total"), 0);

  // An epoch begins: 60 files in shuffled order, across every directory.
  std::vector<std::string> first(names.begin(), names.begin() + 60);
  ReadAll(root, first, src);
  nlohmann::json job = EndedAheadJob("/ds");
  ASSERT_TRUE(job.is_object()) << Jobs(*cluster_).dump() << cluster_->Logs();
  EXPECT_EQ(job["paths"][0], "/ds") << "the scope is the deepest directory holding every directory read";
  EXPECT_EQ(job["files_failed"], 0);
  EXPECT_GT(cluster_->Metric("worker", "granary_worker_fetch_ahead_blocks_total"), 0);

  // The rest of the epoch reads from the cache: no miss, the same bytes.
  uint64_t hits0, misses0, ufs0, hits1, misses1, ufs1;
  ASSERT_TRUE(cluster_->WorkerCounters(&hits0, &misses0, &ufs0));
  ReadAll(root, names, src);
  ASSERT_TRUE(cluster_->WorkerCounters(&hits1, &misses1, &ufs1));
  EXPECT_EQ(misses1, misses0) << "fetch-ahead left blocks of the epoch uncached";
  EXPECT_EQ(ufs1, ufs0);
  EXPECT_GE(hits1 - hits0, names.size());
  // Readers and fetch-ahead together fetched each block from the store once (single flight).
  EXPECT_EQ(ufs1, names.size() * kFileSize);
}

TEST_F(FetchAheadTest, AFullCacheStopsItAndNothingIsEvicted) {
  ClusterOptions opts;
  opts.cache_quota = "2Mi";  // about 90 of the 400 files
  Start(opts);
  const std::string src = dir_ / "src";
  std::vector<std::string> names = MakeTree(src, 2);
  Mount("/ds", src);
  const std::string root = cluster_->mountpoint() + "/ds";
  std::vector<std::string> first(names.begin(), names.begin() + 30);
  ReadAll(root, first, src);
  nlohmann::json job = EndedAheadJob("/ds");
  ASSERT_TRUE(job.is_object()) << Jobs(*cluster_).dump() << cluster_->Logs();
  EXPECT_NE(job["note"].get<std::string>().find("no free room"), std::string::npos) << job.dump();
  EXPECT_GT(cluster_->Metric("worker", "granary_worker_fetch_ahead_no_room_total"), 0);
  EXPECT_GT(cluster_->Metric("worker", "granary_worker_fetch_ahead_blocks_total"), 0);
  // Fetch-ahead took free room only: the files the readers read are all still cached.
  nlohmann::json report = cluster_->Report();
  ASSERT_TRUE(report.is_object());
  EXPECT_EQ(report["workers"][0]["evictions"].get<uint64_t>(), 0u) << report["workers"][0].dump();
  uint64_t hits0, misses0, ufs0, hits1, misses1, ufs1;
  ASSERT_TRUE(cluster_->WorkerCounters(&hits0, &misses0, &ufs0));
  ReadAll(root, first, src);
  ASSERT_TRUE(cluster_->WorkerCounters(&hits1, &misses1, &ufs1));
  EXPECT_EQ(misses1, misses0) << "a block the readers had read was evicted";
}

// cache.fetch_ahead.bandwidth: the bytes fetched ahead never run ahead of the cap (the worker's rate
// limiter keeps at most one second of credit, and a block in flight), and the fetch still ends.
// Only an upper bound on a rate is asserted: a slow machine only makes it smaller.
TEST_F(FetchAheadTest, TheBandwidthCapHolds) {
  Start();
  const std::string src = dir_ / "src";
  std::vector<std::string> names = MakeTree(src, 5);  // 8 MB: 8 s at the cap, well under 1 s without
  constexpr double kCap = 1'000'000;
  Mount("/ds", src, {"cache.fetch_ahead.bandwidth=1000000"});
  const std::string root = cluster_->mountpoint() + "/ds";
  const std::string ahead = "granary_worker_fetch_ahead_bytes_total";
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> first(names.begin(), names.begin() + 40);
  ReadAll(root, first, src);
  ASSERT_TRUE(WaitFor([&] { return cluster_->Metric("worker", ahead) > 0; }, std::chrono::seconds(60)))
      << cluster_->Logs();
  // Samples for 4 s (without a cap, the allowance of 8x the 40 files read comes in well under 1 s).
  double over = 0, since = 0;
  WaitFor([&] {
    const double bytes = cluster_->Metric("worker", ahead);
    since = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    over = std::max(over, bytes - (kCap * (since + 1) + 2 * 65536));
    return since >= 4;
  }, std::chrono::seconds(60));
  EXPECT_LE(over, 0) << "fetched ahead " << over << " bytes beyond the cap within " << since << " s";
  nlohmann::json job = EndedAheadJob("/ds");
  ASSERT_TRUE(job.is_object()) << Jobs(*cluster_).dump() << cluster_->Logs();
  EXPECT_EQ(job["files_failed"], 0);
}

TEST_F(FetchAheadTest, MountOptionTurnsItOff) {
  Start();
  const std::string on = dir_ / "on", off = dir_ / "off";
  std::vector<std::string> on_names = MakeTree(on, 3), off_names = MakeTree(off, 4);
  Mount("/off", off, {"cache.fetch_ahead=false"});
  Mount("/on", on);
  std::vector<std::string> first_off(off_names.begin(), off_names.begin() + 40);
  ReadAll(cluster_->mountpoint() + "/off", first_off, off);
  std::vector<std::string> first_on(on_names.begin(), on_names.begin() + 40);
  ReadAll(cluster_->mountpoint() + "/on", first_on, on);
  // The mount read second is fetched ahead; by then the first had the same evidence.
  ASSERT_TRUE(WaitFor([&] { return !AheadJobs(*cluster_, "/on").empty(); }, std::chrono::seconds(60)))
      << cluster_->Logs();
  EXPECT_TRUE(AheadJobs(*cluster_, "/off").empty()) << Jobs(*cluster_).dump();
  EXPECT_EQ(cluster_->Metric("master", "granary_fetch_ahead_opened_files{mount=\"/off\"}"), 0);
  RunResult bad = cluster_->Cli({"mount", "/bad", "file://" + on, "-o", "cache.fetch_ahead.inflight=0"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("cache.fetch_ahead.inflight"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace granary::testing
