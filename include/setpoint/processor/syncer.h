// Syncer: drives the world towards the desired state, key by key. It holds
// desired and observed state on the runner, works out create / update /
// delete per key, and hands each operation to its updater threads, which
// call the user's Client; results come back to the runner as events.
//
//   class VmClient : public SyncerClient<std::string, Spec, Vm> { ... };
//   VmClient client;
//   Syncer<std::string, Spec, Vm> syncer(&runner, &client, {
//       .name = "vms",
//       .needs_update = [](const Spec& d, const Vm& o) {
//         return d.size != o.size;
//       },
//   });
//   syncer.ObserveFrom(&vm_store);       // observed state, and its sync
//   syncer.Start();                      // updater threads "sp-updater"
//   runner.Post([&] { syncer.SetDesired("web-1", Spec{.size = 2}); });
//
// Guarantees (docs/syncer.md has the details and the defaults):
// - Bursts coalesce: the intent for a key is worked out from the latest
//   desired and observed values when there is room for it (fewer than
//   max_in_flight operations handed to the updaters), so 1,000 updates
//   while an operation runs lead to at most one more operation.
// - Calls run on updater threads: a private pool per syncer, or an
//   UpdaterPool shared by a pod's syncers (SyncerOptions::pool).
// - At most one operation per key in flight, at most max_in_flight overall,
//   optionally rate limited (token bucket) and delayed (execution_delay).
// - A failed operation is retried for that key with capped exponential
//   backoff and jitter (100 ms -> 5 min), reset on success; only failures
//   grow it. A retry-after hint (WithRetryAfter) replaces the backoff delay.
//   Terminal codes are not retried until the desired or observed value of
//   the key changes; they are reported in StatusSnapshot() and counted.
// - Read-your-own-writes: after a successful operation the key waits until
//   the observed state shows a change (or expectation_timeout passes)
//   before another operation is worked out for it.
// - Nothing acts on a partial view: while the syncer is out of sync (an
//   observed store, or the desired producer, is), no operation starts; on
//   sync every key is diffed again.
// - Rescope(filter) forgets keys outside a new shard range without deleting
//   them, cancels the context of their calls in flight (a call handed over
//   but not started never starts), and discards their results.
//   AwaitCallsWithin(filter, ctx) then waits until none of them runs.
// - Every call's context carries the values given to SetCallValues (a
//   controller puts the shard assignment there). A call refused as a stale
//   owner (IsStaleOwner) is counted and not retried until SetCallValues.
// - A client that throws is caught: the operation failed with kInternal and
//   is retried.
//
// Wiring for a shard-range change: syncer.Rescope(filter) first, then each
// source's Rescope(filter), in the same runner event; then, off the
// runner, AwaitCallsWithin(filter, ctx). setpoint::Controller does all of
// it.
//
// Thread safety: everything runs on the runner thread except Start(),
// Stop() and RunUntilIdle(), which belong to the owner thread, and
// stats() and AwaitCallsWithin(), which are safe from any thread but
// the runner's. The Client is called on the updater threads.
// Destroy a syncer after its runner stopped or on the runner thread (never
// on another thread while the runner runs): events it posted earlier and
// the stores it observes then find it gone and do nothing.
#ifndef SETPOINT_PROCESSOR_SYNCER_H_
#define SETPOINT_PROCESSOR_SYNCER_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <stop_token>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/synchronizable.h"
#include "setpoint/processor/transformer.h"
#include "setpoint/processor/updater_pool.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {

enum class SyncOp : uint8_t { kNone, kCreate, kUpdate, kDelete };
const char* SyncOpName(SyncOp op);

// What the Syncer calls to change the world. Called on updater threads, up
// to max_in_flight calls at once, never two for the same key at once.
// Return OK on success; an error code the Syncer classifies (terminal or
// retried); WithRetryAfter(status, d) to ask for a later retry;
// StaleOwnerError when the system refused the write's fencing token. `ctx`
// is cancelled when the Syncer stops or the key leaves its range, and
// carries the values given to SetCallValues.
template <class K, class D, class O>
class SyncerClient {
 public:
  virtual ~SyncerClient() = default;
  virtual absl::Status Create(const Context& ctx, const K& key,
                              const D& desired) = 0;
  virtual absl::Status Update(const Context& ctx, const K& key,
                              const D& desired, const O& observed) = 0;
  virtual absl::Status Delete(const Context& ctx, const K& key,
                              const O& observed) = 0;
};

