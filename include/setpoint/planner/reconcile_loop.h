// ReconcileLoop: runs a Plan again and again — every `interval`, at once on
// Trigger(), and after failures on a capped exponential backoff instead of
// the interval — so the world is pulled back whenever it drifts.
//
//   std::atomic<bool> leader{false};  // set by whatever elects the leader
//   setpoint::ReconcileLoop loop(
//       plan, {.interval = absl::Seconds(10),
//              .gate = [&] { return leader.load(); }});
//   loop.Start();          // own thread "sp-reconcile" (or options.pool's)
//   ...
//   loop.Trigger();        // an event says the world changed: run now
//   loop.Pause();          // cancels the running execution, waits for it
//   loop.Resume();         // runs again, at once
//   loop.Stop();           // cancels the running execution, joins
//
// Or run it on a thread you own: `loop.Run(ctx)` returns when ctx is cancelled.
// Or drive it by hand (tests with a SimulatedClock, no threads): call
// `loop.RunUntilIdle(ctx)` after moving the clock; NextWakeTime() says when.
//
// A step whose write is refused as a stale owner (IsStaleOwner) pauses the
// loop until Resume(): the process no longer owns what the plan writes.
//
// Thread safety: Trigger(), Pause(), Resume(), NextWakeTime(), last_report()
// and stats() may be called from any thread (Pause() not from inside an
// execution). Start(), Stop() and the destructor must not race each other
// (call them from one owner thread). The plan is only used by the thread that
// runs the loop (Start's thread, Run's or RunUntilIdle's caller).
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
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "setpoint/planner/execution_report.h"
#include "setpoint/planner/loop_pool.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/scheduler.h"
#include "spdlog/logger.h"

namespace setpoint {

struct ReconcileLoopOptions {
  // Time between the end of one successful execution and the next start.
  // Must be > 0.
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
  // Where the loop reads the time and waits. Must not be null.
  // Default: Clock::Real().
  Clock* clock = Clock::Real();
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
  // Runs the loop on the pod's shared threads instead of a thread of its
  // own: Start() attaches it, Stop() detaches it (cancelling its running
  // execution). Its clock must be the pool's. It must outlive the loop.
  // Default: none (Start() runs the loop on its own thread).
  LoopPool* pool = nullptr;
  // Seed for the jitter; 0 picks a random one.
  // Default: 0.
  uint64_t seed = 0;
  // The loop starts paused: nothing runs until Resume().
  // Default: false.
  bool start_paused = false;
  // Called on the loop's thread before each execution with its context
  // (cancelled by Stop() and Pause()); the execution runs with the context it
  // returns, e.g. `ctx.WithValue(...)` carrying the assignment it runs under.
  // Return a child of the argument (WithValue, WithTimeout) so the
  // cancellation is kept. If it throws, the execution is skipped and counted
  // as a failure (failure backoff). Default: none (the context as is).
  std::function<Context(const Context&)> execution_context = nullptr;
  // Where executions, steps, retries and rounds are counted
  // (setpoint_plan_*, docs/operations.md), labelled with metric_labels and
  // plan=<name>. Default: none.
  MetricsRegistry* metrics = nullptr;
  MetricLabels metric_labels = {};
};

// Returns kInvalidArgument naming the field when `options` is unusable.
absl::Status ValidateReconcileLoopOptions(const ReconcileLoopOptions& options);

// Counters for operators and tests.
struct ReconcileLoopStats {
  // Executions run (not one cut short by Stop or Pause).
  int64_t executions = 0;
  // Executions that did not converge (stale-owner refusals included), and
  // executions skipped because execution_context threw.
  int64_t failures = 0;
  int64_t consecutive_failures = 0;
  int64_t skipped_by_gate = 0;  // Wake-ups where the gate said no.
  int64_t triggers = 0;         // Trigger() calls (coalesced or not).
  // Executions whose report carries a stale-owner status (IsStaleOwner); each
  // paused the loop.
  int64_t stale_refusals = 0;
};

class ReconcileLoop {
 public:
  // `plan` must outlive the loop. Bad options are not corrected: Start() and
  // Run() return kInvalidArgument naming the field, RunUntilIdle() runs
  // nothing, and options_status() says why from the start.
  ReconcileLoop(Plan& plan, ReconcileLoopOptions options = {});
  // Calls Stop().
  ~ReconcileLoop();
  ReconcileLoop(const ReconcileLoop&) = delete;
  ReconcileLoop& operator=(const ReconcileLoop&) = delete;

  // Starts the loop on its own thread (or attaches it to options.pool); the
  // first execution starts at once.
  // Returns kInvalidArgument for bad options (see options_status()), or
  // kFailedPrecondition if already started or running via Run() or
  // RunUntilIdle().
  absl::Status Start();
  // Cancels the running execution (its context is cancelled), waits for the
  // thread to end (or for the pool's thread to return from it, and
  // detaches). Idempotent.
  void Stop();

