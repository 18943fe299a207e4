// The FUSE keeper process (granary-fuse --keeper): what it hands a successor after its depositor
// died. A real keeper on a real Unix socket; an eventfd stands in for the /dev/fuse descriptor
// (the keeper only holds it and polls it for errors).
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <optional>
#include <set>

#include "fuse/handover.h"
#include "tests/testutil/testutil.h"

namespace granary::fuse {
namespace {

using testing::Bin;
using testing::Process;
using testing::TempDir;
using testing::WaitFor;

constexpr char kMount[] = "/mnt/keeper-test";

class Keeper {
 public:
  explicit Keeper(const TempDir& dir) : path_(dir / "keeper.sock") {
    p_ = std::make_unique<Process>(std::vector<std::string>{Bin("granary-fuse"), "--keeper", path_}, dir / "keeper.log");
    listening_ = WaitFor([&] {
      auto s = ConnectLocal(path_);
      if (s.ok()) close(*s);
      return s.ok() || !p_->Running();
    }) && p_->Running();
  }
  ~Keeper() { p_->Stop(SIGTERM); }
  bool listening() const { return listening_; }
  std::string log() const { return p_->Log(); }

  // A connected depositor that has deposited `st` (with an eventfd as the connection): its socket.
  int Deposit(rpc::FuseConnectionState st, const std::string& sender, int ring_fd = -1) {
    auto s = ConnectLocal(path_);
    if (!s.ok()) return -1;
    st.set_mountpoint(kMount);
    st.set_init_request("init");
    st.set_sender(sender);
    rpc::HandoverMessage m;
    m.set_kind(rpc::HandoverMessage::DEPOSIT);
    *m.mutable_state() = st;
    int efd = eventfd(0, EFD_CLOEXEC);
    Status sent = SendHandover(*s, m, efd, ring_fd);
    close(efd);
    if (!sent.ok()) {
      close(*s);
      return -1;
    }
    return *s;
  }

  // What a successor withdraws, once it comes from `sender` (nullopt: not within the deadline).
  // With `ring_memory`, also the io_uring entries' memory that came along (its first bytes; "" none).
  std::optional<rpc::FuseConnectionState> Withdraw(const std::string& sender, std::string* ring_memory = nullptr) {
    std::optional<rpc::FuseConnectionState> got;
    WaitFor([&] {
      auto r = WithdrawFromKeeper(path_, kMount);
      if (!r.ok() || !r->has_value()) return false;
      std::string memory;
      if ((*r)->ring_fd >= 0) {
        char buf[16] = {};
        ssize_t n = pread((*r)->ring_fd, buf, sizeof buf, 0);
        memory.assign(buf, n > 0 ? static_cast<size_t>(n) : 0);
      }
      (*r)->CloseAll();
      if ((*r)->msg.state().sender() != sender) return false;
      got = (*r)->msg.state();
      if (ring_memory != nullptr) *ring_memory = memory;
      return true;
    });
    return got;
  }

