// `granary local`: every daemon in one process, the CLI finding it without flags, Ctrl-C stopping it.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

TEST(GranaryLocal, ServesReadsReportsAndStops) {
  TempDir dir;
  for (int i = 0; i < 20; ++i) {
    WriteFile(dir / ("imagenet/n0" + std::to_string(i % 4) + "/img" + std::to_string(i) + ".JPEG"),
              RandomBytes(20000 + i * 4099, i));
  }
  mkdir((dir / "mnt").c_str(), 0755);
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"}};
  Process local({Bin("granary"), "local", "file://" + dir / "imagenet", dir / "mnt", "--dir", dir / "state"},
                dir / "local.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();

  // The under-storage is shown directly at the mount point.
  int files = 0;
  uint64_t bytes = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& e : fs::recursive_directory_iterator(dir / "imagenet")) {
      if (!e.is_regular_file()) continue;
      std::string rel = fs::relative(e.path(), dir / "imagenet").string();
      EXPECT_EQ(Sha256File(dir / ("mnt/" + rel)), Sha256File(e.path())) << rel;
      if (pass == 0) {
        ++files;
        bytes += e.file_size();
      }
    }
  }
  EXPECT_EQ(files, 20);

  // The CLI finds this master with no flags.
  nlohmann::json j;
  ASSERT_TRUE(WaitFor([&] {
    RunResult r = RunCommand({Bin("granary"), "report", "--json"}, env);
    if (r.code != 0) return false;
    j = nlohmann::json::parse(r.out, nullptr, false);
    return !j.is_discarded() && j["cache"]["hits"].get<uint64_t>() >= 20 &&
           j["mounts"][0]["cached_bytes"].get<uint64_t>() == bytes;
  })) << j.dump(2) << local.Log();
  EXPECT_EQ(j["mounts"][0]["path"], "/imagenet");
  EXPECT_DOUBLE_EQ(j["mounts"][0]["cached_percentage"].get<double>(), 100.0);
  EXPECT_EQ(j["cache"]["ufs_bytes"].get<uint64_t>(), bytes) << "each byte fetched once";
  RunResult mounts = RunCommand({Bin("granary"), "mounts"}, env);
  EXPECT_EQ(mounts.code, 0) << mounts.out;
  EXPECT_NE(mounts.out.find("/imagenet"), std::string::npos) << mounts.out;

  EXPECT_EQ(local.Stop(SIGINT), 0) << local.Log();
  EXPECT_FALSE(IsMounted(dir / "mnt"));
  EXPECT_FALSE(fs::exists(dir / "home/local.yaml")) << "discovery file must be removed on exit";
  RunResult after = RunCommand({Bin("granary"), "mounts"}, env);
  EXPECT_NE(after.code, 0);
}

}  // namespace
}  // namespace granary::testing
