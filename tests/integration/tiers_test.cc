// The tiered cache through real processes and a real FUSE mount: two small levels filling,
// demoting and evicting while readers run; kill -9 of the worker while it writes blocks; corrupt
// block files; pin and free from the CLI.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kFiles = 120;

std::string FileName(int i) { return "class_" + std::to_string(i % 4) + "/img" + std::to_string(i) + ".jpg"; }

void MakeImages(const std::string& root) {
  for (int i = 0; i < kFiles; ++i) WriteFile(root + "/" + FileName(i), RandomBytes(90000 + (i % 7) * 7000, i + 11));
}

// Block files in every cache directory below `root`.
// The cache's data files (one per cached file, its blocks at their offsets), or with `sidecars`
// the blocks' sidecars (one per block).
std::vector<std::string> BlockFiles(const std::string& root, bool sidecars = false) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file() && it->path().parent_path().parent_path().filename() == "blocks" &&
        (it->path().extension() == ".m") == sidecars) {
      out.push_back(it->path());
    }
  }
  return out;
}

class TiersTest : public ::testing::Test {
 protected:
  void Start(ClusterOptions opts) {
    MakeImages(dir_ / "src");
    cluster_ = std::make_unique<LocalCluster>(dir_, std::move(opts));
    std::string why;
    ASSERT_TRUE(cluster_->StartDaemons(&why)) << why;
    RunResult m = cluster_->Cli({"mount", "/ds", "file://" + dir_ / "src"});
    ASSERT_EQ(m.code, 0) << m.out;
    ASSERT_TRUE(cluster_->StartFuse(&why)) << why;
  }
  void TearDown() override {
    if (HasFailure() && cluster_) std::cerr << cluster_->Logs();
  }
  std::string Mnt(int i) const { return cluster_->mountpoint() + "/ds/" + FileName(i); }
  std::string Src(int i) const { return dir_ / ("src/" + FileName(i)); }

  // Reads every file `passes` times in a shuffled order on `threads` threads; counts errors and
  // wrong bytes.
  void ReadAll(int threads, int passes, std::atomic<int>* errors, std::atomic<int>* wrong) {
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        std::mt19937 rng(static_cast<unsigned>(t + 1));
        std::vector<int> order(kFiles);
        for (int i = 0; i < kFiles; ++i) order[static_cast<size_t>(i)] = i;
        for (int p = 0; p < passes; ++p) {
          std::shuffle(order.begin(), order.end(), rng);
          for (int i : order) {
            std::string got;
            if (!ReadFileChecked(Mnt(i), &got)) {
              (*errors)++;
            } else if (got != ReadFile(Src(i))) {
              (*wrong)++;
            }
          }
        }
      });
    }
    for (auto& t : ts) t.join();
  }

  TempDir dir_;
  TempDir shm_{"/dev/shm"};
  std::unique_ptr<LocalCluster> cluster_;
};

