// Scheduler: runs a Plan until it converges.
//
// Execute() calls Plan::Create(); if it returns procedures it runs them (each
// procedure's children right after it, before its next sibling — depth first),
// then calls Create() again, until Create() returns nothing. It keeps an
// explicit stack, so a chain of millions of procedures needs constant native
// stack and memory for the pending work only.
//
//   setpoint::Scheduler scheduler({.max_rounds = 20});
//   setpoint::ExecutionReport report = scheduler.Execute(ctx, plan);
//   if (!report.status.ok()) LOG(...) << report.Summary();
//
// Safety rails: the context is checked before every Create() and every Do();
// exceptions from user code become failed steps; null or unnamed procedures
// are refused; a plan still returning work after max_rounds rounds stops with
// kAborted naming what it still wanted.
//
// Thread safety: Execute() and Preview() may be called concurrently on one
// Scheduler (they share only the options and the thread-safe cache of arena
// memory).
#ifndef SETPOINT_PLANNER_SCHEDULER_H_
#define SETPOINT_PLANNER_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "setpoint/base/context.h"
#include "setpoint/planner/execution_report.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/procedure.h"
#include "spdlog/logger.h"

namespace setpoint {

struct SchedulerOptions {
  // Create() calls that may return work before the execution is aborted with
  // kAborted (a plan that never converges). At least 1.
  // Default: 100.
  int max_rounds = 100;
  // Steps kept in ExecutionReport::steps; later steps are only counted.
  // At least 0.
  // Default: 10,000.
  int64_t max_recorded_steps = 10'000;
  // Procedures run at once. 1 runs them strictly in order (depth first).
  // Above 1, ready procedures — siblings returned together and the children
  // of finished ones — run on up to this many threads; each procedure still
  // runs after its parent. At least 1.
  // Default: 1.
  int parallelism = 1;
  // When false (the default) the first failed step stops the execution and
  // the steps still pending are reported as not run. When true, the round
  // goes on with the other steps (a failed step's children never run) and the
  // execution reports the first failure after the round ends.
  // Default: false.
  bool continue_on_failure = false;
  // The retry policy for procedures that set none; max_attempts at least 1
  // and valid backoff options.
  // Default: one attempt.
  RetryPolicy default_retry = {};
  // Seed for the jitter of retry backoffs, so tests can fix it; each step's
  // backoff uses seed + its position. 0 picks a random seed per execution.
  // Default: 0.
  uint64_t seed = 0;
  // Where the one line per execution (info when it converged, warn when
  // not) and the debug line per step go.
  // Default: spdlog's default logger at the time the Scheduler is made.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Returns kInvalidArgument naming the field when `options` is unusable.
absl::Status ValidateSchedulerOptions(const SchedulerOptions& options);

// One procedure that the next round would run, from Preview().
struct PreviewItem {
  std::string name;
  std::string description;
};

// Renders a preview as numbered lines, for printing.
std::string FormatPreview(const std::vector<PreviewItem>& items);

namespace planner_internal {
class ArenaChunkCache;
}  // namespace planner_internal

class Scheduler {
 public:
  // Keeps `options` as given (the logger filled in when null). Bad options
  // are not corrected: Execute() and Preview() refuse them (see below), and
  // options_status() says so at once.
  explicit Scheduler(SchedulerOptions options = {});

  // Runs `plan` until Create() returns nothing, the context ends, a step
  // fails (see continue_on_failure), or max_rounds passes. Never throws.
  // With bad options it runs nothing (no Create call): the report's status
  // is kInvalidArgument naming the field, as options_status() says.
  //
  // Procedures made while it runs (inside Create and Do, on the threads that
  // run them) take their memory from an arena of this execution; see
  // Procedure. The Scheduler keeps up to 8 MiB of that memory, and no more
  // than its last execution took, for the next one.
  ExecutionReport Execute(const Context& ctx, Plan& plan) const;

  // What the next round would run: calls Create() only (no Do()). Returns
  // Create's error, kInvalidArgument for null or unnamed procedures or for
  // bad options, or the context's error.
  absl::StatusOr<std::vector<PreviewItem>> Preview(const Context& ctx,
                                                   Plan& plan) const;

  const SchedulerOptions& options() const { return options_; }
  // OK, or kInvalidArgument naming the bad field of options() (what
  // ValidateSchedulerOptions returns).
  const absl::Status& options_status() const { return options_status_; }

 private:
  SchedulerOptions options_;
  absl::Status options_status_;
  // Arena memory kept between executions; shared by copies of this
  // Scheduler. Thread-safe.
  std::shared_ptr<planner_internal::ArenaChunkCache> arenas_;
};

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_SCHEDULER_H_