template <class D, class O>
struct SyncerOptions {
  // Names the syncer in logs and in the sync graph.
  // Default: "syncer".
  std::string name = "syncer";
  // True when `observed` must be updated to match `desired` (the analog of
  // an update mask). Required unless D and O compare with ==.
  // Default: !(desired == observed) when that compiles.
  std::function<bool(const D& desired, const O& observed)> needs_update =
      nullptr;
  // Same-value test for desired values: an equal SetDesired is a no-op.
  // Default: operator== when it compiles, else every set is a change.
  std::function<bool(const D&, const D&)> desired_equal = nullptr;
  // Operations handed to the updaters and not finished, at most (>= 1):
  // running, or queued for a free updater thread. The calls running at once
  // are at most this and the updater threads (8 by default), so a client
  // that blocks on IO still gets 8 calls at a time; a fast client gets 64
  // operations per round trip through the runner instead of 8 (each round
  // trip may cost two thread wake-ups). An operation's values are taken
  // when it is handed over: with more queued than threads, a call may start
  // with values a little older than the latest (the newer ones follow in
  // the next operation for the key).
  // Default: 64 (was 8).
  int max_in_flight = 64;
  // Threads of the private updater pool (without `pool`). 0: one per
  // max_in_flight slot, at most 8 (was at most 64).
  // Default: 0.
  int updater_threads = 0;
  // A pool shared with other syncers (a pod's nodes): calls run on its
  // threads, at most max_in_flight of this syncer's at once, and
  // updater_threads is not used. The pool must outlive the syncer's Stop().
  // Default: null (the syncer owns a private pool).
  UpdaterPool* pool = nullptr;
  // Operations started per second, at most; 0 disables the limit.
  // Default: 0.
  double rate_limit = 0;
  // Token bucket size for rate_limit (>= 1).
  // Default: 1.
  int rate_burst = 1;
  // An intent waits this long after it first appears before it starts, so
  // a burst becomes one operation. Zero: start as soon as possible.
  // Default: 0.
  absl::Duration execution_delay = absl::ZeroDuration();
  // Per-key retry delays after a failure.
  // Default: 100 ms doubling to 5 minutes, jitter 0.2.
  BackoffOptions backoff = {};
  // Codes that are not retried (until the key's desired or observed state
  // changes).
  // Default: TerminalErrorCodes(), the same codes RetryPolicy does not
  // retry.
  std::vector<absl::StatusCode> terminal_codes = TerminalErrorCodes();
  // After a successful operation, how long to wait for the observed state to
  // show it before working the key out again anyway.
  // Default: 30 s.
  absl::Duration expectation_timeout = absl::Seconds(30);
  // Each client call gets a context with this deadline. Zero: none.
  // Default: 0.
  absl::Duration operation_timeout = absl::ZeroDuration();
  // Per-operation switches. A disabled operation is not started; the key
  // stays pending (visible in StatusSnapshot()).
  // Default: all enabled.
  bool enable_create = true;
  bool enable_update = true;
  bool enable_delete = true;
  // Seeds the backoff jitter; 0 picks a random seed.
  // Default: 0.
  uint64_t seed = 0;
  // The stores given to ObserveFrom and DesireFrom are re-scoped with the
  // same filter as Rescope, in the same runner event (setpoint::Controller
  // does this): the keys they deliver are not checked again. Calls are
  // still checked against the filter before they start.
  // Default: false.
  bool trust_store_filters = false;
  // No updater threads: calls run when the owner calls RunUntilIdle(),
  // on its thread (deterministic tests of a whole controller).
  // Default: false.
  bool manual_updates = false;
  // Where operations and their durations are counted
  // (setpoint_syncer_*, docs/operations.md), labelled with metric_labels
  // and syncer=<name>; PublishStatusMetrics() sets the keys-by-state gauges.
  // Default: none (nothing is published).
  MetricsRegistry* metrics = nullptr;
  MetricLabels metric_labels = {};
  // A failing operation is logged as a warning at most once per this
  // interval per syncer (with the count of failures since the last one and
  // one example); the others are logged at debug level.
  // Default: 10 s.
  absl::Duration warning_interval = absl::Seconds(10);
  // Default: the runner's clock (Runner::clock()).
  Clock* clock = nullptr;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Counters, readable from any thread.
struct SyncerStats {
  int64_t creates = 0;  // Succeeded operations, by kind.
  int64_t updates = 0;
  int64_t deletes = 0;
  int64_t failures = 0;              // Failed operations that will be retried.
  int64_t terminal_failures = 0;     // Failed with a terminal code.
  int64_t client_threw = 0;          // Of the failures, how many threw.
  int64_t results_discarded = 0;     // Results for keys forgotten by Rescope.
  int64_t ignored_out_of_range = 0;  // Desired/observed keys outside filter.
  int64_t not_started_at_stop = 0;   // Handed to updaters, never started.
  int64_t calls_cancelled = 0;       // Calls cancelled: the key left.
  int64_t stale_refusals = 0;        // Calls refused as a stale owner
                                     // (discarded results included).
};

// One key that is failing, for StatusSnapshot().
template <class K>
struct SyncerKeyFailure {
  K key;
  absl::Status last_error;
  int failures = 0;  // In a row.
  bool terminal = false;
  // None (InfiniteFuture) for terminal and stale-owner keys.
  absl::Time next_attempt = absl::InfiniteFuture();
};

// The state of every key at one moment, for operators and tests.
template <class K>
struct SyncerStatus {
  bool in_sync = false;   // False: paused, nothing starts.
  int64_t keys = 0;       // Tracked keys (desired or observed).
  int64_t converged = 0;  // Nothing to do.
  int64_t pending = 0;    // Something to do, not started, not failing
                          // (waiting for an updater, the rate limit,
                          // execution_delay or a disabled switch). Keys
                          // waiting out a backoff count as failing.
  int64_t in_flight = 0;
  int64_t awaiting_observation = 0;  // Done, waiting to see it observed.
  int64_t failing = 0;               // Last operation failed (retrying).
  int64_t terminal = 0;              // Failed terminally; not retried.
  int64_t stale = 0;  // Refused as a stale owner; waits for SetCallValues.
  // How long the key that has waited longest for the world to match has
  // waited (zero when every key is converged).
  absl::Duration longest_pending = absl::ZeroDuration();
  std::vector<SyncerKeyFailure<K>> failures;  // At most max_failures.
};

template <class K, class D, class O>
class Syncer : public Synchronizable,
               public DesiredSink<K, D>,
               private UpdaterPool::Queue {
 public:
  using Client = SyncerClient<K, D, O>;
  using Options = SyncerOptions<D, O>;

  Syncer(Runner* runner, Client* client, Options options = {});
  // Calls Stop().
  ~Syncer() override;

  // Starts the updater threads. kInvalidArgument naming the field for bad
  // options; kFailedPrecondition if started twice.
  absl::Status Start();
  // Owner thread. Stops the updaters: operations in progress finish (their
  // client context is cancelled) and their results go to the runner;
  // operations handed over but not started are counted and reported back
  // as not done. Intents still pending are logged with their count.
  // Idempotent.
  void Stop();

  // Observed state and its sync come from `store` (runner thread, before
  // the runner starts or on it).
  void ObserveFrom(Store<K, O>* store);
  // Desired state and its sync come from `store`: the desired view is
  // complete while it is in sync (runner thread, as ObserveFrom).
  void DesireFrom(Store<K, D>* store);

  // DesiredSink (runner thread).
  void ReplaceDesired(absl::flat_hash_map<K, D> desired) override;
  void SetDesired(K key, D desired) override;
  void DeleteDesired(const K& key) override;
  // The producer's sync gates the desired view from now on.
  void DependOnDesired(Synchronizable* producer) override {
    DependOn(producer);
    SetSelfSynced(true);
  }
  // Declares the desired view complete when no Transformer feeds the
  // syncer (user code calling SetDesired directly). ReplaceDesired implies
  // it.
  void MarkDesiredComplete() {
    SETPOINT_DCHECK_ON_RUNNER(runner_);
    SetSelfSynced(true);
  }

  // Observed state, when not fed by ObserveFrom (runner thread).
  void SetObserved(K key, O observed);
  void DeleteObserved(const K& key);

  // Re-scopes the syncer to `filter` (a new shard range): keys outside it
  // are forgotten, never deleted; their calls in flight are cancelled, and
  // those handed over but not started never start. Runner thread.
  void Rescope(KeyFilter<K> filter);
  // Any thread: from now on no call starts for a key `filter` rejects, and
  // the calls running or handed over for such keys are cancelled — at
  // once, without waiting for the runner (a handoff must not wait behind a
  // slow runner event to stop the calls). Rescope(filter) on the runner
  // follows; it sets the same filter. An empty filter allows every key.
  void Fence(KeyFilter<K> filter);
  // Calls started from now on carry the values of `values` in their
  // context (its cancellation and deadline are not used). Clears the
  // stale-owner wait of every key. Runner thread.
  void SetCallValues(const Context& values);
  // Any thread but the runner's: blocks until no call for a key outside
  // `filter` runs, or `ctx` ends; then returns kDeadlineExceeded (or
  // kCancelled) naming how many still run. An empty filter selects all.
  absl::Status AwaitCallsWithin(const KeyFilter<K>& filter,
                                const Context& ctx) const;
  // With manual_updates: runs every call handed over, on this thread, and
  // posts the results to the runner. Returns how many ran.
  int RunUntilIdle();

  // Per-operation switches (runner thread).
  void EnableCreate(bool on) { SetSwitch(&options_.enable_create, on); }
  void EnableUpdate(bool on) { SetSwitch(&options_.enable_update, on); }
  void EnableDelete(bool on) { SetSwitch(&options_.enable_delete, on); }

  // Runner thread: the state of every key; lists up to `max_failures`
  // failing keys.
  SyncerStatus<K> StatusSnapshot(size_t max_failures = 100) const;
  // Runner thread: the desired / observed value of `key`, or nullptr.
  const D* desired(const K& key) const;
  const O* observed(const K& key) const;
  // Any thread.
  SyncerStats stats() const;
  // Runner thread: sets the gauges of options.metrics from a StatusSnapshot
  // (keys by state, in sync, longest pending age). O(keys); a Controller
  // calls it once per status interval. No-op without metrics.
  void PublishStatusMetrics();

 protected:
  void OnSynced() override;
  void OnLostSync() override;

 private:
  struct Entry {
    std::optional<D> desired;
    std::optional<O> observed;
    uint64_t desired_version = 0;
    uint64_t observed_seq = 0;
    // Set by Rescope; results dispatched in an older epoch are discarded.
    uint32_t epoch = 0;
    uint32_t failures = 0;
    absl::Status last_error;
    absl::Time not_before = absl::InfinitePast();       // Backoff.
    absl::Time pending_since = absl::InfiniteFuture();  // execution_delay.
    // Since when the key has not matched (InfiniteFuture: it matches).
    absl::Time unconverged_since = absl::InfiniteFuture();
    absl::Time expect_until = absl::InfinitePast();
    absl::Time wake_at = absl::InfiniteFuture();  // In the wake heap.
    uint64_t expect_observed_seq = 0;
    uint64_t terminal_version = 0;
    uint64_t terminal_observed_seq = 0;
    SyncOp expect_op = SyncOp::kNone;
    SyncOp in_flight = SyncOp::kNone;
    bool terminal = false;
    bool stale = false;  // Refused as a stale owner: waits for new values.
    // call_values_version_ when the call in flight was handed over.
    uint64_t in_flight_values = 0;
    bool dirty = false;
    bool queued = false;
    // In the expectation list (awaiting an observation until expect_until),
    // linked in expect_until order.
    bool expect_linked = false;
    std::pair<const K, Entry>* expect_prev = nullptr;
    std::pair<const K, Entry>* expect_next = nullptr;
  };
  using Map = absl::node_hash_map<K, Entry>;
  using Slot = typename Map::value_type;

  struct Work {
    Slot* slot;  // Stable: an entry is never erased while in flight.
    K key;
    SyncOp op;
    std::optional<D> desired;
    std::optional<O> observed;
    uint64_t desired_version;
    uint64_t observed_seq;
    uint32_t epoch;
    Context values;          // Carries the call's values.
    bool cancelled = false;  // Its key left before it started (under mu_).
  };
  // One pool thread (or the RunUntilIdle caller) serving this syncer: the
  // call it runs and the stop source of that call's context. A source is
  // reused for the next call until a cancellation stops it (no allocation
  // per call); it is replaced under mu_, where Fence and Stop use it.
  struct Seat {
    const Slot* slot = nullptr;  // The call running now, or null.
    std::stop_source stop;
  };
  struct Result {
    Slot* slot;
    K key;
    SyncOp op;
    absl::Status status;
    bool threw;
    bool started;
    uint64_t desired_version;
    uint64_t observed_seq;
    uint32_t epoch;
  };
  struct Wake {
    absl::Time when;
    K key;
    bool operator>(const Wake& o) const { return when > o.when; }
  };

  bool Selected(const K& key) const { return !filter_ || filter_(key); }
  // SetDesired / SetObserved; `check`: drop keys outside the filter.
  void Desire(K key, D desired, bool check);
  void Observe(K key, O observed, bool check);
  bool DesiredEqual(const D& a, const D& b) const;
  bool NeedsUpdate(const D& d, const O& o) const;
  bool IsTerminal(const absl::Status& s) const;
  bool Enabled(SyncOp op) const;
  void SetSwitch(bool* field, bool on);

  void MarkDirty(Slot& slot);
  void SchedulePump();
  void Pump();
  // Works the key out again: nothing, wait (backoff, delay, expectation),
  // or ready to start.
  void Evaluate(Slot& slot, absl::Time now);
  SyncOp Compute(const Entry& e) const;
  bool ExpectationPending(Slot& slot, absl::Time now);
  void WakeAt(Slot& slot, absl::Time when);
  void ArmTimer(absl::Time when);
  void OnTimer();
  void Dispatch(absl::Time now);
  bool TakeToken(absl::Time now);
  void MaybeErase(Slot& slot);
  // The expectation list: keys awaiting an observation, by expect_until
  // (a FIFO in practice: expectation_timeout is one constant). No heap
  // entry and no key copy per successful operation.
  void Expect(Slot& slot);
  void Unexpect(Slot& slot);
  void Erase(Slot& slot);

  // UpdaterPool::Queue: runs calls for one turn on a pool thread.
  bool Serve() override;
  // Runs queued calls on this thread, at most `max_calls` (or until the
  // turn's time is up when `turn`); returns how many ran and sets `*more`
  // when calls are still queued. Pool threads and RunUntilIdle.
  int ServeCalls(int max_calls, bool turn, bool* more);
  // Takes the next call to run and records it as running on `seat`; a
  // cancelled one becomes a not-started result instead (returns nullopt).
  std::optional<Work> TakeWork(Seat* seat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Seat* AcquireSeat() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseSeat(Seat* seat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Cancels the calls running or handed over for keys fence_ rejects;
  // returns how many.
  int64_t CancelOutsideLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a finished call's result and clears its seat.
  void FinishWork(Seat* seat, Result result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PostDrain();
  Result Execute(Work& work, const std::stop_source& stop);
  void DrainResults();
  void ApplyResult(Result& r, absl::Time now);

  Runner* const runner_;
  Client* const client_;
  Options options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;

  // Runner-only state.
  Map entries_;
  KeyFilter<K> filter_;
  uint32_t epoch_ = 0;
  std::vector<Slot*> dirty_;
  std::vector<Slot*> pumping_;  // Pump's copy of dirty_, kept for capacity.
  // Entries with a desired value: lets ReplaceDesired skip its removal scan.
  size_t with_desired_ = 0;
  std::deque<Slot*> ready_;
  std::priority_queue<Wake, std::vector<Wake>, std::greater<>> wakes_;
  Slot* expect_head_ = nullptr;
  Slot* expect_tail_ = nullptr;
  std::vector<Work> dispatching_;  // Dispatch's batch, kept for capacity.
  std::vector<Result> draining_;   // DrainResults' batch, likewise.
  TimerHandle timer_;
  absl::Time timer_at_ = absl::InfiniteFuture();
  bool stopped_on_runner_ = false;  // Stop() reached the runner.
  bool pump_posted_ = false;
  int in_flight_ = 0;
  double tokens_ = 0;
  absl::Time tokens_at_ = absl::InfinitePast();
  std::mt19937_64 rng_;
  Context call_values_;
  uint64_t call_values_version_ = 0;  // Counts SetCallValues.
  bool stale_logged_ = false;         // Since the last SetCallValues.

  // Shared with the updater threads.
  mutable Mutex mu_;
  // Calls handed over, not taken yet, in order: a vector read from `head`
  // (a deque would allocate a block every few calls).
  struct WorkQueue {
    std::vector<Work> items;
    size_t head = 0;
    bool empty() const { return head == items.size(); }
    size_t size() const { return items.size() - head; }
    auto begin() { return items.begin() + static_cast<ptrdiff_t>(head); }
    auto end() { return items.end(); }
    Work PopFront() {
      Work w = std::move(items[head++]);
      if (head == items.size()) {
        items.clear();  // Keeps the capacity.
        head = 0;
      } else if (head >= 64 && head * 2 >= items.size()) {
        items.erase(items.begin(),
                    items.begin() + static_cast<ptrdiff_t>(head));
        head = 0;
      }
      return w;
    }
  };
  WorkQueue work_ ABSL_GUARDED_BY(mu_);
  std::vector<Result> results_ ABSL_GUARDED_BY(mu_);
  bool drain_posted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  // What Fence (or Rescope) allows to start; empty: every key.
  KeyFilter<K> fence_ ABSL_GUARDED_BY(mu_);
  // Every seat made so far (one per thread serving the syncer at once);
  // the calls running now are the seats' non-null slots.
  std::vector<std::unique_ptr<Seat>> seats_ ABSL_GUARDED_BY(mu_);
  std::vector<Seat*> free_seats_ ABSL_GUARDED_BY(mu_);
  // AwaitCallsWithin callers waiting: a finished call signals call_done_
  // only then.
  mutable int awaiters_ ABSL_GUARDED_BY(mu_) = 0;
  mutable CondVar call_done_;  // A running call ended.
  // Where calls run: options_.pool or own_pool_ (null in manual mode).
  UpdaterPool* pool_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::unique_ptr<UpdaterPool> own_pool_;  // Owner thread (Start, Stop).

  // Metric cells (null without options_.metrics): operations by op and
  // result, their durations by op, and the counters below.
  enum ResultKind { kSuccess, kError, kTerminal, kStale, kResultKinds };
  struct Cells {
    Counter* ops[3][kResultKinds] = {};
    Histogram* duration[3] = {};
    Counter* retries = nullptr;
    Counter* discarded = nullptr;
    Counter* cancelled = nullptr;
    Counter* stale_refusals = nullptr;
    Gauge* keys[7] = {};  // By SyncerStatus state, in StateNames() order.
    Gauge* in_sync = nullptr;
    Gauge* longest_pending = nullptr;
  };
  static const char* const* StateNames() {
    static const char* const kNames[7] = {
        "converged",   "pending",  "in_flight", "awaiting_observation",
        "backing_off", "terminal", "stale"};
    return kNames;
  }
  static int OpIndex(SyncOp op) {
    return op == SyncOp::kCreate ? 0 : op == SyncOp::kUpdate ? 1 : 2;
  }
  void CountOp(SyncOp op, ResultKind kind) {
    if (cells_.ops[0][0] != nullptr && op != SyncOp::kNone)
      cells_.ops[OpIndex(op)][kind]->Increment();
  }
  static void Bump(Counter* c) {
    if (c != nullptr) c->Increment();
  }
  void InitCells();
  // Logs a failure as a warning unless one was logged less than
  // warning_interval ago (then at debug level, counted for the next one).
  template <class... Args>
  void WarnFailure(absl::Time now, spdlog::format_string_t<Args...> fmt,
                   Args&&... args);
  Cells cells_;
  absl::Time last_warning_ = absl::InfinitePast();
  int64_t warnings_suppressed_ = 0;

  struct AtomicCounters {
    std::atomic<int64_t> creates{0}, updates{0}, deletes{0}, failures{0},
        terminal_failures{0}, client_threw{0}, results_discarded{0},
        ignored_out_of_range{0}, not_started_at_stop{0}, calls_cancelled{0},
        stale_refusals{0};
  };
  AtomicCounters counters_;

  // Expires when the syncer is destroyed. Events posted to the runner and
  // store listeners hold a weak reference and do nothing once it expired:
  // they may run after the syncer is gone (destroyed on the runner thread,
  // or before a store it observes).
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

// ---------------------------------------------------------------------------

inline const char* SyncOpName(SyncOp op) {
  switch (op) {
    case SyncOp::kCreate:
      return "create";
    case SyncOp::kUpdate:
      return "update";
    case SyncOp::kDelete:
      return "delete";
    case SyncOp::kNone:
      break;
  }
  return "none";
}

namespace internal {
// Formats a key for logs when it is formattable, else "<key>".
template <class K>
std::string KeyForLog(const K& key) {
  if constexpr (fmt::is_formattable<K>::value) {
    return fmt::format("{}", key);
  } else {
    return "<key>";
  }
}
}  // namespace internal

template <class K, class D, class O>
Syncer<K, D, O>::Syncer(Runner* runner, Client* client, Options options)
    : Synchronizable(options.name),
      runner_(runner),
      client_(client),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : runner->clock()),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()),
      rng_(options_.seed != 0 ? options_.seed : std::random_device{}()) {
  tokens_ = std::max(1, options_.rate_burst);
  InitCells();
}

template <class K, class D, class O>
void Syncer<K, D, O>::InitCells() {
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) return;
  const MetricLabels base =
      WithLabels(options_.metric_labels, {{"syncer", options_.name}});
  static const char* const kOps[3] = {"create", "update", "delete"};
  static const char* const kResults[kResultKinds] = {"success", "error",
                                                     "terminal", "stale"};
  for (int op = 0; op < 3; ++op) {
    for (int r = 0; r < kResultKinds; ++r) {
      cells_.ops[op][r] = &m->GetCounter(
          "setpoint_syncer_operations_total",
          "Client calls that returned, by operation and result.",
          WithLabels(base, {{"op", kOps[op]}, {"result", kResults[r]}}));
    }
    cells_.duration[op] = &m->GetHistogram(
        "setpoint_syncer_operation_duration_seconds",
        "How long client calls took, by operation.",
        WithLabels(base, {{"op", kOps[op]}}), Histogram::DurationBuckets());
  }
  cells_.retries = &m->GetCounter(
      "setpoint_syncer_retries_total",
      "Failed operations scheduled for a retry with backoff.", base);
  cells_.discarded = &m->GetCounter(
      "setpoint_syncer_results_discarded_total",
      "Results discarded because their key left the range.", base);
  cells_.cancelled = &m->GetCounter(
      "setpoint_syncer_calls_cancelled_total",
      "Calls cancelled or never started because their key left the range.",
      base);
  cells_.stale_refusals = &m->GetCounter(
      "setpoint_syncer_stale_refusals_total",
      "Calls the system refused as coming from a stale owner (old token).",
      base);
  for (int i = 0; i < 7; ++i) {
    cells_.keys[i] =
        &m->GetGauge("setpoint_syncer_keys", "Tracked keys, by state.",
                     WithLabels(base, {{"state", StateNames()[i]}}));
  }
  cells_.in_sync = &m->GetGauge(
      "setpoint_syncer_in_sync",
      "1 when the syncer's inputs are complete and it acts, else 0.", base);
  cells_.longest_pending = &m->GetGauge(
      "setpoint_syncer_longest_pending_seconds",
      "How long the key waiting longest for the world to match has waited.",
      base);
}

template <class K, class D, class O>
void Syncer<K, D, O>::PublishStatusMetrics() {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  if (cells_.in_sync == nullptr) return;
  SyncerStatus<K> s = StatusSnapshot(0);
  const int64_t by_state[7] = {
      s.converged, s.pending,  s.in_flight, s.awaiting_observation,
      s.failing,   s.terminal, s.stale};
  for (int i = 0; i < 7; ++i)
    cells_.keys[i]->Set(static_cast<double>(by_state[i]));
  cells_.in_sync->Set(s.in_sync ? 1 : 0);
  cells_.longest_pending->Set(absl::ToDoubleSeconds(s.longest_pending));
}

template <class K, class D, class O>
template <class... Args>
void Syncer<K, D, O>::WarnFailure(absl::Time now,
                                  spdlog::format_string_t<Args...> fmt,
                                  Args&&... args) {
  if (now - last_warning_ < options_.warning_interval) {
    ++warnings_suppressed_;
    logger_->debug(fmt, std::forward<Args>(args)...);
    return;
  }
  last_warning_ = now;
  if (warnings_suppressed_ > 0) {
    logger_->warn(
        "syncer={} failures_since_last_warning={} (logged at debug "
        "level; StatusSnapshot lists the failing keys)",
        name(), warnings_suppressed_);
    warnings_suppressed_ = 0;
  }
  logger_->warn(fmt, std::forward<Args>(args)...);
}

template <class K, class D, class O>
Syncer<K, D, O>::~Syncer() {
  Stop();
  timer_.Cancel();
  alive_.reset();
}

template <class K, class D, class O>
absl::Status Syncer<K, D, O>::Start() {
  const Options& o = options_;
  if (o.needs_update == nullptr) {
    if constexpr (!std::equality_comparable_with<D, O>) {
      return absl::InvalidArgumentError(absl::StrCat(
          "start syncer ", name(),
          ": needs_update is required when desired and observed types "
          "cannot be compared with =="));
    }
  }
  if (o.max_in_flight < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start syncer ", name(),
                     ": max_in_flight must be >= 1, got ", o.max_in_flight));
  }
  if (o.updater_threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start syncer ", name(), ": updater_threads must be >= 0, got ",
        o.updater_threads));
  }
  if (!(o.rate_limit >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("start syncer ", name(), ": rate_limit must be >= 0, got ",
                     o.rate_limit));
  }
  if (o.rate_burst < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start syncer ", name(), ": rate_burst must be >= 1, got ",
                     o.rate_burst));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, absl::Duration>{"execution_delay",
                                               o.execution_delay},
        {"expectation_timeout", o.expectation_timeout},
        {"operation_timeout", o.operation_timeout}}) {
    if (value < absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat("start syncer ", name(), ": ", field,
                       " must be >= 0, got ", absl::FormatDuration(value)));
    }
  }
  if (absl::Status s = ValidateBackoffOptions(o.backoff); !s.ok()) {
    return Annotate(s, absl::StrCat("start syncer ", name()));
  }
  if (client_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("start syncer ", name(), ": client is null"));
  }
  {
    MutexLock l(&mu_);
    if (started_ || stopping_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "start syncer ", name(), ": already started or stopped"));
    }
    started_ = true;
  }
  int threads = 0;
  UpdaterPool* pool = nullptr;
  if (o.manual_updates) {
    // Calls run in RunUntilIdle.
  } else if (o.pool != nullptr) {
    pool = o.pool;
    threads = o.pool->threads();
  } else {
    threads = o.updater_threads > 0 ? o.updater_threads
                                    : std::min(o.max_in_flight, 8);
    own_pool_ = std::make_unique<UpdaterPool>(UpdaterPoolOptions{
        .name = o.name, .threads = threads, .logger = logger_});
    if (absl::Status s = own_pool_->Start(); !s.ok()) {
      return Annotate(s, absl::StrCat("start syncer ", name()));
    }
    pool = own_pool_.get();
  }
  if (pool != nullptr) {
    pool->Attach(this);
    bool queued;
    {
      // The runner may dispatch already (a syncer started on a running
      // runner): calls handed over before now are served too.
      MutexLock l(&mu_);
      pool_ = pool;
      queued = !work_.empty();
    }
    if (queued) pool->Notify(this);
  }
  SPDLOG_LOGGER_INFO(logger_,
                     "syncer started syncer={} updaters={} shared_pool={} "
                     "max_in_flight={}",
                     name(), threads, o.pool != nullptr, o.max_in_flight);
  return absl::OkStatus();
}

