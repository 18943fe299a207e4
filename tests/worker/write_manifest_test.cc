// The write=back staging manifest (worker/writes.h ParseWriteManifest) and the recovery that reads
// it at start. The old reader threw nlohmann::json::type_error out of WriteSessions::Open on a field
// of the wrong type (a worker that could not start again), took "abc.json" for session 0 and
// "18446744073709551615.json" for a session whose successor number wraps to 0.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <vector>

#include "tests/testutil/testutil.h"
#include "common/tiers.h"
#include "ufs/ufs.h"
#include "worker/writes.h"

namespace granary::worker {
namespace {

TEST(WriteManifest, RoundTripAndRefusals) {
  WriteManifest m;
  m.target = {3, 9, 1, "dir/ckpt.pt", "ckpt.pt", 0640, 1000, 1000, static_cast<uint32_t>(WriteMode::kBack), 4u << 20, {}, {}};
  m.sealed = true;
  m.size = 12345;
  auto back = ParseWriteManifest(EncodeWriteManifest(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->target.ufs_path, "dir/ckpt.pt");
  EXPECT_EQ(back->target.mode, 0640u);
  EXPECT_EQ(back->size, 12345u);
  EXPECT_TRUE(back->sealed);
  EXPECT_FALSE(back->target.attrs.mode.has_value());

  // chmod, chown and utimes made while writing go with the sealed file, across a restart.
  m.target.attrs.mode = 0600;
  m.target.attrs.gid = 7;
  m.target.attrs.mtime_ns = -1'500'000'000;  // before 1970: a time, not "unset"
  back = ParseWriteManifest(EncodeWriteManifest(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->target.attrs.mode, std::optional<uint32_t>(0600));
  EXPECT_EQ(back->target.attrs.gid, std::optional<uint32_t>(7));
  EXPECT_FALSE(back->target.attrs.uid.has_value());
  EXPECT_EQ(back->target.attrs.mtime_ns, std::optional<int64_t>(-1'500'000'000));

  for (const char* bad : {R"({"sealed":true,"mount_id":"x","ufs_path":"a","name":"a","write_mode":2})",
                          R"({"sealed":true,"mode":-1,"ufs_path":"a","name":"a","write_mode":2})",
                          R"({"sealed":"yes"})", R"([1,2])", R"({"sealed":true,"ufs_path":"../etc/x","name":"x","write_mode":2})",
                          R"({"sealed":true,"ufs_path":"a","name":"a/b","write_mode":2})",
                          R"({"sealed":true,"ufs_path":"a","name":"a","write_mode":7})",
                          R"({"sealed":true,"ufs_path":"a","name":"a","write_mode":2,"set_mode":65535})",
                          R"({"sealed":true,"ufs_path":"a","name":"a","write_mode":2,"set_uid":4294967295})",
                          R"({"sealed":true,"ufs_path":"a","name":"a","write_mode":2,"set_mtime_ns":"now"})",
                          "{\"sealed\":tr", ""}) {
    auto r = ParseWriteManifest(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kDataLoss) << bad;
    }
  }
}

class NoMounts : public MountResolver {
 public:
  StatusOr<MountHandle> GetMount(uint64_t) override { return NotFoundError("no mounts here"); }
};

TEST(WriteManifest, RecoveryKeepsDamagedSealedFilesAndIgnoresStrangers) {
  testing::TempDir dir;
  const std::string d = dir / "staging";
  ASSERT_EQ(mkdir(d.c_str(), 0700), 0);
  // Sealed, with a damaged manifest: kept in place, not uploaded, and the worker starts.
  testing::WriteFile(d + "/5.json", R"({"sealed":true,"mount_id":"x","ufs_path":"a","name":"a","write_mode":2})");
  testing::WriteFile(d + "/5.sealed", "bytes");
  // Torn before its file was sealed: never acknowledged, removed.
  testing::WriteFile(d + "/6.json", "{\"sealed\":tr");
  testing::WriteFile(d + "/6.data", "partial");
  // Not ours.
  testing::WriteFile(d + "/abc.json", "{}");
  testing::WriteFile(d + "/18446744073709551615.json", "{}");
  NoMounts mounts;
  auto w = WriteSessions::Open(d, &mounts, [](const rpc::CommitWriteRequest&) { return Status::OK(); });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  struct stat st;
  EXPECT_EQ(stat((d + "/5.json").c_str(), &st), 0);
  EXPECT_EQ(stat((d + "/5.sealed").c_str(), &st), 0);
  EXPECT_NE(stat((d + "/6.json").c_str(), &st), 0);
  EXPECT_NE(stat((d + "/6.data").c_str(), &st), 0);
  EXPECT_EQ(stat((d + "/abc.json").c_str(), &st), 0);
  EXPECT_EQ((*w)->backlog().files, 0u);  // nothing queued for upload
}

// A mount of a given write mode over a local directory.
class OneMount : public MountResolver {
 public:
  OneMount(std::string root, WriteMode mode) : root_(std::move(root)), mode_(mode) {}
  StatusOr<MountHandle> GetMount(uint64_t) override {
    ASSIGN_OR_RETURN(auto ufs, OpenUnderFileSystem(root_, {}));
    MountHandle m;
    m.uri = "file://" + root_;
    m.ufs = ufs;
    m.write = mode_;
    return m;
  }

 private:
  const std::string root_;
  const WriteMode mode_;
};

// Issue 50, finding 4: the worker committed a write into a read-only mount when asked. The mount's
// own write option decides, and its mode is the mount's, not the caller's.
TEST(WriteSessions, OnlyAWritableMountIsWrittenInItsOwnMode) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "src");
  rpc::WriteCall begin;
  begin.set_op(rpc::WriteCall::BEGIN);
  begin.set_mount_id(1);
  begin.set_ufs_path("x.bin");
  begin.set_name("x.bin");
  begin.set_mode(0644);
  begin.set_write_mode(static_cast<uint32_t>(WriteMode::kBack));
  int commits = 0;
  auto commit = [&](const rpc::CommitWriteRequest&) {
    ++commits;
    return Status::OK();
  };
  {
    OneMount ro(dir / "src", WriteMode::kOff);
    auto w = WriteSessions::Open(dir / "staging-ro", &ro, commit);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    rpc::LocalResponse resp;
    int fd = -1;
    Status st = (*w)->Handle(1, begin, &resp, &fd);
    EXPECT_EQ(st.code(), Code::kFailedPrecondition) << st.ToString();
    EXPECT_EQ(st.reason(), Reason::kReadOnly) << st.ToString();
    EXPECT_LT(fd, 0);
  }
  {
    // The caller says back; the mount says through: close() commits to the store before it answers.
    OneMount through(dir / "src", WriteMode::kThrough);
    auto w = WriteSessions::Open(dir / "staging-through", &through, commit);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    rpc::LocalResponse resp;
    int fd = -1;
    ASSERT_TRUE((*w)->Handle(1, begin, &resp, &fd).ok());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, "abc", 3), 3);
    close(fd);
    rpc::WriteCall c;
    c.set_op(rpc::WriteCall::COMMIT);
    c.set_session(resp.session());
    c.set_size(3);
    rpc::LocalResponse done;
    int none = -1;
    ASSERT_TRUE((*w)->Handle(1, c, &done, &none).ok());
    EXPECT_EQ(testing::ReadFile(dir / "src/x.bin"), "abc") << "not in the store when the commit answered";
    EXPECT_EQ(commits, 1);
    EXPECT_EQ(done.committed_version().empty(), false);
  }
}

// A spare session (BEGIN without a path) has a staging file and no target until AIM gives it one,
// checked as BEGIN checks it; chmod and utimes sent with COMMIT reach the store with the file.
TEST(WriteSessions, SpareSessionsAreAimedBeforeUseAndCommitsCarryTheirAttributes) {
  testing::TempDir dir;
  std::filesystem::create_directories(dir / "src");
  std::vector<rpc::CommitWriteRequest> commits;
  auto commit = [&](const rpc::CommitWriteRequest& c) {
    commits.push_back(c);
    return Status::OK();
  };
  OneMount through(dir / "src", WriteMode::kThrough);
  auto w = WriteSessions::Open(dir / "staging", &through, commit);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto call = [&](uint64_t conn, const rpc::WriteCall& c, rpc::LocalResponse* resp, int* fd) {
    int none = -1;
    Status st = (*w)->Handle(conn, c, resp, fd != nullptr ? fd : &none);
    if (fd == nullptr && none >= 0) close(none);
    return st;
  };
  rpc::WriteCall begin;
  begin.set_op(rpc::WriteCall::BEGIN);
  rpc::LocalResponse spare;
  int fd = -1;
  ASSERT_TRUE(call(1, begin, &spare, &fd).ok());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "spare bytes", 11), 11);
  close(fd);

  rpc::WriteCall commit_call;
  commit_call.set_op(rpc::WriteCall::COMMIT);
  commit_call.set_session(spare.session());
  commit_call.set_size(11);
  rpc::LocalResponse resp;
  EXPECT_EQ(call(1, commit_call, &resp, nullptr).code(), Code::kFailedPrecondition) << "committed with no target";

  rpc::WriteCall aim;
  aim.set_op(rpc::WriteCall::AIM);
  aim.set_session(spare.session());
  aim.set_mount_id(1);
  aim.set_ufs_path("../outside.bin");
  aim.set_name("outside.bin");
  aim.set_mode(0644);
  EXPECT_EQ(call(1, aim, &resp, nullptr).code(), Code::kInvalidArgument) << "aimed outside its mount";
  aim.set_ufs_path("y.bin");
  aim.set_name("y.bin");
  EXPECT_EQ(call(2, aim, &resp, nullptr).code(), Code::kFailedPrecondition) << "another connection's spare aimed";
  ASSERT_TRUE(call(1, aim, &resp, nullptr).ok());
  EXPECT_EQ(call(1, aim, &resp, nullptr).code(), Code::kFailedPrecondition) << "aimed twice";

  const int64_t mtime = 1'000'000'000LL * 1'000'000'000LL + 123'000'000;  // 2001-09-09
  commit_call.mutable_attrs()->set_mode(0604);
  commit_call.mutable_attrs()->set_mtime_ns(mtime);
  ASSERT_TRUE(call(1, commit_call, &resp, nullptr).ok());
  EXPECT_EQ(testing::ReadFile(dir / "src/y.bin"), "spare bytes");
  struct stat st {};
  ASSERT_EQ(::stat((dir / "src/y.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0604u);
  EXPECT_EQ(static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec, mtime);
  ASSERT_EQ(commits.size(), 1u);
  EXPECT_EQ(commits[0].mode(), 0604u) << "the master records what the store has";
  EXPECT_EQ(commits[0].mtime_ns(), mtime);

  commit_call.mutable_attrs()->set_mode(077777);
  EXPECT_EQ(call(1, commit_call, &resp, nullptr).code(), Code::kInvalidArgument) << "a mode beyond 07777 taken";

  // A spare whose connection closes leaves no staging file behind.
  rpc::LocalResponse other;
  ASSERT_TRUE(call(3, begin, &other, &fd).ok());
  close(fd);
  (*w)->ConnectionClosed(3);
  for (const auto& e : std::filesystem::directory_iterator(dir / "staging")) {
    EXPECT_NE(e.path().filename().string(), std::to_string(other.session()) + ".data") << "a dropped spare's file stayed";
  }
}

}  // namespace
}  // namespace granary::worker
