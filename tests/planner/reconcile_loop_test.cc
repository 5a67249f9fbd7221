#include "setpoint/planner/reconcile_loop.h"

#include <atomic>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

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

// ---- Pause / Resume ---------------------------------------------------------

// A plan that converges once its one step has succeeded. The step runs
// `body`; until it returns OK, every execution runs it again.
class OneStepPlan : public Plan {
 public:
  using Body = std::function<absl::Status(const Context&)>;
  explicit OneStepPlan(Body body) : body_(std::move(body)) {}
  std::string Name() const override { return "one-step"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    ++creates;
    if (applied) return Procedures{};
    return ProcedureList(MakeProcedure(
        "apply", [this](const Context& ctx) -> absl::StatusOr<Procedures> {
          SETPOINT_RETURN_IF_ERROR(body_(ctx));
          applied = true;
          return Procedures{};
        }));
  }
  std::atomic<int> creates{0};
  std::atomic<bool> applied{false};

 private:
  Body body_;
};

TEST(ReconcileLoop, PauseCancelsTheRunningExecutionAndWaitsForItsEnd) {
  SimulatedClock clock;
  std::atomic<bool> started{false};
  std::atomic<bool> saw_cancel{false};
  std::atomic<bool> ended{false};
  std::atomic<bool> block{true};
  OneStepPlan plan([&](const Context& ctx) -> absl::Status {
    if (!block.exchange(false)) return absl::OkStatus();
    started = true;
    absl::Status s = ctx.Wait(absl::InfiniteDuration());
    saw_cancel = ctx.Cancelled();
    ended = true;
    return s;
  });
  std::atomic<int> reports{0};
  ReconcileLoopOptions o = Options(&clock);
  o.on_report = [&](const ExecutionReport&) { ++reports; };
  ReconcileLoop loop(plan, o);
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return started.load(); }));
  absl::Status paused = loop.Pause();
  // Read before anything else can happen: Pause returned only after the
  // step ended and on_report ran.
  const bool ended_at_return = ended.load();
  const int reports_at_return = reports.load();
  EXPECT_THAT(paused, IsOk());
  EXPECT_TRUE(ended_at_return);
  EXPECT_EQ(reports_at_return, 1);
  EXPECT_TRUE(saw_cancel);
  ASSERT_TRUE(loop.last_report().has_value());
  EXPECT_THAT(loop.last_report()->status,
              StatusIs(absl::StatusCode::kCancelled));
  // Cut short by Pause: not an execution, not a failure.
  EXPECT_EQ(loop.stats().executions, 0);
  EXPECT_EQ(loop.stats().failures, 0);
  EXPECT_EQ(loop.NextWakeTime(), absl::InfiniteFuture());
  // Neither time nor a trigger starts one while paused.
  EXPECT_THAT(loop.Pause(), IsOk());  // Idempotent.
  loop.Trigger();
  clock.AdvanceTime(absl::Hours(1));
  ASSERT_TRUE(AwaitCondition([&] { return clock.num_waiters() >= 1; }));
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
  EXPECT_EQ(plan.creates, 1);
  loop.Resume();
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(plan.creates, 3);  // The step, then converged.
  EXPECT_THAT(loop.last_report()->status, IsOk());
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), absl::Seconds(10));
}

TEST(ReconcileLoop, PauseReturnsWhenItsContextEndsAndThePauseHolds) {
  SimulatedClock clock;
  Mutex mu;
  CondVar cv;
  bool release = false;
  std::atomic<bool> started{false};
  std::atomic<bool> block{true};
  // The step ignores cancellation until released.
  OneStepPlan plan([&](const Context&) -> absl::Status {
    if (!block.exchange(false)) return absl::OkStatus();
    started = true;
    MutexLock l(&mu);
    cv.Wait(&mu, {}, [&] { return release; });
    return absl::OkStatus();
  });
  std::atomic<int> reports{0};
  ReconcileLoopOptions o = Options(&clock);
  o.on_report = [&](const ExecutionReport&) { ++reports; };
  ReconcileLoop loop(plan, o);
  auto release_step = [&] {
    MutexLock l(&mu);
    release = true;
    cv.SignalAll();
  };
  // Destroyed before the loop: a failed assertion must not leave the step
  // blocked while the loop's destructor joins it.
  struct Releaser {
    std::function<void()> fn;
    ~Releaser() { fn(); }
  } releaser{release_step};
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return started.load(); }));

  std::stop_source cancelled;
  cancelled.request_stop();
  EXPECT_THAT(loop.Pause(Context(cancelled.get_token(), &clock)),
              StatusIs(absl::StatusCode::kCancelled));

  absl::Status timed_out;
  std::jthread pauser([&] {
    timed_out =
        loop.Pause(Context::Background(&clock).WithTimeout(absl::Seconds(5)));
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));  // Only Pause waits on the clock.
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), absl::Seconds(5));
  clock.AdvanceTime(absl::Seconds(5));
  pauser.join();
  EXPECT_THAT(timed_out, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(reports, 0);  // The execution still runs.

  release_step();
  ASSERT_TRUE(AwaitCondition(
      [&] { return reports.load() == 1 && clock.num_waiters() >= 1; }));
  // Paused: the loop waits for Resume, not for a time.
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
  EXPECT_EQ(loop.NextWakeTime(), absl::InfiniteFuture());
  EXPECT_EQ(plan.creates, 1);
  EXPECT_EQ(loop.stats().executions, 0);
  EXPECT_EQ(loop.stats().failures, 0);
}

