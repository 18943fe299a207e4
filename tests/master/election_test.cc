// LeaderElection (master/election.h) on a fake clock against a fake etcd: who leads, terms, and
// fencing — a leader cut off from etcd stops counting itself leader before any other master can
// become one, checked at every instant of random runs.
#include "master/election.h"

#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
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
  bool refuse_leases = false;  // reaches etcd, but every Grant fails
  bool flaky = false;          // a third of the calls fail, as through a slow or overloaded etcd
  bool reads_fail = false;     // keep-alives go through, every Get fails
  std::function<void()> before_create;  // runs (once) just before a CreateIfAbsent reaches etcd

  StatusOr<int64_t> Grant(seconds ttl) override {
    RETURN_IF_ERROR(Reach());
    if (refuse_leases) return UnavailableError("no lease for this one");
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
    if (before_create) std::exchange(before_create, nullptr)();
    RETURN_IF_ERROR(Reach());
    auto it = etcd_->keys.find(key);
    if (it != etcd_->keys.end()) return it->second;
    if (etcd_->leases.count(lease) == 0) return NotFoundError("no such lease");
    ++etcd_->revision;
    EtcdKv kv{key, value, etcd_->revision, lease, etcd_->revision};
    etcd_->keys[key] = kv;
    return kv;
  }
  Status Put(const std::string& key, const std::string& value) override {
    RETURN_IF_ERROR(Reach());
    EtcdKv& kv = etcd_->keys[key];
    ++etcd_->revision;
    if (kv.create_revision == 0) kv.create_revision = etcd_->revision;
    kv.key = key;
    kv.value = value;
    kv.lease = 0;
    kv.mod_revision = etcd_->revision;
    return Status::OK();
  }
  Status DeletePrefix(const std::string& prefix) override {
    RETURN_IF_ERROR(Reach());
    bool any = false;  // etcd's revision moves only when something was deleted
    for (auto it = etcd_->keys.lower_bound(prefix); it != etcd_->keys.end() && it->first.starts_with(prefix);) {
      it = etcd_->keys.erase(it);
      any = true;
    }
    if (any) ++etcd_->revision;
    return Status::OK();
  }
  Status DeleteIfUnchanged(const std::string& key, int64_t mod_revision) override {
    RETURN_IF_ERROR(Reach());
    auto it = etcd_->keys.find(key);
    if (it != etcd_->keys.end() && it->second.mod_revision == mod_revision) {
      etcd_->keys.erase(it);
      ++etcd_->revision;
    }
    return Status::OK();
  }
  StatusOr<std::vector<EtcdKv>> List(const std::string& prefix) override {
    RETURN_IF_ERROR(Reach());
    std::vector<EtcdKv> out;
    for (auto it = etcd_->keys.lower_bound(prefix); it != etcd_->keys.end() && it->first.starts_with(prefix); ++it) {
      out.push_back(it->second);
    }
    return out;
  }
  StatusOr<std::optional<EtcdKv>> Get(const std::string& key) override {
    RETURN_IF_ERROR(Reach());
    if (reads_fail) return UnavailableError("range request timed out");
    auto it = etcd_->keys.find(key);
    if (it == etcd_->keys.end()) return std::optional<EtcdKv>();
    return std::optional<EtcdKv>(it->second);
  }

 private:
  Status Reach() {
    etcd_->Expire();
    if (flaky && rng_() % 3 == 0) return UnavailableError("timed out");
    return cut ? UnavailableError("cut off") : Status::OK();
  }
  std::mt19937 rng_{7};
  FakeEtcd* etcd_;
};

// `ranked`: the candidates compare their standing (`standing`, set by the test) before campaigning.
struct Master {
  Master(FakeEtcd* etcd, const std::string& id, Clock::time_point* now, bool ranked)
      : coord(etcd), election(&coord, Options(id, ranked ? &standing : nullptr),
                              [this](bool l, int64_t t) { changes.push_back({l, t}); }, [now] { return *now; }) {}
  static ElectionOptions Options(const std::string& id, const Standing* standing) {
    ElectionOptions o;
    o.id = id;
    o.ttl = seconds(5);
    o.margin = milliseconds(1000);
    if (standing != nullptr) o.standing = [standing] { return *standing; };
    return o;
  }
  Standing standing;
  FakeCoordinator coord;
  std::vector<std::pair<bool, int64_t>> changes;
  LeaderElection election;
  Clock::time_point next{};
};

