#include "setpoint/processor/runner.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
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
using ::testing::HasSubstr;
using ::testing::Pointee;

RunnerOptions Options(Clock* clock) {
  return {.name = "test",
          .clock = clock,
          .logger = ::setpoint::testing::NullLogger()};
}

TEST(Runner, OnRunnerHoldsBeforeStartOnItsThreadAndAfterStop) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  EXPECT_EQ(runner.clock(), &clock);
  EXPECT_TRUE(runner.OnRunner());  // Not started: the owner wires pieces.
  ASSERT_THAT(runner.Start(), IsOk());
  std::atomic<bool> on_runner{false};
  ASSERT_THAT(runner.PostAndWait(Context::Background(),
                                 [&] { on_runner = runner.OnRunner(); }),
              IsOk());
  EXPECT_TRUE(on_runner.load());
  // The loop runs on its own thread now: the owner's thread is not it.
  ASSERT_TRUE(AwaitCondition([&] { return !runner.OnRunner(); }));
  runner.Stop();
  EXPECT_TRUE(runner.OnRunner());
}

TEST(Runner, OnRunnerInManualModeIsFalseOnAnotherThreadDuringRunUntilIdle) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  std::atomic<int> other{-1};
  ASSERT_THAT(runner.Post([&] {
    EXPECT_TRUE(runner.OnRunner());
    std::thread t([&] { other = runner.OnRunner() ? 1 : 0; });
    t.join();
  }),
              IsOk());
  EXPECT_EQ(runner.RunUntilIdle(), 1);
  EXPECT_EQ(other.load(), 0);
  std::thread t([&] { other = runner.OnRunner() ? 1 : 0; });
  t.join();
  EXPECT_EQ(other.load(), 1);  // Between RunUntilIdle calls: nobody runs it.
}

#ifndef NDEBUG
TEST(RunnerDeathTest, DcheckOnRunnerAbortsOffTheRunnerInDebugBuilds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SimulatedClock clock;
        Runner runner(Options(&clock));
        (void)runner.Start();
        (void)AwaitCondition([&] { return !runner.OnRunner(); });
        SETPOINT_DCHECK_ON_RUNNER(&runner);
      },
      "runner-only call off runner");
}
#endif

TEST(Runner, StartRefusesBadOptionsNamingTheField) {
  SimulatedClock clock;
  RunnerOptions o = Options(&clock);
  o.slow_event_threshold = -absl::Milliseconds(1);
  Runner runner(std::move(o));
  EXPECT_THAT(runner.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                       HasSubstr("slow_event_threshold")));
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

// Events go through segments of a few hundred slots; these tests post enough
// to cross several segment boundaries.
constexpr int kManyEvents = 5000;

TEST(Runner, ManualModeKeepsOrderAcrossSegmentsIncludingNestedPosts) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  std::vector<int> order;
  for (int i = 0; i < kManyEvents; ++i) {
    ASSERT_THAT(runner.Post([&, i] {
      order.push_back(i);
      // Every tenth event posts one more, queued after all of these.
      if (i % 10 == 0) {
        ASSERT_THAT(runner.Post([&, i] { order.push_back(kManyEvents + i); }),
                    IsOk());
      }
    }),
                IsOk());
  }
  EXPECT_EQ(runner.RunUntilIdle(), kManyEvents + kManyEvents / 10);
  ASSERT_EQ(order.size(), static_cast<size_t>(kManyEvents + kManyEvents / 10));
  for (int i = 0; i < kManyEvents; ++i) ASSERT_EQ(order[i], i);
  for (int j = 0; j < kManyEvents / 10; ++j) {
    ASSERT_EQ(order[kManyEvents + j], kManyEvents + 10 * j);
  }
  EXPECT_EQ(runner.stats().events_run, kManyEvents + kManyEvents / 10);
}

