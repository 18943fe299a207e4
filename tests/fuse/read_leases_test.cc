// ReadLeases (fuse/read_leases.h): a lease per (inode, version), within its bounds (files, bytes,
// half the local worker's capacity), let go past its life, and kept alive by a READ using it.
#include "fuse/read_leases.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>

#include "fuse/client.h"

namespace granary::fuse {
namespace {

// A lease over /dev/null with no worker behind it (its end only closes the descriptor).
std::unique_ptr<FileLease> Lease(uint64_t bytes) {
  LocalChannel::Piece p;
  p.fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  p.length = bytes;
  return std::make_unique<FileLease>(std::make_shared<LocalChannel>("/nonexistent"), std::move(p));
}

bool Open(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(ReadLeases, OnePerInodeAndVersion) {
  ReadLeases leases(std::chrono::hours(1));
  EXPECT_TRUE(leases.Add(7, "v1", 1000, Lease(1000)));
  auto l = leases.Find(7, "v1");
  ASSERT_NE(l, nullptr);
  EXPECT_TRUE(Open(l->fd()));
  EXPECT_EQ(leases.Find(7, "v2"), nullptr) << "a new version never reads an old lease";
  EXPECT_EQ(leases.Find(8, "v1"), nullptr);
  // A new version replaces the old one's lease.
  EXPECT_TRUE(leases.Add(7, "v2", 2000, Lease(2000)));
  EXPECT_EQ(leases.Find(7, "v1"), nullptr);
  EXPECT_NE(leases.Find(7, "v2"), nullptr);
  EXPECT_EQ(leases.files(), 1u);
  EXPECT_EQ(leases.bytes(), 2000u);
  // The replaced lease stays usable while a READ holds it.
  EXPECT_TRUE(Open(l->fd()));
}

TEST(ReadLeases, BoundedByHalfTheWorkersCapacity) {
  ReadLeases leases(std::chrono::hours(1));
  leases.SetCapacity(20 << 20);  // 10 MiB may be leased
  EXPECT_FALSE(leases.Fits(11 << 20));
  EXPECT_FALSE(leases.Add(1, "v", 11 << 20, Lease(11 << 20)));
  EXPECT_EQ(leases.files(), 0u);
  for (uint64_t i = 1; i <= 3; ++i) EXPECT_TRUE(leases.Add(i, "v", 4 << 20, Lease(4 << 20)));
  // 12 MiB is over: the least recently used (1) went.
  EXPECT_EQ(leases.files(), 2u);
  EXPECT_EQ(leases.Find(1, "v"), nullptr);
  ASSERT_NE(leases.Find(2, "v"), nullptr);  // 2 is now the most recent
  EXPECT_TRUE(leases.Add(4, "v", 4 << 20, Lease(4 << 20)));
  EXPECT_NE(leases.Find(2, "v"), nullptr);
  EXPECT_EQ(leases.Find(3, "v"), nullptr);
}

TEST(ReadLeases, BoundedInFiles) {
  ReadLeases leases(std::chrono::hours(1));
  for (uint64_t i = 0; i < ReadLeases::kMaxFiles + 10; ++i) leases.Add(i, "v", 1, Lease(1));
  EXPECT_EQ(leases.files(), ReadLeases::kMaxFiles);
  EXPECT_EQ(leases.Find(0, "v"), nullptr);
  EXPECT_NE(leases.Find(ReadLeases::kMaxFiles + 9, "v"), nullptr);
}

TEST(ReadLeases, LeasesPastTheirLifeAreLetGo) {
  auto now = std::chrono::steady_clock::time_point{} + std::chrono::hours(1);
  ReadLeases leases(std::chrono::seconds(10), [&] { return now; });
  leases.Add(1, "v", 10, Lease(10));
  auto held = leases.Find(1, "v");
  ASSERT_NE(held, nullptr);
  now += std::chrono::seconds(9);
  leases.Trim();
  EXPECT_NE(leases.Find(1, "v"), nullptr) << "used or not, a lease lives its life";
  now += std::chrono::seconds(2);
  EXPECT_EQ(leases.Find(1, "v"), nullptr) << "past its life, even before Trim";
  leases.Trim();
  EXPECT_EQ(leases.files(), 0u);
  EXPECT_TRUE(Open(held->fd())) << "a READ still using a lease keeps it until it is done";
  ReadLeases kept(std::chrono::hours(1));
  kept.Add(1, "v", 10, Lease(10));
  kept.Trim();
  EXPECT_NE(kept.Find(1, "v"), nullptr);
  kept.Clear();
  EXPECT_EQ(kept.files(), 0u);
}

}  // namespace
}  // namespace granary::fuse
