#include "master/namespace.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <rocksdb/env.h>
#include <rocksdb/file_system.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "tests/testutil/testutil.h"

namespace granary::master {
namespace {

class NamespaceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFile(dir_ / "src/a/1.jpg", "one");
    testing::WriteFile(dir_ / "src/a/2.jpg", "two!");
    testing::WriteFile(dir_ / "src/b/c/3.jpg", std::string(10000, 'x'));
    testing::WriteFile(dir_ / "src/top.txt", "");
    Reopen();
  }
  void Reopen() {
    ns_.reset();
    auto ns = Namespace::Open(dir_ / "db", 4096, UfsAccess::Unrestricted());
    ASSERT_TRUE(ns.ok()) << ns.status().message();
    ns_ = std::move(ns).value();
  }
  std::set<std::string> Names(uint64_t ino) {
    std::set<std::string> out;
    uint64_t after = 0;
    for (;;) {
      rpc::ReadDirResponse page;
      EXPECT_TRUE(ns_->ReadDir(ino, after, 2, &page).ok());
      for (const auto& e : page.entries()) {
        EXPECT_TRUE(out.insert(e.name()).second) << "duplicate " << e.name();
        after = e.cookie();
      }
      if (page.end()) break;
    }
    return out;
  }

  testing::TempDir dir_;
  std::unique_ptr<Namespace> ns_;
};

TEST_F(NamespaceTest, MountDiscoversLazily) {
  auto m = ns_->Mount("/datasets/imagenet", "file://" + dir_ / "src", {});
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->path(), "/datasets/imagenet");
  EXPECT_EQ(Names(kRootIno), std::set<std::string>{"datasets"});
  auto root = ns_->Resolve("/datasets/imagenet");
  ASSERT_TRUE(root.ok());
  EXPECT_EQ(Names(root->ino()), (std::set<std::string>{"a", "b", "top.txt"}));
  auto f = ns_->Resolve("/datasets/imagenet/b/c/3.jpg");
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->size(), 10000u);
  EXPECT_EQ(f->mode() & 0222, 0u) << "write bits must be cleared";
  auto info = ns_->GetFile(f->ino());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->ufs_path(), "b/c/3.jpg");
  EXPECT_EQ(info->block_size(), 4096u);
  EXPECT_FALSE(info->version().empty());
  EXPECT_EQ(ns_->Resolve("/datasets/imagenet/nope").status().code(), Code::kNotFound);
  EXPECT_EQ(ns_->Resolve("/datasets/imagenet/top.txt/x").status().code(), Code::kNotFound);
}

TEST_F(NamespaceTest, PagingVisitsEveryEntryOnce) {
  for (int i = 0; i < 57; ++i) testing::WriteFile(dir_ / ("src/many/f" + std::to_string(i)), "x");
  ASSERT_TRUE(ns_->Mount("/d", dir_ / "src", {}).ok());
  auto many = ns_->Resolve("/d/many");
  ASSERT_TRUE(many.ok());
  EXPECT_EQ(Names(many->ino()).size(), 57u);
}

TEST_F(NamespaceTest, ConcurrentFirstLookupsListOnce) {
  for (int i = 0; i < 200; ++i) testing::WriteFile(dir_ / ("src/wide/f" + std::to_string(i)), "x");
  ASSERT_TRUE(ns_->Mount("/d", dir_ / "src", {}).ok());
  auto wide = ns_->Resolve("/d/wide");
  ASSERT_TRUE(wide.ok());
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t) {
    ts.emplace_back([&, t] { EXPECT_TRUE(ns_->Lookup(wide->ino(), "f" + std::to_string(t)).ok()); });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(Names(wide->ino()).size(), 200u);
  auto mounts = ns_->ListMounts();
  ASSERT_EQ(mounts.size(), 1u);
}

TEST_F(NamespaceTest, SurvivesReopen) {
  // file:// takes no options and says so rather than ignoring them.
  auto with_opts = ns_->Mount("/d", dir_ / "src", {{"fs.oss.endpoint", "x"}});
  EXPECT_EQ(with_opts.status().code(), Code::kInvalidArgument);
  EXPECT_NE(with_opts.status().message().find("fs.oss.endpoint"), std::string::npos);
  ASSERT_TRUE(ns_->Mount("/d", dir_ / "src", {}).ok());
  auto before = ns_->Resolve("/d/a/2.jpg");
  ASSERT_TRUE(before.ok());
  Reopen();
  auto after = ns_->Resolve("/d/a/2.jpg");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(before->ino(), after->ino());
  auto mounts = ns_->ListMounts();
  ASSERT_EQ(mounts.size(), 1u);
  EXPECT_EQ(mounts[0].path(), "/d");
  EXPECT_EQ(ns_->GetMount(mounts[0].id())->uri(), dir_ / "src");
  // New inodes do not reuse old numbers.
  ASSERT_TRUE(ns_->Mount("/e", dir_ / "src", {}).ok());
  EXPECT_GT(ns_->Resolve("/e")->ino(), after->ino());
}

