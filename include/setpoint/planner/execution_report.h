// ExecutionReport: what one Scheduler::Execute did — its outcome, counters and
// the tree of steps — with exports to JSON and Graphviz DOT.
//
//   ExecutionReport r = scheduler.Execute(ctx, plan);
//   if (!r.status.ok()) std::cerr << r.Summary() << "\n";
//   std::ofstream("run.dot") << r.ToDot();   // dot -Tsvg run.dot
//
// Thread safety: a plain value; the usual rules for const/non-const access.
#ifndef SETPOINT_PLANNER_EXECUTION_REPORT_H_
#define SETPOINT_PLANNER_EXECUTION_REPORT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace setpoint {

enum class StepOutcome {
  kSucceeded,  // Do() returned OK (possibly after retries).
  kFailed,     // Do() failed on its last attempt, threw, or returned nulls.
  kNotRun,     // Accepted but never started: the run stopped first.
};

std::string_view StepOutcomeName(StepOutcome outcome);

// One procedure the execution accepted.
struct StepRecord {
  // Position in ExecutionReport::steps. Steps are recorded as they finish
  // (with parallelism > 1, in finishing order); not-run steps are recorded
  // when the run gives up on them.
  int64_t id = 0;
  // Id of the step that returned this one; -1 when Plan::Create did.
  int64_t parent = -1;
  // The round (1-based Create call) the step belongs to.
  int round = 0;
  std::string name;
  StepOutcome outcome = StepOutcome::kSucceeded;
  // The error of a failed step; OK otherwise.
  absl::Status status = {};
  // Calls of Do() made (0 for not-run steps).
  int attempts = 0;
  // When the step started, relative to the execution's start, and how long
  // all its attempts took (including backoff waits).
  absl::Duration start = {};
  absl::Duration duration = {};
};

struct ExecutionReport {
  std::string plan;
  // Unique within the process, increasing.
  uint64_t execution_id = 0;
  // OK when the plan converged (Create returned nothing). Otherwise the first
  // failure: a step's error, kCancelled/kDeadlineExceeded, or kAborted when
  // max_rounds passed.
  absl::Status status;
  // Create calls that returned work (each such round ran).
  int rounds = 0;
  // Counters over the whole execution (not cut by max_recorded_steps).
  int64_t steps_run = 0;
  int64_t steps_failed = 0;
  int64_t steps_not_run = 0;
  int64_t retries = 0;
  absl::Time started;
  absl::Duration duration;
  // The step a cancelled run (stop token or deadline) stopped before; empty
  // when it stopped before a Create call or was not cancelled.
  std::string stopped_before;
  // The first max_recorded_steps steps; `steps_truncated` says more ran.
  std::vector<StepRecord> steps;
  bool steps_truncated = false;

  // One line: plan, id, outcome, rounds, steps, duration.
  std::string Summary() const;
  // The whole report as a JSON object (steps included, with parent ids).
  std::string ToJson() const;
  // The step tree as a Graphviz digraph: one node per step (colour by
  // outcome), edges from parent to child, rounds as roots.
  std::string ToDot() const;
};

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_EXECUTION_REPORT_H_
