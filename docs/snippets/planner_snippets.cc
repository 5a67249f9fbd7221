// The C++ snippets of docs/planner.md, compiled (and some run) by
// doc_snippets_test, which also checks that the doc shows them as they are
// here. Between "clang-format off" and "on" the text is the doc's, layout
// included; edit both together.

#include <fstream>
#include <iostream>
#include <memory>
#include <set>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/retry.h"
#include "setpoint/planner/execution_report.h"
#include "setpoint/planner/procedure.h"
#include "setpoint/planner/reconcile_loop.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

// ### Procedures
// clang-format off
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cucumber/cloud.h"
#include "setpoint/base/status.h"
#include "setpoint/planner/procedure.h"

using cucumber::Cloud;
using cucumber::Instance;

// The cluster's instances that are running (DescribeInstances also lists
// terminated ones).
absl::StatusOr<std::vector<Instance>> RunningInstances(
    Cloud* cloud, const setpoint::Context& ctx, const std::string& cluster) {
  SETPOINT_ASSIGN_OR_RETURN(
      std::vector<Instance> all,
      cloud->DescribeInstances(ctx, cucumber::kClusterTag, cluster));
  std::erase_if(all, [](const Instance& i) {
    return i.state != cucumber::InstanceState::kRunning;
  });
  return all;
}

std::unique_ptr<setpoint::Procedure> RunInstance(Cloud* cloud,
                                                 std::string cluster) {
  auto step = setpoint::MakeProcedure(
      "run instance cluster=" + cluster,
      [cloud, cluster](const setpoint::Context& ctx)
          -> absl::StatusOr<setpoint::Procedures> {
        SETPOINT_RETURN_IF_ERROR(
            cloud->RunInstance(ctx, {{cucumber::kClusterTag, cluster}}));
        return setpoint::Procedures{};
      },
      "launch one instance in cluster " + cluster);
  // The cloud sometimes answers 503 (kUnavailable): try up to 5 times.
  step->set_retry_policy({.max_attempts = 5});
  return step;
}

std::unique_ptr<setpoint::Procedure> TerminateInstance(Cloud* cloud,
                                                       std::string id) {
  auto step = setpoint::MakeProcedure(
      "terminate instance id=" + id,
      [cloud, id](const setpoint::Context& ctx)
          -> absl::StatusOr<setpoint::Procedures> {
        SETPOINT_RETURN_IF_ERROR(cloud->TerminateInstance(ctx, id));
        return setpoint::Procedures{};
      });
  step->set_retry_policy({.max_attempts = 5});
  return step;
}
// clang-format on

// clang-format off
class ReconcileNodes : public setpoint::Procedure {
 public:
  ReconcileNodes(Cloud* cloud, std::string cluster, int nodes_num)
      : Procedure("reconcile nodes cluster=" + cluster),
        cloud_(cloud), cluster_(std::move(cluster)), nodes_num_(nodes_num) {}

  std::string Description() const override {
    return absl::StrCat("scale to ", nodes_num_, " instances");
  }

  absl::StatusOr<setpoint::Procedures> Do(const setpoint::Context& ctx) override {
    SETPOINT_ASSIGN_OR_RETURN(std::vector<Instance> running,
                              RunningInstances(cloud_, ctx, cluster_));
    setpoint::Procedures next;
    for (int i = static_cast<int>(running.size()); i < nodes_num_; ++i) {
      next.push_back(RunInstance(cloud_, cluster_));
    }
    for (size_t i = static_cast<size_t>(nodes_num_); i < running.size(); ++i) {
      next.push_back(TerminateInstance(cloud_, running[i].id));
    }
    return next;
  }

 private:
  Cloud* cloud_;
  std::string cluster_;
  int nodes_num_;
};
// clang-format on

// clang-format off
std::unique_ptr<setpoint::Procedure> WaitForChange(Cloud* cloud,
                                                   std::string change_id) {
  auto step = setpoint::MakeProcedure(
      "wait for dns change id=" + change_id,
      [cloud, change_id](const setpoint::Context& ctx)
          -> absl::StatusOr<setpoint::Procedures> {
        while (true) {
          SETPOINT_ASSIGN_OR_RETURN(cucumber::DnsChange change,
                                    cloud->GetChange(ctx, change_id));
          if (change.status == cucumber::ChangeStatus::kInSync) {
            return setpoint::Procedures{};
          }
          SETPOINT_RETURN_IF_ERROR(ctx.Wait(absl::Milliseconds(100)));
        }
      });
  step->set_retry_policy({.max_attempts = 5});
  return step;
}

