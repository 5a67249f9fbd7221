// Sources: where observed state comes from. A source lists (or watches) the
// world off the runner and posts Set / Delete / Synced / LostSync to a Store
// on the runner.
//
//   Store<std::string, Vm> vms;
//   PollingSource<std::string, Vm> source(
//       &runner, &vms,
//       [&](const Context& ctx)
//           -> absl::StatusOr<absl::flat_hash_map<std::string, Vm>> {
//         return cloud.ListVms(ctx);
//       },
//       {.interval = absl::Seconds(5)});
//   source.Start();
//   ...
//   source.Rescope([range](const std::string& k) {
//     return range.Contains(ShardOf(k));
//   });
//
// PollingSource lists every `interval`, diffs against its previous list
// (SourceCache) and posts only the changes. The store is in sync after the
// first good list; after `lose_sync_after` failed lists in a row it loses
// sync (the syncer then pauses) until a list succeeds again. Failed lists
// back off (100 ms doubling to 30 s, jittered) instead of waiting
// `interval`. WatchSource (watch_source.h) lists once and then follows a
// stream of changes; SharedSource (shared_source.h) feeds the stores of
// several nodes from one list or watch.
//
// Threads: a source has none of its own. Its lists run on a
// SourceExecutor (`executor`, shared by a pod's sources), holding one of
// its threads while a list is in progress; without one it owns a private
// executor of one thread.
//
// With `manual` set, Start() starts nothing: the owner lists by calling
// RunUntilIdle() when NextWakeTime() comes on the source's clock, for
// deterministic tests of whole controllers on a simulated clock:
//
//   PollingSource<std::string, Vm> source(&runner, &vms, list,
//                                         {.clock = &clock, .manual = true});
//   source.Start();
//   source.RunUntilIdle();    // the first list, on this thread
//   runner.RunUntilIdle();
//   clock.AdvanceTo(source.NextWakeTime());
//
// PushSource is for inputs the user drives: the user's own thread calls
// Set, Delete, Replace, MarkSynced and MarkLostSync.
//
// Rescope (runner thread): the store forgets keys outside the new filter
// (not a delete), loses sync, and the source lists again within it at once;
// a list begun under the old filter is dropped. A PushSource calls its
// on_filter_change so the user can re-list (Replace + MarkSynced).
//
// Shutdown order: Stop() the sources, then the syncer, then the runner; then
// destroy them. Posts after the runner stopped are refused and logged.
//
// Thread safety: Rescope on the runner thread; Start/Stop and RunUntilIdle on
// the owner thread; Trigger, NextWakeTime, AwaitFresh, Snapshot, status and
// stats from any thread; PushSource's Set/Delete/Replace/Mark* from any
// thread.
#ifndef SETPOINT_PROCESSOR_SOURCE_H_
#define SETPOINT_PROCESSOR_SOURCE_H_

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source_cache.h"
#include "setpoint/processor/source_driver.h"
#include "setpoint/processor/source_executor.h"
#include "setpoint/processor/source_health.h"
#include "setpoint/processor/store.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {

// The backoff a source waits after a failure when its options do not say:
// 100 ms doubling to 30 s, each delay shortened by up to 20 %.
inline BackoffOptions DefaultSourceBackoff() {
  return {.initial = absl::Milliseconds(100),
          .max = absl::Seconds(30),
          .multiplier = 2.0,
          .jitter = 0.2};
}

// The common part of sources: the store it feeds, the filter and its
// generation, and posting updates to the runner.
template <class K, class V>
class Source {
 public:
  Source(Runner* runner, Store<K, V>* store,
         std::shared_ptr<spdlog::logger> logger)
      : runner_(runner),
        store_(store),
        logger_(logger != nullptr ? std::move(logger)
                                  : spdlog::default_logger()) {
    store_->BindRunner(runner_);
  }
  virtual ~Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;

  // Runner thread. Re-scopes the store and the source to `filter`.
  void Rescope(KeyFilter<K> filter) {
    SETPOINT_DCHECK_ON_RUNNER(runner_);
    uint64_t generation = store_->Rescope(filter);
    {
      MutexLock l(&mu_);
      filter_ = std::move(filter);
      generation_ = generation;
    }
    OnFilterChanged();
  }

