#include "setpoint/controller/internal/controller_pieces.h"

#include <algorithm>
#include <exception>

#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/planner/loop_pool.h"
#include "setpoint/processor/runner_pool.h"
#include "spdlog/spdlog.h"

namespace setpoint::internal {

ControllerRun::ControllerRun(const NodeInfo& node,
                             const ControllerOptions& opts,
                             ControllerBoard* status_board)
    : info(node),
      options(opts),
      labels({{"kind", node.kind}, {"node", node.id}}),
      board(status_board),
      runner({.name = node.id,
              .clock = opts.clock,
              .metrics = opts.metrics,
              .metric_labels = labels,
              .logger = opts.logger,
              .pool = !opts.manual && opts.runners != nullptr &&
                              opts.runners->clock() == opts.clock
                          ? opts.runners
                          : nullptr}),
      pod(opts.pod_sources),
      pod_id(PodOf(node.id)) {}

std::string PodOf(const std::string& node_id) {
  return node_id.substr(0, node_id.find('/'));
}

void PublishSource(const SourceHealth& health, bool store_in_sync, size_t keys,
                   std::string* json, std::vector<std::string>* not_ready) {
  if (!json->empty()) json->push_back(',');
  health.AppendJson(json,
                    absl::StrCat(",\"keys\":", keys, ",\"store_in_sync\":",
                                 store_in_sync ? "true" : "false"));
  if (store_in_sync) return;
  std::string why = health.NotReady();
  if (why.empty()) {
    // The source is in sync; this node's store waits for its part under
    // the range it was just given.
    why = absl::StrCat("source ", health.status().name,
                       ": listing for the node's new range");
  }
  not_ready->push_back(std::move(why));
}

void ControllerRun::Beat() {
  std::string json;
  std::vector<std::string> not_ready;
  for (auto& piece : pieces) piece->Publish(&json, &not_ready);
  {
    MutexLock l(&board->mu);
    board->beat = options.clock->Now();
    board->not_ready = std::move(not_ready);
    board->pieces_json = absl::StrCat("[", json, "]");
  }
  if (options.manual || options.status_interval <= absl::ZeroDuration()) return;
  MutexLock l(&mu_);
  if (beats_stopped_) return;
  absl::StatusOr<TimerHandle> next = runner.PostAfter(
      options.status_interval, [this] { Beat(); }, "controller status");
  if (next.ok()) beat_ = *std::move(next);
}

void ControllerRun::StopBeats() {
  TimerHandle beat;
  {
    MutexLock l(&mu_);
    beats_stopped_ = true;
    beat = std::move(beat_);
  }
  beat.Cancel();
}

std::shared_ptr<const Assignment> ControllerRun::Current() const {
  MutexLock l(&mu_);
  return current_;
}

void ControllerRun::SetCurrent(std::shared_ptr<const Assignment> a) {
  MutexLock l(&mu_);
  current_ = std::move(a);
}

PlanPiece::PlanPiece(ControllerRun* run, std::unique_ptr<Plan> plan,
                     ReconcileLoopOptions options)
    : manual_(run->options.manual),
      plan_(std::move(plan)),
      loop_(*plan_, Adjust(run, std::move(options))) {}

void PlanPiece::Publish(std::string* json, std::vector<std::string>*) {
  if (!json->empty()) json->push_back(',');
  json->append("{\"plan\":");
  absl::StatusOr<std::string> named =
      CallUserCode("plan name", [&] { return plan_->Name(); });
  const std::string name = named.ok() ? *named : "(plan name threw)";
  AppendJsonString(json, name);
  const ReconcileLoopStats st = loop_.stats();
  absl::StrAppend(
      json, ",\"executions\":", st.executions, ",\"failures\":", st.failures,
      ",\"stale_refusals\":", st.stale_refusals, ",\"last_report\":");
  std::optional<ExecutionReport> last = loop_.last_report();
  json->append(last.has_value() ? last->ToJson() : "null");
  json->push_back('}');
}

ReconcileLoopOptions PlanPiece::Adjust(ControllerRun* run,
                                       ReconcileLoopOptions o) {
  o.clock = run->options.clock;
  if (o.pool == nullptr && !run->options.manual &&
      run->options.loops != nullptr && run->options.loops->clock() == o.clock) {
    o.pool = run->options.loops;
  }
  if (o.metrics == nullptr) o.metrics = run->options.metrics;
  o.metric_labels = WithLabels(run->labels, std::move(o.metric_labels));
  if (o.logger == nullptr) o.logger = run->options.logger;
  // Paused until the node owns shards; every execution runs under the
  // assignment in force when it starts (it is paused around changes).
  o.start_paused = true;
  auto user = std::move(o.execution_context);
  o.execution_context = [run, user = std::move(user)](const Context& ctx) {
    Context c = ctx.WithValue(run->Current());
    return user ? user(c) : c;
  };
  return o;
}

absl::Status PlanPiece::Start() {
  if (manual_) return absl::OkStatus();  // RunUntilIdle drives it.
  return loop_.Start();
}

}  // namespace setpoint::internal