template <class K, class D, class O>
void Syncer<K, D, O>::Stop() {
  WorkQueue not_started;
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    std::swap(not_started, work_);
    for (auto& seat : seats_) {
      if (seat->slot != nullptr) seat->stop.request_stop();
    }
  }
  // Waits for this syncer's calls only (a shared pool runs others').
  UpdaterPool* pool;
  {
    MutexLock l(&mu_);
    pool = pool_;
  }
  if (pool != nullptr) pool->Detach(this);
  if (own_pool_ != nullptr) own_pool_->Stop();  // Joins.
  // Calls cancelled because their key left are counted there already.
  const int64_t never_started =
      std::count_if(not_started.begin(), not_started.end(),
                    [](const Work& w) { return !w.cancelled; });
  if (never_started > 0) {
    counters_.not_started_at_stop.fetch_add(never_started);
    SPDLOG_LOGGER_WARN(logger_,
                       "syncer stopped with operations not started "
                       "syncer={} count={}",
                       name(), never_started);
  }
  // Report what is left to the runner, where the state lives.
  std::vector<Result> undone;
  for (Work& w : not_started) {
    undone.push_back(Result{w.slot, std::move(w.key), w.op,
                            absl::CancelledError("syncer stopped"), false,
                            false, w.desired_version, w.observed_seq, w.epoch});
  }
  absl::Status posted = runner_->Post(
      [this, alive = std::weak_ptr<int>(alive_),
       undone = std::move(undone)]() mutable {
        if (alive.expired()) return;
        // No more wake-ups: the runner would report the timer as dropped.
        stopped_on_runner_ = true;
        timer_.Cancel();
        timer_at_ = absl::InfiniteFuture();
        absl::Time now = clock_->Now();
        for (Result& r : undone) ApplyResult(r, now);
        SyncerStatus<K> s = StatusSnapshot(0);
        SPDLOG_LOGGER_INFO(
            logger_,
            "syncer stopped syncer={} keys={} pending={} failing={} "
            "terminal={}",
            name(), s.keys, s.pending, s.failing, s.terminal);
      },
      "syncer stop");
  if (!posted.ok()) {
    SPDLOG_LOGGER_WARN(logger_,
                       "syncer stopped after its runner; pending intents "
                       "not counted syncer={}",
                       name());
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::ObserveFrom(Store<K, O>* store) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  store->BindRunner(runner_);
  store->Subscribe(
      [this, alive = std::weak_ptr<int>(alive_)](const Change<K, O>& c) {
        if (alive.expired()) return;  // The store outlived the syncer.
        switch (c.kind) {
          case ChangeKind::kSet:
            Observe(c.key, *c.new_value, !options_.trust_store_filters);
            break;
          case ChangeKind::kDelete:
            DeleteObserved(c.key);
            break;
          case ChangeKind::kForget: {
            // Not a delete in the world: forget what we saw, act on nothing.
            auto it = entries_.find(c.key);
            if (it != entries_.end() && it->second.observed.has_value()) {
              it->second.observed.reset();
              ++it->second.observed_seq;
              if (Selected(c.key)) {
                MarkDirty(*it);
              } else {
                MaybeErase(*it);
              }
            }
            break;
          }
        }
      });
  DependOn(store);
}

