// CallCounts on a real server: each call a client makes is counted once under its method's short
// name, unary and streaming alike, and a server without calls counts nothing.
#include "rpc/call_counts.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "proto/granary.grpc.pb.h"
#include "rpc/rpc.h"

namespace granary {
namespace {

// A worker that answers GetStats and streams an empty block; every other method is unimplemented.
class SmallWorker final : public rpc::Worker::Service {
 public:
  grpc::Status GetStats(grpc::ServerContext*, const rpc::GetStatsRequest*, rpc::WorkerStats*) override {
    return grpc::Status::OK;
  }
  grpc::Status ReadBlock(grpc::ServerContext*, const rpc::ReadBlockRequest*,
                         grpc::ServerWriter<rpc::ReadBlockChunk>*) override {
    return grpc::Status::OK;
  }
};

TEST(CallCounts, EachCallIsCountedOnceByItsMethod) {
  SmallWorker service;
  rpc::CallCounts counts;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&service);
  counts.Attach(&b);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(counts.Snapshot().empty());
  RpcSecurity sec;
  auto stub = rpc::Worker::NewStub(sec.MakeChannel("127.0.0.1:" + std::to_string(port)));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    rpc::WorkerStats out;
    ASSERT_TRUE(stub->GetStats(&ctx, rpc::GetStatsRequest(), &out).ok());
  }
  {
    grpc::ClientContext ctx;
    auto reader = stub->ReadBlock(&ctx, rpc::ReadBlockRequest());
    rpc::ReadBlockChunk c;
    while (reader->Read(&c)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  auto snap = counts.Snapshot();
  EXPECT_EQ(snap["GetStats"], 3u);
  EXPECT_EQ(snap["ReadBlock"], 1u);
  EXPECT_EQ(snap.size(), 2u);
  server->Shutdown();
}

}  // namespace
}  // namespace granary
