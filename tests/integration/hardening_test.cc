// Secure by default, tried as an attacker on the node or on the network would: one malformed or
// oversized request never takes a daemon down nor makes it allocate more than a block; the access
// trace reaches root only; a token holder cannot read the nodes' files through a mount; the daemons
// refuse to serve the network without a token; an unmounted dataset leaves no block behind.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/fs.h"
#include "proto/granary.grpc.pb.h"
#include "rpc/local_wire.h"
#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

// Peak resident bytes (VmHWM) of a process: what it ever held, not what it holds now.
uint64_t PeakRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// The sum of every sample of a metric family on a daemon's /metrics (-1 when it does not answer).
double FamilySum(LocalCluster& c, const std::string& daemon, const std::string& family) {
  std::string address = c.MetricsAddress(daemon);
  size_t colon = address.rfind(':');
  if (colon == std::string::npos) return -1;
  httplib::Client cli(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
  auto res = cli.Get("/metrics");
  if (!res || res->status != 200) return -1;
  std::istringstream in(res->body);
  std::string line;
  double sum = 0;
  while (std::getline(in, line)) {
    if (line.rfind(family, 0) != 0) continue;
    char next = line.size() > family.size() ? line[family.size()] : '\0';
    if (next == ' ' || next == '{') sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

// A cluster serving /ds (dir/src, one file of three blocks), mounted and read once.
class Hardened : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = RandomBytes(3 * 65536 + 100, 29);
    WriteFile(dir_ / "src/a.bin", data_);
    std::string why;
    ASSERT_TRUE(c_.StartDaemons(&why)) << why;
    RunResult m = c_.Cli({"mount", "/ds", dir_ / "src"});
    ASSERT_EQ(m.code, 0) << m.out;
    ASSERT_TRUE(c_.StartFuse(&why)) << why;
    ASSERT_EQ(ReadFile(c_.mountpoint() + "/ds/a.bin"), data_);
    nlohmann::json r = c_.Report();
    ASSERT_FALSE(r.is_null());
    socket_ = r["workers"][0]["local_socket"].get<std::string>();
    ASSERT_FALSE(socket_.empty()) << r.dump();
  }

  // The worker still serves: a byte-exact read through the mount (daemon mode: it reaches the worker).
  void ExpectWorkerServes() {
    EXPECT_TRUE(kill(c_.worker_pid(), 0) == 0) << "the worker died:\n" << c_.Logs();
    EXPECT_EQ(ReadFile(c_.mountpoint() + "/ds/a.bin"), data_);
  }

  TempDir dir_;
  LocalCluster c_{dir_};
  std::string data_, socket_;
};

// A 40-byte message naming a 1 TiB block aborted the worker (std::bad_alloc); a 257 MiB length
// prefix with no body grew its RSS by 264 MB per connection.
TEST_F(Hardened, LocalSocketRefusesWhatItCannotServeAndLives) {
  const uint64_t peak_before = PeakRss(c_.worker_pid());
  {
    auto s = ConnectUnix(socket_);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    rpc::LocalRequest req;
    rpc::ReadBlockRequest* r = req.mutable_read();
    r->set_mount_id(1);
    r->set_ufs_path("a.bin");
    r->set_version("v");
    r->set_file_size(1ull << 41);
    r->set_block_size(1ull << 40);
    r->set_length(1ull << 40);
    EXPECT_LE(req.ByteSizeLong() + 4, 48u) << "the message is as small as the one that took the worker down";
    ASSERT_TRUE(SendFrame(*s, req).ok());
    rpc::LocalResponse resp;
    int fd = -1;
    ASSERT_TRUE(RecvFrame(*s, &resp, &fd).ok()) << "the worker answers rather than dying";
    EXPECT_EQ(resp.code(), static_cast<int>(Code::kInvalidArgument)) << resp.message();
    EXPECT_NE(resp.message().find("block_size"), std::string::npos) << resp.message();
    close(*s);
  }
  {
    // A frame longer than any request: refused before its body is read, and the connection closed.
    auto s = ConnectUnix(socket_);
    ASSERT_TRUE(s.ok());
    const uint32_t len = 257u << 20;
    unsigned char hdr[4] = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                            static_cast<unsigned char>(len >> 16), static_cast<unsigned char>(len >> 24)};
    ASSERT_EQ(write(*s, hdr, 4), 4);
    rpc::LocalResponse resp;
    int fd = -1;
    ASSERT_TRUE(RecvFrame(*s, &resp, &fd).ok());
    EXPECT_EQ(resp.code(), static_cast<int>(Code::kInvalidArgument)) << resp.message();
    char b;
    EXPECT_EQ(read(*s, &b, 1), 0) << "the connection is closed after a refused frame";
    close(*s);
  }
  {
    // Bytes that are not a request.
    auto s = ConnectUnix(socket_);
    ASSERT_TRUE(s.ok());
    const char junk[] = "\x08\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff";
    ASSERT_EQ(write(*s, junk, 12), 12);
    rpc::LocalResponse resp;
    int fd = -1;
    ASSERT_TRUE(RecvFrame(*s, &resp, &fd).ok());
    EXPECT_EQ(resp.code(), static_cast<int>(Code::kInvalidArgument)) << resp.message();
    close(*s);
  }
  // Sixteen connections each promising the longest request and sending nothing: memory follows
  // what arrives, not what a prefix claims.
  std::vector<int> held;
  for (int i = 0; i < 16; ++i) {
    auto s = ConnectUnix(socket_);
    ASSERT_TRUE(s.ok());
    const uint32_t len = kMaxLocalRequest;
    unsigned char hdr[4] = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                            static_cast<unsigned char>(len >> 16), static_cast<unsigned char>(len >> 24)};
    ASSERT_EQ(write(*s, hdr, 4), 4);
    held.push_back(*s);
  }
  ExpectWorkerServes();
  for (int s : held) close(s);
  EXPECT_LT(PeakRss(c_.worker_pid()), peak_before + (32u << 20)) << "the refusals cost memory";
  EXPECT_GE(c_.Metric("worker", "granary_bad_requests_total"), 3) << "each refusal is counted";
  EXPECT_NE(c_.Logs().find("refused a bad request"), std::string::npos) << "and logged";
}

