// granary:// for Python (python/, docs/python.md) against a real master and worker, no FUSE
// mount: tests/python/fsspec_check.py as root and as a reader of worker.local_socket_group
// (nobody, whose group is nogroup), checked against the source tree as each user sees it; and the
// C++ client under it across a worker's restart and a file changed while open.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>

#include "python/client.h"
#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

namespace fs = std::filesystem;

gid_t NoGroup() {
  struct group* g = getgrnam("nogroup");
  return g == nullptr ? static_cast<gid_t>(-1) : g->gr_gid;
}

class PythonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(NoGroup(), static_cast<gid_t>(-1)) << "Debian's nogroup is missing";
    const std::string src = dir_ / "src";
    WriteFile(src + "/a/b/c/deep.txt", "deep\n");
    WriteFile(src + "/empty.bin", "");
    WriteFile(src + "/many-blocks.bin", RandomBytes(64 * 1024 * 17 + 123, 7));  // 18 blocks of 64Ki
    WriteFile(src + "/exact-block.bin", RandomBytes(64 * 1024, 8));
    WriteFile(src + "/with space/naïve café ü 日本.txt", "unicode\n");
    for (int i = 0; i < 30; ++i) {
      WriteFile(src + "/class_" + std::to_string(i % 3) + "/img" + std::to_string(i) + ".jpg", RandomBytes(1000 + i * 977, i));
    }
    fs::create_directories(src + "/empty-dir");
    // Real JPEGs in class folders, for the torch example.
    RunResult gen = RunCommand({"/usr/bin/python3", SourceDir() + "/bench/gen_dataset.py", "--out", src + "/images",
                                "--files", "40", "--classes", "2", "--jpeg"});
    ASSERT_EQ(gen.code, 0) << gen.out;
    // What a reader who is not the owner may not have: a file by its mode, a directory's contents.
    WriteFile(src + "/0-secret.bin", RandomBytes(5000, 99));
    chmod((src + "/0-secret.bin").c_str(), 0600);
    chmod((src + "/a/b/c/deep.txt").c_str(), 0640);
    WriteFile(src + "/locked/inside.bin", RandomBytes(3000, 98));
    chmod((src + "/locked").c_str(), 0700);
    // Group `users` (a supplementary group of the reader below): one file it may read by its group
    // bits, one whose group bits deny what its other bits would give (as the kernel decides).
    struct group* users = getgrnam("users");
    ASSERT_NE(users, nullptr) << "Debian's group users is missing";
    WriteFile(src + "/grp-users.bin", RandomBytes(2000, 97));
    WriteFile(src + "/neg-users.bin", RandomBytes(2000, 96));
    ASSERT_EQ(chown((src + "/grp-users.bin").c_str(), 0, users->gr_gid), 0);
    ASSERT_EQ(chown((src + "/neg-users.bin").c_str(), 0, users->gr_gid), 0);
    chmod((src + "/grp-users.bin").c_str(), 0640);
    chmod((src + "/neg-users.bin").c_str(), 0604);
    // The reader reaches the source (to compare), the package and the socket's directory.
    chmod(dir_.path().c_str(), 0755);
    const std::string sock_dir = dir_ / "run";
    ASSERT_EQ(mkdir(sock_dir.c_str(), 0750), 0);
    ASSERT_EQ(chown(sock_dir.c_str(), 0, NoGroup()), 0);
    socket_ = sock_dir + "/worker.sock";
    std::string why;
    ASSERT_TRUE(cluster_.StartDaemons(&why)) << why;
    RunResult m = cluster_.Cli({"mount", "/ds", "file://" + src});
    ASSERT_EQ(m.code, 0) << m.out;
    // The package as built (build/python/granary), copied where any user may import it.
    const std::string py = dir_ / "py";
    fs::create_directories(py + "/granary");
    for (const auto& e : fs::directory_iterator(fs::path(Bin("granary")).parent_path().parent_path() / "python/granary")) {
      if (e.is_regular_file()) fs::copy_file(e.path(), py + "/granary/" + e.path().filename().string());
    }
    fs::copy_file(SourceDir() + "/tests/python/fsspec_check.py", py + "/fsspec_check.py");
    fs::copy_file(SourceDir() + "/python/examples/torch_imagefolder.py", py + "/torch_imagefolder.py");
    for (const auto& e : fs::recursive_directory_iterator(py)) chmod(e.path().c_str(), e.is_directory() ? 0755 : 0644);
    chmod(py.c_str(), 0755);
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.Logs();
  }
  RunResult Check(const std::vector<std::string>& as) {
    std::vector<std::string> argv = as;
    for (const std::string& a : {std::string("/usr/bin/python3"), dir_ / "py/fsspec_check.py", std::string("--socket"), socket_,
                                 std::string("--source"), dir_ / "src", std::string("--ns"), std::string("/ds")}) {
      argv.push_back(a);
    }
    return RunCommand(argv, {{"PYTHONPATH", dir_ / "py"}, {"HOME", "/"}}, std::chrono::seconds(240));
  }

  TempDir dir_;
  std::string socket_ = dir_ / "run/worker.sock";
  LocalCluster cluster_{dir_, [this] {
                          ClusterOptions o;
                          o.worker_args = {"--worker.local_socket", socket_, "--worker.local_socket_group", "nogroup"};
                          return o;
                        }()};
};

