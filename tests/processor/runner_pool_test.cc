#include "setpoint/processor/runner_pool.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
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

RunnerOptions OnPool(RunnerPool* pool, std::string name = "r") {
  return {.name = std::move(name),
          .clock = pool->clock(),
          .logger = NullLogger(),
          .pool = pool};
}

// What one runner's events saw: each producer's posts in order, and never
// two events at once.
struct Seen {
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int64_t> ran{0};
  int64_t last[2] = {-1, -1};  // Runner only.
  int64_t out_of_order = 0;    // Runner only.
};

// `n` started runners on `pool`, and what each one's events see.
void StartWatched(RunnerPool* pool, int n,
                  std::vector<std::unique_ptr<Runner>>* runners,
                  std::vector<std::unique_ptr<Seen>>* seen) {
  for (int i = 0; i < n; ++i) {
    runners->push_back(std::make_unique<Runner>(OnPool(pool)));
    seen->push_back(std::make_unique<Seen>());
    ASSERT_THAT(runners->back()->Start(), IsOk());
  }
}

TEST(RunnerPoolTest, HundredRunnersOnTwoThreadsRunEachOneAtATimeInOrder) {
  RunnerPool pool({.name = "p/runners", .threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  constexpr int kRunners = 100;
  constexpr int kPosts = 2000;
  std::vector<std::unique_ptr<Runner>> runners;
  std::vector<std::unique_ptr<Seen>> seen;
  ASSERT_NO_FATAL_FAILURE(StartWatched(&pool, kRunners, &runners, &seen));
  auto produce = [&](int producer) {
    for (int64_t n = 0; n < kPosts; ++n) {
      for (int i = 0; i < kRunners; i += 1 + (n % 3)) {
        Seen* s = seen[i].get();
        ASSERT_THAT(runners[i]->Post(
                        [s, producer, n] {
                          if (s->inside.fetch_add(1) != 0) ++s->overlaps;
                          if (s->last[producer] >= n) ++s->out_of_order;
                          s->last[producer] = n;
                          ++s->ran;
                          s->inside.fetch_sub(1);
                        },
                        "count"),
                    IsOk());
      }
    }
  };
  std::thread a(produce, 0), b(produce, 1);
  a.join();
  b.join();
  int64_t expected = 0;
  for (int64_t n = 0; n < kPosts; ++n) {
    for (int i = 0; i < kRunners; i += 1 + (n % 3)) ++expected;
  }
  ASSERT_TRUE(AwaitCondition([&] {
    int64_t total = 0;
    for (auto& s : seen) total += s->ran.load();
    return total == 2 * expected;
  }));
  EXPECT_EQ(ThreadsNamed("sp-runner"), 0);
  EXPECT_EQ(ThreadsNamed("sp-runners"), 2);
  for (int i = 0; i < kRunners; ++i) {
    runners[i]->Stop();
    EXPECT_EQ(seen[i]->overlaps.load(), 0) << i;
    EXPECT_EQ(seen[i]->out_of_order, 0) << i;
  }
  EXPECT_GT(pool.stats().turns, 0);
  pool.Stop();
  EXPECT_EQ(ThreadsNamed("sp-runners"), 0);
}

// A runner that goes idle with a timer pending asks the pool for a wake
// after it has said it sleeps; a post in that moment hands it to another
// worker at once. Posts that keep finding runners just asleep (a pause
// after each round) must each run once, in order, one at a time, with no
// two workers in one runner (ThreadSanitizer watches the handover).
TEST(RunnerPoolTest, PostsToRunnersFallingAsleepWithATimerPendingRunOnce) {
  RunnerPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  constexpr int kRunners = 8;
  constexpr int64_t kRounds = 500;
  std::vector<std::unique_ptr<Runner>> runners;
  std::vector<std::unique_ptr<Seen>> seen;
  ASSERT_NO_FATAL_FAILURE(StartWatched(&pool, kRunners, &runners, &seen));
  for (auto& r : runners) {
    // Each idle turn ends with a wake asked for this timer.
    ASSERT_THAT(r->PostAfter(absl::Hours(1), [] {}).status(), IsOk());
  }
  auto produce = [&](int producer) {
    for (int64_t n = 0; n < kRounds; ++n) {
      for (int i = producer; i < kRunners; i += 2) {
        Seen* s = seen[i].get();
        // Earlier than any timer before: the next idle turn asks for a wake.
        ASSERT_THAT(
            runners[i]
                ->PostAfter(absl::Hours(1) - absl::Microseconds(n + 1), [] {})
                .status(),
            IsOk());
        ASSERT_THAT(runners[i]->Post([s, n] {
          if (s->inside.fetch_add(1) != 0) ++s->overlaps;
          if (s->last[0] >= n) ++s->out_of_order;
          s->last[0] = n;
          ++s->ran;
          s->inside.fetch_sub(1);
        }),
                    IsOk());
      }
      // Long enough for the runners to run out of work and fall asleep.
      for (int spin = 0; spin < 50; ++spin) std::this_thread::yield();
    }
  };
  std::thread a(produce, 0), b(produce, 1);
  a.join();
  b.join();
  ASSERT_TRUE(AwaitCondition([&] {
    int64_t total = 0;
    for (auto& s : seen) total += s->ran.load();
    return total == kRunners * kRounds;
  }));
  for (int i = 0; i < kRunners; ++i) {
    runners[i]->Stop();
    EXPECT_EQ(seen[i]->ran.load(), kRounds) << i;
    EXPECT_EQ(seen[i]->overlaps.load(), 0) << i;
    EXPECT_EQ(seen[i]->out_of_order, 0) << i;
    EXPECT_EQ(runners[i]->stats().timers_dropped, kRounds + 1) << i;
  }
  EXPECT_GT(pool.stats().turns, 0);
  pool.Stop();
}

// A timer that comes due while its runner is in a turn: the pool finds
// the runner awake and drops its wake, and the turn must then run the
// timer or ask again, also when the turn looked at the clock just before
// the timer was due and said it sleeps just after the pool looked. Each
// round a runner arms a timer 1 ms ahead and busies itself until about
// then (a little before or after); nothing else posts to it, so a lost
// wake stops its rounds for good.
TEST(RunnerPoolTest, TimersDueWhileTheirRunnerIsBusyStillRun) {
  RunnerPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  constexpr int kRunners = 4;
  constexpr int kRounds = 100;
  struct Chain {
    std::unique_ptr<Runner> runner;
    std::atomic<int> rounds{0};
    uint64_t rng = 0;  // Runner only.
  };
  std::vector<std::unique_ptr<Chain>> chains;
  for (int i = 0; i < kRunners; ++i) {
    auto c = std::make_unique<Chain>();
    c->runner = std::make_unique<Runner>(OnPool(&pool));
    c->rng = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1);
    ASSERT_THAT(c->runner->Start(), IsOk());
    chains.push_back(std::move(c));
  }
  std::function<void(Chain*)> round = [&](Chain* c) {
    if (c->rounds.fetch_add(1) + 1 >= kRounds) return;
    const absl::Time due = absl::Now() + absl::Milliseconds(1);
    if (!c->runner->PostAt(due, [&round, c] { round(c); }).ok()) return;
    c->rng = c->rng * 6364136223846793005ull + 1442695040888963407ull;
    // Busy until 60 us either side of the timer, in steps of 1 us.
    const absl::Duration off =
        absl::Microseconds(static_cast<int64_t>((c->rng >> 33) % 121) - 60);
    (void)c->runner->Post([due, off] {
      while (absl::Now() < due + off) {
      }
    });
  };
  for (auto& c : chains) {
    Chain* p = c.get();
    ASSERT_THAT(p->runner->Post([&round, p] { round(p); }), IsOk());
  }
  EXPECT_TRUE(AwaitCondition(
      [&] {
        for (auto& c : chains) {
          if (c->rounds.load() < kRounds) return false;
        }
        return true;
      },
      absl::Seconds(60)));
  for (auto& c : chains) {
    EXPECT_EQ(c->rounds.load(), kRounds);
    c->runner->Stop();
  }
  pool.Stop();
}

// A simulated clock whose one armed thread, on its second look after
// Arm(), sees the time from before the clock moves to `to`: the look
// moves the clock, calls `moved` (which should get another thread going),
// and returns only once another thread has read the new time and gone
// back to waiting (a pool worker that handled the wakes due by then).
class StaleLookClock final : public Clock {
 public:
  explicit StaleLookClock(SimulatedClock* sim) : sim_(sim) {}

  void Arm(absl::Time to, std::function<void()> moved) {
    MutexLock l(&mu_);
    armed_ = std::this_thread::get_id();
    looks_ = 0;
    to_ = to;
    moved_fn_ = std::move(moved);
  }
  bool fired() {
    MutexLock l(&mu_);
    return fired_;
  }

  absl::Time Now() override {
    const absl::Time t = sim_->Now();
    MutexLock l(&mu_);
    if (armed_ != std::this_thread::get_id()) {
      if (moved_ && t >= to_) saw_.insert(std::this_thread::get_id());
      return t;
    }
    if (++looks_ < 2) return t;
    armed_ = std::thread::id{};
    moved_ = true;
    std::function<void()> moved = std::move(moved_fn_);
    const absl::Time to = to_;
    mu_.Unlock();
    sim_->AdvanceTo(to);
    moved();
    mu_.Lock();
    fired_ = cv_.WaitUntil(
        &mu_, {}, std::chrono::steady_clock::now() + std::chrono::seconds(10),
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return done_; });
    return t;  // The look from before the move.
  }

  bool AwaitWithDeadline(Mutex* mu, CondVar* cv, absl::Time deadline,
                         std::stop_token stop,
                         absl::FunctionRef<bool()> pred) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    {
      MutexLock l(&mu_);
      if (saw_.contains(std::this_thread::get_id())) {
        done_ = true;
        cv_.SignalAll();
      }
    }
    return sim_->AwaitWithDeadline(mu, cv, deadline, stop, pred);
  }

 private:
  SimulatedClock* const sim_;
  Mutex mu_;
  CondVar cv_;
  std::thread::id armed_ ABSL_GUARDED_BY(mu_);
  int looks_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time to_ ABSL_GUARDED_BY(mu_);
  std::function<void()> moved_fn_ ABSL_GUARDED_BY(mu_);
  bool moved_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool fired_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<std::thread::id> saw_ ABSL_GUARDED_BY(mu_);
};

