#include "setpoint/base/status.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

absl::StatusOr<int> Half(int n) {
  if (n % 2 != 0) return absl::InvalidArgumentError("odd");
  return n / 2;
}

absl::Status Check(int n) {
  if (n < 0) return absl::OutOfRangeError("negative");
  return absl::OkStatus();
}

absl::StatusOr<int> Quarter(int n) {
  SETPOINT_RETURN_IF_ERROR(Check(n));
  SETPOINT_ASSIGN_OR_RETURN(int half, Half(n));
  SETPOINT_ASSIGN_OR_RETURN(auto quarter, Half(half));
  return quarter;
}

TEST(StatusMacros, PropagateErrorsAndValues) {
  EXPECT_THAT(Quarter(8), IsOk());
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_THAT(Quarter(6), StatusIs(absl::StatusCode::kInvalidArgument, "odd"));
  EXPECT_THAT(Quarter(-4), StatusIs(absl::StatusCode::kOutOfRange));
}

TEST(StatusMacros, ReturnIfErrorAcceptsStatusOr) {
  auto f = [](int n) -> absl::Status {
    SETPOINT_RETURN_IF_ERROR(Half(n));
    return absl::OkStatus();
  };
  EXPECT_THAT(f(2), IsOk());
  EXPECT_THAT(f(3), Not(IsOk()));
}

TEST(Annotate, PrependsContextKeepsCodeAndPayload) {
  absl::Status s = absl::UnavailableError("redis down");
  s.SetPayload("type.example/retry", absl::Cord("5s"));
  absl::Status a = Annotate(s, "renew lease node=pod-a/2");
  EXPECT_THAT(a, StatusIs(absl::StatusCode::kUnavailable,
                          "renew lease node=pod-a/2: redis down"));
  ASSERT_TRUE(a.GetPayload("type.example/retry").has_value());
  EXPECT_EQ(std::string(*a.GetPayload("type.example/retry")), "5s");
}

TEST(Annotate, OkStaysOk) {
  EXPECT_THAT(Annotate(absl::OkStatus(), "x"), IsOk());
  EXPECT_THAT(Annotate(absl::InternalError("e"), ""),
              StatusIs(absl::StatusCode::kInternal, "e"));
}

TEST(IsTerminalError, ClassifiesCodes) {
  EXPECT_TRUE(IsTerminalError(absl::InvalidArgumentError("")));
  EXPECT_TRUE(IsTerminalError(absl::PermissionDeniedError("")));
  EXPECT_TRUE(IsTerminalError(absl::FailedPreconditionError("")));
  EXPECT_FALSE(IsTerminalError(absl::UnavailableError("")));
  EXPECT_FALSE(IsTerminalError(absl::DeadlineExceededError("")));
  EXPECT_FALSE(IsTerminalError(absl::OkStatus()));
}

TEST(StaleOwner, MarkSurvivesAnnotateAndIsNotARetryHint) {
  absl::Status s = StaleOwnerError("token 3 < 5 for shard 9");
  EXPECT_TRUE(IsStaleOwner(s));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(IsStaleOwner(Annotate(s, "update r1")));
  EXPECT_FALSE(IsStaleOwner(absl::FailedPreconditionError("x")));
  EXPECT_TRUE(IsStaleOwner(AsStaleOwner(absl::AbortedError("x"))));
  EXPECT_TRUE(AsStaleOwner(absl::OkStatus()).ok());
  EXPECT_FALSE(RetryAfterHint(s).has_value());
}

TEST(UnsharedCopy, KeepsCodeMessageAndPayloads) {
  absl::Status s =
      WithRetryAfter(StaleOwnerError("token 3 < 5"), absl::Milliseconds(250));
  absl::Status copy = UnsharedCopy(s);
  EXPECT_EQ(copy, s);
  EXPECT_TRUE(IsStaleOwner(copy));
  EXPECT_EQ(RetryAfterHint(copy), absl::Milliseconds(250));
  EXPECT_NE(copy.message().data(), s.message().data()) << "its own storage";
  EXPECT_TRUE(UnsharedCopy(absl::OkStatus()).ok());
}

TEST(StatusMatchers, DescribeMismatch) {
  EXPECT_THAT(absl::NotFoundError("no such key"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("key")));
  EXPECT_THAT(absl::NotFoundError("x"),
              Not(StatusIs(absl::StatusCode::kInternal)));
}

}  // namespace
}  // namespace setpoint
