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
// Scheduler (they share nothing but the options).
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
  // The retry policy for procedures that set none.
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

class Scheduler {
 public:
  // Invalid options are clamped to the nearest valid values (check them with
  // ValidateSchedulerOptions first to report them).
  explicit Scheduler(SchedulerOptions options = {});

  // Runs `plan` until Create() returns nothing, the context ends, a step
  // fails (see continue_on_failure), or max_rounds passes. Never throws.
  ExecutionReport Execute(const Context& ctx, Plan& plan) const;

  // What the next round would run: calls Create() only (no Do()). Returns
  // Create's error, kInvalidArgument for null or unnamed procedures, or the
  // context's error.
  absl::StatusOr<std::vector<PreviewItem>> Preview(const Context& ctx,
                                                   Plan& plan) const;

  const SchedulerOptions& options() const { return options_; }

 private:
  SchedulerOptions options_;
};

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_SCHEDULER_H_
