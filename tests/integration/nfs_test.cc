// The NFS client against a real NFSv4 server (nfs-ganesha on loopback, scripts/nfs-server.sh),
// and a dataset on it read through `granary local nfs://...`.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "ufs/nfs_ufs.h"
#include "tests/integration/harness.h"
#include "tests/testutil/proxy.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

class NfsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    std::string exp = *dir_ / "nfs/export";
    WriteFile(exp + "/train/n01/a.JPEG", RandomBytes(110'000, 1));
    WriteFile(exp + "/train/n02/b.JPEG", RandomBytes(90'000, 2));
    WriteFile(exp + "/shards/shard-00000.tfrecord", RandomBytes(9'500'000, 3));  // several blocks, >1 MiB reads
    WriteFile(exp + "/naïve ü/日本.txt", "unicode\n");
    WriteFile(exp + "/empty.bin", "");
    WriteFile(exp + "/changing.bin", "version one");
    RunResult r = RunCommand({"bash", SourceDir() + "/scripts/nfs-server.sh", "start", *dir_ / "nfs"}, {},
                             std::chrono::seconds(120));
    std::istringstream in(r.out.substr(std::min(r.out.size(), r.out.rfind("READY"))));
    std::string ready;
    in >> ready >> uri_;
    started_ = r.code == 0 && ready == "READY";
    if (!started_) log_ = r.out;
  }
  static void TearDownTestSuite() {
    RunCommand({"bash", SourceDir() + "/scripts/nfs-server.sh", "stop", *dir_ / "nfs"});
    delete dir_;
  }
  void SetUp() override { ASSERT_TRUE(started_) << "NFS server did not start:\n" << log_; }

  static TempDir* dir_;
  static bool started_;
  static std::string uri_, log_;
};
TempDir* NfsTest::dir_ = nullptr;
bool NfsTest::started_ = false;
std::string NfsTest::uri_, NfsTest::log_;

TEST_F(NfsTest, ListStatReadAndDetectChanges) {
  auto ufs = NfsUfs::Open(uri_, {});
  ASSERT_TRUE(ufs.ok()) << ufs.status().message();
  std::set<std::string> names;
  ASSERT_TRUE((*ufs)->List("", 2, [&](std::vector<UfsEntry>& page) {
    EXPECT_LE(page.size(), 2u);
    for (auto& e : page) names.insert(e.name + (e.is_dir ? "/" : ""));
    return Status::OK();
  }).ok());
  EXPECT_EQ(names, (std::set<std::string>{"train/", "shards/", "naïve ü/", "empty.bin", "changing.bin"}));
  auto st = (*ufs)->Stat("shards/shard-00000.tfrecord");
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_EQ(st->size, 9'500'000u);
  std::string want = ReadFile(*dir_ / "nfs/export/shards/shard-00000.tfrecord");
  std::string buf(4 << 20, '\0');
  auto n = (*ufs)->Read("shards/shard-00000.tfrecord", st->version, 4 << 20, buf.size(), buf.data());
  ASSERT_TRUE(n.ok()) << n.status().message();
  EXPECT_EQ(buf.substr(0, *n), want.substr(4 << 20, 4 << 20));

  auto v1 = (*ufs)->Stat("changing.bin");
  ASSERT_TRUE(v1.ok());
  WriteFile(*dir_ / "nfs/export/changing.bin", "VERSION TWO, longer");
  EXPECT_TRUE((*ufs)->Read("changing.bin", v1->version, 0, 11, buf.data()).status().IsVersionChanged());
  EXPECT_EQ((*ufs)->Stat("no/such/file").status().code(), Code::kNotFound);
  EXPECT_EQ((*ufs)->Read("../escape", "v", 0, 1, buf.data()).status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(NfsUfs::Open(uri_, {{"bogus", "1"}}).ok());
}

// nfs:// keeps the retry contract of s3:// (UfsRetry): a read whose connection is cut, and whose
// reconnections are refused for a while, is tried again on a fresh connection and returns the
// file's bytes once the server is reachable again; with max_attempts 1 it fails at once, naming
// the export; options that are not numbers are refused.
TEST_F(NfsTest, AReadCutOffItsServerIsTriedAgainOnAFreshConnection) {
  const std::string port_arg = "nfsport=";
  const size_t at = uri_.find(port_arg);
  ASSERT_NE(at, std::string::npos) << uri_;
  FaultProxy proxy(std::stoi(uri_.substr(at + port_arg.size())));
  const std::string via_proxy = uri_.substr(0, at) + port_arg + std::to_string(proxy.port());
  auto ufs = NfsUfs::Open(via_proxy, {{"connections", "1"}, {"retry_deadline", "60s"}, {"max_attempts", "100"}});
  ASSERT_TRUE(ufs.ok()) << ufs.status().message();
  auto st = (*ufs)->Stat("train/n01/a.JPEG");
  ASSERT_TRUE(st.ok()) << st.status().message();
  const std::string want = ReadFile(*dir_ / "nfs/export/train/n01/a.JPEG");

  proxy.SetMode(FaultProxy::kReset);  // the live connection is cut at its next request
  const int connections_before = proxy.connections();
  StatusOr<size_t> got = InternalError("not read");
  std::string buf(want.size(), '\0');
  std::thread reader([&] { got = (*ufs)->Read("train/n01/a.JPEG", st->version, 0, buf.size(), buf.data()); });
  // Wait until the reader has tried to reconnect at least twice (each refused), then let it through.
  bool retried = WaitFor([&] { return proxy.connections() >= connections_before + 2; }, std::chrono::seconds(60));
  proxy.SetMode(FaultProxy::kPass);
  reader.join();
  EXPECT_TRUE(retried) << "the read was not tried again on a new connection";
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, want.size());
  EXPECT_TRUE(buf == want) << "the bytes differ from the export's";

  // One attempt only: the cut read fails, with the export named, and is not retried.
  auto once = NfsUfs::Open(via_proxy, {{"connections", "1"}, {"max_attempts", "1"}});
  ASSERT_TRUE(once.ok()) << once.status().message();
  proxy.SetMode(FaultProxy::kReset);
  const int before_once = proxy.connections();
  auto failed = (*once)->Read("train/n01/a.JPEG", st->version, 0, buf.size(), buf.data());
  proxy.SetMode(FaultProxy::kPass);
  EXPECT_FALSE(failed.ok());
  EXPECT_TRUE(failed.status().IsRetryable()) << failed.status().ToString();
  EXPECT_EQ(proxy.connections(), before_once) << "max_attempts 1 reconnected to try again";

  auto bad = NfsUfs::Open(uri_, {{"retry_deadline", "soon"}});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("retry_deadline"), std::string::npos) << bad.status().message();
}

TEST_F(NfsTest, DatasetOnNfsReadsByteIdenticalThroughFuse) {
  TempDir dir;
  mkdir((dir / "mnt").c_str(), 0755);
  Process local({Bin("granary"), "local", uri_, dir / "mnt", "--dir", dir / "state", "--name", "/imagenet"},
                dir / "local.log", {{"GRANARY_HOME", dir / "home"}});
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
  std::string src = *dir_ / "nfs/export";
  int files = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& e : fs::recursive_directory_iterator(src)) {
      std::string rel = fs::relative(e.path(), src).string();
      if (rel == "changing.bin") continue;     // rewritten by the other test
      if (rel.rfind("big", 0) == 0) continue;  // ListStreamsPagesOfABigDirectory's
      struct stat st;
      ASSERT_EQ(stat((dir / ("mnt/" + rel)).c_str(), &st), 0) << rel;
      EXPECT_EQ(S_ISDIR(st.st_mode), e.is_directory()) << rel;
      if (e.is_regular_file()) {
        EXPECT_EQ(Sha256File(dir / ("mnt/" + rel)), Sha256File(e.path())) << rel;
        files += pass == 0;
      }
    }
  }
  EXPECT_EQ(files, 5);
  EXPECT_EQ(local.Stop(SIGTERM), 0) << local.Log();
  EXPECT_FALSE(IsMounted(dir / "mnt"));
}