template <class K, class D, class O>
void Syncer<K, D, O>::DesireFrom(Store<K, D>* store) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  store->BindRunner(runner_);
  store->Subscribe(
      [this, alive = std::weak_ptr<int>(alive_)](const Change<K, D>& c) {
        if (alive.expired()) return;
        if (c.kind == ChangeKind::kSet) {
          Desire(c.key, *c.new_value, !options_.trust_store_filters);
        } else {
          // A delete, or the key left the store's filter (Rescope forgot it
          // here already): no longer desired.
          DeleteDesired(c.key);
        }
      });
  // What the store holds already is desired too: it may be in sync now.
  for (const auto& [key, value] : store->items()) SetDesired(key, value);
  DependOn(store);
  SetSelfSynced(true);
}

template <class K, class D, class O>
bool Syncer<K, D, O>::DesiredEqual(const D& a, const D& b) const {
  if (options_.desired_equal) return options_.desired_equal(a, b);
  if constexpr (std::equality_comparable<D>) {
    return a == b;
  } else {
    return false;
  }
}

template <class K, class D, class O>
bool Syncer<K, D, O>::NeedsUpdate(const D& d, const O& o) const {
  if (options_.needs_update) return options_.needs_update(d, o);
  if constexpr (std::equality_comparable_with<D, O>) {
    return !(d == o);
  } else {
    return false;  // Start() refused these options.
  }
}

