#include "common/status.h"

#include <gtest/gtest.h>

#include <cerrno>

namespace granary {
namespace {

StatusOr<int> Half(int v) {
  if (v % 2) return InvalidArgumentError("odd");
  return v / 2;
}

Status Chain(int v, int* out) {
  ASSIGN_OR_RETURN(int h, Half(v));
  ASSIGN_OR_RETURN(*out, Half(h));
  return Status::OK();
}

TEST(Status, OkAndErrorCodes) {
  EXPECT_TRUE(Status::OK().ok());
  Status s = NotFoundError("missing");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.IsNotFound());
  EXPECT_EQ(s.ToString(), "NOT_FOUND: missing");
  EXPECT_EQ(s.WithContext("open x").message(), "open x: missing");
}

TEST(Status, RetryableAndDataLossFlags) {
  EXPECT_TRUE(UnavailableError("").IsRetryable());
  EXPECT_TRUE(DeadlineExceededError("").IsRetryable());
  EXPECT_FALSE(NotFoundError("").IsRetryable());
  EXPECT_FALSE(PermissionDeniedError("").IsRetryable());
  EXPECT_TRUE(DataLossError("").IsDataLoss());
  EXPECT_FALSE(DataLossError("").IsRetryable());
}

TEST(Status, VersionChangedIsAReasonNotACode) {
  Status changed = VersionChangedError("f changed in the under-storage since it was listed");
  EXPECT_EQ(changed.code(), Code::kFailedPrecondition);
  EXPECT_TRUE(changed.IsVersionChanged());
  EXPECT_TRUE(changed.WithContext("read f").IsVersionChanged()) << "context must keep the reason";
  EXPECT_FALSE(FailedPreconditionError("unpin /a first").IsVersionChanged());
  EXPECT_FALSE(changed == FailedPreconditionError(changed.message()));
  EXPECT_EQ(ReasonFromWire(1), Reason::kVersionChanged);
  EXPECT_EQ(ReasonFromWire(99), Reason::kNone);  // a newer peer's reason this build does not know
  EXPECT_EQ(Status(Code::kOk, "", Reason::kVersionChanged).reason(), Reason::kNone);
}

TEST(Status, ErrnoMapping) {
  EXPECT_EQ(ErrnoError(ENOENT, "x").code(), Code::kNotFound);
  EXPECT_EQ(ErrnoError(EACCES, "x").code(), Code::kPermissionDenied);
  EXPECT_EQ(ErrnoError(ENOSPC, "x").code(), Code::kResourceExhausted);
  EXPECT_NE(ErrnoError(ENOENT, "open f").message().find("open f"), std::string::npos);
}

TEST(StatusOr, MacrosPropagate) {
  int out = 0;
  EXPECT_TRUE(Chain(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = Chain(6, &out);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(Half(3).status().message(), "odd");
  EXPECT_EQ(*Half(10), 5);
}

}  // namespace
}  // namespace granary