// One ReadBlock naming 512 MiB blocks of a 1 GiB file made the worker's RSS peak at 1.6 GB.
TEST_F(Hardened, OversizedGrpcRequestsAreRefusedWithinOneBlockOfMemory) {
  const uint64_t peak_before = PeakRss(c_.worker_pid());
  auto stub = rpc::Worker::NewStub(grpc::CreateChannel(c_.worker_address(), grpc::InsecureChannelCredentials()));
  auto deadline = [] { return std::chrono::system_clock::now() + std::chrono::seconds(30); };
  {
    rpc::ReadBlockRequest req;
    req.set_mount_id(1);
    req.set_ufs_path("a.bin");
    req.set_version("v");
    req.set_block_size(512ull << 20);
    req.set_file_size(1ull << 30);
    req.set_length(512ull << 20);
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    auto reader = stub->ReadBlock(&ctx, req);
    rpc::ReadBlockChunk chunk;
    while (reader->Read(&chunk)) {
    }
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  }
  {
    rpc::LoadBlocksRequest req;  // a file claiming 2^62 bytes: 2^46 blocks to list
    rpc::LoadFile* f = req.add_files();
    f->set_mount_id(1);
    f->set_path("/ds/a.bin");
    f->set_ufs_path("a.bin");
    f->set_version("v");
    f->set_size(1ull << 62);
    f->set_block_size(65536);
    rpc::LoadBlocksResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    grpc::Status st = stub->LoadBlocks(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  }
  {
    rpc::ResidencyRequest req;  // a range past the last index
    rpc::ResidencyQuery* q = req.add_files();
    q->set_file_key(std::string(16, 'k'));
    q->set_first(~0ull - 3);
    q->set_blocks(10);
    rpc::ResidencyResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline());
    grpc::Status st = stub->GetResidency(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  }
  ExpectWorkerServes();
  EXPECT_LT(PeakRss(c_.worker_pid()), peak_before + (64u << 20)) << "a refused request cost memory";
  EXPECT_GE(c_.Metric("worker", "granary_bad_requests_total"), 3);
}

// NoteOpens (fetch-ahead's evidence from granary-fuse): more than 4096 files are refused by name;
// inodes that are no file (none, the root, a directory, one never made) count for nothing.
TEST_F(Hardened, NoteOpensTakesOnlyFilesAndAtMostABatch) {
  const std::string opened = "granary_fetch_ahead_opened_files{mount=\"/ds\"}";
  // The setup's read of a.bin reaches the master in granary-fuse's next batch.
  ASSERT_TRUE(WaitFor([&] { return c_.Metric("master", opened) == 1; })) << c_.Logs();
  auto stub = rpc::Master::NewStub(grpc::CreateChannel(c_.master_address(), grpc::InsecureChannelCredentials()));
  auto call = [&](const rpc::NoteOpensRequest& req) {
    rpc::NoteOpensResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    return stub->NoteOpens(&ctx, req, &resp);
  };
  rpc::NoteOpensRequest big;
  for (uint64_t i = 0; i < 4097; ++i) big.add_inos(i + 2);
  grpc::Status st = call(big);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("NoteOpens"), std::string::npos) << st.error_message();
  rpc::NoteOpensRequest junk;
  for (uint64_t ino : {0ull, 1ull, ~0ull, 1ull << 40}) junk.add_inos(ino);
  st = call(junk);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(c_.Metric("master", opened), 1) << "an inode that is no file counted as an open";
  EXPECT_GE(c_.Metric("master", "granary_bad_requests_total"), 1);
  ExpectWorkerServes();
}

