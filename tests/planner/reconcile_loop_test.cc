#include "setpoint/planner/reconcile_loop.h"

#include <atomic>
#include <stdexcept>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/status.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;

// A plan whose Create counts calls and can be told to fail.
class CountingPlan : public Plan {
 public:
  std::string Name() const override { return "counting"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    ++creates;
    if (fail) return absl::UnavailableError("api down");
    return Procedures{};
  }
  std::atomic<int> creates{0};
  std::atomic<bool> fail{false};
};

ReconcileLoopOptions Options(SimulatedClock* clock) {
  return {.interval = absl::Seconds(10),
          .jitter = 0,
          .failure_backoff = {.initial = absl::Seconds(1),
                              .max = absl::Seconds(4),
                              .multiplier = 2,
                              .jitter = 0},
          .clock = clock,
          .logger = ::setpoint::testing::NullLogger()};
}

// Waits until the loop's thread is parked on the clock after `executions`
// executions, so time can be advanced without racing it.
bool Parked(ReconcileLoop& loop, SimulatedClock& clock, int executions) {
  return AwaitCondition([&] {
    return loop.stats().executions + loop.stats().skipped_by_gate >=
               executions &&
           clock.num_waiters() >= 1;
  });
}

TEST(ReconcileLoop, RunsAtOnceThenEveryInterval) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(plan.creates, 1);
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), absl::Seconds(10));
  clock.AdvanceTime(absl::Seconds(9));
  EXPECT_EQ(plan.creates, 1);
  clock.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(Parked(loop, clock, 2));
  EXPECT_EQ(plan.creates, 2);
  ASSERT_TRUE(loop.last_report().has_value());
  EXPECT_THAT(loop.last_report()->status, IsOk());
  loop.Stop();
}

TEST(ReconcileLoop, JitterLengthensTheWaitWithinBounds) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoopOptions o = Options(&clock);
  o.jitter = 0.5;
  o.seed = 7;
  ReconcileLoop loop(plan, o);
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  absl::Duration wait = clock.NextDeadline() - clock.Now();
  EXPECT_GE(wait, absl::Seconds(10));
  EXPECT_LT(wait, absl::Seconds(15));
}

TEST(ReconcileLoop, TriggerRunsNowAndCoalesces) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  loop.Trigger();
  ASSERT_TRUE(Parked(loop, clock, 2));
  EXPECT_EQ(plan.creates, 2);
  loop.Stop();
  // Without a running thread, many triggers coalesce into one execution.
  for (int i = 0; i < 5; ++i) loop.Trigger();
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 3));
  EXPECT_EQ(plan.creates, 3);
  EXPECT_EQ(loop.stats().triggers, 6);
}

TEST(ReconcileLoop, FailuresBackOffExponentiallyThenReset) {
  SimulatedClock clock;
  CountingPlan plan;
  plan.fail = true;
  ReconcileLoop loop(plan, Options(&clock));
  ASSERT_THAT(loop.Start(), IsOk());
  const absl::Duration expected[] = {absl::Seconds(1), absl::Seconds(2),
                                     absl::Seconds(4), absl::Seconds(4)};
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Parked(loop, clock, i + 1));
    EXPECT_EQ(clock.NextDeadline() - clock.Now(), expected[i])
        << "failure " << i;
    clock.AdvanceTime(expected[i]);
  }
  ASSERT_TRUE(Parked(loop, clock, 5));
  EXPECT_EQ(loop.stats().consecutive_failures, 5);
  plan.fail = false;
  clock.AdvanceTime(absl::Seconds(4));
  ASSERT_TRUE(Parked(loop, clock, 6));
  EXPECT_EQ(loop.stats().consecutive_failures, 0);
  EXPECT_EQ(loop.stats().failures, 5);
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), absl::Seconds(10));
}

TEST(ReconcileLoop, GateSkipsExecutions) {
  SimulatedClock clock;
  CountingPlan plan;
  std::atomic<bool> leader{false};
  ReconcileLoopOptions o = Options(&clock);
  o.gate = [&] { return leader.load(); };
  ReconcileLoop loop(plan, o);
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(plan.creates, 0);
  EXPECT_EQ(loop.stats().skipped_by_gate, 1);
  leader = true;
  loop.Trigger();
  ASSERT_TRUE(AwaitCondition([&] { return loop.stats().executions == 1; }));
  EXPECT_EQ(plan.creates, 1);
}