class ElectionTest : public ::testing::Test {
 protected:
  Master* Add(const std::string& id, bool ranked = false) {
    masters_.push_back(std::make_unique<Master>(&etcd_, id, &etcd_.now, ranked));
    return masters_.back().get();
  }
  // kill -9: gone without resigning (its lease runs out in etcd).
  void Kill(Master* m) {
    m->coord.cut = true;  // its Stop() cannot revoke the lease
    for (auto it = masters_.begin(); it != masters_.end(); ++it) {
      if (it->get() == m) {
        masters_.erase(it);
        return;
      }
    }
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
  // Ranked masters: a leads at `lead`; b and c then join as standbys at `b_at` and `c_at`.
  void ThreeRanked(Standing lead, Standing b_at, Standing c_at) {
    a_ = Add("a:1", true);
    a_->standing = lead;
    RunUntil(etcd_.now + seconds(4));
    ASSERT_EQ(Leader(), a_);
    b_ = Add("b:1", true);
    c_ = Add("c:1", true);
    b_->standing = b_at;
    c_->standing = c_at;
  }
  // Runs in 50 ms steps until `done()` or `limit`; when `done()` first held (zero: never).
  Clock::time_point RunUntilTrue(const std::function<bool()>& done, Clock::time_point limit) {
    while (etcd_.now < limit) {
      RunUntil(etcd_.now + milliseconds(50));
      if (done()) return etcd_.now;
    }
    return {};
  }
  // Runs until the leader key is gone from etcd (within a minute of the test's start).
  Clock::time_point UntilTheKeyIsFree() {
    return RunUntilTrue([&] { return etcd_.keys.count("/granary/leader") == 0; }, start_ + seconds(60));
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
  Master *a_ = nullptr, *b_ = nullptr, *c_ = nullptr;  // ThreeRanked's (a_ gone once killed)
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

// The chaos run's lost writes (seed 1520329050): standby b was cut off from the leader a few seconds
// before the leader died, so it held every entry it had heard of yet lacked the last ones, which c
// had acknowledged. Whichever standby asks first, c — the copy further along — leads.
TEST_F(ElectionTest, TheCopyFurthestAlongLeadsWhicheverStandbyAsksFirst) {
  for (int offset_ms = 0; offset_ms < 2000; offset_ms += 150) {
    masters_.clear();
    etcd_ = FakeEtcd{};
    etcd_.now = start_;
    ASSERT_NO_FATAL_FAILURE(ThreeRanked({4, 1638}, {4, 1628}, {4, 1638}));
    Master *a = a_, *b = b_, *c = c_;
    // b's rounds run `offset_ms` ahead of c's.
    c->next = etcd_.now + milliseconds(offset_ms);
    RunUntil(etcd_.now + seconds(2));
    Kill(a);
    RunUntil(etcd_.now + seconds(15));
    if (HasFatalFailure()) return;
    EXPECT_EQ(Leader(), c) << "offset " << offset_ms << " ms";
    EXPECT_TRUE(b->changes.empty()) << "b led at offset " << offset_ms << " ms";
  }
}

// A candidate further along that reported and then died (its reports stop moving) is not waited
// for: the next copy leads, well before the two-lease fallback.
TEST_F(ElectionTest, ACandidateThatStopsReportingIsNotWaitedFor) {
  ASSERT_NO_FATAL_FAILURE(ThreeRanked({2, 10}, {2, 8}, {2, 10}));
  Master *a = a_, *b = b_, *c = c_;
  c->coord.refuse_leases = true;  // c reports but cannot campaign: the others wait for it...
  RunUntil(etcd_.now + seconds(1));
  Kill(a);
  const Clock::time_point free_at = UntilTheKeyIsFree();
  ASSERT_NE(free_at, Clock::time_point{});
  RunUntil(etcd_.now + seconds(2));
  EXPECT_EQ(Leader(), nullptr) << "b led while c, further along, was still reporting";
  Kill(c);  // ...until it dies: its report stops moving
  const Clock::time_point led = RunUntilTrue([&] { return b->election.IsLeader(); }, free_at + seconds(30));
  ASSERT_NE(led, Clock::time_point{}) << "b never led";
  EXPECT_LT(led - free_at, seconds(10)) << "b waited for the two-lease fallback";
}

// A candidate further along that goes on reporting but never takes the lead (here: etcd refuses it
// leases) holds the election up for two leases at most; then the next copy leads.
TEST_F(ElectionTest, ACandidateAheadThatNeverLeadsHoldsTheElectionUpForTwoLeasesAtMost) {
  ASSERT_NO_FATAL_FAILURE(ThreeRanked({2, 10}, {2, 8}, {2, 10}));
  Master *a = a_, *b = b_, *c = c_;
  c->coord.refuse_leases = true;
  RunUntil(etcd_.now + seconds(1));
  Kill(a);
  const Clock::time_point free_at = UntilTheKeyIsFree();
  ASSERT_NE(free_at, Clock::time_point{});
  RunUntil(free_at + seconds(9));  // two leases less a second
  EXPECT_EQ(Leader(), nullptr) << "b led while c, further along, was reporting";
  RunUntil(free_at + seconds(25));
  EXPECT_EQ(Leader(), b);
}

// A candidate further along that reports only after another has decided (it noticed the free key
// late: slow calls to etcd): the other, having taken the key, sees the report before it leads and
// gives the key back; the copy further along leads.
TEST_F(ElectionTest, AWinnerThatSeesACandidateFurtherAlongGivesTheKeyBack) {
  ASSERT_NO_FATAL_FAILURE(ThreeRanked({2, 10}, {2, 8}, {2, 10}));
  Master *a = a_, *b = b_, *c = c_;
  RunUntil(etcd_.now + seconds(1));
  c->coord.cut = true;  // c hears nothing of the election...
  b->coord.before_create = [&] {  // ...until b has decided: c's first report lands just before b's key
    c->coord.cut = false;
    c->next = c->election.Step();
  };
  Kill(a);
  RunUntil(etcd_.now + seconds(20));
  EXPECT_TRUE(b->changes.empty()) << "b led although c, further along, had reported";
  EXPECT_EQ(Leader(), c);
}

// etcd answering two calls in three (slow, overloaded): the election still ends within a few
// seconds, with the copy furthest along (a failed call does not restart a candidate's watch, and
// the fallback counts from when the key went free).
TEST_F(ElectionTest, AFlakyEtcdDelaysTheElectionALittleAndStillElectsTheCopyFurthestAlong) {
  ASSERT_NO_FATAL_FAILURE(ThreeRanked({2, 10}, {2, 8}, {2, 10}));
  Master *a = a_, *b = b_, *c = c_;
  b->coord.flaky = c->coord.flaky = true;
  RunUntil(etcd_.now + seconds(1));
  Kill(a);
  const Clock::time_point free_at = UntilTheKeyIsFree();
  ASSERT_NE(free_at, Clock::time_point{});
  const Clock::time_point led = RunUntilTrue([&] { return Leader() != nullptr; }, free_at + seconds(60));
  ASSERT_NE(led, Clock::time_point{}) << "nobody led within a minute";
  EXPECT_EQ(Leader(), c);
  EXPECT_LT(led - free_at, seconds(8)) << "the election dragged on";
}

// Random failovers of three ranked masters: every time the leader dies, the new leader is the
// survivor furthest along, whatever the phases of their rounds; the dead master comes back behind.
TEST_F(ElectionTest, RandomFailoversElectTheSurvivorFurthestAlong) {
  for (int seed = 1; seed <= 20; ++seed) {
    masters_.clear();
    etcd_ = FakeEtcd{};
    etcd_.now = start_;
    std::mt19937 rng(seed);
    for (const char* id : {"a:1", "b:1", "c:1"}) {
      Master* m = Add(id, true);
      m->next = etcd_.now + milliseconds(rng() % 2000);
    }
    uint64_t term = 1, index = 100;
    for (int round = 0; round < 6; ++round) {
      RunUntil(etcd_.now + seconds(12));
      if (HasFatalFailure()) return;
      Master* l = Leader();
      ASSERT_NE(l, nullptr) << "seed " << seed << " round " << round;
      // The leader writes; each standby has some prefix of what it wrote.
      term = static_cast<uint64_t>(l->election.term());
      index += 10 + rng() % 50;
      l->standing = {term, index};
      for (auto& m : masters_) {
        if (m.get() != l) m->standing = {term, index - rng() % 12};
      }
      Standing best{};
      for (auto& m : masters_) {
        if (m.get() != l) best = std::max(best, m->standing);
      }
      const std::string dead = l->election.leader();
      Kill(l);
      RunUntil(etcd_.now + seconds(15));
      if (HasFatalFailure()) return;
      Master* next = Leader();
      ASSERT_NE(next, nullptr) << "seed " << seed << " round " << round;
      EXPECT_EQ(next->standing, best) << "seed " << seed << " round " << round << ": a copy behind leads";
      // The dead one comes back with what it had (ahead of nobody: the new leader wrote since).
      Master* back = Add(dead, true);
      back->standing = {best.term, best.index - 1};
      back->next = etcd_.now + milliseconds(rng() % 2000);
      next->standing = {static_cast<uint64_t>(next->election.term()), best.index + 1};
    }
  }
}

// The reports are the election's alone: once the new leader has led for a report's life, none is
// left in etcd (a master whose address changed would leave one forever), and the next election
// still elects the copy furthest along from fresh reports.
// Issue 51: a leader key overwritten under the leader's live lease (whoever can write to etcd) made
// the standbys follow the address it named while the leader went on leading. The leader now checks
// its key at each keep-alive and steps down when it no longer holds its lease; once the foreign key
// is gone, a master leads again.
TEST_F(ElectionTest, ALeaderWhoseKeyIsOverwrittenStepsDown) {
  Master* a = Add("a:1");
  Add("b:1");
  RunUntil(etcd_.now + seconds(3));
  ASSERT_EQ(Leader(), a);
  FakeCoordinator attacker(&etcd_);
  ASSERT_TRUE(attacker.Put("/granary/leader", "evil:1").ok());
  // The leader steps down (the key names another), and the key, which has no lease (no master's
  // ever lacks one), is removed by the masters: one leads again under a key of its own.
  const Clock::time_point back = RunUntilTrue(
      [&] {
        auto it = etcd_.keys.find("/granary/leader");
        return Leader() != nullptr && it != etcd_.keys.end() && it->second.lease != 0 && it->second.value != "evil:1";
      },
      etcd_.now + seconds(30));
  EXPECT_NE(back, Clock::time_point{}) << "a lease-less key stopped the elections";
  ASSERT_GE(a->changes.size(), 2u);
  EXPECT_FALSE(a->changes[1].first) << "the leader kept leading under a key that names another";
  // One with a lease is a master's to end: it stays until its lease does (an attacker holding a
  // live lease is what the etcd TLS and the leader's proof are for, docs/security.md).
}

TEST_F(ElectionTest, ALeaderThatCannotReadItsKeyBackStepsDownBeforeTheOthersElect) {
  Master* a = Add("a:1");
  Add("b:1");
  Add("c:1");
  RunUntil(etcd_.now + seconds(3));
  ASSERT_EQ(Leader(), a);
  // Its keep-alives still go through, but it can no longer read the key that an intruder overwrote
  // without a lease: the others remove that key after a ttl and elect. RunUntil fails on two leaders
  // at once (the fence was extended by the keep-alives alone before the fix).
  a->coord.reads_fail = true;
  FakeCoordinator attacker(&etcd_);
  ASSERT_TRUE(attacker.Put("/granary/leader", "evil:1").ok());
  const Clock::time_point other = RunUntilTrue([&] { return Leader() != nullptr && Leader() != a; }, etcd_.now + seconds(30));
  EXPECT_NE(other, Clock::time_point{}) << "no other master led";
  ASSERT_GE(a->changes.size(), 2u);
  EXPECT_FALSE(a->changes[1].first);
}

TEST_F(ElectionTest, TheLeaderDeletesTheElectionsReports) {
  auto reports = [&] {
    int n = 0;
    for (const auto& [k, kv] : etcd_.keys) n += k.starts_with("/granary/leader/candidates/");
    return n;
  };
  ASSERT_NO_FATAL_FAILURE(ThreeRanked({2, 10}, {2, 8}, {2, 10}));
  Master *b = b_, *c = c_;
  RunUntil(etcd_.now + seconds(1));
  EXPECT_EQ(reports(), 0) << "a's report of its own election is still there after 5 s of its lead";
  Kill(a_);
  ASSERT_NE(RunUntilTrue([&] { return reports() == 2; }, etcd_.now + seconds(15)), Clock::time_point{})
      << "b and c never reported";
  const Clock::time_point led = RunUntilTrue([&] { return Leader() != nullptr; }, etcd_.now + seconds(15));
  ASSERT_NE(led, Clock::time_point{});
  ASSERT_EQ(Leader(), c);
  EXPECT_EQ(reports(), 2) << "the reports went before the other candidates could see the key held";
  RunUntil(led + seconds(3) + seconds(5) / 3 + milliseconds(100));  // a report's life and a keep-alive
  EXPECT_EQ(reports(), 0);
  RunUntil(etcd_.now + seconds(20));
  EXPECT_EQ(reports(), 0) << "a standby reported while the key was held";
  // The next election, from fresh reports: a new standby d is further along than b.
  b->standing = {3, 20};
  Master* d = Add("d:1", true);
  d->standing = {3, 25};
  RunUntil(etcd_.now + seconds(3));
  Kill(c);
  RunUntil(etcd_.now + seconds(15));
  EXPECT_EQ(Leader(), d);
  EXPECT_TRUE(b->changes.empty());
}

}  // namespace
}  // namespace granary::master
