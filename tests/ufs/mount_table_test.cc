#include "ufs/mount_table.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "common/config.h"
#include "tests/testutil/testutil.h"

namespace granary {
namespace {

TEST(MountTable, OpensOnceOutsideTheCallerAndForgetsOnErase) {
  testing::TempDir dir;
  testing::WriteFile(dir / "src/a", "x");
  std::atomic<int> loads{0};
  MountTable table([&](uint64_t id) -> StatusOr<MountTable::Source> {
    ++loads;
    if (id == 9) return NotFoundError("mount 9 is gone");
    return MountTable::Source{"file://" + dir / "src", {{"cache.replicas", "2"}, {"metadata.sync_interval", "5s"}}};
  }, UfsAccess::Unrestricted());
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      auto m = table.Get(1);
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_EQ(m->cache.replicas, 2u);
      EXPECT_EQ(m->cache.metadata_sync_ms, 5000);
      EXPECT_TRUE(m->ufs->Stat("a").ok());
    });
  }
  for (auto& t : readers) t.join();
  int after_first = loads.load();
  EXPECT_GE(after_first, 1);
  bool opened_now = true;
  ASSERT_TRUE(table.Get(1, &opened_now).ok());
  EXPECT_FALSE(opened_now);
  EXPECT_EQ(loads.load(), after_first) << "a mount is opened once, then served from the table";
  EXPECT_EQ(table.Get(9).status().code(), Code::kNotFound);
  table.Erase(1);
  ASSERT_TRUE(table.Get(1, &opened_now).ok());
  EXPECT_TRUE(opened_now);
}

TEST(MountTable, OpenMountAppliesTheOptionRules) {
  EXPECT_EQ(OpenMount("file:///tmp", {{"cache.replicas", "0"}}, UfsAccess::Unrestricted()).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(OpenMount("file:///tmp", {{"secret_key", "x"}}, UfsAccess::Unrestricted()).status().code(), Code::kInvalidArgument);
  auto ok = OpenMount("file:///tmp", {{"cache.policy", "shuffle"}}, UfsAccess::Unrestricted());
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->cache.policy, CachePolicy::kShuffle);
}

// ufs.local_roots and ufs.secrets_dir: what a mount may name on the daemon's machine, compared after
// symbolic links are resolved; a refusal names the setting that would allow it.
TEST(UfsAccess, FileMountsOnlyBelowTheLocalRoots) {
  testing::TempDir dir;
  testing::WriteFile(dir / "roots/data/a", "x");
  testing::WriteFile(dir / "outside/b", "y");
  ASSERT_EQ(symlink((dir / "outside").c_str(), (dir / "roots/escape").c_str()), 0);
  UfsAccess none;  // the cluster default: no file:// mount at all
  Status st = CheckMountAccess("file:///etc", {}, none);
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_NE(st.message().find("ufs.local_roots"), std::string::npos) << st.message();
  EXPECT_EQ(OpenMount("/etc", {}, none).status().code(), Code::kPermissionDenied) << "OpenMount checks it too";

  UfsAccess roots;
  roots.local_roots = {dir / "roots"};
  EXPECT_TRUE(CheckMountAccess("file://" + dir / "roots/data", {}, roots).ok());
  EXPECT_TRUE(CheckMountAccess(dir / "roots", {}, roots).ok());
  EXPECT_EQ(CheckMountAccess("file://" + dir / "outside", {}, roots).code(), Code::kPermissionDenied);
  EXPECT_EQ(CheckMountAccess("file://" + dir / "roots/../outside", {}, roots).code(), Code::kPermissionDenied);
  EXPECT_EQ(CheckMountAccess("file://" + dir / "roots/escape", {}, roots).code(), Code::kPermissionDenied)
      << "a symbolic link below a root that points elsewhere";
  EXPECT_EQ(CheckMountAccess("file://" + dir / "rootsx", {}, roots).code(), Code::kPermissionDenied)
      << "a sibling whose name starts like the root";
  EXPECT_EQ(CheckMountAccess("file:///etc", {}, roots).code(), Code::kPermissionDenied);
  EXPECT_TRUE(CheckMountAccess("file:///etc", {}, UfsAccess::Unrestricted()).ok());
}

TEST(UfsAccess, CredentialFilesOnlyBelowTheSecretsDir) {
  testing::TempDir dir;
  testing::WriteFile(dir / "secrets/ak", "AK");
  testing::WriteFile(dir / "elsewhere/shadow", "root-only");
  ASSERT_EQ(symlink((dir / "elsewhere/shadow").c_str(), (dir / "secrets/link").c_str()), 0);
  UfsAccess a;
  a.secrets_dir = dir / "secrets";
  EXPECT_TRUE(CheckMountAccess("s3://b/p", {{"access_key_file", dir / "secrets/ak"}}, a).ok());
  for (const char* key : {"access_key_file", "secret_key_file", "session_token_file", "credentials_file",
                          "fs.oss.accessKeySecret", "fs.oss.accessKeyId", "fs.oss.securityToken"}) {
    for (const std::string& path : {std::string("/etc/shadow"), dir / "elsewhere/shadow", dir / "secrets/link",
                                    dir / "secrets/../elsewhere/shadow"}) {
      Status st = CheckMountAccess("s3://b/p", {{key, path}}, a);
      EXPECT_EQ(st.code(), Code::kPermissionDenied) << key << "=" << path;
      EXPECT_NE(st.message().find("ufs.secrets_dir"), std::string::npos) << st.message();
    }
  }
  EXPECT_TRUE(CheckMountAccess("oss://b/p", {{"fs.oss.accessKeyId", "LTAI-given-as-itself"}}, a).ok())
      << "an OSS key id given as itself names no file";
  EXPECT_EQ(CheckMountAccess("s3://b/p", {{"access_key_file", dir / "secrets/ak"}}, UfsAccess()).code(),
            Code::kPermissionDenied)
      << "no secrets directory: no credential file";
}

TEST(UfsAccess, FromConfigSplitsTheRootsAndWantsAbsolutePaths) {
  Config cfg = Config::Defaults();
  ASSERT_TRUE(cfg.Set("ufs.local_roots", "/srv/a, /mnt/b", "test").ok());
  auto a = UfsAccess::FromConfig(cfg);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->local_roots, (std::vector<std::string>{"/srv/a", "/mnt/b"}));
  ASSERT_TRUE(cfg.Set("ufs.local_roots", "relative/dir", "test").ok());
  EXPECT_EQ(UfsAccess::FromConfig(cfg).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace granary