TEST(ReconcileLoop, ThrowingGateAndCallbackDoNotKillTheLoop) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoopOptions o = Options(&clock);
  std::atomic<int> gate_calls{0};
  o.gate = [&]() -> bool {
    if (++gate_calls == 1) throw std::runtime_error("lease store down");
    return true;
  };
  o.on_report = [](const ExecutionReport&) {
    throw std::runtime_error("oops");
  };
  ReconcileLoop loop(plan, o);
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(loop.stats().skipped_by_gate, 1);
  loop.Trigger();
  ASSERT_TRUE(Parked(loop, clock, 2));
  EXPECT_EQ(loop.stats().executions, 1);
}

TEST(ReconcileLoop, StopCancelsARunningExecutionPromptly) {
  SimulatedClock clock;
  std::atomic<bool> started{false};
  auto plan =
      PlanFunc("blocks", [&](const Context&) -> absl::StatusOr<Procedures> {
        return ProcedureList(MakeProcedure(
            "wait forever",
            [&](const Context& ctx) -> absl::StatusOr<Procedures> {
              started = true;
              SETPOINT_RETURN_IF_ERROR(ctx.Wait(absl::InfiniteDuration()));
              return Procedures{};
            }));
      });
  std::optional<ExecutionReport> seen;
  Mutex mu;
  ReconcileLoopOptions o = Options(&clock);
  o.on_report = [&](const ExecutionReport& r) {
    MutexLock l(&mu);
    seen = r;
  };
  ReconcileLoop loop(plan, o);
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return started.load(); }));
  loop.Stop();  // Must return: the step's wait is cancelled.
  MutexLock l(&mu);
  ASSERT_TRUE(seen.has_value());
  EXPECT_THAT(seen->status, StatusIs(absl::StatusCode::kCancelled));
  // Cut short by Stop: reported, but not counted as a failure of the plan.
  EXPECT_EQ(loop.stats().failures, 0);
  EXPECT_EQ(loop.stats().executions, 0);
}

TEST(ReconcileLoop, GateSkipsKeepTheFailureBackoff) {
  SimulatedClock clock;
  CountingPlan plan;
  plan.fail = true;
  std::atomic<bool> open{true};
  ReconcileLoopOptions o = Options(&clock);
  o.gate = [&] { return open.load(); };
  ReconcileLoop loop(plan, o);
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));  // Failure 1: wait 1 s.
  clock.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(Parked(loop, clock, 2));  // Failure 2: wait 2 s.
  open = false;
  clock.AdvanceTime(absl::Seconds(2));
  ASSERT_TRUE(Parked(loop, clock, 3));  // Skipped: wait the interval.
  EXPECT_EQ(loop.stats().skipped_by_gate, 1);
  open = true;
  clock.AdvanceTime(absl::Seconds(10));
  ASSERT_TRUE(Parked(loop, clock, 4));  // Failure 3: the backoff went on.
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), absl::Seconds(4));
}

TEST(ReconcileLoop, RunEndsAtTheContextDeadline) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  absl::Status result;
  std::jthread t([&] {
    result =
        loop.Run(Context::Background(&clock).WithTimeout(absl::Seconds(3)));
  });
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), absl::Seconds(3));
  clock.AdvanceTime(absl::Seconds(3));
  t.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST(ReconcileLoop, OnReportSeesUpdatedStats) {
  SimulatedClock clock;
  CountingPlan plan;
  std::atomic<int64_t> seen{-1};
  ReconcileLoopOptions o = Options(&clock);
  ReconcileLoop* self = nullptr;
  o.on_report = [&](const ExecutionReport&) {
    seen = self->stats().executions;
  };
  ReconcileLoop loop(plan, o);
  self = &loop;
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  ASSERT_TRUE(AwaitCondition([&] { return seen.load() == 1; }));
}

TEST(ReconcileLoop, RunOnCallersThreadAndRefuseDoubleStart) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  std::stop_source stop;
  absl::Status result;
  std::jthread t([&] { result = loop.Run(Context(stop.get_token(), &clock)); });
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_THAT(loop.Run(Context()),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  stop.request_stop();
  t.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kCancelled));
  ASSERT_THAT(loop.Start(), IsOk());
  EXPECT_THAT(loop.Start(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(ReconcileLoopOptions, ValidateNamesTheField) {
  EXPECT_THAT(ValidateReconcileLoopOptions({}), IsOk());
  EXPECT_THAT(ValidateReconcileLoopOptions({.interval = absl::ZeroDuration()}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("interval")));
  EXPECT_THAT(ValidateReconcileLoopOptions({.jitter = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("jitter")));
  EXPECT_THAT(ValidateReconcileLoopOptions(
                  {.failure_backoff = {.initial = absl::ZeroDuration()}}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("failure_backoff")));
}

}  // namespace
}  // namespace setpoint
