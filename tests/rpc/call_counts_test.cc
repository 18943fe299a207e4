// CallCounts on a real server: each call a client makes is counted once under its method's short
// name, unary and streaming alike; calls of names the server does not serve count as "other"; a
// server without calls counts nothing.
#include "rpc/call_counts.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <condition_variable>
#include <memory>
#include <mutex>
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
  counts.Attach(&b, "granary.rpc.Worker");
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
  // Methods no service has: answered UNIMPLEMENTED by gRPC itself, counted together as "other" (a
  // caller cannot grow the table with names of its choosing).
  for (int i = 0; i < 3; ++i) {
    grpc::GenericStub generic(sec.MakeChannel("127.0.0.1:" + std::to_string(port)));
    grpc::ClientContext ctx;
    grpc::Slice empty("");  // an empty message (a ByteBuffer with no slice is none)
    grpc::ByteBuffer in(&empty, 1), out;
    grpc::Status st;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    generic.UnaryCall(&ctx, "/granary.rpc.Worker/NoSuch" + std::to_string(i), grpc::StubOptions(), &in, &out,
                      [&](grpc::Status s) {
                        std::lock_guard<std::mutex> l(mu);
                        st = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(30), [&] { return done; }));
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  auto snap = counts.Snapshot();
  EXPECT_EQ(snap["GetStats"], 3u);
  EXPECT_EQ(snap["ReadBlock"], 1u);
  EXPECT_EQ(snap["other"], 3u);
  EXPECT_EQ(snap.size(), 3u);
  server->Shutdown();
}

}  // namespace
}  // namespace granary
