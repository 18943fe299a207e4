// The write=back staging manifest (worker/writes.h ParseWriteManifest) and the recovery that reads
// it at start. The old reader threw nlohmann::json::type_error out of WriteSessions::Open on a field
// of the wrong type (a worker that could not start again), took "abc.json" for session 0 and
// "18446744073709551615.json" for a session whose successor number wraps to 0.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "tests/testutil/testutil.h"
#include "common/tiers.h"
#include "worker/writes.h"

namespace granary::worker {
namespace {

TEST(WriteManifest, RoundTripAndRefusals) {
  WriteManifest m;
  m.target = {3, 9, 1, "dir/ckpt.pt", "ckpt.pt", 0640, 1000, 1000, static_cast<uint32_t>(WriteMode::kBack), 4u << 20};
  m.sealed = true;
  m.size = 12345;
  auto back = ParseWriteManifest(EncodeWriteManifest(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->target.ufs_path, "dir/ckpt.pt");
  EXPECT_EQ(back->target.mode, 0640u);
  EXPECT_EQ(back->size, 12345u);
  EXPECT_TRUE(back->sealed);

  for (const char* bad : {R"({"sealed":true,"mount_id":"x","ufs_path":"a","name":"a","write_mode":2})",
                          R"({"sealed":true,"mode":-1,"ufs_path":"a","name":"a","write_mode":2})",
                          R"({"sealed":"yes"})", R"([1,2])", R"({"sealed":true,"ufs_path":"../etc/x","name":"x","write_mode":2})",
                          R"({"sealed":true,"ufs_path":"a","name":"a/b","write_mode":2})",
                          R"({"sealed":true,"ufs_path":"a","name":"a","write_mode":7})", "{\"sealed\":tr", ""}) {
    auto r = ParseWriteManifest(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_EQ(r.status().code(), Code::kDataLoss) << bad;
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

}  // namespace
}  // namespace granary::worker
