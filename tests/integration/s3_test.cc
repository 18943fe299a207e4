// The S3 client against a real S3 server (Ceph RGW on loopback, started by scripts/s3-server.sh),
// and a dataset on it read through `granary local s3://...`.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "ufs/s3_ufs.h"
#include "master/namespace.h"
#include "tests/integration/harness.h"
#include "tests/testutil/proxy.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

// Counts requests, to prove what is and is not retried.
class CountingHttp : public HttpClient {
 public:
  StatusOr<HttpResponse> Send(const HttpRequest& req) override {
    ++calls;
    return real.Send(req);
  }
  std::atomic<int> calls{0};
  CurlHttpClient real;
};

// Injects faults into the next requests, then passes through to the real server.
class FaultHttp : public HttpClient {
 public:
  enum Fault { kStatus500, kSlowDown503, kReset, kStall, kTruncate };
  StatusOr<HttpResponse> Send(const HttpRequest& req) override {
    ++calls;
    Fault f;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (faults.empty() && !forever) return real.Send(req);
      f = faults.empty() ? *forever : faults.front();
      if (!faults.empty()) faults.erase(faults.begin());
    }
    switch (f) {
      case kStatus500: return HttpResponse{500, {}, "<Error><Code>InternalError</Code></Error>"};
      case kSlowDown503: return HttpResponse{503, {}, "<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>"};
      case kReset: return UnavailableError("Recv failure: Connection reset by peer");
      case kStall: return DeadlineExceededError("Operation too slow. Less than 1024 bytes/sec transferred");
      case kTruncate: {
        auto r = real.Send(req);
        if (r.ok() && r->sunk > 1) r->sunk /= 2;  // the body went into the caller's buffer
        if (r.ok() && r->sunk == 0 && r->body.size() > 1) r->body.resize(r->body.size() / 2);
        return r;
      }
    }
    return InternalError("unreachable");
  }
  void SetForever(std::optional<Fault> f) {
    std::lock_guard<std::mutex> lock(mu);
    forever = f;
  }
  std::mutex mu;
  std::vector<Fault> faults;   // GUARDED_BY(mu)
  std::optional<Fault> forever;  // GUARDED_BY(mu)
  std::atomic<int> calls{0};
  CurlHttpClient real;
};

class S3Test : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    RunResult r = RunCommand({"bash", SourceDir() + "/scripts/s3-server.sh", "start", *dir_ / "rgw"}, {},
                             std::chrono::seconds(180));
    std::istringstream in(r.out.substr(std::min(r.out.size(), r.out.rfind("READY"))));
    std::string ready;
    in >> ready >> endpoint_ >> ak_ >> sk_;
    started_ = r.code == 0 && ready == "READY";
    if (!started_) {
      start_log_ = r.out;
      return;
    }
    // The dataset: levels with and without objects, odd names, >1000 keys in one directory.
    WriteFile(*dir_ / "big.bin", RandomBytes(9'000'000, 11));
    nlohmann::json spec = {
        {"bucket", "granary-test"},
        {"objects",
         {{{"key", "ds/top.txt"}, {"text", "top\n"}},
          {{"key", "ds/deep/x/y/z.bin"}, {"file", *dir_ / "big.bin"}},
          {{"key", "ds/with space/naïve ü.txt"}, {"text", "unicode\n"}},
          {{"key", "ds/clash"}, {"text", "hidden by the directory\n"}},
          {{"key", "ds/clash/inside.txt"}, {"text", "inside\n"}},
          {{"key", "ds/odd//double.txt"}, {"text", "empty segment\n"}},
          {{"key", "ds/long/A.txt"}, {"text", "before the long name\n"}},
          {{"key", "ds/long/" + std::string(300, 'L')}, {"text", "too long\n"}},
          {{"key", "ds/long/z.txt"}, {"text", "after the long name\n"}},
          {{"key", "ds/changing.bin"}, {"text", "version one"}},
          {{"many", "ds/many/k"}, {"count", 1100}}}}};
    WriteFile(*dir_ / "spec.json", spec.dump());
    RunResult put = RunCommand({"/usr/bin/python3", SourceDir() + "/tests/integration/s3_put.py", endpoint_, ak_, sk_,
                                *dir_ / "spec.json"}, {}, std::chrono::seconds(300));
    if (put.code != 0) {
      started_ = false;
      start_log_ = put.out;
    }
  }
  static void TearDownTestSuite() {
    RunCommand({"bash", SourceDir() + "/scripts/s3-server.sh", "stop", *dir_ / "rgw"});
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(started_) << "S3 server did not start:\n" << start_log_; }

  // A file holding one credential (mount options take credentials only by file).
  static std::string CredFile(const std::string& name, const std::string& value) {
    std::string path = *dir_ / ("cred-" + name + "-" + std::to_string(std::hash<std::string>()(value)));
    WriteFile(path, value + "\n");
    chmod(path.c_str(), 0600);
    return path;
  }
  std::shared_ptr<UnderFileSystem> Open(const std::string& uri, std::map<std::string, std::string> opts = {},
                                        std::shared_ptr<HttpClient> http = nullptr, Status* err = nullptr) {
    opts.emplace("endpoint", endpoint_);
    opts.emplace("access_key_file", CredFile("ak", ak_));
    opts.emplace("secret_key_file", CredFile("sk", sk_));
    auto p = ParseUri(uri);
    auto s = ResolveS3Settings(p->authority, p->path, opts);
    if (!s.ok()) {
      if (err) *err = s.status();
      return nullptr;
    }
    auto ufs = S3Ufs::Open(uri, *s, http);
    if (!ufs.ok()) {
      if (err) *err = ufs.status();
      return nullptr;
    }
    return *ufs;
  }
  static std::set<std::string> Names(UnderFileSystem& ufs, const std::string& dir) {
    std::set<std::string> out;
    Status st = ufs.List(dir, 1000, [&](std::vector<UfsEntry>& page) {
      for (auto& e : page) EXPECT_TRUE(out.insert(e.name + (e.is_dir ? "/" : "")).second) << "duplicate " << e.name;
      return Status::OK();
    });
    EXPECT_TRUE(st.ok()) << st.message();
    return out;
  }

  static TempDir* dir_;
  static bool started_;
  static std::string endpoint_, ak_, sk_, start_log_;
};
TempDir* S3Test::dir_ = nullptr;
bool S3Test::started_ = false;
std::string S3Test::endpoint_, S3Test::ak_, S3Test::sk_, S3Test::start_log_;

