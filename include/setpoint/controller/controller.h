// Controller: a Node built from declared pieces — sources that poll the
// world and the user's data into stores, syncers that drive the world
// towards the desired state through the user's clients, and plans run
// again and again — so a sharded controller is a build function, not a
// Node subclass.
//
//   setpoint::ControllerKind records{
//       .kind = "records",
//       .count = 4,
//       .build = [&](setpoint::ControllerBuilder& b) {
//         auto* seen = b.Poll<std::string, Record>(
//             "seen", [&](const setpoint::Context& ctx) { return api.List(ctx);
//             });
//         auto* want = b.Poll<std::string, Record>(
//             "want", [&](const setpoint::Context&) { return catalog.Records();
//             });
//         b.Sync<std::string, Record, Record>("records", &client, seen, want);
//         return absl::OkStatus();
//       }};
//   manager_options.kinds.push_back(records.ToNodeKind());
//
// Pieces: Poll (a store listed by a function: observed state, or desired
// state from your own data), PollAll (every key, as input of a Transform
// whose keys differ), Transform (desired state worked out from stores),
// Sync (a Syncer and its client), Reconcile (a plan run again and again).
//
// What the controller guarantees (docs/controller.md):
// - Fresh pieces for every Run: the build function runs again, so a node
//   whose Run failed comes back whole.
// - Pieces start in the order they were declared (a syncer after the stores
//   it reads) and stop in reverse, the runner last.
// - Nothing acts before the first assignment or with an empty range: the
//   stores hold no key, so no client call starts, and plans are paused.
// - UpdateShardRange(a) first, without waiting for anything, pauses every
//   plan (its running execution is cancelled) and cancels the calls for
//   keys outside a.range (those handed over never start); then re-scopes
//   every store and syncer to a.range in one runner event; then waits until
//   none of those calls and no paused execution still runs, and resumes the
//   plans when a.range is not empty. If anything is still running after
//   handoff_timeout (or the context's deadline: the manager passes the
//   lease's end) it returns kDeadlineExceeded, so the manager keeps the
//   shards recorded as this node's and asks again.
// - Every client call and plan step reads the assignment it was started
//   under with AssignmentOf(ctx) (node id, range, fencing token), to send
//   to the system it writes to. A write refused as stale (StaleOwnerError)
//   is counted and not retried under that assignment.
// - Leader-only work: declare it in a LeaderKind, a one-shard kind whose
//   single shard one node of the whole fleet owns at a time.
//
// Thread safety: the build function runs on the node's Run thread; store
// listeners, OnAssignment hooks and syncer state on the node's runner; list
// functions on their sources' threads; clients on updater threads; plans on
// their loops' threads. Run and UpdateShardRange follow Node's rules.
#ifndef SETPOINT_CONTROLLER_CONTROLLER_H_
#define SETPOINT_CONTROLLER_CONTROLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/json.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "setpoint/node/node.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/node/shard.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/reconcile_loop.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/processor/transformer.h"
#include "spdlog/logger.h"

