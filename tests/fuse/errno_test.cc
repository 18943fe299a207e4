#include "fuse/errno.h"

#include <gtest/gtest.h>

namespace granary::fuse {
namespace {

TEST(ErrnoFunnel, MapsEveryCode) {
  EXPECT_EQ(ToErrno(Status::OK()), 0);
  EXPECT_EQ(ToErrno(NotFoundError("")), ENOENT);
  EXPECT_EQ(ToErrno(PermissionDeniedError("")), EACCES);
  EXPECT_EQ(ToErrno(UnauthenticatedError("")), EACCES);
  EXPECT_EQ(ToErrno(VersionChangedError("changed")), ESTALE);
  // Only a version change is ESTALE: other precondition failures are not "the file changed".
  EXPECT_EQ(ToErrno(FailedPreconditionError("not a holder of this block")), EIO);
  EXPECT_EQ(ToErrno(VersionChangedError("changed").WithContext("read")), ESTALE);
  EXPECT_EQ(ToErrno(DataLossError("")), EIO);
  EXPECT_EQ(ToErrno(UnavailableError("")), EIO);
  EXPECT_EQ(ToErrno(DeadlineExceededError("")), EIO);
  EXPECT_EQ(ToErrno(InternalError("")), EIO);
  EXPECT_EQ(ToErrno(InvalidArgumentError("")), EINVAL);
  EXPECT_EQ(ToErrno(ResourceExhaustedError("")), ENOSPC);
  for (int c = 1; c <= 16; ++c) EXPECT_NE(ToErrno(Status(static_cast<Code>(c), "")), 0) << c;
}

}  // namespace
}  // namespace granary::fuse