// The pool drops a due wake it cannot claim because the runner is in a
// turn. Here that turn looked at the clock just before the timer was due
// (the clock above makes it so: a turn's second look after the event, at
// its end) and says it sleeps just after the other worker dropped the
// wake (a post to a second runner gets that worker going). The timer must
// still run.
TEST(RunnerPoolTest, ATimerWhoseWakeWasDroppedAsItsTurnEndedStillRuns) {
  SimulatedClock sim;
  StaleLookClock clock(&sim);
  RunnerPool pool({.threads = 2, .clock = &clock, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  Runner r(OnPool(&pool, "r"));
  Runner other(OnPool(&pool, "other"));
  ASSERT_THAT(r.Start(), IsOk());
  ASSERT_THAT(other.Start(), IsOk());
  std::atomic<bool> ran{false};
  const absl::Time due = sim.Now() + absl::Seconds(1);
  ASSERT_THAT(r.PostAt(due, [&] { ran = true; }).status(), IsOk());
  // Both workers wait: one for the timer's wake.
  ASSERT_TRUE(sim.AwaitWaiters(2));
  // The turn that runs this event is the one whose end looks early.
  ASSERT_THAT(r.Post([&] { clock.Arm(due, [&] { (void)other.Post([] {}); }); }),
              IsOk());
  EXPECT_TRUE(AwaitCondition([&] { return ran.load(); }))
      << "the timer never ran";
  EXPECT_TRUE(clock.fired()) << "the other worker never handled the wake";
  r.Stop();
  other.Stop();
  pool.Stop();
}

TEST(RunnerPoolTest, TimersWakeIdleRunnersEarlierOnesToo) {
  RunnerPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  Runner r(OnPool(&pool));
  ASSERT_THAT(r.Start(), IsOk());
  std::atomic<int> fired{0};
  ASSERT_THAT(r.PostAfter(absl::Hours(1), [&] { fired += 100; }).status(),
              IsOk());
  absl::StatusOr<TimerHandle> cancelled =
      r.PostAfter(absl::Milliseconds(5), [&] { fired += 1000; });
  ASSERT_THAT(cancelled.status(), IsOk());
  EXPECT_TRUE(cancelled->Cancel());
  // Idle with a wake an hour away: an earlier timer must still fire, the
  // pool waking the runner for it. On a loaded machine the runner may still
  // be in the turn that took the timer when it falls due (and then runs it
  // itself, no wake needed): try again, from idle, a few times.
  int posted = 0;
  for (int attempt = 0; attempt < 10 && pool.stats().timer_wakes == 0;
       ++attempt) {
    ASSERT_TRUE(
        AwaitCondition([&] { return r.BusyFor() == absl::ZeroDuration(); }));
    ASSERT_THAT(r.PostAfter(absl::Milliseconds(50), [&] { ++fired; }).status(),
                IsOk());
    ++posted;
    ASSERT_TRUE(AwaitCondition([&] { return fired.load() == posted; }));
  }
  r.Stop();
  EXPECT_EQ(fired.load(), posted);
  EXPECT_EQ(r.stats().timers_dropped, 1);
  EXPECT_EQ(r.stats().timers_cancelled, 1);
  EXPECT_GE(pool.stats().timer_wakes, 1);
}

TEST(RunnerPoolTest, TimersFollowThePoolsClock) {
  SimulatedClock clock;
  RunnerPool pool({.threads = 1, .clock = &clock, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  Runner r(OnPool(&pool));
  ASSERT_THAT(r.Start(), IsOk());
  std::atomic<int> fired{0};
  ASSERT_THAT(r.PostAfter(absl::Seconds(5), [&] { ++fired; }).status(), IsOk());
  clock.AdvanceTime(absl::Seconds(4));
  EXPECT_FALSE(AwaitCondition([&] { return fired.load() == 1; },
                              absl::Milliseconds(100)));
  clock.AdvanceTime(absl::Seconds(1));
  EXPECT_TRUE(AwaitCondition([&] { return fired.load() == 1; }));
  r.Stop();
}

TEST(RunnerPoolTest, StopRunsWhatWasPostedAndRefusesMore) {
  RunnerPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  Runner r(OnPool(&pool));
  int ran = 0;  // Runner only, read after Stop.
  // Posted before Start: the first turn runs them.
  for (int i = 0; i < 10; ++i) ASSERT_THAT(r.Post([&] { ++ran; }), IsOk());
  ASSERT_THAT(r.Start(), IsOk());
  for (int i = 0; i < 5000; ++i) ASSERT_THAT(r.Post([&] { ++ran; }), IsOk());
  r.Stop();
  EXPECT_EQ(ran, 5010);
  EXPECT_EQ(r.stats().events_run, 5010);
  EXPECT_THAT(r.Post([] {}), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r.Start(), StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(RunnerPoolTest, PostAndWaitAndIsCurrentOnAPool) {
  RunnerPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  Runner r(OnPool(&pool));
  ASSERT_THAT(r.Start(), IsOk());
  EXPECT_FALSE(r.IsCurrent());
  absl::StatusOr<bool> current =
      r.PostAndWait(Context(), [&] { return r.IsCurrent() && r.OnRunner(); });
  ASSERT_THAT(current.status(), IsOk());
  EXPECT_TRUE(*current);
  r.Stop();
}

// A queued turn wakes one idle thread, the one that went idle last (its
// caches still hold what the runner touched): a runner posted to while the
// whole pool waits runs on the same thread every time.
TEST(RunnerPoolTest, ATurnWakesTheThreadThatWentIdleLast) {
  RunnerPool pool({.threads = 4, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  Runner r(OnPool(&pool));
  ASSERT_THAT(r.Start(), IsOk());
  absl::flat_hash_set<std::thread::id> ran_on;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(AwaitCondition([&] { return pool.stats().idle == 4; }))
        << "round " << i << ": idle " << pool.stats().idle;
    absl::StatusOr<std::thread::id> on =
        r.PostAndWait(Context(), [] { return std::this_thread::get_id(); });
    ASSERT_THAT(on.status(), IsOk());
    ran_on.insert(*on);
  }
  EXPECT_EQ(ran_on.size(), 1u);
  r.Stop();
  EXPECT_EQ(pool.stats().threads, 4);
}

TEST(RunnerPoolTest, AnEventThatBlocksHoldsOneThreadAndTheOthersGoOn) {
  RunnerPool pool({.threads = 2, .logger = NullLogger()});
  ASSERT_THAT(pool.Start(), IsOk());
  Runner stuck(OnPool(&pool, "stuck"));
  Runner other(OnPool(&pool, "other"));
  ASSERT_THAT(stuck.Start(), IsOk());
  ASSERT_THAT(other.Start(), IsOk());
  Mutex mu;
  CondVar cv;
  bool open = false;
  std::atomic<bool> entered{false};
  ASSERT_THAT(stuck.Post([&] {
    entered = true;
    MutexLock l(&mu);
    cv.Wait(&mu, {}, [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return open; });
  }),
              IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return entered.load(); }));
  std::atomic<int> ran{0};
  for (int i = 0; i < 1000; ++i)
    ASSERT_THAT(other.Post([&] { ++ran; }), IsOk());
  EXPECT_TRUE(AwaitCondition([&] { return ran.load() == 1000; }));
  // The stuck one says so (what the pod's /healthz reads).
  EXPECT_TRUE(
      AwaitCondition([&] { return stuck.BusyFor() > absl::Milliseconds(20); }));
  // The other one, out of work, says it is not busy (once its last event
  // has returned: the count above is taken inside that event).
  EXPECT_TRUE(
      AwaitCondition([&] { return other.BusyFor() == absl::ZeroDuration(); }));
  {
    MutexLock l(&mu);
    open = true;
    cv.SignalAll();
  }
  stuck.Stop();
  other.Stop();
}

TEST(RunnerPoolTest, RefusesAnotherClockAPoolNotRunningAndBadOptions) {
  RunnerPool pool({.logger = NullLogger()});
  SimulatedClock other;
  RunnerOptions o = OnPool(&pool);
  Runner early(o);
  EXPECT_THAT(early.Start(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                      HasSubstr("not running")));
  ASSERT_THAT(pool.Start(), IsOk());
  o.clock = &other;
  Runner wrong(o);
  EXPECT_THAT(wrong.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                      HasSubstr("clock of pool runners")));
  RunnerPool bad({.threads = 0, .logger = NullLogger()});
  EXPECT_THAT(bad.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                    HasSubstr("threads")));
}

}  // namespace
}  // namespace setpoint