TEST_F(S3Test, ListsEveryLevel) {
  auto ufs = Open("s3://granary-test/ds");
  ASSERT_TRUE(ufs);
  EXPECT_EQ(Names(*ufs, ""), (std::set<std::string>{"top.txt", "deep/", "with space/", "clash/", "odd/", "long/",
                                                     "changing.bin", "many/"}))
      << "the object 'clash' is hidden by the directory 'clash/'";
  EXPECT_EQ(Names(*ufs, "deep"), std::set<std::string>{"x/"}) << "a level holding no object directly";
  EXPECT_EQ(Names(*ufs, "deep/x"), std::set<std::string>{"y/"});
  EXPECT_EQ(Names(*ufs, "deep/x/y"), std::set<std::string>{"z.bin"});
  EXPECT_EQ(Names(*ufs, "with space"), std::set<std::string>{"naïve ü.txt"});
  EXPECT_EQ(Names(*ufs, "clash"), std::set<std::string>{"inside.txt"});
  EXPECT_TRUE(Names(*ufs, "odd").empty()) << "an empty path segment is skipped";
  EXPECT_EQ(Names(*ufs, "long"), (std::set<std::string>{"A.txt", "z.txt"})) << "a name over 255 bytes is skipped";
  auto st = ufs->Stat("deep/x/y/z.bin");
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(st->size, 9'000'000u);
  EXPECT_FALSE(st->version.empty());
  EXPECT_TRUE(ufs->Stat("deep/x")->is_dir);
  EXPECT_EQ(ufs->Stat("nope").status().code(), Code::kNotFound);
}

TEST_F(S3Test, MoreThanAThousandKeysInOneDirectory) {
  auto http = std::make_shared<CountingHttp>();
  auto ufs = Open("s3://granary-test/ds", {}, http);
  ASSERT_TRUE(ufs);
  int before = http->calls.load();
  size_t n = 0;
  std::set<std::string> names;
  ASSERT_TRUE(ufs->List("many", 400, [&](std::vector<UfsEntry>& page) {
    EXPECT_LE(page.size(), 400u);
    n += page.size();
    for (auto& e : page) names.insert(e.name);
    return Status::OK();
  }).ok());
  EXPECT_EQ(n, 1100u);
  EXPECT_EQ(names.size(), 1100u);
  EXPECT_EQ(http->calls.load() - before, 3) << "three list requests joined by continuation tokens";
  EXPECT_EQ(Names(*ufs, "many").size(), 1100u);
}

// A bulk listing resumed from a checkpoint (ListObjectsV2 start-after, signed like any query)
// passes exactly what the whole listing passed after it.
TEST_F(S3Test, TreeListingResumesAfterACheckpoint) {
  auto http = std::make_shared<CountingHttp>();
  auto ufs = Open("s3://granary-test/ds", {}, http);
  ASSERT_TRUE(ufs);
  std::vector<std::string> whole;
  ASSERT_TRUE(ufs->ListTree("", 300, [&](std::vector<UfsEntry>& page) {
    for (auto& e : page) whole.push_back(e.name);
    return Status::OK();
  }, "").ok());
  ASSERT_GT(whole.size(), 1100u);
  const size_t cut = 900;  // in the middle of many/, on a page's end (300 per page)
  std::vector<std::string> rest;
  int before = http->calls.load();
  ASSERT_TRUE(ufs->ListTree("", 300, [&](std::vector<UfsEntry>& page) {
    for (auto& e : page) rest.push_back(e.name);
    return Status::OK();
  }, whole[cut - 1]).ok());
  EXPECT_EQ(rest, std::vector<std::string>(whole.begin() + cut, whole.end())) << "after " << whole[cut - 1];
  EXPECT_LE(http->calls.load() - before, 2) << "the resumed listing starts at the checkpoint";
}