  // Updates that could not be posted because the runner had stopped.
  virtual int64_t updates_refused() const { return refused_.load(); }

  Store<K, V>* store() const { return store_; }

 protected:
  // Called after Rescope, on the runner thread.
  virtual void OnFilterChanged() = 0;

  // The filter and its generation, for the source's own thread.
  std::pair<KeyFilter<K>, uint64_t> CurrentFilter() const {
    MutexLock l(&mu_);
    return {filter_, generation_};
  }
  uint64_t CurrentGeneration() const {
    MutexLock l(&mu_);
    return generation_;
  }

  // Any thread: applies `update` to the store on the runner.
  void Post(StoreUpdate<K, V> update, const char* origin) {
    Store<K, V>* store = store_;
    absl::Status posted = runner_->Post(
        [store, update = std::move(update)]() mutable {
          store->Apply(std::move(update));
        },
        origin);
    if (!posted.ok()) {
      ++refused_;
      SPDLOG_LOGGER_WARN(logger_, "source update refused store={}: {}",
                         store_->name(), posted);
    }
  }

  Runner* const runner_;
  Store<K, V>* const store_;
  const std::shared_ptr<spdlog::logger> logger_;

 private:
  mutable Mutex mu_;
  KeyFilter<K> filter_ ABSL_GUARDED_BY(mu_);
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> refused_{0};
};

template <class V>
struct PollingSourceOptions {
  // Names the source in logs, /statusz and metrics.
  // Default: "poll".
  std::string name = "poll";
  // Time between the end of a good list and the start of the next.
  // Default: 10 s.
  absl::Duration interval = absl::Seconds(10);
  // Each List call gets a context with this deadline. Zero: none.
  // Default: 30 s.
  absl::Duration list_timeout = absl::Seconds(30);
  // The store loses sync after this many failed lists in a row (>= 1).
  // Default: 3.
  int lose_sync_after = 3;
  // Waits after a failed list, instead of `interval`; a good list starts
  // it over.
  // Default: DefaultSourceBackoff(): 100 ms doubling to 30 s, jitter 0.2.
  BackoffOptions backoff = DefaultSourceBackoff();
  // Same-value test for the diff; keep it equal to the store's.
  // Default: operator==.
  std::function<bool(const V&, const V&)> equal = nullptr;
  // Default: the runner's clock (Runner::clock()).
  Clock* clock = nullptr;
  // The threads lists run on (a pod's sources share one; its clock must be
  // the source's). Must outlive the source's Stop().
  // Default: null (a private executor of one thread).
  SourceExecutor* executor = nullptr;
  // Where setpoint_source_* are published (docs/operations.md), labelled
  // with metric_labels and source=<name>.
  // Default: none.
  MetricsRegistry* metrics = nullptr;
  MetricLabels metric_labels = {};
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
  // No threads: the owner lists by calling RunUntilIdle() (tests on a simulated
  // clock).
  // Default: false.
  bool manual = false;
};

// Counters for operators and tests.
struct PollingSourceStats {
  int64_t lists = 0;  // List calls that returned.
  int64_t list_failures = 0;
  int64_t consecutive_failures = 0;
  int64_t changes_posted = 0;  // Keys set or deleted in the cache.
};

namespace source_internal {

// A driver that feeds a SourceCache and records what it does in a
// SourceHealth: the engine of every cached source.
template <class K, class V>
class CachedDriver : public SourceDriver {
 public:
  using Map = absl::flat_hash_map<K, V>;

  SourceCache<K, V>& cache() { return cache_; }
  const SourceCache<K, V>& cache() const { return cache_; }
  SourceHealth& health() { return health_; }
  const SourceHealth& health() const { return health_; }

  // Any thread: the next step lists, whatever it was going to do, and
  // counts a relist for `why`.
  virtual void RequestRelist(SourceRelist why) = 0;

 protected:
  CachedDriver(SourceDriverOptions driver, SourceCacheOptions<V> cache,
               SourceHealthOptions health)
      : SourceDriver(std::move(driver)),
        cache_(std::move(cache)),
        health_(std::move(health)) {}
  // Tells the health what the cache holds now.
  void PublishView() {
    health_.SetView(cache_.InSync(), static_cast<int64_t>(cache_.size()));
  }

