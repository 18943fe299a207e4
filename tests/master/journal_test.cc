// The master's journal (master/journal.h): a standby applying the leader's entries holds the same
// database (inode numbers included); whatever a standby cannot be vouched for is replaced by a
// snapshot; the fence stops writes; commits wait for a follower in sync.
#include "master/journal.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "common/keys.h"
#include "master/namespace.h"
#include "tests/testutil/testutil.h"

namespace granary::master {
namespace {

using KeyValues = std::map<std::string, std::string>;

class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int i = 0; i < 20; ++i) testing::WriteFile(dir_ / ("src/d" + std::to_string(i % 3) + "/f" + std::to_string(i)), "x");
    a_ = Open("a");
    b_ = Open("b");
  }
  std::unique_ptr<Namespace> Open(const std::string& name, size_t keep = 64 << 20) {
    auto ns = Namespace::Open(dir_ / name, 4096, UfsAccess::Unrestricted());
    EXPECT_TRUE(ns.ok()) << ns.status().message();
    (*ns)->journal().Configure(keep, std::chrono::milliseconds(300));
    return std::move(ns).value();
  }
  // What a standby's stream does (master/replication.cc), in one thread: `to` catches up with `from`.
  void Pump(Namespace* from, Namespace* to) {
    for (int rounds = 0; rounds < 1000; ++rounds) {
      std::vector<JournalEntry> entries;
      FollowerNeeds need = from->journal().Read(to->journal().position(), 4096, &entries);
      if (need == FollowerNeeds::kNothing) return;
      if (need == FollowerNeeds::kSnapshot) {
        ++snapshots_;
        ASSERT_TRUE(to->journal().InstallBegin().ok());
        Status st = from->journal().Snapshot(
            512, [&](const std::vector<std::string>& k, const std::vector<std::string>& v) { return to->journal().InstallPage(k, v); });
        ASSERT_TRUE(st.ok()) << st.message();
        ASSERT_TRUE(to->InstallSnapshotEnd().ok());
        continue;
      }
      for (const auto& e : entries) {
        Status st = to->ApplyEntry(e);
        ASSERT_TRUE(st.ok()) << st.message();
      }
    }
    FAIL() << "the standby never caught up";
  }
  static KeyValues Contents(Namespace* ns) {
    KeyValues out;
    EXPECT_TRUE(ns->journal()
                    .Snapshot(1 << 20,
                              [&](const std::vector<std::string>& k, const std::vector<std::string>& v) {
                                for (size_t i = 0; i < k.size(); ++i) out[k[i]] = v[i];
                                return Status::OK();
                              })
                    .ok());
    return out;
  }
  // Inode of `path`, asked the way a standby answers (never listing the under-storage).
  static uint64_t StandbyIno(Namespace* ns, const std::string& path) {
    uint64_t ino = kRootIno;
    size_t start = 1;
    while (start < path.size()) {
      size_t slash = path.find('/', start);
      std::string name = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      bool ufs = false;
      auto a = ns->Lookup(ino, name, &ufs);
      if (!a.ok()) return 0;
      ino = a->ino();
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    return ino;
  }

  testing::TempDir dir_;
  std::unique_ptr<Namespace> a_, b_;
  int snapshots_ = 0;
};