TEST_F(S3Test, RangedReadsAndChangedObjects) {
  auto ufs = Open("s3://granary-test/ds");
  ASSERT_TRUE(ufs);
  std::string want = ReadFile(*dir_ / "big.bin");
  auto st = ufs->Stat("deep/x/y/z.bin");
  ASSERT_TRUE(st.ok());
  std::string buf(1'000'000, '\0');
  auto n = ufs->Read("deep/x/y/z.bin", st->version, 4'194'000, buf.size(), buf.data());
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(*n, buf.size());
  EXPECT_EQ(buf, want.substr(4'194'000, 1'000'000));
  n = ufs->Read("deep/x/y/z.bin", st->version, 8'999'990, 100, buf.data());
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 10u) << "a read past the end is clipped";
  // Streaming (worker/block_source.h): RGW's 206 starts where asked, so the buffer's front is
  // reported as it lands, all of it by the end.
  ReadProgress progress;
  std::string streamed(4 << 20, '\0');
  n = ufs->ReadStreaming("deep/x/y/z.bin", st->version, 4 << 20, streamed.size(), streamed.data(), &progress);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(*n, streamed.size());
  EXPECT_EQ(progress.landed(), streamed.size());
  EXPECT_EQ(streamed, want.substr(4 << 20, 4 << 20));

  auto v1 = ufs->Stat("changing.bin");
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(ufs->Read("changing.bin", v1->version, 0, 11, buf.data()).ok());
  nlohmann::json spec = {{"bucket", "granary-test"}, {"create", false},
                         {"objects", {{{"key", "ds/changing.bin"}, {"text", "VERSION TWO"}}}}};
  WriteFile(*dir_ / "rewrite.json", spec.dump());
  ASSERT_EQ(RunCommand({"/usr/bin/python3", SourceDir() + "/tests/integration/s3_put.py", endpoint_, ak_, sk_,
                        *dir_ / "rewrite.json"}).code, 0);
  auto r = ufs->Read("changing.bin", v1->version, 0, 11, buf.data());
  EXPECT_TRUE(r.status().IsVersionChanged()) << "the rewrite must be detected, not served: " << r.status().ToString();
  ReadProgress stale;  // nothing of another version lands
  r = ufs->ReadStreaming("changing.bin", v1->version, 0, 11, buf.data(), &stale);
  EXPECT_TRUE(r.status().IsVersionChanged()) << r.status().ToString();
  EXPECT_EQ(stale.landed(), 0u);
}

TEST_F(S3Test, WrongSecretFailsOnceWithAClearError) {
  auto http = std::make_shared<CountingHttp>();
  Status err;
  auto ufs = Open("s3://granary-test/ds", {{"secret_key_file", CredFile("sk", "wrong-secret")}}, http, &err);
  EXPECT_FALSE(ufs);
  EXPECT_EQ(err.code(), Code::kPermissionDenied) << err.message();
  EXPECT_NE(err.message().find("SignatureDoesNotMatch"), std::string::npos) << err.message();
  EXPECT_EQ(err.message().find("wrong-secret"), std::string::npos) << "the secret must not be in the error";
  EXPECT_EQ(http->calls.load(), 1) << "403 must not be retried";
}

TEST_F(S3Test, MissingBucketAndPrefix) {
  Status err;
  EXPECT_FALSE(Open("s3://no-such-bucket-here/x", {}, nullptr, &err));
  EXPECT_EQ(err.code(), Code::kNotFound);
  EXPECT_NE(err.message().find("no-such-bucket-here"), std::string::npos) << err.message();
  // A prefix with nothing below it opens (a writable mount may start empty) and is not there; the
  // master refuses to mount it read-only (Namespace::Mount).
  auto empty = Open("s3://granary-test/no-such-prefix", {}, nullptr, &err);
  ASSERT_NE(empty, nullptr) << err.message();
  EXPECT_EQ(empty->Stat("").status().code(), Code::kNotFound);
  TempDir ns_dir;
  auto ns = master::Namespace::Open(ns_dir.path(), 1 << 20, UfsAccess::Unrestricted());
  ASSERT_TRUE(ns.ok());
  std::map<std::string, std::string> opts{{"endpoint", endpoint_}, {"access_key_file", CredFile("ak", ak_)},
                                          {"secret_key_file", CredFile("sk", sk_)}};
  auto ro = (*ns)->Mount("/ro", "s3://granary-test/no-such-prefix", opts);
  EXPECT_EQ(ro.status().code(), Code::kNotFound) << ro.status().message();
  opts["write"] = "through";
  EXPECT_TRUE((*ns)->Mount("/rw", "s3://granary-test/no-such-prefix", opts).ok());
  Status unknown;
  EXPECT_FALSE(Open("s3://granary-test/ds", {{"acces_key", "x"}}, nullptr, &unknown));
  EXPECT_NE(unknown.message().find("unknown s3 mount option 'acces_key'"), std::string::npos) << unknown.message();
}

TEST_F(S3Test, DatasetOnS3ReadsByteIdenticalThroughFuse) {
  TempDir dir;
  mkdir((dir / "mnt").c_str(), 0755);
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"},
                                         {"AWS_ACCESS_KEY_ID", ak_},
                                         {"AWS_SECRET_ACCESS_KEY", sk_},
                                         {"AWS_ENDPOINT_URL", endpoint_}};
  Process local({Bin("granary"), "local", "s3://granary-test/ds", dir / "mnt", "--dir", dir / "state"},
                dir / "local.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_EQ(Sha256File(dir / "mnt/deep/x/y/z.bin"), Sha256File(*dir_ / "big.bin"));
    EXPECT_EQ(ReadFile(dir / "mnt/with space/naïve ü.txt"), "unicode\n");
    EXPECT_EQ(ReadFile(dir / "mnt/clash/inside.txt"), "inside\n");
  }
  struct stat st;
  EXPECT_EQ(stat((dir / "mnt/many/k01099").c_str(), &st), 0);
  std::string log = local.Log();
  EXPECT_EQ(local.Stop(SIGTERM), 0) << log;
  EXPECT_EQ(log.find(sk_), std::string::npos) << "the secret key leaked into the log";
  EXPECT_FALSE(IsMounted(dir / "mnt"));
}