  // Runs the loop on the calling thread until `ctx` is done (cancelled or past
  // its deadline); returns ctx.Err() then, kInvalidArgument for bad options,
  // or kFailedPrecondition if the loop is already running (Start, Run or
  // RunUntilIdle). Waits use options.clock; give
  // `ctx` the same clock.
  absl::Status Run(const Context& ctx);

  // Asks for an execution now. Calls while one is pending coalesce into one;
  // a call during an execution causes one more right after it.
  void Trigger();

  // Stops executions from starting, e.g. while this process gives up what the
  // plan manages. A running execution has its context cancelled; Pause
  // returns OK once it has ended (its report and on_report done), or ctx.Err()
  // if `ctx` ends first (the pause still holds). Idempotent. Any thread, but
  // not from inside an execution (plan, steps, gate, on_report,
  // execution_context): kFailedPrecondition then, and nothing is paused. With
  // scheduler.parallelism > 1 a step is only recognised if it passes its ctx.
  absl::Status Pause(const Context& ctx = Context());
  // Ends a pause (Pause(), start_paused or a stale-owner refusal); one
  // execution starts at once, as after Trigger(). Does nothing when not
  // paused. Any thread.
  void Resume();

  // Manual mode: if an execution is due now on options.clock (the first at
  // once, after Trigger()/Resume(), or once the interval or failure backoff
  // since the last one has passed) and the loop is not paused, runs it on the
  // calling thread. Returns whether an execution ran: false for a gate skip,
  // and false without doing anything while Start(), Run() or another
  // RunUntilIdle() is active, when `ctx` is done, or when the options are bad
  // (options_status()). Give `ctx` options.clock.
  bool RunUntilIdle(const Context& ctx);
  // When the next execution is due: absl::InfinitePast() if due now,
  // absl::InfiniteFuture() while paused or while an execution runs (unless a
  // Trigger() asks for one more). Any thread.
  absl::Time NextWakeTime() const;

  // OK, or kInvalidArgument naming the bad field of the options (what
  // ValidateReconcileLoopOptions returned for them).
  const absl::Status& options_status() const { return options_status_; }

  // The report of the last finished execution, if any.
  std::optional<ExecutionReport> last_report() const;
  // Any thread.
  ReconcileLoopStats stats() const;

 private:
  enum class Outcome { kConverged, kFailed, kSkipped };
  // The wait before the next execution after `outcome`.
  absl::Duration NextWaitLocked(Outcome outcome)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool GateOpen();

  // When the next execution is due, as NextWakeTime() says.
  absl::Time NextWakeTimeLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // If an execution is due now and the loop is not paused, claims it (clears
  // the trigger, marks it executing) and returns true.
  bool ClaimIfDueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs a claimed execution on the calling thread — gate, execution_context,
  // Scheduler::Execute, stats, on_report — sets when the next one is due and
  // ends the claim. Returns whether Scheduler::Execute ran. `ctx` is the
  // Run()/RunUntilIdle() context.
  bool RunClaimed(const Context& ctx) ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the claim taken by ClaimIfDueLocked; the next execution is due at
  // `next`.
  void EndClaimLocked(absl::Time next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  friend class LoopPool;
  // For the pool: runs the execution due now, if any, on the calling pool
  // thread.
  void RunOnPool(const Context& ctx) ABSL_LOCKS_EXCLUDED(mu_);

  Plan& plan_;
  std::string plan_name_;  // For logs; read once so a throwing Name() is safe.
  // Counts `report` in options_.metrics (no-op without).
  void CountReport(const ExecutionReport& report, bool interrupted, bool stale);
  // Makes every counter of options.metrics, at 0.
  void InitCounters();
  const ReconcileLoopOptions options_;
  const absl::Status options_status_;
  const Scheduler scheduler_;
  Clock* const clock_;
  spdlog::logger* const logger_;

  mutable Mutex mu_;
  CondVar cv_;
  // Run() or RunUntilIdle() is active, on `loop_thread_`.
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::thread::id loop_thread_ ABSL_GUARDED_BY(mu_);
  bool triggered_ ABSL_GUARDED_BY(mu_) = false;
  // No execution may start (Pause(), start_paused, a stale-owner refusal).
  bool paused_ ABSL_GUARDED_BY(mu_);
  // Between a claim and its end: the execution (gate to on_report) runs.
  // Pause() waits for it to turn false.
  bool executing_ ABSL_GUARDED_BY(mu_) = false;
  // The running execution's scope, so Pause() can cancel it; null outside
  // Scheduler::Execute. Owned by RunClaimed's stack frame.
  CancelScope* current_scope_ ABSL_GUARDED_BY(mu_) = nullptr;
  // When the next execution is due if not triggered or paused
  // (InfinitePast: at once; InfiniteFuture while one runs).
  absl::Time next_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::optional<ExecutionReport> last_report_ ABSL_GUARDED_BY(mu_);
  ReconcileLoopStats stats_ ABSL_GUARDED_BY(mu_);
  Backoff failure_backoff_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);  // For the interval jitter.

  // Owned by Start()/Stop(), which callers must not race with each other.
  std::jthread thread_;
  bool attached_ = false;  // Start() attached the loop to options_.pool.
};

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_RECONCILE_LOOP_H_
