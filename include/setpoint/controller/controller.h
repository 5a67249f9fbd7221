// Controller: a Node built from declared pieces — sources that list or
// watch the world and the user's data into stores, syncers that drive the
// world towards the desired state through the user's clients, and plans run
// again and again — so a sharded controller is a build function, not a
// Node subclass.
//
//   setpoint::ControllerKind records{
//       .kind = "records",
//       .count = 4,
//       .build = [&](setpoint::ControllerBuilder& b) {
//         auto* seen = b.SharedPoll<std::string, Record>(
//             "seen", [&](const setpoint::Context& ctx) {
//               return api.List(ctx);  // once per pod, not once per node
//             });
//         auto* want = b.Poll<std::string, Record>(
//             "want", [&](const setpoint::Context&) {
//               return catalog.Records();
//             });
//         b.Sync<std::string, Record, Record>("records", &client, seen, want);
//         return absl::OkStatus();
//       }};
//   manager_options.kinds.push_back(records.ToNodeKind());
//
// Pieces: Poll (a store listed by a function: observed state, or desired
// state from your own data), Watch (a store fed by a list and a stream of
// changes), SharedPoll and SharedWatch (the same, once per pod for all the
// kind's nodes), PollAll (every key, as input of a Transform whose keys
// differ), Transform (desired state worked out from stores), Sync (a Syncer
// and its client), Reconcile (a plan run again and again), Reader (a plan's
// view of a source, and a wait for fresh state).
//
// What the controller guarantees (docs/controller.md):
// - Fresh pieces for every Run (or Launch): the build function runs again,
//   so a node whose Run failed comes back whole.
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
// The pieces' internals are in controller/internal/controller_pieces.h.
//
// Thread safety: the build function runs on the thread that calls Run or
// Launch (in a pod, the manager's: a controller needs no thread of its own);
// store listeners, OnAssignment hooks and syncer state on the node's runner;
// list and watch functions on the pod's source threads (PodSources); clients on
// updater threads; plans on their loops' threads. Run, Launch, Halt and
// UpdateShardRange follow Node's rules.
#ifndef SETPOINT_CONTROLLER_CONTROLLER_H_
#define SETPOINT_CONTROLLER_CONTROLLER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/controller/controller_options.h"
#include "setpoint/controller/internal/controller_pieces.h"
#include "setpoint/controller/pod_sources.h"
#include "setpoint/controller/source_reader.h"
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
#include "setpoint/processor/watch.h"
#include "setpoint/processor/watch_source.h"
#include "spdlog/logger.h"