// A cold 9 MB object of 4 MiB blocks read in 1 MiB READs through a cluster's mount: the first READ
// of each block is a demand miss answered as the block arrives (BlockSource::Stream), its bytes put
// into the local socket's pipe by the worker (vmsplice) and spliced on by granary-fuse
// (worker/local_server.h, StreamPipe) — exactly the object's bytes, cold and warm.
TEST_F(S3Test, AColdBlockStreamedThroughTheLocalSocketsPipeIsTheObjectsBytes) {
  TempDir dir;
  // The daemons take the store's settings from the environment they inherit (never arguments).
  struct Env {
    std::vector<std::string> names;
    void Set(const std::string& k, const std::string& v) {
      setenv(k.c_str(), v.c_str(), 1);
      names.push_back(k);
    }
    ~Env() {
      for (const auto& k : names) unsetenv(k.c_str());
    }
  } env;
  env.Set("AWS_ACCESS_KEY_ID", ak_);
  env.Set("AWS_SECRET_ACCESS_KEY", sk_);
  env.Set("AWS_ENDPOINT_URL", endpoint_);
  ClusterOptions o;
  o.block_size = "4Mi";
  // Kernel mode, no readahead hints: each block's first READ misses and waits for its fetch.
  o.fuse_args = {"--fuse.open", "kernel", "--fuse.readahead_blocks", "0"};
  LocalCluster c(dir, o);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ASSERT_EQ(c.Cli({"mount", "/ds", "s3://granary-test/ds", "-o", "cache.fetch_ahead=false"}).code, 0) << c.Logs();
  ASSERT_TRUE(c.StartFuse(&why)) << why;
  const std::string want = ReadFile(*dir_ / "big.bin");
  for (int pass = 0; pass < 2; ++pass) {  // cold, then warm
    int fd = open((c.mountpoint() + "/ds/deep/x/y/z.bin").c_str(), O_RDONLY);
    ASSERT_GE(fd, 0) << strerror(errno);
    std::string got, buf(1 << 20, '\0');
    for (;;) {
      ssize_t n = read(fd, buf.data(), buf.size());
      ASSERT_GE(n, 0) << strerror(errno);
      if (n == 0) break;
      got.append(buf.data(), static_cast<size_t>(n));
    }
    close(fd);
    EXPECT_EQ(got.size(), want.size());
    EXPECT_TRUE(got == want) << "pass " << pass << ": other bytes";
  }
  EXPECT_GT(c.Metric("fuse", "granary_fuse_read_pieces_total{source=\"piped\"}"), 0)
      << "no READ's bytes came through the pipe (pieces: "
      << c.Metric("fuse", "granary_fuse_read_pieces_total{source=\"zero_copy\"}") << " zero-copy; "
      << c.Metric("worker", "granary_worker_streamed_reads_total") << " streamed)\n"
      << c.Logs();
  ASSERT_TRUE(c.StopAll(&why)) << why;
}

// Writes through a mount of RGW (write=through, then write=back): a multipart upload, a small PUT,
// directories as markers, a rename (copy + delete), removals, a replacement; the objects are whole
// (read back with the S3 client itself) and no upload is left open.
TEST_F(S3Test, WritesLandWholeAsObjects) {
  for (const char* mode : {"through", "back"}) {
    SCOPED_TRACE(mode);
    TempDir dir;
    mkdir((dir / "mnt").c_str(), 0755);
    const std::string prefix = std::string("written-") + mode;
    std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"},
                                           {"AWS_ACCESS_KEY_ID", ak_},
                                           {"AWS_SECRET_ACCESS_KEY", sk_},
                                           {"AWS_ENDPOINT_URL", endpoint_}};
    Process local({Bin("granary"), "local", "s3://granary-test/" + prefix, dir / "mnt", "--dir", dir / "state", "-o",
                   std::string("write=") + mode},
                  dir / "local.log", env);
    ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
    ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
    auto ufs = Open("s3://granary-test/" + prefix);
    ASSERT_NE(ufs, nullptr);
    // The object `key` as the store has it (write=back: once uploaded); "" when absent.
    auto object = [&](const std::string& key) -> std::string {
      auto st = ufs->Stat(key);
      if (!st.ok() || st->is_dir) return "";
      std::string out(st->size, '\0');
      auto n = ufs->Read(key, st->version, 0, out.size(), out.data());
      return n.ok() ? out.substr(0, *n) : "";
    };
    auto settled = [&](const std::string& key, const std::string& want) {
      return WaitFor([&] { return object(key) == want; }, std::chrono::seconds(60));
    };

    const std::string big = RandomBytes(40 << 20, 31);  // three parts of 16 MiB
    {
      std::ofstream f(dir / "mnt/ckpt.pt", std::ios::binary);
      f.write(big.data(), static_cast<std::streamsize>(big.size()));
      f.close();
      ASSERT_TRUE(f.good());
    }
    EXPECT_TRUE(settled("ckpt.pt", big)) << local.Log();
    WriteFile(dir / "mnt/small.txt", "small\n");
    EXPECT_TRUE(settled("small.txt", "small\n"));
    ASSERT_EQ(mkdir((dir / "mnt/out").c_str(), 0755), 0) << strerror(errno);
    EXPECT_TRUE(ufs->Stat("out").ok() && ufs->Stat("out")->is_dir);
    ASSERT_EQ(rename((dir / "mnt/small.txt").c_str(), (dir / "mnt/out/moved.txt").c_str()), 0) << strerror(errno);
    EXPECT_EQ(object("out/moved.txt"), "small\n");
    EXPECT_EQ(object("small.txt"), "");
    EXPECT_EQ(ReadFile(dir / "mnt/out/moved.txt"), "small\n");
    WriteFile(dir / "mnt/out/moved.txt", "replaced\n");  // O_TRUNC: a new whole object
    EXPECT_TRUE(settled("out/moved.txt", "replaced\n"));
    EXPECT_EQ(rmdir((dir / "mnt/out").c_str()), -1);
    EXPECT_EQ(errno, ENOTEMPTY);
    ASSERT_EQ(unlink((dir / "mnt/out/moved.txt").c_str()), 0) << strerror(errno);
    EXPECT_EQ(object("out/moved.txt"), "");
    ASSERT_EQ(rmdir((dir / "mnt/out").c_str()), 0) << strerror(errno);
    EXPECT_EQ(ufs->Stat("out").status().code(), Code::kNotFound);
    // A directory rename is refused with EOPNOTSUPP (object stores cannot rename one at once).
    ASSERT_EQ(mkdir((dir / "mnt/d1").c_str(), 0755), 0);
    EXPECT_EQ(rename((dir / "mnt/d1").c_str(), (dir / "mnt/d2").c_str()), -1);
    EXPECT_EQ(errno, EOPNOTSUPP);
    WriteFile(dir / "expected.pt", big);
    EXPECT_EQ(Sha256File(dir / "mnt/ckpt.pt"), Sha256File(dir / "expected.pt")) << "read back through the mount";
    std::string log = local.Log();
    EXPECT_EQ(local.Stop(SIGTERM), 0) << log;
    EXPECT_EQ(log.find(sk_), std::string::npos) << "the secret key leaked into the log";
  }
  // No multipart upload was left open.
  WriteFile(dir_->path() + "/uploads.py",
            "import boto3, sys\n"
            "from botocore.config import Config\n"
            "s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2], "
            "aws_secret_access_key=sys.argv[3], region_name='us-east-1', config=Config(s3={'addressing_style': 'path'}))\n"
            "print(len(s3.list_multipart_uploads(Bucket='granary-test').get('Uploads', [])))\n");
  RunResult uploads = RunCommand({"/usr/bin/python3", dir_->path() + "/uploads.py", endpoint_, ak_, sk_});
  EXPECT_EQ(uploads.out, "0\n");
}