TEST(Runner, ManyProducersKeepPerThreadOrderAndCount) {
  Runner runner({.name = "many", .logger = ::setpoint::testing::NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  constexpr int kThreads = 8, kEach = 20000;
  std::vector<int> next(kThreads, 0);  // Runner-only state.
  std::atomic<int> out_of_order{0}, done{0};
  {
    std::vector<std::jthread> producers;
    for (int t = 0; t < kThreads; ++t) {
      producers.emplace_back([&, t] {
        for (int i = 0; i < kEach; ++i) {
          ASSERT_THAT(runner.Post([&, t, i] {
            if (next[t] != i) ++out_of_order;
            next[t] = i + 1;
            done.fetch_add(1, std::memory_order_relaxed);
          }),
                      IsOk());
        }
      });
    }
  }
  ASSERT_TRUE(AwaitCondition([&] { return done.load() == kThreads * kEach; }));
  runner.Stop();
  EXPECT_EQ(out_of_order.load(), 0);
  EXPECT_EQ(runner.stats().events_run, kThreads * kEach);
}

TEST(Runner, AnEventPostedAfterAnotherThreadsPostRunsAfterIt) {
  Runner runner(
      {.name = "causal", .logger = ::setpoint::testing::NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  constexpr int kRounds = 2000;
  std::vector<int> order;  // Runner-only state.
  std::atomic<int> done{0};
  for (int r = 0; r < kRounds; ++r) {
    std::atomic<bool> first_posted{false};
    std::jthread a([&] {
      ASSERT_THAT(runner.Post([&, r] { order.push_back(2 * r); }), IsOk());
      first_posted.store(true);
    });
    std::jthread b([&] {
      while (!first_posted.load()) std::this_thread::yield();
      ASSERT_THAT(runner.Post([&, r] {
        order.push_back(2 * r + 1);
        ++done;
      }),
                  IsOk());
    });
  }
  ASSERT_TRUE(AwaitCondition([&] { return done.load() == kRounds; }));
  runner.Stop();
  ASSERT_EQ(order.size(), static_cast<size_t>(2 * kRounds));
  for (int i = 0; i < 2 * kRounds; ++i) ASSERT_EQ(order[i], i);
}

TEST(Runner, EventsPostingManyEventsFromTheRunnerNeverBlock) {
  Runner runner({.name = "self", .logger = ::setpoint::testing::NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  std::vector<int> order;  // Runner-only state.
  std::atomic<bool> done{false};
  ASSERT_THAT(runner.Post([&] {
    // More than a segment at once from the runner's own thread.
    for (int i = 0; i < kManyEvents; ++i) {
      ASSERT_THAT(runner.Post([&, i] { order.push_back(i); }), IsOk());
    }
    ASSERT_THAT(runner.Post([&] { done = true; }), IsOk());
  }),
              IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return done.load(); }));
  runner.Stop();
  ASSERT_EQ(order.size(), static_cast<size_t>(kManyEvents));
  for (int i = 0; i < kManyEvents; ++i) ASSERT_EQ(order[i], i);
}

TEST(Runner, WakesForEachPostAfterFallingAsleep) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  ASSERT_THAT(runner.Start(), IsOk());
  std::atomic<int> ran{0};
  for (int i = 1; i <= 200; ++i) {
    // The runner sleeps on the clock once it has nothing to do.
    ASSERT_TRUE(clock.AwaitWaiters(1));
    ASSERT_THAT(runner.Post([&] { ++ran; }), IsOk());
    ASSERT_TRUE(AwaitCondition([&] { return ran.load() == i; })) << i;
  }
  runner.Stop();
  EXPECT_EQ(runner.stats().events_run, 200);
}

TEST(Runner, WakesForPostsRacingItsFallingAsleep) {
  Runner runner({.name = "race", .logger = ::setpoint::testing::NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  std::atomic<int> ran{0};
  std::mt19937 rng(7);
  for (int i = 1; i <= 300; ++i) {
    // Varying pauses: some posts land while the runner spins, some as it
    // decides to sleep, some while it sleeps.
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
    ASSERT_THAT(runner.Post([&] { ++ran; }), IsOk());
    ASSERT_TRUE(AwaitCondition([&] { return ran.load() == i; })) << i;
  }
}

TEST(Runner, StopRunsEventsLeftInPartlyReadSegments) {
  Runner runner({.name = "drain", .logger = ::setpoint::testing::NullLogger()});
  std::atomic<bool> started{false}, release{false};
  std::atomic<int> ran{0};
  // Manual mode first: the head ends inside a segment.
  for (int i = 0; i < 700; ++i) {
    ASSERT_THAT(runner.Post([&] { ++ran; }), IsOk());
  }
  EXPECT_EQ(runner.RunUntilIdle(), 700);
  ASSERT_THAT(runner.Post([&] {
    started = true;
    while (!release.load()) std::this_thread::yield();
  }),
              IsOk());
  for (int i = 0; i < 1500; ++i) {
    ASSERT_THAT(runner.Post([&] { ++ran; }), IsOk());
  }
  ASSERT_THAT(runner.Start(), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return started.load(); }));
  std::jthread stopper([&] { runner.Stop(); });
  ASSERT_TRUE(AwaitCondition([&] { return !runner.Post([] {}).ok(); }));
  release = true;
  stopper.join();
  EXPECT_EQ(ran.load(), 2200);
  EXPECT_EQ(runner.stats().events_dropped, 0);
}

TEST(Runner, ManualStopDropsWhatIsLeftInAPartlyReadSegment) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  int ran = 0;
  for (int i = 0; i < 600; ++i) {
    ASSERT_THAT(runner.Post([&] { ++ran; }), IsOk());
  }
  EXPECT_EQ(runner.RunUntilIdle(), 600);
  auto owned = std::make_shared<int>(1);
  for (int i = 0; i < 300; ++i) {
    ASSERT_THAT(runner.Post([&ran, owned] { ++ran; }), IsOk());
  }
  runner.Stop();
  EXPECT_EQ(ran, 600);
  EXPECT_EQ(owned.use_count(), 1);  // The dropped closures are destroyed.
  RunnerStats stats = runner.stats();
  EXPECT_EQ(stats.events_run, 600);
  EXPECT_EQ(stats.events_dropped, 300);
  EXPECT_EQ(runner.RunUntilIdle(), 0);
}

TEST(Runner, ManualStopInsideAnEventDropsTheRest) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  int ran = 0;
  for (int i = 0; i < 1000; ++i) {
    ASSERT_THAT(runner.Post([&, i] {
      ++ran;
      if (i == 299) runner.Stop();
    }),
                IsOk());
  }
  EXPECT_EQ(runner.RunUntilIdle(), 300);
  EXPECT_EQ(ran, 300);
  EXPECT_EQ(runner.stats().events_dropped, 700);
}

TEST(Runner, ManyTimersFireByTimeThenPostingOrder) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  const absl::Time start = clock.Now();
  constexpr int kTimers = 20000;
  std::mt19937 rng(1);
  std::vector<std::pair<int64_t, int>> expected;  // (ms, posting index)
  std::vector<std::pair<int64_t, int>> fired;
  auto post = [&](int index) {
    const int64_t ms = static_cast<int64_t>(rng() % 500);  // Many ties.
    expected.emplace_back(ms, index);
    ASSERT_THAT(
        runner.PostAt(start + absl::Milliseconds(ms),
                      [&fired, ms, index] { fired.emplace_back(ms, index); }),
        IsOk());
  };
  for (int i = 0; i < kTimers; ++i) post(i);
  // A few due, then most at once (taken in bulk), with timers posted
  // between the two.
  clock.AdvanceTo(start + absl::Milliseconds(10));
  runner.RunUntilIdle();
  for (int i = kTimers; i < kTimers + 1000; ++i) post(i);
  clock.AdvanceTo(start + absl::Milliseconds(400));
  runner.RunUntilIdle();
  clock.AdvanceTo(start + absl::Milliseconds(500));
  runner.RunUntilIdle();
  std::sort(expected.begin(), expected.end());
  // The second batch's timers due at 10 ms or earlier fire after the first
  // run; all others in (time, posting) order.
  std::vector<std::pair<int64_t, int>> early, rest;
  for (const auto& e : expected) {
    (e.first <= 10 && e.second < kTimers ? early : rest).push_back(e);
  }
  early.insert(early.end(), rest.begin(), rest.end());
  EXPECT_EQ(fired, early);
  EXPECT_EQ(runner.stats().timers_fired, kTimers + 1000);
}

