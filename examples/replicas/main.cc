// replicas: keeps "replica sets" running on a fake container runtime with
// setpoint's processor: a source, two stores, a transformer and a syncer, all
// on one Runner.
//
//   replica sets ──PushSource──> Store "replica sets"
//                                     │  Transformer "expand": web x3 ->
//                                     v  web-0, web-1, web-2
//   FakeRuntime ──PollingSource──> Store "containers" ──> Syncer "containers"
//        ^                                                      │
//        └──────── RuntimeClient: create / update / delete ─────┘
//
// The demo changes the replica sets a few times (scale up, new image, scale
// down) and waits for the runtime to match after each change. Exit codes: 0
// converged, 1 did not converge within the deadline.

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "replicas/runtime.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/processor/transformer.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace replicas {
namespace {

// The input: what the user asks for.
struct ReplicaSet {
  std::string image;
  int replicas = 0;
  bool operator==(const ReplicaSet&) const = default;
};
using ReplicaSets = absl::flat_hash_map<std::string, ReplicaSet>;

// The desired state of one container. The observed state is `Container`
// (runtime.h), which also carries the runtime's id; the two types differ, so
// the syncer needs a `needs_update` that says which fields matter.
struct ContainerSpec {
  std::string image;
  bool operator==(const ContainerSpec&) const = default;
};
using DesiredContainers = absl::flat_hash_map<std::string, ContainerSpec>;

// The transform: "web" with 3 replicas becomes web-0, web-1 and web-2.
DesiredContainers Expand(const ReplicaSets& sets) {
  DesiredContainers want;
  for (const auto& [name, set] : sets) {
    for (int i = 0; i < set.replicas; ++i) {
      want[name + "-" + std::to_string(i)] = ContainerSpec{set.image};
    }
  }
  return want;
}

// The syncer calls this on its updater threads (never on the runner), at
// most one call per container at a time. An error is retried with backoff.
class RuntimeClient
    : public setpoint::SyncerClient<std::string, ContainerSpec, Container> {
 public:
  RuntimeClient(FakeRuntime* runtime, std::shared_ptr<spdlog::logger> logger)
      : runtime_(runtime), logger_(std::move(logger)) {}

  absl::Status Create(const setpoint::Context& ctx, const std::string& name,
                      const ContainerSpec& want) override {
    logger_->info("create container={} image={}", name, want.image);
    return runtime_->Create(ctx, name, want.image);
  }
  absl::Status Update(const setpoint::Context& ctx, const std::string& name,
                      const ContainerSpec& want,
                      const Container& seen) override {
    logger_->info("update container={} image={} -> {}", name, seen.image,
                  want.image);
    return runtime_->Update(ctx, name, want.image);
  }
  absl::Status Delete(const setpoint::Context& ctx, const std::string& name,
                      const Container& seen) override {
    logger_->info("delete container={} image={}", name, seen.image);
    return runtime_->Delete(ctx, name);
  }

 private:
  FakeRuntime* const runtime_;
  const std::shared_ptr<spdlog::logger> logger_;
};

struct Phase {
  std::string what;
  ReplicaSets sets;
};

int Main() {
  // The application owns the spdlog setup; setpoint logs through `logger`.
  auto logger = std::make_shared<spdlog::logger>(
      "replicas", std::make_shared<spdlog::sinks::stdout_color_sink_mt>());
  logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(logger);

  // The world: a slow, slightly flaky runtime with one leftover container
  // that nobody wants any more.
  FakeRuntime runtime(
      {.latency = absl::Milliseconds(20), .failure_rate = 0.2, .seed = 1});
  runtime.Preload("old-0", "busybox:1.36");

  // ---- Wiring, before anything starts. The modules keep their state on
  // the runner: every event runs on its one thread, so no locks. -----------
  setpoint::Runner runner({.name = "replicas", .logger = logger});

  // Input: the replica sets, pushed by this program (a watch stream in a
  // real controller).
  setpoint::Store<std::string, ReplicaSet> sets_store(
      {.name = "replica sets", .logger = logger});
  setpoint::PushSource<std::string, ReplicaSet> sets_source(
      &runner, &sets_store, {.logger = logger});

  // Observed: the containers, listed from the runtime every 100 ms. The
  // store is in sync after the first good list; the syncer waits for that,
  // so it never deletes on a view it has not seen whole.
  setpoint::Store<std::string, Container> containers(
      {.name = "containers", .logger = logger});
  setpoint::PollingSource<std::string, Container> poller(
      &runner, &containers,
      [&runtime](const setpoint::Context& ctx) { return runtime.List(ctx); },
      {.name = "runtime",
       .interval = absl::Milliseconds(100),
       .list_timeout = absl::Seconds(1),
       .logger = logger});

  // The syncer: desired (from the transformer) vs observed, per container.
  RuntimeClient client(&runtime, logger);
  setpoint::Syncer<std::string, ContainerSpec, Container> syncer(
      &runner, &client,
      {.name = "containers",
       .needs_update =
           [](const ContainerSpec& want, const Container& seen) {
             return want.image != seen.image;
           },
       .max_in_flight = 4,
       // Short retries for a demo; the default starts at 100 ms and caps
       // at 5 minutes.
       .backoff = {.initial = absl::Milliseconds(50), .max = absl::Seconds(1)},
       .logger = logger});
  syncer.ObserveFrom(&containers);

  // The transformer: reruns Expand over the whole store after a change
  // (changes within 50 ms share one run) and replaces the syncer's desired
  // set with the result.
  setpoint::Transformer<std::string, ContainerSpec> expand(
      &runner, &syncer, [&sets_store] { return Expand(sets_store.items()); },
      {.name = "expand",
       .accumulation_window = absl::Milliseconds(50),
       .logger = logger});
  expand.Watch(&sets_store);

  // ---- Start: the runner first, so the others can post to it. -----------
  if (absl::Status s = runner.Start(); !s.ok()) {
    logger->error("{}", s);
    return 1;
  }
  if (absl::Status s = syncer.Start(); !s.ok()) {
    logger->error("{}", s);
    return 1;
  }
  if (absl::Status s = poller.Start(); !s.ok()) {
    logger->error("{}", s);
    return 1;
  }

  const std::vector<Phase> phases = {
      {"start web x3 and api x2",
       {{"web", {"nginx:1.25", 3}}, {"api", {"api:v1", 2}}}},
      {"scale web up to 5",
       {{"web", {"nginx:1.25", 5}}, {"api", {"api:v1", 2}}}},
      {"roll api to api:v2",
       {{"web", {"nginx:1.25", 5}}, {"api", {"api:v2", 2}}}},
      {"scale web down to 2 and remove api", {{"web", {"nginx:1.25", 2}}}},
  };
  const absl::Duration kDeadline = absl::Seconds(10);  // Per phase.

  bool converged = true;
  for (const Phase& phase : phases) {
    logger->info("==== phase: {}", phase.what);
    absl::Time start = absl::Now();
    // The whole table, every time: keys it lacks are deleted from the store.
    sets_source.Replace(phase.sets);

    // What the runtime should hold at the end of this phase.
    absl::flat_hash_map<std::string, std::string> want;
    for (const auto& [name, spec] : Expand(phase.sets)) want[name] = spec.image;

    // Converged: the runtime holds exactly `want`, and the syncer agrees
    // (in sync, nothing pending, in flight or awaiting observation).
    // The syncer's status is runner-only state: read it there.
    auto done = [&] {
      if (runtime.Images() != want) return false;
      auto status = runner.PostAndWait(
          setpoint::Context(), [&] { return syncer.StatusSnapshot(); },
          "replicas check");
      return status.ok() && status->in_sync &&
             status->converged == status->keys &&
             status->keys == static_cast<int64_t>(want.size());
    };
    while (!done() && absl::Now() - start < kDeadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (!done()) {
      logger->error("phase did not converge within {}: {}", kDeadline,
                    phase.what);
      converged = false;
      break;
    }
    setpoint::SyncerStats c = syncer.stats();
    logger->info(
        "==== converged in {}: {} containers; so far creates={} updates={} "
        "deletes={} retried_failures={}",
        absl::Trunc(absl::Now() - start, absl::Milliseconds(1)), want.size(),
        c.creates, c.updates, c.deletes, c.failures);
  }

  // The final picture, read on the runner.
  auto status = runner.PostAndWait(
      setpoint::Context(), [&] { return syncer.StatusSnapshot(); },
      "replicas status");
  if (status.ok()) {
    logger->info(
        "status in_sync={} keys={} converged={} pending={} in_flight={} "
        "awaiting_observation={} backing_off={} terminal={}",
        status->in_sync, status->keys, status->converged, status->pending,
        status->in_flight, status->awaiting_observation, status->backing_off,
        status->terminal);
    for (const auto& f : status->failures) {
      logger->info("failing container={} failures={} terminal={}: {}", f.key,
                   f.failures, f.terminal, f.last_error);
    }
  }

  // ---- Shutdown in the documented order: sources, syncer, runner. -------
  poller.Stop();
  syncer.Stop();
  runner.Stop();
  logger->info("{}", converged ? "done: converged" : "done: NOT converged");
  return converged ? 0 : 1;
}

}  // namespace
}  // namespace replicas

int main() { return replicas::Main(); }