TEST_F(JournalTest, AStandbyHoldsTheLeadersNamespaceWithTheSameInodes) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  auto f = a_->Resolve("/data/d1/f4");  // lists / and d1 in the leader: inodes handed out
  ASSERT_TRUE(f.ok()) << f.status().message();
  Pump(a_.get(), b_.get());
  EXPECT_EQ(snapshots_, 1) << "a new standby starts from a snapshot";
  EXPECT_EQ(b_->journal().position(), a_->journal().position());
  EXPECT_EQ(StandbyIno(b_.get(), "/data/d1/f4"), f->ino());
  ASSERT_EQ(b_->ListMounts().size(), 1u) << "the mount table follows the entries";

  // More writes: entries only, no second snapshot.
  auto g = a_->Resolve("/data/d2/f5");
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE(a_->meta().PutPin("/data/d2", {}).ok());
  ASSERT_TRUE(a_->Unmount("/data").ok());
  ASSERT_TRUE(a_->Mount("/other", "file://" + dir_ / "src/d0", {}).ok());
  Pump(a_.get(), b_.get());
  EXPECT_EQ(snapshots_, 1);
  EXPECT_EQ(Contents(b_.get()), Contents(a_.get()));
  ASSERT_EQ(b_->ListMounts().size(), 1u);
  EXPECT_EQ(b_->ListMounts()[0].path(), "/other");

  // The standby takes over: it goes on from the same counters, so no inode number is handed out twice.
  ASSERT_TRUE(b_->ReloadState().ok());
  ASSERT_TRUE(b_->journal().BeginTerm(9).ok());
  auto h = b_->Resolve("/other/f0");
  ASSERT_TRUE(h.ok()) << h.status().message();
  auto seen = Contents(a_.get());
  for (const auto& [k, v] : seen) {
    if (k[0] == 'I') {
      EXPECT_NE(GetBe64(k.data() + 1), h->ino()) << "inode reused";
    }
  }
  // And the old leader, now a standby at the same position, follows without a snapshot.
  Pump(b_.get(), a_.get());
  EXPECT_EQ(snapshots_, 1);
  EXPECT_EQ(Contents(a_.get()), Contents(b_.get()));
}

TEST_F(JournalTest, ADeposedLeadersUnreplicatedWritesAreReplacedByASnapshot) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  Pump(a_.get(), b_.get());
  ASSERT_EQ(snapshots_, 1);
  // A writes on, cut off: B never gets it, takes over and writes too.
  ASSERT_TRUE(a_->Mount("/lost", "file://" + dir_ / "src/d0", {}).ok());
  ASSERT_TRUE(b_->ReloadState().ok());
  ASSERT_TRUE(b_->journal().BeginTerm(7).ok());
  ASSERT_TRUE(b_->Mount("/kept", "file://" + dir_ / "src/d1", {}).ok());
  EXPECT_EQ(a_->journal().position().index, b_->journal().position().index - 1);
  // Same index, other term: A's entries are not B's.
  std::vector<JournalEntry> entries;
  EXPECT_EQ(b_->journal().Read(a_->journal().position(), 1 << 20, &entries), FollowerNeeds::kSnapshot);
  Pump(b_.get(), a_.get());
  EXPECT_EQ(snapshots_, 2);
  EXPECT_EQ(Contents(a_.get()), Contents(b_.get()));
  std::set<std::string> paths;
  for (const auto& m : a_->ListMounts()) paths.insert(m.path());
  EXPECT_EQ(paths, (std::set<std::string>{"/data", "/kept"}));
}

TEST_F(JournalTest, AFollowerOlderThanTheKeptEntriesTakesASnapshot) {
  a_ = nullptr;
  a_ = Open("a2", /*keep=*/2048);
  ASSERT_TRUE(a_->journal().BeginTerm(3).ok());
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  Pump(a_.get(), b_.get());
  ASSERT_EQ(snapshots_, 1);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(a_->Resolve("/data/d" + std::to_string(i) + "/f" + std::to_string(i)).ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(a_->meta().PutPin("/data/p" + std::to_string(i), {}).ok());
  Pump(a_.get(), b_.get());
  EXPECT_EQ(snapshots_, 2) << "2 KiB of entries cannot hold 50 pins' worth";
  EXPECT_EQ(Contents(b_.get()), Contents(a_.get()));
}

TEST_F(JournalTest, EntriesOutOfOrderOrWithoutTheirPositionAreRefused) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  Pump(a_.get(), b_.get());
  ASSERT_TRUE(a_->meta().PutPin("/x", {}).ok());
  ASSERT_TRUE(a_->meta().PutPin("/y", {}).ok());
  std::vector<JournalEntry> entries;
  LogPosition from = b_->journal().position();
  ASSERT_EQ(a_->journal().Read(from, 1 << 20, &entries), FollowerNeeds::kEntries);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(b_->ApplyEntry(entries[1]).code(), Code::kFailedPrecondition) << "a gap";
  JournalEntry forged = entries[0];
  forged.pos.term += 1;  // its data says otherwise
  EXPECT_EQ(b_->ApplyEntry(forged).code(), Code::kDataLoss);
  JournalEntry garbage{entries[0].pos, "not a write batch"};
  EXPECT_EQ(b_->ApplyEntry(garbage).code(), Code::kDataLoss);
  EXPECT_EQ(b_->journal().position(), from) << "nothing applied";
  ASSERT_TRUE(b_->ApplyEntry(entries[0]).ok());
  ASSERT_TRUE(b_->ApplyEntry(entries[1]).ok());
  EXPECT_EQ(Contents(b_.get()), Contents(a_.get()));
}

