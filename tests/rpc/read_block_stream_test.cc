// ReadBlockStream against a worker that answers in 1 MiB chunks (every worker before
// ReadBlockRequest.max_chunk_bytes) and one that answers a block in one message: the same bytes
// either way, appended after what the caller's string held, and DATA_LOSS for an answer of the
// wrong length. The Worker service here is a stand-in whose only code is ReadBlock: it streams
// `body_` in chunks of its own choosing and records what the caller asked.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary {
namespace {

class ChunkingWorker final : public rpc::Worker::Service {
 public:
  ChunkingWorker(std::string body, size_t chunk) : body_(std::move(body)), chunk_(chunk) {}
  grpc::Status ReadBlock(grpc::ServerContext*, const rpc::ReadBlockRequest* req,
                         grpc::ServerWriter<rpc::ReadBlockChunk>* writer) override {
    asked_max_chunk_ = req->max_chunk_bytes();
    for (size_t off = 0; off < body_.size(); off += chunk_) {
      rpc::ReadBlockChunk c;
      c.set_data(body_.substr(off, chunk_));
      if (off == 0) c.set_cache_hit(true);
      if (!writer->Write(c)) break;
    }
    return grpc::Status::OK;
  }
  uint64_t asked_max_chunk_ = 0;

 private:
  std::string body_;
  size_t chunk_;
};

class ReadBlockStreamTest : public ::testing::Test {
 protected:
  void Serve(std::string body, size_t chunk) {
    if (server_) {  // the previous one goes before its service
      server_->Shutdown();
      server_.reset();
    }
    service_ = std::make_unique<ChunkingWorker>(std::move(body), chunk);
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.SetMaxSendMessageSize(kMaxMessageBytes);
    b.RegisterService(service_.get());
    server_ = b.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    RpcSecurity sec;  // no TLS, no token: loopback
    stub_ = rpc::Worker::NewStub(sec.MakeChannel("127.0.0.1:" + std::to_string(port)));
  }
  Status Read(uint64_t want, std::string* out, bool* hit = nullptr) {
    grpc::ClientContext ctx;
    return ReadBlockStream(*stub_, ctx, rpc::ReadBlockRequest(), want, out, "the worker", hit);
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  std::unique_ptr<ChunkingWorker> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<rpc::Worker::Stub> stub_;
};

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 2654435761u) >> 13);
  return s;
}

TEST_F(ReadBlockStreamTest, AnOldWorkersMiBChunksAreJoined) {
  const std::string body = Pattern((4 << 20) - 12345);
  Serve(body, 1 << 20);
  std::string out;
  bool hit = false;
  ASSERT_TRUE(Read(body.size(), &out, &hit).ok());
  EXPECT_TRUE(out == body) << "joined chunks differ";
  EXPECT_TRUE(hit);
  EXPECT_EQ(service_->asked_max_chunk_, static_cast<uint64_t>(kMaxMessageBytes - (64 << 10)))
      << "the caller asks for chunks as large as its channel takes";
}

TEST_F(ReadBlockStreamTest, ABlockInOneMessageIsTakenWhole) {
  const std::string body = Pattern(4 << 20);
  Serve(body, body.size());
  std::string out;
  ASSERT_TRUE(Read(body.size(), &out).ok());
  EXPECT_TRUE(out == body);
}

TEST_F(ReadBlockStreamTest, BytesGoAfterWhatTheStringHeld) {
  const std::string body = Pattern(3 << 20);
  for (size_t chunk : {size_t{1} << 20, body.size()}) {
    Serve(body, chunk);
    std::string out = "prefix";
    ASSERT_TRUE(Read(body.size(), &out).ok()) << chunk;
    EXPECT_TRUE(out == "prefix" + body) << chunk;
  }
}

TEST_F(ReadBlockStreamTest, AnAnswerOfTheWrongLengthIsDataLoss) {
  const std::string body = Pattern(2 << 20);
  for (size_t chunk : {size_t{1} << 20, body.size()}) {
    Serve(body, chunk);
    std::string out;
    Status shorter = Read(body.size() + 1, &out);
    EXPECT_EQ(shorter.code(), Code::kDataLoss) << chunk << ": " << shorter.ToString();
    out.clear();
    Status longer = Read(body.size() - 1, &out);
    EXPECT_EQ(longer.code(), Code::kDataLoss) << chunk << ": " << longer.ToString();
  }
}

}  // namespace
}  // namespace granary
