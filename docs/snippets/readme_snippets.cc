// The C++ snippets of README.md, compiled and run by doc_snippets_test,
// which also checks that the README shows them as they are here. Between
// "clang-format off" and "on" the text is the README's, layout included;
// edit both together. (The README's controller is quoted from
// examples/sharded/records_controller.h.)

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/status.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/procedure.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

// The README leaves the cloud out.
class Cloud {
 public:
  virtual ~Cloud() = default;
  virtual absl::StatusOr<int> CountRunning(const setpoint::Context& ctx) = 0;
  virtual absl::Status StartOne(const setpoint::Context& ctx) = 0;
};

// ## A plan
// clang-format off
#include "setpoint/planner/reconcile_loop.h"

// Keeps `want` replicas running. Create() only observes; procedures act.
class Replicas : public setpoint::Plan {
 public:
  Replicas(Cloud* cloud, int want) : cloud_(cloud), want_(want) {}
  std::string Name() const override { return "replicas"; }

  absl::StatusOr<setpoint::Procedures> Create(const setpoint::Context& ctx) override {
    SETPOINT_ASSIGN_OR_RETURN(int have, cloud_->CountRunning(ctx));
    setpoint::Procedures todo;
    for (int i = have; i < want_; ++i) {
      auto start = setpoint::MakeProcedure(
          "start replica", [this](const setpoint::Context& step)
                               -> absl::StatusOr<setpoint::Procedures> {
            SETPOINT_RETURN_IF_ERROR(cloud_->StartOne(step));
            return setpoint::Procedures{};  // or follow-up steps
          });
      start->set_retry_policy({.max_attempts = 3});
      todo.push_back(std::move(start));
    }
    return todo;  // empty: converged
  }

 private:
  Cloud* cloud_;
  int want_;
};

// Runs the plan every 10 s until ctx is cancelled.
absl::Status KeepReplicas(const setpoint::Context& ctx, Cloud* cloud) {
  Replicas plan(cloud, 3);
  setpoint::ReconcileLoop loop(plan, {.interval = absl::Seconds(10)});
  return loop.Run(ctx);  // or loop.Start(): on a thread of its own
}
// clang-format on

namespace readme_snippets {
namespace {

// Starts a replica on the second call of StartOne (the first is a 503).
class FakeCloud : public Cloud {
 public:
  absl::StatusOr<int> CountRunning(const setpoint::Context&) override {
    return running_;
  }
  absl::Status StartOne(const setpoint::Context&) override {
    if (++calls_ % 2 == 1) return absl::UnavailableError("503");
    ++running_;
    return absl::OkStatus();
  }
  int running() const { return running_; }

 private:
  int running_ = 1;
  int calls_ = 0;
};

TEST(ReadmeSnippets, ReplicasConverges) {
  setpoint::testing::SimulatedClock clock({.auto_advance = true});
  FakeCloud cloud;
  Replicas plan(&cloud, 3);
  setpoint::ExecutionReport report = setpoint::Scheduler().Execute(
      setpoint::Context::Background(&clock), plan);
  SETPOINT_EXPECT_OK(report.status);
  EXPECT_EQ(cloud.running(), 3);
}

TEST(ReadmeSnippets, KeepReplicasRunsUntilCancelled) {
  setpoint::testing::SimulatedClock clock({.auto_advance = true});
  FakeCloud cloud;
  std::stop_source stop;
  stop.request_stop();
  EXPECT_TRUE(absl::IsCancelled(
      KeepReplicas(setpoint::Context(stop.get_token(), &clock), &cloud)));
}

}  // namespace
}  // namespace readme_snippets