TEST(Runner, TimerPostedByAFiringTimerAtAnEarlierTimeStillFires) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  const absl::Time start = clock.Now();
  std::vector<int> fired;
  for (int i = 0; i < 3000; ++i) {
    ASSERT_THAT(runner.PostAt(start + absl::Milliseconds(1 + i % 100),
                              [&, i] {
                                fired.push_back(i);
                                if (i == 0) {
                                  ASSERT_THAT(
                                      runner.PostAt(
                                          start, [&] { fired.push_back(-1); }),
                                      IsOk());
                                }
                              }),
                IsOk());
  }
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_EQ(runner.RunUntilIdle(), 3001);
  EXPECT_EQ(fired.size(), 3001u);
  EXPECT_EQ(fired.front(), 0);
  EXPECT_NE(std::find(fired.begin(), fired.end(), -1), fired.end());
}

TEST(Runner, ManyCancelledTimersAreForgottenAndTheRestFire) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  constexpr int kTimers = 10000;
  std::vector<TimerHandle> handles;
  std::vector<int> fired;
  for (int i = 0; i < kTimers; ++i) {
    absl::StatusOr<TimerHandle> h =
        runner.PostAfter(absl::Milliseconds(1 + (i * 37) % 1000),
                         [&, i] { fired.push_back(i); });
    ASSERT_THAT(h, IsOk());
    handles.push_back(*h);
  }
  int cancelled = 0;
  for (int i = 0; i < kTimers; ++i) {
    if (i % 4 != 0) {
      ASSERT_TRUE(handles[i].Cancel()) << i;
      ++cancelled;
    }
  }
  // Slots freed by cancelled timers are reused; old handles stay dead.
  std::vector<int> late;
  for (int i = 0; i < 100; ++i) {
    ASSERT_THAT(runner.PostAfter(absl::Milliseconds(2000),
                                 [&, i] { late.push_back(i); }),
                IsOk());
  }
  for (int i = 0; i < kTimers; ++i) {
    if (i % 4 != 0) {
      EXPECT_FALSE(handles[i].Cancel()) << i;
    }
  }
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_EQ(runner.RunUntilIdle(), kTimers - cancelled);
  for (int i : fired) EXPECT_EQ(i % 4, 0);
  EXPECT_EQ(fired.size(), static_cast<size_t>(kTimers - cancelled));
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_EQ(runner.RunUntilIdle(), 100);
  EXPECT_EQ(late.size(), 100u);
  RunnerStats stats = runner.stats();
  EXPECT_EQ(stats.timers_cancelled, cancelled);
  EXPECT_EQ(stats.timers_fired, kTimers - cancelled + 100);
}