// Objects modified, deleted and added in RGW show through the mount after the sync interval, and a
// read in progress never mixes the old and the new bytes.
TEST_F(S3Test, MetadataSyncShowsChangesAndNeverMixesVersions) {
  TempDir dir;
  mkdir((dir / "mnt").c_str(), 0755);
  std::string v1 = RandomBytes(1'000'000, 21), v2 = RandomBytes(1'000'000, 22);
  WriteFile(dir / "v1.bin", v1);
  WriteFile(dir / "v2.bin", v2);
  auto put = [&](const nlohmann::json& objects) {
    nlohmann::json spec = {{"bucket", "granary-test"}, {"create", false}, {"objects", objects}};
    WriteFile(dir / "spec.json", spec.dump());
    RunResult r = RunCommand({"/usr/bin/python3", SourceDir() + "/tests/integration/s3_put.py", endpoint_, ak_, sk_,
                              dir / "spec.json"});
    ASSERT_EQ(r.code, 0) << r.out;
  };
  put({{{"key", "sync/a.txt"}, {"text", "A1"}},
       {{"key", "sync/b.txt"}, {"text", "B"}},
       {{"key", "sync/big.bin"}, {"file", dir / "v1.bin"}}});
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"},
                                         {"AWS_ACCESS_KEY_ID", ak_},
                                         {"AWS_SECRET_ACCESS_KEY", sk_},
                                         {"AWS_ENDPOINT_URL", endpoint_}};
  Process local({Bin("granary"), "local", "s3://granary-test/sync", dir / "mnt", "--dir", dir / "state", "-o",
                 "metadata.sync_interval=1s", "--master.block_size", "64Ki", "--fuse.entry_timeout", "0s",
                 "--fuse.attr_timeout", "0s", "--fuse.negative_timeout", "0s"},
                dir / "local.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
  auto names = [&] {
    std::set<std::string> out;
    for (auto& e : std::filesystem::directory_iterator(dir / "mnt")) out.insert(e.path().filename());
    return out;
  };
  EXPECT_EQ(names(), (std::set<std::string>{"a.txt", "b.txt", "big.bin"}));
  EXPECT_EQ(ReadFile(dir / "mnt/a.txt"), "A1");

  // Open the old version and read its first block, then replace it in the under-storage.
  int fd = open((dir / "mnt/big.bin").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string got(65536, '\0');
  ASSERT_EQ(pread(fd, got.data(), got.size(), 0), 65536);
  ASSERT_EQ(got, v1.substr(0, 65536));
  put({{{"key", "sync/big.bin"}, {"file", dir / "v2.bin"}},
       {{"key", "sync/a.txt"}, {"text", "A2, longer"}},
       {{"delete", "sync/b.txt"}},
       {{"key", "sync/c.txt"}, {"text", "C"}}});
  // The open file goes on with the old bytes or fails; it never returns bytes of the new version.
  int errors = 0;
  for (size_t off = 65536; off < v1.size(); off += 65536) {
    std::string part(std::min<size_t>(65536, v1.size() - off), '\0');
    ssize_t n = pread(fd, part.data(), part.size(), static_cast<off_t>(off));
    if (n < 0) {
      ++errors;
      EXPECT_TRUE(errno == ESTALE || errno == EIO) << strerror(errno);
      continue;
    }
    part.resize(static_cast<size_t>(n));
    ASSERT_EQ(part, v1.substr(off, part.size())) << "bytes of two versions mixed at offset " << off;
  }
  close(fd);
  EXPECT_GT(errors, 0) << "uncached blocks of the replaced version cannot be fetched any more";

  // After the interval: the new listing and the new bytes.
  ASSERT_TRUE(WaitFor([&] { return names() == std::set<std::string>{"a.txt", "big.bin", "c.txt"}; }))
      << local.Log();
  ASSERT_TRUE(WaitFor([&] { return ReadFile(dir / "mnt/a.txt") == "A2, longer"; }));
  std::string now;
  ASSERT_TRUE(WaitFor([&] { return ReadFileChecked(dir / "mnt/big.bin", &now) && now == v2; }));
  EXPECT_EQ(ReadFile(dir / "mnt/c.txt"), "C");
  std::string log = local.Log();
  EXPECT_NE(log.find("synced"), std::string::npos) << log;
  EXPECT_EQ(local.Stop(SIGTERM), 0) << log;
}

// The bulk load (one flat listing) builds the same namespace as lazy per-directory listing, odd
// keys included (a key hidden by a directory of the same name, an empty segment, a name too long).
TEST_F(S3Test, BulkMetadataLoadMatchesLazyListing) {
  TempDir dir;
  std::map<std::string, std::string> opts{
      {"endpoint", endpoint_}, {"access_key_file", CredFile("ak", ak_)}, {"secret_key_file", CredFile("sk", sk_)}};
  auto open_ns = [&](const std::string& name, uint64_t list_ahead = master::Namespace::kListAheadEntries) {
    auto ns = master::Namespace::Open(dir / name, 4 << 20, UfsAccess::Unrestricted());
    EXPECT_TRUE(ns.ok()) << ns.status().message();
    (*ns)->SetListAheadEntries(list_ahead);
    auto m = (*ns)->Mount("/ds", "s3://granary-test/ds", opts);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return std::move(ns).value();
  };
  // Every path below `ino` into *out; `order` picks the order subdirectories are descended in (0 as
  // listed; odd reversed; 2 and up rotated by half), so concurrent walkers meet in different places.
  std::function<void(master::Namespace&, uint64_t, const std::string&, std::map<std::string, std::string>*, size_t)>
      walk = [&](master::Namespace& ns, uint64_t ino, const std::string& prefix,
                 std::map<std::string, std::string>* out, size_t order) {
        std::vector<std::pair<uint64_t, std::string>> dirs;
        uint64_t after = 0;
        for (;;) {
          rpc::ReadDirResponse page;
          Status st = ns.ReadDir(ino, after, 500, &page);
          ASSERT_TRUE(st.ok()) << st.message();
          for (const auto& e : page.entries()) {
            std::string path = prefix + e.name();
            if (e.attr().type() == rpc::DIRECTORY) {
              (*out)[path + "/"] = "dir";
              dirs.emplace_back(e.attr().ino(), path + "/");
            } else {
              auto f = ns.GetFile(e.attr().ino());
              ASSERT_TRUE(f.ok());
              (*out)[path] = std::to_string(e.attr().size()) + " " + f->version();
            }
            after = e.cookie();
          }
          if (page.end()) break;
        }
        if (order % 2 == 1) std::reverse(dirs.begin(), dirs.end());
        if (order >= 2) std::rotate(dirs.begin(), dirs.begin() + static_cast<long>(dirs.size() / 2), dirs.end());
        for (const auto& [sub, path] : dirs) walk(ns, sub, path, out, order);
      };
  // Directory by directory (one delimiter listing each), as a sync lists them.
  auto lazy = open_ns("lazy", 0);
  std::map<std::string, std::string> lazy_tree, bulk_tree;
  walk(*lazy, lazy->Resolve("/ds")->ino(), "", &lazy_tree, 0);
  const uint64_t dirs = std::count_if(lazy_tree.begin(), lazy_tree.end(), [](const auto& kv) { return kv.second == "dir"; });
  EXPECT_EQ(lazy->ufs_counters().lists.load(), dirs + 1);
  // Listed ahead (the default): the whole tree (fewer entries than the budget) in one flat listing
  // at the first readdir.
  auto ahead = open_ns("ahead");
  std::map<std::string, std::string> ahead_tree;
  walk(*ahead, ahead->Resolve("/ds")->ino(), "", &ahead_tree, 0);
  EXPECT_EQ(ahead_tree, lazy_tree);
  EXPECT_EQ(ahead->ufs_counters().lists.load(), 1u);
  // A budget smaller than the tree: the listing ahead stops, the directories it passed whole are
  // listed, the rest is listed as it is read; the same tree.
  auto partial = open_ns("partial", 300);
  std::map<std::string, std::string> partial_tree;
  walk(*partial, partial->Resolve("/ds")->ino(), "", &partial_tree, 0);
  EXPECT_EQ(partial_tree, lazy_tree);
  EXPECT_GT(partial->ufs_counters().lists.load(), 1u);
  // Listings ahead racing one another and plain listings of the directories they cover: four
  // walkers at once, each descending in its own order, over a budget that stops most listings
  // ahead part way. Every walker sees the same tree.
  auto racing = open_ns("racing", 50);
  std::vector<std::map<std::string, std::string>> trees(4);
  std::vector<std::thread> walkers;
  for (size_t w = 0; w < trees.size(); ++w) {
    walkers.emplace_back([&, w] { walk(*racing, racing->Resolve("/ds")->ino(), "", &trees[w], w); });
  }
  for (auto& t : walkers) t.join();
  for (const auto& tree : trees) EXPECT_EQ(tree, lazy_tree);
  auto bulk = open_ns("bulk");
  auto stats = bulk->LoadTree("/ds");
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_GE(stats->files, 1100u);
  walk(*bulk, bulk->Resolve("/ds")->ino(), "", &bulk_tree, 0);
  EXPECT_EQ(bulk_tree, lazy_tree);
  EXPECT_TRUE(bulk_tree.count("clash/inside.txt"));
  // A key whose name cannot be a file name, between two that can: skipped, and its directory
  // stays one directory (it was once closed at the skipped key, then swept of what came before).
  EXPECT_TRUE(bulk_tree.count("long/A.txt"));
  EXPECT_TRUE(bulk_tree.count("long/z.txt"));
  EXPECT_FALSE(bulk_tree.count("clash")) << "the directory wins over the object of the same name";
}

// A directory listed for the first time with the store unreachable fails once, when the listing
// ahead has spent its retries: not again after the plain listing's own.
TEST_F(S3Test, AColdListingWithTheStoreDownFailsAfterOneListing) {
  int rgw_port = std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1));
  FaultProxy proxy(rgw_port);
  TempDir dir;
  auto ns = master::Namespace::Open(dir / "db", 4 << 20, UfsAccess::Unrestricted());
  ASSERT_TRUE(ns.ok()) << ns.status().message();
  auto m = (*ns)->Mount("/ds", "s3://granary-test/ds",
                        {{"endpoint", "http://127.0.0.1:" + std::to_string(proxy.port())},
                         {"access_key_file", CredFile("ak", ak_)},
                         {"secret_key_file", CredFile("sk", sk_)},
                         {"retry_deadline", "1s"},
                         {"max_attempts", "3"}});
  ASSERT_TRUE(m.ok()) << m.status().message();
  proxy.SetMode(FaultProxy::kReset);
  const uint64_t before = (*ns)->ufs_counters().lists.load();
  rpc::ReadDirResponse page;
  Status st = (*ns)->ReadDir(m->root_ino(), 0, 100, &page);
  EXPECT_TRUE(st.IsUnderStorageDown()) << st.message();
  EXPECT_NE(st.message().find("s3://granary-test/ds"), std::string::npos) << st.message();
  EXPECT_EQ((*ns)->ufs_counters().lists.load() - before, 1u) << "listed again after the store was found down";
  // Back up: the same call lists.
  proxy.SetMode(FaultProxy::kPass);
  page.Clear();
  st = (*ns)->ReadDir(m->root_ino(), 0, 100, &page);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_GT(page.entries_size(), 0);
}

