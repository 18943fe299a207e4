// Transport security between Granary's daemons: the shared RPC token (refused without it, never
// printed) and TLS.
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

// rpc.tls_*: every daemon speaks TLS; a client without the CA cannot talk to them.
TEST(Security, TlsBetweenEveryDaemon) {
  TempDir dir;
  RunResult gen = RunCommand({"openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                              "/CN=granary-test", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout",
                              dir / "key.pem", "-out", dir / "cert.pem"});
  ASSERT_EQ(gen.code, 0) << gen.out;
  WriteFile(dir / "src/a.txt", "over tls\n");
  ClusterOptions opts;
  opts.extra_args = {"--rpc.tls_cert", dir / "cert.pem", "--rpc.tls_key", dir / "key.pem", "--rpc.tls_ca",
                     dir / "cert.pem"};
  LocalCluster c(dir, opts);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;

  RunResult plain = c.Cli({"mounts"});
  EXPECT_NE(plain.code, 0) << "a plaintext client must not get through: " << plain.out;

  WriteFile(dir / "client.yaml", "rpc:\n  tls_ca: " + dir / "cert.pem" + "\n");
  RunResult ok = c.Cli({"--config", dir / "client.yaml", "mount", "/ds", dir / "src"});
  ASSERT_EQ(ok.code, 0) << ok.out << c.Logs();
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  EXPECT_EQ(ReadFile(c.mountpoint() + "/ds/a.txt"), "over tls\n");
  EXPECT_TRUE(c.StopAll(&why)) << why;
}

}  // namespace
}  // namespace granary::testing
