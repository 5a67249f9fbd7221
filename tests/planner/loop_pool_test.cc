#include "setpoint/planner/loop_pool.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/mutex.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/reconcile_loop.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"
#include "setpoint/testing/threads.h"

namespace setpoint {
namespace {

using ::setpoint::testing::ThreadsNamed;

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;

// A plan that counts its executions and, while `hold` is set, blocks each
// one until it is released or its context is cancelled.
class CountingPlan {
 public:
  CountingPlan()
      : plan_(MakePlan(
            "count", [this](const Context& ctx) -> absl::StatusOr<Procedures> {
              ++executions_;
              MutexLock l(&mu_);
              ++inside_;
              cv_.SignalAll();
              cv_.Wait(&mu_, ctx.stop_token(),
                       [this]()
                           ABSL_NO_THREAD_SAFETY_ANALYSIS { return !hold_; });
              if (ctx.Cancelled()) ++cancelled_;
              --inside_;
              return Procedures{};
            })) {}
  Plan& plan() { return *plan_; }
  int executions() const { return executions_.load(); }
  void Hold() {
    MutexLock l(&mu_);
    hold_ = true;
  }
  void Release() {
    MutexLock l(&mu_);
    hold_ = false;
    cv_.SignalAll();
  }
  int inside() {
    MutexLock l(&mu_);
    return inside_;
  }
  int cancelled() {
    MutexLock l(&mu_);
    return cancelled_;
  }

