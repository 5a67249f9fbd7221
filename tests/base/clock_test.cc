#include "setpoint/base/clock.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/simulated_clock.h"

namespace setpoint {
namespace {

using ::setpoint::testing::SimulatedClock;

TEST(SimulatedClock, TimeMovesOnlyWhenAdvanced) {
  SimulatedClock clock;
  absl::Time t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.AdvanceTime(absl::Seconds(3));
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(3));
  clock.AdvanceTime(-absl::Seconds(1));  // Ignored.
  clock.AdvanceTo(t0);                   // Never backwards.
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(3));
}

TEST(SimulatedClock, SleeperWakesWhenTimePassesItsDeadline) {
  SimulatedClock clock;
  std::atomic<bool> woke{false};
  std::atomic<bool> reached{false};
  std::jthread sleeper([&] {
    reached = clock.SleepFor(absl::Seconds(5));
    woke = true;
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  EXPECT_EQ(clock.NextDeadline(), clock.Now() + absl::Seconds(5));
  clock.AdvanceTime(absl::Seconds(4));
  // Still blocked: the waiter is still registered after the advance.
  EXPECT_EQ(clock.num_waiters(), 1);
  EXPECT_FALSE(woke);
  clock.AdvanceTime(absl::Seconds(1));
  sleeper.join();
  EXPECT_TRUE(woke);
  EXPECT_TRUE(reached);
  EXPECT_EQ(clock.num_waiters(), 0);
}

TEST(SimulatedClock, StopTokenCutsASleepShort) {
  SimulatedClock clock;
  std::atomic<bool> reached{true};
  std::jthread sleeper([&](std::stop_token st) {
    reached = clock.SleepFor(absl::Hours(1), st);
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  sleeper.request_stop();
  sleeper.join();
  EXPECT_FALSE(reached);
}

TEST(SimulatedClock, AwaitWithDeadlineReturnsWhenPredicateHolds) {
  SimulatedClock clock;
  Mutex mu;
  CondVar cv;
  bool ready = false;
  bool result = false;
  std::jthread waiter([&] {
    MutexLock l(&mu);
    result = clock.AwaitWithDeadline(&mu, &cv, absl::InfiniteFuture(), {},
                                     [&] { return ready; });
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  {
    MutexLock l(&mu);
    ready = true;
    cv.SignalAll();
  }
  waiter.join();
  EXPECT_TRUE(result);
}

TEST(SimulatedClock, ManyWaitersWakeInDeadlineOrder) {
  SimulatedClock clock;
  std::atomic<int> woken{0};
  std::vector<std::jthread> threads;
  for (int i = 1; i <= 4; ++i) {
    threads.emplace_back([&, i] {
      clock.SleepFor(absl::Seconds(i));
      ++woken;
    });
  }
  ASSERT_TRUE(clock.AwaitWaiters(4));
  for (int i = 1; i <= 4; ++i) {
    clock.AdvanceTime(absl::Seconds(1));
    ASSERT_TRUE(
        ::setpoint::testing::AwaitCondition([&] { return woken.load() == i; }));
    EXPECT_EQ(clock.num_waiters(), 4 - i);
  }
}

TEST(SimulatedClock, AutoAdvanceJumpsToDeadlines) {
  SimulatedClock clock({.auto_advance = true});
  absl::Time t0 = clock.Now();
  EXPECT_TRUE(clock.SleepFor(absl::Minutes(10)));
  EXPECT_EQ(clock.Now(), t0 + absl::Minutes(10));
}

TEST(SimulatedClock, AwaitWaitersTimesOut) {
  SimulatedClock clock;
  EXPECT_FALSE(clock.AwaitWaiters(1, absl::Milliseconds(5)));
}

TEST(RealClock, SleepsAndCanBeStopped) {
  Clock* clock = Clock::Real();
  absl::Time t0 = clock->Now();
  EXPECT_TRUE(clock->SleepFor(absl::Milliseconds(5)));
  EXPECT_GE(clock->Now() - t0, absl::Milliseconds(5));

  std::stop_source stop;
  stop.request_stop();
  EXPECT_FALSE(clock->SleepFor(absl::Hours(1), stop.get_token()));
}

TEST(RealClock, AwaitWithDeadlineTimesOut) {
  Clock* clock = Clock::Real();
  Mutex mu;
  CondVar cv;
  MutexLock l(&mu);
  EXPECT_FALSE(clock->AwaitWithDeadline(&mu, &cv,
                                        clock->Now() + absl::Milliseconds(2),
                                        {}, [] { return false; }));
}

}  // namespace
}  // namespace setpoint
