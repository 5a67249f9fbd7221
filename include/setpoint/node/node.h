// Node: the user's unit of work in a pod. A NodeManager creates nodes, runs
// each (on a thread of its own, or, for a node that says it needs none,
// through Launch and Halt) and tells each which shards it owns.
//
//   class VmNode : public setpoint::Node {
//    public:
//     absl::Status Run(const Context& ctx) override {
//       runner_.Start(); ...; ctx.Wait(absl::InfiniteDuration()); ...
//       return absl::OkStatus();
//     }
//     absl::Status UpdateShardRange(const Context& ctx,
//                                   const Assignment& a) override {
//       // Re-scope the syncer and the sources on the runner, and wait.
//       return absl::OkStatus();
//     }
//
// Most controllers need not write this class: setpoint::Controller
// (controller/controller.h) builds one from declared pieces.
//   };
//
// Thread safety: Run runs on the node's own thread; Launch and Halt on the
// manager's threads, never at once; UpdateShardRange is called on another
// thread (the node's relay), possibly while Run runs or the node is
// launched, but never twice at once. Each node sees its assignments in order,
// starting from the empty range.
#ifndef SETPOINT_NODE_NODE_H_
#define SETPOINT_NODE_NODE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/base/metrics.h"
#include "setpoint/node/shard.h"

namespace setpoint {

class LoopPool;
class RunnerPool;
class UpdaterPool;

// Who a node is; given to the factory that creates it.
struct NodeInfo {
  std::string id;    // "<pod>/<kind>/<index>", unique across pods.
  std::string kind;  // Nodes of a kind split one ring between them.
  int index = 0;     // 0 .. count-1 within the pod.
  uint32_t ring_size = kDefaultRingSize;
  // The pod's metrics (NodeManagerOptions::metrics), for the node's parts.
  // Null: none.
  MetricsRegistry* metrics = nullptr;
  // The pod's updater pool (NodeManagerOptions::updaters), shared
  // by the syncers of every node, so the pod's threads do not grow with its
  // node count. Null: each syncer owns its own.
  UpdaterPool* updaters = nullptr;
  // The pod's loop pool (NodeManagerOptions::loops), shared by the
  // reconcile loops of every node. Null: each loop has its own thread.
  LoopPool* loops = nullptr;
  // The pod's runner pool (NodeManagerOptions::runners), on which every
  // node's runner runs. Null: each runner has its own thread.
  RunnerPool* runners = nullptr;
};

// What a node tells operators, through the pod's /healthz, /readyz and
// /statusz (NodeManager::Liveness, Readiness, StatusJson).
struct NodeReport {
  // Why the node is not alive (a runner stuck in one event): /healthz fails.
  std::vector<std::string> stuck;
  // Why it is not ready (a syncer out of sync): /readyz fails.
  std::vector<std::string> not_ready;
  // A JSON object with the node's own status (its syncers, plans); empty
  // for none.
  std::string status_json;
};

class Node {
 public:
  virtual ~Node() = default;

  // Does the node's work until `ctx` is cancelled; then returns OK. An error
  // return (or a throw) is a failure: the manager takes the node's range
  // away, waits (backoff), and calls Run again on the same object.
  virtual absl::Status Run(const Context& ctx) = 0;

  // Optional, for a node whose work runs on threads it shares (runners and
  // loops on the pod's pools): true, and the manager calls Launch instead of
  // giving Run a thread to wait on, so the pod's threads do not grow with its
  // node count. Called once, after the factory. Default: false.
  virtual bool Threadless() const { return false; }
  // Threadless nodes: starts the node's work and returns at once; it goes on
  // until Halt. An error return (or a throw) is a failure, handled as a
  // failed Run: the range is taken away, and after a backoff Launch is
  // called again. Once launched, a node reports trouble through Report
  // (stuck, not ready), not by failing. Default: kUnimplemented.
  virtual absl::Status Launch(const Context& ctx) {
    (void)ctx;
    return absl::UnimplementedError("this node runs on a thread of its own");
  }
  // Threadless nodes: stops what Launch started and returns once it has
  // stopped; called once per successful Launch, when the pod stops.
  // Default: nothing.
  virtual void Halt() {}

  // The node's shards are now `assignment.range`, with fencing token
  // `assignment.token` (pass it to the systems you write to; it only grows
  // for a shard). Must return only once the node has stopped every piece of
  // work on shards outside the new range: another node may start on them as
  // soon as this returns OK. Keep it short: the lease keeps running.
  // Return an error when work outside the new range may still be running
  // (a call that ignored its cancellation): the manager then keeps the
  // shards recorded as this node's (nobody else is granted them), and asks
  // again later. A throw is a failure of the node (it is restarted).
  virtual absl::Status UpdateShardRange(const Context& ctx,
                                        const Assignment& assignment) = 0;

  // Fills `report` for operators. Called on any thread, possibly while Run
  // and UpdateShardRange run: read what the node published, never block.
  // Something that has not made progress for `stuck_after` is stuck.
  // Default: nothing to report (alive and ready).
  virtual void Report(absl::Duration stuck_after, NodeReport& report) const {
    (void)stuck_after;
    (void)report;
  }
};

}  // namespace setpoint

#endif  // SETPOINT_NODE_NODE_H_