namespace setpoint {

// The assignment `ctx` was started under, or nullptr outside a controller.
inline const Assignment* AssignmentOf(const Context& ctx) {
  return ctx.Value<Assignment>();
}

// A key's shard is ShardOf(key, ring_size) (node/shard.h); for keys that
// are not strings, overload ShardOf(const MyKey&, uint32_t ring_size) in
// your key's namespace.

class ControllerBuilder;
using ControllerBuildFn = std::function<absl::Status(ControllerBuilder&)>;

// Declares a controller's pieces; given to the build function once per
// Run. Pieces it returns pointers to live until that Run ends.
//
// Thread safety: the build function's thread only, during the call.
class ControllerBuilder {
 public:
  // A store of `name` filled by `list` every options.interval (a
  // PollingSource): observed state, or desired state from your own data.
  // Holds only the keys of the node's range; a range change lists again.
  // `list` runs on the pod's source threads: IO is fine there. A failed
  // list is retried after options.backoff (100 ms doubling to 30 s by
  // default) instead of the interval; after options.lose_sync_after (3)
  // in a row the store loses sync and nothing acts on it.
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
  // A store fed by `list` (every item and a resume token: WatchList) and
  // then by the stream `watch` opens from that token (watch.h): a
  // WatchSource. The source resumes from the last token after a
  // disconnect, lists again when the stream says the token expired
  // (kOutOfRange) and deletes what is gone, takes a stream with no event
  // nor bookmark for options.idle_timeout (290 s) for dead, and backs off
  // 800 ms doubling to 30 s (starting over after 2 minutes without a
  // failure). Holds only the keys of the node's range; a range change
  // lists again. Both functions run on the pod's source threads; an open
  // stream holds one while it waits.
  template <class K, class V, class ListFn, class WatchFnT>
  Store<K, V>* Watch(std::string name, ListFn list, WatchFnT watch,
                     WatchSourceOptions<V> options = {}) {
    using Piece = internal::SourcePiece<K, V, WatchSource<K, V>>;
    auto equal = options.equal;
    const std::string store_name = name;
    auto piece = std::make_unique<Piece>(
        run_, store_name, std::move(equal), /*scoped=*/true,
        [&](Runner* runner, Store<K, V>* store) {
          return std::make_unique<WatchSource<K, V>>(
              runner, store, WatchListFn<K, V>(std::move(list)),
              WatchFn<K, V>(std::move(watch)),
              internal::SourceDefaults(run_, std::move(name),
                                       std::move(options), run_->labels));
        });
    return Add<K, V>(std::move(piece), /*scoped=*/true);
  }
  // Poll, shared by the kind's nodes in this pod (PodSources): one list
  // per interval for the pod, each node's store holding its range of it.
  // The first node to declare `name` makes it (its `list` and options);
  // the others attach. A key entering a node's range is delivered from
  // the shared cache at once, with no list (docs/controller.md says why
  // that is safe).
  template <class K, class V, class ListFn>
  Store<K, V>* SharedPoll(std::string name, ListFn list,
                          PollingSourceOptions<V> options = {}) {
    auto equal = options.equal;
    auto hold = Acquire<K, V>(name, [&] {
      return SharedSource<K, V>::Poll(
          typename SharedSource<K, V>::ListFn(std::move(list)),
          SharedDefaults(name, std::move(options)));
    });
    return AddShared<K, V>(std::move(name), std::move(hold), std::move(equal));
  }
  // Watch, shared by the kind's nodes in this pod: one stream per pod.
  template <class K, class V, class ListFn, class WatchFnT>
  Store<K, V>* SharedWatch(std::string name, ListFn list, WatchFnT watch,
                           WatchSourceOptions<V> options = {}) {
    auto equal = options.equal;
    auto hold = Acquire<K, V>(name, [&] {
      return SharedSource<K, V>::Watch(
          WatchListFn<K, V>(std::move(list)), WatchFn<K, V>(std::move(watch)),
          SharedDefaults(name, std::move(options)));
    });
    return AddShared<K, V>(std::move(name), std::move(hold), std::move(equal));
  }
  // A view of the source that feeds `store` (made by Poll, PollAll, Watch,
  // SharedPoll or SharedWatch in this build) for plans and other threads:
  // Snapshot() and AwaitFresh(ctx) (source_reader.h). Another store gives
  // a reader whose calls fail with kFailedPrecondition.
  template <class K, class V>
  SourceReader<K, V> Reader(Store<K, V>* store) {
    auto it = run_->readers.find(store);
    if (it == run_->readers.end()) return SourceReader<K, V>();
    return SourceReader<K, V>(
        std::static_pointer_cast<internal::SourceAccess<K, V>>(it->second));
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
    return AddSync(std::move(name), client, observed, desired,
                   std::move(options));
  }
  // The same with a client that takes batches: up to options.max_batch
  // operations of different keys per call, options.max_batches_in_flight
  // calls at once (docs/syncer.md, "Batch clients"). Every per-key promise
  // holds for each operation of a batch.
  template <class K, class D, class O>
  Syncer<K, D, O>* Sync(std::string name, BatchSyncerClient<K, D, O>* client,
                        Store<K, O>* observed, Store<K, D>* desired,
                        SyncerOptions<D, O> options = {}) {
    return AddSync(std::move(name), client, observed, desired,
                   std::move(options));
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
  template <class K, class D, class O, class Client>
  Syncer<K, D, O>* AddSync(std::string name, Client* client,
                           Store<K, O>* observed, Store<K, D>* desired,
                           SyncerOptions<D, O> options) {
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

  friend class Controller;
  explicit ControllerBuilder(internal::ControllerRun* run) : run_(run) {}
  template <class K, class V, class ListFn>
  Store<K, V>* AddPoll(std::string name, ListFn list,
                       PollingSourceOptions<V> options, bool scoped) {
    using Piece = internal::SourcePiece<K, V, PollingSource<K, V>>;
    auto equal = options.equal;
    const std::string store_name = name;
    auto piece = std::make_unique<Piece>(
        run_, store_name, std::move(equal), scoped,
        [&](Runner* runner, Store<K, V>* store) {
          return std::make_unique<PollingSource<K, V>>(
              runner, store,
              typename PollingSource<K, V>::ListFn(std::move(list)),
              internal::SourceDefaults(run_, std::move(name),
                                       std::move(options), run_->labels));
        });
    return Add<K, V>(std::move(piece), scoped);
  }
  template <class K, class V, class Piece>
  Store<K, V>* Add(std::unique_ptr<Piece> piece, bool scoped) {
    Store<K, V>* store = piece->store();
    if (scoped) run_->scoped_stores.insert(store);
    run_->pieces.push_back(std::move(piece));
    return store;
  }
  // A shared source's options: the run's clock, logger, metrics (labelled
  // kind= and pod=), the pod's executor, manual mode.
  template <class Options>
  Options SharedDefaults(const std::string& name, Options o) {
    return internal::SourceDefaults(
        run_, name, std::move(o),
        {{"kind", run_->info.kind}, {"pod", run_->pod_id}});
  }
  template <class K, class V, class Make>
  std::shared_ptr<internal::SharedHold<K, V>> Acquire(const std::string& name,
                                                      Make make) {
    auto hold = run_->pod->Acquire<K, V>(name, make);
    if (hold.ok()) return *std::move(hold);
    run_->errors.push_back(hold.status());
    // A private one, never started: the build fails anyway.
    return std::make_shared<internal::SharedHold<K, V>>(make());
  }
  template <class K, class V>
  Store<K, V>* AddShared(std::string name,
                         std::shared_ptr<internal::SharedHold<K, V>> hold,
                         std::function<bool(const V&, const V&)> equal) {
    auto piece = std::make_unique<internal::SharedPiece<K, V>>(
        run_, name, std::move(hold), std::move(equal));
    return Add<K, V>(std::move(piece), /*scoped=*/true);
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
  // Node: a controller needs no thread of its own while it works (its
  // runner, sources, loops and calls run on their own threads, or on the
  // pod's pools): true unless in manual mode. Launch builds and starts
  // fresh pieces (the first half of Run) and returns; Halt stops them in
  // reverse (the second half).
  bool Threadless() const override { return !options_.manual; }
  absl::Status Launch(const Context& ctx) override;
  void Halt() override;
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