template <class K, class D, class O>
bool Syncer<K, D, O>::IsTerminal(const absl::Status& s) const {
  return std::find(options_.terminal_codes.begin(),
                   options_.terminal_codes.end(),
                   s.code()) != options_.terminal_codes.end();
}

template <class K, class D, class O>
bool Syncer<K, D, O>::Enabled(SyncOp op) const {
  switch (op) {
    case SyncOp::kCreate:
      return options_.enable_create;
    case SyncOp::kUpdate:
      return options_.enable_update;
    case SyncOp::kDelete:
      return options_.enable_delete;
    case SyncOp::kNone:
      break;
  }
  return false;
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetSwitch(bool* field, bool on) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  if (*field == on) return;
  *field = on;
  if (on) {
    for (Slot& slot : entries_) MarkDirty(slot);
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetDesired(K key, D desired) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  Desire(std::move(key), std::move(desired), /*check=*/true);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Desire(K key, D desired, bool check) {
  if (check && !Selected(key)) {
    counters_.ignored_out_of_range.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto [it, inserted] = entries_.try_emplace(std::move(key));
  Entry& e = it->second;
  if (e.desired.has_value() && DesiredEqual(*e.desired, desired)) return;
  if (!e.desired.has_value()) ++with_desired_;
  e.desired = std::move(desired);
  ++e.desired_version;
  // A key waiting in ready_ is worked out again when Dispatch reaches it,
  // and one in flight when its result comes back: no need to mark it.
  if (!e.queued && e.in_flight == SyncOp::kNone) MarkDirty(*it);
}

template <class K, class D, class O>
void Syncer<K, D, O>::DeleteDesired(const K& key) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.desired.has_value()) return;
  --with_desired_;
  it->second.desired.reset();
  ++it->second.desired_version;
  MarkDirty(*it);
}

template <class K, class D, class O>
void Syncer<K, D, O>::ReplaceDesired(absl::flat_hash_map<K, D> desired) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  // One lookup per key of the snapshot (find first: no key copy when the
  // key is known). `in_snapshot` counts the keys that now have a desired
  // value from the snapshot; when that is every key with one, nothing was
  // removed and the scan of every entry is skipped.
  size_t in_snapshot = 0;
  for (auto& [key, value] : desired) {
    if (!Selected(key)) {
      counters_.ignored_out_of_range.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    auto it = entries_.find(key);
    if (it == entries_.end()) it = entries_.try_emplace(key).first;
    Entry& e = it->second;
    ++in_snapshot;
    if (e.desired.has_value()) {
      if (DesiredEqual(*e.desired, value)) continue;
    } else {
      ++with_desired_;
    }
    e.desired = std::move(value);
    ++e.desired_version;
    MarkDirty(*it);
  }
  if (in_snapshot != with_desired_) {
    for (Slot& slot : entries_) {
      Entry& e = slot.second;
      if (e.desired.has_value() && !desired.contains(slot.first)) {
        e.desired.reset();
        ++e.desired_version;
        --with_desired_;
        MarkDirty(slot);
      }
    }
  }
  SetSelfSynced(true);
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetObserved(K key, O observed) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  Observe(std::move(key), std::move(observed), /*check=*/true);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Observe(K key, O observed, bool check) {
  if (check && !Selected(key)) {
    counters_.ignored_out_of_range.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  auto [it, inserted] = entries_.try_emplace(std::move(key));
  Entry& e = it->second;
  e.observed = std::move(observed);
  ++e.observed_seq;
  // As in Desire: queued and in-flight keys are worked out again anyway.
  if (!e.queued && e.in_flight == SyncOp::kNone) MarkDirty(*it);
}

template <class K, class D, class O>
void Syncer<K, D, O>::DeleteObserved(const K& key) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->second.observed.has_value()) return;
  it->second.observed.reset();
  ++it->second.observed_seq;
  MarkDirty(*it);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Rescope(KeyFilter<K> filter) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  filter_ = std::move(filter);
  ++epoch_;
  // The queues hold pointers to entries; rebuild them from scratch.
  for (Slot* slot : dirty_) slot->second.dirty = false;
  for (Slot* slot : ready_) slot->second.queued = false;
  dirty_.clear();
  ready_.clear();
  int64_t forgotten = 0, in_flight = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto next = std::next(it);
    if (!Selected(it->first)) {
      ++forgotten;
      Entry& e = it->second;
      if (e.in_flight != SyncOp::kNone) {
        // Kept until its result arrives, so a returning key cannot get a
        // second operation in flight; the result will be discarded.
        ++in_flight;
        if (e.desired.has_value()) --with_desired_;
        e.desired.reset();
        e.observed.reset();
        e.epoch = epoch_;
        // If the key comes back, it starts afresh.
        e.failures = 0;
        e.terminal = false;
        e.last_error = absl::OkStatus();
        e.not_before = absl::InfinitePast();
        e.expect_op = SyncOp::kNone;
        Unexpect(*it);
      } else {
        if (e.desired.has_value()) --with_desired_;
        Erase(*it);
      }
    }
    it = next;
  }
  for (Slot& slot : entries_) MarkDirty(slot);
  int64_t cancelled = 0;
  {
    // Calls for keys that left stop: running ones see their context
    // cancelled, handed-over ones never start.
    MutexLock l(&mu_);
    fence_ = filter_;
    cancelled = CancelOutsideLocked();
  }
  counters_.calls_cancelled.fetch_add(cancelled, std::memory_order_relaxed);
  if (cells_.cancelled != nullptr && cancelled > 0)
    cells_.cancelled->Increment(static_cast<double>(cancelled));
  SPDLOG_LOGGER_INFO(logger_,
                     "syncer reset to a new filter syncer={} forgotten={} "
                     "in_flight_forgotten={} calls_cancelled={} kept={}",
                     name(), forgotten, in_flight, cancelled,
                     static_cast<int64_t>(entries_.size()) - in_flight);
}

