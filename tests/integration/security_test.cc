// The shared RPC token: calls without it are refused with a clear error, and it never appears in
// logs or output.
#include <gtest/gtest.h>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

TEST(Security, SharedTokenIsRequiredAndNeverPrinted) {
  TempDir dir;
  const std::string token = "tok-3f9a1c0d7e5b2468";
  WriteFile(dir / "token", token + "\n");
  chmod((dir / "token").c_str(), 0600);
  WriteFile(dir / "src/a.txt", "secret data\n");
  ClusterOptions opts;
  opts.extra_args = {"--rpc.token_file", dir / "token", "--log.level", "debug"};
  LocalCluster c(dir, opts);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;

  RunResult denied = c.Cli({"mounts"});
  EXPECT_NE(denied.code, 0);
  EXPECT_NE(denied.out.find("rpc token"), std::string::npos) << denied.out;

  WriteFile(dir / "client.yaml", "rpc:\n  token_file: " + dir / "token" + "\n");
  RunResult ok = c.Cli({"--config", dir / "client.yaml", "mount", "/ds", dir / "src"});
  ASSERT_EQ(ok.code, 0) << ok.out;
  ASSERT_TRUE(c.StartFuse(&why)) << why;  // the worker registered and FUSE reads with the token
  EXPECT_EQ(ReadFile(c.mountpoint() + "/ds/a.txt"), "secret data\n");

  // A wrong token is refused too.
  WriteFile(dir / "wrong", "nope\n");
  WriteFile(dir / "wrong.yaml", "rpc:\n  token_file: " + dir / "wrong" + "\n");
  RunResult wrong = c.Cli({"--config", dir / "wrong.yaml", "ls", "/ds"});
  EXPECT_NE(wrong.code, 0);
  EXPECT_NE(wrong.out.find("rpc token"), std::string::npos) << wrong.out;

  ASSERT_TRUE(c.StopAll(&why)) << why;
  std::string logs = c.Logs() + denied.out + ok.out + wrong.out;
  EXPECT_EQ(logs.find(token), std::string::npos) << "the token leaked into logs or output";
}

}  // namespace
}  // namespace granary::testing