TEST_F(JournalTest, TheFenceStopsEveryWrite) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  std::atomic<bool> leading{true};
  a_->journal().SetFence([&]() -> Status { return leading ? Status::OK() : UnavailableError("deposed"); });
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  LogPosition before = a_->journal().position();
  KeyValues contents = Contents(a_.get());
  leading = false;
  EXPECT_EQ(a_->Mount("/more", "file://" + dir_ / "src", {}).status().code(), Code::kUnavailable);
  EXPECT_FALSE(a_->Resolve("/data/d0/f0").ok()) << "a listing writes, so it is fenced too";
  EXPECT_FALSE(a_->meta().PutPin("/data", {}).ok());
  EXPECT_EQ(a_->journal().position(), before);
  EXPECT_EQ(Contents(a_.get()), contents);
}

TEST_F(JournalTest, CommitsWaitForAFollowerInSync) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  Journal& j = a_->journal();
  j.Configure(64 << 20, std::chrono::seconds(60));
  j.Acked("b", j.position().index);  // in step: in sync
  ASSERT_EQ(j.Followers().size(), 1u);
  EXPECT_TRUE(j.Followers()[0].in_sync);
  const uint64_t start = j.position().index;
  std::atomic<bool> done{false};
  std::thread writer([&] {
    EXPECT_TRUE(a_->meta().PutPin("/p", {}).ok());
    EXPECT_TRUE(j.WaitReplicated().ok());
    done = true;
  });
  ASSERT_TRUE(j.WaitBeyond(start, std::chrono::seconds(30))) << "the entry is written before the wait";
  // Group commit (issue 51, finding 5): the wait holds no namespace lock, so another call goes on
  // meanwhile (it waited behind the first's acknowledgement for up to the sync timeout before).
  // (Had it queued, it would have returned only when the first's wait timed out: `done` below.)
  EXPECT_TRUE(a_->meta().PutPin("/other", {}).ok());
  EXPECT_TRUE(a_->Resolve("/").ok());
  EXPECT_FALSE(done) << "the write's acknowledgement waits for the follower's, and nothing else did";
  j.Acked("b", start + 2);
  writer.join();
  EXPECT_TRUE(done);
  EXPECT_TRUE(j.WaitReplicated().ok()) << "this thread's entry, acknowledged already";
  // A follower that does not answer within the sync timeout drops out of sync, and the write returns.
  j.Configure(64 << 20, std::chrono::milliseconds(200));
  ASSERT_TRUE(a_->meta().PutPin("/q", {}).ok());
  EXPECT_TRUE(j.WaitReplicated().ok());
  ASSERT_EQ(j.Followers().size(), 1u);
  EXPECT_FALSE(j.Followers()[0].in_sync);
  EXPECT_TRUE(a_->meta().PutPin("/r", {}).ok()) << "no follower in sync: no wait";
  j.Acked("b", j.position().index);
  EXPECT_TRUE(j.Followers()[0].in_sync) << "caught up: in sync again";
  j.Forget("b");
  EXPECT_TRUE(j.Followers().empty());
}

TEST_F(JournalTest, APartialCopyNeverLeadsAndIsReplacedWhole) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  // B starts installing A's snapshot and stops halfway (a crash, a broken stream).
  ASSERT_TRUE(b_->journal().InstallBegin().ok());
  int pages = 0;
  ASSERT_TRUE(a_->journal()
                  .Snapshot(64, [&](const std::vector<std::string>& k, const std::vector<std::string>& v) {
                    return ++pages > 2 ? UnavailableError("the stream broke") : b_->journal().InstallPage(k, v);
                  })
                  .code() == Code::kUnavailable);
  b_ = nullptr;
  b_ = Open("b");  // restarted
  EXPECT_FALSE(b_->journal().Whole());
  EXPECT_EQ(b_->journal().BeginTerm(6).code(), Code::kFailedPrecondition) << "a partial copy must never lead";
  Pump(a_.get(), b_.get());
  EXPECT_TRUE(b_->journal().Whole());
  EXPECT_EQ(Contents(b_.get()), Contents(a_.get()));
}

