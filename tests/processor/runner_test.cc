#include "setpoint/processor/runner.h"

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
using ::testing::ElementsAre;

RunnerOptions Options(Clock* clock) {
  return {.name = "test",
          .clock = clock,
          .logger = ::setpoint::testing::NullLogger()};
}

TEST(Runner, ManualModeRunsEventsInOrderIncludingWhatTheyPost) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  std::vector<int> order;
  ASSERT_THAT(runner.Post([&] {
    order.push_back(1);
    EXPECT_TRUE(runner.IsCurrent());
    (void)runner.Post([&] { order.push_back(3); });
  }),
              IsOk());
  ASSERT_THAT(runner.Post([&] { order.push_back(2); }), IsOk());
  EXPECT_FALSE(runner.IsCurrent());
  EXPECT_EQ(runner.RunUntilIdle(), 3);
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
  EXPECT_EQ(runner.stats().events_run, 3);
}

TEST(Runner, TimersFireWhenTheClockPassesThem) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  std::vector<std::string> fired;
  ASSERT_THAT(runner.PostAfter(absl::Seconds(2), [&] { fired.push_back("b"); }),
              IsOk());
  ASSERT_THAT(runner.PostAfter(absl::Seconds(1), [&] { fired.push_back("a"); }),
              IsOk());
  ASSERT_THAT(runner.PostAt(clock.Now() + absl::Seconds(2),
                            [&] { fired.push_back("c"); }),
              IsOk());
  EXPECT_EQ(runner.RunUntilIdle(), 0);
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_EQ(runner.RunUntilIdle(), 1);
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_EQ(runner.RunUntilIdle(), 2);
  // Same time: in posting order.
  EXPECT_THAT(fired, ElementsAre("a", "b", "c"));
  EXPECT_EQ(runner.stats().timers_fired, 3);
}

TEST(Runner, CancelledTimersDoNotRun) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  bool ran = false;
  absl::StatusOr<TimerHandle> timer =
      runner.PostAfter(absl::Seconds(1), [&] { ran = true; });
  ASSERT_THAT(timer, IsOk());
  EXPECT_TRUE(timer->Cancel());
  EXPECT_FALSE(timer->Cancel());  // Once only.
  clock.AdvanceTime(absl::Seconds(5));
  EXPECT_EQ(runner.RunUntilIdle(), 0);
  EXPECT_FALSE(ran);
  EXPECT_EQ(runner.stats().timers_cancelled, 1);
  // A fired timer cannot be cancelled.
  absl::StatusOr<TimerHandle> fired =
      runner.PostAfter(absl::Seconds(1), [&] { ran = true; });
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_EQ(runner.RunUntilIdle(), 1);
  EXPECT_FALSE(fired->Cancel());
  EXPECT_TRUE(ran);
}

TEST(Runner, HandleOutlivesTheRunner) {
  SimulatedClock clock;
  absl::StatusOr<TimerHandle> timer;
  {
    Runner runner(Options(&clock));
    timer = runner.PostAfter(absl::Seconds(1), [] {});
  }
  ASSERT_THAT(timer, IsOk());
  EXPECT_FALSE(timer->Cancel());
}

TEST(Runner, ThrowingEventIsCountedAndTheRunnerGoesOn) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  bool after = false;
  ASSERT_THAT(runner.Post([] { throw std::runtime_error("bug"); }, "bad"),
              IsOk());
  ASSERT_THAT(runner.Post([] { throw 7; }, "worse"), IsOk());
  ASSERT_THAT(runner.Post([&] { after = true; }), IsOk());
  EXPECT_EQ(runner.RunUntilIdle(), 3);
  EXPECT_TRUE(after);
  EXPECT_EQ(runner.stats().events_threw, 2);
}

TEST(Runner, ThreadedRunnerRunsPostsFromManyThreadsInPerThreadOrder) {
  Runner runner(
      {.name = "threads", .logger = ::setpoint::testing::NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  constexpr int kThreads = 4, kEach = 5000;
  std::vector<std::vector<int>> seen(kThreads);  // Runner-only state.
  std::atomic<int> done{0};
  {
    std::vector<std::jthread> producers;
    for (int t = 0; t < kThreads; ++t) {
      producers.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          ASSERT_THAT(runner.Post([&, t, i] {
            seen[t].push_back(i);
            ++done;
          }),
                      IsOk());
        }
      });
    }
  }
  ASSERT_TRUE(AwaitCondition([&] { return done.load() == kThreads * kEach; }));
  runner.Stop();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(seen[t].size(), static_cast<size_t>(kEach));
    for (int i = 0; i < kEach; ++i) ASSERT_EQ(seen[t][i], i);
  }
}

