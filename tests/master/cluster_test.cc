#include "master/cluster.h"

#include <gtest/gtest.h>

#include <tuple>

namespace granary::master {
namespace {

rpc::BlockRef Block(const std::string& key, uint64_t index, uint64_t mount, uint64_t len) {
  rpc::BlockRef b;
  b.set_file_key(key);
  b.set_index(index);
  b.set_mount_id(mount);
  b.set_length(len);
  return b;
}

struct FakeClock {
  std::chrono::steady_clock::time_point now{};
  Cluster::Clock fn() {
    return [this] { return now; };
  }
};

uint64_t CachedBytes(Cluster& c, uint64_t mount) {
  rpc::Report r;
  rpc::MountReport mr;
  mr.mutable_mount()->set_id(mount);
  c.FillReport(&r, {&mr});
  return mr.cached_bytes();
}

TEST(Cluster, TracksBlocksPerMountOnce) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  rpc::RegisterWorkerRequest w1;
  w1.set_address("a:1");
  *w1.add_blocks() = Block("k1", 0, 7, 100);
  uint64_t id1 = c.RegisterWorker(w1);
  rpc::RegisterWorkerRequest w2;
  w2.set_address("b:1");
  uint64_t id2 = c.RegisterWorker(w2);
  EXPECT_NE(id1, id2);
  rpc::ReportBlocksRequest rep;
  rep.set_worker_id(id2);
  *rep.add_added() = Block("k1", 0, 7, 100);  // a second replica: not counted twice
  *rep.add_added() = Block("k1", 1, 7, 50);
  EXPECT_TRUE(c.ReportBlocks(rep));
  EXPECT_EQ(CachedBytes(c, 7), 150u);
  EXPECT_EQ(c.Holders("k1", 0).size(), 2u);

  rpc::ReportBlocksRequest rm;
  rm.set_worker_id(id2);
  *rm.add_removed() = Block("k1", 1, 7, 50);
  EXPECT_TRUE(c.ReportBlocks(rm));
  EXPECT_EQ(CachedBytes(c, 7), 100u);
  c.DropMount(7);
  EXPECT_EQ(CachedBytes(c, 7), 0u);
}

// Replica and elastic copies are counted apart; a block reported again with the other kind moves,
// and a worker that goes silent takes both kinds with it.
TEST(Cluster, ReplicaAndElasticBytesApart) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  rpc::RegisterWorkerRequest w;
  w.set_address("a:1");
  uint64_t a = c.RegisterWorker(w);
  w.set_address("b:1");
  uint64_t b = c.RegisterWorker(w);
  auto report = [&](uint64_t worker, rpc::BlockRef blk, bool elastic, bool add = true) {
    rpc::ReportBlocksRequest r;
    r.set_worker_id(worker);
    blk.set_elastic(elastic);
    *(add ? r.add_added() : r.add_removed()) = blk;
    EXPECT_TRUE(c.ReportBlocks(r));
  };
  auto usage = [&] {
    rpc::Report r;
    rpc::MountReport mr;
    mr.mutable_mount()->set_id(7);
    c.FillReport(&r, {&mr});
    return std::make_tuple(mr.cached_bytes(), mr.replica_bytes(), mr.elastic_bytes());
  };
  report(a, Block("k", 0, 7, 100), false);
  report(b, Block("k", 0, 7, 100), true);
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{100}, uint64_t{100}, uint64_t{100}));
  EXPECT_EQ(c.Holders("k", 0), std::vector<uint64_t>{a});
  EXPECT_EQ(c.ElasticHolders("k", 0), std::vector<uint64_t>{b});
  Cluster::Cached cached;
  c.CachedOf("k", 100, 100, &cached);
  EXPECT_EQ(cached.distinct, 100u);
  EXPECT_EQ(cached.replica, 100u);
  EXPECT_EQ(cached.elastic, 100u);
  report(a, Block("k", 0, 7, 100), true);  // a membership change made a's copy elastic
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{100}, uint64_t{0}, uint64_t{200}));
  EXPECT_TRUE(c.Holders("k", 0).empty());
  report(b, Block("k", 0, 7, 100), false);  // and b's a replica
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{100}, uint64_t{100}, uint64_t{100}));
  report(a, Block("k", 0, 7, 100), true, /*add=*/false);
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{100}, uint64_t{100}, uint64_t{0}));
  clk.now += std::chrono::seconds(11);
  c.ExpireWorkers();
  EXPECT_EQ(usage(), std::make_tuple(uint64_t{0}, uint64_t{0}, uint64_t{0}));
}

TEST(Cluster, SilentWorkersLoseTheirBlocks) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  rpc::RegisterWorkerRequest w;
  w.set_address("a:1");
  *w.add_blocks() = Block("k", 0, 1, 10);
  uint64_t id = c.RegisterWorker(w);
  clk.now += std::chrono::seconds(5);
  EXPECT_TRUE(c.Heartbeat(id, {}));
  c.ExpireWorkers();
  EXPECT_EQ(c.Holders("k", 0).size(), 1u);
  clk.now += std::chrono::seconds(11);
  c.ExpireWorkers();
  EXPECT_TRUE(c.Holders("k", 0).empty());
  EXPECT_FALSE(c.Heartbeat(id, {})) << "a lost worker must re-register";
  EXPECT_FALSE(c.Heartbeat(999, {}));
}

TEST(Cluster, ReRegisteringReplacesTheOldEntry) {
  FakeClock clk;
  Cluster c(std::chrono::seconds(10), clk.fn());
  rpc::RegisterWorkerRequest w;
  w.set_address("a:1");
  *w.add_blocks() = Block("k", 0, 1, 10);
  c.RegisterWorker(w);
  w.clear_blocks();
  c.RegisterWorker(w);
  EXPECT_TRUE(c.Holders("k", 0).empty());
  rpc::Report r;
  c.FillReport(&r, {});
  EXPECT_EQ(r.workers_size(), 1);
}

}  // namespace
}  // namespace granary::master