// A directory far larger than one READDIR reply streams in pages: every entry once, with the same
// attributes and version Stat reports, special files skipped, nested paths and errors handled.
TEST_F(NfsTest, ListStreamsPagesOfABigDirectory) {
  std::string big = *dir_ / "nfs/export/big/sub";
  fs::create_directories(big);
  constexpr int kFiles = 5000;  // ~40 READDIR replies of 64 KiB
  for (int i = 0; i < kFiles; ++i) WriteFile(big + "/file-" + std::to_string(i) + ".jpg", std::to_string(i));
  fs::create_directory(big + "/a-directory");
  fs::create_symlink("file-1.jpg", big + "/a-link");
  fs::create_symlink("nowhere", big + "/dangling-link");
  mkfifo((big + "/a-fifo").c_str(), 0644);
  auto ufs = NfsUfs::Open(uri_, {});
  ASSERT_TRUE(ufs.ok()) << ufs.status().message();

  std::map<std::string, UfsEntry> seen;
  int pages = 0, duplicates = 0;
  ASSERT_TRUE((*ufs)->List("big/sub", 100, [&](std::vector<UfsEntry>& page) {
    EXPECT_LE(page.size(), 100u);
    ++pages;
    for (auto& e : page) duplicates += !seen.emplace(e.name, e).second;
    return Status::OK();
  }).ok());
  EXPECT_EQ(duplicates, 0);
  EXPECT_EQ(seen.size(), kFiles + 2u);  // the files, the directory, and the link as its target
  EXPECT_GE(pages, kFiles / 100);
  ASSERT_TRUE(seen.count("a-directory"));
  EXPECT_TRUE(seen["a-directory"].is_dir);
  ASSERT_TRUE(seen.count("a-link"));
  EXPECT_EQ(seen["a-link"].size, 1u);
  EXPECT_EQ(seen["a-link"].version, seen["file-1.jpg"].version);
  EXPECT_FALSE(seen.count("dangling-link"));
  EXPECT_FALSE(seen.count("a-fifo"));
  for (int i : {0, 1, 777, kFiles - 1}) {
    std::string name = "file-" + std::to_string(i) + ".jpg";
    ASSERT_TRUE(seen.count(name)) << name;
    auto st = (*ufs)->Stat("big/sub/" + name);
    ASSERT_TRUE(st.ok()) << st.status().message();
    EXPECT_EQ(seen[name].version, st->version) << name;
    EXPECT_EQ(seen[name].size, std::to_string(i).size());
    EXPECT_EQ(seen[name].mode, st->mode);
    EXPECT_EQ(seen[name].mtime_ns, st->mtime_ns);
    EXPECT_FALSE(seen[name].is_dir);
  }

  // The caller's error stops the listing at once; the connection stays usable.
  int calls = 0;
  Status stop = (*ufs)->List("big/sub", 10, [&](std::vector<UfsEntry>&) {
    ++calls;
    return AbortedError("enough");
  });
  EXPECT_EQ(stop.code(), Code::kAborted);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ((*ufs)->List("big/no-such-dir", 10, [](std::vector<UfsEntry>&) { return Status::OK(); }).code(),
            Code::kNotFound);
  EXPECT_EQ((*ufs)->List("big/sub/file-1.jpg", 10, [](std::vector<UfsEntry>&) { return Status::OK(); }).code(),
            Code::kNotFound);
  EXPECT_TRUE((*ufs)->Stat("big").ok());
}