 private:
  std::atomic<int> executions_{0};
  Mutex mu_;
  CondVar cv_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  int inside_ ABSL_GUARDED_BY(mu_) = 0;
  int cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<Plan> plan_;
};

ReconcileLoopOptions OnPool(LoopPool* pool, absl::Duration interval) {
  return {.interval = interval,
          .jitter = 0,
          .clock = pool->clock(),
          .logger = NullLogger(),
          .pool = pool};
}

TEST(LoopPoolTest, HundredLoopsRunAgainAndAgainOnFourThreads) {
  LoopPool pool({.name = "p/loops", .max_threads = 4, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  std::vector<std::unique_ptr<CountingPlan>> plans;
  std::vector<std::unique_ptr<ReconcileLoop>> loops;
  for (int i = 0; i < 100; ++i) {
    plans.push_back(std::make_unique<CountingPlan>());
    loops.push_back(std::make_unique<ReconcileLoop>(
        plans.back()->plan(), OnPool(&pool, absl::Milliseconds(20))));
    ASSERT_THAT(loops.back()->Start(), IsOk());
  }
  EXPECT_TRUE(AwaitCondition([&] {
    for (auto& p : plans) {
      if (p->executions() < 3) return false;
    }
    return true;
  }));
  EXPECT_EQ(ThreadsNamed("sp-reconcile"), 0);
  EXPECT_LE(ThreadsNamed("sp-loop"), 4);
  EXPECT_LE(pool.stats().threads, 4);
  EXPECT_EQ(pool.stats().loops, 100);
  for (auto& l : loops) l->Stop();
  EXPECT_EQ(pool.stats().loops, 0);
  EXPECT_EQ(pool.stats().busy, 0);
  // Stopped loops run no more.
  std::vector<int> at_stop;
  for (auto& p : plans) at_stop.push_back(p->executions());
  pool.Stop();
  for (size_t i = 0; i < plans.size(); ++i) {
    EXPECT_EQ(plans[i]->executions(), at_stop[i]);
  }
  EXPECT_EQ(ThreadsNamed("sp-loop"), 0);
}

TEST(LoopPoolTest, TriggerAndResumeRunAWaitingLoopAtOnce) {
  LoopPool pool({.logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CountingPlan plan;
  ReconcileLoop loop(plan.plan(), OnPool(&pool, absl::Hours(1)));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return plan.executions() == 1; }));
  loop.Trigger();
  ASSERT_TRUE(AwaitCondition([&] { return plan.executions() == 2; }));
  ASSERT_THAT(loop.Pause(), IsOk());
  loop.Resume();
  ASSERT_TRUE(AwaitCondition([&] { return plan.executions() == 3; }));
  loop.Stop();
  EXPECT_EQ(loop.stats().executions, 3);
}

TEST(LoopPoolTest, LongExecutionsGrowThePoolToItsMaxAndTheRestWait) {
  LoopPool pool({.max_threads = 3,
                 .idle_timeout = absl::Milliseconds(50),
                 .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CountingPlan plan;
  plan.Hold();
  std::vector<std::unique_ptr<ReconcileLoop>> loops;
  for (int i = 0; i < 6; ++i) {
    loops.push_back(std::make_unique<ReconcileLoop>(
        plan.plan(), OnPool(&pool, absl::Hours(1))));
    ASSERT_THAT(loops.back()->Start(), IsOk());
  }
  // Three run at once, held; the other three wait for a thread.
  ASSERT_TRUE(AwaitCondition([&] { return plan.inside() == 3; }));
  EXPECT_EQ(pool.stats().threads, 3);
  EXPECT_EQ(pool.stats().busy, 3);
  EXPECT_EQ(plan.executions(), 3);
  plan.Release();
  // Every loop ran once; then the idle threads leave, one stays.
  ASSERT_TRUE(AwaitCondition([&] { return plan.executions() == 6; }));
  EXPECT_TRUE(AwaitCondition([&] { return pool.stats().threads == 1; }));
  // (A thread that left is gone from /proc once it has exited.)
  EXPECT_TRUE(AwaitCondition([] { return ThreadsNamed("sp-loop") == 1; }));
  for (auto& l : loops) l->Stop();
}

TEST(LoopPoolTest, StopCancelsTheRunningExecutionAndWaitsForIt) {
  LoopPool pool({.logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CountingPlan plan;
  plan.Hold();
  ReconcileLoop loop(plan.plan(), OnPool(&pool, absl::Hours(1)));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return plan.inside() == 1; }));
  loop.Stop();
  // Returned after the execution saw its cancellation and ended.
  EXPECT_EQ(plan.inside(), 0);
  EXPECT_EQ(plan.cancelled(), 1);
  EXPECT_EQ(pool.stats().loops, 0);
  // Started again: attached again, runs at once.
  plan.Release();
  ASSERT_THAT(loop.Start(), IsOk());
  EXPECT_TRUE(AwaitCondition([&] { return plan.executions() == 2; }));
  loop.Stop();
}

TEST(LoopPoolTest, WaitsOnThePoolsClock) {
  SimulatedClock clock;
  LoopPool pool({.clock = &clock, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CountingPlan plan;
  ReconcileLoop loop(plan.plan(), OnPool(&pool, absl::Seconds(10)));
  ASSERT_THAT(loop.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return plan.executions() == 1; }));
  // The next execution is scheduled from the end of the first; wait for that
  // end before moving the clock.
  const absl::Time due = clock.Now() + absl::Seconds(10);
  ASSERT_TRUE(AwaitCondition([&] { return loop.NextWakeTime() == due; }));
  clock.AdvanceTime(absl::Seconds(9));
  // Not due yet: nothing runs however long real time waits for it.
  EXPECT_FALSE(AwaitCondition([&] { return plan.executions() == 2; },
                              absl::Milliseconds(100)));
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_TRUE(AwaitCondition([&] { return plan.executions() == 2; }));
  loop.Stop();
}

TEST(LoopPoolTest, RefusesALoopWithAnotherClockAndBadOptions) {
  LoopPool pool({.logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  CountingPlan plan;
  SimulatedClock other;
  ReconcileLoopOptions o = OnPool(&pool, absl::Seconds(1));
  o.clock = &other;
  ReconcileLoop loop(plan.plan(), o);
  EXPECT_THAT(loop.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("clock of pool loops")));
  EXPECT_EQ(pool.stats().loops, 0);

  LoopPool bad({.max_threads = 0, .logger = NullLogger()});
  EXPECT_THAT(bad.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("max_threads")));
  LoopPool stopped({.logger = NullLogger()});
  stopped.Stop();
  ReconcileLoop late(plan.plan(), OnPool(&stopped, absl::Seconds(1)));
  EXPECT_THAT(late.Start(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace setpoint
