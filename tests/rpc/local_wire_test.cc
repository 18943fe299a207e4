// The worker's local socket framing (rpc/local_wire.h): a block's bytes sent after the message
// (SendFrameWithBytes) parse as the same message for any receiver, and RecvFrameInto lands them
// straight in the caller's buffer only when they are the frame's last field of the expected length.
#include "rpc/local_wire.h"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>
#include <thread>

#include "proto/granary.pb.h"

namespace granary {
namespace {

struct Pair {
  Pair() { EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0); }
  ~Pair() {
    close(sv[0]);
    close(sv[1]);
  }
  int sv[2];
};

std::string Bytes(size_t n) {
  std::mt19937_64 rng(n);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

rpc::LocalResponse Answer(size_t n) {
  rpc::LocalResponse r;
  r.set_length(n);
  r.set_source(2);
  r.set_reason(0);
  return r;
}

// Sends on a thread (a frame larger than the socket's buffer blocks until it is read).
template <typename F>
void Sending(F send, const std::function<void()>& receive) {
  std::thread t(send);
  receive();
  t.join();
}

TEST(LocalWire, BytesSentAfterTheMessageLandInTheCallersBuffer) {
  for (size_t n : {size_t{1}, size_t{300}, size_t{100000}, size_t{(4u << 20) + 7}}) {
    SCOPED_TRACE(n);
    Pair p;
    const std::string bytes = Bytes(n);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    Sending([&] { EXPECT_TRUE(SendFrameWithBytes(p.sv[0], Answer(n), rpc::LocalResponse::kDataFieldNumber, bytes, devnull).ok()); },
            [&] {
              std::string into(n, 'x');
              rpc::LocalResponse got;
              int fd = -1;
              bool landed = false;
              ASSERT_TRUE(RecvFrameInto(p.sv[1], &got, &fd, rpc::LocalResponse::kDataFieldNumber, into.data(), n, &landed).ok());
              EXPECT_TRUE(landed);
              EXPECT_TRUE(into == bytes);
              EXPECT_TRUE(got.data().empty());
              EXPECT_EQ(got.length(), n);
              EXPECT_EQ(got.source(), 2u);
              EXPECT_GE(fd, 0) << "the descriptor travels with the frame";
              if (fd >= 0) close(fd);
            });
    close(devnull);
  }
}

// A receiver that parses whole frames (RecvFrame, an older granary-fuse) reads the same message.
TEST(LocalWire, BytesSentAfterTheMessageParseAsTheMessage) {
  Pair p;
  const std::string bytes = Bytes(70000);
  Sending([&] { EXPECT_TRUE(SendFrameWithBytes(p.sv[0], Answer(bytes.size()), rpc::LocalResponse::kDataFieldNumber, bytes).ok()); },
          [&] {
            rpc::LocalResponse got;
            int fd = -1;
            ASSERT_TRUE(RecvFrame(p.sv[1], &got, &fd).ok());
            EXPECT_TRUE(got.data() == bytes);
            EXPECT_EQ(got.length(), bytes.size());
            EXPECT_EQ(got.source(), 2u);
            EXPECT_EQ(fd, -1);
          });
}

// Frames RecvFrameInto does not land in place are parsed whole, nothing lost: the bytes in the
// middle of the message (an older worker's SendFrame, fields in number order), another length than
// asked, and a message whose fields before the bytes are longer than the head it reads first.
TEST(LocalWire, OtherFramesAreParsedWhole) {
  const std::string bytes = Bytes(20000);
  struct Case {
    const char* name;
    std::function<Status(int)> send;
    size_t want;
  };
  rpc::LocalResponse whole = Answer(bytes.size());
  whole.set_data(bytes);
  rpc::LocalResponse wordy = Answer(bytes.size());
  wordy.set_message(std::string(2000, 'm'));
  const Case cases[] = {
      {"in the middle", [&](int s) { return SendFrame(s, whole); }, bytes.size()},
      {"another length", [&](int s) { return SendFrameWithBytes(s, Answer(bytes.size()), rpc::LocalResponse::kDataFieldNumber, bytes); },
       bytes.size() - 1},
      {"a long head", [&](int s) { return SendFrameWithBytes(s, wordy, rpc::LocalResponse::kDataFieldNumber, bytes); }, bytes.size()},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Pair p;
    Sending([&] { EXPECT_TRUE(c.send(p.sv[0]).ok()); },
            [&] {
              std::string into(c.want, 'x');
              rpc::LocalResponse got;
              int fd = -1;
              bool landed = true;
              ASSERT_TRUE(RecvFrameInto(p.sv[1], &got, &fd, rpc::LocalResponse::kDataFieldNumber, into.data(), c.want, &landed).ok());
              EXPECT_FALSE(landed);
              EXPECT_TRUE(got.data() == bytes);
              EXPECT_EQ(got.length(), bytes.size());
              EXPECT_EQ(into, std::string(c.want, 'x')) << "the caller's buffer is untouched";
            });
  }
}

// A frame cut short (the worker died mid-send) or longer than allowed is an error, not a hang or
// a partial answer.
TEST(LocalWire, ACutOrOversizedFrameIsAnError) {
  const std::string bytes = Bytes(5000);
  {
    Pair p;
    std::thread t([&] {
      std::string frame(4, '\0');
      rpc::LocalResponse r = Answer(bytes.size());
      r.set_data(bytes);
      std::string body = r.SerializeAsString();
      uint32_t len = static_cast<uint32_t>(body.size());
      for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((len >> (8 * i)) & 0xff);
      frame += body.substr(0, body.size() / 2);
      ASSERT_EQ(send(p.sv[0], frame.data(), frame.size(), MSG_NOSIGNAL), static_cast<ssize_t>(frame.size()));
      shutdown(p.sv[0], SHUT_WR);
    });
    std::string into(bytes.size(), 'x');
    rpc::LocalResponse got;
    int fd = -1;
    bool landed = false;
    Status st = RecvFrameInto(p.sv[1], &got, &fd, rpc::LocalResponse::kDataFieldNumber, into.data(), into.size(), &landed);
    t.join();
    EXPECT_EQ(st.code(), Code::kUnavailable) << st.ToString();
    EXPECT_FALSE(landed);
  }
  {
    Pair p;
    std::thread t([&] { (void)SendFrameWithBytes(p.sv[0], Answer(bytes.size()), rpc::LocalResponse::kDataFieldNumber, bytes); });
    std::string into(bytes.size(), 'x');
    rpc::LocalResponse got;
    int fd = -1;
    bool landed = false;
    Status st = RecvFrameInto(p.sv[1], &got, &fd, rpc::LocalResponse::kDataFieldNumber, into.data(), into.size(), &landed,
                              /*max_len=*/1000);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.ToString();
    shutdown(p.sv[1], SHUT_RDWR);
    t.join();
  }
}

}  // namespace
}  // namespace granary
