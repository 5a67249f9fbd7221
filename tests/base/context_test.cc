#include "setpoint/base/context.h"

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

TEST(Context, BackgroundIsNeverDone) {
  Context ctx;
  EXPECT_FALSE(ctx.Done());
  EXPECT_THAT(ctx.Err(), IsOk());
  EXPECT_EQ(ctx.deadline(), absl::InfiniteFuture());
}

TEST(Context, CancelledByItsStopSource) {
  std::stop_source stop;
  Context ctx(stop.get_token());
  EXPECT_FALSE(ctx.Done());
  stop.request_stop();
  EXPECT_TRUE(ctx.Done());
  EXPECT_TRUE(ctx.Cancelled());
  EXPECT_THAT(ctx.Err(), StatusIs(absl::StatusCode::kCancelled));
}

TEST(Context, DeadlineOnTheInjectedClock) {
  SimulatedClock clock;
  Context ctx = Context::Background(&clock).WithTimeout(absl::Seconds(10));
  EXPECT_FALSE(ctx.Done());
  clock.AdvanceTime(absl::Seconds(10));
  EXPECT_TRUE(ctx.Done());
  EXPECT_FALSE(ctx.Cancelled());
  EXPECT_THAT(ctx.Err(), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(Context, ChildrenOnlyShortenTheDeadline) {
  SimulatedClock clock;
  Context parent = Context::Background(&clock).WithTimeout(absl::Seconds(10));
  Context longer = parent.WithTimeout(absl::Seconds(60));
  Context shorter = parent.WithTimeout(absl::Seconds(1));
  EXPECT_EQ(longer.deadline(), parent.deadline());
  EXPECT_EQ(shorter.deadline(), clock.Now() + absl::Seconds(1));
}

TEST(Context, CancellationWinsOverDeadline) {
  SimulatedClock clock;
  std::stop_source stop;
  Context ctx = Context(stop.get_token(), &clock).WithTimeout(absl::Seconds(1));
  clock.AdvanceTime(absl::Seconds(2));
  stop.request_stop();
  EXPECT_THAT(ctx.Err(), StatusIs(absl::StatusCode::kCancelled));
}

TEST(Context, WaitReturnsOkAfterTimeout) {
  SimulatedClock clock({.auto_advance = true});
  Context ctx = Context::Background(&clock);
  absl::Time t0 = clock.Now();
  EXPECT_THAT(ctx.Wait(absl::Seconds(3)), IsOk());
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(3));
}

TEST(Context, WaitStopsAtTheDeadline) {
  SimulatedClock clock({.auto_advance = true});
  Context ctx = Context::Background(&clock).WithTimeout(absl::Seconds(1));
  EXPECT_THAT(ctx.Wait(absl::Hours(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(clock.Now(), ctx.deadline());
}

TEST(Context, WaitWakesOnCancel) {
  SimulatedClock clock;
  std::stop_source stop;
  Context ctx(stop.get_token(), &clock);
  absl::Status result;
  std::jthread waiter([&] { result = ctx.Wait(absl::Hours(1)); });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  stop.request_stop();
  waiter.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kCancelled));
}

TEST(CancelScope, CancelsItsSubtreeOnly) {
  std::stop_source stop;
  Context parent(stop.get_token());
  CancelScope scope(parent);
  EXPECT_FALSE(scope.context().Done());
  scope.Cancel();
  EXPECT_TRUE(scope.context().Done());
  EXPECT_FALSE(parent.Done());
}

TEST(CancelScope, FollowsTheParent) {
  std::stop_source stop;
  SimulatedClock clock;
  Context parent =
      Context(stop.get_token(), &clock).WithTimeout(absl::Seconds(5));
  CancelScope scope(parent);
  EXPECT_EQ(scope.context().deadline(), parent.deadline());
  EXPECT_EQ(scope.context().clock(), &clock);
  stop.request_stop();
  EXPECT_THAT(scope.context().Err(), StatusIs(absl::StatusCode::kCancelled));
}

TEST(CancelScope, ParentAlreadyCancelled) {
  std::stop_source stop;
  stop.request_stop();
  CancelScope scope{Context(stop.get_token())};
  EXPECT_TRUE(scope.context().Cancelled());
}

struct Owner {
  int token;
};
struct Other {
  int n;
};

TEST(ContextValues, ChildrenCarryThemAndCanReplaceThem) {
  Context base;
  EXPECT_EQ(base.Value<Owner>(), nullptr);
  Context a = base.WithValue(std::make_shared<const Owner>(Owner{1}));
  Context b = a.WithValue(std::make_shared<const Other>(Other{7}))
                  .WithTimeout(absl::Seconds(1));
  ASSERT_NE(b.Value<Owner>(), nullptr);
  EXPECT_EQ(b.Value<Owner>()->token, 1);
  EXPECT_EQ(b.Value<Other>()->n, 7);
  Context c = b.WithValue(std::make_shared<const Owner>(Owner{2}));
  EXPECT_EQ(c.Value<Owner>()->token, 2);
  EXPECT_EQ(b.Value<Owner>()->token, 1);  // The parent is unchanged.
  EXPECT_EQ(c.WithValue<Owner>(nullptr).Value<Owner>(), nullptr);
  EXPECT_EQ(base.Value<Owner>(), nullptr);
}

TEST(ContextValues, WithValuesOfKeepsCancellationAndTakesValues) {
  std::stop_source stop;
  Context mine(stop.get_token());
  Context theirs = Context().WithValue(std::make_shared<const Owner>(Owner{5}));
  Context both = mine.WithValuesOf(theirs);
  EXPECT_EQ(both.Value<Owner>()->token, 5);
  stop.request_stop();
  EXPECT_TRUE(both.Cancelled());
  CancelScope scope(both);
  EXPECT_EQ(scope.context().Value<Owner>()->token, 5);
}

}  // namespace
}  // namespace setpoint