TEST_F(NamespaceTest, MountErrors) {
  EXPECT_EQ(ns_->Mount("/d", dir_ / "missing", {}).status().code(), Code::kNotFound);
  EXPECT_EQ(ns_->Mount("/", dir_ / "src", {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ns_->Mount("rel", dir_ / "src", {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ns_->Mount("/a/../b", dir_ / "src", {}).status().code(), Code::kInvalidArgument);
  ASSERT_TRUE(ns_->Mount("/d", dir_ / "src", {}).ok());
  EXPECT_EQ(ns_->Mount("/d", dir_ / "src", {}).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(ns_->Mount("/d/inner", dir_ / "src", {}).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ns_->Mount("/x", "s3cret://bucket", {}).status().code(), Code::kUnimplemented);
}

// Issue 50, findings 4 and 6: a commit's attributes are checked; a name made for a write that never
// committed goes by its name only, even where the store would refuse a remove.
TEST_F(NamespaceTest, WritesCheckWhatTheyRecord) {
  std::map<std::string, std::string> opts{{"write", "through"}};
  auto m = ns_->Mount("/w", "file://" + dir_ / "src", opts);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto root = ns_->Resolve("/w");
  ASSERT_TRUE(root.ok());
  auto t = ns_->PrepareCreate(root->ino(), "new.bin", 0644, 0, 0);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const uint64_t ino = t->file.attr().ino();
  UfsEntry e;
  e.name = "new.bin";
  e.size = ~uint64_t{0};
  e.mode = 0644;
  e.version = "v";
  EXPECT_EQ(ns_->CommitWrite(ino, root->ino(), "new.bin", "new.bin", e).status().code(), Code::kInvalidArgument);
  e.size = 3;
  e.mode = 0xFFFFFFFF;
  EXPECT_EQ(ns_->CommitWrite(ino, root->ino(), "new.bin", "new.bin", e).status().code(), Code::kInvalidArgument);
  e.mode = 0644;
  e.version = "";
  EXPECT_EQ(ns_->CommitWrite(ino, root->ino(), "new.bin", "new.bin", e).status().code(), Code::kInvalidArgument);
  auto a = ns_->GetAttr(ino);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->size(), 0u) << "a refused commit changed the record";

  // The write failed: its entry goes without the store being asked (it has nothing there).
  EXPECT_EQ(ns_->Remove(root->ino(), "top.txt", false, {}, ino).code(), Code::kNotFound) << "another file's name";
  ASSERT_TRUE(ns_->Remove(root->ino(), "new.bin", false, {}, ino).ok());
  EXPECT_EQ(ns_->Lookup(root->ino(), "new.bin").status().code(), Code::kNotFound);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "src/top.txt"));

  // A pending file's chmod is kept in its record and applied by its commit.
  auto t2 = ns_->PrepareCreate(root->ino(), "later.bin", 0644, 0, 0);
  ASSERT_TRUE(t2.ok());
  UfsAttrChange c;
  c.mode = 0600;
  auto changed = ns_->SetAttr(t2->file.attr().ino(), c, {});
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_EQ(changed->mode() & 0777, 0600u);
  testing::WriteFile(dir_ / "src/later.bin", "abc");
  ASSERT_EQ(chmod((dir_ / "src/later.bin").c_str(), 0644), 0);
  auto st = (*OpenUnderFileSystem("file://" + dir_ / "src", {}))->Stat("later.bin");
  ASSERT_TRUE(st.ok());
  auto committed = ns_->CommitWrite(t2->file.attr().ino(), root->ino(), "later.bin", "later.bin", *st);
  ASSERT_TRUE(committed.ok()) << committed.status().ToString();
  EXPECT_EQ(committed->mode() & 0777, 0600u);
  struct stat sb;
  ASSERT_EQ(stat((dir_ / "src/later.bin").c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u) << "the chmod made while it was written did not reach the store";
}

TEST_F(NamespaceTest, UnmountRemovesSubtreeAndEmptyParents) {
  ASSERT_TRUE(ns_->Mount("/p/q", dir_ / "src", {}).ok());
  ASSERT_TRUE(ns_->Resolve("/p/q/b/c/3.jpg").ok());
  auto gone = ns_->Unmount("/p/q");
  ASSERT_TRUE(gone.ok()) << gone.status().message();
  EXPECT_TRUE(Names(kRootIno).empty());
  EXPECT_EQ(ns_->Resolve("/p").status().code(), Code::kNotFound);
  EXPECT_EQ(ns_->Unmount("/p/q").status().code(), Code::kNotFound);
  EXPECT_TRUE(ns_->ListMounts().empty());
}

}  // namespace
}  // namespace granary::master

namespace granary::master {
namespace {

// Metadata sync against a local directory: changes appear on the next access after the interval.
class NamespaceSyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFile(dir_ / "src/d/keep.jpg", "keep");
    testing::WriteFile(dir_ / "src/d/change.jpg", "old");
    testing::WriteFile(dir_ / "src/d/gone.jpg", "gone");
    testing::WriteFile(dir_ / "src/d/sub/deep.jpg", "deep");
    auto ns = Namespace::Open(dir_ / "db", 4096, UfsAccess::Unrestricted());
    ASSERT_TRUE(ns.ok()) << ns.status().message();
    ns_ = std::move(ns).value();
    ns_->SetReclaimListener([this](std::vector<FileKey> keys) {
      reclaimed_.insert(reclaimed_.end(), keys.begin(), keys.end());
    });
  }
  rpc::MountInfo Mount(const std::string& interval) {
    std::map<std::string, std::string> opts;
    if (!interval.empty()) opts["metadata.sync_interval"] = interval;
    auto m = ns_->Mount("/ds", "file://" + dir_ / "src", opts);
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? *m : rpc::MountInfo();
  }
  std::map<std::string, rpc::Attr> List(uint64_t ino) {
    std::map<std::string, rpc::Attr> out;
    uint64_t after = 0;
    for (;;) {
      rpc::ReadDirResponse page;
      EXPECT_TRUE(ns_->ReadDir(ino, after, 2, &page).ok());
      for (const auto& e : page.entries()) {
        EXPECT_TRUE(out.emplace(e.name(), e.attr()).second) << "duplicate " << e.name();
        after = e.cookie();
      }
      if (page.end()) break;
    }
    return out;
  }
  void ChangeTheSource() {
    // A different size guarantees a new version whatever the mtime granularity.
    testing::WriteFile(dir_ / "src/d/change.jpg", "new bytes");
    std::filesystem::remove(dir_ / "src/d/gone.jpg");
    std::filesystem::remove_all(dir_ / "src/d/sub");
    testing::WriteFile(dir_ / "src/d/new.jpg", "new");
  }

  testing::TempDir dir_;
  std::unique_ptr<Namespace> ns_;
  std::vector<FileKey> reclaimed_;
};

// A listing (ReadDir with files) and a lookup (Lookup with file) carry each regular file's open
// information exactly as GetFile answers it, so granary-fuse's open that follows asks nothing;
// directories carry none; StoredFile (NoteOpens) answers the same without a sync.
TEST_F(NamespaceSyncTest, ListingsAndLookupsCarryWhatGetFileAnswers) {
  rpc::MountInfo m = Mount("never");
  auto d = ns_->Lookup(m.root_ino(), "d");
  ASSERT_TRUE(d.ok());
  rpc::ReadDirResponse page;
  ASSERT_TRUE(ns_->ReadDir(d->ino(), 0, 100, &page, nullptr, /*files=*/true).ok());
  ASSERT_EQ(page.entries_size(), 4);
  for (const auto& e : page.entries()) {
    if (e.attr().type() == rpc::DIRECTORY) {
      EXPECT_FALSE(e.has_file()) << e.name();
      continue;
    }
    ASSERT_TRUE(e.has_file()) << e.name();
    auto got = ns_->GetFile(e.attr().ino());
    ASSERT_TRUE(got.ok());
    EXPECT_EQ(e.file().SerializeAsString(), got->SerializeAsString()) << e.name();
    auto stored = ns_->StoredFile(e.attr().ino());
    ASSERT_TRUE(stored.ok());
    EXPECT_EQ(stored->SerializeAsString(), got->SerializeAsString()) << e.name();
    rpc::FileInfo looked;
    auto a = ns_->Lookup(d->ino(), e.name(), nullptr, &looked);
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(looked.SerializeAsString(), got->SerializeAsString()) << e.name();
  }
  // Without asking: nothing extra.
  rpc::ReadDirResponse plain;
  ASSERT_TRUE(ns_->ReadDir(d->ino(), 0, 100, &plain).ok());
  for (const auto& e : plain.entries()) EXPECT_FALSE(e.has_file()) << e.name();
  EXPECT_EQ(ns_->StoredFile(d->ino()).status().code(), Code::kInvalidArgument);
}

// Files' open information with paths near PATH_MAX: a page ends by bytes (never past gRPC's
// message limit) and the listing goes on after it, every entry once.
TEST_F(NamespaceSyncTest, ListingsWithLongPathsArePagedByBytes) {
  std::string deep = "d";
  for (int i = 0; i < 15; ++i) deep += "/" + std::string(250, static_cast<char>('a' + i));
  constexpr int kFiles = 1200;  // ~3.9 KiB of path each: ~4.7 MiB of open information
  for (int i = 0; i < kFiles; ++i) testing::WriteFile(dir_ / ("src/" + deep + "/f" + std::to_string(i)), "x");
  rpc::MountInfo m = Mount("never");
  auto dir = ns_->Resolve("/ds/" + deep);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  std::set<std::string> seen;
  uint64_t after = 0;
  int pages = 0;
  for (;;) {
    rpc::ReadDirResponse page;
    ASSERT_TRUE(ns_->ReadDir(dir->ino(), after, 4096, &page, nullptr, true).ok());
    ++pages;
    EXPECT_LT(page.ByteSizeLong(), Namespace::kMaxDirPageBytes + 8192);
    for (const auto& e : page.entries()) {
      EXPECT_TRUE(seen.insert(e.name()).second) << "duplicate " << e.name();
      EXPECT_TRUE(e.has_file()) << e.name();
      after = e.cookie();
    }
    if (page.end()) break;
    ASSERT_GT(page.entries_size(), 0);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kFiles));
  EXPECT_GE(pages, 2);
}

