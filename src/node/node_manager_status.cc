// The node manager's status: metrics, liveness, readiness and /statusz.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "node/node_slot.h"
#include "setpoint/base/format.h"
#include "setpoint/base/json.h"
#include "setpoint/node/node_manager.h"

namespace setpoint {

namespace {

const char* CodeLabel(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case absl::StatusCode::kDataLoss:
      return "data_loss";
    case absl::StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case absl::StatusCode::kAborted:
      return "aborted";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    case absl::StatusCode::kPermissionDenied:
      return "permission_denied";
    case absl::StatusCode::kUnauthenticated:
      return "unauthenticated";
    default:
      return "other";
  }
}

// Every operation and code setpoint_registry_errors_total counts, so that
// each series is there at 0 from the start.
constexpr const char* kRegistryOps[] = {"poll", "handoff", "release", "grant",
                                        "deregister"};
constexpr absl::StatusCode kRegistryCodes[] = {
    absl::StatusCode::kUnavailable,     absl::StatusCode::kDeadlineExceeded,
    absl::StatusCode::kDataLoss,        absl::StatusCode::kFailedPrecondition,
    absl::StatusCode::kAborted,         absl::StatusCode::kCancelled,
    absl::StatusCode::kInvalidArgument, absl::StatusCode::kPermissionDenied,
    absl::StatusCode::kUnauthenticated, absl::StatusCode::kUnknown};

}  // namespace

void NodeManager::InitMetrics() {
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) return;
  const MetricLabels pod = {{"pod", pod_id_}};
  poll_duration_ =
      &m->GetHistogram("setpoint_registry_poll_duration_seconds",
                       "How long registry polls (lease renewals) took.", pod,
                       Histogram::DurationBuckets());
  handoff_duration_ = &m->GetHistogram(
      "setpoint_node_handoff_duration_seconds",
      "How long nodes took to take a new range (UpdateShardRange).", pod,
      Histogram::DurationBuckets());
  for (const char* op : kRegistryOps) {
    for (absl::StatusCode code : kRegistryCodes) {
      m->GetCounter("setpoint_registry_errors_total",
                    "Registry calls that failed, by operation and code.",
                    {{"pod", pod_id_}, {"op", op}, {"code", CodeLabel(code)}});
    }
  }
  collector_ = m->AddCollector([this](MetricWriter& w) { CollectMetrics(w); });
}

void NodeManager::CountError(const char* op, const absl::Status& s) {
  if (s.ok() || options_.metrics == nullptr) return;
  options_.metrics
      ->GetCounter(
          "setpoint_registry_errors_total",
          "Registry calls that failed, by operation and code.",
          {{"pod", pod_id_}, {"op", op}, {"code", CodeLabel(s.code())}})
      .Increment();
}

void NodeManager::CollectMetrics(MetricWriter& w) const {
  const MetricLabels pod = {{"pod", pod_id_}};
  MutexLock l(&mu_);
  const NodeManagerStats& st = stats_;
  const std::pair<const char*, std::pair<const char*, int64_t>> counters[] = {
      {"setpoint_registry_polls_total",
       {"Registry polls (lease renewals) sent.", st.polls}},
      {"setpoint_registry_poll_failures_total",
       {"Registry polls that failed.", st.poll_failures}},
      {"setpoint_node_grants_total",
       {"Shard ranges granted to this pod's nodes.", st.grants}},
      {"setpoint_node_grant_conflicts_total",
       {"Grants refused for now (shards still held, epoch grace).",
        st.grant_conflicts}},
      {"setpoint_node_grants_waited_total",
       {"Grants not sent: the pod's view showed another node still holding "
        "some of their shards.",
        st.grants_waited}},
      {"setpoint_node_releases_total",
       {"Shard releases published.", st.releases}},
      {"setpoint_node_self_fences_total",
       {"Nodes stopped at once: renewals failed, the lease lapsed, the "
        "record differed or the registry's state was new.",
        st.fences}},
      {"setpoint_registry_epoch_changes_total",
       {"Times the registry's state was new (restart, restore, failover).",
        st.epoch_changes}},
      {"setpoint_node_restarts_total",
       {"Node restarts after a failed Run.", st.restarts}},
      {"setpoint_node_update_failures_total",
       {"UpdateShardRange calls that reported work still running.",
        st.update_failures}},
  };
  for (const auto& [name, help_value] : counters) {
    w.Counter(name, help_value.first, pod,
              static_cast<double>(help_value.second));
  }
  const absl::Time now = clock_->Now();
  const double lease_left =
      renewed_at_ == absl::InfinitePast()
          ? 0.0
          : std::max(0.0, absl::ToDoubleSeconds(FenceDeadline() - now));
  w.Gauge("setpoint_node_drained",
          "1 while the pod is drained (setpointctl drain): its nodes get no "
          "share of the ring.",
          pod, drained_ ? 1 : 0);
  w.Gauge("setpoint_node_lease_remaining_seconds",
          "Time this pod's nodes may still work without another renewal.", pod,
          lease_left);
  for (const auto& slot : slots_) {
    const MetricLabels node = {
        {"pod", pod_id_}, {"kind", slot->info.kind}, {"node", slot->info.id}};
    w.Gauge("setpoint_node_shards_owned",
            "Shards the node works on (its active range).", node,
            static_cast<double>(slot->active.range.size()));
    w.Gauge("setpoint_node_fencing_token",
            "The fencing token of the node's active range (0: none).", node,
            static_cast<double>(slot->active.token));
    w.Gauge("setpoint_node_running",
            "1 while the node runs (its Run executes, or it is launched).",
            node, slot->running ? 1 : 0);
  }
}

