// Console output of the cucumber example: an execution's steps as an
// indented table, and the observed cloud state with a verdict, for humans.
//
//   setpoint::ExecutionReport report = scheduler.Execute(ctx, plan);
//   std::cout << cucumber::FormatSteps(report);
//   std::cout << cucumber::FormatObservedState(cloud.Inspect(), request);
//
// Thread safety: stateless functions; safe from any thread.
#ifndef SETPOINT_EXAMPLES_CUCUMBER_CONSOLE_H_
#define SETPOINT_EXAMPLES_CUCUMBER_CONSOLE_H_

#include <string>

#include "absl/time/time.h"
#include "cucumber/cloud.h"
#include "cucumber/request.h"
#include "setpoint/planner/execution_report.h"

namespace cucumber {

// A duration for people: "0ms", "42ms", "1.25s".
std::string ShortDuration(absl::Duration d);

// One line per recorded step — round, name indented under its parent,
// outcome, attempts, time — with the error under failed steps, each line
// starting with `indent`.
std::string FormatSteps(const setpoint::ExecutionReport& report,
                        const std::string& indent = "  ");

// The cluster's instances (running and terminated) and the record as reads
// see it, then "verdict converged" or "verdict NOT converged: <why>" (see
// CheckConverged), each line starting with `indent`.
std::string FormatObservedState(const CloudSnapshot& snapshot,
                                const ClusterRequest& request,
                                const std::string& indent = "  ");

}  // namespace cucumber

#endif  // SETPOINT_EXAMPLES_CUCUMBER_CONSOLE_H_
