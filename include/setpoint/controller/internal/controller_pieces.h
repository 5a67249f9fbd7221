// Internal to setpoint::Controller: the pieces a ControllerBuilder
// declares (sources, transforms, syncers, plans), type-erased behind
// ControllerPiece, and ControllerRun, one Run's pieces and runner. Users
// include setpoint/controller/controller.h; nothing here is API.
//
// Thread safety: as each piece says; a ControllerRun is built on the Run
// thread and then used by the Controller under its update lock.
#ifndef SETPOINT_CONTROLLER_INTERNAL_CONTROLLER_PIECES_H_
#define SETPOINT_CONTROLLER_INTERNAL_CONTROLLER_PIECES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/base/json.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "setpoint/controller/controller_options.h"
#include "setpoint/controller/pod_sources.h"
#include "setpoint/controller/source_reader.h"
#include "setpoint/node/node.h"
#include "setpoint/node/shard.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/reconcile_loop.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/shared_source.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/source_health.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/processor/transformer.h"
#include "setpoint/processor/watch_source.h"

namespace setpoint::internal {

// One declared piece, type-erased for the controller.
class ControllerPiece {
 public:
  virtual ~ControllerPiece() = default;
  virtual absl::Status Start() { return absl::OkStatus(); }
  virtual void Stop() {}
  // Relay thread, first and without waiting: stop work `a` does not allow
  // (pause plans, cancel and refuse calls for keys outside a.range).
  virtual void Fence(const Assignment& /*a*/) {}
  // Runner thread: re-scope to `a`; `values` carries it for calls.
  virtual void Rescope(const Assignment& /*a*/, const Context& /*values*/) {}
  // Relay thread, after the re-scope: wait until nothing outside a.range
  // runs (for plans: until the paused execution ended).
  virtual absl::Status AwaitOutside(const Assignment& /*a*/,
                                    const Context& /*ctx*/) {
    return absl::OkStatus();
  }
  // Relay thread: the new assignment is in place.
  virtual void Resume(const Assignment& /*a*/) {}
  // Manual mode: runs what is due now; returns how much ran.
  virtual int RunUntilIdle(const Context& /*ctx*/) { return 0; }
  // Manual mode: when something is due next.
  virtual absl::Time NextWakeTime() const { return absl::InfiniteFuture(); }
  // Runner thread: appends a JSON object about the piece to `json` (or
  // nothing), and to `not_ready` why it is not ready; sets its gauges.
  virtual void Publish(std::string* /*json*/,
                       std::vector<std::string>* /*not_ready*/) {}
};

// What the pieces of the running Run last published (any thread).
struct ControllerBoard {
  mutable Mutex mu;
  bool running ABSL_GUARDED_BY(mu) = false;
  absl::Time beat ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  std::vector<std::string> not_ready ABSL_GUARDED_BY(mu);
  std::string pieces_json ABSL_GUARDED_BY(mu) = "[]";
};

// One Run's pieces and runner.
struct ControllerRun {
  ControllerRun(const NodeInfo& info, const ControllerOptions& options,
                ControllerBoard* board);

  // The assignment in force, for plan contexts (any thread).
  std::shared_ptr<const Assignment> Current() const;
  void SetCurrent(std::shared_ptr<const Assignment> a);

  // Runner thread: every piece publishes to `board`; then, unless manual or
  // stopped, the next one is due in options.status_interval.
  void Beat();
  // Cancels the next Beat (before the runner stops).
  void StopBeats();

  const NodeInfo info;
  const ControllerOptions options;
  // kind=, node= (and the metrics registry in options.metrics).
  const MetricLabels labels;
  ControllerBoard* const board;
  Runner runner;
  std::vector<std::unique_ptr<ControllerPiece>> pieces;  // Declared order.
  std::vector<std::function<void(const Assignment&)>> on_assignment;
  std::vector<std::shared_ptr<void>> owned;
  // Stores re-scoped to the range in the same event as the syncers.
  absl::flat_hash_set<const void*> scoped_stores;
  // The pod's shared sources and source threads (null executor in manual
  // mode), and the pod's id (the node id up to its first '/').
  std::shared_ptr<PodSources> pod;
  SourceExecutor* executor = nullptr;
  const std::string pod_id;
  // Errors of declarations (a shared source declared with other types):
  // the build fails with the first.
  std::vector<absl::Status> errors;
  // Store -> its source's SourceAccess<K, V>, for ControllerBuilder::Reader.
  absl::flat_hash_map<const void*, std::shared_ptr<void>> readers;