TEST_F(PythonTest, RootReadsEveryFileOfTheSourceThroughFsspec) {
  RunResult r = Check({});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 failures"), std::string::npos) << r.out;
}

// scripts/install-python.sh's install: fsspec finds granary:// by its entry point alone (no
// `import granary`), with the socket as a storage option.
TEST_F(PythonTest, TheInstalledPackageRegistersTheProtocolWithFsspec) {
  const std::string site = dir_ / "site";
  const std::string build = fs::path(Bin("granary")).parent_path().parent_path().string();
  RunResult inst = RunCommand({"bash", SourceDir() + "/scripts/install-python.sh", "--prefix", site, "--build", build});
  ASSERT_EQ(inst.code, 0) << inst.out;
  RunResult r = RunCommand({"/usr/bin/python3", "-c",
                            "import fsspec, sys\n"
                            "with fsspec.open('granary:///ds/exact-block.bin', 'rb', socket=sys.argv[1]) as f:\n"
                            "  sys.stdout.write(f.read().hex())\n",
                            socket_},
                           {{"PYTHONPATH", site}, {"HOME", "/"}});
  ASSERT_EQ(r.code, 0) << r.out;
  std::string hex;
  for (unsigned char ch : ReadFile(dir_ / "src/exact-block.bin")) {
    static const char* d = "0123456789abcdef";
    hex += d[ch >> 4];
    hex += d[ch & 15];
  }
  EXPECT_TRUE(r.out == hex) << "the installed package read other bytes than the source's";
}

// python/examples/torch_imagefolder.py: a DataLoader with 2 forked workers over granary:// decodes
// the same images, in the same order, as over the source directory (equal digests).
TEST_F(PythonTest, TheTorchExampleDecodesWhatTheSourceHolds) {
  if (RunCommand({"/usr/bin/python3", "-c", "import torch"}).code != 0) {
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh leaves it out: 600 MB)";
  }
  const std::string example = dir_ / "py/torch_imagefolder.py";
  std::map<std::string, std::string> env{{"PYTHONPATH", dir_ / "py"}, {"HOME", "/"}};
  RunResult via = RunCommand({"/usr/bin/python3", example, "granary:///ds/images", "--socket", socket_, "--workers", "2"},
                             env, std::chrono::seconds(240));
  ASSERT_EQ(via.code, 0) << via.out;
  RunResult local = RunCommand({"/usr/bin/python3", example, dir_ / "src/images", "--workers", "0"}, env,
                               std::chrono::seconds(240));
  ASSERT_EQ(local.code, 0) << local.out;
  auto digest = [](const std::string& out) {
    size_t at = out.find("digest ");
    return at == std::string::npos ? std::string("(none)") : out.substr(at + 7, 64);
  };
  EXPECT_NE(via.out.find("40 images in 2 classes"), std::string::npos) << via.out;
  EXPECT_EQ(digest(via.out), digest(local.out)) << via.out << "\n" << local.out;
}