// A block that is the whole object (UnderFileSystem::ReadWhole) is asked for without a Range — RGW
// spends ~25% less CPU on such a GET (docs/benchmarks.md, session 44) — and still pinned to its
// version, checked for length, and streamed.
TEST_F(S3Test, WholeObjectReadsAskWithoutARange) {
  struct Recording : HttpClient {
    StatusOr<HttpResponse> Send(const HttpRequest& req) override {
      bool ranged = false;
      for (const auto& [k, v] : req.headers) ranged |= k == "Range";
      (ranged ? ranged_gets : plain_gets) += req.method == "GET";
      return real.Send(req);
    }
    std::atomic<int> ranged_gets{0}, plain_gets{0};
    CurlHttpClient real;
  };
  auto http = std::make_shared<Recording>();
  auto ufs = Open("s3://granary-test/ds", {}, http);
  ASSERT_TRUE(ufs);
  std::string want = ReadFile(*dir_ / "big.bin");
  auto st = ufs->Stat("deep/x/y/z.bin");
  ASSERT_TRUE(st.ok());
  http->plain_gets = 0;  // Stat's requests do not count
  http->ranged_gets = 0;
  ReadProgress progress;
  std::string buf(want.size(), '\0');
  auto n = ufs->ReadWhole("deep/x/y/z.bin", st->version, buf.size(), buf.data(), &progress);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(*n, want.size());
  EXPECT_EQ(buf, want);
  EXPECT_EQ(progress.landed(), want.size()) << "a whole object's 200 streams as a range's 206 does";
  EXPECT_EQ(http->plain_gets.load(), 1);
  EXPECT_EQ(http->ranged_gets.load(), 0);
  // A range still asks for its range.
  ASSERT_TRUE(ufs->ReadStreaming("deep/x/y/z.bin", st->version, 0, 1000, buf.data(), nullptr).ok());
  EXPECT_EQ(http->ranged_gets.load(), 1);
  // Listed shorter than it is (a size from another version): refused, never returned as the file.
  auto wrong = ufs->ReadWhole("deep/x/y/z.bin", st->version, want.size() - 1, buf.data(), nullptr);
  EXPECT_FALSE(wrong.ok());
  // Another version: FAILED_PRECONDITION, as for a range.
  auto gone = ufs->ReadWhole("deep/x/y/z.bin", "\"not-its-etag\"", want.size(), buf.data(), nullptr);
  EXPECT_TRUE(gone.status().IsVersionChanged()) << gone.status().ToString();
}

