// Builds against an installed setpoint: runs a tiny plan to convergence and
// a one-node controller under the test harness, both on a simulated clock.
// Exits 0 only if both converged as expected and the Prometheus adapter
// and the pod's listener serve a metric.
#include <cstdio>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "setpoint/controller/controller.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/pod/ops_server.h"
#include "setpoint/prometheus/prometheus_metrics.h"
#include "setpoint/testing/controller_harness.h"
#include "setpoint/testing/simulated_clock.h"

namespace {

using Map = absl::flat_hash_map<std::string, int>;

// The world: a map the client writes.
struct MapClient : setpoint::SyncerClient<std::string, int, int> {
  Map world;
  absl::Status Create(const setpoint::Context&, const std::string& k,
                      const int& v) override {
    world[k] = v;
    return absl::OkStatus();
  }
  absl::Status Update(const setpoint::Context&, const std::string& k,
                      const int& v, const int&) override {
    world[k] = v;
    return absl::OkStatus();
  }
  absl::Status Delete(const setpoint::Context&, const std::string& k,
                      const int&) override {
    world.erase(k);
    return absl::OkStatus();
  }
};

bool ControllerConverges() {
  setpoint::testing::SimulatedClock clock;
  MapClient client;
  const Map want = {{"a", 1}, {"b", 2}, {"c", 3}};
  setpoint::testing::ControllerHarness node(
      [&](setpoint::ControllerBuilder& b) {
        auto* seen =
            b.Poll<std::string, int>("seen", [&](const setpoint::Context&) {
              return absl::StatusOr<Map>(client.world);
            });
        auto* desired =
            b.Poll<std::string, int>("want", [&](const setpoint::Context&) {
              return absl::StatusOr<Map>(want);
            });
        b.Sync<std::string, int, int>("map", &client, seen, desired);
        return absl::OkStatus();
      },
      {.clock = &clock});
  if (!node.Start().ok()) return false;
  if (!node.Assign({0, setpoint::kDefaultRingSize}, 1).ok()) return false;
  node.Advance(absl::Seconds(30));
  std::printf("controller: %zu of %zu keys\n", client.world.size(),
              want.size());
  return client.world == want;
}

}  // namespace

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
  bool plan_ok = report.status.ok() && have == 3 && report.steps_run == 3;
  setpoint::MetricsRegistry metrics;
  metrics.GetCounter("consumer_runs_total", "Runs.").Increment();
  const bool metrics_ok = setpoint::PrometheusText(metrics).find(
                              "consumer_runs_total 1") != std::string::npos &&
                          setpoint::OpsServer::Start(
                              {.address = "127.0.0.1:0", .metrics = &metrics})
                              .ok();
  return plan_ok && metrics_ok && ControllerConverges() ? 0 : 1;
}