template <class K, class D, class O>
int64_t Syncer<K, D, O>::CancelOutsideLocked() {
  int64_t cancelled = 0;
  if (!fence_) return cancelled;
  for (auto& seat : seats_) {
    if (seat->slot != nullptr && !fence_(seat->slot->first) &&
        seat->stop.request_stop()) {
      ++cancelled;
    }
  }
  for (Work& w : work_) {
    if (!w.cancelled && !fence_(w.key)) {
      w.cancelled = true;
      ++cancelled;
    }
  }
  return cancelled;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Fence(KeyFilter<K> filter) {
  int64_t cancelled;
  {
    MutexLock l(&mu_);
    fence_ = std::move(filter);
    cancelled = CancelOutsideLocked();
  }
  counters_.calls_cancelled.fetch_add(cancelled, std::memory_order_relaxed);
  if (cells_.cancelled != nullptr && cancelled > 0)
    cells_.cancelled->Increment(static_cast<double>(cancelled));
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetCallValues(const Context& values) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  call_values_ = Context().WithValuesOf(values);
  ++call_values_version_;
  stale_logged_ = false;
  {
    // Calls handed over but not started yet start under the new values.
    MutexLock l(&mu_);
    for (Work& w : work_) {
      w.values = call_values_;
      w.slot->second.in_flight_values = call_values_version_;
    }
  }
  for (Slot& slot : entries_) {
    if (slot.second.stale) {
      slot.second.stale = false;
      MarkDirty(slot);
    }
  }
}

template <class K, class D, class O>
absl::Status Syncer<K, D, O>::AwaitCallsWithin(const KeyFilter<K>& filter,
                                               const Context& ctx) const {
  auto outside = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t n = 0;
    if (!filter) return n;
    for (const auto& seat : seats_) {
      if (seat->slot != nullptr && !filter(seat->slot->first)) ++n;
    }
    return n;
  };
  MutexLock l(&mu_);
  ++awaiters_;
  const bool done = ctx.clock()->AwaitWithDeadline(
      &mu_, &call_done_, ctx.deadline(), ctx.stop_token(),
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outside() == 0; });
  --awaiters_;
  if (done) return absl::OkStatus();
  int64_t left = outside();
  std::string msg =
      absl::StrCat("syncer ", name(), ": ", left,
                   " call(s) for keys outside the range still running");
  return ctx.Cancelled() ? absl::CancelledError(msg)
                         : absl::DeadlineExceededError(msg);
}

template <class K, class D, class O>
int Syncer<K, D, O>::RunUntilIdle() {
  bool more = false;
  return ServeCalls(std::numeric_limits<int>::max(), /*turn=*/false, &more);
}

template <class K, class D, class O>
void Syncer<K, D, O>::OnSynced() {
  SPDLOG_LOGGER_INFO(logger_,
                     "syncer in sync, diffing all keys syncer={} keys={}",
                     name(), entries_.size());
  for (Slot& slot : entries_) MarkDirty(slot);
}

template <class K, class D, class O>
void Syncer<K, D, O>::OnLostSync() {
  SPDLOG_LOGGER_INFO(logger_, "syncer lost sync, paused syncer={}", name());
}

template <class K, class D, class O>
void Syncer<K, D, O>::MarkDirty(Slot& slot) {
  if (slot.second.dirty) return;
  slot.second.dirty = true;
  dirty_.push_back(&slot);
  SchedulePump();
}

