// What the node manager keeps per node: the Slot its lease protocol, relays,
// restart loop and status share. Internal to src/node.
#ifndef SETPOINT_SRC_NODE_NODE_SLOT_H_
#define SETPOINT_SRC_NODE_NODE_SLOT_H_

#include <deque>
#include <memory>
#include <thread>

#include "setpoint/node/node_manager.h"

namespace setpoint {

// One node and what the manager knows about it. The fields below `node` are
// guarded by NodeManager::mu_ (a nested struct cannot name it for the
// analysis).
struct NodeManager::Slot {
  NodeInfo info;
  std::unique_ptr<Node> node;
  // node->Threadless(): launched and halted, no run thread while it works.
  bool threadless = false;
  // Last assignment UpdateShardRange returned from.
  Assignment active;
  // Assignments waiting for the relay; the front one may be running.
  std::deque<Assignment> queue;
  // Included in polls (false while a failed node waits to restart).
  bool registered = true;
  // Run failed: being fenced and deregistered before the restart.
  bool failed = false;
  // Fenced and deregistered; the run thread may restart Run.
  bool restart_ok = false;
  // The run thread waits out the restart backoff on the clock (set in the
  // critical section that starts the wait, so Idle() sees no gap).
  bool backing_off = false;
  // Fenced (renewals failed, the lease lapsed, the record differed or the
  // state is new): the empty range was queued, and the node waits for a
  // renewal in time before it may be granted anything again.
  bool lease_fenced = false;
  // The relay is inside UpdateShardRange with queue.front(), since
  // call_started.
  bool in_call = false;
  absl::Time call_started = absl::InfinitePast();
  // The node refused its last update: the relay waits until then.
  absl::Time retry_at = absl::InfinitePast();
  // The node refused its last update and has not returned OK since: what
  // it works on is somewhere between `active` and what it was asked for.
  bool unconfirmed = false;
  bool running = false;
  int restarts = 0;
  // Runs Run (or, for a threadless node, the restarts after a failed
  // Launch); not started for a threadless node that launched.
  std::jthread run;
};

}  // namespace setpoint

#endif  // SETPOINT_SRC_NODE_NODE_SLOT_H_
