#include "setpoint/base/backoff.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Backoff, GrowsExponentiallyAndCapsWithoutJitter) {
  Backoff b({.initial = absl::Milliseconds(100),
             .max = absl::Seconds(1),
             .multiplier = 2,
             .jitter = 0},
            1);
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
  EXPECT_EQ(b.Next(), absl::Milliseconds(200));
  EXPECT_EQ(b.Next(), absl::Milliseconds(400));
  EXPECT_EQ(b.Next(), absl::Milliseconds(800));
  EXPECT_EQ(b.Next(), absl::Seconds(1));
  EXPECT_EQ(b.Next(), absl::Seconds(1));
  EXPECT_EQ(b.attempts(), 6);
  b.Reset();
  EXPECT_EQ(b.attempts(), 0);
  EXPECT_EQ(b.Next(), absl::Milliseconds(100));
}

TEST(Backoff, ManyAttemptsDoNotOverflow) {
  Backoff b({.initial = absl::Seconds(1), .max = absl::Minutes(5), .jitter = 0},
            1);
  absl::Duration last;
  for (int i = 0; i < 5000; ++i) last = b.Next();
  EXPECT_EQ(last, absl::Minutes(5));
}

TEST(Backoff, JitterStaysInRangeAndIsDeterministicPerSeed) {
  BackoffOptions o{.initial = absl::Seconds(1),
                   .max = absl::Seconds(1),
                   .multiplier = 1,
                   .jitter = 0.5};
  Backoff a(o, 42), b(o, 42), c(o, 43);
  bool any_differs = false;
  for (int i = 0; i < 100; ++i) {
    absl::Duration da = a.Next();
    EXPECT_EQ(da, b.Next());
    EXPECT_GT(da, absl::Milliseconds(500));
    EXPECT_LE(da, absl::Seconds(1));
    if (da != c.Next()) any_differs = true;
  }
  EXPECT_TRUE(any_differs);
}

TEST(Backoff, ValidateNamesTheField) {
  EXPECT_THAT(ValidateBackoffOptions({}), IsOk());
  EXPECT_THAT(
      ValidateBackoffOptions({.initial = absl::ZeroDuration()}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("initial")));
  EXPECT_THAT(ValidateBackoffOptions(
                  {.initial = absl::Seconds(2), .max = absl::Seconds(1)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max")));
  EXPECT_THAT(
      ValidateBackoffOptions({.multiplier = 0.5}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiplier")));
  EXPECT_THAT(
      ValidateBackoffOptions({.jitter = 1.5}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("jitter")));
}

TEST(Backoff, CreateRefusesBadOptionsNamingTheField) {
  absl::StatusOr<Backoff> bad = Backoff::Create(
      {.initial = absl::Seconds(1), .max = absl::Seconds(5), .jitter = 7});
  EXPECT_THAT(bad.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("jitter")));
  absl::StatusOr<Backoff> good = Backoff::Create(
      {.initial = absl::Seconds(1), .max = absl::Seconds(5), .jitter = 0}, 7);
  ASSERT_THAT(good.status(), IsOk());
  EXPECT_EQ(good->Next(), absl::Seconds(1));
  EXPECT_EQ(good->Next(), absl::Seconds(2));
}

TEST(BackoffDeathTest, ConstructorAbortsOnOptionsNobodyValidated) {
  EXPECT_DEATH(Backoff({.initial = -absl::Seconds(1)}, 1), "initial");
}

}  // namespace
}  // namespace setpoint
