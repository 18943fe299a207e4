// LeaderElection (master/election.h) on a fake clock against a fake etcd: who leads, terms, and
// fencing — a leader cut off from etcd stops counting itself leader before any other master can
// become one, checked at every instant of random runs.
#include "master/election.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace granary::master {
namespace {

using Clock = LeaderElection::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// etcd as the election sees it: leases that expire `ttl` after their last renewal on the shared
// fake clock, keys bound to them, and a revision counter.
struct FakeEtcd {
  Clock::time_point now{};
  int64_t revision = 1;
  int64_t next_lease = 100;
  std::map<int64_t, std::pair<Clock::time_point, seconds>> leases;  // id -> (expiry, ttl)
  std::map<std::string, EtcdKv> keys;

  void Expire() {
    for (auto it = leases.begin(); it != leases.end();) {
      if (now < it->second.first) {
        ++it;
        continue;
      }
      for (auto k = keys.begin(); k != keys.end();) k = k->second.lease == it->first ? keys.erase(k) : std::next(k);
      it = leases.erase(it);
      ++revision;
    }
  }
};

// One master's connection to the fake etcd; `cut` makes every call fail as a partition would.
class FakeCoordinator : public Coordinator {
 public:
  explicit FakeCoordinator(FakeEtcd* etcd) : etcd_(etcd) {}
  bool cut = false;

  StatusOr<int64_t> Grant(seconds ttl) override {
    RETURN_IF_ERROR(Reach());
    const int64_t id = etcd_->next_lease++;
    etcd_->leases[id] = {etcd_->now + ttl, ttl};
    return id;
  }
  StatusOr<int64_t> KeepAlive(int64_t lease) override {
    RETURN_IF_ERROR(Reach());
    auto it = etcd_->leases.find(lease);
    if (it == etcd_->leases.end()) return NotFoundError("expired");
    it->second.first = etcd_->now + it->second.second;
    return it->second.second.count();
  }
  Status Revoke(int64_t lease) override {
    RETURN_IF_ERROR(Reach());
    if (etcd_->leases.count(lease) != 0) etcd_->leases[lease].first = etcd_->now;
    etcd_->Expire();
    return Status::OK();
  }
  StatusOr<EtcdKv> CreateIfAbsent(const std::string& key, const std::string& value, int64_t lease) override {
    RETURN_IF_ERROR(Reach());
    auto it = etcd_->keys.find(key);
    if (it != etcd_->keys.end()) return it->second;
    if (etcd_->leases.count(lease) == 0) return NotFoundError("no such lease");
    EtcdKv kv{key, value, ++etcd_->revision, lease};
    etcd_->keys[key] = kv;
    return kv;
  }
  StatusOr<std::optional<EtcdKv>> Get(const std::string& key) override {
    RETURN_IF_ERROR(Reach());
    auto it = etcd_->keys.find(key);
    if (it == etcd_->keys.end()) return std::optional<EtcdKv>();
    return std::optional<EtcdKv>(it->second);
  }

 private:
  Status Reach() {
    etcd_->Expire();
    return cut ? UnavailableError("cut off") : Status::OK();
  }
  FakeEtcd* etcd_;
};

struct Master {
  Master(FakeEtcd* etcd, const std::string& id, Clock::time_point* now)
      : coord(etcd), election(&coord, Options(id), [this](bool l, int64_t t) { changes.push_back({l, t}); },
                              [now] { return *now; }) {}
  static ElectionOptions Options(const std::string& id) {
    ElectionOptions o;
    o.id = id;
    o.ttl = seconds(5);
    o.margin = milliseconds(1000);
    return o;
  }
  FakeCoordinator coord;
  std::vector<std::pair<bool, int64_t>> changes;
  LeaderElection election;
  Clock::time_point next{};
};

class ElectionTest : public ::testing::Test {
 protected:
  Master* Add(const std::string& id) {
    masters_.push_back(std::make_unique<Master>(&etcd_, id, &etcd_.now));
    return masters_.back().get();
  }
  // Advances the clock to `until` in steps of `tick`, running each master's rounds when due, and
  // checks at every instant that at most one master counts itself leader.
  void RunUntil(Clock::time_point until, milliseconds tick = milliseconds(50)) {
    while (etcd_.now < until) {
      etcd_.now += tick;
      etcd_.Expire();
      for (auto& m : masters_) {
        if (etcd_.now >= m->next) m->next = m->election.Step();
      }
      int leaders = 0;
      for (auto& m : masters_) leaders += m->election.IsLeader();
      ASSERT_LE(leaders, 1) << "two leaders at once, " << (etcd_.now - start_) / milliseconds(1) << " ms in";
    }
  }
  Master* Leader() {
    for (auto& m : masters_) {
      if (m->election.IsLeader()) return m.get();
    }
    return nullptr;
  }

