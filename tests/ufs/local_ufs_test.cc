#include "ufs/local_ufs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "common/hash.h"
#include "tests/testutil/testutil.h"

namespace granary {
namespace {

TEST(Uri, ParseAndRedact) {
  auto p = ParseUri("file:///srv/imagenet");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->scheme, "file");
  EXPECT_EQ(p->path, "/srv/imagenet");
  EXPECT_EQ(ParseUri("/srv/x")->scheme, "file");
  EXPECT_EQ(ParseUri("s3://bucket/a/b")->path, "a/b");
  EXPECT_FALSE(ParseUri("relative/path").ok());
  EXPECT_EQ(RedactUri("s3://AKID:SECRET@bucket/p?token=abc"), "s3://bucket/p");
}

TEST(Names, RejectEscapes) {
  EXPECT_TRUE(IsValidName("a b ü.jpg"));
  EXPECT_FALSE(IsValidName(""));
  EXPECT_FALSE(IsValidName("."));
  EXPECT_FALSE(IsValidName(".."));
  EXPECT_FALSE(IsValidName("a/b"));
  EXPECT_FALSE(IsValidName(std::string(256, 'x')));
}

TEST(FileKey, DependsOnEveryPart) {
  FileKey a = MakeFileKey("file:///x", "p", "v1");
  EXPECT_NE(a, MakeFileKey("file:///x", "p", "v2"));
  EXPECT_NE(a, MakeFileKey("file:///y", "p", "v1"));
  EXPECT_NE(MakeFileKey("ab", "c", ""), MakeFileKey("a", "bc", ""));
  FileKey b;
  ASSERT_TRUE(ParseFileKeyHex(FileKeyHex(a), &b));
  EXPECT_EQ(a, b);
}

TEST(LocalUfs, StatListRead) {
  testing::TempDir dir;
  testing::WriteFile(dir / "d/x.bin", "0123456789");
  testing::WriteFile(dir / "top.txt", "t");
  auto ufs = LocalUfs::Open(dir.path());
  ASSERT_TRUE(ufs.ok());
  auto st = (*ufs)->Stat("d/x.bin");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size, 10u);
  EXPECT_FALSE(st->version.empty());

  std::vector<std::string> names;
  ASSERT_TRUE((*ufs)->List("", 1, [&](std::vector<UfsEntry>& page) {
    EXPECT_EQ(page.size(), 1u);
    for (auto& e : page) names.push_back(e.name + (e.is_dir ? "/" : ""));
    return Status::OK();
  }).ok());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"d/", "top.txt"}));

  char buf[16];
  auto n = (*ufs)->Read("d/x.bin", st->version, 3, 16, buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(buf, *n), "3456789");
}