TEST(ReconcileLoop, ResumeRunsAtOnce) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_THAT(loop.Pause(), IsOk());
  loop.Resume();
  ASSERT_TRUE(Parked(loop, clock, 2));  // Without advancing the clock.
  EXPECT_EQ(plan.creates, 2);
  EXPECT_EQ(loop.stats().triggers, 0);  // Resume is not a Trigger.
}

TEST(ReconcileLoop, StartPausedRunsNothingUntilResume) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoopOptions o = Options(&clock);
  o.start_paused = true;
  ReconcileLoop loop(plan, o);
  EXPECT_EQ(loop.NextWakeTime(), absl::InfiniteFuture());
  EXPECT_FALSE(loop.RunUntilIdle(Context::Background(&clock)));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return clock.num_waiters() >= 1; }));
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
  loop.Trigger();
  clock.AdvanceTime(absl::Hours(1));
  EXPECT_EQ(plan.creates, 0);
  loop.Resume();
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(plan.creates, 1);
}

TEST(ReconcileLoop, PauseCutExecutionDoesNotGrowTheBackoff) {
  SimulatedClock clock;
  std::atomic<bool> started{false};
  std::atomic<bool> block{true};
  std::atomic<bool> fail{false};
  OneStepPlan plan([&](const Context& ctx) -> absl::Status {
    if (fail) return absl::UnavailableError("api down");
    if (!block.exchange(false)) return absl::OkStatus();
    started = true;
    return ctx.Wait(absl::InfiniteDuration());
  });
  ReconcileLoop loop(plan, Options(&clock));
  std::stop_source give_up;  // Ends RunUntilIdle should the pauser time out.
  absl::Status paused;
  std::jthread pauser([&] {
    if (AwaitCondition([&] { return started.load(); })) {
      paused = loop.Pause();
    } else {
      give_up.request_stop();
    }
  });
  // Manual mode: the execution runs here and Pause cuts it short.
  EXPECT_TRUE(loop.RunUntilIdle(Context(give_up.get_token(), &clock)));
  pauser.join();
  EXPECT_THAT(paused, IsOk());
  EXPECT_THAT(loop.last_report()->status,
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(loop.stats().failures, 0);
  EXPECT_EQ(loop.stats().consecutive_failures, 0);
  EXPECT_FALSE(loop.RunUntilIdle(Context::Background(&clock)));
  fail = true;
  loop.Resume();
  EXPECT_TRUE(loop.RunUntilIdle(Context::Background(&clock)));
  EXPECT_EQ(loop.stats().failures, 1);
  // The first step of the backoff: the cut execution did not count.
  EXPECT_EQ(loop.NextWakeTime() - clock.Now(), absl::Seconds(1));
}

TEST(ReconcileLoop, PauseFromInsideAnExecutionIsRefused) {
  for (int parallelism : {1, 2}) {
    SCOPED_TRACE(parallelism);
    SimulatedClock clock;
    ReconcileLoop* self = nullptr;
    Mutex mu;
    std::vector<absl::Status> from_steps;
    std::atomic<bool> planned{false};
    // With two workers the steps meet here, so one runs on a worker thread
    // (recognised by its ctx), the other on the loop's (by its thread).
    std::latch both(2);
    auto step = [&](const Context& ctx) -> absl::StatusOr<Procedures> {
      if (parallelism == 2) both.arrive_and_wait();
      absl::Status s = self->Pause(ctx);
      MutexLock l(&mu);
      from_steps.push_back(s);
      return Procedures{};
    };
    auto plan =
        PlanFunc("pauses", [&](const Context&) -> absl::StatusOr<Procedures> {
          if (planned.exchange(true)) return Procedures{};
          return ProcedureList(MakeProcedure("a", step),
                               MakeProcedure("b", step));
        });
    absl::Status from_gate;
    absl::Status from_on_report;
    ReconcileLoopOptions o = Options(&clock);
    o.scheduler.parallelism = parallelism;
    o.gate = [&] {
      from_gate = self->Pause();
      return true;
    };
    o.on_report = [&](const ExecutionReport&) {
      from_on_report = self->Pause();
    };
    ReconcileLoop loop(plan, o);
    self = &loop;
    EXPECT_TRUE(loop.RunUntilIdle(Context::Background(&clock)));
    EXPECT_THAT(from_gate, StatusIs(absl::StatusCode::kFailedPrecondition));
    EXPECT_THAT(from_on_report,
                StatusIs(absl::StatusCode::kFailedPrecondition));
    MutexLock l(&mu);
    ASSERT_EQ(from_steps.size(), 2u);
    for (const absl::Status& s : from_steps) {
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
    }
    // Refused calls pause nothing.
    EXPECT_THAT(loop.last_report()->status, IsOk());
    EXPECT_EQ(loop.NextWakeTime() - clock.Now(), absl::Seconds(10));
  }
}

// ---- execution_context ------------------------------------------------------

struct Assignment {
  int64_t token;
};

int64_t TokenOf(const Context& ctx) {
  const Assignment* a = ctx.Value<Assignment>();
  return a == nullptr ? -1 : a->token;
}

TEST(ReconcileLoop, ExecutionContextValueReachesCreateAndDo) {
  SimulatedClock clock;
  int64_t token = 7;
  std::vector<int64_t> in_create;
  std::vector<int64_t> in_do;
  bool need_step = true;
  auto plan =
      PlanFunc("valued", [&](const Context& ctx) -> absl::StatusOr<Procedures> {
        in_create.push_back(TokenOf(ctx));
        if (!need_step) return Procedures{};
        need_step = false;
        return ProcedureList(MakeProcedure(
            "write",
            [&](const Context& step_ctx) -> absl::StatusOr<Procedures> {
              in_do.push_back(TokenOf(step_ctx));
              return Procedures{};
            }));
      });
  bool hook_saw_live_ctx = false;
  ReconcileLoopOptions o = Options(&clock);
  o.execution_context = [&](const Context& ctx) {
    hook_saw_live_ctx = !ctx.Done();
    return ctx.WithValue(std::make_shared<const Assignment>(Assignment{token}));
  };
  ReconcileLoop loop(plan, o);
  const Context ctx = Context::Background(&clock);
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_TRUE(hook_saw_live_ctx);
  EXPECT_THAT(in_create, ::testing::ElementsAre(7, 7));
  EXPECT_THAT(in_do, ::testing::ElementsAre(7));
  // Called again for each execution.
  token = 8;
  need_step = true;
  loop.Trigger();
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_THAT(in_create, ::testing::ElementsAre(7, 7, 8, 8));
  EXPECT_THAT(in_do, ::testing::ElementsAre(7, 8));
}

TEST(ReconcileLoop, ThrowingExecutionContextSkipsAndBacksOff) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoopOptions o = Options(&clock);
  o.execution_context = [](const Context&) -> Context {
    throw std::runtime_error("no assignment");
  };
  ReconcileLoop loop(plan, o);
  const Context ctx = Context::Background(&clock);
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 0);
  EXPECT_EQ(loop.stats().executions, 0);
  EXPECT_EQ(loop.stats().failures, 1);
  EXPECT_EQ(loop.stats().consecutive_failures, 1);
  EXPECT_FALSE(loop.last_report().has_value());
  EXPECT_EQ(loop.NextWakeTime() - clock.Now(), absl::Seconds(1));
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(loop.NextWakeTime() - clock.Now(), absl::Seconds(2));
}

