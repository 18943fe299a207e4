// `granary local`: every daemon in one process, the CLI finding it without flags, Ctrl-C stopping it.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/fs.h"
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
  // keep_cache off: the second pass must reach the worker (it counts hits below).
  Process local({Bin("granary"), "local", "file://" + dir / "imagenet", dir / "mnt", "--dir", dir / "state",
                 "--fuse.keep_cache", "false", "--fuse.open", "daemon"},  // the second pass reaches the worker
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
  // `granary info` of a namespace path finds this node's worker as it does for a path in the mount
  // (issue 54: it named fuse.worker's default and counted 0 blocks on this node).
  for (const std::string& path : {std::string("/imagenet/n00/img0.JPEG"), dir / "mnt/n00/img0.JPEG"}) {
    RunResult info = RunCommand({Bin("granary"), "info", path, "--json"}, env);
    ASSERT_EQ(info.code, 0) << info.out;
    auto ij = nlohmann::json::parse(info.out, nullptr, false);
    ASSERT_TRUE(ij.is_object()) << info.out;
    EXPECT_EQ(ij["local_blocks"], ij["blocks"]) << path << ": " << info.out;
    EXPECT_NE(ij["local_worker"], "127.0.0.1:29999") << info.out;
  }
  RunResult mounts = RunCommand({Bin("granary"), "mounts"}, env);
  EXPECT_EQ(mounts.code, 0) << mounts.out;
  EXPECT_NE(mounts.out.find("/imagenet"), std::string::npos) << mounts.out;

  EXPECT_EQ(local.Stop(SIGINT), 0) << local.Log();
  EXPECT_FALSE(IsMounted(dir / "mnt"));
  EXPECT_EQ(local.Log().find("failed to unmount"), std::string::npos) << "a clean stop says no error: " << local.Log();
  EXPECT_FALSE(fs::exists(dir / "home/local.yaml")) << "discovery file must be removed on exit";
  RunResult after = RunCommand({Bin("granary"), "mounts"}, env);
  EXPECT_NE(after.code, 0);
}