// A file due for a check with the under-storage comes without its open information: the open then
// asks GetFile, which checks it, and sees a changed file's new version.
// Fetch-ahead skips the flat listing of a tree every directory of which is listed and fresh
// (JobManager::Scan); with "always", every directory is due, so none counts as listed.
TEST_F(NamespaceSyncTest, ATreeDueForASyncIsNotListed) {
  rpc::MountInfo m = Mount("always");
  List(m.root_ino());
  auto d = ns_->Resolve("/ds/d");
  ASSERT_TRUE(d.ok());
  List(d->ino());
  auto listed = ns_->TreeListed("/ds");
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  EXPECT_FALSE(*listed);
}

TEST_F(NamespaceSyncTest, AFileDueForACheckIsListedWithoutItsOpenInformation) {
  rpc::MountInfo m = Mount("always");
  auto d = ns_->Lookup(m.root_ino(), "d");
  ASSERT_TRUE(d.ok());
  rpc::ReadDirResponse page;
  ASSERT_TRUE(ns_->ReadDir(d->ino(), 0, 100, &page, nullptr, true).ok());
  ASSERT_EQ(page.entries_size(), 4);
  for (const auto& e : page.entries()) EXPECT_FALSE(e.has_file()) << e.name();
  rpc::FileInfo looked;
  ASSERT_TRUE(ns_->Lookup(d->ino(), "keep.jpg", nullptr, &looked).ok());
  EXPECT_FALSE(looked.has_attr());
}

