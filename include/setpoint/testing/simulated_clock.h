// SimulatedClock: a Clock whose time moves only when told to, for
// deterministic tests of anything that waits or times out.
//
//   setpoint::testing::SimulatedClock clock;
//   std::jthread t([&](std::stop_token st) {
//     clock.SleepFor(absl::Seconds(5), st);
//   });
//   clock.AwaitWaiters(1);                // the thread is blocked on the clock
//   clock.AdvanceTime(absl::Seconds(5));  // ...and wakes
//
// With `auto_advance` set, a wait that would block until a finite deadline
// instead moves the clock to that deadline at once: single-threaded code that
// sleeps (API latency, retry backoff) runs instantly and deterministically.
//
// Thread safety: thread-safe.
#ifndef SETPOINT_TESTING_SIMULATED_CLOCK_H_
#define SETPOINT_TESTING_SIMULATED_CLOCK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/mutex.h"

namespace setpoint::testing {

struct SimulatedClockOptions {
  // The time the clock starts at.
  // Default: 2026-01-01T00:00:00Z.
  absl::Time start = absl::FromUnixSeconds(1767225600);
  // Waits with a finite deadline advance the clock to it instead of blocking.
  // Default: false.
  bool auto_advance = false;
};

class SimulatedClock final : public Clock {
 public:
  explicit SimulatedClock(SimulatedClockOptions options = {});
  ~SimulatedClock() override;

  absl::Time Now() override;
  bool AwaitWithDeadline(Mutex* mu, CondVar* cv, absl::Time deadline,
                         std::stop_token stop,
                         absl::FunctionRef<bool()> pred) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Moves time forward by `d` (negative durations are ignored) and wakes every
  // waiter whose deadline has passed. Must not be called with a waiter's mutex
  // held.
  void AdvanceTime(absl::Duration d);
  // Moves time to `t` if it is later than now; see AdvanceTime.
  void AdvanceTo(absl::Time t);

  // Number of threads blocked in AwaitWithDeadline/SleepUntil right now.
  int num_waiters();
  // Blocks (in real time, up to `real_timeout`) until at least `n` threads are
  // blocked on this clock. Returns false on timeout. Use it to know a thread
  // reached its wait before advancing time, instead of sleeping.
  bool AwaitWaiters(int n, absl::Duration real_timeout = absl::Seconds(10));
  // The earliest finite deadline any waiter has, or InfiniteFuture.
  absl::Time NextDeadline();

 private:
  struct Waiter;

  void Register(const std::shared_ptr<Waiter>& w);
  void Unregister(const std::shared_ptr<Waiter>& w);

  const bool auto_advance_;
  Mutex mu_;
  CondVar waiters_changed_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Waiter>> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_SIMULATED_CLOCK_H_