 private:
  std::string path_;
  std::unique_ptr<Process> p_;
  bool listening_ = false;
};

rpc::HandoverMessage Change(rpc::HandoverMessage::Kind kind, uint64_t kino, uint64_t id) {
  rpc::HandoverMessage m;
  m.set_kind(kind);
  if (kind == rpc::HandoverMessage::HANDLE_PUT || kind == rpc::HandoverMessage::HANDLE_DROP) {
    m.mutable_handle()->set_fh(id);
    m.mutable_handle()->set_kino(kino);
    m.mutable_handle()->set_counted_cached(true);
  } else {
    m.mutable_backing()->set_kino(kino);
    m.mutable_backing()->set_backing_id(static_cast<int>(id));
  }
  return m;
}

std::set<uint64_t> Handles(const rpc::FuseConnectionState& st) {
  std::set<uint64_t> out;
  for (const auto& h : st.handles()) out.insert(h.fh());
  return out;
}

std::set<std::pair<uint64_t, int>> Backings(const rpc::FuseConnectionState& st) {
  std::set<std::pair<uint64_t, int>> out;
  for (const auto& b : st.backings()) out.insert({b.kino(), b.backing_id()});
  return out;
}

// Daemon-served opens of passthrough mode (handles) and backing ids, as deposited and changed by
// a granary-fuse that then dies: the successor gets exactly the live ones.
TEST(Keeper, HandsASuccessorTheLiveHandlesAndBackingIds) {
  TempDir dir;
  Keeper k(dir);
  ASSERT_TRUE(k.listening()) << k.log();
  rpc::FuseConnectionState st;
  auto* h = st.add_handles();
  h->set_fh(1);
  h->set_kino(5);
  h->set_counted_cached(true);
  int d = k.Deposit(st, "first");
  ASSERT_GE(d, 0) << k.log();
  for (const auto& m : {Change(rpc::HandoverMessage::HANDLE_PUT, 6, 2), Change(rpc::HandoverMessage::HANDLE_PUT, 6, 3),
                        Change(rpc::HandoverMessage::HANDLE_DROP, 5, 1), Change(rpc::HandoverMessage::BACKING_PUT, 7, 9),
                        Change(rpc::HandoverMessage::BACKING_PUT, 8, 10),
                        Change(rpc::HandoverMessage::BACKING_DROP, 8, 10)}) {
    ASSERT_TRUE(SendHandover(d, m).ok());
  }
  close(d);  // the depositor dies
  auto got = k.Withdraw("first");
  ASSERT_TRUE(got.has_value()) << k.log();
  EXPECT_EQ(Handles(*got), (std::set<uint64_t>{2, 3}));
  EXPECT_EQ(Backings(*got), (std::set<std::pair<uint64_t, int>>{{7, 9}}));
  for (const auto& b : got->backings()) EXPECT_EQ(b.passthrough(), -1) << "open counts are unknown after a crash";
}

// A change its predecessor wrote late (after the successor deposited) must not edit the
// successor's state.
TEST(Keeper, IgnoresAReplacedDepositor) {
  TempDir dir;
  Keeper k(dir);
  ASSERT_TRUE(k.listening()) << k.log();
  rpc::FuseConnectionState first;
  auto* b = first.add_backings();
  b->set_kino(7);
  b->set_backing_id(9);
  int d1 = k.Deposit(first, "first");
  ASSERT_GE(d1, 0) << k.log();
  ASSERT_TRUE(k.Withdraw("first").has_value()) << k.log();
  rpc::FuseConnectionState second = first;
  auto* h = second.add_handles();
  h->set_fh(4);
  h->set_kino(7);
  h->set_counted_cached(true);
  int d2 = k.Deposit(second, "second");
  ASSERT_GE(d2, 0) << k.log();
  ASSERT_TRUE(k.Withdraw("second").has_value()) << k.log();
  ASSERT_TRUE(SendHandover(d1, Change(rpc::HandoverMessage::BACKING_DROP, 7, 9)).ok());
  ASSERT_TRUE(SendHandover(d1, Change(rpc::HandoverMessage::HANDLE_DROP, 7, 4)).ok());
  ASSERT_TRUE(SendHandover(d1, Change(rpc::HandoverMessage::HANDLE_PUT, 7, 50)).ok());
  // A withdrawal reads every depositor of the mount first, so d1's messages are read by now.
  auto got = k.Withdraw("second");
  ASSERT_TRUE(got.has_value()) << k.log();
  EXPECT_EQ(Backings(*got), (std::set<std::pair<uint64_t, int>>{{7, 9}}));
  EXPECT_EQ(Handles(*got), (std::set<uint64_t>{4}));
  close(d1);
  close(d2);
}

// A memfd holding `text` (standing in for the io_uring entries' memory).
int MemoryWith(const std::string& text) {
  int fd = memfd_create("keeper-test-ring", MFD_CLOEXEC);
  if (fd >= 0 && write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

// The io_uring entries' memory travels with the connection (fuse/uring.h): a successor's first
// deposit, made before it adopted that memory, does not make the keeper forget it; a deposit with
// memory of its own replaces it.
TEST(Keeper, KeepsTheRingMemoryUntilADepositBringsItsOwn) {
  TempDir dir;
  Keeper k(dir);
  ASSERT_TRUE(k.listening()) << k.log();
  rpc::FuseConnectionState st;
  st.set_uring_payload(1 << 20);
  st.set_uring_memory_base(0x6f0000000000ULL);
  st.set_uring_memory_bytes(16);
  int ring = MemoryWith("first's entries.");
  ASSERT_GE(ring, 0);
  int d1 = k.Deposit(st, "first", ring);
  close(ring);
  ASSERT_GE(d1, 0) << k.log();
  std::string memory;
  auto got = k.Withdraw("first", &memory);
  ASSERT_TRUE(got.has_value()) << k.log();
  EXPECT_EQ(memory, "first's entries.");
  // The successor deposits at once, before it maps the memory: no memory, no address.
  rpc::FuseConnectionState second = st;
  second.clear_uring_memory_base();
  second.clear_uring_memory_bytes();
  int d2 = k.Deposit(second, "second");
  ASSERT_GE(d2, 0) << k.log();
  got = k.Withdraw("second", &memory);
  ASSERT_TRUE(got.has_value()) << k.log();
  EXPECT_EQ(memory, "first's entries.");
  EXPECT_EQ(got->uring_memory_base(), 0x6f0000000000ULL);
  EXPECT_EQ(got->uring_memory_bytes(), 16u);
  // A third brings memory of its own (it could not map the first's).
  ring = MemoryWith("third's entries.");
  ASSERT_GE(ring, 0);
  int d3 = k.Deposit(st, "third", ring);
  close(ring);
  ASSERT_GE(d3, 0) << k.log();
  got = k.Withdraw("third", &memory);
  ASSERT_TRUE(got.has_value()) << k.log();
  EXPECT_EQ(memory, "third's entries.");
  for (int d : {d1, d2, d3}) close(d);
}

}  // namespace
}  // namespace granary::fuse
