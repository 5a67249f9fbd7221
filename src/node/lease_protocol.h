// The node manager's lease protocol as pure functions: from what a poll
// showed and what one node works on, the next thing to do for that node,
// and why its kind's targets moved. No locks, no threads, no clock: the
// manager gathers the facts under its lock and acts on the decision.
// Internal to src/node; tests/node/lease_protocol_test.cc covers it.
#ifndef SETPOINT_SRC_NODE_LEASE_PROTOCOL_H_
#define SETPOINT_SRC_NODE_LEASE_PROTOCOL_H_

#include <optional>
#include <set>
#include <string>

#include "setpoint/node/node_registry.h"
#include "setpoint/node/shard.h"

namespace setpoint::lease_protocol {

// What the manager knows of one node when it looks.
struct NodeFacts {
  // What the node works on (the last update it returned OK from, or what
  // it keeps after a refusal).
  Assignment active;
  // An update waits for the relay, or the pod is stopping: nothing moves.
  bool relay_busy = false;
  // Fenced; waits for a renewal in time before it may be granted again.
  bool lease_fenced = false;
  // Its Run failed: it empties, leaves the ring and restarts.
  bool failed = false;
  // It refused its last update and has not returned OK since.
  bool unconfirmed = false;
};

// The next thing one node needs.
struct Decision {
  enum class Kind {
    kNothing,   // Settled, or waiting for the relay or a renewal.
    kStop,      // The registry's record differs from what it works on.
    kAskAgain,  // A refused change, asked for again towards the target.
    kShrink,    // Stop outside the target before anything is published.
    kRegistry,  // Release, grant or deregister (in the pod's handoff).
  };
  Kind kind = Kind::kNothing;
  // kAskAgain, kShrink: the update to queue for the node.
  Assignment update;
  // kRegistry: what the node keeps (release), the target to grow into
  // (grant, after the release if both), or that it leaves the ring.
  std::optional<Assignment> release;
  std::optional<ShardSet> grant;
  bool deregister = false;
};

// One node's next step towards `target`, given the record the last poll
// showed for it (`held`: nothing when it has none). The order is the
// protocol's: a record that differs stops the node; a refused change is
// asked for again; shrink first; publish the release once the node works
// on less than it holds (growing in the same round trip when it now works
// inside its target); a failed node leaves; grow only into free shards.
Decision Decide(const NodeFacts& node, const std::optional<Assignment>& held,
                ShardSet target);

// An id's place in the order that hands out the odd shards (SharePlaces:
// those over q, then the rest, each in id order), after `other` crossed q
// (`up`: came to hold more than q; else stopped). `over` says whether `id`
// is over q. The place moves by one at most: when `other` passes in front
// of it, or, for an id not over q, when the group ahead grows or shrinks
// without `other` passing it.
uint64_t PlaceAfterCrossing(uint64_t place, bool over, const std::string& id,
                            const std::string& other, bool up);

// What a view's state and the one before say about why targets moved,
// for logs: "start" (no view before), "epoch" (the registry's state is
// new), "drain" (the drained pods changed), "join" and "leave" (members
// came or went: a leave is a deregistration or an expired lease, the
// registry keeps no difference), joined by '+' when several hold; "none"
// when nothing that moves targets changed.
struct ViewState {
  const std::string* epoch = nullptr;
  const std::set<std::string>* drained = nullptr;
  const KindView* kind = nullptr;  // Null: the kind was not in the view.
};
std::string MoveReason(const std::optional<ViewState>& before,
                       const ViewState& now);
// The same from what is known to have changed ("none" when nothing did).
std::string MoveReasonOf(bool drained_changed, bool joined, bool left);

}  // namespace setpoint::lease_protocol

#endif  // SETPOINT_SRC_NODE_LEASE_PROTOCOL_H_