TEST_F(S3Test, TransientFaultsAreRetriedAndNeverReturnWrongBytes) {
  auto http = std::make_shared<FaultHttp>();
  auto ufs = Open("s3://granary-test/ds", {{"retry_deadline", "60s"}}, http);
  ASSERT_TRUE(ufs);
  std::string want = ReadFile(*dir_ / "big.bin").substr(1'000'000, 2'000'000);
  auto st = ufs->Stat("deep/x/y/z.bin");
  ASSERT_TRUE(st.ok());
  using F = FaultHttp;
  for (F::Fault f : {F::kStatus500, F::kSlowDown503, F::kReset, F::kStall, F::kTruncate}) {
    {
      std::lock_guard<std::mutex> lock(http->mu);
      http->faults = {f, f};
    }
    int before = http->calls.load();
    std::string buf(want.size(), '\0');
    auto n = ufs->Read("deep/x/y/z.bin", st->version, 1'000'000, buf.size(), buf.data());
    ASSERT_TRUE(n.ok()) << "fault " << f << ": " << n.status().message();
    EXPECT_EQ(*n, want.size()) << "fault " << f;
    EXPECT_EQ(buf, want) << "fault " << f;
    EXPECT_EQ(http->calls.load() - before, 3) << "fault " << f << ": two failures, then success";
  }
  // A whole object's body cut short is fetched again too.
  {
    std::lock_guard<std::mutex> lock(http->mu);
    http->faults = {F::kTruncate};
  }
  std::string whole(9'000'000, '\0');
  int before = http->calls.load();
  auto n = ufs->ReadWhole("deep/x/y/z.bin", st->version, whole.size(), whole.data(), nullptr);
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(whole, ReadFile(*dir_ / "big.bin"));
  EXPECT_EQ(http->calls.load() - before, 2);
}

