// SyncerCounters: a Syncer's one set of counters. Each count is kept once
// here and, when the syncer has a MetricsRegistry, written to its metric
// cell in the same call, so stats() and /metrics never disagree and no
// call site counts twice. The gauges of the keys by state are set from a
// status snapshot (PublishStatus).
//
// The metric names (setpoint_syncer_*) are listed in docs/operations.md;
// every series exists from construction, at 0.
//
// Thread safety: Add, ObserveDuration, ObserveBatch and Read from any
// thread (relaxed atomics); Op and PublishStatus from one thread at a time
// (the syncer's runner).
#ifndef SETPOINT_PROCESSOR_INTERNAL_SYNCER_COUNTERS_H_
#define SETPOINT_PROCESSOR_INTERNAL_SYNCER_COUNTERS_H_

#include <atomic>
#include <cstdint>

#include "setpoint/base/metrics.h"
#include "setpoint/processor/sync_types.h"

namespace setpoint::internal {

// The states a key can be in, as metrics and /statusz name them.
enum class KeyStateName : uint8_t {
  kConverged,
  kPending,
  kInFlight,
  kAwaitingObservation,
  kBackingOff,
  kTerminal,
  kStale,
  kCount,
};
const char* KeyStateNameText(KeyStateName state);

class SyncerCounters {
 public:
  // Counters besides the operations' results.
  enum Kind : uint8_t {
    kThrew,
    kDiscarded,
    kIgnored,
    kNotStartedAtStop,
    kCancelled,
    kPauses,
    kProbes,
    kRequeued,
    kBatches,
    kKinds,
  };
  // How an operation ended.
  enum Result : uint8_t { kSuccess, kError, kTerminal, kStale, kResults };

  // `labels` already name the syncer. No registry: counts only.
  SyncerCounters(MetricsRegistry* metrics, const MetricLabels& labels);
  SyncerCounters(const SyncerCounters&) = delete;
  SyncerCounters& operator=(const SyncerCounters&) = delete;

  void Add(Kind kind, int64_t n = 1);
  // An operation's result (success counts as a create / update / delete,
  // error as a failure that is retried, stale as a stale refusal).
  void Op(SyncOp op, Result result);
  void ObserveDuration(SyncOp op, int64_t ns);
  void ObserveBatch(int64_t operations);

  SyncerStats Read() const;
  bool has_metrics() const { return in_sync_ != nullptr; }

  // Sets the gauges: keys by state, in sync, paused, longest pending.
  void PublishStatus(
      const int64_t (&keys)[static_cast<int>(KeyStateName::kCount)],
      bool in_sync, bool paused, double longest_pending_s);

 private:
  static int OpIndex(SyncOp op);

  std::atomic<int64_t> ops_[3][kResults] = {};
  std::atomic<int64_t> kinds_[kKinds] = {};
  // Cells, null without a registry.
  Counter* op_cells_[3][kResults] = {};
  Counter* kind_cells_[kKinds] = {};
  Counter* retries_ = nullptr;
  Counter* stale_ = nullptr;
  Histogram* durations_[3] = {};
  Histogram* batch_size_ = nullptr;
  Gauge* keys_[static_cast<int>(KeyStateName::kCount)] = {};
  Gauge* in_sync_ = nullptr;
  Gauge* paused_ = nullptr;
  Gauge* longest_pending_ = nullptr;
};

}  // namespace setpoint::internal

#endif  // SETPOINT_PROCESSOR_INTERNAL_SYNCER_COUNTERS_H_