template <class K, class D, class O>
void Syncer<K, D, O>::SchedulePump() {
  if (pump_posted_) return;
  absl::Status posted = runner_->Post(
      [this, alive = std::weak_ptr<int>(alive_)] {
        if (!alive.expired()) Pump();
      },
      "syncer pump");
  if (posted.ok()) pump_posted_ = true;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Pump() {
  pump_posted_ = false;
  absl::Time now = clock_->Now();
  // Evaluate may erase entries; take the list first.
  // Keeps both buffers' capacity from one pump to the next.
  pumping_.swap(dirty_);
  for (Slot* slot : pumping_) {
    slot->second.dirty = false;
    Evaluate(*slot, now);
  }
  pumping_.clear();
  Dispatch(now);
}

template <class K, class D, class O>
SyncOp Syncer<K, D, O>::Compute(const Entry& e) const {
  if (e.desired.has_value()) {
    if (!e.observed.has_value()) return SyncOp::kCreate;
    return NeedsUpdate(*e.desired, *e.observed) ? SyncOp::kUpdate
                                                : SyncOp::kNone;
  }
  return e.observed.has_value() ? SyncOp::kDelete : SyncOp::kNone;
}

template <class K, class D, class O>
bool Syncer<K, D, O>::ExpectationPending(Slot& slot, absl::Time now) {
  Entry& e = slot.second;
  if (e.expect_op == SyncOp::kNone) return false;
  bool seen = e.observed_seq != e.expect_observed_seq &&
              (e.expect_op == SyncOp::kDelete ? !e.observed.has_value()
                                              : e.observed.has_value());
  if (seen || now >= e.expect_until) {
    e.expect_op = SyncOp::kNone;
    Unexpect(slot);
    return false;
  }
  return true;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Expect(Slot& slot) {
  Entry& e = slot.second;
  if (e.expect_linked) return;
  e.expect_linked = true;
  // From the tail: expect_until only grows unless the clock steps back.
  Slot* after = expect_tail_;
  while (after != nullptr && after->second.expect_until > e.expect_until) {
    after = after->second.expect_prev;
  }
  e.expect_prev = after;
  e.expect_next = after != nullptr ? after->second.expect_next : expect_head_;
  if (e.expect_next != nullptr) {
    e.expect_next->second.expect_prev = &slot;
  } else {
    expect_tail_ = &slot;
  }
  if (after != nullptr) {
    after->second.expect_next = &slot;
  } else {
    expect_head_ = &slot;
    ArmTimer(e.expect_until);
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::Unexpect(Slot& slot) {
  Entry& e = slot.second;
  if (!e.expect_linked) return;
  e.expect_linked = false;
  if (e.expect_prev != nullptr) {
    e.expect_prev->second.expect_next = e.expect_next;
  } else {
    expect_head_ = e.expect_next;
  }
  if (e.expect_next != nullptr) {
    e.expect_next->second.expect_prev = e.expect_prev;
  } else {
    expect_tail_ = e.expect_prev;
  }
  e.expect_prev = e.expect_next = nullptr;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Erase(Slot& slot) {
  Unexpect(slot);
  entries_.erase(slot.first);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Evaluate(Slot& slot, absl::Time now) {
  Entry& e = slot.second;
  if (e.in_flight != SyncOp::kNone) return;  // Its result evaluates again.
  if (ExpectationPending(slot, now)) {
    Expect(slot);
    return;
  }
  SyncOp op = Compute(e);
  if (op == SyncOp::kNone) {
    // In sync with the world: whatever failed before is moot.
    e.failures = 0;
    e.terminal = false;
    e.stale = false;
    e.last_error = absl::OkStatus();
    e.not_before = absl::InfinitePast();
    e.pending_since = absl::InfiniteFuture();
    e.unconverged_since = absl::InfiniteFuture();
    if (!e.desired.has_value() && !e.observed.has_value() && !e.queued &&
        !e.dirty) {
      Erase(slot);
    }
    return;
  }
  if (e.unconverged_since == absl::InfiniteFuture()) e.unconverged_since = now;
  if (e.stale) return;  // Waits for the next SetCallValues.
  if (e.terminal) {
    if (e.terminal_version == e.desired_version &&
        e.terminal_observed_seq == e.observed_seq) {
      return;  // Waits for a change of the key.
    }
    e.terminal = false;
    e.failures = 0;
    e.not_before = absl::InfinitePast();
  }
  if (!InSync() || !Enabled(op)) return;  // Diffed again when that changes.
  if (e.pending_since == absl::InfiniteFuture()) e.pending_since = now;
  absl::Time start =
      std::max(e.not_before, e.pending_since + options_.execution_delay);
  if (start > now) {
    WakeAt(slot, start);
    return;
  }
  if (!e.queued) {
    e.queued = true;
    ready_.push_back(&slot);
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::WakeAt(Slot& slot, absl::Time when) {
  Entry& e = slot.second;
  if (e.wake_at <= when) return;  // An earlier wake re-evaluates anyway.
  e.wake_at = when;
  wakes_.push(Wake{when, slot.first});
  ArmTimer(when);
}

template <class K, class D, class O>
void Syncer<K, D, O>::ArmTimer(absl::Time when) {
  if (when >= timer_at_ || stopped_on_runner_) return;
  timer_.Cancel();
  auto timer = runner_->PostAt(
      when,
      [this, alive = std::weak_ptr<int>(alive_)] {
        if (!alive.expired()) OnTimer();
      },
      "syncer timer");
  if (!timer.ok()) return;  // The runner stopped.
  timer_ = *timer;
  timer_at_ = when;
}

template <class K, class D, class O>
void Syncer<K, D, O>::OnTimer() {
  timer_at_ = absl::InfiniteFuture();
  absl::Time now = clock_->Now();
  while (!wakes_.empty() && wakes_.top().when <= now) {
    Wake w = wakes_.top();
    wakes_.pop();
    auto it = entries_.find(w.key);
    if (it == entries_.end() || it->second.wake_at != w.when) continue;
    it->second.wake_at = absl::InfiniteFuture();
    Evaluate(*it, now);
  }
  while (expect_head_ != nullptr && expect_head_->second.expect_until <= now) {
    Slot* slot = expect_head_;
    Unexpect(*slot);
    Evaluate(*slot, now);
  }
  Dispatch(now);
  if (!wakes_.empty()) ArmTimer(wakes_.top().when);
  if (expect_head_ != nullptr) ArmTimer(expect_head_->second.expect_until);
}

template <class K, class D, class O>
bool Syncer<K, D, O>::TakeToken(absl::Time now) {
  if (options_.rate_limit <= 0) return true;
  double burst = std::max(1, options_.rate_burst);
  if (tokens_at_ != absl::InfinitePast()) {
    tokens_ =
        std::min(burst, tokens_ + absl::ToDoubleSeconds(now - tokens_at_) *
                                      options_.rate_limit);
  }
  tokens_at_ = now;
  if (tokens_ >= 1) {
    tokens_ -= 1;
    return true;
  }
  ArmTimer(now + absl::Seconds((1 - tokens_) / options_.rate_limit));
  return false;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Dispatch(absl::Time now) {
  if (!InSync()) return;
  std::vector<Work>& batch = dispatching_;
  while (!ready_.empty() && in_flight_ < options_.max_in_flight) {
    Slot* slot = ready_.front();
    Entry& e = slot->second;
    SyncOp op = Compute(e);
    if (op == SyncOp::kNone || !Enabled(op) || e.in_flight != SyncOp::kNone ||
        std::max(e.not_before, e.pending_since + options_.execution_delay) >
            now) {
      // The key changed since it was queued; work it out again.
      ready_.pop_front();
      e.queued = false;
      Evaluate(*slot, now);
      continue;
    }
    if (!TakeToken(now)) break;
    ready_.pop_front();
    e.queued = false;
    e.in_flight = op;
    e.in_flight_values = call_values_version_;
    e.pending_since = absl::InfiniteFuture();
    ++in_flight_;
    batch.push_back(Work{slot, slot->first, op, e.desired, e.observed,
                         e.desired_version, e.observed_seq, e.epoch,
                         call_values_});
  }
  if (batch.empty()) return;
  bool stopped;
  UpdaterPool* pool;
  {
    MutexLock l(&mu_);
    stopped = stopping_;
    pool = pool_;
    if (!stopped) {
      for (Work& w : batch) work_.items.push_back(std::move(w));
    }
  }
  if (!stopped) {
    batch.clear();
    // One notification for the whole batch: the thread that takes it asks
    // for help only when it finds more queued than the call it runs.
    if (pool != nullptr) pool->Notify(this);
    return;
  }
  // Stopped: nothing will run these; they stay pending.
  for (Work& w : batch) {
    Result r{w.slot,
             std::move(w.key),
             w.op,
             absl::CancelledError("syncer stopped"),
             false,
             false,
             w.desired_version,
             w.observed_seq,
             w.epoch};
    ApplyResult(r, now);
  }
  batch.clear();
}

template <class K, class D, class O>
void Syncer<K, D, O>::MaybeErase(Slot& slot) {
  const Entry& e = slot.second;
  if (!e.desired.has_value() && !e.observed.has_value() &&
      e.in_flight == SyncOp::kNone && !e.dirty && !e.queued) {
    Erase(slot);
  }
}

template <class K, class D, class O>
typename Syncer<K, D, O>::Result Syncer<K, D, O>::Execute(
    Work& w, const std::stop_source& stop) {
  Result r{w.slot, std::move(w.key),  w.op,           absl::OkStatus(), false,
           true,   w.desired_version, w.observed_seq, w.epoch};
  Context op_ctx = Context(stop.get_token(), clock_).WithValuesOf(w.values);
  if (options_.operation_timeout > absl::ZeroDuration()) {
    op_ctx = op_ctx.WithTimeout(options_.operation_timeout);
  }
  struct Timed {
    Histogram* h;
    std::chrono::steady_clock::time_point start;
    ~Timed() {
      if (h != nullptr) {
        h->Observe(std::chrono::duration<double>(
                       std::chrono::steady_clock::now() - start)
                       .count());
      }
    }
  } timed{w.op == SyncOp::kNone ? nullptr : cells_.duration[OpIndex(w.op)],
          cells_.duration[0] != nullptr
              ? std::chrono::steady_clock::now()
              : std::chrono::steady_clock::time_point{}};
  try {
    switch (w.op) {
      case SyncOp::kCreate:
        r.status = client_->Create(op_ctx, r.key, *w.desired);
        break;
      case SyncOp::kUpdate:
        r.status = client_->Update(op_ctx, r.key, *w.desired, *w.observed);
        break;
      case SyncOp::kDelete:
        r.status = client_->Delete(op_ctx, r.key, *w.observed);
        break;
      case SyncOp::kNone:
        break;
    }
  } catch (const std::exception& ex) {
    r.threw = true;
    r.status = absl::InternalError(
        absl::StrCat(SyncOpName(w.op), " threw: ", ex.what()));
  } catch (...) {
    r.threw = true;
    r.status = absl::InternalError(
        absl::StrCat(SyncOpName(w.op), " threw a non-exception"));
  }
  return r;
}

template <class K, class D, class O>
std::optional<typename Syncer<K, D, O>::Work> Syncer<K, D, O>::TakeWork(
    Seat* seat) {
  Work w = work_.PopFront();
  if (w.cancelled || (fence_ && !fence_(w.key))) {
    // Its key left the range before the call started: it never starts.
    results_.push_back(Result{w.slot, std::move(w.key), w.op,
                              absl::CancelledError("key left the range"), false,
                              false, w.desired_version, w.observed_seq,
                              w.epoch});
    return std::nullopt;
  }
  // A source is reused until something cancels a call through it; Fence
  // and Stop reach it only under mu_, so the next call gets a fresh one.
  if (seat->stop.stop_requested()) seat->stop = std::stop_source();
  seat->slot = w.slot;
  return w;
}

template <class K, class D, class O>
typename Syncer<K, D, O>::Seat* Syncer<K, D, O>::AcquireSeat() {
  if (free_seats_.empty()) {
    seats_.push_back(std::make_unique<Seat>());
    return seats_.back().get();
  }
  Seat* seat = free_seats_.back();
  free_seats_.pop_back();
  return seat;
}

template <class K, class D, class O>
void Syncer<K, D, O>::ReleaseSeat(Seat* seat) {
  free_seats_.push_back(seat);
}

template <class K, class D, class O>
void Syncer<K, D, O>::FinishWork(Seat* seat, Result result) {
  seat->slot = nullptr;
  if (awaiters_ > 0) call_done_.SignalAll();
  results_.push_back(std::move(result));
}

template <class K, class D, class O>
void Syncer<K, D, O>::PostDrain() {
  absl::Status posted = runner_->Post(
      [this, alive = std::weak_ptr<int>(alive_)] {
        if (!alive.expired()) DrainResults();
      },
      "syncer results");
  if (!posted.ok()) {
    SPDLOG_LOGGER_WARN(logger_,
                       "syncer results not delivered, runner stopped "
                       "syncer={}: {}",
                       name(), posted);
  }
}

template <class K, class D, class O>
bool Syncer<K, D, O>::Serve() {
  bool more = false;
  // A turn: at most 256 calls and about a millisecond, then the pool
  // serves the other syncers with queued calls before this one again.
  ServeCalls(256, /*turn=*/true, &more);
  return more;
}

template <class K, class D, class O>
int Syncer<K, D, O>::ServeCalls(int max_calls, bool turn, bool* more) {
  // Results go back to the runner in batches: one drain is posted when
  // this thread runs out of calls, when 64 results wait, or after a call
  // that took long (its result should not wait for the next ones).
  constexpr size_t kHandBack = 64;
  constexpr auto kSlowCall = std::chrono::microseconds(50);
  constexpr auto kTurn = std::chrono::milliseconds(1);
  using SteadyClock = std::chrono::steady_clock;
  // One clock read per call: `last` is when the previous call returned.
  const SteadyClock::time_point turn_start = SteadyClock::now();
  SteadyClock::time_point last = turn_start;
  Seat* seat = nullptr;
  std::optional<Result> done;
  bool slow = false;
  bool asked_for_help = false;
  int ran = 0;
  *more = false;
  while (true) {
    std::optional<Work> work;
    bool post = false;
    UpdaterPool* help = nullptr;
    {
      MutexLock l(&mu_);
      if (seat == nullptr) seat = AcquireSeat();
      if (done.has_value()) {
        FinishWork(seat, std::move(*done));
        done.reset();
      }
      const bool turn_over =
          ran >= max_calls || (turn && ran > 0 && last - turn_start >= kTurn);
      while (!work.has_value() && !work_.empty() && !stopping_ && !turn_over) {
        work = TakeWork(seat);  // nullopt: a cancelled call, reported.
      }
      *more = !work_.empty() && !stopping_;
      if (!results_.empty() && !drain_posted_ &&
          (!work.has_value() || slow || results_.size() >= kHandBack)) {
        drain_posted_ = true;
        post = true;
      }
      if (!work.has_value()) {
        ReleaseSeat(seat);
        seat = nullptr;
      } else if (*more && !asked_for_help) {
        // More calls wait than the one this thread takes: another thread
        // may start on them (a client blocking on IO gets one thread per
        // call; a fast one's calls are all run here before help comes).
        asked_for_help = true;
        help = pool_;
      }
    }
    if (post) PostDrain();
    if (help != nullptr) help->Notify(this);
    if (!work.has_value()) return ran;
    ++ran;
    done = Execute(*work, seat->stop);
    const SteadyClock::time_point now = SteadyClock::now();
    slow = now - last >= kSlowCall;
    last = now;
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::DrainResults() {
  // Swaps buffers with the updaters: both keep their capacity.
  std::vector<Result>& results = draining_;
  {
    MutexLock l(&mu_);
    results.swap(results_);
    drain_posted_ = false;
  }
  absl::Time now = clock_->Now();
  for (Result& r : results) ApplyResult(r, now);
  results.clear();
  Dispatch(now);
}

template <class K, class D, class O>
void Syncer<K, D, O>::ApplyResult(Result& r, absl::Time now) {
  // No lookup: the entry stays while its operation is in flight.
  Slot* it = r.slot;
  if (it->second.in_flight == SyncOp::kNone) {
    // Cannot happen: entries stay while an operation is in flight.
    SPDLOG_LOGGER_ERROR(logger_,
                        "syncer result without an operation syncer={} key={}",
                        name(), internal::KeyForLog(r.key));
    return;
  }
  Entry& e = it->second;
  e.in_flight = SyncOp::kNone;
  --in_flight_;
  if (r.epoch != e.epoch || !Selected(r.key)) {
    counters_.results_discarded.fetch_add(1, std::memory_order_relaxed);
    Bump(cells_.discarded);
    if (IsStaleOwner(r.status)) {
      // A stale writer's refusal that came back after the key left (a pod
      // that froze and thawed): still a refusal operators must see.
      counters_.stale_refusals.fetch_add(1, std::memory_order_relaxed);
      Bump(cells_.stale_refusals);
      CountOp(r.op, kStale);
    }
    SPDLOG_LOGGER_INFO(logger_,
                       "syncer result discarded, key left the range "
                       "syncer={} key={} op={}: {}",
                       name(), internal::KeyForLog(r.key), SyncOpName(r.op),
                       r.status);
    if (Selected(r.key)) {
      MarkDirty(*it);
    } else {
      MaybeErase(*it);
    }
    return;
  }
  if (!r.started) {
    // Handed over but never started: the intent is still pending. At Stop
    // nothing more runs; a call refused by Fence before Rescope caught up is
    // worked out again later (by then Rescope has usually forgotten it).
    e.last_error = r.status;
    if (!stopped_on_runner_) WakeAt(*it, now + options_.backoff.initial);
    return;
  }
  if (IsStaleOwner(r.status) && e.in_flight_values != call_values_version_) {
    // Refused under values SetCallValues has replaced since: that says
    // nothing of the new ones, under which the key is tried again now.
    counters_.stale_refusals.fetch_add(1, std::memory_order_relaxed);
    Bump(cells_.stale_refusals);
    CountOp(r.op, kStale);
  } else if (IsStaleOwner(r.status)) {
    // The system saw a newer owner's token: not ours to retry under this
    // assignment; a new one (SetCallValues) lets the key try again.
    counters_.stale_refusals.fetch_add(1, std::memory_order_relaxed);
    Bump(cells_.stale_refusals);
    CountOp(r.op, kStale);
    e.stale = true;
    e.last_error = r.status;
    ++e.failures;
    if (!stale_logged_) {
      stale_logged_ = true;
      SPDLOG_LOGGER_WARN(logger_,
                         "syncer {} refused as a stale owner, not retried "
                         "under this assignment syncer={} key={}: {}",
                         SyncOpName(r.op), name(), internal::KeyForLog(r.key),
                         r.status);
    }
  } else if (r.status.ok()) {
    CountOp(r.op, kSuccess);
    switch (r.op) {
      case SyncOp::kCreate:
        counters_.creates.fetch_add(1, std::memory_order_relaxed);
        break;
      case SyncOp::kUpdate:
        counters_.updates.fetch_add(1, std::memory_order_relaxed);
        break;
      case SyncOp::kDelete:
        counters_.deletes.fetch_add(1, std::memory_order_relaxed);
        break;
      case SyncOp::kNone:
        break;
    }
    e.failures = 0;
    e.terminal = false;
    e.last_error = absl::OkStatus();
    e.not_before = absl::InfinitePast();
    Unexpect(*it);
    e.expect_op = r.op;
    e.expect_observed_seq = r.observed_seq;
    e.expect_until = now + options_.expectation_timeout;
    SETPOINT_LOG_DEBUG(logger_, "syncer {} done syncer={} key={}",
                       SyncOpName(r.op), name(), internal::KeyForLog(r.key));
  } else if (IsTerminal(r.status)) {
    counters_.terminal_failures.fetch_add(1, std::memory_order_relaxed);
    CountOp(r.op, kTerminal);
    e.terminal = true;
    e.terminal_version = r.desired_version;
    e.terminal_observed_seq = r.observed_seq;
    e.last_error = r.status;
    ++e.failures;
    WarnFailure(now,
                "syncer {} failed terminally, not retried until the key "
                "changes syncer={} key={}: {}",
                SyncOpName(r.op), name(), internal::KeyForLog(r.key), r.status);
  } else {
    counters_.failures.fetch_add(1, std::memory_order_relaxed);
    CountOp(r.op, kError);
    Bump(cells_.retries);
    if (r.threw) counters_.client_threw.fetch_add(1, std::memory_order_relaxed);
    ++e.failures;
    std::optional<absl::Duration> hint = RetryAfterHint(r.status);
    absl::Duration delay =
        hint.has_value()
            ? *hint
            : BackoffDelay(options_.backoff, static_cast<int>(e.failures - 1),
                           std::uniform_real_distribution<double>(0, 1)(rng_));
    e.not_before = now + delay;
    e.last_error = r.status;
    // One warning per warning_interval for the whole syncer, with the
    // count of the others: visible, not a flood (StatusSnapshot lists every
    // failing key).
    WarnFailure(now,
                "syncer {} failed, retrying syncer={} key={} failures={} "
                "retry_in={}: {}",
                SyncOpName(r.op), name(), internal::KeyForLog(r.key),
                e.failures, delay, r.status);
  }
  Evaluate(*it, now);
}

template <class K, class D, class O>
SyncerStatus<K> Syncer<K, D, O>::StatusSnapshot(size_t max_failures) const {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  SyncerStatus<K> s;
  s.in_sync = InSync();
  absl::Time now = clock_->Now();
  for (const Slot& slot : entries_) {
    const Entry& e = slot.second;
    if (!e.desired.has_value() && !e.observed.has_value()) {
      if (e.in_flight != SyncOp::kNone) ++s.in_flight;
      continue;  // Forgotten, waiting for its result.
    }
    ++s.keys;
    if (e.unconverged_since < now) {
      s.longest_pending =
          std::max(s.longest_pending, now - e.unconverged_since);
    }
    if (e.in_flight != SyncOp::kNone) {
      ++s.in_flight;
    } else if (e.expect_op != SyncOp::kNone && now < e.expect_until) {
      ++s.awaiting_observation;
    } else if (e.terminal) {
      ++s.terminal;
    } else if (Compute(e) == SyncOp::kNone) {
      ++s.converged;
    } else if (e.stale) {
      ++s.stale;
    } else if (e.failures > 0) {
      ++s.failing;
    } else {
      ++s.pending;
    }
    if (e.failures > 0 && !e.last_error.ok() &&
        s.failures.size() < max_failures && e.in_flight == SyncOp::kNone) {
      s.failures.push_back(SyncerKeyFailure<K>{
          slot.first, e.last_error, static_cast<int>(e.failures), e.terminal,
          e.terminal || e.stale ? absl::InfiniteFuture() : e.not_before});
    }
  }
  return s;
}

template <class K, class D, class O>
const D* Syncer<K, D, O>::desired(const K& key) const {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  auto it = entries_.find(key);
  return it == entries_.end() || !it->second.desired.has_value()
             ? nullptr
             : &*it->second.desired;
}

template <class K, class D, class O>
const O* Syncer<K, D, O>::observed(const K& key) const {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  auto it = entries_.find(key);
  return it == entries_.end() || !it->second.observed.has_value()
             ? nullptr
             : &*it->second.observed;
}

template <class K, class D, class O>
SyncerStats Syncer<K, D, O>::stats() const {
  auto get = [](const std::atomic<int64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  return SyncerStats{
      .creates = get(counters_.creates),
      .updates = get(counters_.updates),
      .deletes = get(counters_.deletes),
      .failures = get(counters_.failures),
      .terminal_failures = get(counters_.terminal_failures),
      .client_threw = get(counters_.client_threw),
      .results_discarded = get(counters_.results_discarded),
      .ignored_out_of_range = get(counters_.ignored_out_of_range),
      .not_started_at_stop = get(counters_.not_started_at_stop),
      .calls_cancelled = get(counters_.calls_cancelled),
      .stale_refusals = get(counters_.stale_refusals),
  };
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SYNCER_H_