TEST_F(NamespaceSyncTest, AlwaysSeesAddsChangesAndDeletes) {
  rpc::MountInfo m = Mount("always");
  auto d = ns_->Lookup(m.root_ino(), "d");
  ASSERT_TRUE(d.ok());
  auto before = List(d->ino());
  ASSERT_EQ(before.size(), 4u);
  auto old_file = ns_->GetFile(before["change.jpg"].ino());
  ASSERT_TRUE(old_file.ok());
  ASSERT_TRUE(ns_->Lookup(before["sub"].ino(), "deep.jpg").ok());  // known, so reclaimed when deleted
  ChangeTheSource();
  auto after = List(d->ino());
  EXPECT_EQ(after.size(), 3u);
  EXPECT_TRUE(after.count("keep.jpg"));
  EXPECT_TRUE(after.count("new.jpg"));
  EXPECT_FALSE(after.count("gone.jpg"));
  EXPECT_FALSE(after.count("sub"));
  // The changed file keeps its inode (cookies stay valid) and gets a new version.
  ASSERT_TRUE(after.count("change.jpg"));
  EXPECT_EQ(after["change.jpg"].ino(), before["change.jpg"].ino());
  EXPECT_EQ(after["change.jpg"].size(), 9u);
  auto new_file = ns_->GetFile(after["change.jpg"].ino());
  ASSERT_TRUE(new_file.ok());
  EXPECT_NE(new_file->version(), old_file->version());
  // The old version, the deleted file and the deleted subtree's file are reclaimed.
  std::string uri = "file://" + dir_ / "src";
  std::set<FileKey> got(reclaimed_.begin(), reclaimed_.end());
  EXPECT_TRUE(got.count(MakeFileKey(uri, "d/change.jpg", old_file->version())));
  EXPECT_EQ(got.size(), 3u);
  EXPECT_FALSE(ns_->GetAttr(before["gone.jpg"].ino()).ok());
  // Mount statistics follow.
  auto mounts = ns_->ListMounts();
  ASSERT_EQ(mounts.size(), 1u);
  EXPECT_EQ(mounts[0].known_files(), 3u);
  EXPECT_EQ(mounts[0].known_bytes(), 4u + 9u + 3u);
}

