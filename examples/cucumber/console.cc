#include "cucumber/console.h"

#include <algorithm>
#include <map>
#include <vector>

#include "cucumber/cucumber_plan.h"
#include "spdlog/fmt/fmt.h"

namespace cucumber {
namespace {

// Longest step column before names are cut.
constexpr size_t kMaxStepWidth = 56;

std::string Outcome(const setpoint::StepRecord& step) {
  switch (step.outcome) {
    case setpoint::StepOutcome::kSucceeded:
      return "ok";
    case setpoint::StepOutcome::kFailed:
      return "FAILED";
    case setpoint::StepOutcome::kNotRun:
      return "not run";
  }
  return "?";
}

}  // namespace

std::string ShortDuration(absl::Duration d) {
  if (d < absl::Seconds(1)) {
    return fmt::format("{}ms", absl::ToInt64Milliseconds(d));
  }
  return fmt::format("{:.2f}s", absl::ToDoubleSeconds(d));
}

std::string FormatSteps(const setpoint::ExecutionReport& report,
                        const std::string& indent) {
  if (report.steps.empty()) {
    return indent + (report.status.ok() ? "(no steps: already converged)\n"
                                        : "(no steps ran)\n");
  }
  // Depth of each step in the tree (parents come before their children).
  std::map<int64_t, int> depth;
  std::vector<std::string> labels;
  size_t width = 4;
  for (const setpoint::StepRecord& step : report.steps) {
    int d = 0;
    if (auto it = depth.find(step.parent); it != depth.end())
      d = it->second + 1;
    depth[step.id] = d;
    std::string label =
        std::string(2 * static_cast<size_t>(d), ' ') + step.name;
    if (label.size() > kMaxStepWidth) {
      label = label.substr(0, kMaxStepWidth - 3) + "...";
    }
    width = std::max(width, label.size());
    labels.push_back(std::move(label));
  }
  std::string out =
      fmt::format("{}{:<5}  {:<{}}  {:<7}  {:>5}  {:>6}\n", indent, "round",
                  "step", width, "result", "tries", "took");
  for (size_t i = 0; i < report.steps.size(); ++i) {
    const setpoint::StepRecord& step = report.steps[i];
    bool ran = step.outcome != setpoint::StepOutcome::kNotRun;
    out += fmt::format("{}{:<5}  {:<{}}  {:<7}  {:>5}  {:>6}\n", indent,
                       step.round, labels[i], width, Outcome(step),
                       ran ? std::to_string(step.attempts) : "-",
                       ran ? ShortDuration(step.duration) : "-");
    if (step.outcome == setpoint::StepOutcome::kFailed) {
      out += fmt::format("{}       error: {}\n", indent,
                         std::string(step.status.message()));
    }
  }
  if (report.steps_truncated) {
    out += fmt::format("{}(more steps ran than were recorded)\n", indent);
  }
  return out;
}

std::string FormatObservedState(const CloudSnapshot& snapshot,
                                const ClusterRequest& request,
                                const std::string& indent) {
  std::string out;
  int running = 0;
  bool first = true;
  for (const Instance& vm : snapshot.instances) {
    auto tag = vm.tags.find(kClusterTag);
    if (tag == vm.tags.end() || tag->second != request.name) continue;
    if (vm.state == InstanceState::kRunning) ++running;
    out += fmt::format("{}{:<10} {}  {:<11} {}\n", indent,
                       first ? "instances" : "", vm.id, vm.private_ip,
                       InstanceStateName(vm.state));
    first = false;
  }
  if (first) out += fmt::format("{}{:<10} (none)\n", indent, "instances");
  auto record = snapshot.records.find(request.dns_name);
  if (record == snapshot.records.end()) {
    out += fmt::format("{}{:<10} {} (no record)\n", indent, "dns",
                       request.dns_name);
  } else {
    out += fmt::format("{}{:<10} {} A {}\n", indent, "dns", request.dns_name,
                       fmt::join(record->second, " "));
  }
  absl::Status converged = CheckConverged(snapshot, request);
  if (converged.ok() && request.nodes_num == 0) {
    out += fmt::format(
        "{}{:<10} converged: no instances running and no record {}\n", indent,
        "verdict", request.dns_name);
  } else if (converged.ok()) {
    out += fmt::format(
        "{}{:<10} converged: {}/{} instances running, {} lists exactly "
        "their addresses\n",
        indent, "verdict", running, request.nodes_num, request.dns_name);
  } else {
    out += fmt::format("{}{:<10} NOT converged: {}\n", indent, "verdict",
                       std::string(converged.message()));
  }
  return out;
}

}  // namespace cucumber