// Issue 54, finding 1: two `granary local` on one machine shared the metrics ports (SO_REUSEPORT):
// a scrape got either at random. Now the second takes ports of its own, each discovery file (one
// per GRANARY_HOME) says where its instance's metrics are, and a second instance in the same
// GRANARY_HOME is refused, naming the first.
TEST(GranaryLocal, TwoInstancesOnOneMachineEachAnswerForThemselves) {
  TempDir dir;
  const std::string a_data = RandomBytes(300000, 1), b_data = RandomBytes(200000, 2);
  WriteFile(dir / "a/x.bin", a_data);
  WriteFile(dir / "b/y.bin", b_data);
  mkdir((dir / "mnt-a").c_str(), 0755);
  mkdir((dir / "mnt-b").c_str(), 0755);
  std::map<std::string, std::string> env_a{{"GRANARY_HOME", dir / "home-a"}}, env_b{{"GRANARY_HOME", dir / "home-b"}};
  Process a({Bin("granary"), "local", "file://" + dir / "a", dir / "mnt-a", "--dir", dir / "state-a"}, dir / "a.log",
            env_a);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt-a") || !a.Running(); })) << a.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt-a")) << a.Log();
  Process b({Bin("granary"), "local", "file://" + dir / "b", dir / "mnt-b", "--dir", dir / "state-b"}, dir / "b.log",
            env_b);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt-b") || !b.Running(); })) << b.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt-b")) << b.Log();

  // Each discovery file says where its own instance's worker metrics are.
  auto worker_metrics = [&](const std::string& home) {
    std::string yaml = ReadFile(home + "/local.yaml");
    size_t at = yaml.find(", worker http://");
    if (at == std::string::npos) return std::string();
    at += std::strlen(", worker http://");
    return yaml.substr(at, yaml.find("/metrics", at) - at);
  };
  std::string wa, wb;
  ASSERT_TRUE(WaitFor([&] {
    wa = worker_metrics(dir / "home-a");
    wb = worker_metrics(dir / "home-b");
    return !wa.empty() && !wb.empty();
  })) << a.Log() << b.Log();
  EXPECT_NE(wa, wb) << "two instances share a metrics port";
  EXPECT_NE(b.Log().find("metrics at http://"), std::string::npos) << "the banner says where: " << b.Log();

  // Reads through A only: A's worker counts the bytes it fetched, B's counts none.
  std::string got;
  ASSERT_TRUE(ReadFileChecked(dir / "mnt-a/x.bin", &got));
  ASSERT_EQ(got, a_data);
  auto ufs_bytes = [](const std::string& address) -> double {
    auto [code, body] = HttpGet(address, "/metrics");
    if (code != 200) return -1;
    const std::string sample = "granary_worker_ufs_read_bytes_total ";
    size_t at = body.find("\n" + sample);
    return at == std::string::npos ? -1 : std::stod(body.substr(at + 1 + sample.size()));
  };
  EXPECT_GE(ufs_bytes(wa), static_cast<double>(a_data.size()));
  EXPECT_EQ(ufs_bytes(wb), 0.0) << "B's endpoint answered with A's counters";
  for (int i = 0; i < 5; ++i) EXPECT_GE(ufs_bytes(wa), static_cast<double>(a_data.size())) << "a scrape reached B";

  // Each GRANARY_HOME's CLI finds its own instance.
  for (const auto& [env, path] : {std::pair{env_a, "/a"}, std::pair{env_b, "/b"}}) {
    RunResult r = RunCommand({Bin("granary"), "report", "--json"}, env);
    ASSERT_EQ(r.code, 0) << r.out;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << r.out;
    ASSERT_EQ(j["mounts"].size(), 1u) << r.out;
    EXPECT_EQ(j["mounts"][0]["path"], path) << r.out;
  }

  // And `granary stats`: A's cache holds what it read, B's nothing.
  auto cache_used = [&](const std::map<std::string, std::string>& env) -> double {
    RunResult r = RunCommand({Bin("granary"), "stats", "--count", "1", "--interval", "100ms", "--json"}, env);
    if (r.code != 0) return -1;
    auto j = nlohmann::json::parse(r.out.substr(0, r.out.find('\n')), nullptr, false);
    return j.is_object() ? j["cache"]["used_bytes"].get<double>() : -1;
  };
  EXPECT_GE(cache_used(env_a), static_cast<double>(a_data.size()));
  EXPECT_EQ(cache_used(env_b), 0.0) << "B's stats showed A";

  // A third in A's GRANARY_HOME (its own state directory) is refused, naming A.
  mkdir((dir / "mnt-c").c_str(), 0755);
  RunResult c = RunCommand(
      {Bin("granary"), "local", "file://" + dir / "b", dir / "mnt-c", "--dir", dir / "state-c"}, env_a,
      std::chrono::seconds(60));
  EXPECT_NE(c.code, 0) << c.out;
  EXPECT_NE(c.out.find("another granary local (pid " + std::to_string(a.pid()) + ")"), std::string::npos) << c.out;
  EXPECT_FALSE(IsMounted(dir / "mnt-c"));

  EXPECT_EQ(b.Stop(SIGINT), 0) << b.Log();
  EXPECT_EQ(a.Stop(SIGINT), 0) << a.Log();
}