TEST_F(NamespaceSyncTest, OpeningAChangedFileChecksItsVersion) {
  rpc::MountInfo m = Mount("always");
  auto d = ns_->Lookup(m.root_ino(), "d");
  auto f = ns_->Lookup(d->ino(), "change.jpg");
  ASSERT_TRUE(f.ok());
  auto v1 = ns_->GetFile(f->ino());
  testing::WriteFile(dir_ / "src/d/change.jpg", "a longer body");
  auto v2 = ns_->GetFile(f->ino());
  ASSERT_TRUE(v2.ok());
  EXPECT_NE(v2->version(), v1->version());
  EXPECT_EQ(v2->attr().size(), 13u);
  std::filesystem::remove(dir_ / "src/d/change.jpg");
  EXPECT_EQ(ns_->GetFile(f->ino()).status().code(), Code::kNotFound);
}

TEST_F(NamespaceSyncTest, NeverKeepsTheFirstListing) {
  rpc::MountInfo m = Mount("never");
  auto d = ns_->Lookup(m.root_ino(), "d");
  ASSERT_EQ(List(d->ino()).size(), 4u);
  ChangeTheSource();
  EXPECT_EQ(List(d->ino()).size(), 4u);
  EXPECT_TRUE(reclaimed_.empty());
}

TEST_F(NamespaceSyncTest, AnIntervalWaitsForItsTime) {
  rpc::MountInfo m = Mount("1h");
  auto d = ns_->Lookup(m.root_ino(), "d");
  ASSERT_EQ(List(d->ino()).size(), 4u);
  ChangeTheSource();
  EXPECT_EQ(List(d->ino()).size(), 4u) << "not due yet";
  // A bad interval is refused at mount time.
  auto bad = ns_->Mount("/other", "file://" + dir_ / "src", {{"metadata.sync_interval", "sometimes"}});
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("metadata.sync_interval"), std::string::npos) << bad.status().message();
}

}  // namespace
}  // namespace granary::master

namespace granary::master {
namespace {

class LoadTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int d = 0; d < 5; ++d) {
      for (int f = 0; f < 30; ++f) {
        testing::WriteFile(dir_ / ("src/c" + std::to_string(d) + "/sub/f" + std::to_string(f) + ".jpg"),
                           std::string(static_cast<size_t>(f), 'x'));
      }
      testing::WriteFile(dir_ / ("src/c" + std::to_string(d) + "/top.txt"), "t");
    }
    std::filesystem::create_directories(dir_ / "src/empty");
    auto ns = Namespace::Open(dir_ / "db", 4096, UfsAccess::Unrestricted());
    ASSERT_TRUE(ns.ok());
    ns_ = std::move(ns).value();
    auto m = ns_->Mount("/ds", "file://" + dir_ / "src", {});
    ASSERT_TRUE(m.ok()) << m.status().message();
    mount_ = *m;
  }
  // Every path below `ino` (directories with a trailing /).
  std::set<std::string> Tree(uint64_t ino, const std::string& prefix = "") {
    std::set<std::string> out;
    uint64_t after = 0;
    for (;;) {
      rpc::ReadDirResponse page;
      Status st = ns_->ReadDir(ino, after, 7, &page);
      EXPECT_TRUE(st.ok()) << st.message();
      if (!st.ok()) break;
      for (const auto& e : page.entries()) {
        bool dir = e.attr().type() == rpc::DIRECTORY;
        EXPECT_TRUE(out.insert(prefix + e.name() + (dir ? "/" : "")).second) << "duplicate " << e.name();
        if (dir) {
          auto sub = Tree(e.attr().ino(), prefix + e.name() + "/");
          out.insert(sub.begin(), sub.end());
        }
        after = e.cookie();
      }
      if (page.end()) break;
    }
    return out;
  }

  // Tree() with the under-storage moved away: what is served without listing it.
  std::set<std::string> TreeWithoutSource(uint64_t ino) {
    std::filesystem::rename(dir_ / "src", dir_ / "moved");
    auto tree = Tree(ino);
    std::filesystem::rename(dir_ / "moved", dir_ / "src");
    return tree;
  }
  // A load of /ds in pages of `page_size` entries, stopped before its page `stop_after` + 1 (0: not
  // stopped).
  StatusOr<LoadStats> Load(size_t page_size, int stop_after = 0) {
    LoadTreeOptions opts;
    opts.page_size = page_size;
    int pages = 0;
    if (stop_after > 0) opts.stop = [&] { return ++pages > stop_after; };
    return ns_->LoadTree("/ds", opts);
  }

  static constexpr size_t kEntries = 5u * 31u + 5u * 2u + 1u;  // the fixture's files and directories
  testing::TempDir dir_;
  std::unique_ptr<Namespace> ns_;
  rpc::MountInfo mount_;
};

