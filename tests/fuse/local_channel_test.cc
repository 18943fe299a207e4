// LocalChannel's whole-file leases (fuse/local_channel.h) against a minimal worker on a unix socket
// that speaks the local wire (rpc/local_wire.h): concurrent passthrough opens do not queue behind
// one another's round trips, and a lease's release goes back on the connection that granted it
// (the worker keeps a connection's leases and ends them when it closes).
#include "fuse/local_channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <functional>
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

// A minimal unix-socket server for the fake workers below: accepts connections and serves each on
// a thread of its own with `serve(conn, number)` (number: order of arrival, from 0); the destructor
// shuts every connection down and waits for the threads. Declare it last in its owner, so that it
// stops before what `serve` uses goes away.
class SocketServer {
 public:
  SocketServer(const std::string& path, std::function<void(int, int)> serve) : serve_(std::move(serve)) {
    auto l = ListenUnix(path, 16, "fake worker");
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    listen_ = l.ok() ? *l : -1;
    acceptor_ = std::thread([this] {
      for (int number = 0;; ++number) {
        int c = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) return;
        std::lock_guard<std::mutex> g(mu_);
        conns_.push_back(c);
        servers_.emplace_back([this, c, number] { serve_(c, number); });
      }
    });
  }
  ~SocketServer() {
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

 private:
  std::function<void(int, int)> serve_;
  int listen_ = -1;
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<int> conns_;
  std::vector<std::thread> servers_;
};

// Answers every whole-file lease request with /dev/null and a new lease id, and records which
// connection asked and which connection each release came on. With `hold_first`, the first
// request's answer waits (up to 5 s) until a second request has arrived: it arrives only if the
// client does not hold one line for both.
class FakeWorker {
 public:
  explicit FakeWorker(const std::string& path, bool hold_first)
      : hold_first_(hold_first), server_(path, [this](int conn, int number) { Serve(conn, number); }) {}

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
  std::mutex mu_;
  std::condition_variable cv_;
  Seen seen_;
  uint64_t next_lease_ = 0;
  SocketServer server_;  // last: stops first
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

// A worker that answers every read with `payload_`: put into the connection's pipe (vmsplice)
// when the connection gave it one and `take_pipes`, else inline. Records which connection (in
// order of arrival) each read came on.
class PipeWorker {
 public:
  PipeWorker(const std::string& path, bool take_pipes)
      : take_pipes_(take_pipes),
        payload_(testing::RandomBytes(128 << 10, 21)),
        server_(path, [this](int conn, int number) { Serve(conn, number); }) {}
  const std::string& payload() const { return payload_; }
  std::vector<int> reads_on() {
    std::lock_guard<std::mutex> g(mu_);
    return reads_on_;
  }

 private:
  void Serve(int conn, int number) {
    int pipe = -1;
    for (;;) {
      rpc::LocalRequest req;
      int fd = -1;
      if (!RecvFrame(conn, &req, &fd).ok()) break;
      rpc::LocalResponse resp;
      if (req.stream_pipe()) {
        if (take_pipes_ && fd >= 0) {
          pipe = fd;
        } else {
          if (fd >= 0) close(fd);
          resp.set_code(static_cast<int32_t>(Code::kInvalidArgument));  // as a worker before pipes
        }
        if (!SendFrame(conn, resp).ok()) break;
        continue;
      }
      if (fd >= 0) close(fd);
      {
        std::lock_guard<std::mutex> g(mu_);
        reads_on_.push_back(number);
      }
      resp.set_length(payload_.size());
      Status st;
      if (pipe >= 0) {
        iovec iov{payload_.data(), payload_.size()};
        while (iov.iov_len > 0) {
          ssize_t n = vmsplice(pipe, &iov, 1, 0);
          if (n <= 0) break;
          iov.iov_base = static_cast<char*>(iov.iov_base) + n;
          iov.iov_len -= static_cast<size_t>(n);
        }
        resp.set_in_pipe(true);
        st = SendFrame(conn, resp);
      } else {
        st = SendFrameWithBytes(conn, resp, rpc::LocalResponse::kDataFieldNumber, payload_);
      }
      if (!st.ok()) break;
    }
    if (pipe >= 0) close(pipe);
  }

  const bool take_pipes_;
  std::string payload_;
  std::mutex mu_;
  std::vector<int> reads_on_;
  SocketServer server_;  // last: stops first
};

rpc::ReadBlockRequest ARead() {
  rpc::ReadBlockRequest req;
  req.set_length(128 << 10);
  return req;
}

// The bytes of a read come in the connection's pipe: read once, they are the worker's; a piece
// consumed gives its connection back, one released with its bytes still in the pipe closes it (the
// next read's bytes would follow them).
TEST(LocalChannelPipes, APipedPieceIsReadOnceAndItsConnectionReusedOnlyWhenDrained) {
  TempDir dir;
  PipeWorker worker(dir / "worker.sock", /*take_pipes=*/true);
  LocalChannel ch(dir / "worker.sock");
  LocalChannel::Piece a;
  ASSERT_TRUE(ch.Read(ARead(), &a).ok());
  EXPECT_TRUE(a.pipe);
  ASSERT_GE(a.fd, 0);
  ASSERT_EQ(a.length, worker.payload().size());
  std::string got(a.length, '\0');
  ASSERT_TRUE(LocalChannel::ReadInto(a, got.data()).ok());
  EXPECT_TRUE(got == worker.payload());
  const int pipe_fd = a.fd;
  ch.Release(&a);
  EXPECT_EQ(a.fd, -1);
  EXPECT_GE(fcntl(pipe_fd, F_GETFD), 0) << "the connection's pipe stays open with it";

  LocalChannel::Piece b;
  ASSERT_TRUE(ch.Read(ARead(), &b).ok());
  EXPECT_TRUE(b.pipe);
  ch.Release(&b);  // its bytes never read: the connection is closed, not reused
  LocalChannel::Piece c;
  ASSERT_TRUE(ch.Read(ARead(), &c).ok());
  std::string again(c.length, '\0');
  ASSERT_TRUE(LocalChannel::ReadInto(c, again.data()).ok());
  EXPECT_TRUE(again == worker.payload());
  ch.Release(&c);
  EXPECT_EQ(worker.reads_on(), (std::vector<int>{0, 0, 1}));
}

// A worker that takes no pipe (older than LocalRequest.stream_pipe) answers it with an error: the
// connection goes on, its bytes inline.
TEST(LocalChannelPipes, AWorkerThatTakesNoPipeSendsTheBytesInline) {
  TempDir dir;
  PipeWorker worker(dir / "worker.sock", /*take_pipes=*/false);
  LocalChannel ch(dir / "worker.sock");
  for (int i = 0; i < 2; ++i) {
    LocalChannel::Piece p;
    ASSERT_TRUE(ch.Read(ARead(), &p).ok());
    EXPECT_FALSE(p.pipe);
    EXPECT_LT(p.fd, 0);
    EXPECT_TRUE(std::string(p.bytes(), p.length) == worker.payload());
    ch.Release(&p);
  }
  EXPECT_EQ(worker.reads_on(), (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace granary::fuse