// ---- stale owner ------------------------------------------------------------

TEST(ReconcileLoop, StaleOwnerRefusalPausesUntilResume) {
  SimulatedClock clock;
  std::atomic<bool> stale{true};
  OneStepPlan plan([&](const Context&) -> absl::Status {
    if (stale) return StaleOwnerError("write shard=3 token=7: token 9 seen");
    return absl::OkStatus();
  });
  ReconcileLoop loop(plan, Options(&clock));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(loop.stats().stale_refusals, 1);
  EXPECT_EQ(loop.stats().failures, 1);
  ASSERT_TRUE(loop.last_report().has_value());
  // The Scheduler annotates the step's error; the stale mark survives.
  EXPECT_TRUE(IsStaleOwner(loop.last_report()->status));
  EXPECT_THAT(loop.last_report()->status,
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr("token 9 seen")));
  EXPECT_EQ(clock.NextDeadline(), absl::InfiniteFuture());
  EXPECT_EQ(loop.NextWakeTime(), absl::InfiniteFuture());
  clock.AdvanceTime(absl::Hours(1));
  loop.Trigger();
  ASSERT_TRUE(Parked(loop, clock, 1));
  EXPECT_EQ(plan.creates, 1);
  stale = false;  // The new assignment arrived.
  loop.Resume();
  ASSERT_TRUE(Parked(loop, clock, 2));
  EXPECT_THAT(loop.last_report()->status, IsOk());
  EXPECT_EQ(loop.stats().stale_refusals, 1);
  EXPECT_EQ(clock.NextDeadline() - clock.Now(), absl::Seconds(10));
}