std::unique_ptr<setpoint::Procedure> UpdateRecord(
    Cloud* cloud, std::string name, std::set<std::string> addresses) {
  std::string description =
      absl::StrCat("set A records to ", absl::StrJoin(addresses, ","));
  auto step = setpoint::MakeProcedure(
      "update dns record name=" + name,
      [cloud, name, addresses](const setpoint::Context& ctx)
          -> absl::StatusOr<setpoint::Procedures> {
        SETPOINT_ASSIGN_OR_RETURN(cucumber::DnsChange change,
                                  cloud->UpsertRecord(ctx, name, addresses));
        return setpoint::ProcedureList(WaitForChange(cloud, change.id));
      },
      std::move(description));
  step->set_retry_policy({.max_attempts = 5});
  return step;
}
// clang-format on

// ### The plan
// clang-format off
#include "setpoint/planner/plan.h"

class ClusterPlan : public setpoint::Plan {
 public:
  ClusterPlan(Cloud* cloud, std::string cluster, std::string dns_name,
              int nodes_num)
      : cloud_(cloud), cluster_(std::move(cluster)),
        dns_name_(std::move(dns_name)), nodes_num_(nodes_num) {}

  std::string Name() const override { return "cluster " + cluster_; }

  absl::StatusOr<setpoint::Procedures> Create(const setpoint::Context& ctx) override {
    SETPOINT_ASSIGN_OR_RETURN(std::vector<Instance> running,
                              RunningInstances(cloud_, ctx, cluster_));
    if (static_cast<int>(running.size()) != nodes_num_) {
      // Fix the instances first; DNS is looked at in a later round.
      return setpoint::ProcedureList(
          std::make_unique<ReconcileNodes>(cloud_, cluster_, nodes_num_));
    }
    std::set<std::string> want;
    for (const Instance& i : running) want.insert(i.private_ip);
    std::set<std::string> have;
    absl::StatusOr<cucumber::DnsRecord> record = cloud_->GetRecord(ctx, dns_name_);
    if (record.ok()) {
      have = record->addresses;
    } else if (!absl::IsNotFound(record.status())) {
      return record.status();  // Cannot see the record: do not guess.
    }
    if (have == want) return setpoint::Procedures{};  // Converged.
    // (With nodes_num == 0 the record would have to be deleted instead;
    // the cloud refuses an empty address list.)
    return setpoint::ProcedureList(UpdateRecord(cloud_, dns_name_, want));
  }

 private:
  Cloud* cloud_;
  std::string cluster_;
  std::string dns_name_;
  int nodes_num_;
};
// clang-format on

// ## Testing a plan
// clang-format off
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;

TEST(Planner, RetriesUnavailableUntilItWorks) {
  setpoint::testing::SimulatedClock clock({.auto_advance = true});
  int calls = 0;
  bool done = false;
  setpoint::PlanFunc plan("flaky", [&](const setpoint::Context&)
                                       -> absl::StatusOr<setpoint::Procedures> {
    if (done) return setpoint::Procedures{};
    auto step = setpoint::MakeProcedure(
        "call api", [&](const setpoint::Context&)
                        -> absl::StatusOr<setpoint::Procedures> {
          if (++calls < 3) return absl::UnavailableError("503");
          done = true;
          return setpoint::Procedures{};
        });
    step->set_retry_policy({.max_attempts = 5,
                            .backoff = {.initial = absl::Seconds(1),
                                        .max = absl::Seconds(10),
                                        .jitter = 0}});
    return setpoint::ProcedureList(std::move(step));
  });

  setpoint::ExecutionReport report =
      setpoint::Scheduler().Execute(setpoint::Context::Background(&clock), plan);

  EXPECT_THAT(report.status, IsOk());
  EXPECT_EQ(report.retries, 2);
  EXPECT_EQ(report.steps[0].attempts, 3);
  EXPECT_EQ(report.duration, absl::Seconds(3));  // 1 s + 2 s, simulated
}

TEST(Planner, NeverConverges) {
  setpoint::PlanFunc plan("busy", [](const setpoint::Context&)
                                      -> absl::StatusOr<setpoint::Procedures> {
    return setpoint::ProcedureList(setpoint::MakeProcedure(
        "poke", [](const setpoint::Context&)
                    -> absl::StatusOr<setpoint::Procedures> {
          return setpoint::Procedures{};
        }));
  });
  setpoint::ExecutionReport report =
      setpoint::Scheduler({.max_rounds = 3}).Execute(setpoint::Context(), plan);
  EXPECT_THAT(report.status,
              StatusIs(absl::StatusCode::kAborted, HasSubstr("max_rounds=3")));
  EXPECT_EQ(report.rounds, 3);
}
// clang-format on