namespace setpoint {

// The assignment `ctx` was started under, or nullptr outside a controller.
inline const Assignment* AssignmentOf(const Context& ctx) {
  return ctx.Value<Assignment>();
}

// A key's shard is ShardOf(key, ring_size) (node/shard.h); for keys that
// are not strings, overload ShardOf(const MyKey&, uint32_t ring_size) in
// your key's namespace.

struct ControllerOptions {
  // How long UpdateShardRange waits for calls and plan steps outside the
  // new range to return after their cancellation, before it reports
  // failure (the manager then keeps the shards and asks again).
  // Default: 2 s.
  absl::Duration handoff_timeout = absl::Seconds(2);
  // Time for the runner, sources, syncers and loops.
  // Default: Clock::Real().
  Clock* clock = nullptr;
  // No threads: the runner, sources, syncers and loops run only when
  // RunUntilIdle() is called, on the caller's thread (deterministic tests;
  // setpoint::testing::ControllerHarness drives it).
  // Default: false.
  bool manual = false;
  // How often the pieces' status is published for the pod's /statusz,
  // /readyz and keys-by-state gauges (one runner event, O(keys)); a runner
  // that has not run it for the probe's stuck_after is reported stuck. In
  // manual mode it is published at the end of every RunUntilIdle instead.
  // Default: 1 s.
  absl::Duration status_interval = absl::Seconds(1);
  // Where the runner, syncers and plans publish their series, labelled
  // kind=<kind> and node=<node id>.
  // Default: NodeInfo::metrics (the pod's), else none.
  MetricsRegistry* metrics = nullptr;
  // The updater threads the syncers' calls run on (SyncerOptions::pool,
  // unless a Sync sets its own). Must outlive the controller.
  // Default: NodeInfo::updaters (the pod's pool), else each syncer owns its
  // threads.
  UpdaterPool* updaters = nullptr;
  // Every line is written through a clone of it named after the node id, so
  // each names its node; the pieces name themselves (runner=, syncer=,
  // plan=, source=).
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

class ControllerBuilder;
using ControllerBuildFn = std::function<absl::Status(ControllerBuilder&)>;

namespace internal {

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

template <class K, class V>
class PollPiece final : public ControllerPiece {
 public:
  using ListFn = typename PollingSource<K, V>::ListFn;
  // `scoped`: the store holds only the keys of the node's range (and none
  // before the first assignment); otherwise every key.
  PollPiece(ControllerRun* run, std::string name, ListFn list,
            PollingSourceOptions<V> options, bool scoped)
      : scoped_(scoped),
        store_({.name = name,
                .equal = options.equal,
                .logger = run->options.logger}),
        name_(name),
        source_(&run->runner, &store_, std::move(list),
                Adjust(run, std::move(name), std::move(options))) {
    // Nothing is ours before the first assignment.
    if (scoped_) source_.Rescope([](const K&) { return false; });
  }
  Store<K, V>* store() { return &store_; }
  PollingSource<K, V>* source() { return &source_; }

  absl::Status Start() override { return source_.Start(); }
  void Stop() override { source_.Stop(); }
  void Rescope(const Assignment& a, const Context&) override {
    if (scoped_) source_.Rescope(FilterFor<K>(a));
  }
  int RunUntilIdle(const Context&) override {
    return source_.RunUntilIdle() ? 1 : 0;
  }
  absl::Time NextWakeTime() const override { return source_.NextWakeTime(); }
  void Publish(std::string*, std::vector<std::string>* not_ready) override {
    if (!store_.InSync()) {
      not_ready->push_back(
          absl::StrCat("source ", name_, " has not listed yet (not in sync)"));
    }
  }

 private:
  static PollingSourceOptions<V> Adjust(ControllerRun* run, std::string name,
                                        PollingSourceOptions<V> o) {
    o.name = run->info.id + "/" + name;
    if (o.clock == nullptr) o.clock = run->options.clock;
    if (o.logger == nullptr) o.logger = run->options.logger;
    o.manual = run->options.manual;
    return o;
  }

  const bool scoped_;
  Store<K, V> store_;
  const std::string name_;
  PollingSource<K, V> source_;
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
                  ",\"failing\":", s.failing, ",\"terminal\":", s.terminal,
                  ",\"stale\":", s.stale);
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
  SyncPiece(ControllerRun* run, std::string name, SyncerClient<K, D, O>* client,
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

}  // namespace internal

// Declares a controller's pieces; given to the build function once per
// Run. Pieces it returns pointers to live until that Run ends.
//
// Thread safety: the build function's thread only, during the call.
class ControllerBuilder {
 public:
  // A store of `name` filled by `list` every options.interval (a
  // PollingSource): observed state, or desired state from your own data.
  // Holds only the keys of the node's range. `list` runs on the source's
  // own thread: IO is fine there.
  template <class K, class V, class ListFn>
  Store<K, V>* Poll(std::string name, ListFn list,
                    PollingSourceOptions<V> options = {}) {
    return AddPoll<K, V>(std::move(name), std::move(list), std::move(options),
                         /*scoped=*/true);
  }
  // A store of every key `list` returns, whatever the node's range: input
  // for a Transform whose output keys are not the input's (a replica set
  // "web" becomes web-0, web-1, ... which fall in other shards). Reads
  // only; nothing acts on it directly.
  template <class K, class V, class ListFn>
  Store<K, V>* PollAll(std::string name, ListFn list,
                       PollingSourceOptions<V> options = {}) {
    return AddPoll<K, V>(std::move(name), std::move(list), std::move(options),
                         /*scoped=*/false);
  }

