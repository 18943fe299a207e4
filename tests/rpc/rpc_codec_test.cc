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

namespace granary {
namespace {

// Standby masters: which UNAVAILABLE moves a client, and where to.
TEST(LeaderFollowing, AnUnavailableAServerAnsweredIsNotAnUnreachableServer) {
  grpc::Status answered = ToGrpc(UnavailableError("the NFS server does not answer"));
  EXPECT_FALSE(ServerUnreachable(answered));
  EXPECT_FALSE(IsNotLeader(answered));
  EXPECT_TRUE(ServerUnreachable(grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses")));
  grpc::Status standby(grpc::StatusCode::UNAVAILABLE, "a standby", std::string(kLeaderHint) + "m2:1");
  EXPECT_TRUE(IsNotLeader(standby));
  EXPECT_EQ(LeaderHint(standby), "m2:1");
  grpc::Status electing(grpc::StatusCode::UNAVAILABLE, "no leader", kLeaderHint);
  EXPECT_TRUE(IsNotLeader(electing));
  EXPECT_EQ(LeaderHint(electing), "");
  EXPECT_EQ(FromGrpc(answered, "the master").code(), Code::kUnavailable);
  EXPECT_EQ(SplitAddressList(" a:1, b:2,,c:3 "), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
}

TEST(LeaderFollowing, TheHolderFollowsHintsAndOtherwiseTheList) {
  auto sec = RpcSecurity::FromConfig(RpcConfig{});
  ASSERT_TRUE(sec.ok());
  StubHolder<rpc::Master> h(*sec, "127.0.0.1:1,127.0.0.1:2");
  EXPECT_EQ(h.address(), "127.0.0.1:1");
  EXPECT_EQ(h.address_count(), 2u);
  h.Note(ToGrpc(UnavailableError("its under-storage failed")));
  EXPECT_EQ(h.address(), "127.0.0.1:1") << "the server answered: stay";
  h.Note(grpc::Status(grpc::StatusCode::UNAVAILABLE, "standby", std::string(kLeaderHint) + "127.0.0.1:7"));
  EXPECT_EQ(h.address(), "127.0.0.1:7") << "a hint is followed at once, even off the list";
  // The named leader stops answering: back to the list (moves are at most one per 200 ms).
  const grpc::Status gone(grpc::StatusCode::UNAVAILABLE, "connection refused");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (h.address() == "127.0.0.1:7" && std::chrono::steady_clock::now() < deadline) h.Note(gone);
  EXPECT_EQ(h.address(), "127.0.0.1:1");
  while (h.address() == "127.0.0.1:1" && std::chrono::steady_clock::now() < deadline) h.Note(gone);
  EXPECT_EQ(h.address(), "127.0.0.1:2") << "unreachable: the next address";
}

}  // namespace
}  // namespace granary
