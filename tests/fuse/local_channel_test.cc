// LocalChannel's whole-file leases (fuse/local_channel.h) against a minimal worker on a unix socket
// that speaks the local wire (rpc/local_wire.h): concurrent passthrough opens do not queue behind
// one another's round trips, and a lease's release goes back on the connection that granted it
// (the worker keeps a connection's leases and ends them when it closes).
#include "fuse/local_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "common/net.h"
#include "rpc/local_wire.h"
#include "tests/testutil/testutil.h"

namespace granary::fuse {
namespace {

using testing::TempDir;

// Answers every whole-file lease request with /dev/null and a new lease id, and records which
// connection asked and which connection each release came on. With `hold_first`, the first
// request's answer waits (up to 5 s) until a second request has arrived: it arrives only if the
// client does not hold one line for both.
class FakeWorker {
 public:
  explicit FakeWorker(const std::string& path, bool hold_first) : hold_first_(hold_first) {
    auto l = ListenUnix(path, 16, "fake worker");
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    listen_ = l.ok() ? *l : -1;
    acceptor_ = std::thread([this] { Accept(); });
  }
  ~FakeWorker() {
    shutdown(listen_, SHUT_RDWR);
    acceptor_.join();
    {
      std::lock_guard<std::mutex> g(mu_);
      for (int c : conns_) shutdown(c, SHUT_RDWR);
    }
    for (auto& t : servers_) t.join();
    for (int c : conns_) close(c);
    close(listen_);
  }

  struct Seen {
    int requests = 0;
    bool held_to_the_deadline = false;
    std::map<uint64_t, int> granted_on;   // lease -> connection number
    std::map<uint64_t, int> released_on;  // lease -> connection number
  };
  Seen seen() {
    std::lock_guard<std::mutex> g(mu_);
    return seen_;
  }

 private:
  void Accept() {
    for (;;) {
      int c = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      std::lock_guard<std::mutex> g(mu_);
      const int number = static_cast<int>(conns_.size());
      conns_.push_back(c);
      servers_.emplace_back([this, c, number] { Serve(c, number); });
    }
  }

  void Serve(int conn, int number) {
    for (;;) {
      rpc::LocalRequest req;
      int fd = -1;
      if (!RecvFrame(conn, &req, &fd).ok()) return;
      if (fd >= 0) close(fd);
      std::unique_lock<std::mutex> lock(mu_);
      if (req.release() != 0) {
        seen_.released_on[req.release()] = number;
        continue;
      }
      const bool first = seen_.requests++ == 0;
      cv_.notify_all();
      if (first && hold_first_ &&
          !cv_.wait_for(lock, std::chrono::seconds(5), [this] { return seen_.requests >= 2; })) {
        seen_.held_to_the_deadline = true;
      }
      const uint64_t lease = ++next_lease_;
      seen_.granted_on[lease] = number;
      lock.unlock();
      rpc::LocalResponse resp;
      resp.set_lease(lease);
      resp.set_length(1);
      int dev_null = open("/dev/null", O_RDONLY | O_CLOEXEC);
      Status st = SendFrame(conn, resp, dev_null);
      close(dev_null);
      if (!st.ok()) return;
    }
  }

  const bool hold_first_;
  int listen_ = -1;
  std::thread acceptor_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> conns_;
  std::vector<std::thread> servers_;
  Seen seen_;
  uint64_t next_lease_ = 0;
};

rpc::ReadBlockRequest WholeFile() {
  rpc::ReadBlockRequest req;
  req.set_index(0);
  return req;
}

TEST(LocalChannelLeases, TwoOpensAtOnceNeitherWaitsForTheOthersRoundTrip) {
  TempDir dir;
  FakeWorker worker(dir / "worker.sock", /*hold_first=*/true);
  LocalChannel ch(dir / "worker.sock");
  LocalChannel::Piece a, b;
  Status sa, sb;
  std::thread ta([&] { sa = ch.LeaseFile(WholeFile(), &a); });
  std::thread tb([&] { sb = ch.LeaseFile(WholeFile(), &b); });
  ta.join();
  tb.join();
  ASSERT_TRUE(sa.ok()) << sa.ToString();
  ASSERT_TRUE(sb.ok()) << sb.ToString();
  FakeWorker::Seen seen = worker.seen();
  EXPECT_EQ(seen.requests, 2);
  EXPECT_FALSE(seen.held_to_the_deadline) << "the second open waited for the first one's answer";
  EXPECT_NE(seen.granted_on[a.lease], seen.granted_on[b.lease]);
  ch.Release(&a);
  ch.Release(&b);
}

TEST(LocalChannelLeases, EachReleaseGoesBackOnTheConnectionThatGrantedItsLease) {
  TempDir dir;
  FakeWorker worker(dir / "worker.sock", /*hold_first=*/false);
  LocalChannel ch(dir / "worker.sock");
  std::vector<LocalChannel::Piece> pieces(20);
  for (auto& p : pieces) ASSERT_TRUE(ch.LeaseFile(WholeFile(), &p).ok());
  for (auto& p : pieces) {
    EXPECT_GE(p.fd, 0);
    ch.Release(&p);
    EXPECT_EQ(p.fd, -1);
    EXPECT_EQ(p.shared_gen, 0u);
  }
  ASSERT_TRUE(testing::WaitFor([&] { return worker.seen().released_on.size() == pieces.size(); }))
      << worker.seen().released_on.size() << " releases arrived";
  FakeWorker::Seen seen = worker.seen();
  std::map<int, int> per_connection;
  for (const auto& [lease, conn] : seen.granted_on) {
    EXPECT_EQ(seen.released_on[lease], conn) << "lease " << lease;
    ++per_connection[conn];
  }
  EXPECT_GT(per_connection.size(), 1u) << "every lease rode one connection";
}

}  // namespace
}  // namespace granary::fuse