TEST(ReconcileLoop, StaleOwnerFromCreateOrALaterStepIsRecognised) {
  SimulatedClock clock;
  const Context ctx = Context::Background(&clock);
  {
    auto plan = PlanFunc(
        "stale-read", [](const Context&) -> absl::StatusOr<Procedures> {
          return StaleOwnerError("read shard=3 token=7: token 9 seen");
        });
    ReconcileLoop loop(plan, Options(&clock));
    EXPECT_TRUE(loop.RunUntilIdle(ctx));
    EXPECT_EQ(loop.stats().stale_refusals, 1);
    EXPECT_EQ(loop.NextWakeTime(), absl::InfiniteFuture());
  }
  {
    // With continue_on_failure the report's status is the first failure;
    // a stale refusal of a later step still pauses the loop.
    std::atomic<bool> planned{false};
    auto plan = PlanFunc(
        "two-writes", [&](const Context&) -> absl::StatusOr<Procedures> {
          if (planned.exchange(true)) return Procedures{};
          return ProcedureList(
              MakeProcedure("a",
                            [](const Context&) -> absl::StatusOr<Procedures> {
                              return absl::UnavailableError("api down");
                            }),
              MakeProcedure("b",
                            [](const Context&) -> absl::StatusOr<Procedures> {
                              return StaleOwnerError("write shard=3 token=7");
                            }));
        });
    ReconcileLoopOptions o = Options(&clock);
    o.scheduler.continue_on_failure = true;
    ReconcileLoop loop(plan, o);
    EXPECT_TRUE(loop.RunUntilIdle(ctx));
    EXPECT_FALSE(IsStaleOwner(loop.last_report()->status));
    EXPECT_EQ(loop.stats().stale_refusals, 1);
    EXPECT_EQ(loop.NextWakeTime(), absl::InfiniteFuture());
  }
}

// ---- manual mode ------------------------------------------------------------

TEST(ReconcileLoop, RunIfDueFollowsTheIntervalAndTriggers) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  const Context ctx = Context::Background(&clock);
  EXPECT_EQ(loop.NextWakeTime(), absl::InfinitePast());  // The first at once.
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 1);
  const absl::Time due = clock.Now() + absl::Seconds(10);
  EXPECT_EQ(loop.NextWakeTime(), due);
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  loop.Resume();  // Not paused: does nothing.
  EXPECT_EQ(loop.NextWakeTime(), due);
  clock.AdvanceTime(absl::Seconds(10) - absl::Nanoseconds(1));
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 1);
  clock.AdvanceTime(absl::Nanoseconds(1));
  EXPECT_EQ(loop.NextWakeTime(), absl::InfinitePast());
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 2);
  EXPECT_EQ(loop.NextWakeTime(), clock.Now() + absl::Seconds(10));
  loop.Trigger();
  loop.Trigger();  // Coalesces.
  EXPECT_EQ(loop.NextWakeTime(), absl::InfinitePast());
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 3);
  EXPECT_EQ(loop.stats().executions, 3);
  EXPECT_EQ(loop.stats().triggers, 2);
}