// Writes through a writable mount of a directory of the export (write=through, then back): the
// files appear whole in the export (written to a hidden temporary name, then renamed), and mkdir,
// rename, unlink and rmdir reach the server.
TEST_F(NfsTest, WritesLandWholeInTheExport) {
  for (const char* mode : {"through", "back"}) {
    SCOPED_TRACE(mode);
    const std::string sub = std::string("written-") + mode;
    const std::string exp = *dir_ / ("nfs/export/" + sub);
    fs::create_directories(exp);
    const size_t q = uri_.find('?');
    const std::string uri = q == std::string::npos ? uri_ + "/" + sub : uri_.substr(0, q) + "/" + sub + uri_.substr(q);
    TempDir dir;
    mkdir((dir / "mnt").c_str(), 0755);
    Process local({Bin("granary"), "local", uri, dir / "mnt", "--dir", dir / "state", "-o", std::string("write=") + mode},
                  dir / "local.log", {{"GRANARY_HOME", dir / "home"}});
    ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
    ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
    const std::string big = RandomBytes(5'000'000, 9);
    WriteFile(dir / "mnt/ckpt.pt", big);
    EXPECT_TRUE(WaitFor([&] { return fs::exists(exp + "/ckpt.pt") && ReadFile(exp + "/ckpt.pt") == big; })) << local.Log();
    ASSERT_EQ(mkdir((dir / "mnt/out").c_str(), 0755), 0) << strerror(errno);
    EXPECT_TRUE(fs::is_directory(exp + "/out"));
    ASSERT_EQ(rename((dir / "mnt/ckpt.pt").c_str(), (dir / "mnt/out/final.pt").c_str()), 0) << strerror(errno);
    EXPECT_EQ(ReadFile(exp + "/out/final.pt"), big);
    EXPECT_EQ(ReadFile(dir / "mnt/out/final.pt"), big);
    EXPECT_EQ(rmdir((dir / "mnt/out").c_str()), -1);
    EXPECT_EQ(errno, ENOTEMPTY);
    ASSERT_EQ(unlink((dir / "mnt/out/final.pt").c_str()), 0) << strerror(errno);
    ASSERT_EQ(rmdir((dir / "mnt/out").c_str()), 0) << strerror(errno);
    EXPECT_TRUE(fs::is_empty(exp)) << "left in the export";
    EXPECT_EQ(local.Stop(SIGTERM), 0) << local.Log();
  }
}

}  // namespace
}  // namespace granary::testing