  // Desired state worked out on the runner by `snapshot` from stores of
  // this build (`inputs`): it runs once they are all in sync, and again an
  // accumulation window after any of them changes, and its result
  // replaces the returned store's content within the node's range. Pass
  // that store to Sync as its desired state.
  template <class K, class D, class SnapshotFn, class... Inputs>
  Store<K, D>* Transform(std::string name, SnapshotFn snapshot,
                         Inputs*... inputs) {
    auto piece = std::make_unique<internal::TransformPiece<K, D>>(
        run_, std::move(name),
        typename internal::TransformPiece<K, D>::SnapshotFn(
            std::move(snapshot)),
        TransformerOptions{});
    (piece->transformer()->Watch(inputs), ...);
    Store<K, D>* store = piece->store();
    run_->scoped_stores.insert(store);
    run_->pieces.push_back(std::move(piece));
    return store;
  }

  // A syncer that makes `observed` match `desired` (both stores of this
  // build) through `client`, which must outlive the controller. Its calls
  // run on updater threads and read AssignmentOf(ctx).
  template <class K, class D, class O>
  Syncer<K, D, O>* Sync(std::string name, SyncerClient<K, D, O>* client,
                        Store<K, O>* observed, Store<K, D>* desired,
                        SyncerOptions<D, O> options = {}) {
    // Keys from stores scoped with the syncer need no second check.
    options.trust_store_filters = run_->scoped_stores.contains(observed) &&
                                  run_->scoped_stores.contains(desired);
    auto piece = std::make_unique<internal::SyncPiece<K, D, O>>(
        run_, std::move(name), client, std::move(options));
    Syncer<K, D, O>* syncer = piece->syncer();
    syncer->ObserveFrom(observed);
    syncer->DesireFrom(desired);
    run_->pieces.push_back(std::move(piece));
    return syncer;
  }

  // Runs `plan` again and again (a ReconcileLoop on its own thread) while
  // the node owns shards; around every change of assignment its execution
  // is cancelled and waited for. Its Create and Do read AssignmentOf(ctx).
  // The loop's clock and logger are the controller's.
  ReconcileLoop* Reconcile(std::unique_ptr<Plan> plan,
                           ReconcileLoopOptions options = {});

  // Runs `hook` on the runner after each re-scope, for pieces wired by
  // hand (a Transformer, a PushSource's re-list). The handoff does not
  // cancel or wait for the calls of a Syncer wired by hand: declare
  // syncers with Sync.
  void OnAssignment(std::function<void(const Assignment&)> hook) {
    run_->on_assignment.push_back(std::move(hook));
  }
  // Keeps `object` alive until this Run ends (destroyed after the pieces).
  template <class T>
  T* Own(std::unique_ptr<T> object) {
    T* raw = object.get();
    run_->owned.push_back(std::shared_ptr<void>(std::move(object)));
    return raw;
  }

  Runner* runner() { return &run_->runner; }
  Clock* clock() const { return run_->options.clock; }
  const NodeInfo& node() const { return run_->info; }
  const std::shared_ptr<spdlog::logger>& logger() const {
    return run_->options.logger;
  }

 private:
  friend class Controller;
  explicit ControllerBuilder(internal::ControllerRun* run) : run_(run) {}
  template <class K, class V, class ListFn>
  Store<K, V>* AddPoll(std::string name, ListFn list,
                       PollingSourceOptions<V> options, bool scoped) {
    auto piece = std::make_unique<internal::PollPiece<K, V>>(
        run_, std::move(name),
        typename internal::PollPiece<K, V>::ListFn(std::move(list)),
        std::move(options), scoped);
    Store<K, V>* store = piece->store();
    if (scoped) run_->scoped_stores.insert(store);
    run_->pieces.push_back(std::move(piece));
    return store;
  }
  internal::ControllerRun* run_;
};

// Counters for operators and tests.
struct ControllerStats {
  int64_t runs = 0;              // Run calls that built their pieces.
  int64_t build_failures = 0;    // ...that failed to build or start.
  int64_t handoffs = 0;          // UpdateShardRange calls that returned OK.
  int64_t handoff_failures = 0;  // ...that reported work still running.
};

class Controller : public Node {
 public:
  Controller(NodeInfo info, ControllerBuildFn build,
             ControllerOptions options = {});
  ~Controller() override;