// Issue 50, finding 2: `granary local` run as root answered any local user's Remove, Rename, MakeDir
// and Mount (with write=through) on its loopback master, and acted as root. Its daemons now answer
// only the holder of a fresh per-instance token, readable by its own user alone.
TEST(GranaryLocal, AnswersOnlyItsOwnUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: another user is played by setpriv";
  if (access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "no setpriv (util-linux)";
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  WriteFile(dir / "src/a.bin", "root's data");
  WriteFile(dir / "secret/root-only", "root only");
  mkdir((dir / "mnt").c_str(), 0755);
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"}};
  Process local({Bin("granary"), "local", "file://" + dir / "src", dir / "mnt", "--dir", dir / "state", "-o",
                 "write=through"},
                dir / "local.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
  // Where its master listens (the discovery file tells its own user; another finds the port anyway).
  std::string master;
  {
    // Written right after the mount is up: waited for, not assumed.
    std::string yaml;
    ASSERT_TRUE(WaitFor([&] {
      yaml = ReadFile(dir / "home/local.yaml");
      return yaml.find("token_file") != std::string::npos;
    })) << yaml << local.Log();
    size_t at = yaml.find("address: \"");
    ASSERT_NE(at, std::string::npos) << yaml;
    master = yaml.substr(at + 10, yaml.find('"', at + 10) - at - 10);
  }
  struct stat st;
  ASSERT_EQ(stat((dir / "state").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  ASSERT_EQ(stat((dir / "state/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Its own user, through the discovery file: everything as before.
  RunResult own = RunCommand({Bin("granary"), "mounts"}, env);
  EXPECT_EQ(own.code, 0) << own.out;
  // Another user: refused, whatever it asks.
  auto as_nobody = [&](std::vector<std::string> args) {
    std::vector<std::string> argv{"/usr/bin/setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                                  Bin("granary"), "--master", master};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, {{"GRANARY_HOME", dir / "nobody-home"}});
  };
  for (auto args : std::vector<std::vector<std::string>>{
           {"mounts"},
           {"mount", "/evil", "file://" + dir / "secret", "-o", "write=through"},
           {"free", "/src"},
           {"ls", "/"}}) {
    RunResult r = as_nobody(args);
    EXPECT_NE(r.code, 0) << args[0] << " by another user: " << r.out;
    EXPECT_NE(r.out.find("token"), std::string::npos) << args[0] << ": " << r.out;
  }
  RunResult mounts = RunCommand({Bin("granary"), "mounts"}, env);
  EXPECT_EQ(mounts.out.find("/evil"), std::string::npos) << mounts.out;
  EXPECT_EQ(ReadFile(dir / "secret/root-only"), "root only");
  EXPECT_EQ(local.Stop(SIGINT), 0) << local.Log();
}

// Issue 51, finding 2: another user squatted /tmp/granary-<uid> (0777) and planted a mount's
// endpoints file naming his own "worker"; `granary stats` sent it the user's token. The runtime
// directory is now trusted only when it is the user's own: the CLI refuses, names the squatter,
// and connects to nothing the planted file names.
TEST(GranaryLocal, ASquattedRuntimeDirectoryIsRefusedNotTrusted) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: two other users are played by chown and setpriv";
  if (access("/usr/bin/setpriv", X_OK) != 0) GTEST_SKIP() << "no setpriv (util-linux)";
  constexpr int kVictim = 54321;  // a uid no account of a test machine uses
  const std::string squat = "/tmp/granary-" + std::to_string(kVictim);
  std::filesystem::remove_all(squat);  // left by an earlier run of this test only
  TempDir dir;
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  mkdir((dir / "data").c_str(), 0755);
  mkdir((dir / "home").c_str(), 0700);
  ASSERT_EQ(chown((dir / "home").c_str(), kVictim, kVictim), 0);
  // The victim's token, which must reach nobody.
  WriteFile(dir / "home/token", "victims-secret-token\n");
  ASSERT_EQ(chown((dir / "home/token").c_str(), kVictim, kVictim), 0);
  ASSERT_EQ(chmod((dir / "home/token").c_str(), 0600), 0);
  WriteFile(dir / "home/granary.yaml", "rpc:\n  token_file: " + dir / "home/token" + "\n");
  ASSERT_EQ(chown((dir / "home/granary.yaml").c_str(), kVictim, kVictim), 0);
  // The attacker's listener: whatever connects is what the planted file lured.
  int lure = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT_GE(lure, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lure, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(lure, 8), 0);
  socklen_t len = sizeof a;
  ASSERT_EQ(getsockname(lure, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string lure_at = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  // The squat: made by nobody, open to all, with an endpoints file for the victim's data folder.
  ASSERT_EQ(mkdir(squat.c_str(), 0777), 0);
  ASSERT_EQ(chmod(squat.c_str(), 0777), 0);
  ASSERT_EQ(chown(squat.c_str(), 65534, 65534), 0);
  const std::string mp = dir / "data";
  const std::string planted = squat + "/" + MountRunFileName(mp, ".json");
  WriteFile(planted, nlohmann::json({{"mountpoint", mp}, {"root", "/"}, {"pid", getpid()}, {"metrics", lure_at},
                                     {"worker", lure_at}, {"master", lure_at}, {"trace", ""}})
                         .dump());
  ASSERT_EQ(chown(planted.c_str(), 65534, 65534), 0);
  const std::string v = std::to_string(kVictim);
  RunResult r = RunCommand({"/usr/bin/setpriv", "--reuid", v, "--regid", v, "--clear-groups", Bin("granary"), "stats",
                            mp, "--count", "1"},
                           {{"GRANARY_HOME", dir / "home"}, {"XDG_RUNTIME_DIR", ""}, {"GRANARY_RUN_DIR", ""}});
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(squat), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("uid 65534"), std::string::npos) << r.out;
  pollfd p{lure, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0) << "the CLI connected to the address the planted file named";
  close(lure);
  struct stat st {};
  ASSERT_EQ(lstat(squat.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u) << "the squatter's directory was taken over rather than refused";
  std::filesystem::remove_all(squat);
}

// Two datasets that share a folder name, served one after the other from one state directory:
// each just works (a distinct name, or the old name when its source is gone), a --name taken by
// another source stays an error, and a second `granary local` on a busy state directory is told so.
TEST(GranaryLocal, AnotherSourceWithTheSameFolderNameJustWorks) {
  TempDir dir;
  WriteFile(dir / "a/imagenet/x.txt", "from a\n");
  WriteFile(dir / "b/imagenet/x.txt", "from b\n");
  WriteFile(dir / "c/imagenet/x.txt", "from c\n");
  mkdir((dir / "mnt").c_str(), 0755);
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"}};
  // Serves `src` (plus `extra` arguments) at mnt until the file reads back; returns what it read.
  auto serve = [&](const std::string& src, std::vector<std::string> extra, std::string* mounts) {
    std::vector<std::string> argv{Bin("granary"), "local", "file://" + dir / src, dir / "mnt", "--dir", dir / "state"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    Process local(argv, dir / "local.log", env);
    if (!WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); }) || !IsMounted(dir / "mnt")) {
      local.Wait();
      return "(not served) " + local.Log();
    }
    std::string got = ReadFile(dir / "mnt/x.txt");
    *mounts = RunCommand({Bin("granary"), "mounts"}, env).out;
    EXPECT_EQ(local.Stop(SIGINT), 0) << local.Log();
    return got;
  };
  std::string mounts;
  EXPECT_EQ(serve("a/imagenet", {}, &mounts), "from a\n");
  EXPECT_EQ(serve("b/imagenet", {}, &mounts), "from b\n");
  EXPECT_NE(mounts.find("/imagenet-2"), std::string::npos) << mounts;
  EXPECT_EQ(serve("a/imagenet", {}, &mounts), "from a\n") << "the first dataset keeps its name";
  // a's source is gone: c takes /imagenet over; b keeps /imagenet-2.
  fs::remove_all(dir / "a");
  EXPECT_EQ(serve("c/imagenet", {}, &mounts), "from c\n");
  EXPECT_EQ(mounts.find("/imagenet-3"), std::string::npos) << mounts;
  EXPECT_NE(mounts.find("/imagenet-2"), std::string::npos) << mounts;
  EXPECT_EQ(serve("b/imagenet", {}, &mounts), "from b\n");

  // A name given with --name and taken by another source is a real conflict.
  Process named({Bin("granary"), "local", "file://" + dir / "c/imagenet", dir / "mnt", "--dir", dir / "state", "--name",
                 "/imagenet-2"},
                dir / "named.log", env);
  EXPECT_NE(named.Wait(), 0);
  EXPECT_NE(named.Log().find("already mounted from"), std::string::npos) << named.Log();
  EXPECT_FALSE(IsMounted(dir / "mnt"));

  // Two at once on one state directory: the second says who holds it.
  Process first({Bin("granary"), "local", "file://" + dir / "b/imagenet", dir / "mnt", "--dir", dir / "state"},
                dir / "first.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !first.Running(); })) << first.Log();
  mkdir((dir / "mnt2").c_str(), 0755);
  Process second({Bin("granary"), "local", "file://" + dir / "c/imagenet", dir / "mnt2", "--dir", dir / "state"},
                 dir / "second.log", env);
  EXPECT_NE(second.Wait(), 0);
  EXPECT_NE(second.Log().find("pid " + std::to_string(first.pid())), std::string::npos) << second.Log();
  EXPECT_NE(second.Log().find("--dir"), std::string::npos) << second.Log();
  EXPECT_FALSE(IsMounted(dir / "mnt2"));
  EXPECT_EQ(first.Stop(SIGINT), 0) << first.Log();
}

TEST(GranaryLocal, ConfigFileTieredStoreAndPerMountPolicy) {
  TempDir dir;
  TempDir shm("/dev/shm");
  for (int i = 0; i < 8; ++i) WriteFile(dir / ("ds/f" + std::to_string(i)), RandomBytes(50000, i));
  mkdir((dir / "mnt").c_str(), 0755);
  WriteFile(dir / "granary.yaml", "worker:\n  tieredstore:\n    policy: lru\n    levels:\n"
                                  "      - {mediumtype: MEM, path: " + shm / "mem" + ", quota: 64Mi}\n"
                                  "      - {mediumtype: HDD, path: " + dir / "hdd" + ", quota: 1Gi, high: \"0.9\", low: \"0.8\"}\n");
  std::map<std::string, std::string> env{{"GRANARY_HOME", dir / "home"}};
  Process local({Bin("granary"), "local", "file://" + dir / "ds", dir / "mnt", "--dir", dir / "state", "--config",
                 dir / "granary.yaml", "-o", "cache.policy=shuffle"},
                dir / "local.log", env);
  ASSERT_TRUE(WaitFor([&] { return IsMounted(dir / "mnt") || !local.Running(); })) << local.Log();
  ASSERT_TRUE(IsMounted(dir / "mnt")) << local.Log();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(ReadFile(dir / ("mnt/f" + std::to_string(i))), RandomBytes(50000, i));
  nlohmann::json w;
  ASSERT_TRUE(WaitFor([&] {
    RunResult r = RunCommand({Bin("granary"), "report", "--json"}, env);
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    if (r.code != 0 || j.is_discarded() || j["workers"].empty()) return false;
    w = j["workers"][0];
    return w["tiers"].size() == 2 && w["tiers"][0]["blocks"].get<uint64_t>() == 8;
  })) << w.dump(2) << local.Log();
  EXPECT_EQ(w["tiers"][0]["medium"], "MEM");
  EXPECT_EQ(w["tiers"][0]["paths"][0], shm / "mem");
  EXPECT_EQ(w["tiers"][1]["medium"], "HDD");
  EXPECT_DOUBLE_EQ(w["tiers"][1]["high"].get<double>(), 0.9);
  EXPECT_FALSE(fs::exists(dir / "state/cache")) << "with levels, cache_dir is not used";
  EXPECT_EQ(local.Stop(SIGINT), 0) << local.Log();
}

}  // namespace
}  // namespace granary::testing
