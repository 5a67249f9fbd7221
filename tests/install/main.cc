// A program that uses setpoint as a user would, built both against an
// installed setpoint (find_package, tests/install) and against the source
// tree (add_subdirectory, tests/subdir): runs a tiny plan to convergence and
// a one-node controller under the test harness, both on a simulated clock,
// and drains a pod in a Redis registry on a redis-server of its own.
// Exits 0 only if both converged as expected, the Redis registry recorded
// the drain, and the Prometheus adapter and the pod's listener serve a
// metric. Without redis-server the Redis part is skipped, unless CI is set.
#include <cstdio>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "setpoint/controller/controller.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/pod/ops_server.h"
#include "setpoint/prometheus/prometheus_metrics.h"
#include "setpoint/registry/redis_node_registry.h"
#include "setpoint/testing/controller_harness.h"
#include "setpoint/testing/redis_server.h"
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

// A Redis registry on a redis-server of our own records a drained pod.
bool RedisRegistryRecordsADrain() {
  setpoint::testing::RedisServer server;
  absl::Status started = server.Start();
  if (absl::IsNotFound(started) && !setpoint::testing::RedisRequired()) {
    std::printf("redis: skipped (%s)\n", started.ToString().c_str());
    return true;
  }
  if (!started.ok()) {
    std::printf("redis: %s\n", started.ToString().c_str());
    return false;
  }
  auto registry = setpoint::RedisNodeRegistry::Create(
      {.address = server.address(), .ns = "consumer"});
  if (!registry.ok()) {
    std::printf("redis: %s\n", registry.status().ToString().c_str());
    return false;
  }
  const setpoint::Context ctx = setpoint::Context::Background();
  if (!(*registry)->SetDrained(ctx, "pod-a", true).ok()) return false;
  auto described = (*registry)->Describe(ctx);
  if (!described.ok()) return false;
  std::printf("redis: %zu drained pod(s)\n", described->drained.size());
  return described->drained.size() == 1 && described->drained.contains("pod-a");
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
  const bool controller_ok = ControllerConverges();
  const bool redis_ok = RedisRegistryRecordsADrain();
  return plan_ok && metrics_ok && controller_ok && redis_ok ? 0 : 1;
}
