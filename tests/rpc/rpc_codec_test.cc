// Status <-> grpc::Status: code for code, and a Reason survives the trip (a version change seen by
// a worker must still be one when granary-fuse gets it).
#include "rpc/rpc.h"
#include "rpc/wire.h"
#include "ufs/ufs.h"

#include <gtest/gtest.h>

namespace granary {
namespace {

TEST(RpcCodec, CodesRoundTrip) {
  for (int c = 1; c <= 16; ++c) {
    Status s(static_cast<Code>(c), "m");
    Status back = FromGrpc(ToGrpc(s), "the worker");
    EXPECT_EQ(back.code(), s.code()) << c;
    EXPECT_EQ(back.reason(), Reason::kNone) << c;
  }
  EXPECT_TRUE(FromGrpc(ToGrpc(Status::OK()), "x").ok());
}

TEST(RpcCodec, VersionChangedSurvives) {
  Status back = FromGrpc(ToGrpc(VersionChangedError("s3://b/k changed")), "the worker");
  EXPECT_TRUE(back.IsVersionChanged());
  EXPECT_EQ(back.message(), "s3://b/k changed");
  EXPECT_FALSE(FromGrpc(ToGrpc(FailedPreconditionError("not a holder")), "w").IsVersionChanged());
  // Details from elsewhere (not ours) are ignored, not misread.
  EXPECT_FALSE(FromGrpc(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "m", "garbage"), "w").IsVersionChanged());
}

// A server that answered that its under-storage is down is told apart from one that could not be
// reached (both UNAVAILABLE): granary-fuse waits for the second only.
TEST(RpcCodec, UnderStorageDownSurvives) {
  Status down = MarkUnderStorage(UnavailableError("s3 GET k: connection reset"));
  EXPECT_TRUE(down.IsUnderStorageDown());
  Status back = FromGrpc(ToGrpc(down.WithContext("fetch k")), "the worker at w:1");
  EXPECT_TRUE(back.IsUnderStorageDown()) << back.ToString();
  EXPECT_FALSE(FromGrpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"), "w").IsUnderStorageDown());
  EXPECT_FALSE(MarkUnderStorage(NotFoundError("gone")).IsUnderStorageDown());
  EXPECT_EQ(ReasonFromWire(2), Reason::kUnderStorage);
}

// The local socket's status and the read source, as the worker encodes and granary-fuse decodes
// them (rpc/wire.h): every code and reason survives; what this build does not know does not pass
// for something benign.
TEST(RpcCodec, LocalStatusAndReadSource) {
  for (int c = 0; c <= 16; ++c) {
    rpc::LocalResponse resp;
    rpc::SetStatus(Status(static_cast<Code>(c), "m", Reason::kVersionChanged), &resp);
    Status back = rpc::StatusOf(resp);
    EXPECT_EQ(back.code(), static_cast<Code>(c));
    EXPECT_EQ(back.reason(), c == 0 ? Reason::kNone : Reason::kVersionChanged) << c;
  }
  rpc::LocalResponse odd;
  odd.set_code(99);
  EXPECT_EQ(rpc::StatusOf(odd).code(), Code::kUnknown);
  odd.set_code(-1);
  EXPECT_EQ(rpc::StatusOf(odd).code(), Code::kUnknown);
  for (auto s : {rpc::ReadSource::kCache, rpc::ReadSource::kPeer, rpc::ReadSource::kUnderStorage}) {
    EXPECT_EQ(rpc::ReadSourceFromWire(rpc::ToWire(s)), s);
  }
  EXPECT_EQ(rpc::ReadSourceFromWire(7), rpc::ReadSource::kUnderStorage);
}

}  // namespace
}  // namespace granary