  // Node: builds fresh pieces, starts them and waits for `ctx`; then stops
  // them in reverse. A build or start error is returned (the manager
  // restarts the node after a backoff).
  absl::Status Run(const Context& ctx) override;
  // Node: see the file comment.
  absl::Status UpdateShardRange(const Context& ctx,
                                const Assignment& assignment) override;

  // The assignment last given to UpdateShardRange, even if that handoff
  // reported work still running (any thread).
  Assignment assignment() const;
  // Any thread.
  ControllerStats stats() const;
  const NodeInfo& info() const { return info_; }
  // Node: what the pieces last published (options.status_interval): stuck
  // when the runner has not run that event for `stuck_after`; not ready
  // while not running, or a source or syncer is not in sync; the status
  // JSON names the assignment and each piece (syncer counts and first
  // failing keys, each plan's last execution report).
  void Report(absl::Duration stuck_after, NodeReport& report) const override;

  // Manual mode (options.manual), for tests on one thread: Start builds
  // and starts the pieces without threads; RunUntilIdle runs runner
  // events, due timers, due lists, queued calls and due plan executions
  // until nothing more can run before the clock's now, and returns how
  // many ran; NextWakeTime says when something is due next; Stop stops and
  // destroys the pieces. The runner of the running pieces, or nullptr.
  absl::Status Start();
  int64_t RunUntilIdle();
  absl::Time NextWakeTime() const;
  void Stop();
  Runner* runner();

 private:
  absl::StatusOr<std::unique_ptr<internal::ControllerRun>> Build();
  // Builds and starts a run into run_, counting it.
  absl::Status BuildAndStart() ABSL_EXCLUSIVE_LOCKS_REQUIRED(update_mu_);
  // Starts the pieces of `run` under the assignment in force.
  absl::Status StartRun(internal::ControllerRun& run);
  static void StopRun(internal::ControllerRun& run);
  std::shared_ptr<const Assignment> MakeAssignment(const Assignment& a) const;

  const NodeInfo info_;
  const ControllerBuildFn build_;
  ControllerOptions options_;

  // Held by UpdateShardRange and while a Run starts or stops, so a
  // re-scope never meets half-built pieces.
  mutable Mutex update_mu_;
  std::unique_ptr<internal::ControllerRun> run_ ABSL_GUARDED_BY(update_mu_);

  mutable Mutex mu_;
  std::shared_ptr<const Assignment> assignment_ ABSL_GUARDED_BY(mu_);
  ControllerStats stats_ ABSL_GUARDED_BY(mu_);
  // Written by the running Run's Beat (its own lock).
  internal::ControllerBoard board_;
};

// A kind of controller nodes, for a NodeManager or PodMain.
struct ControllerKind {
  std::string kind = "";
  // Nodes of this kind in each pod.
  // Default: 1.
  int count = 1;
  // Default: 4096.
  uint32_t ring_size = kDefaultRingSize;
  ControllerBuildFn build = nullptr;
  ControllerOptions options = {};

  // The kind with a factory that makes a Controller per node.
  NodeKindOptions ToNodeKind() const;
};

// A kind whose work runs on one node of the whole fleet at a time: one
// node per pod, a ring of one shard. Its plans and syncers act only on the
// node that owns that shard; when it moves, the old leader's work is
// cancelled and has ended before the new leader starts.
ControllerKind LeaderKind(std::string kind, ControllerBuildFn build,
                          ControllerOptions options = {});

}  // namespace setpoint

#endif  // SETPOINT_CONTROLLER_CONTROLLER_H_
