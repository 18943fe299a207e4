// The one frame codec (common/local_frames.h), the one connect (common/net.h) and the one
// thread-per-connection server (common/unix_server.h) of every local socket.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <array>
#include <thread>

#include "common/local_frames.h"
#include "common/net.h"
#include "common/unix_server.h"
#include "tests/testutil/testutil.h"

namespace granary {
namespace {

using testing::TempDir;
using testing::WaitFor;

UnixServer::Options Named(const std::string& what) {
  UnixServer::Options o;
  o.what = what;
  return o;
}

int OpenFds() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

struct Pair {
  int a = -1, b = -1;
  Pair() {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    a = sv[0];
    b = sv[1];
  }
  ~Pair() {
    close(a);
    close(b);
  }
};

Status SendFrame(int sock, const std::string& body, std::span<const int> fds) {
  std::string frame(4, '\0');
  frames::EncodeLength(static_cast<uint32_t>(body.size()), frame.data());
  frame += body;
  iovec iov{frame.data(), frame.size()};
  return frames::SendV(sock, &iov, 1, fds, "a test socket");
}

TEST(LocalFramesTest, AFrameAndItsDescriptorsArriveWhole) {
  Pair p;
  int f1 = open("/dev/null", O_RDONLY | O_CLOEXEC), f2 = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  // More than a socket buffers: sent while it is read.
  Status sent;
  std::thread sender([&] { sent = SendFrame(p.a, std::string(300'000, 'x'), std::array<int, 2>{f1, f2}); });
  int got[2] = {-1, -1};
  uint32_t len = 0;
  std::string body;
  ASSERT_TRUE(frames::RecvLength(p.b, got, 1 << 20, &len, "a test socket").ok());
  ASSERT_EQ(len, 300'000u);
  ASSERT_TRUE(frames::ReadGrowing(len, &body, [&](char* d, size_t n) {
                return frames::RecvExactly(p.b, d, n, {}, "a test socket");
              }).ok());
  sender.join();
  EXPECT_TRUE(sent.ok()) << sent.ToString();
  EXPECT_EQ(body, std::string(300'000, 'x'));
  ASSERT_GE(got[0], 0);
  ASSERT_GE(got[1], 0);
  struct stat s1 {}, s2 {}, o1 {}, o2 {};
  fstat(got[0], &s1);
  fstat(got[1], &s2);
  fstat(f1, &o1);
  fstat(f2, &o2);
  EXPECT_EQ(s1.st_ino, o1.st_ino);
  EXPECT_EQ(s2.st_ino, o2.st_ino);
  EXPECT_NE(fcntl(got[0], F_GETFD) & FD_CLOEXEC, 0) << "a received descriptor must be close-on-exec";
  frames::CloseAll(got);
  close(f1);
  close(f2);
}

TEST(LocalFramesTest, DescriptorsBeyondWhatTheReceiverTakesAreClosed) {
  Pair p;
  int f[4];
  for (int& x : f) x = open("/dev/null", O_RDONLY | O_CLOEXEC);
  const int before = OpenFds();
  ASSERT_TRUE(SendFrame(p.a, "hi", std::span<const int>(f, 4)).ok());
  int one[1] = {-1};
  uint32_t len = 0;
  ASSERT_TRUE(frames::RecvLength(p.b, one, 64, &len, "a test socket").ok());
  EXPECT_GE(one[0], 0);
  EXPECT_EQ(OpenFds(), before + 1) << "the three descriptors nobody asked for stayed open";
  frames::CloseAll(one);
  for (int x : f) close(x);
}

TEST(LocalFramesTest, ALengthPastTheLimitADeadlineAndAClosedPeerAreSaid) {
  Pair p;
  ASSERT_TRUE(SendFrame(p.a, std::string(100, 'y'), {}).ok());
  uint32_t len = 0;
  Status st = frames::RecvLength(p.b, {}, 64, &len, "a test socket");
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("a test socket"), std::string::npos) << st.message();

  Pair q;
  char c;
  st = frames::RecvExactly(q.b, &c, 1, {}, "a quiet socket",
                           std::chrono::steady_clock::now() + std::chrono::milliseconds(50));
  EXPECT_EQ(st.code(), Code::kDeadlineExceeded) << st.ToString();
  shutdown(q.a, SHUT_WR);
  st = frames::RecvExactly(q.b, &c, 1, {}, "a quiet socket");
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
}

TEST(UnixServerTest, ServesCapsConnectionsAndDrainsOnStop) {
  TempDir dir;
  const std::string path = dir / "s.sock";
  std::atomic<int> serving{0};
  UnixServer::Options o;
  o.what = "a test server";
  o.max_connections = 2;
  o.on_full = [](int c) { (void)!write(c, "full\n", 5); };
  auto server = UnixServer::Start(path, o, [&](int c) {
    ++serving;
    char buf[64];
    while (read(c, buf, sizeof buf) > 0) {  // until the client goes or Stop shuts it down
    }
    --serving;
  });
  ASSERT_TRUE(server.ok()) << server.status().message();
  struct stat st {};
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto c1 = ConnectUnix(path, "a test server");
  auto c2 = ConnectUnix(path, "a test server");
  ASSERT_TRUE(c1.ok() && c2.ok());
  ASSERT_TRUE(WaitFor([&] { return serving == 2; }));
  auto c3 = ConnectUnix(path, "a test server");
  ASSERT_TRUE(c3.ok());
  char buf[8] = {};
  EXPECT_EQ(read(*c3, buf, sizeof buf), 5);
  EXPECT_EQ(std::string(buf, 5), "full\n");
  (*server)->Stop();  // the two handlers are blocked reading: shut down, they return
  EXPECT_EQ(serving.load(), 0);
  EXPECT_NE(lstat(path.c_str(), &st), 0) << "its socket file stayed";
  for (int c : {*c1, *c2, *c3}) close(c);

  auto gone = ConnectUnix(path, "a test server");
  EXPECT_EQ(gone.status().code(), Code::kUnavailable);
  EXPECT_NE(gone.status().message().find("nobody listens on a test server"), std::string::npos)
      << gone.status().message();
}

TEST(UnixServerTest, StopLeavesASuccessorsSocketFileAlone) {
  TempDir dir;
  const std::string path = dir / "s.sock";
  auto first = UnixServer::Start(path, Named("first"), [](int) {});
  ASSERT_TRUE(first.ok());
  unlink(path.c_str());  // a successor takes the name
  auto second = UnixServer::Start(path, Named("second"), [](int) {});
  ASSERT_TRUE(second.ok());
  (*first)->Stop();
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << "the first server removed its successor's socket";
  auto c = ConnectUnix(path, "second");
  ASSERT_TRUE(c.ok()) << c.status().message();
  close(*c);
}

}  // namespace
}  // namespace granary