TEST_F(LoadTreeTest, LoadsEverythingSoNoListingIsNeededAfterwards) {
  auto stats = ns_->LoadTree("/ds");
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  EXPECT_EQ(stats->files, 5u * 31u);
  EXPECT_EQ(stats->added, 5u * 31u + 5u * 2u + 1u);  // files, c*/ and c*/sub/, empty/
  // Take the under-storage away: everything loaded is served from RocksDB alone.
  std::filesystem::rename(dir_ / "src", dir_ / "moved");
  auto tree = Tree(mount_.root_ino());
  EXPECT_EQ(tree.size(), 5u * 31u + 5u * 2u + 1u);
  EXPECT_TRUE(tree.count("c3/sub/f29.jpg"));
  EXPECT_TRUE(tree.count("empty/"));
  auto mounts = ns_->ListMounts();
  EXPECT_EQ(mounts[0].known_files(), 5u * 31u);
  std::filesystem::rename(dir_ / "moved", dir_ / "src");
}

TEST_F(LoadTreeTest, ATreeIsListedWhenEveryDirectoryInItIs) {
  auto listed = [&](const std::string& p) {
    auto l = ns_->TreeListed(p);
    EXPECT_TRUE(l.ok()) << l.status().message();
    return l.ok() && *l;
  };
  EXPECT_FALSE(listed("/ds"));
  // The top and one branch listed by readers: the rest is not.
  auto c0 = ns_->Lookup(mount_.root_ino(), "c0");
  ASSERT_TRUE(c0.ok());
  Tree(c0->ino());
  EXPECT_TRUE(listed("/ds/c0"));
  EXPECT_FALSE(listed("/ds"));
  EXPECT_FALSE(listed("/ds/c0/top.txt"));  // a file is no tree
  // Everything listed, lazily or by a load: nothing to list again.
  Tree(mount_.root_ino());
  EXPECT_TRUE(listed("/ds"));
  ASSERT_TRUE(ns_->LoadTree("/ds").ok());
  EXPECT_TRUE(listed("/ds"));
  EXPECT_FALSE(ns_->TreeListed("/ds/nothing").ok());
}

TEST_F(LoadTreeTest, LoadingAgainChangesOnlyWhatChanged) {
  // Part of the tree is listed lazily first; the load keeps those inodes.
  auto c0 = ns_->Lookup(mount_.root_ino(), "c0");
  ASSERT_TRUE(c0.ok());
  auto top = ns_->Lookup(c0->ino(), "top.txt");
  ASSERT_TRUE(top.ok());
  ASSERT_TRUE(ns_->LoadTree("/ds").ok());
  EXPECT_EQ(ns_->Lookup(c0->ino(), "top.txt")->ino(), top->ino());
  auto again = ns_->LoadTree("/ds");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->added + again->changed + again->removed, 0u);
  // Changes in the under-storage: a new version, a deleted subtree, a new file.
  testing::WriteFile(dir_ / "src/c0/top.txt", "changed!");
  std::filesystem::remove_all(dir_ / "src/c4");
  testing::WriteFile(dir_ / "src/c1/new.jpg", "n");
  std::vector<FileKey> reclaimed;
  ns_->SetReclaimListener([&](std::vector<FileKey> k) { reclaimed.insert(reclaimed.end(), k.begin(), k.end()); });
  auto third = ns_->LoadTree("/ds");
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->added, 1u);
  EXPECT_EQ(third->changed, 1u);
  EXPECT_EQ(third->removed, 1u);  // c4 and everything below it
  EXPECT_EQ(reclaimed.size(), 1u + 31u);
  auto tree = Tree(mount_.root_ino());
  EXPECT_FALSE(tree.count("c4/"));
  EXPECT_TRUE(tree.count("c1/new.jpg"));
  EXPECT_EQ(ns_->GetAttr(top->ino())->size(), 8u);
}

// A load stopped after a few pages (a cancelled job, a caller gone, a master killed) leaves a
// cursor; the next load lists only what comes after its checkpoint, and the tree ends complete and
// fully listed. A third load starts from the beginning again.
TEST_F(LoadTreeTest, AStoppedLoadResumesAfterItsCheckpoint) {
  auto first = Load(10, 7);
  ASSERT_EQ(first.status().code(), Code::kCancelled) << first.status().ToString();
  auto second = Load(10);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_FALSE(second->resumed_after.empty());
  // The first load wrote 7 pages of 10 entries; the walk passes again at most the other files of
  // its checkpoint's directory (31 here).
  EXPECT_LE(second->files, 5u * 31u - 70u + 31u) << "the resumed load listed again what the first one wrote";
  EXPECT_GT(second->files, 0u);
  auto tree = TreeWithoutSource(mount_.root_ino());  // everything is served without a listing
  EXPECT_EQ(tree.size(), kEntries);
  EXPECT_TRUE(tree.count("c0/sub/f0.jpg"));
  EXPECT_TRUE(tree.count("c4/sub/f29.jpg"));
  EXPECT_TRUE(tree.count("empty/"));
  EXPECT_EQ(ns_->ListMounts()[0].known_files(), 5u * 31u);
  auto third = Load(10);
  ASSERT_TRUE(third.ok()) << third.status().message();
  EXPECT_TRUE(third->resumed_after.empty()) << "a completed load leaves no cursor";
  EXPECT_EQ(third->files, 5u * 31u);
  EXPECT_EQ(third->added + third->changed + third->removed, 0u);
}