 private:
  mutable Mutex mu_;
  std::shared_ptr<const Assignment> current_ ABSL_GUARDED_BY(mu_);
  bool beats_stopped_ ABSL_GUARDED_BY(mu_) = false;
  TimerHandle beat_ ABSL_GUARDED_BY(mu_);
};

template <class K>
KeyFilter<K> FilterFor(const Assignment& a) {
  if (a.range.Empty()) return [](const K&) { return false; };
  // The whole ring (one node of the kind, a leader): no key to refuse.
  if (a.range.Covers(ShardRange{0, a.ring_size})) return nullptr;
  return [range = a.range, ring = a.ring_size](const K& key) {
    return range.Contains(ShardOf(key, ring));
  };
}

// The pod a node belongs to: its id up to the first '/'.
std::string PodOf(const std::string& node_id);

// Runner thread: a source piece's /statusz entry (its source's health and
// the node's store: `keys`, `store_in_sync`) and, when the store is not in
// sync, why (the source's own message, or that it lists for the new range).
void PublishSource(const SourceHealth& health, bool store_in_sync, size_t keys,
                   std::string* json, std::vector<std::string>* not_ready);

// The options every source piece takes from the run.
template <class Options>
Options SourceDefaults(ControllerRun* run, std::string name, Options o,
                       MetricLabels labels) {
  o.name = std::move(name);
  if (o.clock == nullptr) o.clock = run->options.clock;
  if (o.logger == nullptr) o.logger = run->options.logger;
  if (o.metrics == nullptr) o.metrics = run->options.metrics;
  o.metric_labels = WithLabels(labels, std::move(o.metric_labels));
  if (o.executor == nullptr) o.executor = run->executor;
  o.manual = run->options.manual;
  return o;
}

// A store fed by a PollingSource or a WatchSource of the node's own.
template <class K, class V, class S>
class SourcePiece final : public ControllerPiece {
 public:
  // `scoped`: the store holds only the keys of the node's range (and none
  // before the first assignment); otherwise every key. `make` builds the
  // source on the run's runner and `store()`.
  template <class Make>
  SourcePiece(ControllerRun* run, const std::string& name,
              std::function<bool(const V&, const V&)> equal, bool scoped,
              Make make)
      : scoped_(scoped),
        store_({.name = name,
                .equal = std::move(equal),
                .logger = run->options.logger}),
        source_(make(&run->runner, &store_)),
        access_(std::make_shared<SourceAccess<K, V>>(
            [this](const Context& ctx) { return source_->AwaitFresh(ctx); },
            [this] { return source_->Snapshot(); })) {
    // Nothing is ours before the first assignment.
    if (scoped_) source_->Rescope([](const K&) { return false; });
    run->readers[&store_] = access_;
  }
  ~SourcePiece() override { access_->Close(); }
  Store<K, V>* store() { return &store_; }

  absl::Status Start() override { return source_->Start(); }
  void Stop() override {
    source_->Stop();  // Readers waiting for a list return.
    access_->Close();
  }
  void Rescope(const Assignment& a, const Context&) override {
    if (scoped_) source_->Rescope(FilterFor<K>(a));
  }
  int RunUntilIdle(const Context&) override {
    return source_->RunUntilIdle() ? 1 : 0;
  }
  absl::Time NextWakeTime() const override { return source_->NextWakeTime(); }
  void Publish(std::string* json,
               std::vector<std::string>* not_ready) override {
    PublishSource(source_->health(), store_.InSync(), store_.size(), json,
                  not_ready);
  }

 private:
  const bool scoped_;
  Store<K, V> store_;
  std::unique_ptr<S> source_;
  std::shared_ptr<SourceAccess<K, V>> access_;
};

// A node's store fed by a source shared with the pod's other nodes of the
// kind: the node's part of its cache.
template <class K, class V>
class SharedPiece final : public ControllerPiece {
 public:
  SharedPiece(ControllerRun* run, const std::string& name,
              std::shared_ptr<SharedHold<K, V>> hold,
              std::function<bool(const V&, const V&)> equal)
      : hold_(std::move(hold)),
        store_({.name = name,
                .equal = std::move(equal),
                .logger = run->options.logger}),
        access_(std::make_shared<SourceAccess<K, V>>(
            [this](const Context& ctx) {
              return hold_->source()->AwaitFresh(ctx);
            },
            [this] { return hold_->source()->Snapshot(); })) {
    // Nothing is ours before the first assignment: scoped before it
    // subscribes, so the cache posts it nothing to drop.
    store_.Rescope([](const K&) { return false; });
    subscription_ = hold_->source()->Subscribe(&run->runner, &store_);
    run->readers[&store_] = access_;
  }
  ~SharedPiece() override {
    access_->Close();
    subscription_.reset();
  }
  Store<K, V>* store() { return &store_; }

