#include "common/config.h"

#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "tests/testutil/testutil.h"

namespace granary {
namespace {

TEST(Config, EveryDefaultParses) {
  Config c = Config::Defaults();
  EXPECT_EQ(c.master.block_size, 4u << 20);
  EXPECT_EQ(c.worker.cache_quota, 10ull << 30);
  EXPECT_EQ(c.worker.heartbeat_interval.count(), 3000);
  EXPECT_EQ(c.fuse.mountpoint, "/data");
  EXPECT_TRUE(c.fuse.allow_other);
  for (const auto& s : Config::Settings()) {
    EXPECT_EQ(c.Get(s.key), s.get(c));
    EXPECT_FALSE(c.IsExplicit(s.key));
  }
}

TEST(Config, YamlSectionsOverrideDefaults) {
  Config c = Config::Defaults();
  ASSERT_TRUE(c.LoadYaml("worker:\n  cache_quota: 20Gi\n  heartbeat_interval: 500ms\nfuse:\n  allow_other: false\n", "t.yaml").ok());
  EXPECT_EQ(c.worker.cache_quota, 20ull << 30);
  EXPECT_EQ(c.worker.heartbeat_interval.count(), 500);
  EXPECT_FALSE(c.fuse.allow_other);
  EXPECT_TRUE(c.IsExplicit("worker.cache_quota"));
  EXPECT_FALSE(c.IsExplicit("worker.cache_dir"));
}

// Found by tests/fuzz/config_fuzz.cc under ASan: the walk kept a reference into a temporary of
// yaml-cpp's iterator (stack-use-after-scope) for every nested section; it read freed stack by luck.
// Under scripts/sanitize.sh this test fails on the old code.
TEST(Config, NestedSectionsAndAFlowListOfLevels) {
  Config c = Config::Defaults();
  Status s = c.LoadYaml(
      "master:\n  block_size: 4Mi\nworker:\n  cache_quota: 10Gi\n  tieredstore:\n    levels:\n"
      "      - {mediumtype: SSD, path: /cache, quota: 1Gi}\nfuse:\n  open: kernel\n  writes: false\n",
      "t.yaml");
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(c.worker.tieredstore.levels.size(), 1u);
  EXPECT_EQ(c.worker.tieredstore.levels[0].paths, std::vector<std::string>{"/cache"});
  EXPECT_EQ(c.worker.tieredstore.levels[0].quota(), 1ull << 30);
  EXPECT_FALSE(c.fuse.writes);
}

TEST(Config, ErrorsNameTheKey) {
  Config c = Config::Defaults();
  Status s = c.LoadYaml("worker:\n  cache_quota: 12Zi\n", "t.yaml");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("t.yaml: worker.cache_quota"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("512Mi"), std::string::npos) << s.message();

  s = c.LoadYaml("worker:\n  cache_qouta: 1Gi\n", "t.yaml");
  EXPECT_NE(s.message().find("unknown setting 'worker.cache_qouta'"), std::string::npos) << s.message();

  s = c.LoadYaml("master:\n  block_size:\n", "t.yaml");
  EXPECT_NE(s.message().find("master.block_size: no value given"), std::string::npos) << s.message();

  s = c.LoadYaml("master: [1, 2\n", "t.yaml");
  EXPECT_NE(s.message().find("not valid YAML"), std::string::npos) << s.message();

  s = c.LoadYaml("master:\n  listen: nowhere\n", "t.yaml");
  EXPECT_NE(s.message().find("master.listen"), std::string::npos) << s.message();
}

TEST(Config, FlagsOverrideFile) {
  testing::TempDir dir;
  testing::WriteFile(dir / "c.yaml", "worker:\n  cache_quota: 20Gi\n  cache_dir: /x\n");
  CLI::App app;
  ConfigFlags flags;
  AddConfigFlags(app, &flags);
  std::vector<std::string> args = {"--worker.cache_quota", "1Gi", "--config", dir / "c.yaml"};
  std::reverse(args.begin(), args.end());
  app.parse(args);
  auto c = BuildConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->worker.cache_quota, 1ull << 30);
  EXPECT_EQ(c->worker.cache_dir, "/x");
}

TEST(Config, MissingFileAndRangeChecks) {
  ConfigFlags flags;
  flags.config_file = "/nonexistent/granary.yaml";
  auto c = BuildConfig(flags);
  EXPECT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("/nonexistent/granary.yaml"), std::string::npos);
  ConfigFlags small;
  small.values["master.block_size"] = "1Ki";
  EXPECT_NE(BuildConfig(small).status().message().find("master.block_size"), std::string::npos);
}