// Stopped again and again (a master restarted over and over), each time a few pages in: each load
// makes progress, and the tree ends whole, with every directory listed, the empty ones too
// wherever the cuts fell. (The walk resumes a directory's files from their start, as their order
// is not fixed: a load gets past a directory if it can list that directory's files, 31 here.)
TEST_F(LoadTreeTest, LoadsStoppedAnywhereEndWhole) {
  std::filesystem::create_directories(dir_ / "src/aempty");                 // before every branch
  std::filesystem::create_directories(dir_ / "src/c2/sub/deeper/empty");  // deep, between files
  testing::WriteFile(dir_ / "src/c2/sub/deeper/z.bin", "z");
  const size_t total = kEntries + 4u;
  for (int pages_each : {11, 12, 13, 17, 25}) {
    SCOPED_TRACE("stopped every " + std::to_string(pages_each) + " pages");
    testing::TempDir db;
    auto ns = Namespace::Open(db / "db", 4096, UfsAccess::Unrestricted());
    ASSERT_TRUE(ns.ok());
    auto m = (*ns)->Mount("/ds", "file://" + dir_ / "src", {});
    ASSERT_TRUE(m.ok());
    LoadTreeOptions opts;
    opts.page_size = 3;
    int loads = 0;
    for (;;) {
      int pages = 0;
      opts.stop = [&] { return ++pages > pages_each; };
      auto st = (*ns)->LoadTree("/ds", opts);
      ++loads;
      if (st.ok()) break;
      ASSERT_EQ(st.status().code(), Code::kCancelled) << st.status().ToString();
      ASSERT_LT(loads, 200) << "the loads make no progress";
    }
    EXPECT_GE(loads, static_cast<int>(total) / (3 * pages_each)) << "every load was stopped before its end";
    std::swap(ns_, *ns);
    auto tree = TreeWithoutSource(m->root_ino());
    std::swap(ns_, *ns);
    EXPECT_EQ(tree.size(), total);
    EXPECT_TRUE(tree.count("aempty/"));
    EXPECT_TRUE(tree.count("c2/sub/deeper/empty/"));
    EXPECT_TRUE(tree.count("c2/sub/deeper/z.bin"));
    EXPECT_EQ((*ns)->ListMounts()[0].known_files(), 5u * 31u + 1u);
  }
}

// A directory the stopped load left open has been listed since (here the mount's root, by a
// readdir: its children are stamped with the next generation, and it is marked listed). The load
// resumes all the same, and nothing the first load wrote is swept.
TEST_F(LoadTreeTest, AResumeAfterAnOpenDirectoryWasListedLosesNothing) {
  ASSERT_EQ(Load(10, 7).status().code(), Code::kCancelled);
  rpc::ReadDirResponse page;
  ASSERT_TRUE(ns_->ReadDir(mount_.root_ino(), 0, 100, &page).ok());
  auto second = Load(10);
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_FALSE(second->resumed_after.empty());
  EXPECT_EQ(second->removed, 0u);
  EXPECT_EQ(TreeWithoutSource(mount_.root_ino()).size(), kEntries);
}

// Every directory the stopped load left open finished since: as after a crash in the middle of a
// page (a directory the page finished is written before the page's cursor), or listed by readdirs.
// The load resumes and sweeps nothing.
TEST_F(LoadTreeTest, AResumeAfterItsOpenDirectoriesFinishedSince) {
  ASSERT_EQ(Load(10, 7).status().code(), Code::kCancelled);
  ASSERT_EQ(Tree(mount_.root_ino()).size(), kEntries);  // lists every directory not loaded yet
  auto last = Load(10);
  ASSERT_TRUE(last.ok()) << last.status().message();
  EXPECT_FALSE(last->resumed_after.empty());
  EXPECT_EQ(last->removed, 0u);
  EXPECT_EQ(last->added, 0u);
  EXPECT_EQ(TreeWithoutSource(mount_.root_ino()).size(), kEntries);
}

TEST_F(LoadTreeTest, BadPathsAreClearErrors) {
  EXPECT_EQ(ns_->LoadTree("/ds/c0/top.txt").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ns_->LoadTree("/").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ns_->LoadTree("/nope").status().code(), Code::kNotFound);
}