// The write calls: a file appears whole at Commit (never partly), hidden while written; an aborted
// writer leaves nothing; directories and renames.
TEST(LocalUfs, WritesAppearWholeAtCommit) {
  testing::TempDir dir;
  auto ufs = LocalUfs::Open(dir.path());
  ASSERT_TRUE(ufs.ok());
  auto w = (*ufs)->Create("ckpt.pt", 0640);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Append("hello ").ok());
  EXPECT_EQ((*ufs)->Stat("ckpt.pt").status().code(), Code::kNotFound) << "visible before Commit";
  int listed = 0;
  ASSERT_TRUE((*ufs)->List("", 10, [&](std::vector<UfsEntry>& page) {
    listed += static_cast<int>(page.size());
    return Status::OK();
  }).ok());
  EXPECT_EQ(listed, 0) << "the temporary file must not be listed";
  ASSERT_TRUE((*w)->Append("world").ok());
  auto e = (*w)->Commit();
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->size, 11u);
  EXPECT_EQ(e->name, "ckpt.pt");
  EXPECT_EQ(testing::ReadFile(dir / "ckpt.pt"), "hello world");
  EXPECT_EQ(e->version, (*ufs)->Stat("ckpt.pt")->version);
  struct stat st;
  ASSERT_EQ(stat((dir / "ckpt.pt").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);

  // A second version replaces the first whole; an aborted one leaves the first as it was.
  auto w2 = (*ufs)->Create("ckpt.pt", 0644);
  ASSERT_TRUE((*w2)->Append("v2").ok());
  (*w2)->Abort();
  EXPECT_EQ(testing::ReadFile(dir / "ckpt.pt"), "hello world");
  {
    auto w3 = (*ufs)->Create("ckpt.pt", 0644);
    ASSERT_TRUE((*w3)->Append("dropped").ok());
  }  // destroyed uncommitted: aborted
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()), 1)
      << "a temporary file was left behind";

  ASSERT_TRUE((*ufs)->MakeDir("out", 0755).ok());
  EXPECT_EQ((*ufs)->MakeDir("out", 0755).code(), Code::kAlreadyExists);
  ASSERT_TRUE((*ufs)->Rename("ckpt.pt", "out/final.pt").ok());
  EXPECT_EQ(testing::ReadFile(dir / "out/final.pt"), "hello world");
  Status s = (*ufs)->RemoveDir("out");
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.reason(), Reason::kNotEmpty) << s.ToString();
  ASSERT_TRUE((*ufs)->Remove("out/final.pt").ok());
  EXPECT_EQ((*ufs)->Remove("out/final.pt").code(), Code::kNotFound);
  ASSERT_TRUE((*ufs)->RemoveDir("out").ok());
  EXPECT_FALSE(std::filesystem::exists(dir / "out"));
  EXPECT_EQ((*ufs)->Create("../escape", 0644).status().code(), Code::kInvalidArgument);
}

// Issue 50, finding 1: a user who owns a directory inside a writable source swaps a subdirectory
// for a link to a root-owned directory; no write call may then act there.
TEST(LocalUfs, WritesNeverFollowALink) {
  namespace fs = std::filesystem;
  testing::TempDir dir;
  fs::create_directories(dir / "src/mine");
  fs::create_directories(dir / "outside");
  testing::WriteFile(dir / "outside/victim", "root's");
  testing::WriteFile(dir / "src/mine/a", "a");
  fs::create_directory_symlink(dir / "outside", dir / "src/sub");  // src/sub -> outside
  fs::create_directory_symlink(dir / "outside", dir / "src/mine/deeper");
  auto ufs = LocalUfs::Open(dir / "src");
  ASSERT_TRUE(ufs.ok());

  auto created = (*ufs)->Create("sub/planted", 0644);
  EXPECT_EQ(created.status().code(), Code::kPermissionDenied) << created.status().ToString();
  EXPECT_NE(created.status().message().find("symbolic link"), std::string::npos) << created.status().ToString();
  EXPECT_EQ((*ufs)->Create("mine/deeper/planted", 0644).status().code(), Code::kPermissionDenied);
  EXPECT_EQ((*ufs)->Remove("sub/victim").code(), Code::kPermissionDenied);
  EXPECT_EQ((*ufs)->MakeDir("sub/d", 07777).code(), Code::kPermissionDenied);
  EXPECT_EQ((*ufs)->RemoveDir("sub/d").code(), Code::kPermissionDenied);
  EXPECT_EQ((*ufs)->Rename("mine/a", "sub/victim").code(), Code::kPermissionDenied);
  EXPECT_EQ((*ufs)->Rename("sub/victim", "mine/stolen").code(), Code::kPermissionDenied);
  UfsAttrChange chmod;
  chmod.mode = 04777;
  EXPECT_EQ((*ufs)->SetAttr("sub/victim", chmod).code(), Code::kPermissionDenied);
  EXPECT_EQ((*ufs)->SetAttr("sub", chmod).code(), Code::kPermissionDenied) << "a link itself is never changed";

  EXPECT_EQ(testing::ReadFile(dir / "outside/victim"), "root's");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir / "outside"), fs::directory_iterator()), 1)
      << "something was made outside the source";
  struct stat st;
  ASSERT_EQ(stat((dir / "outside/victim").c_str(), &st), 0);
  EXPECT_NE(st.st_mode & 07777, 04777u);
  EXPECT_TRUE(fs::exists(dir / "src/mine/a"));

  // A link as the last component is a name like any other: removing it removes the link, not what
  // it points to; renaming moves the link.
  ASSERT_TRUE((*ufs)->Rename("sub", "moved").ok());
  EXPECT_TRUE(fs::is_symlink(dir / "src/moved"));
  ASSERT_TRUE((*ufs)->Remove("moved").ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir / "src/moved")));
  EXPECT_EQ(testing::ReadFile(dir / "outside/victim"), "root's");
}