namespace planner_snippets {

// ### Running it
int RunningIt() {
  // clang-format off
cucumber::SimulatedCloud cloud;  // add {.error_rate = 0.1} for 503s
setpoint::Scheduler scheduler({.max_rounds = 20});
ClusterPlan plan(&cloud, "demo", "demo.example.com", 3);

std::stop_source stop;  // stop.request_stop() from elsewhere cancels the run
setpoint::Context ctx =
    setpoint::Context(stop.get_token()).WithTimeout(absl::Minutes(5));

setpoint::ExecutionReport report = scheduler.Execute(ctx, plan);
std::cout << report.Summary() << "\n";
if (!report.status.ok()) return 1;
  // clang-format on
  return 0;
}

// The guide's plan, on a simulated cloud and clock: it converges.
TEST(PlannerSnippets, ClusterPlanConverges) {
  setpoint::testing::SimulatedClock clock({.auto_advance = true});
  cucumber::SimulatedCloud cloud({.clock = &clock});
  ClusterPlan plan(&cloud, "demo", "demo.example.com", 3);
  setpoint::ExecutionReport report =
      setpoint::Scheduler({.max_rounds = 20})
          .Execute(setpoint::Context::Background(&clock), plan);
  EXPECT_THAT(report.status, IsOk()) << report.Summary();
  SETPOINT_ASSERT_OK_AND_ASSIGN(
      std::vector<Instance> running,
      RunningInstances(&cloud, setpoint::Context::Background(&clock), "demo"));
  EXPECT_EQ(running.size(), 3u);
}

// ## Retries
void RetryPolicySnippet(setpoint::Procedure* step) {
  // clang-format off
step->set_retry_policy({
    .max_attempts = 5,                       // attempts in total; 1 = no retry
    .backoff = {.initial = absl::Milliseconds(200), .max = absl::Seconds(5)},
    .retryable = [](const absl::Status& s) { return absl::IsUnavailable(s); },
});
  // clang-format on
}

absl::StatusOr<size_t> RetrySnippet(const setpoint::Context& ctx, Cloud* cloud,
                                    const std::string& cluster) {
  // clang-format off
SETPOINT_ASSIGN_OR_RETURN(
    std::vector<Instance> running,
    setpoint::Retry(ctx, {.max_attempts = 5},
                    [&] { return RunningInstances(cloud, ctx, cluster); }));
  // clang-format on
  return running.size();
}

// ## Preview: a dry run
absl::Status PreviewSnippet(const setpoint::Context& ctx,
                            const setpoint::Scheduler& scheduler,
                            setpoint::Plan& plan) {
  // clang-format off
SETPOINT_ASSIGN_OR_RETURN(std::vector<setpoint::PreviewItem> items,
                          scheduler.Preview(ctx, plan));
std::cout << setpoint::FormatPreview(items);
  // clang-format on
  return absl::OkStatus();
}

// ## The execution report
void DotSnippet(const setpoint::ExecutionReport& report) {
  // clang-format off
  std::ofstream("run.dot") << report.ToDot();
  // clang-format on
}

// ## ReconcileLoop: running a plan forever
void ExportMetrics(const setpoint::ExecutionReport&) {}

absl::Status ReconcileLoopSnippet(setpoint::Plan& plan) {
  // clang-format off
setpoint::ReconcileLoop loop(plan, {
    .interval = absl::Seconds(30),
    .on_report = [](const setpoint::ExecutionReport& r) { ExportMetrics(r); },
    .scheduler = {.max_rounds = 20},
});
SETPOINT_RETURN_IF_ERROR(loop.Start());  // thread "sp-reconcile"; first run at once
// ... when an event says the world changed:
loop.Trigger();
// ... on shutdown (the destructor does this too):
loop.Stop();
  // clang-format on
  return absl::OkStatus();
}

setpoint::PlanFunc converged("converged",
                             [](const setpoint::Context&)
                                 -> absl::StatusOr<setpoint::Procedures> {
                               return setpoint::Procedures{};
                             });

// Manual mode.
TEST(PlannerSnippets, ManualMode) {
  setpoint::Plan& plan = converged;
  // clang-format off
setpoint::testing::SimulatedClock clock;
setpoint::ReconcileLoop loop(plan, {.jitter = 0, .clock = &clock});
const setpoint::Context ctx = setpoint::Context::Background(&clock);
EXPECT_TRUE(loop.RunUntilIdle(ctx));   // the first execution runs at once
EXPECT_FALSE(loop.RunUntilIdle(ctx));  // the next is due in 10 s
clock.AdvanceTo(loop.NextWakeTime());
EXPECT_TRUE(loop.RunUntilIdle(ctx));
  // clang-format on
}

// Testing a ReconcileLoop with Run(ctx).
TEST(PlannerSnippets, LoopRunOnTheTestThread) {
  setpoint::Plan& plan = converged;
  // clang-format off
setpoint::testing::SimulatedClock clock({.auto_advance = true});
std::stop_source stop;
std::vector<absl::Time> ends;
setpoint::ReconcileLoop loop(plan, {
    .interval = absl::Seconds(10),
    .jitter = 0,
    .on_report = [&](const setpoint::ExecutionReport&) {
      ends.push_back(clock.Now());
      if (ends.size() == 3) stop.request_stop();
    },
    .clock = &clock,
});
EXPECT_THAT(loop.Run(setpoint::Context(stop.get_token(), &clock)),
            StatusIs(absl::StatusCode::kCancelled));
EXPECT_EQ(loop.stats().executions, 3);
  // clang-format on
}

}  // namespace planner_snippets