// /trace was served on 0.0.0.0:29997 to anyone: the path, pid and uid of every FUSE operation.
TEST_F(Hardened, TheAccessTraceIsForRootOnly) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: another user is played by setuid(65534)";
  {
    std::string address = c_.MetricsAddress("fuse");
    size_t colon = address.rfind(':');
    ASSERT_NE(colon, std::string::npos);
    httplib::Client http(address.substr(0, colon), std::stoi(address.substr(colon + 1)));
    auto res = http.Get("/trace");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 404) << "the trace is on no network port";
    auto metrics = http.Get("/metrics");
    ASSERT_TRUE(metrics);
    EXPECT_EQ(metrics->body.find("a.bin"), std::string::npos) << "metrics carry no file names";
  }
  char real[PATH_MAX];
  ASSERT_NE(realpath(c_.mountpoint().c_str(), real), nullptr);
  auto endpoints = nlohmann::json::parse(ReadFile(MountEndpointsFile(real).value()), nullptr, false);
  ASSERT_TRUE(endpoints.is_object());
  const std::string sock = endpoints.value("trace", "");
  ASSERT_FALSE(sock.empty()) << endpoints.dump();
  struct stat st {};
  ASSERT_EQ(lstat(sock.c_str(), &st), 0) << sock;
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "only its owner may connect";

  // Another user of the node, through the file's mode and, were it wider, the peer check.
  auto as_nobody = [&](bool* connected, bool* got_bytes) {
    int pipefd[2];
    ASSERT_EQ(pipe(pipefd), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      char result[2] = {'0', '0'};
      if (setgid(65534) == 0 && setuid(65534) == 0) {
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        sockaddr_un a{};
        a.sun_family = AF_UNIX;
        memcpy(a.sun_path, sock.c_str(), sock.size() + 1);
        if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
          result[0] = '1';
          const char req[] = "{}\n";
          (void)!send(s, req, 3, MSG_NOSIGNAL);
          char b;
          if (read(s, &b, 1) == 1) result[1] = '1';
        }
      }
      (void)!write(pipefd[1], result, 2);
      _exit(0);
    }
    close(pipefd[1]);
    char result[2] = {'?', '?'};
    EXPECT_EQ(read(pipefd[0], result, 2), 2);
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    *connected = result[0] == '1';
    *got_bytes = result[1] == '1';
  };
  bool connected = true, got = true;
  as_nobody(&connected, &got);
  EXPECT_FALSE(connected) << "uid 65534 opened the trace socket";
  {
    // Modes widened by mistake (the socket's and its 0700 directory's): the peer check still holds.
    const std::string parent = sock.substr(0, sock.rfind('/'));
    struct stat pst {};
    ASSERT_EQ(stat(parent.c_str(), &pst), 0);
    ASSERT_EQ(chmod(parent.c_str(), 0711), 0);
    ASSERT_EQ(chmod(sock.c_str(), 0666), 0);
    as_nobody(&connected, &got);
    chmod(sock.c_str(), 0600);
    chmod(parent.c_str(), pst.st_mode & 07777);
    EXPECT_TRUE(connected);
    EXPECT_FALSE(got) << "uid 65534 read the trace";
  }

  // Root reads it: one record of a read through the mount.
  Process trace({Bin("granary"), "trace", c_.mountpoint(), "--json", "--count", "1", "--op", "lookup"},
                dir_ / "trace.out");
  EXPECT_TRUE(WaitFor([&] {
    std::string ignored;
    ReadFileChecked(c_.mountpoint() + "/ds/no-such-" + std::to_string(rand()), &ignored);
    return ReadFile(dir_ / "trace.out").find("\"op\":\"lookup\"") != std::string::npos;
  })) << ReadFile(dir_ / "trace.out");
  EXPECT_EQ(trace.Wait(), 0) << trace.Log();
}

