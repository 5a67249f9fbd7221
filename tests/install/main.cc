// Builds against an installed setpoint and runs a tiny plan to convergence on
// a simulated clock. Exits 0 only if the plan converged as expected.
#include <cstdio>

#include "setpoint/planner/plan.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/testing/simulated_clock.h"

int main() {
  setpoint::testing::SimulatedClock clock({.auto_advance = true});
  int have = 0;
  auto plan = setpoint::PlanFunc(
      "consumer",
      [&](const setpoint::Context&) -> absl::StatusOr<setpoint::Procedures> {
        setpoint::Procedures todo;
        for (int i = have; i < 3; ++i) {
          todo.push_back(setpoint::MakeProcedure(
              "add one",
              [&](const setpoint::Context& ctx)
                  -> absl::StatusOr<setpoint::Procedures> {
                if (!ctx.Wait(absl::Seconds(1)).ok()) return ctx.Err();
                ++have;
                return setpoint::Procedures{};
              }));
        }
        return todo;
      });
  setpoint::Scheduler scheduler;
  setpoint::ExecutionReport report =
      scheduler.Execute(setpoint::Context::Background(&clock), plan);
  std::printf("%s\n", report.Summary().c_str());
  return report.status.ok() && have == 3 && report.steps_run == 3 ? 0 : 1;
}
