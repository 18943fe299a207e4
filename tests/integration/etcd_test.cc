// The masters' etcd client and leader election (master/etcd.h, master/election.h) against a real
// 3-member etcd on loopback (scripts/etcd.sh): the wire, bad endpoints, a member down, and a leader
// cut off from etcd replaced by a standby, with real time.
#include <gtest/gtest.h>

#include <atomic>
#include <sstream>

#include "master/election.h"
#include "master/etcd.h"
#include "tests/testutil/testutil.h"

namespace granary::master {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

std::vector<std::string> Split(const std::string& csv) {
  std::vector<std::string> out;
  std::stringstream in(csv);
  for (std::string s; std::getline(in, s, ',');) out.push_back(s);
  return out;
}

// An endpoint nothing listens on: a port the OS gave and took back.
std::string ClosedEndpoint() {
  testing::RunResult r = testing::RunCommand({"python3", "-c",
                                              "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
                                              "print(s.getsockname()[1])"});
  std::string port = r.out.substr(0, r.out.find('\n'));
  return "https://127.0.0.1:" + port;
}

class EtcdTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    testing::RunResult r = testing::RunCommand(
        {"bash", testing::SourceDir() + "/scripts/etcd.sh", "start", *dir_ / "etcd", "3"}, {}, seconds(60));
    const size_t at = r.out.rfind("READY ");
    if (r.code == 0 && at != std::string::npos) {
      std::string list = r.out.substr(at + 6);
      list = list.substr(0, list.find('\n'));
      endpoints_ = Split(list);
      // scripts/etcd.sh serves TLS with client certificates, and says where they are.
      const size_t tls = r.out.rfind("TLS ");
      if (tls != std::string::npos) {
        std::string d = r.out.substr(tls + 4);
        d = d.substr(0, d.find('\n'));
        tls_ = {d + "/ca.pem", d + "/client.pem", d + "/client-key.pem", false};
      }
    } else {
      log_ = r.out;
    }
  }
  static void TearDownTestSuite() {
    testing::RunCommand({"bash", testing::SourceDir() + "/scripts/etcd.sh", "stop", *dir_ / "etcd"});
    delete dir_;
  }
  void SetUp() override { ASSERT_EQ(endpoints_.size(), 3u) << "etcd did not start:\n" << log_; }
  std::unique_ptr<EtcdClient> Client(std::vector<std::string> endpoints = {}) {
    auto c = EtcdClient::Create(endpoints.empty() ? endpoints_ : endpoints, seconds(2), tls_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }

  static testing::TempDir* dir_;
  static std::vector<std::string> endpoints_;
  static std::string log_;
  static EtcdTls tls_;
};
EtcdTls EtcdTest::tls_;
testing::TempDir* EtcdTest::dir_ = nullptr;
std::vector<std::string> EtcdTest::endpoints_;
std::string EtcdTest::log_;

TEST_F(EtcdTest, LeasesAndACreateIfAbsentOverTheGateway) {
  auto c = Client();
  ASSERT_NE(c, nullptr);
  const std::string key = std::string("/granary/test/\x01\xff key", 20);  // any bytes survive base64
  auto mine = c->Grant(seconds(10));
  auto theirs = c->Grant(seconds(10));
  ASSERT_TRUE(mine.ok() && theirs.ok()) << mine.status().ToString();
  auto created = c->CreateIfAbsent(key, "a:1", *mine);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  EXPECT_EQ(created->lease, *mine);
  EXPECT_EQ(created->value, "a:1");
  EXPECT_GT(created->create_revision, 0);
  auto held = c->CreateIfAbsent(key, "b:1", *theirs);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  EXPECT_EQ(held->value, "a:1") << "the holder's key, not ours";
  EXPECT_EQ(held->lease, *mine);
  EXPECT_EQ(held->create_revision, created->create_revision);
  auto got = c->Get(key);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->key, key);
  auto ttl = c->KeepAlive(*mine);
  ASSERT_TRUE(ttl.ok()) << ttl.status().ToString();
  EXPECT_GT(*ttl, 0);
  ASSERT_TRUE(c->Revoke(*mine).ok());
  EXPECT_EQ(c->KeepAlive(*mine).status().code(), Code::kNotFound);
  got = c->Get(key);
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value()) << "the key went with its lease";
  auto again = c->CreateIfAbsent(key, "b:1", *theirs);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->value, "b:1");
  EXPECT_GT(again->create_revision, created->create_revision) << "a later leader's term is larger";
  ASSERT_TRUE(c->Revoke(*theirs).ok());
}