// docs/configuration.md must list every setting with its default.
TEST(Config, DocumentationListsEverySetting) {
  std::string doc = testing::ReadFile(testing::SourceDir() + "/docs/configuration.md");
  ASSERT_FALSE(doc.empty());
  for (const auto& s : Config::Settings()) {
    EXPECT_NE(doc.find("`" + s.key + "`"), std::string::npos) << s.key << " is not in docs/configuration.md";
    if (!s.default_value.empty()) {
      EXPECT_NE(doc.find("`" + s.default_value + "`"), std::string::npos) << s.key << " default";
    }
  }
}

}  // namespace
}  // namespace granary

namespace granary {
namespace {

TEST(TieredStoreConfig, FluidStyleLevelsParse) {
  Config c = Config::Defaults();
  ASSERT_TRUE(c.LoadYaml(R"(worker:
  tieredstore:
    policy: shuffle
    levels:
      - {mediumtype: SSD, path: "/mnt/nvme0/granary,/mnt/nvme1/granary", quota: 150Gi, high: "0.99", low: "0.8"}
      - {mediumtype: MEM, path: /dev/shm/granary, quota: 2Gi, high: "0.95", low: "0.7", volumeType: emptyDir}
      - mediumtype: hdd
        path: /mnt/hdd/granary
        quotaList: 1Ti
)", "t.yaml").ok());
  EXPECT_EQ(c.worker.tieredstore.policy, CachePolicy::kShuffle);
  const auto& l = c.worker.tieredstore.levels;
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].medium, "MEM") << "levels are ordered fastest first";
  EXPECT_EQ(l[0].quota(), 2ull << 30);
  EXPECT_DOUBLE_EQ(l[0].high, 0.95);
  EXPECT_DOUBLE_EQ(l[0].low, 0.7);
  EXPECT_EQ(l[1].medium, "SSD");
  ASSERT_EQ(l[1].paths.size(), 2u);
  EXPECT_EQ(l[1].paths[1], "/mnt/nvme1/granary");
  EXPECT_EQ(l[1].quotas[0], 75ull << 30) << "quota is split evenly among paths";
  EXPECT_EQ(l[2].medium, "HDD");
  EXPECT_DOUBLE_EQ(l[2].high, 0.95) << "default";
  // The text form (granary config, --worker.tieredstore.levels) reads back the same.
  auto again = ParseTierLevels(c.Get("worker.tieredstore.levels"));
  ASSERT_TRUE(again.ok()) << again.status().message();
  ASSERT_EQ(again->size(), 3u);
  EXPECT_EQ((*again)[1].quotas, l[1].quotas);
  EXPECT_EQ((*again)[1].paths, l[1].paths);
}

TEST(TieredStoreConfig, LevelsFromAFlagAndTheDefaultLevel) {
  ConfigFlags flags;
  flags.values["worker.tieredstore.levels"] = "[{mediumtype: SSD, path: /c1, quotaList: 1Gi}]";
  auto c = BuildConfig(flags);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->worker.EffectiveLevels()[0].paths[0], "/c1");
  ConfigFlags none;
  none.values["worker.cache_dir"] = "/cache";
  auto d = BuildConfig(none);
  ASSERT_TRUE(d.ok());
  auto levels = d->worker.EffectiveLevels();
  ASSERT_EQ(levels.size(), 1u);
  EXPECT_EQ(levels[0].paths[0], "/cache");
  EXPECT_EQ(levels[0].quota(), d->worker.cache_quota);
  flags.values["worker.cache_dir"] = "/cache";
  EXPECT_NE(BuildConfig(flags).status().message().find("drop worker.cache_dir"), std::string::npos);
}

TEST(TieredStoreConfig, BadLevelsAreClearErrors) {
  struct Case {
    std::string yaml, expect;
  } cases[] = {
      {"[{mediumtype: NVM, path: /a, quota: 1Gi}]", "mediumtype must be MEM, SSD or HDD"},
      {"[{mediumtype: SSD, quota: 1Gi}]", "path is required"},
      {"[{mediumtype: SSD, path: rel/dir, quota: 1Gi}]", "must be absolute"},
      {"[{mediumtype: SSD, path: /a}]", "quota (or quotaList) is required"},
      {"[{mediumtype: SSD, path: /a, quota: lots}]", "level 0 (SSD): quota"},
      {"[{mediumtype: SSD, path: \"/a,/b\", quotaList: 1Gi}]", "quotaList has 1 entries for 2 paths"},
      {"[{mediumtype: SSD, path: /a, quota: 1Gi, high: \"1.5\"}]", "high: '1.5' is not a fraction"},
      {"[{mediumtype: SSD, path: /a, quota: 1Gi, high: \"0.5\", low: \"0.9\"}]", "low (0.9) must not be above high (0.5)"},
      {"[{mediumtype: SSD, path: /a, quota: 1Gi, hihg: \"0.5\"}]", "unknown field 'hihg'"},
      {"[{mediumtype: SSD, path: /a, quota: 1Gi}, {mediumtype: SSD, path: /b, quota: 1Gi}]", "appears twice"},
      {"[{mediumtype: MEM, path: /a, quota: 1Gi}, {mediumtype: SSD, path: /a, quota: 1Gi}]", "already used"},
      {"{mediumtype: SSD}", "expected a list of levels"},
  };
  for (const auto& c : cases) {
    auto r = ParseTierLevels(c.yaml);
    ASSERT_FALSE(r.ok()) << c.yaml;
    EXPECT_NE(r.status().message().find(c.expect), std::string::npos) << c.yaml << " -> " << r.status().message();
  }
  Config cfg = Config::Defaults();
  Status s = cfg.LoadYaml("worker:\n  tieredstore:\n    policy: fifo\n", "t.yaml");
  EXPECT_NE(s.message().find("worker.tieredstore.policy: 'fifo' is not a cache policy"), std::string::npos)
      << s.message();
}