TEST_F(JournalTest, ASingleMastersPositionIsNeverTakenForAnElectedOnes) {
  // Both journals at term 0 (single masters): equal indexes prove nothing.
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  ASSERT_TRUE(b_->Mount("/other", "file://" + dir_ / "src/d0", {}).ok());
  ASSERT_EQ(a_->journal().position(), b_->journal().position());
  std::vector<JournalEntry> entries;
  EXPECT_EQ(a_->journal().Read(b_->journal().position(), 1 << 20, &entries), FollowerNeeds::kSnapshot);
}

TEST_F(JournalTest, ASnapshotInFlightKeepsTheEntriesAfterIt) {
  a_ = nullptr;
  a_ = Open("a3", /*keep=*/1024);
  ASSERT_TRUE(a_->journal().BeginTerm(3).ok());
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  LogPosition at;
  ASSERT_TRUE(a_->journal()
                  .Snapshot(1 << 20, [](const std::vector<std::string>&, const std::vector<std::string>&) { return Status::OK(); },
                            &at)
                  .ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(a_->meta().PutPin("/data/p" + std::to_string(i), {}).ok());  // far beyond 1 KiB
  std::vector<JournalEntry> entries;
  EXPECT_EQ(a_->journal().Read(at, 1 << 30, &entries), FollowerNeeds::kEntries);
  EXPECT_EQ(entries.size(), 50u);
  a_->journal().Unhold(at.index);
  ASSERT_TRUE(a_->meta().PutPin("/data/q", {}).ok());
  entries.clear();
  EXPECT_EQ(a_->journal().Read(at, 1 << 30, &entries), FollowerNeeds::kSnapshot) << "released: trimmed again";
}

TEST_F(JournalTest, ANewLeaderHandsOutNoNumberThePreviousOneMayHaveUsed) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  ASSERT_TRUE(a_->Mount("/data", "file://" + dir_ / "src", {}).ok());
  Pump(a_.get(), b_.get());
  // A lists a directory (inodes handed out) that B never gets, and dies.
  auto lost = a_->Resolve("/data/d1/f1");
  ASSERT_TRUE(lost.ok());
  ASSERT_TRUE(b_->ReloadState().ok());
  ASSERT_TRUE(b_->journal().BeginTerm(7).ok());
  ASSERT_TRUE(b_->SkipAhead(1 << 24, 1024).ok());
  auto other = b_->Resolve("/data/d2/f2");
  ASSERT_TRUE(other.ok());
  EXPECT_GT(other->ino(), lost->ino() + (1u << 23)) << "a number A gave out is not given to another file";
  EXPECT_EQ(b_->GetAttr(lost->ino()).status().code(), Code::kNotFound);
}

// Issue 56: free stamps only grow — across a restart and a failover — so a worker never takes a
// new leader's free for an old one (or its batches for older than a free they came after).
TEST_F(JournalTest, FreeStampsGrowAcrossARestartAndAFailover) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  auto s1 = a_->NextFreeStamp();
  ASSERT_TRUE(s1.ok()) << s1.status().ToString();
  auto s2 = a_->NextFreeStamp();
  ASSERT_TRUE(s2.ok());
  EXPECT_GT(*s2, *s1);
  EXPECT_EQ(a_->FreeStamp(), *s2);
  Pump(a_.get(), b_.get());
  a_.reset();  // the leader dies; the standby leads
  ASSERT_TRUE(b_->ReloadState().ok());
  ASSERT_TRUE(b_->journal().BeginTerm(6).ok());
  EXPECT_GT(b_->FreeStamp(), *s2) << "a new leader's batches would be older than the last free";
  auto s3 = b_->NextFreeStamp();
  ASSERT_TRUE(s3.ok());
  EXPECT_GT(*s3, *s2);
  a_ = Open("a");  // the old leader restarts
  auto s4 = a_->NextFreeStamp();
  ASSERT_TRUE(s4.ok());
  EXPECT_GT(*s4, *s2);
}

