// ReconcileLoop: runs a Plan again and again — every `interval`, at once on
// Trigger(), and after failures on a capped exponential backoff instead of
// the interval — so the world is pulled back whenever it drifts.
//
//   std::atomic<bool> leader{false};  // set by whatever elects the leader
//   setpoint::ReconcileLoop loop(
//       plan, {.interval = absl::Seconds(10),
//              .gate = [&] { return leader.load(); }});
//   loop.Start();          // own thread "sp-reconcile"
//   ...
//   loop.Trigger();        // an event says the world changed: run now
//   loop.Stop();           // cancels the running execution, joins
//
// Or run it on a thread you own: `loop.Run(ctx)` returns when ctx is cancelled.
//
// Thread safety: Trigger(), last_report() and stats() may be called from any
// thread. Start(), Stop() and the destructor must not race each other (call
// them from one owner thread). The plan is only used by the loop's thread.
#ifndef SETPOINT_PLANNER_RECONCILE_LOOP_H_
#define SETPOINT_PLANNER_RECONCILE_LOOP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/planner/execution_report.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/scheduler.h"
#include "spdlog/logger.h"

namespace setpoint {

struct ReconcileLoopOptions {
  // Time between the end of one successful execution and the next start.
  // Default: 10 s.
  absl::Duration interval = absl::Seconds(10);
  // Each wait is lengthened by a random fraction in [0, jitter) of itself, so
  // many loops do not run in lock step. In [0, 1].
  // Default: 0.1.
  double jitter = 0.1;
  // Waits after consecutive failed executions (reset by a success).
  // Default: 1 s doubling to 5 minutes, 20% jitter.
  BackoffOptions failure_backoff = {.initial = absl::Seconds(1),
                                    .max = absl::Minutes(5)};
  // Asked before each execution; when it returns false (or throws) the run is
  // skipped and asked again after `interval`. Use it so only the owner of a
  // shard or the leader runs the plan. Default (empty): always run.
  std::function<bool()> gate = nullptr;
  // Called on the loop's thread after every execution, once last_report() and
  // stats() include it. Exceptions are caught and logged. Default: none.
  std::function<void(const ExecutionReport&)> on_report = nullptr;
  // Options of the Scheduler that runs each execution.
  // Default: SchedulerOptions{}.
  SchedulerOptions scheduler = {};
  // Default: Clock::Real().
  Clock* clock = Clock::Real();
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
  // Seed for the jitter; 0 picks a random one.
  // Default: 0.
  uint64_t seed = 0;
};

// Returns kInvalidArgument naming the field when `options` is unusable.
absl::Status ValidateReconcileLoopOptions(const ReconcileLoopOptions& options);

// Counters for operators and tests.
struct ReconcileLoopStats {
  int64_t executions = 0;  // Executions run (not one cut short by Stop).
  int64_t failures = 0;    // Executions that did not converge.
  int64_t consecutive_failures = 0;
  int64_t skipped_by_gate = 0;  // Wake-ups where the gate said no.
  int64_t triggers = 0;         // Trigger() calls (coalesced or not).
};

class ReconcileLoop {
 public:
  // `plan` must outlive the loop. Invalid options are clamped (validate them
  // first with ValidateReconcileLoopOptions to report them).
  ReconcileLoop(Plan& plan, ReconcileLoopOptions options = {});
  // Calls Stop().
  ~ReconcileLoop();
  ReconcileLoop(const ReconcileLoop&) = delete;
  ReconcileLoop& operator=(const ReconcileLoop&) = delete;

  // Starts the loop on its own thread; the first execution starts at once.
  // Returns kFailedPrecondition if already started or running via Run().
  absl::Status Start();
  // Cancels the running execution (its context is cancelled), waits for the
  // thread to end. Idempotent.
  void Stop();

  // Runs the loop on the calling thread until `ctx` is done (cancelled or past
  // its deadline); returns ctx.Err() then, or kFailedPrecondition if the loop
  // is already running. Waits use options.clock; give `ctx` the same clock.
  absl::Status Run(const Context& ctx);

  // Asks for an execution now. Calls while one is pending coalesce into one;
  // a call during an execution causes one more right after it.
  void Trigger();

  // The report of the last finished execution, if any.
  std::optional<ExecutionReport> last_report() const;
  ReconcileLoopStats stats() const;

 private:
  enum class Outcome { kConverged, kFailed, kSkipped };
  // The wait before the next execution after `outcome`.
  absl::Duration NextWait(Outcome outcome);
  bool GateOpen();

  Plan& plan_;
  std::string plan_name_;  // For logs; read once so a throwing Name() is safe.
  const ReconcileLoopOptions options_;
  const Scheduler scheduler_;
  Clock* const clock_;
  spdlog::logger* const logger_;

  mutable Mutex mu_;
  CondVar cv_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool triggered_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<ExecutionReport> last_report_ ABSL_GUARDED_BY(mu_);
  ReconcileLoopStats stats_ ABSL_GUARDED_BY(mu_);
  Backoff failure_backoff_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);  // For the interval jitter.

  // Owned by Start()/Stop(), which callers must not race with each other.
  std::jthread thread_;
};

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_RECONCILE_LOOP_H_