// A token holder mounted file:///etc and read root-only files through ReadBlock, and made the
// master send /etc/shadow to an endpoint of its choosing as a credential.
TEST_F(Hardened, MountsNameOnlyConfiguredRootsAndSecrets) {
  RunResult etc = c_.Cli({"mount", "/etc", "file:///etc"});
  EXPECT_NE(etc.code, 0);
  EXPECT_NE(etc.out.find("ufs.local_roots"), std::string::npos) << etc.out;
  ASSERT_EQ(symlink("/etc", (dir_ / "src/escape").c_str()), 0);
  RunResult link = c_.Cli({"mount", "/esc", dir_ / "src/escape"});
  EXPECT_NE(link.code, 0) << "a link below a root that points out of it";
  EXPECT_NE(link.out.find("ufs.local_roots"), std::string::npos) << link.out;

  httplib::Server sink;  // the caller's endpoint: nothing may reach it
  std::atomic<int> dialled{0};
  sink.Get(".*", [&](const httplib::Request&, httplib::Response&) { dialled++; });
  sink.Put(".*", [&](const httplib::Request&, httplib::Response&) { dialled++; });
  int port = sink.bind_to_any_port("127.0.0.1");
  std::thread serve([&] { sink.listen_after_bind(); });
  ASSERT_EQ(symlink("/etc/shadow", (dir_ / "shadow-link").c_str()), 0);
  for (const std::string& file : {std::string("/etc/shadow"), dir_ / "shadow-link"}) {
    RunResult r = c_.Cli({"mount", "/steal", "s3://bucket/p", "-o", "endpoint=http://127.0.0.1:" + std::to_string(port),
                          "-o", "access_key_file=" + file, "-o", "secret_key_file=" + file});
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("ufs.secrets_dir"), std::string::npos) << r.out;
  }
  sink.stop();
  serve.join();
  EXPECT_EQ(dialled.load(), 0) << "the master dialled the caller's endpoint";
  // A link planted inside an allowed dataset reads nothing outside the roots.
  WriteFile(dir_ / "planted/ok.txt", "fine");
  ASSERT_EQ(symlink("/etc/hostname", (dir_ / "planted/leak").c_str()), 0);
  RunResult planted = c_.Cli({"mount", "/planted", dir_ / "planted"});
  ASSERT_EQ(planted.code, 0) << planted.out;
  EXPECT_EQ(ReadFile(c_.mountpoint() + "/planted/ok.txt"), "fine");
  std::string leaked;
  EXPECT_FALSE(ReadFileChecked(c_.mountpoint() + "/planted/leak", &leaked)) << "read through the link: " << leaked;
  RunResult mounts = c_.Cli({"mounts"});
  EXPECT_EQ(mounts.out.find("/steal"), std::string::npos) << mounts.out;
  EXPECT_EQ(mounts.out.find("/etc"), std::string::npos) << mounts.out;
}

