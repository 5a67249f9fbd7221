#include "setpoint/base/retry.h"

#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;

RetryPolicy Fixed(int attempts) {
  return {.max_attempts = attempts,
          .backoff = {.initial = absl::Seconds(1),
                      .max = absl::Seconds(4),
                      .multiplier = 2,
                      .jitter = 0}};
}

TEST(Retry, RetriesUntilSuccessWaitingBackoffOnTheClock) {
  SimulatedClock clock({.auto_advance = true});
  Context ctx = Context::Background(&clock);
  int calls = 0, attempts = 0;
  std::vector<absl::Duration> delays;
  absl::Time t0 = clock.Now();
  absl::StatusOr<int> r = Retry(
      ctx, Fixed(5),
      [&]() -> absl::StatusOr<int> {
        if (++calls < 4) return absl::UnavailableError("503");
        return 42;
      },
      [&](int, const absl::Status&, absl::Duration d) {
        delays.push_back(d);
        return true;
      },
      0, &attempts);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(attempts, 4);
  EXPECT_THAT(delays, ::testing::ElementsAre(absl::Seconds(1), absl::Seconds(2),
                                             absl::Seconds(4)));
  EXPECT_EQ(clock.Now() - t0, absl::Seconds(7));
}

TEST(Retry, StopsAtMaxAttemptsWithTheLastError) {
  SimulatedClock clock({.auto_advance = true});
  int calls = 0;
  absl::Status s = Retry(Context::Background(&clock), Fixed(3), [&] {
    return absl::UnavailableError("503 #" + std::to_string(++calls));
  });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, "503 #3"));
}

TEST(Retry, TerminalErrorsAreNotRetriedByDefault) {
  int calls = 0;
  absl::Status s = Retry(Context(), Fixed(5), [&] {
    ++calls;
    return absl::PermissionDeniedError("no");
  });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(calls, 1);
}

TEST(Retry, CustomPredicateAndAThrowingOne) {
  SimulatedClock clock({.auto_advance = true});
  RetryPolicy only_aborted = Fixed(5);
  only_aborted.retryable = [](const absl::Status& s) {
    return absl::IsAborted(s);
  };
  int calls = 0;
  EXPECT_THAT(Retry(Context::Background(&clock), only_aborted,
                    [&] {
                      ++calls;
                      return absl::UnavailableError("503");
                    }),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(calls, 1);
  RetryPolicy throws = Fixed(5);
  throws.retryable = [](const absl::Status&) -> bool {
    throw std::runtime_error("bad predicate");
  };
  EXPECT_FALSE(IsRetryable(throws, absl::UnavailableError("x")));
  EXPECT_FALSE(IsRetryable(RetryPolicy{}, absl::OkStatus()));
}

TEST(Retry, HookCanStopRetrying) {
  int calls = 0;
  absl::Status s = Retry(
      Context(), Fixed(5),
      [&] {
        ++calls;
        return absl::UnavailableError("503");
      },
      [](int, const absl::Status&, absl::Duration) { return false; });
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(calls, 1);
}

TEST(Retry, CancelDuringTheWaitReturnsTheContextErrorWithTheLastError) {
  SimulatedClock clock;
  std::stop_source stop;
  absl::Status s;
  std::jthread t([&] {
    s = Retry(Context(stop.get_token(), &clock), Fixed(5),
              [] { return absl::UnavailableError("503"); });
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  stop.request_stop();
  t.join();
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kCancelled,
                          HasSubstr("failed with \"UNAVAILABLE: 503\"")));
}

TEST(Retry, SameSeedSameDelays) {
  RetryPolicy p = Fixed(6);
  p.backoff.jitter = 0.9;
  auto delays = [&](uint64_t seed) {
    SimulatedClock clock({.auto_advance = true});
    std::vector<absl::Duration> out;
    (void)Retry(
        Context::Background(&clock), p,
        [] { return absl::UnavailableError("503"); },
        [&](int, const absl::Status&, absl::Duration d) {
          out.push_back(d);
          return true;
        },
        seed);
    return out;
  };
  EXPECT_EQ(delays(5), delays(5));
  EXPECT_NE(delays(5), delays(6));
}

TEST(Retry, RefusesAPolicyItCannotFollowWithoutCallingFn) {
  int calls = 0;
  int attempts = -1;
  absl::Status s = Retry(
      Context(), RetryPolicy{.max_attempts = 0},
      [&] {
        ++calls;
        return absl::UnavailableError("down");
      },
      [](int, const absl::Status&, absl::Duration) { return true; }, 1,
      &attempts);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("max_attempts")));
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(attempts, 0);
  RetryPolicy bad_backoff{.max_attempts = 3};
  bad_backoff.backoff.multiplier = 0.5;
  EXPECT_THAT(
      ValidateRetryPolicy(bad_backoff),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiplier")));
  EXPECT_THAT(ValidateRetryPolicy({}), IsOk());
}

}  // namespace
}  // namespace setpoint