// The candidates' reports (master/election.h, "Which master"): a plain Put, and a List of one
// prefix only (its range end computed from the prefix, also past a 0xff byte), each key with a
// mod_revision that every Put moves, even of the same value.
TEST_F(EtcdTest, PutsDeletesAndAPrefixListOverTheGateway) {
  auto c = Client();
  ASSERT_NE(c, nullptr);
  const std::string prefix = "/granary/test/candidates/";
  ASSERT_TRUE(c->Put(prefix + "a:1", "4/1638").ok());
  ASSERT_TRUE(c->Put(prefix + "b:1", "4/1628").ok());
  ASSERT_TRUE(c->Put("/granary/test/candidates0", "not under the prefix").ok());
  ASSERT_TRUE(c->Put("/granary/test/candidate", "nor this").ok());
  auto all = c->List(prefix);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].key, prefix + "a:1");
  EXPECT_EQ((*all)[0].value, "4/1638");
  EXPECT_EQ((*all)[1].key, prefix + "b:1");
  const int64_t before = (*all)[0].mod_revision;
  EXPECT_GT(before, 0);
  ASSERT_TRUE(c->Put(prefix + "a:1", "4/1638").ok());
  all = c->List(prefix);
  ASSERT_TRUE(all.ok() && all->size() == 2u);
  EXPECT_GT((*all)[0].mod_revision, before) << "the same value put again moves the revision";
  const std::string ff = std::string("/granary/test/\xff", 15);
  ASSERT_TRUE(c->Put(ff + "x", "1/1").ok());
  auto odd = c->List(ff);
  ASSERT_TRUE(odd.ok()) << odd.status().ToString();
  ASSERT_EQ(odd->size(), 1u);
  EXPECT_EQ((*odd)[0].key, ff + "x");
  EXPECT_EQ(c->List("").status().code(), Code::kInvalidArgument);
  // A prefix delete removes the keys under the prefix and no other; nothing left is no error.
  ASSERT_TRUE(c->DeletePrefix(prefix).ok());
  all = c->List(prefix);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_TRUE(all->empty());
  EXPECT_TRUE(c->DeletePrefix(prefix).ok());
  for (const char* k : {"/granary/test/candidates0", "/granary/test/candidate"}) {
    auto other = c->Get(k);
    ASSERT_TRUE(other.ok()) << other.status().ToString();
    EXPECT_TRUE(other->has_value()) << "a delete of " << prefix << " took " << k;
  }
  EXPECT_EQ(c->DeletePrefix("").code(), Code::kInvalidArgument);
}

TEST_F(EtcdTest, BadEndpointsGetClearErrors) {
  EXPECT_EQ(EtcdClient::Create({}, seconds(1), tls_).status().code(), Code::kInvalidArgument);
  // Plain HTTP only when asked for (issue 51): the refusal says how to set TLS up, or opt out.
  auto plain = EtcdClient::Create({"http://127.0.0.1:2379"}, seconds(1), tls_);
  EXPECT_EQ(plain.status().code(), Code::kInvalidArgument);
  EXPECT_NE(plain.status().message().find("master.etcd_allow_plaintext"), std::string::npos) << plain.status().message();
  EXPECT_NE(plain.status().message().find("master.etcd_tls_cert"), std::string::npos) << plain.status().message();
  EXPECT_TRUE(EtcdClient::Create({"http://127.0.0.1:2379"}, seconds(1), EtcdTls{"", "", "", true}).ok());
  EXPECT_EQ(EtcdClient::Create({"https://127.0.0.1"}, seconds(1), tls_).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({"https://127.0.0.1:99999"}, seconds(1), tls_).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create(endpoints_, seconds(1), EtcdTls{tls_.ca, tls_.cert, "", false}).status().code(),
            Code::kInvalidArgument)
      << "a certificate without its key";
  auto unreadable = EtcdClient::Create(endpoints_, seconds(1), EtcdTls{tls_.ca + ".missing", tls_.cert, tls_.key, false});
  EXPECT_EQ(unreadable.status().code(), Code::kInvalidArgument);
  EXPECT_NE(unreadable.status().message().find("master.etcd_tls_ca"), std::string::npos) << unreadable.status().message();
  // No client certificate: etcd (--client-cert-auth) answers nothing, and the error says where.
  auto anonymous = EtcdClient::Create(endpoints_, seconds(2), EtcdTls{tls_.ca, "", "", false});
  ASSERT_TRUE(anonymous.ok()) << anonymous.status().ToString();
  auto refused = (*anonymous)->Grant(seconds(5));
  EXPECT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("https://127.0.0.1:"), std::string::npos) << refused.status().message();
  const std::string closed = ClosedEndpoint();
  auto down = Client({closed});
  ASSERT_NE(down, nullptr);
  auto g = down->Grant(seconds(5));
  EXPECT_EQ(g.status().code(), Code::kUnavailable);
  EXPECT_NE(g.status().message().find(closed.substr(8)), std::string::npos) << g.status().message();
  // A dead endpoint first in the list: the next one answers.
  std::vector<std::string> list = {closed};
  list.insert(list.end(), endpoints_.begin(), endpoints_.end());
  auto c = Client(list);
  ASSERT_NE(c, nullptr);
  auto lease = c->Grant(seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_TRUE(c->Revoke(*lease).ok());
}

