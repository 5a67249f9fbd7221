// Procedure: one step of a plan. Do() acts on the world and may return
// follow-up procedures, which the Scheduler runs right after it, before its
// next sibling (depth first, in the order returned).
//
//   class RunInstance : public setpoint::Procedure {
//    public:
//     explicit RunInstance(Cloud* c) : Procedure("run instance"), cloud_(c) {}
//     absl::StatusOr<Procedures> Do(const Context& ctx) override {
//       SETPOINT_RETURN_IF_ERROR(cloud_->Run(ctx));
//       return ProcedureList(MakeProcedure("tag instance", [](const Context&) {
//         return Procedures{};
//       }));
//     }
//    private:
//     Cloud* cloud_;
//   };
//
// Thread safety: the Scheduler calls Do() on one thread at a time per
// procedure; with parallelism > 1 different procedures run concurrently, so
// state they share must be synchronized by the user.
#ifndef SETPOINT_PLANNER_PROCEDURE_H_
#define SETPOINT_PLANNER_PROCEDURE_H_

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "setpoint/base/context.h"
#include "setpoint/base/retry.h"

namespace setpoint {

class Procedure;

// What Plan::Create and Procedure::Do return: the steps to run next, in order.
// Null entries are refused with kInvalidArgument.
using Procedures = std::vector<std::unique_ptr<Procedure>>;

class Procedure {
 public:
  // `name` says what the step does ("run instance i-42"); it appears in
  // reports, logs and errors. An empty name is refused by the Scheduler.
  explicit Procedure(std::string name) : name_(std::move(name)) {}
  virtual ~Procedure() = default;
  Procedure(const Procedure&) = delete;
  Procedure& operator=(const Procedure&) = delete;

  const std::string& Name() const { return name_; }

  // A human-readable account of what Do() would change, for Preview().
  // Default: empty.
  virtual std::string Description() const { return {}; }

  // Performs the step. Returns the follow-up procedures (possibly none), or an
  // error. Exceptions are caught by the Scheduler and become kUnknown
  // failures carrying the exception's text. Must honour `ctx` when it blocks.
  virtual absl::StatusOr<Procedures> Do(const Context& ctx) = 0;

  // The retry policy for this step; null means the Scheduler's default. A
  // step that threw is never retried (an exception is a bug, not a transient
  // fault), nor one whose context is done.
  const RetryPolicy* retry_policy() const { return retry_.get(); }
  // Sets this step's retry policy. Returns *this for chaining.
  Procedure& set_retry_policy(RetryPolicy policy) {
    retry_ = std::make_unique<const RetryPolicy>(std::move(policy));
    return *this;
  }

 private:
  std::string name_;
  // Null for most procedures; a unique_ptr keeps every procedure small (the
  // Scheduler's throughput is bound by how much procedure memory it touches).
  std::unique_ptr<const RetryPolicy> retry_;
};

// A Procedure from a callable `absl::StatusOr<Procedures>(const Context&)`.
template <typename Fn>
class ProcedureFunc final : public Procedure {
 public:
  ProcedureFunc(std::string name, Fn fn, std::string description = {})
      : Procedure(std::move(name)),
        fn_(std::move(fn)),
        description_(std::move(description)) {}

  std::string Description() const override { return description_; }
  absl::StatusOr<Procedures> Do(const Context& ctx) override {
    return fn_(ctx);
  }

 private:
  Fn fn_;
  std::string description_;
};

// Makes a procedure from a lambda:
//   MakeProcedure("delete record", [&](const Context& ctx) ->
//   absl::StatusOr<Procedures> {
//     SETPOINT_RETURN_IF_ERROR(dns.Delete(ctx, name));
//     return Procedures{};
//   });
template <typename Fn>
std::unique_ptr<Procedure> MakeProcedure(std::string name, Fn&& fn,
                                         std::string description = {}) {
  static_assert(std::is_invocable_r_v<absl::StatusOr<Procedures>,
                                      std::decay_t<Fn>&, const Context&>,
                "a procedure body must be callable as "
                "absl::StatusOr<Procedures>(const Context&)");
  return std::make_unique<ProcedureFunc<std::decay_t<Fn>>>(
      std::move(name), std::forward<Fn>(fn), std::move(description));
}

// Builds a Procedures list from move-only pointers (a braced list cannot):
//   return ProcedureList(std::make_unique<A>(), std::make_unique<B>());
template <typename... P>
Procedures ProcedureList(std::unique_ptr<P>... procedures) {
  Procedures list;
  list.reserve(sizeof...(P));
  (list.push_back(std::move(procedures)), ...);
  return list;
}

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_PROCEDURE_H_
