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
