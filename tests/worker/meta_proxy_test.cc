// The grants of worker/meta_proxy.h: what a reader of worker.local_socket_group may name. (The
// calls through a real socket, master and worker: tests/integration/python_test.cc.)
#include "worker/meta_proxy.h"

#include <gtest/gtest.h>

namespace granary::worker {
namespace {

LocalPeer Reader(uint32_t uid, uint32_t gid) {
  LocalPeer p;
  p.uid = uid;
  p.gid = gid;
  return p;
}

rpc::Attr Mode(uint32_t mode, uint32_t uid, uint32_t gid) {
  rpc::Attr a;
  a.set_ino(42);
  a.set_mode(mode);
  a.set_uid(uid);
  a.set_gid(gid);
  return a;
}

std::unique_ptr<MetaProxy> Proxy() {
  Config cfg;
  cfg.master.address = "127.0.0.1:1";  // never called here
  auto sec = RpcSecurity::FromConfig(cfg.rpc);
  EXPECT_TRUE(sec.ok()) << sec.status().ToString();
  return std::make_unique<MetaProxy>(cfg, *sec);
}

TEST(MetaProxy, PermissionBitsArePickedAsTheKernelPicksThem) {
  const rpc::Attr a = Mode(0640, 1000, 2000);
  EXPECT_EQ(MetaProxy::PermFor(Reader(1000, 5), a), 6u);   // owner: rw-
  EXPECT_EQ(MetaProxy::PermFor(Reader(1001, 2000), a), 4u);  // group: r--
  EXPECT_EQ(MetaProxy::PermFor(Reader(1001, 5), a), 0u);   // other: ---
  // The owner's bits, even when the group's or other's would give more (as the kernel does).
  EXPECT_EQ(MetaProxy::PermFor(Reader(1000, 2000), Mode(0074, 1000, 2000)), 0u);
  LocalPeer root = Reader(0, 0);
  EXPECT_EQ(MetaProxy::PermFor(root, Mode(0, 1, 1)), 7u);
}

TEST(MetaProxy, AGrantIsForOneUserOneEntryAndItsBitsAndThisWorkerOnly) {
  auto p = Proxy();
  const LocalPeer alice = Reader(1000, 100), bob = Reader(1001, 100);
  const std::string g = p->Grant(alice, 7, MetaProxy::kRead | MetaProxy::kSearch);
  auto bits = p->Verify(alice, 7, g);
  ASSERT_TRUE(bits.ok()) << bits.status().ToString();
  EXPECT_EQ(*bits, MetaProxy::kRead | MetaProxy::kSearch);
  EXPECT_EQ(p->Verify(bob, 7, g).status().code(), Code::kUnauthenticated);  // another user
  EXPECT_EQ(p->Verify(Reader(1000, 101), 7, g).status().code(), Code::kUnauthenticated);  // another gid
  EXPECT_EQ(p->Verify(alice, 8, g).status().code(), Code::kUnauthenticated);  // another entry
  std::string raised = g;
  raised[0] = static_cast<char>(7);  // bits raised
  EXPECT_EQ(p->Verify(alice, 7, raised).status().code(), Code::kUnauthenticated);
  EXPECT_EQ(p->Verify(alice, 7, "").status().code(), Code::kUnauthenticated);
  EXPECT_EQ(p->Verify(alice, 7, g.substr(0, 5)).status().code(), Code::kUnauthenticated);
  // Another worker process (a restart): another key.
  EXPECT_EQ(Proxy()->Verify(alice, 7, g).status().code(), Code::kUnauthenticated);
}

TEST(MetaProxy, GrantsExpireAsTheMountsAttributesDoAndNameTheGroups) {
  auto p = Proxy();  // fuse.attr_timeout's default: 60 s
  const LocalPeer alice = Reader(1000, 100);
  const auto old = p->grant_ttl() + std::chrono::milliseconds(1);
  EXPECT_TRUE(p->Verify(alice, 7, p->Grant(alice, 7, 5, p->grant_ttl() - std::chrono::seconds(1))).ok());
  EXPECT_EQ(p->Verify(alice, 7, p->Grant(alice, 7, 5, old)).status().code(), Code::kUnauthenticated);
  rpc::ReadBlockRequest r;
  r.set_mount_id(1);
  r.set_ufs_path("a");
  EXPECT_EQ(p->CheckRead(alice, r, p->DataGrant(alice, 1, "a", "", 0, 0, old)).code(), Code::kUnauthenticated);
  EXPECT_TRUE(p->CheckRead(alice, r, p->DataGrant(alice, 1, "a", "", 0, 0)).ok());
  // A supplementary group gives its bits (as the kernel gives them), and is part of the grant.
  LocalPeer in_users = alice;
  in_users.groups = {50, 100, 200};
  EXPECT_EQ(MetaProxy::PermFor(in_users, Mode(0604, 0, 200)), 0u);  // the group's bits, not other's
  EXPECT_EQ(MetaProxy::PermFor(alice, Mode(0604, 0, 200)), 4u);
  EXPECT_EQ(p->Verify(alice, 7, p->Grant(in_users, 7, 5)).status().code(), Code::kUnauthenticated);
}

TEST(MetaProxy, AReadNeedsTheDataGrantOfExactlyThatFileVersion) {
  auto p = Proxy();
  const LocalPeer alice = Reader(1000, 100);
  rpc::ReadBlockRequest r;
  r.set_mount_id(3);
  r.set_ufs_path("train/a.jpg");
  r.set_version("v1");
  r.set_file_size(1234);
  r.set_block_size(65536);
  r.set_offset(100);  // where in the file is not part of it
  const std::string g = p->DataGrant(alice, 3, "train/a.jpg", "v1", 1234, 65536);
  EXPECT_TRUE(p->CheckRead(alice, r, g).ok());
  EXPECT_EQ(p->CheckRead(Reader(1001, 100), r, g).code(), Code::kUnauthenticated);
  EXPECT_EQ(p->CheckRead(alice, r, "").code(), Code::kUnauthenticated);
  for (int field = 0; field < 5; ++field) {
    rpc::ReadBlockRequest other = r;
    if (field == 0) other.set_mount_id(4);
    if (field == 1) other.set_ufs_path("train/../../etc/shadow");
    if (field == 2) other.set_version("v2");
    if (field == 3) other.set_file_size(1235);
    if (field == 4) other.set_block_size(1 << 20);
    EXPECT_EQ(p->CheckRead(alice, other, g).code(), Code::kUnauthenticated) << "field " << field;
  }
  LocalPeer trusted = alice;
  trusted.trusted = true;
  EXPECT_TRUE(p->CheckRead(trusted, r, "").ok());  // root and the worker's user need none
}

}  // namespace
}  // namespace granary::worker
