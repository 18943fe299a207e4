// RetryUfsCall: the retry contract of the remote under-storages (ufs/ufs.h, UfsRetry), with the
// failures injected by the attempt itself.
#include <gtest/gtest.h>

#include <map>

#include "ufs/ufs.h"

namespace granary {
namespace {

TEST(UfsRetryTest, ARetryableFailureIsTriedAgainUntilItSucceeds) {
  UfsRetry r;  // 5 attempts, 20 s
  int calls = 0;
  StatusOr<int> got = RetryUfsCall(r, [&]() -> StatusOr<int> {
    if (++calls < 3) return UnavailableError("connection reset");
    return 42;
  });
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_EQ(*got, 42);
  EXPECT_EQ(calls, 3);
}

TEST(UfsRetryTest, OtherFailuresAreReturnedAtOnce) {
  UfsRetry r;
  for (Status fail : {NotFoundError("no such file"), PermissionDeniedError("denied"), VersionChangedError("changed")}) {
    int calls = 0;
    Status st = RetryUfsCall(r, [&] {
      ++calls;
      return fail;
    });
    EXPECT_EQ(st.code(), fail.code());
    EXPECT_EQ(calls, 1) << fail.message();
  }
}

TEST(UfsRetryTest, MaxAttemptsAndMayRetryBoundTheTries) {
  UfsRetry r;
  r.max_attempts = 3;
  int calls = 0;
  Status st = RetryUfsCall(r, [&] {
    ++calls;
    return UnavailableError("down");
  });
  EXPECT_TRUE(st.IsRetryable());
  EXPECT_EQ(calls, 3);

  calls = 0;
  bool handed_on = false;
  st = RetryUfsCall(
      r,
      [&] {
        ++calls;
        handed_on = true;  // a page went to the caller before the failure
        return UnavailableError("down");
      },
      [&] { return !handed_on; });
  EXPECT_EQ(calls, 1);
}

TEST(UfsRetryTest, NoRetryStartsAfterTheDeadline) {
  UfsRetry r;
  r.max_attempts = 100;
  r.deadline = std::chrono::milliseconds(0);
  int calls = 0;
  (void)RetryUfsCall(r, [&] {
    ++calls;
    return UnavailableError("down");
  });
  EXPECT_EQ(calls, 1);
}

TEST(UfsRetryTest, OptionsAreTakenOutAndCheckedByName) {
  std::map<std::string, std::string> o = {{"max_attempts", "7"}, {"retry_deadline", "3s"}, {"connections", "2"}};
  auto r = UfsRetry::FromOptions(&o);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->max_attempts, 7);
  EXPECT_EQ(r->deadline, std::chrono::milliseconds(3000));
  EXPECT_EQ(o, (std::map<std::string, std::string>{{"connections", "2"}}));
  std::map<std::string, std::string> bad = {{"max_attempts", "many"}};
  auto e = UfsRetry::FromOptions(&bad);
  EXPECT_EQ(e.status().code(), Code::kInvalidArgument);
  EXPECT_NE(e.status().message().find("max_attempts"), std::string::npos);
}

}  // namespace
}  // namespace granary