// An unmounted dataset's blocks go from every worker: at once from a live one, and at its
// registration from one that was down meanwhile.
TEST_F(Hardened, UnmountFreesTheDatasetsBlocksAlsoOnAWorkerThatWasDown) {
  WriteFile(dir_ / "other/b.bin", RandomBytes(65536 * 2, 30));
  ASSERT_EQ(c_.Cli({"mount", "/other", dir_ / "other"}).code, 0);
  ASSERT_EQ(ReadFile(c_.mountpoint() + "/other/b.bin").size(), 65536u * 2);
  auto blocks = [&] { return FamilySum(c_, "worker", "granary_worker_cache_blocks"); };
  ASSERT_TRUE(WaitFor([&] { return blocks() == 6; })) << blocks();  // 4 of a.bin, 2 of b.bin

  RunResult u = c_.Cli({"unmount", "/ds"});
  ASSERT_EQ(u.code, 0) << u.out;
  EXPECT_TRUE(WaitFor([&] { return blocks() == 2; })) << "a.bin's blocks are still cached: " << blocks();

  c_.KillWorker();
  RunResult u2 = c_.Cli({"unmount", "/other"});
  ASSERT_EQ(u2.code, 0) << u2.out;
  std::string why;
  ASSERT_TRUE(c_.RestartWorker(&why)) << why;
  EXPECT_TRUE(WaitFor([&] { return blocks() == 0; })) << "b.bin's blocks outlived the unmount: " << blocks();
  EXPECT_EQ(FamilySum(c_, "worker", "granary_worker_cache_used_bytes"), 0);
}

// The master's data directory holds every dataset's file names: 0700 even when it was wider.
TEST(Secure, TheMastersDataDirectoryIsTightened) {
  TempDir dir;
  ASSERT_EQ(mkdir((dir / "master").c_str(), 0755), 0);
  ASSERT_EQ(chmod((dir / "master").c_str(), 0755), 0);
  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  struct stat st {};
  ASSERT_EQ(stat((dir / "master").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // Serving without a token on loopback is allowed, and said loudly.
  EXPECT_NE(c.Logs().find("without rpc.token_file"), std::string::npos) << c.Logs();
}

// Without rpc.token_file a daemon refuses to listen beyond loopback unless told it is meant.
TEST(Secure, NoTokenNoNetworkUnlessToldSo) {
  TempDir dir;
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{Bin("granary-master"), "--master.listen", "0.0.0.0:0", "--master.data_dir", dir / "m"},
        std::vector<std::string>{Bin("granary-worker"), "--worker.listen", "0.0.0.0:0", "--worker.cache_dir",
                                 dir / "c", "--master.address", "127.0.0.1:1"}}) {
    RunResult r = RunCommand(argv);
    EXPECT_NE(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("rpc.token_file"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("rpc.allow_unauthenticated"), std::string::npos) << r.out;
  }
  Process told({Bin("granary-master"), "--master.listen", "0.0.0.0:0", "--master.data_dir", dir / "m2",
                "--master.metrics_listen", "127.0.0.1:0", "--rpc.allow_unauthenticated", "true", "--ready-file",
                dir / "m2.addr"},
               dir / "m2.log");
  EXPECT_FALSE(WaitForReadyFile(dir / "m2.addr", &told).empty()) << told.Log();
  EXPECT_NE(told.Log().find("SERVING WITHOUT A TOKEN"), std::string::npos) << told.Log();
  EXPECT_EQ(told.Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace granary::testing