TEST(Runner, CancelRacingTheFiringEitherCancelsOrRuns) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  ASSERT_THAT(runner.Start(), IsOk());
  constexpr int kTimers = 20000;
  auto ran = std::make_unique<std::atomic<bool>[]>(kTimers);
  std::vector<TimerHandle> handles;
  for (int i = 0; i < kTimers; ++i) {
    absl::StatusOr<TimerHandle> h = runner.PostAfter(
        absl::Milliseconds(1 + i % 7), [&ran, i] { ran[i] = true; });
    ASSERT_THAT(h, IsOk());
    handles.push_back(*h);
  }
  std::vector<bool> cancelled(kTimers);
  std::jthread advancer([&] { clock.AdvanceTime(absl::Seconds(1)); });
  for (int i = kTimers - 1; i >= 0; --i) cancelled[i] = handles[i].Cancel();
  advancer.join();
  ASSERT_TRUE(AwaitCondition([&] {
    RunnerStats s = runner.stats();
    return s.timers_fired + s.timers_cancelled == kTimers &&
           s.events_run == s.timers_fired;
  }));
  runner.Stop();
  int both_or_neither = 0;
  for (int i = 0; i < kTimers; ++i) {
    if (ran[i].load() == cancelled[i]) ++both_or_neither;
  }
  EXPECT_EQ(both_or_neither, 0);
  EXPECT_EQ(runner.stats().timers_dropped, 0);
}