TEST(Runner, ThreadedTimersWakeOnTheSimulatedClock) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  ASSERT_THAT(runner.Start(), IsOk());
  std::atomic<int> fired{0};
  ASSERT_THAT(runner.PostAfter(absl::Minutes(1), [&] { ++fired; }), IsOk());
  ASSERT_TRUE(clock.AwaitWaiters(1));
  // An earlier timer posted while the runner sleeps wakes it to re-plan.
  ASSERT_THAT(runner.PostAfter(absl::Seconds(1), [&] { ++fired; }), IsOk());
  ASSERT_TRUE(AwaitCondition(
      [&] { return clock.NextDeadline() == clock.Now() + absl::Seconds(1); }));
  clock.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitCondition([&] { return fired.load() == 1; }));
  clock.AdvanceTime(absl::Minutes(1));
  ASSERT_TRUE(AwaitCondition([&] { return fired.load() == 2; }));
}

TEST(Runner, StopRunsWhatWasPostedBeforeAndRefusesNewPosts) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  std::atomic<int> ran{0};
  std::atomic<bool> started{false}, release{false};
  absl::Status late;
  ASSERT_THAT(runner.PostAfter(absl::Hours(1), [&] { ++ran; }), IsOk());
  // The first event holds the runner until Stop() has begun, so the rest of
  // the queue runs during the drain, deterministically.
  ASSERT_THAT(runner.Post([&] {
    started = true;
    while (!release.load()) std::this_thread::yield();
  }),
              IsOk());
  for (int i = 0; i < 100; ++i) {
    ASSERT_THAT(runner.Post([&] {
      ++ran;
      late = runner.Post([] {});  // Posted during the drain: refused.
    }),
                IsOk());
  }
  ASSERT_THAT(runner.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return started.load(); }));
  std::jthread stopper([&] { runner.Stop(); });
  // Once Stop() has begun, posts are refused. Probes accepted before that
  // were posted before Stop() and run too.
  int probes = 0;
  ASSERT_TRUE(AwaitCondition([&] {
    if (!runner.Post([] {}, "probe").ok()) return true;
    ++probes;
    return false;
  }));
  release = true;
  stopper.join();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_THAT(late, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(runner.Post([] {}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(runner.PostAfter(absl::Seconds(1), [] {}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(runner.Start(), StatusIs(absl::StatusCode::kFailedPrecondition));
  RunnerStats stats = runner.stats();
  EXPECT_EQ(stats.events_run, 101 + probes);
  EXPECT_EQ(stats.timers_dropped, 1);  // Reported, not silently lost.
}

TEST(Runner, ManualStopReportsQueuedEventsAsDropped) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  bool ran = false;
  ASSERT_THAT(runner.Post([&] { ran = true; }), IsOk());
  ASSERT_THAT(runner.PostAfter(absl::Seconds(1), [&] { ran = true; }), IsOk());
  runner.Stop();
  EXPECT_FALSE(ran);
  EXPECT_EQ(runner.stats().events_dropped, 1);
  EXPECT_EQ(runner.stats().timers_dropped, 1);
  EXPECT_EQ(runner.RunUntilIdle(), 0);
}

TEST(Runner, SlowEventsAreCounted) {
  SimulatedClock clock;
  RunnerOptions o = Options(&clock);
  o.slow_event_threshold = absl::Milliseconds(20);
  Runner runner(o);
  ASSERT_THAT(runner.Post(
                  [] {
                    // Busy for longer than the threshold on the real
                    // monotonic clock (what the check measures).
                    auto until = std::chrono::steady_clock::now() +
                                 std::chrono::milliseconds(60);
                    while (std::chrono::steady_clock::now() < until) {
                    }
                  },
                  "blocking io"),
              IsOk());
  ASSERT_THAT(runner.Post([] {}), IsOk());
  EXPECT_EQ(runner.RunUntilIdle(), 2);
  EXPECT_EQ(runner.stats().slow_events, 1);
}

TEST(Runner, MoveOnlyClosures) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  auto value = std::make_unique<int>(41);
  int seen = 0;
  ASSERT_THAT(runner.Post([v = std::move(value), &seen] { seen = *v + 1; }),
              IsOk());
  runner.RunUntilIdle();
  EXPECT_EQ(seen, 42);
}

}  // namespace
}  // namespace setpoint
