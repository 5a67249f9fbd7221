// The C++ snippet of docs/pod.md, a whole pod program: compiled into the
// doc_snippets_pod executable (built with doc_snippets_test, never run),
// and checked by doc_snippets_test to be what the doc shows. Between
// "clang-format off" and "on" the text is the doc's, layout included; edit
// both together.

#include <memory>

#include "absl/status/status.h"
#include "setpoint/base/context.h"
#include "setpoint/node/node.h"
#include "setpoint/pod/pod_main.h"

// A node that does nothing but wait; the doc leaves it out.
class JobsNode : public setpoint::Node {
 public:
  explicit JobsNode(const setpoint::NodeInfo&) {}
  absl::Status Run(const setpoint::Context& ctx) override {
    (void)ctx.Wait(absl::InfiniteDuration());
    return absl::OkStatus();
  }
  absl::Status UpdateShardRange(const setpoint::Context&,
                                const setpoint::Assignment&) override {
    return absl::OkStatus();
  }
};

// clang-format off
int main(int argc, char** argv) {
  return setpoint::PodMain(argc, argv, {
      .program = "jobs",
      .description = "Runs the jobs of the catalogue it owns.",
      .kinds = {{.kind = "jobs", .count = 2,
                 .factory = [](const setpoint::NodeInfo& info) {
                   return std::make_unique<JobsNode>(info);
                 }}},
  });
}
// clang-format on
