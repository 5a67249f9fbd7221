// Syncer: drives the world towards the desired state, key by key. It holds
// desired and observed state on the runner, works out create / update /
// delete per key, and hands the operations to updater threads, which call
// the user's client (one call per operation, or many operations per batch
// call); results come back to the runner as events.
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
// Guarantees (docs/syncer.md has the details and the defaults), for every
// operation, alone or inside a batch call:
// - Bursts coalesce: a key's operation is worked out from its latest
//   desired and observed values when there is room for it, so 1,000
//   updates while an operation runs lead to at most one more operation.
// - At most one operation per key in flight, at most max_in_flight
//   overall, optionally rate limited (token bucket) and delayed
//   (execution_delay). A batch client gets up to max_batch operations of
//   different keys per call, max_batches_in_flight calls at once.
// - A failed operation is retried for its key with capped exponential
//   backoff and jitter (10 ms -> 30 s), reset on success. A retry-after
//   hint (WithRetryAfter) replaces the delay. Terminal codes are not
//   retried until the key's desired or observed value changes.
// - When the world is unreachable (pause_codes from many keys in a row),
//   writes pause: one probe call at a time, backing off to at most 1 s,
//   until the world answers; no key's failures or backoff grow meanwhile.
// - Read-your-own-writes: after a successful operation the key waits until
//   the observed state shows it (or expectation_timeout passes).
// - Nothing acts on a partial view: while the syncer is out of sync (an
//   observed store, or the desired producer, is), no operation starts.
// - Rescope(filter) forgets keys outside a new shard range without
//   deleting them; their calls are cancelled (a batch call holding one is
//   cancelled, and its other operations are tried again without counting
//   a failure), and calls handed over but not started never start.
//   AwaitCallsWithin(filter, ctx) then waits until none of them runs.
// - Every call's context carries the values given to SetCallValues (a
//   controller puts the shard assignment there). A call refused as a stale
//   owner (IsStaleOwner) is counted and not retried until SetCallValues.
// - A client that throws is caught (CallUserCode): the operation failed
//   with kInternal and is retried.
//
// Wiring for a shard-range change: Rescope(filter) on every syncer, store
// and source, in the same runner event; then, off the runner,
// AwaitCallsWithin(filter, ctx). setpoint::Controller does all of it.
//
// Thread safety: everything runs on the runner thread except Start(),
// Stop() and RunUntilIdle(), which belong to the owner thread, and stats(),
// Fence() and AwaitCallsWithin(), which are safe from any thread (the last
// one not from the runner's). The client is called on the updater threads.
// Destroy a syncer after its runner stopped or on the runner thread: events
// it posted earlier and the stores it observes then find it gone.
#ifndef SETPOINT_PROCESSOR_SYNCER_H_
#define SETPOINT_PROCESSOR_SYNCER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <queue>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/status.h"
#include "setpoint/base/token_bucket.h"
#include "setpoint/processor/internal/call_dispatcher.h"
#include "setpoint/processor/internal/sync_rules.h"
#include "setpoint/processor/internal/sync_table.h"
#include "setpoint/processor/internal/syncer_counters.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/sync_types.h"
#include "setpoint/processor/synchronizable.h"
#include "setpoint/processor/transformer.h"
#include "setpoint/processor/updater_pool.h"
#include "spdlog/logger.h"