  // The first node to start starts the source; it stops with the last.
  absl::Status Start() override { return hold_->StartOnce(); }
  void Stop() override {
    access_->Close();
    subscription_.reset();  // Nothing more is posted to this runner.
  }
  void Rescope(const Assignment& a, const Context&) override {
    if (subscription_ != nullptr) subscription_->Rescope(FilterFor<K>(a));
  }
  // Manual mode: every node drives the one source (on one thread).
  int RunUntilIdle(const Context&) override {
    return hold_->source()->RunUntilIdle() ? 1 : 0;
  }
  absl::Time NextWakeTime() const override {
    return hold_->source()->manual() ? hold_->source()->NextWakeTime()
                                     : absl::InfiniteFuture();
  }
  void Publish(std::string* json,
               std::vector<std::string>* not_ready) override {
    PublishSource(hold_->source()->health(), store_.InSync(), store_.size(),
                  json, not_ready);
  }

 private:
  std::shared_ptr<SharedHold<K, V>> hold_;
  Store<K, V> store_;
  std::unique_ptr<typename SharedSource<K, V>::Subscription> subscription_;
  std::shared_ptr<SourceAccess<K, V>> access_;
};

// A store fed by a Transformer: ReplaceDesired replaces its content.
template <class K, class D>
class StoreSink final : public DesiredSink<K, D> {
 public:
  explicit StoreSink(Store<K, D>* store) : store_(store) {}
  void ReplaceDesired(absl::flat_hash_map<K, D> desired) override {
    StoreUpdate<K, D> u{.generation = store_->generation(),
                        .replace = true,
                        .sync = StoreUpdate<K, D>::Sync::kSynced};
    u.sets.reserve(desired.size());
    for (auto& kv : desired)
      u.sets.emplace_back(kv.first, std::move(kv.second));
    store_->Apply(std::move(u));
  }
  void SetDesired(K key, D desired) override {
    store_->Set(std::move(key), std::move(desired));
  }
  void DeleteDesired(const K& key) override { store_->Delete(key); }
  void DependOnDesired(Synchronizable* producer) override {
    store_->DependOn(producer);
  }

 private:
  Store<K, D>* store_;
};

template <class K, class D>
class TransformPiece final : public ControllerPiece {
 public:
  using SnapshotFn = typename Transformer<K, D>::SnapshotFn;
  TransformPiece(ControllerRun* run, std::string name, SnapshotFn snapshot,
                 TransformerOptions options)
      : store_({.name = name, .logger = run->options.logger}),
        sink_(&store_),
        transformer_(&run->runner, &sink_, std::move(snapshot),
                     Adjust(run, std::move(name), std::move(options))) {
    store_.Rescope([](const K&) { return false; });
  }
  Store<K, D>* store() { return &store_; }
  Transformer<K, D>* transformer() { return &transformer_; }

  void Rescope(const Assignment& a, const Context&) override {
    // The store forgets what left and is out of sync until the next
    // snapshot, which is asked for now.
    store_.Rescope(FilterFor<K>(a));
    transformer_.Invalidate();
  }

 private:
  static TransformerOptions Adjust(ControllerRun* run, std::string name,
                                   TransformerOptions o) {
    o.name = std::move(name);
    if (o.logger == nullptr) o.logger = run->options.logger;
    return o;
  }

  Store<K, D> store_;
  StoreSink<K, D> sink_;
  Transformer<K, D> transformer_;
};

// Failing keys listed per syncer in the status JSON.
inline constexpr size_t kStatusFailures = 5;

template <class K>
void AppendSyncerStatusJson(std::string* out, const std::string& name,
                            const SyncerStatus<K>& s, const SyncerStats& c) {
  if (!out->empty()) out->push_back(',');
  out->append("{\"syncer\":");
  AppendJsonString(out, name);
  absl::StrAppend(out, ",\"in_sync\":", s.in_sync ? "true" : "false",
                  ",\"keys\":", s.keys, ",\"converged\":", s.converged,
                  ",\"pending\":", s.pending, ",\"in_flight\":", s.in_flight,
                  ",\"awaiting_observation\":", s.awaiting_observation,
                  ",\"backing_off\":", s.backing_off,
                  ",\"terminal\":", s.terminal, ",\"stale\":", s.stale,
                  ",\"paused\":", s.paused ? "true" : "false");
  if (s.paused) {
    out->append(",\"paused_since\":");
    AppendJsonString(out, absl::FormatTime(absl::RFC3339_full, s.paused_since,
                                           absl::UTCTimeZone()));
    out->append(",\"pause_error\":");
    AppendJsonString(out, s.pause_error.ToString());
  }
  absl::StrAppendFormat(out, ",\"longest_pending_seconds\":%.3f",
                        absl::ToDoubleSeconds(s.longest_pending));
  absl::StrAppend(out, ",\"creates\":", c.creates, ",\"updates\":", c.updates,
                  ",\"deletes\":", c.deletes, ",\"failures\":", c.failures,
                  ",\"stale_refusals\":", c.stale_refusals,
                  ",\"failing_keys\":[");
  for (size_t i = 0; i < s.failures.size(); ++i) {
    const SyncerKeyFailure<K>& f = s.failures[i];
    if (i > 0) out->push_back(',');
    out->append("{\"key\":");
    AppendJsonString(out, KeyForLog(f.key));
    out->append(",\"error\":");
    AppendJsonString(out, f.last_error.ToString());
    absl::StrAppend(out, ",\"failures\":", f.failures,
                    ",\"terminal\":", f.terminal ? "true" : "false",
                    ",\"next_attempt\":");
    if (f.next_attempt == absl::InfiniteFuture()) {
      out->append("null");
    } else {
      AppendJsonString(out, absl::FormatTime(absl::RFC3339_full, f.next_attempt,
                                             absl::UTCTimeZone()));
    }
    out->push_back('}');
  }
  out->append("]}");
}

template <class K, class D, class O>
class SyncPiece final : public ControllerPiece {
 public:
  // `Client`: a SyncerClient<K, D, O> or a BatchSyncerClient<K, D, O>.
  template <class Client>
  SyncPiece(ControllerRun* run, std::string name, Client* client,
            SyncerOptions<D, O> options)
      : syncer_(&run->runner, client,
                Adjust(run, std::move(name), std::move(options))) {
    syncer_.Rescope([](const K&) { return false; });
  }
  Syncer<K, D, O>* syncer() { return &syncer_; }

