// Plan: looks at the current state of the world and says what to do next.
//
// The Scheduler calls Create() in rounds: it runs the procedures a round
// returned, then calls Create() again, until Create() returns nothing (the
// world matches the plan). Create() must only observe, never change the world:
// Preview() calls it to show what would happen.
//
//   class EnsureThreeNodes : public setpoint::Plan {
//    public:
//     std::string Name() const override { return "three-nodes"; }
//     absl::StatusOr<Procedures> Create(const Context& ctx) override {
//       Procedures todo;
//       for (int i = cloud_->Count(); i < 3; ++i) todo.push_back(RunOne());
//       return todo;
//     }
//   };
//
// Thread safety: the Scheduler calls Create() from one thread at a time.
#ifndef SETPOINT_PLANNER_PLAN_H_
#define SETPOINT_PLANNER_PLAN_H_

#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/status/statusor.h"
#include "setpoint/base/context.h"
#include "setpoint/planner/procedure.h"

namespace setpoint {

class Plan {
 public:
  virtual ~Plan() = default;

  // A short stable name, used in reports, logs and errors.
  virtual std::string Name() const = 0;

  // Observes the world and returns the procedures that move it towards the
  // plan; an empty list means converged. Errors abort the execution.
  // Exceptions are caught and become kInternal errors (ThrewException).
  virtual absl::StatusOr<Procedures> Create(const Context& ctx) = 0;
};

// A Plan from a name and a callable `absl::StatusOr<Procedures>(const
// Context&)`.
template <typename Fn>
class PlanFunc final : public Plan {
 public:
  PlanFunc(std::string name, Fn fn)
      : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string Name() const override { return name_; }
  absl::StatusOr<Procedures> Create(const Context& ctx) override {
    return fn_(ctx);
  }

 private:
  std::string name_;
  Fn fn_;
};

template <typename Fn>
PlanFunc(std::string, Fn) -> PlanFunc<Fn>;

// Makes a plan from a name and a lambda, as MakeProcedure does for steps:
//   auto plan = MakePlan("zone serial", [&](const Context& ctx)
//                            -> absl::StatusOr<Procedures> { ... });
template <typename Fn>
std::unique_ptr<Plan> MakePlan(std::string name, Fn&& fn) {
  static_assert(std::is_invocable_r_v<absl::StatusOr<Procedures>,
                                      std::decay_t<Fn>&, const Context&>,
                "a plan body must be callable as "
                "absl::StatusOr<Procedures>(const Context&)");
  return std::make_unique<PlanFunc<std::decay_t<Fn>>>(std::move(name),
                                                      std::forward<Fn>(fn));
}

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_PLAN_H_
