// Transformer: user logic on the runner that turns observed stores into the
// desired state a Syncer applies.
//
//   Transformer<std::string, Spec> t(&runner, &syncer, [&] {
//     absl::flat_hash_map<std::string, Spec> want;
//     for (const auto& [name, rs] : replica_sets.items()) Expand(rs, want);
//     return want;
//   });
//   t.Watch(&replica_sets);                    // snapshot style
//   t.Watch(&dns_names, [](const Change<std::string, Name>& c) {
//     DesiredDiff<std::string, Spec> diff;     // per-change style
//     if (c.kind == ChangeKind::kSet) {
//       diff.set.emplace_back(c.key, ToSpec(*c.new_value));
//     }
//     if (c.kind == ChangeKind::kDelete) diff.remove.push_back(c.key);
//     return diff;
//   });
//
// Snapshot style: once every watched store is in sync, Snapshot() runs and
// its result replaces the sink's whole desired set; after that, a change in
// a store watched without a hook runs it again, `accumulation_window` after
// the first change (changes in between share one run). Per-change style: a
// hook turns one change into a diff applied at once, with no snapshot.
//
// The transformer is in sync once its inputs are and, if it has a snapshot,
// that snapshot was delivered since they last came back; the sink (a Syncer)
// does not act before that. A snapshot or hook that throws is logged and
// counted; a failed snapshot is retried (backing off from the window to one
// minute) and the transformer stays out of sync until one succeeds.
//
// A transformer may be destroyed before the stores it watches: from then on
// their changes no longer reach it.
//
// Thread safety: runner thread only.
#ifndef SETPOINT_PROCESSOR_TRANSFORMER_H_
#define SETPOINT_PROCESSOR_TRANSFORMER_H_

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/base/logging.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/synchronizable.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {

// A change of the desired state: keys to set, keys no longer desired.
template <class K, class D>
struct DesiredDiff {
  std::vector<std::pair<K, D>> set = {};
  std::vector<K> remove = {};
};

// What consumes desired state (a Syncer). Runner thread only.
template <class K, class D>
class DesiredSink {
 public:
  virtual ~DesiredSink() = default;
  // `desired` is the whole desired set; keys missing from it are no longer
  // desired.
  virtual void ReplaceDesired(absl::flat_hash_map<K, D> desired) = 0;
  virtual void SetDesired(K key, D desired) = 0;
  virtual void DeleteDesired(const K& key) = 0;
  // The sink's desired view is complete only while `producer` is in sync.
  virtual void DependOnDesired(Synchronizable* producer) = 0;
};

struct TransformerOptions {
  // Default: "transformer".
  std::string name = "transformer";
  // Changes are gathered this long before the snapshot runs again (>= 0).
  // Default: 100 ms.
  absl::Duration accumulation_window = absl::Milliseconds(100);
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Returns kInvalidArgument naming the field when `options` is unusable
// (accumulation_window < 0). A Controller refuses such a transform at Start;
// a Transformer built directly checks it in its constructor.
inline absl::Status ValidateTransformerOptions(const TransformerOptions& o) {
  if (o.accumulation_window < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transformer ", o.name, ": accumulation_window must be >= 0, got ",
        absl::FormatDuration(o.accumulation_window)));
  }
  return absl::OkStatus();
}

// Counters for operators and tests.
struct TransformerStats {
  int64_t snapshots = 0;          // Snapshots delivered.
  int64_t snapshot_failures = 0;  // Snapshots that threw.
  int64_t hook_diffs = 0;         // Hook results applied.
  int64_t hook_failures = 0;      // Hooks that threw (the change is skipped).
};

template <class K, class D>
class Transformer : public Synchronizable {
 public:
  using DesiredMap = absl::flat_hash_map<K, D>;
  using SnapshotFn = absl::AnyInvocable<DesiredMap()>;

  // `snapshot` may be null when every input is watched with a hook.
  // `options` must pass ValidateTransformerOptions; bad ones are a bug and
  // abort, naming the field.
  Transformer(Runner* runner, DesiredSink<K, D>* sink, SnapshotFn snapshot,
              TransformerOptions options = {});
  ~Transformer() override { timer_.Cancel(); }

  // Snapshot style: changes in `store` schedule a snapshot.
  template <class IK, class IV>
  void Watch(Store<IK, IV>* store);
  // Per-change style: each change of `store` goes through `hook` and the
  // returned diff reaches the sink at once.
  template <class IK, class IV>
  void Watch(Store<IK, IV>* store,
             std::type_identity_t<
                 absl::AnyInvocable<DesiredDiff<K, D>(const Change<IK, IV>&)>>
                 hook);

  // Schedules a snapshot as if an input had changed (for inputs that are not
  // stores, such as a timer or configuration).
  void Invalidate() {
    SETPOINT_DCHECK_ON_RUNNER(runner_);
    ScheduleSnapshot(options_.accumulation_window);
  }

  // Runner thread only.
  const TransformerStats& stats() const {
    SETPOINT_DCHECK_ON_RUNNER(runner_);
    return stats_;
  }

 protected:
  void OnInputsSyncChanged(bool inputs_in_sync) override;

 private:
  // Runs the snapshot `delay` from now unless one is already pending. A
  // zero delay (the inputs came back) moves a pending later run forward.
  void ScheduleSnapshot(absl::Duration delay);
  void RunSnapshot();
  void ApplyDiff(DesiredDiff<K, D> diff);