TEST(Runner, CancelAfterStopOrDropReturnsFalse) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  absl::StatusOr<TimerHandle> timer = runner.PostAfter(absl::Seconds(1), [] {});
  ASSERT_THAT(timer, IsOk());
  TimerHandle copy = *timer;
  runner.Stop();
  EXPECT_FALSE(timer->Cancel());
  EXPECT_FALSE(copy.Cancel());
  EXPECT_FALSE(TimerHandle().Cancel());
  EXPECT_EQ(runner.stats().timers_dropped, 1);
  EXPECT_EQ(runner.stats().timers_cancelled, 0);
}

// PostAndWait ---------------------------------------------------------------

// Holds the runner inside an event until Open().
class Gate {
 public:
  // The event's body: blocks until Open().
  void Pass() {
    MutexLock l(&mu_);
    entered_ = true;
    cv_.Wait(&mu_, {},
             [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_; });
  }
  bool AwaitEntered() {
    return AwaitCondition([this] {
      MutexLock l(&mu_);
      return entered_;
    });
  }
  void Open() {
    MutexLock l(&mu_);
    open_ = true;
    cv_.SignalAll();
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool entered_ ABSL_GUARDED_BY(mu_) = false;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(RunnerPostAndWait, ReturnsWhatFnReturnsAsStatusOrStatusOr) {
  Runner runner(Options(Clock::Real()));
  ASSERT_THAT(runner.Start(), IsOk());
  const Context ctx;
  int runs = 0;  // Runner only.

  absl::Status done = runner.PostAndWait(ctx, [&] {
    EXPECT_TRUE(runner.IsCurrent());
    ++runs;
  });
  EXPECT_THAT(done, IsOk());

  auto value = runner.PostAndWait(ctx, [&] { return ++runs; });
  static_assert(std::is_same_v<decltype(value), absl::StatusOr<int>>);
  EXPECT_THAT(value, IsOk());
  EXPECT_EQ(value.value_or(0), 2);

  auto error = runner.PostAndWait(
      ctx, [] { return absl::NotFoundError("find vm=web-0: gone"); });
  static_assert(std::is_same_v<decltype(error), absl::Status>);
  EXPECT_THAT(error,
              StatusIs(absl::StatusCode::kNotFound, "find vm=web-0: gone"));

  auto text = runner.PostAndWait(
      ctx, []() -> absl::StatusOr<std::string> { return "pod-a"; });
  static_assert(std::is_same_v<decltype(text), absl::StatusOr<std::string>>);
  EXPECT_EQ(text.value_or(""), "pod-a");
  auto no_text = runner.PostAndWait(ctx, []() -> absl::StatusOr<std::string> {
    return absl::UnavailableError("cloud down");
  });
  EXPECT_THAT(no_text, StatusIs(absl::StatusCode::kUnavailable));

  // A reference is copied out; a move-only value is moved out.
  const std::string name = "observed";
  auto copied =
      runner.PostAndWait(ctx, [&]() -> const std::string& { return name; });
  static_assert(std::is_same_v<decltype(copied), absl::StatusOr<std::string>>);
  EXPECT_EQ(copied.value_or(""), "observed");
  auto moved = runner.PostAndWait(ctx, [] { return std::make_unique<int>(7); });
  ASSERT_THAT(moved, IsOk());
  EXPECT_THAT(*moved, Pointee(7));
}

TEST(RunnerPostAndWait, OnTheRunnerRunsInline) {
  Runner runner(Options(Clock::Real()));
  ASSERT_THAT(runner.Start(), IsOk());
  std::vector<std::string> order;  // Runner only.
  auto outer = runner.PostAndWait(Context(), [&] {
    EXPECT_THAT(runner.Post([&] { order.push_back("posted"); }), IsOk());
    // Waiting for the runner from the runner would never return: inline.
    auto inner = runner.PostAndWait(Context(), [&] {
      order.push_back("inline");
      return 5;
    });
    order.push_back("outer");
    return inner.value_or(0);
  });
  EXPECT_EQ(outer.value_or(0), 5);
  auto seen = runner.PostAndWait(Context(), [&] { return order; });
  EXPECT_THAT(seen.value_or(std::vector<std::string>{}),
              ElementsAre("inline", "outer", "posted"));
}

TEST(RunnerPostAndWait, RefusedAfterStopAndFnNeverRuns) {
  auto captured = std::make_shared<int>(0);
  bool ran = false;
  {
    Runner runner(Options(Clock::Real()));
    ASSERT_THAT(runner.Start(), IsOk());
    runner.Stop();
    EXPECT_THAT(runner.PostAndWait(Context(), [&, captured] { ran = true; }),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         HasSubstr("runner stopped")));
    EXPECT_EQ(captured.use_count(), 1);  // fn is gone when it returns.
  }
  {
    SimulatedClock clock;
    Runner manual(Options(&clock));
    manual.Stop();
    EXPECT_THAT(manual.PostAndWait(Context(), [&] { return ran = true; }),
                StatusIs(absl::StatusCode::kFailedPrecondition));
  }
  EXPECT_FALSE(ran);
}

TEST(RunnerPostAndWait, AnEndedContextMeansFnNeverRuns) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  ASSERT_THAT(runner.Start(), IsOk());
  std::atomic<bool> ran{false};
  std::stop_source stop;
  stop.request_stop();
  EXPECT_THAT(runner.PostAndWait(Context(stop.get_token(), &clock),
                                 [&] { ran = true; }),
              StatusIs(absl::StatusCode::kCancelled));
  const Context expired = Context::Background(&clock).WithDeadline(clock.Now());
  EXPECT_THAT(runner.PostAndWait(expired, [&] { return ran = true; }),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // Not on the runner's thread either, where fn would run inline.
  auto inside = runner.PostAndWait(Context(), [&] {
    return runner.PostAndWait(expired, [&] { ran = true; });
  });
  EXPECT_THAT(inside, StatusIs(absl::StatusCode::kDeadlineExceeded));
  runner.Stop();
  EXPECT_FALSE(ran);
}

TEST(RunnerPostAndWait, GivesUpWhenTheDeadlinePassesWhileQueued) {
  SimulatedClock clock;  // The caller's context's clock only.
  Runner runner(Options(Clock::Real()));
  ASSERT_THAT(runner.Start(), IsOk());
  Gate gate;
  ASSERT_THAT(runner.Post([&] { gate.Pass(); }, "gate"), IsOk());
  ASSERT_TRUE(gate.AwaitEntered());

  std::atomic<bool> ran{false};
  auto captured = std::make_shared<int>(0);
  absl::Status result;
  long captures_left = 0;
  std::thread caller([&] {
    const Context ctx =
        Context::Background(&clock).WithTimeout(absl::Seconds(5));
    {
      // fn refers to a local that is gone once PostAndWait returned.
      int local = 0;
      result = runner.PostAndWait(ctx, [&ran, &local, captured] {
        ran = true;
        ++local;
      });
    }
    captures_left = captured.use_count();
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));  // The caller waits on the clock.
  clock.AdvanceTime(absl::Seconds(4));
  EXPECT_EQ(clock.num_waiters(), 1);
  clock.AdvanceTime(absl::Seconds(1));
  caller.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(captures_left, 1);  // fn was destroyed before the return.

  // The event is still queued behind the gate; run it: it does nothing.
  gate.Open();
  runner.Stop();
  EXPECT_FALSE(ran);
  EXPECT_EQ(runner.stats().events_run, 2);
}

TEST(RunnerPostAndWait, GivesUpWhenCancelledWhileQueued) {
  SimulatedClock clock;  // Shows when the caller waits; time never moves.
  Runner runner(Options(Clock::Real()));
  ASSERT_THAT(runner.Start(), IsOk());
  Gate gate;
  ASSERT_THAT(runner.Post([&] { gate.Pass(); }, "gate"), IsOk());
  ASSERT_TRUE(gate.AwaitEntered());

  std::atomic<bool> ran{false};
  std::stop_source stop;
  absl::Status result;
  std::thread caller([&] {
    result = runner.PostAndWait(Context(stop.get_token(), &clock),
                                [&] { ran = true; });
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));  // Posted, and waiting.
  stop.request_stop();
  caller.join();
  EXPECT_THAT(result, StatusIs(absl::StatusCode::kCancelled));
  gate.Open();
  runner.Stop();
  EXPECT_FALSE(ran);
  EXPECT_EQ(runner.stats().events_run, 2);
}

TEST(RunnerPostAndWait, OnceFnStartedWaitsForItWhateverTheContext) {
  SimulatedClock clock;
  Runner runner(Options(Clock::Real()));
  ASSERT_THAT(runner.Start(), IsOk());
  Gate gate;
  absl::StatusOr<int> result;
  std::thread caller([&] {
    const Context ctx =
        Context::Background(&clock).WithTimeout(absl::Seconds(5));
    result = runner.PostAndWait(ctx, [&] {
      gate.Pass();
      return 3;
    });
  });
  ASSERT_TRUE(gate.AwaitEntered());
  clock.AdvanceTime(absl::Seconds(10));  // Past the deadline, fn running.
  gate.Open();
  caller.join();
  EXPECT_THAT(result, IsOk());
  EXPECT_EQ(result.value_or(0), 3);
}

TEST(RunnerPostAndWait, AThrowingFnIsInternalAndTheRunnerGoesOn) {
  Runner runner(Options(Clock::Real()));
  ASSERT_THAT(runner.Start(), IsOk());
  EXPECT_THAT(runner.PostAndWait(
                  Context(), []() -> int { throw std::runtime_error("boom"); },
                  "read items"),
              StatusIs(absl::StatusCode::kInternal,
                       "post and wait on runner test origin=read items: "
                       "fn threw: boom"));
  EXPECT_THAT(runner.PostAndWait(Context(), [] { throw 7; }),
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("non-standard exception")));
  EXPECT_EQ(runner.PostAndWait(Context(), [] { return 1; }).value_or(0), 1);
  // Caught inside the event: the runner saw no throw.
  EXPECT_EQ(runner.stats().events_threw, 0);
}

