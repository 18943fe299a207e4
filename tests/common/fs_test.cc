// RuntimeDir and MakePrivateDir (issue 51, finding 2): a runtime directory another user made is
// refused, one of our own that others may enter is closed, a link is never followed.
#include "common/fs.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/testutil/testutil.h"

namespace granary {
namespace {

// Sets an environment variable for the scope of one test, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(RuntimeDir, MadePrivateAndOursOnlyOpenedToUsAlone) {
  testing::TempDir dir;
  const std::string run = dir / "run";
  {
    ScopedEnv env("GRANARY_RUN_DIR", run);
    auto got = RuntimeDir();
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, run);
    EXPECT_EQ(ModeOf(run), 0700u);
    // Ours but opened to everyone (by a careless chmod): closed again, not refused.
    ASSERT_EQ(chmod(run.c_str(), 0777), 0);
    ASSERT_TRUE(RuntimeDir().ok());
    EXPECT_EQ(ModeOf(run), 0700u);
    auto file = MountEndpointsFile("/data");
    ASSERT_TRUE(file.ok());
    EXPECT_EQ(file->rfind(run + "/fuse-", 0), 0u) << *file;
  }
  // A link to a directory of ours is not taken for one: whoever planted it chose where it leads.
  const std::string link = dir / "link";
  ASSERT_EQ(symlink(run.c_str(), link.c_str()), 0);
  ScopedEnv env("GRANARY_RUN_DIR", link);
  auto got = RuntimeDir();
  EXPECT_EQ(got.status().code(), Code::kPermissionDenied);
  EXPECT_NE(got.status().message().find("link"), std::string::npos) << got.status().ToString();
}

TEST(RuntimeDir, OneAnotherUserMadeIsRefusedAndNamed) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: the other user's directory is made by chown";
  testing::TempDir dir;
  const std::string squat = dir / "squat";
  ASSERT_EQ(mkdir(squat.c_str(), 0777), 0);
  ASSERT_EQ(chown(squat.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(squat.c_str(), 0777), 0);
  ScopedEnv env("GRANARY_RUN_DIR", squat);
  auto got = RuntimeDir();
  ASSERT_EQ(got.status().code(), Code::kPermissionDenied) << got.status().ToString();
  EXPECT_NE(got.status().message().find("uid 65534"), std::string::npos) << got.status().ToString();
  EXPECT_NE(got.status().message().find(squat), std::string::npos) << got.status().ToString();
  EXPECT_FALSE(MountRunFile("/data", ".sock").ok()) << "a socket path in the squatted directory";
  EXPECT_EQ(ModeOf(squat), 0777u) << "another user's directory was changed";
}

// An ext4 made with and without a journal, each on a loop device: only the second is named.
class LoopExt4 {
 public:
  LoopExt4(const std::string& dir, bool journal) : mnt_(dir + "/mnt") {
    const std::string img = dir + "/fs.img";
    std::filesystem::create_directories(mnt_);
    const std::string mkfs = "truncate -s 32M " + img + " && mkfs.ext4 -q -F " + std::string(journal ? "" : "-O ^has_journal ") +
                             img + " >/dev/null 2>&1";
    mounted_ = std::system(mkfs.c_str()) == 0 && std::system(("mount -o loop " + img + " " + mnt_).c_str()) == 0;
  }
  ~LoopExt4() {
    if (mounted_) (void)std::system(("umount " + mnt_).c_str());
  }
  bool mounted() const { return mounted_; }
  const std::string& path() const { return mnt_; }

 private:
  std::string mnt_;
  bool mounted_ = false;
};

TEST(Ext4WithoutJournal, NamesOnlyAnExt4WithoutAJournal) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: loop mounts";
  testing::TempDir with, without;
  LoopExt4 journaled(with.path(), true), bare(without.path(), false);
  ASSERT_TRUE(journaled.mounted() && bare.mounted()) << "mkfs.ext4 or a loop mount failed";
  EXPECT_EQ(Ext4WithoutJournal(journaled.path()), "");
  const std::string name = Ext4WithoutJournal(bare.path());
  EXPECT_EQ(name.rfind("loop", 0), 0u) << "got '" << name << "'";
  EXPECT_EQ(Ext4WithoutJournal("/dev/shm"), "");  // tmpfs
  EXPECT_EQ(Ext4WithoutJournal(bare.path() + "/missing"), "");
}

}  // namespace
}  // namespace granary