std::vector<const NodeManager::Slot*> NodeManager::ReportedSlots() const {
  MutexLock l(&mu_);
  std::vector<const Slot*> out;
  for (const auto& slot : slots_) out.push_back(slot.get());
  return out;
}

std::vector<std::string> NodeManager::Liveness(
    absl::Duration stuck_after) const {
  std::vector<std::string> problems;
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    const absl::Duration bound =
        stuck_after + options_.poll_interval + options_.operation_timeout;
    if (started_ && !stopped_ && last_tick_ != absl::InfinitePast() &&
        now - last_tick_ > bound) {
      problems.push_back(
          absl::StrCat("node manager pod=", pod_id_,
                       ": the protocol thread has not come round for ",
                       HumanDuration(now - last_tick_)));
    }
  }
  for (const Slot* slot : ReportedSlots()) {
    NodeReport r;
    slot->node->Report(stuck_after, r);
    for (auto& p : r.stuck) {
      problems.push_back(absl::StrCat(slot->info.id, ": ", p));
    }
  }
  return problems;
}

std::vector<std::string> NodeManager::Readiness(
    absl::Duration stuck_after) const {
  std::vector<std::string> problems;
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    if (!started_ || stopped_) {
      problems.push_back("node manager not running");
    } else if (failure_streak_ > 0) {
      problems.push_back(
          absl::StrCat("registry unreachable: ", failure_streak_,
                       " polls failed in a row, last: ", last_poll_error_));
    }
    if (renewed_at_ == absl::InfinitePast()) {
      problems.push_back("no lease yet: the registry has not answered");
    } else if (now >= FenceDeadline()) {
      problems.push_back(absl::StrCat("lease lapsed ",
                                      HumanDuration(now - FenceDeadline()),
                                      " ago: nodes are fenced"));
    }
  }
  for (const Slot* slot : ReportedSlots()) {
    NodeReport r;
    slot->node->Report(stuck_after, r);
    for (auto& p : r.not_ready) {
      problems.push_back(absl::StrCat(slot->info.id, ": ", p));
    }
  }
  return problems;
}

std::string NodeManager::StatusJson(absl::Duration stuck_after) const {
  struct Row {
    NodeInfo info;
    Assignment active;
    bool registered, running;
    int restarts;
    const Node* node;
  };
  std::vector<Row> rows;
  std::string out = "{\"pod\":";
  AppendJsonString(&out, pod_id_);
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    out += ",\"epoch\":";
    AppendJsonString(&out, epoch_);
    absl::StrAppendFormat(
        &out, ",\"lease_valid_for_seconds\":%.3f",
        renewed_at_ == absl::InfinitePast()
            ? 0.0
            : std::max(0.0, absl::ToDoubleSeconds(FenceDeadline() - now)));
    absl::StrAppend(&out, ",\"drained\":", drained_ ? "true" : "false");
    absl::StrAppend(&out, ",\"registry_reachable\":",
                    failure_streak_ == 0 && renewed_at_ != absl::InfinitePast()
                        ? "true"
                        : "false");
    const NodeManagerStats& st = stats_;
    absl::StrAppend(
        &out, ",\"stats\":{\"polls\":", st.polls,
        ",\"poll_failures\":", st.poll_failures, ",\"grants\":", st.grants,
        ",\"releases\":", st.releases, ",\"self_fences\":", st.fences,
        ",\"epoch_changes\":", st.epoch_changes, ",\"restarts\":", st.restarts,
        ",\"update_failures\":", st.update_failures, "}");
    for (const auto& slot : slots_) {
      rows.push_back(Row{slot->info, slot->active, slot->registered,
                         slot->running, slot->restarts, slot->node.get()});
    }
  }
  out += ",\"nodes\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (i > 0) out += ",";
    out += "{\"id\":";
    AppendJsonString(&out, r.info.id);
    out += ",\"kind\":";
    AppendJsonString(&out, r.info.kind);
    absl::StrAppend(
        &out, ",\"range\":[", r.active.range.Hull().begin, ",",
        r.active.range.Hull().end, "],\"shards\":", r.active.range.RunsJson(),
        ",\"ring_size\":", r.info.ring_size, ",\"token\":", r.active.token,
        ",\"registered\":", r.registered ? "true" : "false",
        ",\"running\":", r.running ? "true" : "false",
        ",\"restarts\":", r.restarts);
    NodeReport report;
    r.node->Report(stuck_after, report);
    if (!report.status_json.empty()) {
      absl::StrAppend(&out, ",\"status\":", report.status_json);
    }
    out += "}";
  }
  out += "]}";
  return out;
}

}  // namespace setpoint
