// IdleNode: a Node that does nothing: Run waits for its context and every
// range is accepted at once. For tests of the protocol, the registry and
// the operator's tools, where only ownership matters.
//
//   NodeManager manager({.kinds = {{.kind = "vm", .factory = [](auto&) {
//                           return std::make_unique<IdleNode>(); }}}, ...});
//
// Derive from it to record what a node is told.
//
// Thread safety: stateless.
#ifndef SETPOINT_TESTING_IDLE_NODE_H_
#define SETPOINT_TESTING_IDLE_NODE_H_

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/node/node.h"
#include "setpoint/node/shard.h"

namespace setpoint::testing {

class IdleNode : public Node {
 public:
  absl::Status Run(const Context& ctx) override {
    (void)ctx.Wait(absl::InfiniteDuration());
    return absl::OkStatus();
  }
  absl::Status UpdateShardRange(const Context&, const Assignment&) override {
    return absl::OkStatus();
  }
};

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_IDLE_NODE_H_
