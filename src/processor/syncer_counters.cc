#include "setpoint/processor/internal/syncer_counters.h"

#include <vector>

namespace setpoint::internal {
namespace {

constexpr const char* kOpNames[3] = {"create", "update", "delete"};
constexpr const char* kResultNames[SyncerCounters::kResults] = {
    "success", "error", "terminal", "stale"};

struct KindMetric {
  const char* name;
  const char* help;
};
// By SyncerCounters::Kind.
constexpr KindMetric kKindMetrics[SyncerCounters::kKinds] = {
    {"setpoint_syncer_client_threw_total",
     "Client calls that threw (each is also a failed operation)."},
    {"setpoint_syncer_results_discarded_total",
     "Results discarded because their key left the range."},
    {"setpoint_syncer_ignored_out_of_range_total",
     "Desired or observed values ignored: their key is outside the range."},
    {"setpoint_syncer_not_started_at_stop_total",
     "Operations handed to the updaters that never started: the syncer "
     "stopped."},
    {"setpoint_syncer_calls_cancelled_total",
     "Calls cancelled or never started because their key left the range."},
    {"setpoint_syncer_pauses_total",
     "Times writes paused because the world was unreachable."},
    {"setpoint_syncer_probes_total",
     "Calls sent while paused, to see whether the world is back."},
    {"setpoint_syncer_requeued_total",
     "Failed operations retried without counting a failure (the world was "
     "down, or their batch was cancelled for another key)."},
    {"setpoint_syncer_batches_total", "Batch client calls made."},
};

}  // namespace

const char* KeyStateNameText(KeyStateName state) {
  switch (state) {
    case KeyStateName::kConverged:
      return "converged";
    case KeyStateName::kPending:
      return "pending";
    case KeyStateName::kInFlight:
      return "in_flight";
    case KeyStateName::kAwaitingObservation:
      return "awaiting_observation";
    case KeyStateName::kBackingOff:
      return "backing_off";
    case KeyStateName::kTerminal:
      return "terminal";
    case KeyStateName::kStale:
      return "stale";
    case KeyStateName::kCount:
      break;
  }
  return "unknown";
}

SyncerCounters::SyncerCounters(MetricsRegistry* m, const MetricLabels& base) {
  if (m == nullptr) return;
  for (int op = 0; op < 3; ++op) {
    for (int r = 0; r < kResults; ++r) {
      op_cells_[op][r] = &m->GetCounter(
          "setpoint_syncer_operations_total",
          "Client calls that returned, by operation and result.",
          WithLabels(base,
                     {{"op", kOpNames[op]}, {"result", kResultNames[r]}}));
    }
    durations_[op] = &m->GetHistogram(
        "setpoint_syncer_operation_duration_seconds",
        "How long client calls took, by operation (a batch call's duration "
        "for each of its operations).",
        WithLabels(base, {{"op", kOpNames[op]}}), Histogram::DurationBuckets());
  }
  for (int k = 0; k < kKinds; ++k) {
    kind_cells_[k] =
        &m->GetCounter(kKindMetrics[k].name, kKindMetrics[k].help, base);
  }
  retries_ = &m->GetCounter(
      "setpoint_syncer_retries_total",
      "Failed operations scheduled for a retry with backoff.", base);
  stale_ = &m->GetCounter(
      "setpoint_syncer_stale_refusals_total",
      "Calls the system refused as coming from a stale owner (old token).",
      base);
  batch_size_ = &m->GetHistogram("setpoint_syncer_batch_operations",
                                 "Operations per batch client call.", base,
                                 {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000});
  for (int i = 0; i < static_cast<int>(KeyStateName::kCount); ++i) {
    keys_[i] = &m->GetGauge(
        "setpoint_syncer_keys", "Tracked keys, by state.",
        WithLabels(
            base, {{"state", KeyStateNameText(static_cast<KeyStateName>(i))}}));
  }
  in_sync_ = &m->GetGauge(
      "setpoint_syncer_in_sync",
      "1 when the syncer's inputs are complete and it acts, else 0.", base);
  paused_ = &m->GetGauge(
      "setpoint_syncer_paused",
      "1 while writes are paused because the world is unreachable (one "
      "probe call at a time), else 0.",
      base);
  longest_pending_ = &m->GetGauge(
      "setpoint_syncer_longest_pending_seconds",
      "How long the key waiting longest for the world to match has waited.",
      base);
}

int SyncerCounters::OpIndex(SyncOp op) {
  return op == SyncOp::kCreate ? 0 : op == SyncOp::kUpdate ? 1 : 2;
}

void SyncerCounters::Add(Kind kind, int64_t n) {
  if (n == 0) return;
  kinds_[kind].fetch_add(n, std::memory_order_relaxed);
  if (kind_cells_[kind] != nullptr) {
    kind_cells_[kind]->Increment(static_cast<double>(n));
  }
}

void SyncerCounters::Op(SyncOp op, Result result) {
  if (op == SyncOp::kNone) return;
  const int i = OpIndex(op);
  // One writer (the syncer's runner): no read-modify-write needed.
  ops_[i][result].store(ops_[i][result].load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
  if (op_cells_[i][result] == nullptr) return;
  op_cells_[i][result]->Increment();
  if (result == kError) retries_->Increment();
  if (result == kStale) stale_->Increment();
}

void SyncerCounters::ObserveDuration(SyncOp op, int64_t ns) {
  if (op == SyncOp::kNone || durations_[0] == nullptr) return;
  durations_[OpIndex(op)]->Observe(static_cast<double>(ns) * 1e-9);
}

void SyncerCounters::ObserveBatch(int64_t operations) {
  Add(kBatches);
  if (batch_size_ != nullptr) {
    batch_size_->Observe(static_cast<double>(operations));
  }
}

SyncerStats SyncerCounters::Read() const {
  auto get = [](const std::atomic<int64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  auto sum = [&](Result r) {
    return get(ops_[0][r]) + get(ops_[1][r]) + get(ops_[2][r]);
  };
  return SyncerStats{
      .creates = get(ops_[0][kSuccess]),
      .updates = get(ops_[1][kSuccess]),
      .deletes = get(ops_[2][kSuccess]),
      .failures = sum(kError),
      .terminal_failures = sum(kTerminal),
      .client_threw = get(kinds_[kThrew]),
      .results_discarded = get(kinds_[kDiscarded]),
      .ignored_out_of_range = get(kinds_[kIgnored]),
      .not_started_at_stop = get(kinds_[kNotStartedAtStop]),
      .calls_cancelled = get(kinds_[kCancelled]),
      .stale_refusals = sum(kStale),
      .pauses = get(kinds_[kPauses]),
      .probes = get(kinds_[kProbes]),
      .requeued = get(kinds_[kRequeued]),
      .batches = get(kinds_[kBatches]),
  };
}

void SyncerCounters::PublishStatus(
    const int64_t (&keys)[static_cast<int>(KeyStateName::kCount)], bool in_sync,
    bool paused, double longest_pending_s) {
  if (in_sync_ == nullptr) return;
  for (int i = 0; i < static_cast<int>(KeyStateName::kCount); ++i) {
    keys_[i]->Set(static_cast<double>(keys[i]));
  }
  in_sync_->Set(in_sync ? 1 : 0);
  paused_->Set(paused ? 1 : 0);
  longest_pending_->Set(longest_pending_s);
}

}  // namespace setpoint::internal
