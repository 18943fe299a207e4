// Bad input: every binary exits non-zero with one line that names the problem.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/integration/harness.h"

namespace granary::testing {
namespace {

int CountLines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Binds a TCP socket on a loopback port the OS picks; returns the fd (listening if `listen_too`) and
// sets *address.
int BindLoopback(bool listen_too, std::string* address) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  if (listen_too) {
    EXPECT_EQ(listen(fd, 1), 0);
  }
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *address = "127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  return fd;
}

void ExpectOneLineError(const RunResult& r, const std::string& needle) {
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_EQ(CountLines(r.out), 1) << r.out;
  EXPECT_NE(r.out.find("error: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.out;
}

TEST(BadInput, ConfigFileProblems) {
  TempDir dir;
  ExpectOneLineError(RunCommand({Bin("granary-master"), "--config", dir / "missing.yaml"}), "missing.yaml");
  WriteFile(dir / "bad-size.yaml", "worker:\n  cache_quota: 12Zi\n");
  ExpectOneLineError(RunCommand({Bin("granary-worker"), "--config", dir / "bad-size.yaml"}), "worker.cache_quota");
  WriteFile(dir / "unknown.yaml", "master:\n  lisen: 127.0.0.1:0\n");
  ExpectOneLineError(RunCommand({Bin("granary-master"), "--config", dir / "unknown.yaml"}), "unknown setting 'master.lisen'");
  WriteFile(dir / "empty-value.yaml", "master:\n  block_size:\n");
  ExpectOneLineError(RunCommand({Bin("granary-master"), "--config", dir / "empty-value.yaml"}), "master.block_size: no value given");
  WriteFile(dir / "not-yaml.yaml", "master: [\n");
  ExpectOneLineError(RunCommand({Bin("granary-fuse"), "--config", dir / "not-yaml.yaml"}), "not valid YAML");
  ExpectOneLineError(RunCommand({Bin("granary-master"), "--master.block_size", "huge"}), "master.block_size");
}

TEST(BadInput, PortAlreadyInUse) {
  TempDir dir;
  std::string busy;
  int fd = BindLoopback(true, &busy);
  ExpectOneLineError(RunCommand({Bin("granary-master"), "--master.listen", busy, "--master.data_dir", dir / "m"}),
                     "address already in use");
  ExpectOneLineError(RunCommand({Bin("granary-worker"), "--worker.listen", busy, "--worker.cache_dir", dir / "c"}),
                     "address already in use");
  close(fd);
}

TEST(BadInput, MissingMountPointAndUnderStorage) {
  TempDir dir;
  ExpectOneLineError(RunCommand({Bin("granary-fuse"), "--fuse.mountpoint", dir / "no-such-dir"}), "does not exist");
  mkdir((dir / "mnt").c_str(), 0755);
  ExpectOneLineError(RunCommand({Bin("granary"), "local", dir / "no-such-src", dir / "mnt", "--dir", dir / "state"},
                         {{"GRANARY_HOME", dir / "home"}}),
                     "does not exist");
  mkdir((dir / "src").c_str(), 0755);
  ExpectOneLineError(RunCommand({Bin("granary"), "local", dir / "src", dir / "no-such-mnt", "--dir", dir / "state"},
                         {{"GRANARY_HOME", dir / "home"}}),
                     "mount point");
  EXPECT_FALSE(IsMounted(dir / "mnt"));

  LocalCluster c(dir);
  std::string why;
  ASSERT_TRUE(c.StartDaemons(&why)) << why;
  ExpectOneLineError(c.Cli({"mount", "/x", "file://" + dir / "no-such-src"}), "does not exist");
  ExpectOneLineError(c.Cli({"mount", "/x", "ftp://host/x"}), "not supported");
  ExpectOneLineError(c.Cli({"unmount", "/never-mounted"}), "not a mounted dataset");
}

TEST(BadInput, UnreachableMaster) {
  TempDir dir;
  // A port that nothing listens on: bind, read the port, close.
  std::string dead;
  close(BindLoopback(false, &dead));
  ExpectOneLineError(RunCommand({Bin("granary"), "--master", dead, "mounts"}, {{"GRANARY_HOME", dir / "home"}}),
                     "cannot reach the master at " + dead);
}

}  // namespace
}  // namespace granary::testing