  SourceCache<K, V> cache_;
  SourceHealth health_;
};

// Calls `fn(args...)`, turning a throw into kInternal ("<what> threw: ...").
// (CallUserCode, the one boundary for user callbacks.)
template <class R, class Fn, class... Args>
absl::StatusOr<R> CallCatching(const char* what, Fn& fn, Args&&... args) {
  absl::StatusOr<R> out = CallUserCode(what, [&]() -> absl::StatusOr<R> {
    return fn(std::forward<Args>(args)...);
  });
  return out;
}

// The options' errors, for the sources' Validate.
absl::Status ValidateCommon(const std::string& what, const std::string& name,
                            absl::Duration list_timeout, int lose_sync_after,
                            const BackoffOptions& backoff);

// Lists every interval; a failed list backs off and, lose_sync_after in a
// row, makes the cache lose sync.
template <class K, class V>
class PollDriver final : public CachedDriver<K, V> {
 public:
  using Map = absl::flat_hash_map<K, V>;
  using ListFn = absl::AnyInvocable<absl::StatusOr<Map>(const Context&)>;

  PollDriver(ListFn list, PollingSourceOptions<V> options, bool filtered,
             bool shared);
  ~PollDriver() override { this->Stop(); }

  void RequestRelist(SourceRelist why) override;
  PollingSourceStats stats() const;
  const PollingSourceOptions<V>& options() const { return options_; }

 protected:
  absl::Status Validate() const override;
  typename SourceDriver::StepResult Step(const Context& ctx) override;

 private:
  ListFn list_;
  const PollingSourceOptions<V> options_;
  std::atomic<int64_t> changes_posted_{0};
  Mutex mu_;
  // A relist was asked for (counted when its list lands).
  std::optional<SourceRelist> relist_ ABSL_GUARDED_BY(mu_);
  // Touched only inside Step (one at a time, on whichever thread drives
  // the source). std::mt19937_64, not absl::BitGen: Debian's prebuilt
  // Abseil seeds BitGen from a pool ThreadSanitizer reports as racing.
  std::mt19937_64 jitter_;
};

}  // namespace source_internal

// A store filled by listing the whole state with `list` every interval.
template <class K, class V>
class PollingSource : public Source<K, V> {
 public:
  using Map = absl::flat_hash_map<K, V>;
  using ListFn = absl::AnyInvocable<absl::StatusOr<Map>(const Context&)>;

  PollingSource(Runner* runner, Store<K, V>* store, ListFn list,
                PollingSourceOptions<V> options = {});
  // Calls Stop().
  ~PollingSource() override { Stop(); }

  // Starts listing (the first list at once); in manual mode starts
  // nothing. kFailedPrecondition if already started, or if the executor
  // is not running; kInvalidArgument naming the field for bad options
  // (interval <= 0, list_timeout < 0, lose_sync_after < 1, bad backoff),
  // and then nothing starts.
  absl::Status Start() { return driver_.Start(); }
  // Cancels a list in progress (its context) and waits for it. Idempotent.
  void Stop() { driver_.Stop(); }
  // Lists again now instead of at the end of the interval (any thread).
  void Trigger() { driver_.Trigger(); }

  // Manual mode, owner thread, between Start() and Stop(): lists once, on
  // the calling thread, if a list is due now on the source's clock (see
  // NextWakeTime), and posts the changes to the store as the thread would.
  // Returns whether it listed; false when not due, not in manual mode, not
  // started or stopped.
  bool RunUntilIdle() { return driver_.RunUntilIdle(); }
  // When the next list is due: absl::InfinitePast() when it is due now (the
  // first list, after Trigger() or a filter change, or once the time came);
  // otherwise the end of the last list plus the interval (after a good list)
  // or the backoff (after a failed one).
  absl::Time NextWakeTime() const { return driver_.NextWakeTime(); }
  // Returns once a list that began after the call landed (the store has it
  // queued on the runner; Snapshot has it): OK, or that list's error. See
  // SourceDriver::AwaitFresh.
  absl::Status AwaitFresh(const Context& ctx) {
    return driver_.AwaitFresh(ctx);
  }
  // The last list, within the filter. Any thread.
  Map Snapshot() const { return driver_.cache().Snapshot(); }