// Found by tests/fuzz/config_fuzz.cc (in a CI run): a field name that is a map or a list threw out
// of ParseTierLevels, taking a worker down on one --worker.tieredstore.levels value.
TEST(TieredStoreConfig, AFieldNameThatIsNotAWordIsAnError) {
  for (const char* yaml : {"[{mediumtype: MEM, path: /dev/g, quota: 1Gi}: x]", "[{[a, b]: 1}]",
                           "[{{path: /a}: SSD}]"}) {
    auto l = ParseTierLevels(yaml);
    EXPECT_FALSE(l.ok()) << yaml;
  }
  auto named = ParseTierLevels("[{[a, b]: 1}]");
  ASSERT_FALSE(named.ok());
  EXPECT_NE(named.status().message().find("level 0"), std::string::npos) << named.status().ToString();
}

TEST(TieredStoreConfig, MountOptionWriteIsOffThroughOrBack) {
  std::map<std::string, std::string> ufs;
  MountCacheOptions cache;
  EXPECT_EQ(cache.write, WriteMode::kOff);
  ASSERT_TRUE(SplitMountOptions({{"write", "through"}}, &ufs, &cache).ok());
  EXPECT_EQ(cache.write, WriteMode::kThrough);
  ASSERT_TRUE(SplitMountOptions({{"write", "back"}}, &ufs, &cache).ok());
  EXPECT_EQ(cache.write, WriteMode::kBack);
  EXPECT_TRUE(ufs.empty()) << "write is Granary's own option, not the under-storage's";
  Status s = SplitMountOptions({{"write", "on"}}, &ufs, &cache);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("mount option write: 'on' is not off, through or back"), std::string::npos) << s.message();
}

TEST(TieredStoreConfig, MountOptionsSplitCacheFromUnderStorage) {
  std::map<std::string, std::string> ufs;
  MountCacheOptions cache;
  ASSERT_TRUE(SplitMountOptions({{"cache.policy", "shuffle"}, {"endpoint", "http://h"}}, &ufs, &cache).ok());
  EXPECT_EQ(cache.policy, CachePolicy::kShuffle);
  EXPECT_EQ(ufs.size(), 1u);
  EXPECT_EQ(ufs["endpoint"], "http://h");
  Status s = SplitMountOptions({{"cache.polcy", "lru"}}, &ufs, &cache);
  EXPECT_NE(s.message().find("unknown mount option 'cache.polcy'"), std::string::npos) << s.message();
  s = SplitMountOptions({{"cache.policy", "mru"}}, &ufs, &cache);
  EXPECT_NE(s.message().find("cache.policy"), std::string::npos) << s.message();

  EXPECT_EQ(cache.replicas, 1u);
  ASSERT_TRUE(SplitMountOptions({{"cache.replicas", "3"}}, &ufs, &cache).ok());
  EXPECT_EQ(cache.replicas, 3u);
  for (const char* bad : {"0", "17", "two", "-1", ""}) {
    s = SplitMountOptions({{"cache.replicas", bad}}, &ufs, &cache);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("cache.replicas: '" + std::string(bad) + "' is not a whole number from 1 to 16"),
              std::string::npos)
        << s.message();
  }

  EXPECT_TRUE(cache.elastic) << "elastic copies are on by default";
  ASSERT_TRUE(SplitMountOptions({{"cache.elastic", "false"}}, &ufs, &cache).ok());
  EXPECT_FALSE(cache.elastic);
  s = SplitMountOptions({{"cache.elastic", "no"}}, &ufs, &cache);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("cache.elastic: 'no' is not true or false"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace granary