// etcd to one master: a switch that cuts it off (every call UNAVAILABLE), as a partition would.
class Cuttable : public Coordinator {
 public:
  explicit Cuttable(Coordinator* real) : real_(real) {}
  std::atomic<bool> cut{false};
  StatusOr<int64_t> Grant(seconds ttl) override { return cut ? Cut() : real_->Grant(ttl); }
  StatusOr<int64_t> KeepAlive(int64_t lease) override { return cut ? Cut() : real_->KeepAlive(lease); }
  Status Revoke(int64_t lease) override { return cut ? Cut() : real_->Revoke(lease); }
  StatusOr<EtcdKv> CreateIfAbsent(const std::string& k, const std::string& v, int64_t lease) override {
    if (cut) return Cut();
    return real_->CreateIfAbsent(k, v, lease);
  }
  StatusOr<std::optional<EtcdKv>> Get(const std::string& k) override {
    if (cut) return Cut();
    return real_->Get(k);
  }
  Status Put(const std::string& k, const std::string& v) override { return cut ? Cut() : real_->Put(k, v); }
  Status DeletePrefix(const std::string& p) override { return cut ? Cut() : real_->DeletePrefix(p); }
  Status DeleteIfUnchanged(const std::string& k, int64_t rev) override {
    return cut ? Cut() : real_->DeleteIfUnchanged(k, rev);
  }
  StatusOr<std::vector<EtcdKv>> List(const std::string& prefix) override {
    if (cut) return Cut();
    return real_->List(prefix);
  }

 private:
  static Status Cut() { return UnavailableError("cut off"); }
  Coordinator* real_;
};

ElectionOptions Options(const std::string& id) {
  ElectionOptions o;
  o.key = "/granary/test/leader";
  o.id = id;
  o.ttl = seconds(2);
  o.margin = milliseconds(500);
  return o;
}

// Two masters on real etcd and real time: one leads; cut off, it steps down and the other leads
// within the lease's ttl and a poll; with a member of etcd down, a stopped leader's standby still
// takes over.
TEST_F(EtcdTest, AStandbyTakesOverFromALeaderCutOffAndFromOneThatStops) {
  auto ca = Client(), cb = Client();
  ASSERT_TRUE(ca && cb);
  Cuttable a_link(ca.get()), b_link(cb.get());
  auto a = std::make_unique<LeaderElection>(&a_link, Options("a:1"));
  auto b = std::make_unique<LeaderElection>(&b_link, Options("b:1"));
  a->Start();
  ASSERT_TRUE(testing::WaitFor([&] { return a->IsLeader(); }, seconds(10)));
  b->Start();
  ASSERT_TRUE(testing::WaitFor([&] { return b->leader() == "a:1"; }, seconds(10)));
  EXPECT_FALSE(b->IsLeader());
  const int64_t first = a->term();
  a_link.cut = true;
  const auto cut_at = std::chrono::steady_clock::now();
  bool both = false;
  ASSERT_TRUE(testing::WaitFor([&] {
    both = both || (a->IsLeader() && b->IsLeader());
    return b->IsLeader();
  }, seconds(15))) << "the standby never took over";
  EXPECT_FALSE(both) << "two leaders at once";
  EXPECT_FALSE(a->IsLeader());
  EXPECT_LT(std::chrono::steady_clock::now() - cut_at, seconds(6));
  EXPECT_GT(b->term(), first);
  // Back: a is a standby that knows who leads.
  a_link.cut = false;
  ASSERT_TRUE(testing::WaitFor([&] { return a->leader() == "b:1"; }, seconds(10)));
  // One etcd member down; the leader stops (resigns) and a takes over through the other two.
  testing::RunCommand({"bash", testing::SourceDir() + "/scripts/etcd.sh", "stop", *dir_ / "etcd", "0"});
  b.reset();
  ASSERT_TRUE(testing::WaitFor([&] { return a->IsLeader(); }, seconds(15))) << "no leader with a member down";
  a.reset();
}

}  // namespace
}  // namespace granary::master