  // Any thread.
  PollingSourceStats stats() const { return driver_.stats(); }
  SourceStatus status() const { return driver_.health().status(); }
  const SourceHealth& health() const { return driver_.health(); }
  int64_t updates_refused() const override {
    return driver_.cache().updates_refused();
  }

 protected:
  void OnFilterChanged() override {
    auto [filter, generation] = this->CurrentFilter();
    if (driver_.cache().Rescope(sub_, std::move(filter), generation)) {
      driver_.RequestRelist(SourceRelist::kRange);
    }
  }

 private:
  static PollingSourceOptions<V> Defaults(Runner* runner,
                                          PollingSourceOptions<V> o) {
    if (o.clock == nullptr) o.clock = runner->clock();
    return o;
  }

  source_internal::PollDriver<K, V> driver_;
  const int64_t sub_;
};

template <class K, class V>
struct PushSourceOptions {
  // Called on the runner after Rescope: list again within the new filter
  // and call Replace(...) then MarkSynced().
  // Default: none (the store stays out of sync until MarkSynced).
  std::function<void(const KeyFilter<K>&)> on_filter_change = nullptr;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// A source the user drives from a watch stream or callbacks.
template <class K, class V>
class PushSource : public Source<K, V> {
 public:
  PushSource(Runner* runner, Store<K, V>* store,
             PushSourceOptions<K, V> options = {})
      : Source<K, V>(runner, store, options.logger),
        on_filter_change_(std::move(options.on_filter_change)) {}

  void Set(K key, V value) {
    StoreUpdate<K, V> u{.generation = this->CurrentGeneration()};
    u.sets.emplace_back(std::move(key), std::move(value));
    this->Post(std::move(u), "push source set");
  }
  void Delete(K key) {
    StoreUpdate<K, V> u{.generation = this->CurrentGeneration()};
    u.deletes.push_back(std::move(key));
    this->Post(std::move(u), "push source delete");
  }
  // The complete content (keys outside the filter are ignored); with
  // `synced` the store is in sync once it is applied.
  void Replace(absl::flat_hash_map<K, V> items, bool synced = true) {
    StoreUpdate<K, V> u{.generation = this->CurrentGeneration(),
                        .replace = true};
    u.sets.reserve(items.size());
    for (auto& kv : items) u.sets.emplace_back(kv.first, std::move(kv.second));
    if (synced) u.sync = StoreUpdate<K, V>::Sync::kSynced;
    this->Post(std::move(u), "push source replace");
  }
  void MarkSynced() {
    this->Post({.generation = this->CurrentGeneration(),
                .sync = StoreUpdate<K, V>::Sync::kSynced},
               "push source synced");
  }
  void MarkLostSync() {
    this->Post({.generation = this->CurrentGeneration(),
                .sync = StoreUpdate<K, V>::Sync::kLostSync},
               "push source lost sync");
  }

 protected:
  void OnFilterChanged() override {
    if (on_filter_change_) on_filter_change_(this->store_->filter());
  }

 private:
  std::function<void(const KeyFilter<K>&)> on_filter_change_;
};

// ---------------------------------------------------------------------------

namespace source_internal {

template <class K, class V>
PollDriver<K, V>::PollDriver(ListFn list, PollingSourceOptions<V> options,
                             bool filtered, bool shared)
    : CachedDriver<K, V>(SourceDriverOptions{.name = options.name,
                                             .clock = options.clock,
                                             .executor = options.executor,
                                             .manual = options.manual,
                                             .logger = options.logger},
                         SourceCacheOptions<V>{.name = options.name,
                                               .filtered = filtered,
                                               .equal = options.equal,
                                               .logger = options.logger},
                         SourceHealthOptions{
                             .name = options.name,
                             .type = "poll",
                             .shared = shared,
                             .clock = options.clock,
                             .metrics = options.metrics,
                             .labels = WithLabels(options.metric_labels,
                                                  {{"source", options.name}})}),
      list_(std::move(list)),
      options_(std::move(options)),
      jitter_(std::random_device{}()) {}

template <class K, class V>
absl::Status PollDriver<K, V>::Validate() const {
  if (options_.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start polling source ", options_.name, ": interval must be > 0, got ",
        absl::FormatDuration(options_.interval)));
  }
  return ValidateCommon("polling source", options_.name, options_.list_timeout,
                        options_.lose_sync_after, options_.backoff);
}