TEST_F(TiersTest, TwoSmallLevelsFillDemoteAndEvictWhileReadersRun) {
  ClusterOptions o;
  // ~12 MB of images over 1 MiB of MEM and 3 MiB of SSD, in 64 KiB blocks.
  o.worker_args = {"--worker.tieredstore.levels",
                   "[{mediumtype: MEM, path: " + shm_ / "mem" + ", quota: 1Mi, high: \"0.8\", low: \"0.5\"}, "
                   "{mediumtype: SSD, path: " + dir_ / "ssd" + ", quota: 3Mi, high: \"0.8\", low: \"0.5\"}]"};
  Start(o);
  std::atomic<int> errors{0}, wrong{0};
  ReadAll(4, 2, &errors, &wrong);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(wrong.load(), 0);
  // The reserver runs in the background; wait for its counters to reach the master.
  nlohmann::json tiers;
  ASSERT_TRUE(WaitFor([&] {
    auto r = cluster_->Report();
    if (r.is_null() || r["workers"].empty()) return false;
    tiers = r["workers"][0]["tiers"];
    return tiers.size() == 2 && tiers[0]["demotions"].get<uint64_t>() > 0 && tiers[1]["evictions"].get<uint64_t>() > 0;
  })) << tiers.dump(2);
  EXPECT_EQ(tiers[0]["medium"], "MEM");
  EXPECT_EQ(tiers[1]["medium"], "SSD");
  for (const auto& t : tiers) EXPECT_LE(t["used_bytes"].get<uint64_t>(), t["capacity_bytes"].get<uint64_t>()) << t.dump();
  EXPECT_GT(tiers[0]["hits"].get<uint64_t>() + tiers[1]["hits"].get<uint64_t>(), 0u);
  // Cache files stay private and named by hash.
  for (const auto& f : BlockFiles(shm_.path())) {
    struct stat st;
    ASSERT_EQ(stat(f.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u) << f;
    EXPECT_EQ(f.find("img"), std::string::npos) << f;
  }
  RunResult text = cluster_->Cli({"report"});
  EXPECT_NE(text.out.find("MEM"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("demoted"), std::string::npos) << text.out;
}

TEST_F(TiersTest, KillNineWhileWritingBlocksThenEverythingReadsBackIdentical) {
  ClusterOptions o;
  // Reads fail while the worker is down (they are not the point here): no two-minute stall first.
  o.fuse_args = {"--fuse.worker_wait", "1s"};
  Start(o);
  std::atomic<bool> stop{false};
  std::atomic<int> errors{0}, wrong{0};
  // Cold readers keep the worker writing blocks.
  std::thread reader([&] {
    for (int i = 0; i < kFiles && !stop; ++i) {
      std::string got;
      if (!ReadFileChecked(Mnt(i), &got)) {
        errors++;  // expected while the worker is down
      } else if (got != ReadFile(Src(i))) {
        wrong++;
      }
    }
  });
  ASSERT_TRUE(WaitFor([&] { return BlockFiles(dir_ / "cache").size() >= 40; }));
  cluster_->KillWorker();
  stop = true;
  reader.join();
  EXPECT_EQ(wrong.load(), 0) << "a read returned wrong bytes";
  // What a crash can leave: a torn block file and a half-written temp file. The torn one holds a
  // block the worker had committed (it has a sidecar): a data file the kill interrupted before any
  // block of it was committed is debris, removed at start without counting as corrupt — and so is
  // a block whose sidecar the kill cut short. So the block torn here is the oldest one, committed
  // well before the kill (the first sidecar listed was once the one being written: a flake).
  auto sidecars = BlockFiles(dir_ / "cache", true);
  ASSERT_FALSE(sidecars.empty());
  std::sort(sidecars.begin(), sidecars.end(), [](const std::string& a, const std::string& b) {
    return fs::last_write_time(a) < fs::last_write_time(b);
  });
  std::string torn = sidecars[0].substr(0, sidecars[0].rfind('-'));  // <key>-<index>.m -> <key>
  ASSERT_TRUE(fs::exists(torn)) << torn;
  ASSERT_EQ(truncate(torn.c_str(), 5000), 0);
  WriteFile(dir_ / "cache/tmp/99999-1", std::string(3000, 'x'));

  std::string why;
  ASSERT_TRUE(cluster_->RestartWorker(&why)) << why;
  // FUSE's channel reconnects with a short backoff (at most 2 s).
  std::string first;
  ASSERT_TRUE(WaitFor([&] { return ReadFileChecked(Mnt(0), &first); }));
  for (int i = 0; i < kFiles; ++i) {
    std::string got;
    ASSERT_TRUE(ReadFileChecked(Mnt(i), &got)) << FileName(i);
    ASSERT_EQ(got, ReadFile(Src(i))) << FileName(i);
  }
  EXPECT_FALSE(fs::exists(dir_ / "cache/tmp/99999-1")) << "temp leftovers are removed at start";
  // The worker's stats reach the master with its next (early) heartbeat.
  nlohmann::json r;
  EXPECT_TRUE(WaitFor([&] {
    r = cluster_->Report();
    return !r.is_null() && r["workers"][0]["blocks"].get<uint64_t>() == BlockFiles(dir_ / "cache", true).size();
  })) << r.dump(1) << " vs " << BlockFiles(dir_ / "cache", true).size() << " block files";
  ASSERT_FALSE(r.is_null());
  EXPECT_GE(r["workers"][0]["corrupt_blocks"].get<uint64_t>(), 1u) << "the torn block was discarded";
}

TEST_F(TiersTest, FlippedBytesInACachedBlockAreDetectedAndRefetched) {
  ClusterOptions o;
  // The blocks are damaged right after they were cached: reads must not trust them as the
  // worker's own fresh writes (worker.trust_own_writes, 10s by default).
  o.worker_args = {"--worker.trust_own_writes", "0s"};
  Start(o);
  for (int i = 0; i < 10; ++i) {
    std::string got;
    ASSERT_TRUE(ReadFileChecked(Mnt(i), &got));
  }
  auto files = BlockFiles(dir_ / "cache");
  ASSERT_GE(files.size(), 10u);
  for (const auto& f : files) DamageOnDisk(f, 4096 + 1000);  // a byte of each file's first block
  for (int i = 0; i < 10; ++i) {
    std::string got;
    ASSERT_TRUE(ReadFileChecked(Mnt(i), &got)) << FileName(i);
    ASSERT_EQ(got, ReadFile(Src(i))) << FileName(i) << ": corrupt cached bytes were served";
  }
  nlohmann::json r;
  EXPECT_TRUE(WaitFor([&] {
    r = cluster_->Report();
    return !r.is_null() && r["workers"][0]["corrupt_blocks"].get<uint64_t>() >= 10u;
  })) << r.dump(1);
}

TEST_F(TiersTest, PinKeepsBlocksFreeRemovesThem) {
  ClusterOptions o;
  o.worker_args = {"--worker.tieredstore.levels",
                   "[{mediumtype: SSD, path: " + dir_ / "ssd" + ", quota: 6Mi, high: \"0.9\", low: \"0.6\"}]"};
  Start(o);
  uint64_t class0_blocks = 0;
  for (int i = 0; i < kFiles; i += 4) class0_blocks += (fs::file_size(Src(i)) + 65535) / 65536;
  RunResult pin = cluster_->Cli({"pin", "/ds/class_0"});
  ASSERT_EQ(pin.code, 0) << pin.out;
  EXPECT_NE(pin.out.find("30 files"), std::string::npos) << pin.out;
  std::atomic<int> errors{0}, wrong{0};
  ReadAll(2, 2, &errors, &wrong);  // 13 MB through 6 MiB: constant eviction
  EXPECT_EQ(errors.load() + wrong.load(), 0);
  uint64_t pinned = 0;
  ASSERT_TRUE(WaitFor([&] {
    auto r = cluster_->Report();
    if (r.is_null() || r["workers"].empty()) return false;
    pinned = r["workers"][0]["pinned_blocks"].get<uint64_t>();
    return pinned == class0_blocks && r["workers"][0]["evictions"].get<uint64_t>() > 0;
  })) << pinned << " of " << class0_blocks << " pinned blocks cached";
  // Every block of class_0 stayed cached whatever else was read and evicted.
  RunResult bad = cluster_->Cli({"free", "/ds/class_0"});
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("unpin"), std::string::npos) << bad.out;
  ASSERT_EQ(cluster_->Cli({"unpin", "/ds/class_0"}).code, 0);
  RunResult fr = cluster_->Cli({"free", "/ds"});
  ASSERT_EQ(fr.code, 0) << fr.out;
  ASSERT_TRUE(WaitFor([&] {
    auto r = cluster_->Report();
    return !r.is_null() && r["workers"][0]["blocks"].get<uint64_t>() == 0;
  }));
  EXPECT_TRUE(BlockFiles(dir_ / "ssd").empty());
  RunResult missing = cluster_->Cli({"pin", "/ds/nope"});
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.out.find("/ds/nope does not exist"), std::string::npos) << missing.out;
}

}  // namespace
}  // namespace granary::testing