// A leader with no standby in sync reserves a block of stamps no standby gets and hands them out;
// the next leader (Promote's SkipAhead) still stamps above every one of them.
TEST_F(JournalTest, ANewLeaderStampsAboveAReservationItNeverGot) {
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  ASSERT_TRUE(a_->NextFreeStamp().ok());
  Pump(a_.get(), b_.get());
  uint64_t last = 0;
  for (uint64_t i = 0; i <= (1u << 20) + 1; ++i) {  // past the first block: a second reservation
    auto s = a_->NextFreeStamp();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    last = *s;
  }
  a_.reset();  // the leader dies before any standby got its second reservation
  ASSERT_TRUE(b_->ReloadState().ok());
  ASSERT_TRUE(b_->journal().BeginTerm(6).ok());
  ASSERT_TRUE(b_->SkipAhead(0, 0).ok());
  auto next = b_->NextFreeStamp();
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_GT(*next, last) << "a free stamp went back: workers would count new batches older than old frees";
}

// Issue 51, finding 5: a directory rename rewrites its subtree's paths in bounded batches with the
// namespace lock released between them; meanwhile every read (on the leader and on a standby)
// sees the new paths, a write goes through, and a new directory made at the old name keeps its
// own; a crash halfway leaves a rename the next leader finishes.
TEST_F(JournalTest, ADirectoryRenameIsWrittenOutInBatchesThatReadsStandbysAndACrashFollow) {
  for (int i = 0; i < 30; ++i) {
    testing::WriteFile(dir_ / ("src/big/s" + std::to_string(i % 4) + "/deep/f" + std::to_string(i)), std::to_string(i));
  }
  ASSERT_TRUE(a_->journal().BeginTerm(5).ok());
  std::map<std::string, std::string> opts{{"write", "through"}, {"metadata.sync_interval", "never"}};
  ASSERT_TRUE(a_->Mount("/w", "file://" + dir_ / "src", opts).ok());
  std::map<uint64_t, std::string> files;  // ino -> path below big/
  ASSERT_TRUE(a_->ForEachFile("/w/big", [&](const std::string&, const rpc::FileInfo& f) {
                  files[f.attr().ino()] = f.ufs_path().substr(4);
                  return Status::OK();
                }).ok());
  ASSERT_EQ(files.size(), 30u);
  auto root = a_->Resolve("/w");
  ASSERT_TRUE(root.ok());
  Pump(a_.get(), b_.get());

  // Every file's path as `ns` answers it (a standby's way: never the under-storage).
  auto paths_are = [&](Namespace* ns, const std::string& top) {
    for (const auto& [ino, rest] : files) {
      bool ufs = false;
      auto f = ns->GetFile(ino, &ufs);
      if (!f.ok()) return ::testing::AssertionFailure() << "file " << ino << ": " << f.status().ToString();
      if (f->ufs_path() != top + "/" + rest) {
        return ::testing::AssertionFailure() << "file " << ino << " at " << f->ufs_path() << ", not " << top << "/" << rest;
      }
    }
    return ::testing::AssertionSuccess();
  };
  int batches = 0;
  a_->SetRenameBatchHookForTest(
      [&]() -> Status {
        if (++batches == 1) {
          EXPECT_TRUE(paths_are(a_.get(), "moved")) << "the leader, halfway";
          Pump(a_.get(), b_.get());
          EXPECT_TRUE(paths_are(b_.get(), "moved")) << "a standby, halfway";
          EXPECT_EQ(b_->renames_in_progress(), 1u);
          // Another write goes through meanwhile (it would wait for the whole rename if the lock
          // were held across it; 60 s: a deadlock, not a timing).
          auto made = std::async(std::launch::async, [&] { return a_->MakeDir(root->ino(), "meanwhile", 0755, {}); });
          if (made.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
            ADD_FAILURE() << "a write waited for the rename's batches";
            _exit(1);  // the rename holds what the write needs: nothing to unwind
          }
          EXPECT_TRUE(made.get().ok());
          // A new directory at the old name is another directory: its files keep their own paths.
          auto again = a_->MakeDir(root->ino(), "big", 0755, {});
          EXPECT_TRUE(again.ok()) << again.status().ToString();
          if (again.ok()) {
            auto t = a_->PrepareCreate(again->ino(), "x", 0644, 0, 0);
            EXPECT_TRUE(t.ok() && t->file.ufs_path() == "big/x") << (t.ok() ? t->file.ufs_path() : t.status().ToString());
          }
          return Status::OK();
        }
        return UnavailableError("the master died here");  // the second pause: a crash
      },
      4);
  // The rename has happened when the master "dies" writing it out: it says so (a retry would find
  // nothing to rename), and the rest is left to the next leader.
  Status renamed = a_->Rename(root->ino(), "big", root->ino(), "moved", false);
  EXPECT_TRUE(renamed.ok()) << renamed.ToString();
  EXPECT_EQ(batches, 2);
  EXPECT_EQ(a_->renames_in_progress(), 1u);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "src/moved/s0/deep/f0"));

  // The leader restarts halfway: its copy still answers the new paths, and it finishes the rename.
  a_->SetRenameBatchHookForTest(nullptr, 1024);
  a_.reset();
  a_ = Open("a");
  EXPECT_EQ(a_->renames_in_progress(), 1u);
  EXPECT_TRUE(paths_are(a_.get(), "moved")) << "the leader after a restart";
  ASSERT_TRUE(a_->journal().BeginTerm(6).ok());
  ASSERT_TRUE(a_->FinishRenames().ok());
  EXPECT_EQ(a_->renames_in_progress(), 0u);
  EXPECT_TRUE(paths_are(a_.get(), "moved")) << "the leader once written out";
  auto x = a_->Resolve("/w/big/x");
  ASSERT_TRUE(x.ok()) << x.status().ToString();
  auto xf = a_->GetFile(x->ino());
  ASSERT_TRUE(xf.ok());
  EXPECT_EQ(xf->ufs_path(), "big/x") << "the new directory at the old name was moved too";
  Pump(a_.get(), b_.get());
  EXPECT_EQ(b_->renames_in_progress(), 0u);
  EXPECT_TRUE(paths_are(b_.get(), "moved")) << "a standby once written out";
  EXPECT_EQ(Contents(b_.get()), Contents(a_.get()));

  // A directory renamed back goes the same way without a pause.
  auto big = a_->Resolve("/w/big");
  ASSERT_TRUE(big.ok());
  ASSERT_TRUE(a_->Remove(big->ino(), "x", false, {}, x->ino()).ok());
  ASSERT_TRUE(a_->Remove(root->ino(), "big", true).ok());
  ASSERT_TRUE(a_->Rename(root->ino(), "moved", root->ino(), "big", false).ok());
  EXPECT_TRUE(paths_are(a_.get(), "big"));
  EXPECT_EQ(a_->renames_in_progress(), 0u);

  // The dataset unmounted between two batches: the rename ends (it spun for ever, committing an
  // entry per turn, before the fix), and a later directory rename is not held behind it.
  for (int i = 0; i < 30; ++i) testing::WriteFile(dir_ / ("src2/big/d" + std::to_string(i % 4) + "/f" + std::to_string(i)), "v");
  ASSERT_TRUE(a_->Mount("/v", "file://" + dir_ / "src2", opts).ok());
  auto vroot = a_->Resolve("/v");
  ASSERT_TRUE(vroot.ok());
  size_t listed = 0;
  ASSERT_TRUE(a_->ForEachFile("/v/big", [&](const std::string&, const rpc::FileInfo&) { ++listed; return Status::OK(); }).ok());
  ASSERT_EQ(listed, 30u);
  int turns = 0;
  a_->SetRenameBatchHookForTest(
      [&]() -> Status {
        if (++turns == 1) {
          EXPECT_TRUE(a_->Unmount("/v").ok());
        }
        return turns > 50 ? UnavailableError("the rename does not end") : Status::OK();
      },
      4);
  auto ended = a_->Rename(vroot->ino(), "big", vroot->ino(), "gone", false);
  EXPECT_TRUE(ended.ok()) << ended.ToString();
  EXPECT_EQ(turns, 1);
  EXPECT_EQ(a_->renames_in_progress(), 0u);
  a_->SetRenameBatchHookForTest(nullptr, 1024);
  EXPECT_TRUE(a_->Rename(root->ino(), "big", root->ino(), "moved", false).ok());
}

}  // namespace
}  // namespace granary::master