  Runner* const runner_;
  DesiredSink<K, D>* const sink_;
  SnapshotFn snapshot_;
  const TransformerOptions options_;
  std::shared_ptr<spdlog::logger> logger_;
  // Expires with this transformer. Store listeners and timer closures hold a
  // weak reference: a store has no unsubscribe, and a timer the runner has
  // already taken cannot be cancelled, so they check it before touching
  // `this`.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
  TimerHandle timer_;
  bool scheduled_ = false;  // A snapshot timer is pending (timer_).
  int failures_ = 0;
  TransformerStats stats_;
};

// ---------------------------------------------------------------------------

template <class K, class D>
Transformer<K, D>::Transformer(Runner* runner, DesiredSink<K, D>* sink,
                               SnapshotFn snapshot, TransformerOptions options)
    : Synchronizable(options.name),
      runner_(runner),
      sink_(sink),
      snapshot_(std::move(snapshot)),
      options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()) {
  // With no inputs yet, a transformer without a snapshot is trivially
  // complete; one with a snapshot waits for its first run.
  const absl::Status valid = ValidateTransformerOptions(options_);
  SETPOINT_CHECK_MSG(valid.ok(), "{}", std::string(valid.message()));
  if (snapshot_ == nullptr) SetSelfSynced(true);
  sink_->DependOnDesired(this);
}

template <class K, class D>
template <class IK, class IV>
void Transformer<K, D>::Watch(Store<IK, IV>* store) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  store->BindRunner(runner_);
  store->Subscribe(
      [this, alive = std::weak_ptr<char>(alive_)](const Change<IK, IV>&) {
        if (alive.expired()) return;
        if (snapshot_ != nullptr)
          ScheduleSnapshot(options_.accumulation_window);
      });
  DependOn(store);
  if (InputsInSync() && !SelfSynced()) ScheduleSnapshot(absl::ZeroDuration());
}

template <class K, class D>
template <class IK, class IV>
void Transformer<K, D>::Watch(
    Store<IK, IV>* store,
    std::type_identity_t<
        absl::AnyInvocable<DesiredDiff<K, D>(const Change<IK, IV>&)>>
        hook) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  store->BindRunner(runner_);
  store->Subscribe(
      [this, alive = std::weak_ptr<char>(alive_),
       hook = std::move(hook)](const Change<IK, IV>& change) mutable {
        if (alive.expired()) return;
        absl::StatusOr<DesiredDiff<K, D>> diff =
            CallUserCode("transformer hook", [&] { return hook(change); });
        if (!diff.ok()) {
          ++stats_.hook_failures;
          SPDLOG_LOGGER_ERROR(logger_,
                              "transformer hook failed, change skipped "
                              "transformer={}: {}",
                              name(), diff.status());
          if (snapshot_ != nullptr)
            ScheduleSnapshot(options_.accumulation_window);
          return;
        }
        ++stats_.hook_diffs;
        ApplyDiff(*std::move(diff));
      });
  DependOn(store);
  if (InputsInSync() && !SelfSynced()) ScheduleSnapshot(absl::ZeroDuration());
}

template <class K, class D>
void Transformer<K, D>::OnInputsSyncChanged(bool inputs_in_sync) {
  if (snapshot_ == nullptr) return;
  if (!inputs_in_sync) {
    // Desired state built while an input is incomplete must not be trusted:
    // a fresh snapshot is needed once the inputs come back.
    SetSelfSynced(false);
    return;
  }
  ScheduleSnapshot(absl::ZeroDuration());
}

template <class K, class D>
void Transformer<K, D>::ScheduleSnapshot(absl::Duration delay) {
  if (snapshot_ == nullptr) return;
  if (scheduled_) {
    // The pending run covers this change too. Only a run that must happen
    // now (the inputs came back while a window or a backoff was pending)
    // replaces it; a timer the runner has already taken cannot be cancelled,
    // but then it runs next anyway.
    if (delay > absl::ZeroDuration() || !timer_.Cancel()) return;
    scheduled_ = false;
  }
  auto timer = runner_->PostAfter(
      delay,
      [this, alive = std::weak_ptr<char>(alive_)] {
        if (alive.expired()) return;
        scheduled_ = false;
        RunSnapshot();
      },
      "transformer snapshot");
  if (!timer.ok()) {
    SETPOINT_LOG_DEBUG(logger_, "transformer snapshot not scheduled {}: {}",
                       name(), timer.status());
    return;
  }
  timer_ = *timer;
  scheduled_ = true;
}

template <class K, class D>
void Transformer<K, D>::RunSnapshot() {
  if (!InputsInSync()) return;  // Runs again when they come back.
  absl::StatusOr<DesiredMap> desired =
      CallUserCode("transformer snapshot", [&] { return snapshot_(); });
  if (!desired.ok()) {
    ++stats_.snapshot_failures;
    absl::Duration retry =
        BackoffDelay({.initial = std::max(options_.accumulation_window,
                                          absl::Milliseconds(10)),
                      .max = absl::Minutes(1)},
                     failures_++, 0.0);
    SPDLOG_LOGGER_ERROR(logger_,
                        "transformer snapshot failed transformer={} "
                        "retry_in={}: {}",
                        name(), retry, desired.status());
    ScheduleSnapshot(retry);
    return;
  }
  failures_ = 0;
  ++stats_.snapshots;
  sink_->ReplaceDesired(*std::move(desired));
  SetSelfSynced(true);
}

template <class K, class D>
void Transformer<K, D>::ApplyDiff(DesiredDiff<K, D> diff) {
  for (auto& [key, value] : diff.set) {
    sink_->SetDesired(std::move(key), std::move(value));
  }
  for (const K& key : diff.remove) sink_->DeleteDesired(key);
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_TRANSFORMER_H_