// Issue 50, finding 7: written files and directories are the writer's, with the mode it asked
// for, and the kernel checks the writer's own permissions (the daemon is root here).
TEST(LocalUfs, WritesActForTheCaller) {
  if (geteuid() != 0) GTEST_SKIP() << "acting for another user needs root";
  namespace fs = std::filesystem;
  testing::TempDir dir;
  fs::create_directories(dir / "src/users");
  fs::create_directories(dir / "src/roots");
  ASSERT_EQ(chmod(dir.path().c_str(), 0755), 0);
  ASSERT_EQ(chmod((dir / "src").c_str(), 0755), 0);
  ASSERT_EQ(chown((dir / "src/users").c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod((dir / "src/users").c_str(), 0755), 0);
  ASSERT_EQ(chmod((dir / "src/roots").c_str(), 0755), 0);
  testing::WriteFile(dir / "src/roots/secret", "root only");
  ASSERT_EQ(chmod((dir / "src/roots/secret").c_str(), 0600), 0);
  auto ufs = LocalUfs::Open(dir / "src");
  ASSERT_TRUE(ufs.ok());
  const WriteCaller nobody{65534, 65534, {}};

  auto w = (*ufs)->Create("users/out.bin", 0640, nobody);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->Append("x").ok());
  auto e = (*w)->Commit();
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->uid, 65534u);
  EXPECT_EQ(e->gid, 65534u);
  EXPECT_EQ(e->mode, 0640u);
  ASSERT_TRUE((*ufs)->MakeDir("users/d", 0750, nobody).ok());
  struct stat st;
  ASSERT_EQ(stat((dir / "src/users/d").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  EXPECT_EQ(st.st_mode & 07777, 0750u);

  // Where the writer may not write, the store says so: nothing is made or removed as root.
  auto denied = (*ufs)->Create("roots/planted", 0644, nobody);
  ASSERT_TRUE(denied.ok() ? (*denied)->Commit().status().code() == Code::kPermissionDenied
                          : denied.status().code() == Code::kPermissionDenied)
      << denied.status().ToString();
  EXPECT_FALSE(fs::exists(dir / "src/roots/planted"));
  EXPECT_EQ((*ufs)->Remove("roots/secret", nobody).code(), Code::kPermissionDenied);
  EXPECT_EQ((*ufs)->Rename("users/out.bin", "roots/secret", nobody).code(), Code::kPermissionDenied);
  EXPECT_EQ(testing::ReadFile(dir / "src/roots/secret"), "root only");
  UfsAttrChange give;
  give.uid = 0;
  EXPECT_EQ((*ufs)->SetAttr("users/out.bin", give, nobody).code(), Code::kPermissionDenied) << "chown needs root";
  UfsAttrChange mode;
  mode.mode = 0604;
  mode.mtime_ns = int64_t{1'700'000'000} * 1'000'000'000 + 5;
  ASSERT_TRUE((*ufs)->SetAttr("users/out.bin", mode, nobody).ok());
  ASSERT_EQ(stat((dir / "src/users/out.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0604u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1'700'000'000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 5);
  // The thread acts as root again afterwards.
  EXPECT_TRUE((*ufs)->Create("roots/mine", 0600).ok());
}

TEST(LocalUfs, DetectsChangedAndMissingFiles) {
  testing::TempDir dir;
  testing::WriteFile(dir / "f", "aaaa");
  auto ufs = LocalUfs::Open(dir.path()).value();
  std::string v1 = ufs->Stat("f")->version;
  testing::WriteFile(dir / "f", "bbbbb");
  char buf[8];
  EXPECT_TRUE(ufs->Read("f", v1, 0, 4, buf).status().IsVersionChanged());
  unlink((dir / "f").c_str());
  EXPECT_EQ(ufs->Read("f", v1, 0, 4, buf).status().code(), Code::kNotFound);
}

// OpenLocal: the descriptor granary-fuse reads a local source with (fuse/source_reads.h), handed
// out only for the listed version, only within the roots, with the stat it was checked against.
TEST(LocalUfs, OpensAFileForReadingHereOnlyAtItsListedVersion) {
  testing::TempDir dir;
  testing::WriteFile(dir / "roots/ds/f", "abcdef");
  testing::WriteFile(dir / "outside/secret", "root-only");
  ASSERT_EQ(symlink((dir / "outside/secret").c_str(), (dir / "roots/ds/leak").c_str()), 0);
  auto ufs = LocalUfs::Open(dir / "roots/ds", {dir / "roots"}).value();
  const UfsEntry e = ufs->Stat("f").value();
  auto f = ufs->OpenLocal("f", e.version);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  char buf[8];
  EXPECT_EQ(pread(f->fd, buf, 3, 2), 3);
  EXPECT_EQ(std::string(buf, 3), "cde");
  EXPECT_EQ(f->size, 6u);
  EXPECT_EQ(f->mtime_ns, e.mtime_ns);
  close(f->fd);
  EXPECT_TRUE(ufs->OpenLocal("f", e.version + "x").status().IsVersionChanged());
  EXPECT_EQ(ufs->OpenLocal("leak", "v").status().code(), Code::kPermissionDenied);
  EXPECT_EQ(ufs->OpenLocal("../outside/secret", "v").status().code(), Code::kInvalidArgument);
}

// A FIFO put where a listed file was (no writer ever comes) is refused at once: neither a read nor
// an OpenLocal waits in open(2), which would hold a worker thread for ever.
TEST(LocalUfs, RefusesAFifoPutWhereAFileWasWithoutWaiting) {
  testing::TempDir dir;
  testing::WriteFile(dir / "f", "abcd");
  auto ufs = LocalUfs::Open(dir.path()).value();
  const std::string v = ufs->Stat("f")->version;
  ASSERT_EQ(unlink((dir / "f").c_str()), 0);
  ASSERT_EQ(mkfifo((dir / "f").c_str(), 0600), 0);
  char buf[4];
  EXPECT_TRUE(ufs->Read("f", v, 0, 4, buf).status().IsVersionChanged());
  EXPECT_TRUE(ufs->OpenLocal("f", v).status().IsVersionChanged());
  std::vector<std::string> names;
  ASSERT_TRUE(ufs->List("", 100, [&](std::vector<UfsEntry>& page) {
                   for (const auto& e : page) names.push_back(e.name);
                   return Status::OK();
                 }).ok());
  EXPECT_TRUE(names.empty());  // special files are not listed
}

TEST(LocalUfs, RefusesPathsOutsideTheRoot) {
  testing::TempDir dir;
  auto ufs = LocalUfs::Open(dir.path()).value();
  char buf[4];
  EXPECT_EQ(ufs->Read("../etc/passwd", "v", 0, 4, buf).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ufs->Stat("a//b").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(LocalUfs::Open(dir / "missing").status().code(), Code::kNotFound);
}

// A staging file on the store's filesystem is taken whole (linked in, no copy): with the writer's
// mode and times, nothing left under a temporary name; a link on the way or a file longer than
// the write is not taken.
TEST(LocalUfs, AdoptLinksAStagingFileInWhole) {
  namespace fs = std::filesystem;
  testing::TempDir dir;
  fs::create_directories(dir / "src/d");
  fs::create_directories(dir / "staging");
  fs::create_directories(dir / "outside");
  fs::create_directory_symlink(dir / "outside", dir / "src/link");
  testing::WriteFile(dir / "staging/1.data", "staged bytes");
  testing::WriteFile(dir / "src/d/f.bin", "old version");
  auto local = LocalUfs::Open(dir / "src");
  ASSERT_TRUE(local.ok());
  // As the worker holds a store: behind the counting wrapper, which must pass Adopt on (it once
  // did not, and every write=through and write=back upload copied the staging file instead).
  UfsCounters counters;
  std::shared_ptr<UnderFileSystem> ufs = CountedUfs(*local, &counters);
  int fd = open((dir / "staging/1.data").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_TRUE(ufs->CanAdopt(st.st_dev));
  EXPECT_FALSE(ufs->CanAdopt(st.st_dev + 1));

  UfsAttrChange attrs;
  attrs.mtime_ns = 1'300'000'000'000'000'000;
  EXPECT_EQ(ufs->Adopt("d/f.bin", fd, 5, 0640, attrs).status().code(), Code::kUnimplemented)
      << "a staging file longer than the write was taken";
  EXPECT_EQ(ufs->Adopt("link/f.bin", fd, 12, 0640, attrs).status().code(), Code::kPermissionDenied);
  auto e = ufs->Adopt("d/f.bin", fd, 12, 0640, attrs);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->size, 12u);
  EXPECT_EQ(testing::ReadFile(dir / "src/d/f.bin"), "staged bytes");
  ASSERT_EQ(stat((dir / "src/d/f.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1'300'000'000);
  EXPECT_EQ(e->version, ufs->Stat("d/f.bin")->version);
  ASSERT_EQ(stat((dir / "staging/1.data").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u) << "the store's file is not the staging file itself";
  EXPECT_GE(counters.writes.load(), 1u);
  std::vector<std::string> names;
  for (const auto& f : fs::directory_iterator(dir / "src/d")) names.push_back(f.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"f.bin"}) << "a temporary name was left";
  EXPECT_TRUE(fs::is_empty(dir / "outside"));
  // Taken again (an upload made again after a restart): the same file, still nothing left over.
  unlink((dir / "staging/1.data").c_str());
  EXPECT_TRUE(ufs->Adopt("d/f.bin", fd, 12, 0640, {}).ok());
  names.clear();
  for (const auto& f : fs::directory_iterator(dir / "src/d")) names.push_back(f.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"f.bin"});
  close(fd);
}

}  // namespace
}  // namespace granary

namespace granary {
namespace {

// With ufs.local_roots, a read stays within them: a link a dataset's writer planted reads nothing
// outside, a link to another allowed directory reads as before.
TEST(LocalUfsConfined, ReadsThroughLinksStayWithinTheRoots) {
  testing::TempDir dir;
  testing::WriteFile(dir / "roots/ds/in.txt", "inside");
  testing::WriteFile(dir / "roots/shared/s.txt", "shared");
  testing::WriteFile(dir / "outside/secret", "root-only");
  ASSERT_EQ(symlink((dir / "outside/secret").c_str(), (dir / "roots/ds/leak").c_str()), 0);
  ASSERT_EQ(symlink((dir / "roots/shared/s.txt").c_str(), (dir / "roots/ds/ok-link").c_str()), 0);
  auto confined = LocalUfs::Open(dir / "roots/ds", {dir / "roots"});
  ASSERT_TRUE(confined.ok()) << confined.status().ToString();
  auto read = [&](UnderFileSystem& ufs, const std::string& name) -> StatusOr<std::string> {
    ASSIGN_OR_RETURN(UfsEntry e, ufs.Stat(name));
    std::string out(e.size, '\0');
    ASSIGN_OR_RETURN(size_t n, ufs.Read(name, e.version, 0, e.size, out.data()));
    out.resize(n);
    return out;
  };
  EXPECT_EQ(read(**confined, "in.txt").value(), "inside");
  EXPECT_EQ(read(**confined, "ok-link").value(), "shared");
  auto leak = read(**confined, "leak");
  EXPECT_EQ(leak.status().code(), Code::kPermissionDenied) << leak.status().ToString();
  EXPECT_NE(leak.status().message().find("ufs.local_roots"), std::string::npos) << leak.status().message();
  auto open = LocalUfs::Open(dir / "roots/ds");  // unconfined (granary's own tools, tests)
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(read(**open, "leak").value(), "root-only");
}

}  // namespace
}  // namespace granary
