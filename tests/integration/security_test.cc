// Transport security between Granary's daemons: the shared RPC token (refused without it, never
// printed) and TLS.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>

#include "proto/granary.grpc.pb.h"
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
  {
    // Fetch-ahead's evidence (NoteOpens) is no exception.
    auto stub = rpc::Master::NewStub(grpc::CreateChannel(c.master_address(), grpc::InsecureChannelCredentials()));
    rpc::NoteOpensRequest req;
    req.add_inos(2);
    rpc::NoteOpensResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    EXPECT_EQ(stub->NoteOpens(&ctx, req, &resp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }

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

// A credential given inline to the master's Mount RPC (which the CLI never sends, but any gRPC
// client can) is refused there, by name, and its value reaches no file, log, listing or metric.
TEST(Security, InlineSecretsAreRefusedAtTheMaster) {
  TempDir dir;
  WriteFile(dir / "src/a.txt", "data\n");
  WriteFile(dir / "sk", "from-a-file\n");
  const std::string secret = "InL1ne-S3cret-9b7e41";
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  auto stub = rpc::Master::NewStub(grpc::CreateChannel(c.master_address(), grpc::InsecureChannelCredentials()));
  struct Case {
    std::string uri, key, wanted;
  };
  for (const Case& k : std::vector<Case>{{"s3://bucket/p", "secret_key", "secret_key_file=PATH"},
                                         {"s3://bucket/p", "session_token", "session_token_file=PATH"},
                                         {"oss://bucket/p", "fs.oss.accessKeySecret", "path of a file"},
                                         {"file://" + dir / "src", "secret_key", "secret_key_file=PATH"}}) {
    rpc::MountRequest req;
    req.set_path("/inline");
    req.set_uri(k.uri);
    (*req.mutable_options())[k.key] = secret;
    (*req.mutable_options())["endpoint"] = "http://127.0.0.1:1";  // never dialled: refused before
    rpc::MountResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    grpc::Status st = stub->Mount(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << k.uri << " " << k.key << ": " << st.error_message();
    EXPECT_NE(st.error_message().find(k.wanted), std::string::npos) << st.error_message();
    EXPECT_EQ(st.error_message().find(secret), std::string::npos) << "the error echoed the secret";
  }
  // The same policy through the CLI, and a file reference is accepted and kept as the path.
  RunResult cli = c.Cli({"mount", "/inline", "s3://bucket/p", "-o", "secret_key=" + secret});
  EXPECT_NE(cli.code, 0);
  EXPECT_NE(cli.out.find("secret_key_file=PATH"), std::string::npos) << cli.out;
  RunResult mounts = c.Cli({"mounts"});
  EXPECT_EQ(mounts.code, 0) << mounts.out;
  EXPECT_EQ(mounts.out.find("/inline"), std::string::npos) << "a refused mount was recorded:\n" << mounts.out;
  std::string metrics;
  if (httplib::Client m(c.MetricsAddress("master")); auto r = m.Get("/metrics")) metrics = r->body;
  EXPECT_FALSE(metrics.empty());
  ASSERT_TRUE(c.StopAll(&why)) << why;
  std::string seen = c.Logs() + cli.out + mounts.out + metrics;
  EXPECT_EQ(seen.find(secret), std::string::npos) << "the secret reached a log, the CLI's output or /metrics";
  // Every file the cluster wrote (the master's RocksDB, logs, the worker's cache), byte by byte.
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (!e.is_regular_file()) continue;
    EXPECT_EQ(ReadFile(e.path()).find(secret), std::string::npos) << "the secret was written to " << e.path();
  }
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