// A group that does not exist stops the worker with an error that names it (readers would find no
// socket they may use).
TEST_F(PythonTest, AnUnknownSocketGroupIsAClearErrorAtStart) {
  RunResult r = RunCommand({Bin("granary-worker"), "--master.address", cluster_.master_address(), "--worker.listen",
                            "127.0.0.1:0", "--worker.metrics_listen", "off", "--worker.cache_dir", dir_ / "cache2",
                            "--worker.local_socket", dir_ / "run/other.sock", "--worker.local_socket_group",
                            "no-such-group-here"});
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("worker.local_socket_group"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no-such-group-here"), std::string::npos) << r.out;
}

TEST_F(PythonTest, AGroupReaderReadsWhatTheModesAllowAndForgesNothing) {
  struct stat st {};
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  EXPECT_EQ(st.st_gid, NoGroup());
  // nobody, in group nogroup (the socket's) and, as a supplementary group, users.
  RunResult r = Check({"runuser", "-u", "nobody", "-g", "nogroup", "-G", "users", "--"});
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("0 failures"), std::string::npos) << r.out;
  // A user outside the group cannot connect at all: the error names the socket.
  RunResult other = RunCommand({"runuser", "-u", "daemon", "--", "/usr/bin/python3", "-c",
                                "import granary._native as n\ntry:\n  n.Client('" + socket_ +
                                    "')\nexcept PermissionError as e:\n  print('refused:', e)\n"},
                               {{"PYTHONPATH", dir_ / "py"}, {"HOME", "/"}});
  EXPECT_EQ(other.code, 0) << other.out;
  EXPECT_NE(other.out.find("refused:"), std::string::npos) << other.out;
  EXPECT_NE(other.out.find(socket_), std::string::npos) << other.out;
}

// The C++ client under the package: an open file reads on across a worker's restart (its grants
// are void: it gets new ones for the same version), and a file changed in the source while open
// gives the old bytes or ESTALE, never a mix.
TEST_F(PythonTest, AnOpenFileReadsOnAcrossARestartAndNeverMixesVersions) {
  python::ClientOptions o;
  o.socket = socket_;
  o.metadata_ttl = std::chrono::milliseconds(0);
  auto c = python::Client::Create(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string want = ReadFile(dir_ / "src/many-blocks.bin");
  auto f = (*c)->Open("/ds/many-blocks.bin");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::string got(want.size(), '\0');
  const uint64_t half = want.size() / 2;
  auto n = (*c)->Read(**f, 0, half, got.data());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  std::string why;
  ASSERT_TRUE(cluster_.RestartWorker(&why)) << why;
  n = (*c)->Read(**f, half, want.size(), got.data() + half);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, want.size() - half);
  EXPECT_TRUE(got == want) << "the bytes across the restart differ from the source";

  // Changed in the source while open (same size, other bytes and mtime): what is read of the open
  // file is the old version's bytes or a VersionChanged error, never the new bytes. (A mount that
  // checks its files with the under-storage every second, so that later opens can see the new
  // version: without metadata.sync_interval the master never looks again, for the mount either.)
  RunResult sync = cluster_.Cli({"mount", "/sync", "file://" + dir_ / "src", "-o", "metadata.sync_interval=1s"});
  ASSERT_EQ(sync.code, 0) << sync.out;
  auto g = (*c)->Open("/sync/exact-block.bin");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  const std::string old_bytes = ReadFile(dir_ / "src/exact-block.bin");
  const std::string new_bytes = RandomBytes(old_bytes.size(), 1234);
  WriteFile(dir_ / "src/exact-block.bin", new_bytes);
  struct timespec later[2] = {{0, UTIME_OMIT}, {time(nullptr) + 100, 0}};
  utimensat(AT_FDCWD, (dir_ / "src/exact-block.bin").c_str(), later, 0);
  std::string after(old_bytes.size(), '\0');
  auto m = (*c)->Read(**g, 0, after.size(), after.data());
  if (m.ok()) {
    EXPECT_TRUE(after == old_bytes) << "an open file read bytes of another version";
  } else {
    EXPECT_TRUE(m.status().IsVersionChanged()) << m.status().ToString();
    // The next opens ask the master (GETFILE), which learns the new version from the
    // under-storage as it does for the mount's opens: until then ESTALE, then the new bytes —
    // never the new bytes under the old version's name, never a mix.
    std::string fresh(new_bytes.size(), '\0');
    Status last;
    EXPECT_TRUE(WaitFor([&] {
      auto again = (*c)->Open("/sync/exact-block.bin");
      if (!again.ok()) {
        last = again.status();
        return false;
      }
      auto k = (*c)->Read(**again, 0, fresh.size(), fresh.data());
      last = k.status();
      if (!k.ok()) {
        EXPECT_TRUE(k.status().IsVersionChanged()) << k.status().ToString();
        return false;
      }
      EXPECT_TRUE(fresh == new_bytes || fresh == old_bytes) << "bytes of neither version";
      return fresh == new_bytes;
    }, std::chrono::seconds(60))) << last.ToString();
  }
}

}  // namespace
}  // namespace granary::testing