namespace setpoint {

// What the Syncer calls to change the world, one key per call. Called on
// updater threads, up to max_in_flight calls at once, never two for the
// same key at once. Return OK on success; an error the Syncer classifies
// (terminal or retried); WithRetryAfter(status, d) to ask for a later
// retry; StaleOwnerError when the system refused the write's fencing
// token. `ctx` is cancelled when the Syncer stops or the key leaves its
// range, and carries the values given to SetCallValues (AssignmentOf).
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

// One operation of a batch call. `desired` is set for creates and updates,
// `observed` for updates and deletes. The client sets `status` when this
// operation failed (it starts OK).
template <class K, class D, class O>
struct SyncOperation {
  SyncOp op = SyncOp::kNone;
  const K* key = nullptr;
  const D* desired = nullptr;
  const O* observed = nullptr;
  absl::Status status;
};

// What the Syncer calls to change the world, many keys per call (one
// PATCH of many rrsets, one ChangeResourceRecordSets): for APIs that take
// batches or allow one writer at a time. `ops` holds up to max_batch
// operations of different keys. Return an error when the whole call failed
// (every operation failed with it), or OK with each operation's own
// status set where it failed. The call may block its updater thread for as
// long as the API takes; it never waits for other keys' calls. `ctx` is as
// for SyncerClient: it is cancelled when any key of the batch leaves the
// range (the other keys are tried again without counting a failure).
template <class K, class D, class O>
class BatchSyncerClient {
 public:
  virtual ~BatchSyncerClient() = default;
  virtual absl::Status Apply(const Context& ctx,
                             std::span<SyncOperation<K, D, O>> ops) = 0;
};

template <class D, class O>
struct SyncerOptions {
  // Names the syncer in logs, metrics and the sync graph.
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
  // Operations handed to the updaters and not finished, at most: running,
  // or queued for a thread (or a batch). Their values are taken when they
  // are handed over. 0 picks the default.
  // Default: 64 for a SyncerClient; max_batch * (max_batches_in_flight +
  // 1) for a BatchSyncerClient (the next batch fills while one runs).
  int max_in_flight = 0;
  // Threads of the private updater pool (without `pool`). 0: one per
  // max_in_flight slot, at most 8 (a SyncerClient); max_batches_in_flight
  // (a BatchSyncerClient).
  // Default: 0.
  int updater_threads = 0;
  // A pool shared with other syncers (a pod's nodes): calls run on its
  // threads and updater_threads is not used. It must outlive Stop().
  // Default: null (the syncer owns a private pool).
  UpdaterPool* pool = nullptr;
  // Batch clients: operations per call, at most (>= 1).
  // Default: 100.
  int max_batch = 100;
  // Batch clients: when no batch call runs, how long the first ready
  // operation waits for others to join it before a call starts.
  // Default: 2 ms.
  absl::Duration batch_delay = absl::Milliseconds(2);
  // Batch clients: batch calls running at once (>= 1); 1 suits APIs that
  // allow one writer at a time.
  // Default: 1.
  int max_batches_in_flight = 1;
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
  // Per-key retry delays after a failure. They start short, as client-go's
  // per-item limiter does (5 ms), because a busy API frees up within
  // milliseconds, and end at a short cap, because a world that is down
  // pauses the syncer instead (pause_after).
  // Default: 10 ms doubling to 30 s, jitter 0.2.
  BackoffOptions backoff = {.initial = absl::Milliseconds(10),
                            .max = absl::Seconds(30),
                            .multiplier = 2,
                            .jitter = 0.2};
  // Codes that are not retried (until the key's desired or observed value
  // changes).
  // Default: TerminalErrorCodes().
  std::vector<absl::StatusCode> terminal_codes = TerminalErrorCodes();
  // Failures with pause_codes in a row (no answer from the world between
  // them), from at least two keys, that pause writes: then one probe call
  // at a time, with pause_probe delays, until the world answers. 0: never.
  // Default: 8.
  int pause_after = 8;
  // Default: kUnavailable, kDeadlineExceeded (map "connection refused" to
  // kUnavailable in your client).
  std::vector<absl::StatusCode> pause_codes = {
      absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded};
  // Default: 250 ms doubling to 1 s, jitter 0.2.
  BackoffOptions pause_probe = {.initial = absl::Milliseconds(250),
                                .max = absl::Seconds(1),
                                .multiplier = 2,
                                .jitter = 0.2};
  // After a successful operation, how long to wait for the observed state to
  // show it before working the key out again anyway.
  // Default: 30 s.
  absl::Duration expectation_timeout = absl::Seconds(30);
  // Each client call (or batch call) gets a context with this deadline.
  // Zero: none.
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
  // No updater threads: calls run when the owner calls RunUntilIdle(), on
  // its thread (deterministic tests of a whole controller).
  // Default: false.
  bool manual_updates = false;
  // Where operations are counted (setpoint_syncer_*, docs/operations.md),
  // labelled with metric_labels and syncer=<name>; PublishStatusMetrics()
  // sets the keys-by-state gauges.
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

// The state of every key at one moment, for operators and tests. The
// states' names are those of the setpoint_syncer_keys gauge.
template <class K>
struct SyncerStatus {
  bool in_sync = false;   // False: its inputs are incomplete; nothing acts.
  int64_t keys = 0;       // Tracked keys (desired or observed).
  int64_t converged = 0;  // Nothing to do.
  int64_t pending = 0;    // Something to do, not started, not failing
                          // (waiting for an updater, the rate limit,
                          // execution_delay, a batch, the pause or a
                          // disabled switch).
  int64_t in_flight = 0;
  int64_t awaiting_observation = 0;  // Done, waiting to see it observed.
  int64_t backing_off = 0;           // Last operation failed; retried after its
                                     // backoff.
  int64_t terminal = 0;              // Failed terminally; not retried.
  int64_t stale = 0;  // Refused as a stale owner; waits for SetCallValues.
  // How long the key that has waited longest for the world to match has
  // waited (zero when every key is converged).
  absl::Duration longest_pending = absl::ZeroDuration();
  // Writes paused because the world is unreachable: since when, and the
  // error that says so. InfiniteFuture when not paused.
  bool paused = false;
  absl::Time paused_since = absl::InfiniteFuture();
  absl::Status pause_error;
  std::vector<SyncerKeyFailure<K>> failures;  // At most max_failures.
};

template <class K, class D, class O>
class Syncer : public Synchronizable,
               public DesiredSink<K, D>,
               private internal::CallDispatcher::Host {
 public:
  using Client = SyncerClient<K, D, O>;
  using BatchClient = BatchSyncerClient<K, D, O>;
  using Options = SyncerOptions<D, O>;

  Syncer(Runner* runner, Client* client, Options options = {});
  Syncer(Runner* runner, BatchClient* client, Options options = {});
  // Calls Stop().
  ~Syncer() override;

  // Starts the updater threads. kInvalidArgument naming the field for bad
  // options; kFailedPrecondition if started twice.
  absl::Status Start();
  // Owner thread. Stops the updaters: operations in progress finish (their
  // context is cancelled) and their results go to the runner; operations
  // handed over but not started are counted and reported back as not
  // done. Intents still pending are logged with their count. Idempotent.
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
  // it. Runner thread.
  void MarkDesiredComplete() { SetSelfSynced(true); }

  // Observed state, when not fed by ObserveFrom (runner thread).
  void SetObserved(K key, O observed);
  void DeleteObserved(const K& key);

  // Re-scopes the syncer to `filter` (a new shard range): keys outside it
  // are forgotten, never deleted; their calls in flight are cancelled, and
  // those handed over but not started never start. Runner thread.
  void Rescope(KeyFilter<K> filter);
  // Any thread: from now on no call starts for a key `filter` rejects, and
  // the calls running or handed over for such keys are cancelled at once,
  // without waiting for the runner. Rescope(filter) on the runner follows;
  // it sets the same filter. An empty filter allows every key.
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
  // posts the results to the runner. Returns how many operations ran.
  int RunUntilIdle();

  // Per-operation switches (runner thread).
  void EnableCreate(bool on) { SetSwitch(&rules_.create, on); }
  void EnableUpdate(bool on) { SetSwitch(&rules_.update, on); }
  void EnableDelete(bool on) { SetSwitch(&rules_.delete_, on); }

  // Runner thread: the state of every key; lists up to `max_failures`
  // failing keys.
  SyncerStatus<K> StatusSnapshot(size_t max_failures = 100) const;
  // Runner thread: the desired / observed value of `key`, or nullptr.
  const D* desired(const K& key) const;
  const O* observed(const K& key) const;
  // Any thread.
  SyncerStats stats() const { return counters_.Read(); }
  // Runner thread: sets the gauges of options.metrics from a StatusSnapshot
  // (keys by state, in sync, paused, longest pending age). O(keys); a
  // Controller calls it once per status interval. No-op without metrics.
  void PublishStatusMetrics();

 protected:
  void OnSynced() override;
  void OnLostSync() override;

 private:
  using Table = internal::SyncTable<K, D, O>;
  using Slot = typename Table::Slot;
  // One operation handed to the dispatcher, with copies of its values. The
  // key is its slot's: a slot with an operation in flight is never erased.
  struct Work : internal::DispatchedCall {
    const K* key = nullptr;
    std::optional<D> desired;
    std::optional<O> observed;
    SyncOp op = SyncOp::kNone;
    bool probe = false;  // Sent while paused.
    uint32_t epoch = 0;
    uint32_t desired_version = 0;
    uint32_t observed_seq = 0;
  };
  struct Wake {
    int64_t when;
    uint32_t slot;
    bool operator>(const Wake& o) const { return when > o.when; }
  };

  Syncer(Runner* runner, Client* client, BatchClient* batch, Options options);
  static Options WithDefaults(Options o, bool batch);
  absl::Status Validate() const;

  bool Selected(const K& key) const { return !filter_ || filter_(key); }
  void Desire(K key, D desired, bool check);
  void Observe(K key, O observed, bool check);
  void ForgetObserved(const K& key);
  bool DesiredEqual(const D& a, const D& b) const;
  SyncOp Compute(const Slot& s) const;
  void SetSwitch(bool* field, bool on);

  void MarkDirty(uint32_t id);
  void SchedulePump();
  void Pump();
  // Works the key out again: nothing, a wait, or ready to start.
  void Evaluate(uint32_t id, int64_t now);
  void WakeAt(uint32_t id, int64_t when);
  void ArmTimer(int64_t when);
  void OnTimer();
  // Hands ready operations over, as the limits, the pause and batching
  // allow.
  void Dispatch(int64_t now);
  // Takes one ready key off the queue into `batch`; false when none may.
  bool HandOver(int64_t now, std::vector<internal::DispatchedCall*>& batch);
  Work* NewWork();
  void MaybeErase(uint32_t id);
  void Erase(uint32_t id);
  void Expect(uint32_t id);
  void Unexpect(uint32_t id);

  // internal::CallDispatcher::Host (updater threads).
  void Execute(const Context& ctx,
               std::span<internal::DispatchedCall* const> calls) override;
  void ResultsReady() override;
  void DrainResults();
  void ApplyResult(Work& w, int64_t now);
  // The world answers again after a pause.
  void Resume(int64_t now);
  // Logs a failure as a warning unless one was logged less than
  // warning_interval ago (then at debug level, counted for the next one).
  void WarnFailure(int64_t now, const Work& w, const char* what,
                   absl::Duration retry_in);

  Runner* const runner_;
  Client* const client_;
  BatchClient* const batch_client_;
  Options options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;
  internal::KeyRules rules_;
  internal::PauseRules pause_rules_;
  internal::SyncerCounters counters_;
  internal::CallDispatcher dispatcher_;
  std::unique_ptr<UpdaterPool> own_pool_;  // Owner thread (Start, Stop).
  bool stop_called_ = false;               // Owner thread.

  // Runner-only state.
  Table table_;
  KeyFilter<K> filter_;
  uint32_t epoch_ = 0;
  std::vector<uint32_t> dirty_;
  std::vector<uint32_t> pumping_;  // Pump's copy of dirty_, for capacity.
  size_t with_desired_ = 0;        // Entries with a desired value.
  std::deque<uint32_t> ready_;
  int64_t ready_since_ = internal::kFuture;  // ready_ not empty since.
  std::priority_queue<Wake, std::vector<Wake>, std::greater<>> wakes_;
  uint32_t expect_head_ = internal::kNoSlot;
  uint32_t expect_tail_ = internal::kNoSlot;
  std::vector<internal::DispatchedCall*> handing_;  // Dispatch's batch.
  std::vector<internal::DispatchedCall*> draining_;
  std::vector<std::unique_ptr<Work>> works_;  // Every Work made.
  std::vector<Work*> free_works_;
  TimerHandle timer_;
  int64_t timer_at_ = internal::kFuture;
  bool stopped_on_runner_ = false;  // Stop() reached the runner.
  bool pump_posted_ = false;
  int in_flight_ = 0;
  TokenBucket bucket_;
  internal::WorldPause pause_;
  std::mt19937_64 rng_;
  Context call_values_;
  uint32_t call_values_version_ = 0;  // Counts SetCallValues.
  bool stale_logged_ = false;         // Since the last SetCallValues.
  int64_t last_warning_ = internal::kPast;
  int64_t warnings_suppressed_ = 0;

  // Expires when the syncer is destroyed. Events posted to the runner and
  // store listeners hold a weak reference and do nothing once it expired.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace setpoint

#include "setpoint/processor/internal/syncer_calls.h"  // IWYU pragma: export

#endif  // SETPOINT_PROCESSOR_SYNCER_H_