TEST(RunnerPostAndWait, ManualModeRunsTheQueueOnTheCallingThread) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  std::vector<std::string> order;
  ASSERT_THAT(runner.Post([&] { order.push_back("before"); }), IsOk());
  ASSERT_THAT(
      runner.PostAfter(absl::Seconds(1), [&] { order.push_back("timer"); }),
      IsOk());
  auto n = runner.PostAndWait(Context::Background(&clock), [&] {
    EXPECT_TRUE(runner.IsCurrent());
    EXPECT_THAT(runner.Post([&] { order.push_back("posted by fn"); }), IsOk());
    order.push_back("fn");
    return order.size();
  });
  EXPECT_EQ(n.value_or(0), 2u);
  EXPECT_THAT(order, ElementsAre("before", "fn", "posted by fn"));
  EXPECT_FALSE(runner.IsCurrent());
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_THAT(runner.PostAndWait(Context(), [] {}), IsOk());
  EXPECT_EQ(order.back(), "timer");
}

TEST(RunnerPostAndWait, ManualModeChecksTheContextWhenFnComesUp) {
  SimulatedClock clock;
  Runner runner(Options(&clock));
  bool ran = false;
  // An earlier event moves the clock past the caller's deadline.
  ASSERT_THAT(runner.Post([&] { clock.AdvanceTime(absl::Seconds(2)); }),
              IsOk());
  EXPECT_THAT(runner.PostAndWait(
                  Context::Background(&clock).WithTimeout(absl::Seconds(1)),
                  [&] { ran = true; }),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // An earlier event stops the runner: the rest is dropped, fn with it.
  ASSERT_THAT(runner.Post([&] { runner.Stop(); }), IsOk());
  EXPECT_THAT(runner.PostAndWait(Context(), [&] { ran = true; }),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("stopped before it ran")));
  EXPECT_FALSE(ran);
  EXPECT_EQ(runner.stats().events_dropped, 1);
}

}  // namespace
}  // namespace setpoint