  absl::Status Start() override { return syncer_.Start(); }
  void Stop() override { syncer_.Stop(); }
  void Fence(const Assignment& a) override { syncer_.Fence(FilterFor<K>(a)); }
  void Rescope(const Assignment& a, const Context& values) override {
    syncer_.Rescope(FilterFor<K>(a));
    syncer_.SetCallValues(values);
  }
  absl::Status AwaitOutside(const Assignment& a, const Context& ctx) override {
    return syncer_.AwaitCallsWithin(FilterFor<K>(a), ctx);
  }
  int RunUntilIdle(const Context&) override { return syncer_.RunUntilIdle(); }
  void Publish(std::string* json,
               std::vector<std::string>* not_ready) override {
    syncer_.PublishStatusMetrics();
    SyncerStatus<K> s = syncer_.StatusSnapshot(kStatusFailures);
    if (!s.in_sync) {
      not_ready->push_back(absl::StrCat("syncer ", syncer_.name(),
                                        " not in sync (its inputs are not "
                                        "complete: nothing acts)"));
    }
    if (s.paused) {
      not_ready->push_back(absl::StrCat(
          "syncer ", syncer_.name(),
          " paused: the world is unreachable (one probe at a time): ",
          s.pause_error.message()));
    }
    AppendSyncerStatusJson(json, syncer_.name(), s, syncer_.stats());
  }

 private:
  static SyncerOptions<D, O> Adjust(ControllerRun* run, std::string name,
                                    SyncerOptions<D, O> o) {
    o.name = std::move(name);
    if (o.metrics == nullptr) o.metrics = run->options.metrics;
    o.metric_labels = WithLabels(run->labels, std::move(o.metric_labels));
    if (o.clock == nullptr) o.clock = run->options.clock;
    if (o.logger == nullptr) o.logger = run->options.logger;
    if (o.pool == nullptr) o.pool = run->options.updaters;
    o.manual_updates = run->options.manual;
    return o;
  }

  Syncer<K, D, O> syncer_;
};

class PlanPiece final : public ControllerPiece {
 public:
  PlanPiece(ControllerRun* run, std::unique_ptr<Plan> plan,
            ReconcileLoopOptions options);
  ReconcileLoop* loop() { return &loop_; }

  absl::Status Start() override;
  void Stop() override { loop_.Stop(); }
  void Fence(const Assignment&) override {
    // Pauses and cancels the running execution; waits for nothing.
    (void)loop_.Pause(Context().WithDeadline(absl::InfinitePast()));
  }
  absl::Status AwaitOutside(const Assignment&, const Context& ctx) override {
    return loop_.Pause(ctx);
  }
  void Resume(const Assignment& a) override {
    if (!a.range.Empty()) loop_.Resume();
  }
  int RunUntilIdle(const Context& ctx) override {
    return loop_.RunUntilIdle(ctx) ? 1 : 0;
  }
  absl::Time NextWakeTime() const override { return loop_.NextWakeTime(); }
  void Publish(std::string* json, std::vector<std::string>*) override;

 private:
  static ReconcileLoopOptions Adjust(ControllerRun* run,
                                     ReconcileLoopOptions o);

  const bool manual_;
  std::unique_ptr<Plan> plan_;
  ReconcileLoop loop_;
};

}  // namespace setpoint::internal

#endif  // SETPOINT_CONTROLLER_INTERNAL_CONTROLLER_PIECES_H_
