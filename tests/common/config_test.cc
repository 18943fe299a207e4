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
