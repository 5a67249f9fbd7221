// Clock: where setpoint gets time and how it waits for it.
//
// Every component that waits or measures time takes a Clock* in its options,
// so tests can inject setpoint::testing::SimulatedClock and move time by hand:
// - A Runner defaults to Clock::Real(); the pieces that run on a runner
//   (sources, syncers, a Controller's parts) default to the runner's clock
//   (Runner::clock()), so a test sets the clock once.
// - Leases and fencing default to Clock::Monotonic(), which never steps:
//   NodeManager and InMemoryNodeRegistry (the Redis registry measures leases
//   on the Redis server's clock).
// - A ReconcileLoop, which runs on its own thread, takes the clock of its
//   options (default Clock::Real()); a Scheduler the clock of the Context it
//   is given.
// All waits go through the clock and are cancellable with a std::stop_token.
//
//   Mutex mu; CondVar cv; bool ready = false;
//   MutexLock l(&mu);
//   clock->AwaitWithDeadline(&mu, &cv, clock->Now() + absl::Seconds(1), stop,
//                            [&] { return ready; });
//
// Thread safety: implementations are thread-safe.
#ifndef SETPOINT_BASE_CLOCK_H_
#define SETPOINT_BASE_CLOCK_H_

#include <stop_token>

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "setpoint/base/mutex.h"

namespace setpoint {

class Clock {
 public:
  virtual ~Clock() = default;

  // The process-wide real clock (wall time from absl::Now(), waits on the
  // steady clock). Never destroyed.
  static Clock* Real();
  // The process's monotonic clock (steady, never steps; its absl::Time has an
  // arbitrary origin): for leases and timeouts that must not follow wall
  // clock jumps. Thread-safe; never destroyed.
  static Clock* Monotonic();

  // Returns the current time of this clock.
  virtual absl::Time Now() = 0;

  // Blocks until `pred()` holds, this clock reaches `deadline`, or `stop` is
  // requested; returns the final value of `pred()`. `mu` must be held on entry;
  // it is released while blocked and held again on return. Code that changes
  // what `pred` reads must hold `mu` and call `cv->SignalAll()`.
  // `deadline` may be absl::InfiniteFuture().
  virtual bool AwaitWithDeadline(Mutex* mu, CondVar* cv, absl::Time deadline,
                                 std::stop_token stop,
                                 absl::FunctionRef<bool()> pred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) = 0;

  // Sleeps until this clock reaches `deadline` or `stop` is requested.
  // Returns true when the deadline was reached, false when stopped first.
  bool SleepUntil(absl::Time deadline, std::stop_token stop = {});

  // Sleeps for `d` of this clock's time; see SleepUntil.
  bool SleepFor(absl::Duration d, std::stop_token stop = {});
};

}  // namespace setpoint

#endif  // SETPOINT_BASE_CLOCK_H_
