// ControllerOptions: how a Controller runs its pieces — the clock, manual
// stepping for tests, the handoff bound, where status, metrics, client calls
// and sources go. Given per kind (ControllerKind::options) or per
// Controller.
//
//   setpoint::ControllerKind kind{.kind = "records", .build = Build,
//                                 .options = {.handoff_timeout =
//                                                 absl::Seconds(1)}};
//
// Thread safety: a value type.
#ifndef SETPOINT_CONTROLLER_CONTROLLER_OPTIONS_H_
#define SETPOINT_CONTROLLER_CONTROLLER_OPTIONS_H_

#include <memory>

#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/metrics.h"
#include "setpoint/controller/pod_sources.h"
#include "spdlog/logger.h"

namespace setpoint {

class LoopPool;
class RunnerPool;
class UpdaterPool;

struct ControllerOptions {
  // How long UpdateShardRange waits for calls and plan steps outside the
  // new range to return after their cancellation, before it reports
  // failure (the manager then keeps the shards and asks again).
  // Default: 2 s.
  absl::Duration handoff_timeout = absl::Seconds(2);
  // Time for the runner, sources, syncers and loops.
  // Default: Clock::Real().
  Clock* clock = nullptr;
  // No threads: the runner, sources, syncers and loops run only when
  // RunUntilIdle() is called, on the caller's thread (deterministic tests;
  // setpoint::testing::ControllerHarness drives it).
  // Default: false.
  bool manual = false;
  // How often the pieces' status is published for the pod's /statusz,
  // /readyz and keys-by-state gauges (one runner event, O(keys)); a runner
  // that has not run it for the probe's stuck_after is reported stuck. In
  // manual mode it is published at the end of every RunUntilIdle instead.
  // Default: 1 s.
  absl::Duration status_interval = absl::Seconds(1);
  // Where the runner, sources, syncers and plans publish their series,
  // labelled kind=<kind> and node=<node id> (shared sources: kind and
  // pod=<pod id>).
  // Default: NodeInfo::metrics (the pod's), else none.
  MetricsRegistry* metrics = nullptr;
  // The updater threads the syncers' calls run on (SyncerOptions::pool,
  // unless a Sync sets its own). Must outlive the controller.
  // Default: NodeInfo::updaters (the pod's pool), else each syncer owns its
  // threads.
  UpdaterPool* updaters = nullptr;
  // The threads the plans' reconcile loops run on
  // (ReconcileLoopOptions::pool, unless a Reconcile sets its own), when its
  // clock is the controller's. Must outlive the controller.
  // Default: NodeInfo::loops (the pod's pool), else each loop has its own
  // thread.
  LoopPool* loops = nullptr;
  // The threads the node's runner runs on (RunnerOptions::pool), when its
  // clock is the controller's. Must outlive the controller.
  // Default: NodeInfo::runners (the pod's pool), else the runner has its own
  // thread.
  RunnerPool* runners = nullptr;
  // The shared sources and the source threads of this kind's nodes in this
  // pod (pod_sources.h).
  // Default: ControllerKind::ToNodeKind gives one per pod; a Controller
  // made by hand gets one of its own.
  std::shared_ptr<PodSources> pod_sources = nullptr;
  // Every line is written through a clone of it named after the node id, so
  // each names its node; the pieces name themselves (runner=, syncer=,
  // plan=, source=).
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

}  // namespace setpoint

#endif  // SETPOINT_CONTROLLER_CONTROLLER_OPTIONS_H_
