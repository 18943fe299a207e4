#include "master/cluster.h"

#include <gtest/gtest.h>

#include <tuple>

namespace granary::master {
namespace {

// A worker's stats holding, of `mount`, `held` bytes of which `elastic` are elastic copies and
// `home` are blocks it is the home of (one block per 100 bytes, for the block counts).
rpc::WorkerStats Holding(uint64_t mount, uint64_t held, uint64_t elastic, uint64_t home) {
  rpc::WorkerStats s;
  rpc::MountCounters& c = (*s.mutable_mount_counters())[mount];
  c.set_held_bytes(held);
  c.set_held_blocks(held / 100);
  c.set_elastic_bytes(elastic);
  c.set_home_bytes(home);
  c.set_home_blocks(home / 100);
  return s;
}

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  Cluster::Clock fn() {
    return [this] { return now; };
  }
};

// cached_bytes, cached_blocks, replica_bytes, elastic_bytes of a mount, as the report gives them.
std::tuple<uint64_t, uint64_t, uint64_t, uint64_t> Usage(Cluster& c, uint64_t mount) {
  rpc::Report r;
  rpc::MountReport mr;
  mr.mutable_mount()->set_id(mount);
  c.FillReport(&r, {&mr});
  return {mr.cached_bytes(), mr.cached_blocks(), mr.replica_bytes(), mr.elastic_bytes()};
}

uint64_t Register(Cluster& c, const std::string& address, rpc::WorkerStats stats = {}) {
  rpc::RegisterWorkerRequest w;
  w.set_address(address);
  *w.mutable_stats() = std::move(stats);
  return c.RegisterWorker(w);
}

// Each block counts once in cached_bytes (at its home); every copy counts in replica or elastic
// bytes; mounts are kept apart; the figures follow the latest stats of each worker.
TEST(Cluster, SumsTheWorkersCountersPerMount) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  uint64_t a = Register(c, "a:1", Holding(7, 300, 0, 200));  // 3 blocks, home of 2
  uint64_t b = Register(c, "b:1");
  EXPECT_NE(a, b);
  EXPECT_EQ(Usage(c, 7), std::make_tuple(uint64_t{200}, uint64_t{2}, uint64_t{300}, uint64_t{0}));
  // b holds a replica of one of a's blocks, is the home of the third, and keeps an elastic copy.
  rpc::WorkerStats sb = Holding(7, 300, 100, 100);
  (*sb.mutable_mount_counters())[8] = Holding(8, 50, 0, 50).mount_counters().at(8);
  EXPECT_TRUE(c.Heartbeat(b, sb));
  EXPECT_EQ(Usage(c, 7), std::make_tuple(uint64_t{300}, uint64_t{3}, uint64_t{500}, uint64_t{100}));
  EXPECT_EQ(Usage(c, 8), std::make_tuple(uint64_t{50}, uint64_t{0}, uint64_t{50}, uint64_t{0}));
  EXPECT_EQ(Usage(c, 9), std::make_tuple(uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{0})) << "a mount no worker holds";
  EXPECT_TRUE(c.Heartbeat(a, Holding(7, 100, 0, 0)));  // a evicted two blocks; its last is b's
  EXPECT_EQ(Usage(c, 7), std::make_tuple(uint64_t{100}, uint64_t{1}, uint64_t{300}, uint64_t{100}));
}

// A worker that goes silent stops counting within worker_timeout and must register again; its
// registration (no block list, only its counters) brings the figures back at once — as after a
// master restart.
TEST(Cluster, SilentWorkersStopCounting) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  uint64_t id = Register(c, "a:1", Holding(1, 1000, 0, 1000));
  clk.now += std::chrono::seconds(5);
  EXPECT_TRUE(c.Heartbeat(id, Holding(1, 1000, 0, 1000)));
  c.ExpireWorkers();
  EXPECT_EQ(std::get<0>(Usage(c, 1)), 1000u);
  clk.now += std::chrono::seconds(11);
  c.ExpireWorkers();
  EXPECT_EQ(Usage(c, 1), std::make_tuple(uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{0}));
  EXPECT_TRUE(c.AliveWorkers().empty());
  EXPECT_FALSE(c.Heartbeat(id, {})) << "a lost worker must re-register";
  EXPECT_FALSE(c.Heartbeat(999, {}));
  Register(c, "a:1", Holding(1, 1000, 0, 1000));
  EXPECT_EQ(std::get<0>(Usage(c, 1)), 1000u);

  Cluster restarted(std::chrono::seconds(10), clk.fn());
  EXPECT_FALSE(restarted.Heartbeat(id, {})) << "a restarted master asks its workers to register";
  // Another worker registers first and gets an id the old master had given "a:1": a's heartbeat
  // with its old id is refused, not taken as b's.
  uint64_t b = Register(restarted, "b:1", Holding(1, 10, 0, 10));
  EXPECT_FALSE(restarted.Heartbeat(b, Holding(1, 1000, 0, 1000), "a:1"));
  EXPECT_TRUE(restarted.Heartbeat(b, Holding(1, 10, 0, 10), "b:1"));
  Register(restarted, "a:1", Holding(1, 1000, 0, 1000));
  EXPECT_EQ(std::get<0>(Usage(restarted, 1)), 1010u);
}

TEST(Cluster, ReRegisteringReplacesTheOldEntry) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  Register(c, "a:1", Holding(1, 100, 0, 100));
  Register(c, "a:1");
  EXPECT_EQ(Usage(c, 1), std::make_tuple(uint64_t{0}, uint64_t{0}, uint64_t{0}, uint64_t{0})) << "the old entry's counters are gone";
  rpc::Report r;
  c.FillReport(&r, {});
  EXPECT_EQ(r.workers_size(), 1);
}

// The membership travels only when it changed since the epoch the caller has.
TEST(Cluster, MembershipTravelsOnlyWhenItChanged) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  uint64_t a = Register(c, "a:1");
  google::protobuf::RepeatedPtrField<rpc::PeerInfo> got;
  uint64_t e1 = c.Members(0, &got);
  ASSERT_EQ(got.size(), 1);
  EXPECT_EQ(got[0].id(), a);
  got.Clear();
  EXPECT_EQ(c.Members(e1, &got), e1);
  EXPECT_TRUE(got.empty()) << "unchanged: nothing sent";
  Register(c, "b:1");
  uint64_t e2 = c.Members(e1, &got);
  EXPECT_NE(e2, e1);
  EXPECT_EQ(got.size(), 2);
  got.Clear();
  clk.now += std::chrono::seconds(11);
  EXPECT_TRUE(c.Heartbeat(a, {}));
  c.ExpireWorkers();  // b died
  uint64_t e3 = c.Members(e2, &got);
  EXPECT_NE(e3, e2);
  ASSERT_EQ(got.size(), 1);
  EXPECT_EQ(got[0].id(), a);
  EXPECT_NE(Cluster(std::chrono::seconds(10), clk.fn()).Members(0, &got), e3)
      << "a restarted master's epochs are new";
}

}  // namespace
}  // namespace granary::master