TEST_F(S3Test, PersistentFaultsGiveUpWithinTheBounds) {
  auto http = std::make_shared<FaultHttp>();
  auto ufs = Open("s3://granary-test/ds", {{"max_attempts", "4"}, {"retry_deadline", "60s"}}, http);
  ASSERT_TRUE(ufs);
  auto st = ufs->Stat("top.txt");
  ASSERT_TRUE(st.ok());
  http->SetForever(FaultHttp::kSlowDown503);
  char buf[16];
  int before = http->calls.load();
  auto r = ufs->Read("top.txt", st->version, 0, 4, buf);
  EXPECT_EQ(r.status().code(), Code::kUnavailable) << r.status().message();
  EXPECT_NE(r.status().message().find("SlowDown"), std::string::npos) << r.status().message();
  EXPECT_EQ(http->calls.load() - before, 4) << "max_attempts bounds the tries";

  // A short deadline ends the retries long before max_attempts.
  http->SetForever(std::nullopt);
  auto quick = Open("s3://granary-test/ds", {{"max_attempts", "100"}, {"retry_deadline", "300ms"}}, http);
  ASSERT_TRUE(quick);
  http->SetForever(FaultHttp::kReset);
  before = http->calls.load();
  r = quick->Read("top.txt", st->version, 0, 4, buf);
  EXPECT_EQ(r.status().code(), Code::kUnavailable);
  EXPECT_LT(http->calls.load() - before, 100) << "the deadline bounds the tries";
  http->SetForever(std::nullopt);
}

// The storage link fails under a reader: retries run out within the deadline and the reader gets
// EIO — no hang, no wrong bytes — and once the link is back, reads succeed.
TEST_F(S3Test, UnreachableStorageGivesTheReaderEioThenRecovers) {
  int rgw_port = std::stoi(endpoint_.substr(endpoint_.rfind(':') + 1));
  FaultProxy proxy(rgw_port);
  TempDir dir;
  mkdir((dir / "mnt").c_str(), 0755);
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"}, {"AWS_ACCESS_KEY_ID", ak_},
                                         {"AWS_SECRET_ACCESS_KEY", sk_}};
  Process local({Bin("granary"), "local", "s3://granary-test/ds", dir / "mnt", "--dir", dir / "state", "-o",
                 "endpoint=http://127.0.0.1:" + std::to_string(proxy.port()), "-o", "retry_deadline=2s", "-o",
                 "max_attempts=4"},
                dir / "local.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
  std::string path = dir / "mnt/deep/x/y/z.bin";
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);  // listed through the proxy

  proxy.SetMode(FaultProxy::kReset);
  int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  std::string buf(1 << 20, '\0');
  errno = 0;
  EXPECT_EQ(read(fd, buf.data(), buf.size()), -1) << "no bytes may come back while the storage is cut off";
  EXPECT_EQ(errno, EIO) << strerror(errno);
  close(fd);
  // The worker answered that the storage is down (after its retry_deadline); granary-fuse took
  // that as the answer, not as a worker to wait for (fuse.worker_wait, 2 min by default).
  EXPECT_NE(local.Log().find("read: "), std::string::npos) << local.Log();
  EXPECT_EQ(local.Log().find("fuse.worker_wait"), std::string::npos) << local.Log();

  proxy.SetMode(FaultProxy::kPass);
  EXPECT_EQ(Sha256File(path), Sha256File(*dir_ / "big.bin")) << "reads recover once the storage is back";
  EXPECT_EQ(local.Stop(SIGTERM), 0) << local.Log();
}

// Credentials from files named by mount options (a mounted Kubernetes Secret), endpoint as an option.
TEST_F(S3Test, MountOptionsWithCredentialFiles) {
  TempDir dir;
  mkdir((dir / "mnt").c_str(), 0755);
  WriteFile(dir / "ak", ak_ + "\n");
  WriteFile(dir / "sk", sk_ + "\n");
  Process local({Bin("granary"), "local", "s3://granary-test/ds/deep", dir / "mnt", "--dir", dir / "state", "-o",
                 "endpoint=" + endpoint_, "-o", "access_key_file=" + dir / "ak", "-o", "secret_key_file=" + dir / "sk"},
                dir / "local.log", {{"GRANARY_HOME", dir / "home"}, {"AWS_ACCESS_KEY_ID", ""}});
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
  EXPECT_EQ(Sha256File(dir / "mnt/x/y/z.bin"), Sha256File(*dir_ / "big.bin"));
  RunResult mounts = RunCommand({Bin("granary"), "mounts"}, {{"GRANARY_HOME", dir / "home"}});
  EXPECT_EQ(mounts.out.find(sk_), std::string::npos) << mounts.out;
  EXPECT_EQ(local.Stop(SIGTERM), 0) << local.Log();
  EXPECT_EQ(local.Log().find(sk_), std::string::npos);
}

}  // namespace
}  // namespace granary::testing