  FakeEtcd etcd_;
  Clock::time_point start_ = etcd_.now;
  std::vector<std::unique_ptr<Master>> masters_;
};

TEST_F(ElectionTest, OneLeadsAndTheOthersKnowWho) {
  Master* a = Add("a:1");
  Master* b = Add("b:1");
  Master* c = Add("c:1");
  RunUntil(etcd_.now + seconds(3));
  Master* l = Leader();
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l, a) << "the first to campaign leads";
  EXPECT_GT(a->election.term(), 0);
  EXPECT_EQ(b->election.term(), 0);
  EXPECT_EQ(b->election.leader(), "a:1");
  EXPECT_EQ(c->election.leader(), "a:1");
  ASSERT_EQ(a->changes.size(), 1u);
  EXPECT_TRUE(a->changes[0].first);
  // Kept alive, it goes on leading.
  RunUntil(etcd_.now + seconds(60));
  EXPECT_EQ(Leader(), a);
  EXPECT_EQ(a->changes.size(), 1u);
  EXPECT_TRUE(b->changes.empty());
}

// The fence: cut off from etcd, the leader stops counting itself leader (ttl - margin after its last
// keep-alive was sent) before etcd ends its lease, so before another master can lead; the new
// leader's term is larger.
TEST_F(ElectionTest, ALeaderCutOffStepsDownBeforeAnotherLeads) {
  Master* a = Add("a:1");
  Master* b = Add("b:1");
  RunUntil(etcd_.now + seconds(2));
  ASSERT_EQ(Leader(), a);
  const int64_t first_term = a->election.term();
  a->coord.cut = true;
  const Clock::time_point cut_at = etcd_.now;
  Clock::time_point a_stopped{}, b_started{};
  while (etcd_.now < cut_at + seconds(20) && (a_stopped == Clock::time_point{} || b_started == Clock::time_point{})) {
    RunUntil(etcd_.now + milliseconds(10), milliseconds(10));
    if (a_stopped == Clock::time_point{} && !a->election.IsLeader()) a_stopped = etcd_.now;
    if (b_started == Clock::time_point{} && b->election.IsLeader()) b_started = etcd_.now;
  }
  ASSERT_NE(a_stopped, Clock::time_point{});
  ASSERT_NE(b_started, Clock::time_point{}) << "the standby never took over";
  EXPECT_LT(a_stopped, b_started);
  EXPECT_LE(b_started - cut_at, seconds(5) + milliseconds(5000) / 3 + milliseconds(100)) << "failover within ttl and a poll";
  EXPECT_GT(b->election.term(), first_term);
  // A comes back: it is a standby and knows who leads.
  a->coord.cut = false;
  RunUntil(etcd_.now + seconds(3));
  EXPECT_EQ(Leader(), b);
  EXPECT_EQ(a->election.leader(), "b:1");
  ASSERT_EQ(a->changes.size(), 2u);
  EXPECT_FALSE(a->changes[1].first);
}

TEST_F(ElectionTest, AStoppedLeaderResignsAndAStandbyLeadsAtItsNextRound) {
  Master* a = Add("a:1");
  Master* b = Add("b:1");
  RunUntil(etcd_.now + seconds(2));
  ASSERT_EQ(Leader(), a);
  a->election.Stop();
  EXPECT_FALSE(a->election.IsLeader());
  const Clock::time_point stopped = etcd_.now;
  masters_.erase(masters_.begin());
  RunUntil(etcd_.now + seconds(2));
  EXPECT_EQ(Leader(), b);
  EXPECT_LE(b->election.since() - stopped, milliseconds(5000) / 3 + milliseconds(100));
}

// etcd unreachable for everyone for 30 s: the leader steps down at its fence and nobody leads
// meanwhile; once etcd is back, a leader is elected by itself.
TEST_F(ElectionTest, EtcdDownForAWhileThenALeaderAgain) {
  Master* a = Add("a:1");
  Master* b = Add("b:1");
  RunUntil(etcd_.now + seconds(2));
  ASSERT_EQ(Leader(), a);
  a->coord.cut = b->coord.cut = true;
  RunUntil(etcd_.now + seconds(30));
  EXPECT_EQ(Leader(), nullptr);
  a->coord.cut = b->coord.cut = false;
  RunUntil(etcd_.now + seconds(10));
  EXPECT_NE(Leader(), nullptr);
}

// Random cuts and reconnections of three masters over ten minutes of fake time: never two leaders
// at once (RunUntil checks every 50 ms), the terms of successive leaders only grow, and whenever
// everyone has been connected for two ttls, someone leads.
TEST_F(ElectionTest, RandomPartitionsNeverMakeTwoLeaders) {
  for (int seed = 1; seed <= 5; ++seed) {
    masters_.clear();
    etcd_ = FakeEtcd{};
    etcd_.now = start_;
    std::mt19937 rng(seed);
    Add("a:1");
    Add("b:1");
    Add("c:1");
    int64_t last_term = 0;
    for (int round = 0; round < 120; ++round) {
      for (auto& m : masters_) m->coord.cut = rng() % 4 == 0;
      RunUntil(etcd_.now + milliseconds(500 + rng() % 5000));
      if (HasFatalFailure()) return;
      if (Master* l = Leader()) {
        EXPECT_GE(l->election.term(), last_term) << "seed " << seed;
        last_term = l->election.term();
      }
    }
    for (auto& m : masters_) m->coord.cut = false;
    RunUntil(etcd_.now + seconds(10));
    EXPECT_NE(Leader(), nullptr) << "seed " << seed;
  }
}

}  // namespace
}  // namespace granary::master
