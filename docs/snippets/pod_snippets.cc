// The C++ snippet of docs/pod.md, a whole pod program: compiled into the
// doc_snippets_pod executable (built with doc_snippets_test, never run),
// and checked by doc_snippets_test to be what the doc shows. Between
// "clang-format off" and "on" the text is the doc's, layout included; edit
// both together.

#include <string>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "setpoint/controller/controller.h"
#include "setpoint/pod/pod_main.h"

// clang-format off
setpoint::ControllerKind JobsKind(const int* jobs) {
  return {.kind = "jobs",
          .count = 2,
          .build = [jobs](setpoint::ControllerBuilder& b) {
            b.Reconcile(setpoint::MakePlan(
                "jobs", [jobs](const setpoint::Context&)
                            -> absl::StatusOr<setpoint::Procedures> {
                  (void)*jobs;  // Plan the jobs of this node's shards.
                  return setpoint::Procedures{};
                }));
            return absl::OkStatus();
          }};
}

int main(int argc, char** argv) {
  int jobs = 1000;
  return setpoint::PodMain(argc, argv, {
      .program = "jobs",
      .description = "Runs the jobs of the catalogue it owns.",
      .kinds = {JobsKind(&jobs).ToNodeKind()},
      .flags = {{.name = "jobs", .help = "jobs in the catalogue",
                 .set = [&](const std::string& v) {
                   return absl::SimpleAtoi(v, &jobs) && jobs >= 0
                              ? absl::OkStatus()
                              : absl::InvalidArgumentError("not a count");
                 }}},
  });
}
// clang-format on