TEST(ReconcileLoop, RunIfDueFollowsTheFailureBackoff) {
  SimulatedClock clock;
  CountingPlan plan;
  plan.fail = true;
  ReconcileLoop loop(plan, Options(&clock));
  const Context ctx = Context::Background(&clock);
  const absl::Duration expected[] = {absl::Seconds(1), absl::Seconds(2),
                                     absl::Seconds(4), absl::Seconds(4)};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(loop.RunUntilIdle(ctx));
    EXPECT_EQ(loop.NextWakeTime() - clock.Now(), expected[i]);
    clock.AdvanceTime(expected[i] - absl::Nanoseconds(1));
    EXPECT_FALSE(loop.RunUntilIdle(ctx));
    clock.AdvanceTime(absl::Nanoseconds(1));
  }
  plan.fail = false;
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(loop.stats().failures, 4);
  EXPECT_EQ(loop.stats().consecutive_failures, 0);
  EXPECT_EQ(loop.NextWakeTime() - clock.Now(), absl::Seconds(10));
}

TEST(ReconcileLoop, RunIfDueRunsNothingWhilePaused) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  const Context ctx = Context::Background(&clock);
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_THAT(loop.Pause(), IsOk());  // Nothing runs: returns at once.
  EXPECT_EQ(loop.NextWakeTime(), absl::InfiniteFuture());
  clock.AdvanceTime(absl::Hours(1));
  loop.Trigger();
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 1);
  loop.Resume();
  EXPECT_EQ(loop.NextWakeTime(), absl::InfinitePast());
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 2);
}

TEST(ReconcileLoop, RunIfDueDoesNothingWhileTheLoopRuns) {
  SimulatedClock clock;
  CountingPlan plan;
  ReconcileLoop loop(plan, Options(&clock));
  const Context ctx = Context::Background(&clock);
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(Parked(loop, clock, 1));
  loop.Trigger();
  ASSERT_TRUE(Parked(loop, clock, 2));
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  loop.Stop();
  EXPECT_EQ(plan.creates, 2);
  // Stopped: manual mode takes over where the thread left off.
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  loop.Trigger();
  EXPECT_TRUE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 3);
  // And Start/Run refuse while RunUntilIdle runs.
  ReconcileLoop* self = &loop;
  absl::Status start_inside;
  absl::Status run_inside;
  auto nested =
      PlanFunc("nested", [&](const Context&) -> absl::StatusOr<Procedures> {
        start_inside = self->Start();
        run_inside = self->Run(Context::Background(&clock));
        return Procedures{};
      });
  ReconcileLoop outer(nested, Options(&clock));
  self = &outer;
  EXPECT_TRUE(outer.RunUntilIdle(ctx));
  EXPECT_THAT(start_inside, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(run_inside, StatusIs(absl::StatusCode::kFailedPrecondition));
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

TEST(ReconcileLoopOptions, BadOptionsAreRefusedNotClamped) {
  SimulatedClock clock;
  CountingPlan plan;
  const Context ctx = Context::Background(&clock);

  ReconcileLoopOptions zero_interval = Options(&clock);
  zero_interval.interval = absl::ZeroDuration();
  ReconcileLoop loop(plan, zero_interval);
  EXPECT_THAT(loop.options_status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("interval must be > 0")));
  EXPECT_THAT(loop.Start(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr(
                           "start reconcile loop plan=counting: reconcile "
                           "loop options: interval must be > 0, got 0")));
  EXPECT_THAT(
      loop.Run(ctx),
      StatusIs(absl::StatusCode::kInvalidArgument,
               ::testing::HasSubstr("run reconcile loop plan=counting")));
  EXPECT_FALSE(loop.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 0);
  EXPECT_EQ(loop.stats().executions, 0);

  ReconcileLoopOptions high_jitter = Options(&clock);
  high_jitter.jitter = 1.5;
  ReconcileLoop jittery(plan, high_jitter);
  EXPECT_THAT(jittery.Start(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("jitter must be in [0, 1]")));

  ReconcileLoopOptions no_clock = Options(&clock);
  no_clock.clock = nullptr;
  ReconcileLoop clockless(plan, no_clock);
  EXPECT_THAT(clockless.Run(ctx),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("clock is null")));
  EXPECT_EQ(clockless.NextWakeTime(), absl::InfinitePast());

  ReconcileLoopOptions bad_scheduler = Options(&clock);
  bad_scheduler.scheduler.max_rounds = 0;
  ReconcileLoop unschedulable(plan, bad_scheduler);
  EXPECT_THAT(unschedulable.Start(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("max_rounds must be >= 1, got 0")));
  EXPECT_FALSE(unschedulable.RunUntilIdle(ctx));
  EXPECT_EQ(plan.creates, 0);
  EXPECT_THAT(ReconcileLoop(plan, Options(&clock)).options_status(), IsOk());
}

}  // namespace
}  // namespace setpoint