template <class K, class V>
void PollDriver<K, V>::RequestRelist(SourceRelist why) {
  {
    MutexLock l(&mu_);
    relist_ = why;
  }
  this->Trigger();
}

template <class K, class V>
PollingSourceStats PollDriver<K, V>::stats() const {
  const SourceStatus s = this->health_.status();
  return {.lists = s.lists,
          .list_failures = s.list_failures,
          .consecutive_failures = s.consecutive_failures,
          .changes_posted = changes_posted_.load()};
}

template <class K, class V>
typename SourceDriver::StepResult PollDriver<K, V>::Step(const Context& ctx) {
  Clock* clock = this->clock();
  this->health_.Started();
  std::optional<SourceRelist> relist;
  {
    MutexLock l(&mu_);
    relist = std::exchange(relist_, std::nullopt);
  }
  const uint64_t epoch = this->cache_.epoch();
  const int64_t seq = this->ListBegins();
  const Context list_ctx = options_.list_timeout > absl::ZeroDuration()
                               ? ctx.WithTimeout(options_.list_timeout)
                               : ctx;
  const absl::Time began = clock->Now();
  absl::StatusOr<Map> listed = CallCatching<Map>("list", list_, list_ctx);
  if (ctx.Cancelled()) {
    this->ListEnded(seq, absl::CancelledError("source stopped"), false);
    return {absl::InfiniteFuture(), false};
  }
  const absl::Time ended = clock->Now();
  if (!listed.ok()) {
    this->health_.ListFailed(listed.status(), ended - began);
    const int64_t failures = this->health_.status().consecutive_failures;
    const absl::Duration wait =
        BackoffDelay(options_.backoff, static_cast<int>(failures - 1),
                     std::uniform_real_distribution<double>(0, 1)(jitter_));
    SPDLOG_LOGGER_WARN(this->logger(),
                       "list failed source={} failures={} retry_in={}: {}",
                       options_.name, failures, wait, listed.status());
    if (failures >= options_.lose_sync_after && this->cache_.LoseSync()) {
      SPDLOG_LOGGER_WARN(this->logger(), "source lost sync source={}",
                         options_.name);
    }
    if (relist.has_value()) {
      MutexLock l(&mu_);
      if (!relist_.has_value()) relist_ = relist;  // Counted when it lands.
    }
    this->ListEnded(seq, listed.status(), false);
    this->PublishView();
    return {ended + wait, true};
  }
  const bool was_in_sync = this->cache_.InSync();
  std::optional<int64_t> changes =
      this->cache_.Replace(std::move(*listed), epoch);
  if (!changes.has_value()) {
    // Listed under a filter that changed meanwhile: the change asked for
    // another list, due now.
    this->health_.ListSucceeded(ended - began,
                                static_cast<int64_t>(this->cache_.size()));
    this->ListEnded(seq, absl::OkStatus(), false);
    return {ended, true};
  }
  this->health_.ListSucceeded(ended - began,
                              static_cast<int64_t>(this->cache_.size()));
  if (relist.has_value()) this->health_.Relisted(*relist);
  changes_posted_ += *changes;
  if (!was_in_sync) {
    SPDLOG_LOGGER_INFO(this->logger(), "source in sync source={} keys={}",
                       options_.name, this->cache_.size());
  }
  this->ListEnded(seq, absl::OkStatus(), true);
  this->PublishView();
  return {ended + options_.interval, true};
}

}  // namespace source_internal

template <class K, class V>
PollingSource<K, V>::PollingSource(Runner* runner, Store<K, V>* store,
                                   ListFn list, PollingSourceOptions<V> options)
    : Source<K, V>(runner, store, options.logger),
      driver_(std::move(list), Defaults(runner, std::move(options)),
              /*filtered=*/true, /*shared=*/false),
      sub_(driver_.cache().Subscribe(runner, store)) {}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SOURCE_H_