// RocksDB's files, with reads of its tables failing on demand: an I/O error in the middle of a
// listing must fail the call, not read as the end of the directory.
class FailingReadsFs : public rocksdb::FileSystemWrapper {
 public:
  explicit FailingReadsFs(std::shared_ptr<rocksdb::FileSystem> t) : FileSystemWrapper(std::move(t)) {}
  const char* Name() const override { return "FailingReadsFs"; }
  rocksdb::IOStatus NewRandomAccessFile(const std::string& f, const rocksdb::FileOptions& o,
                                        std::unique_ptr<rocksdb::FSRandomAccessFile>* r,
                                        rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus st = target()->NewRandomAccessFile(f, o, r, dbg);
    if (st.ok() && f.size() > 4 && f.compare(f.size() - 4, 4, ".sst") == 0) r->reset(new File(std::move(*r), &fail));
    return st;
  }
  std::atomic<bool> fail{false};

 private:
  class File : public rocksdb::FSRandomAccessFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSRandomAccessFile>&& t, std::atomic<bool>* fail)
        : FSRandomAccessFileOwnerWrapper(std::move(t)), fail_(fail) {}
    rocksdb::IOStatus Read(uint64_t off, size_t n, const rocksdb::IOOptions& o, rocksdb::Slice* result, char* scratch,
                           rocksdb::IODebugContext* dbg) const override {
      if (*fail_) return rocksdb::IOStatus::IOError("injected read error");
      return target()->Read(off, n, o, result, scratch, dbg);
    }
    rocksdb::IOStatus MultiRead(rocksdb::FSReadRequest* reqs, size_t n, const rocksdb::IOOptions& o,
                                rocksdb::IODebugContext* dbg) override {
      if (*fail_) return rocksdb::IOStatus::IOError("injected read error");
      return target()->MultiRead(reqs, n, o, dbg);
    }

   private:
    std::atomic<bool>* fail_;
  };
};

TEST_F(NamespaceTest, AnIoErrorInAListingFailsTheCall) {
  for (int i = 0; i < 400; ++i) testing::WriteFile(dir_ / ("src/many/file-with-a-long-name-" + std::to_string(i)), "x");
  ASSERT_TRUE(ns_->Mount("/d", dir_ / "src", {}).ok());
  auto many = ns_->Resolve("/d/many");
  ASSERT_TRUE(many.ok());
  ASSERT_EQ(Names(many->ino()).size(), 400u);
  for (int i = 0; i < 400; ++i) {  // pins over more table blocks than opening reads (it reads the mounts)
    ASSERT_TRUE(ns_->meta().PutPin("/d/many/file-with-a-long-name-" + std::to_string(i), {}).ok());
  }
  ns_.reset();  // the reopen below replays the log into table files, where the fault is

  auto fs = std::make_shared<FailingReadsFs>(rocksdb::FileSystem::Default());
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(fs);
  auto ns = Namespace::Open(dir_ / "db", 4096, UfsAccess::Unrestricted(), kSyncNever, 64 << 20, env.get());
  ASSERT_TRUE(ns.ok()) << ns.status().ToString();
  auto again = (*ns)->Resolve("/d/many");  // the directory's own record is cached now
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  fs->fail = true;
  rpc::ReadDirResponse page;
  Status st = (*ns)->ReadDir(again->ino(), 0, 100, &page);
  EXPECT_FALSE(st.ok()) << "a listing that hit an I/O error came back as " << page.entries_size()
                        << " entries, end=" << page.end();
  EXPECT_TRUE(st.IsRetryable()) << st.ToString();
  EXPECT_NE(st.message().find("injected read error"), std::string::npos) << st.ToString();
  auto pins = (*ns)->meta().Pins();
  EXPECT_FALSE(pins.ok()) << "pins listed as " << pins->size() << " despite the I/O error";
  fs->fail = false;
  ns->reset();
}

TEST_F(NamespaceTest, ADataDirInUseIsAClearError) {
  // The same process: a second Namespace on the directory.
  auto second = Namespace::Open(dir_ / "db", 4096, UfsAccess::Unrestricted());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("already open in this process"), std::string::npos) << second.status().message();

  // Another process holding RocksDB's lock (as a second granary-master would): named by its pid.
  ns_.reset();
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(done[1]);  // else the read below never sees the parent's end close
    close(ready[0]);
    int fd = open((dir_ / "db/LOCK").c_str(), O_RDWR);
    struct flock fl{};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    char c = fd >= 0 && fcntl(fd, F_SETLK, &fl) == 0 ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1) _exit(1);
    if (read(done[0], &c, 1) < 0) _exit(1);  // holds the lock until the parent is done (or gone)
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  EXPECT_EQ(c, 'y');
  auto held = Namespace::Open(dir_ / "db", 4096, UfsAccess::Unrestricted());
  close(done[1]);
  close(ready[0]);
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  ASSERT_FALSE(held.ok());
  EXPECT_EQ(held.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(held.status().message().find("pid " + std::to_string(child)), std::string::npos) << held.status().message();
  Reopen();  // released: opens again
}

}  // namespace
}  // namespace granary::master
