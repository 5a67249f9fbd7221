// Sources: where observed state comes from. A source does its IO on its own
// thread and posts Set / Delete / Synced / LostSync to a Store on the runner.
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
// PollingSource lists every `interval`, diffs against its previous list on
// its own thread and posts only the changes. The store is in sync after the
// first good list; after `lose_sync_after` failed lists in a row it loses
// sync (the syncer then pauses) until a list succeeds again. Failed lists
// back off (BackoffOptions) instead of waiting `interval`.
//
// With `manual` set, Start() starts no thread: the owner lists by calling
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
// PushSource is for watch-style inputs: the user's own thread calls Set,
// Delete, Replace, MarkSynced and MarkLostSync.
//
// Rescope (runner thread): the store forgets keys outside the new filter
// (not a delete), loses sync, and the source lists again within it at once;
// updates listed under the old filter are dropped on arrival. A PushSource
// calls its on_filter_change so the user can re-list (Replace + MarkSynced).
//
// Shutdown order: Stop() the sources, then the syncer, then the runner; then
// destroy them. Posts after the runner stopped are refused and logged.
//
// Thread safety: Rescope on the runner thread; Start/Stop and RunUntilIdle on
// the owner thread; Trigger, NextWakeTime and stats from any thread;
// PushSource's Set/Delete/Replace/Mark* from any thread.
#ifndef SETPOINT_PROCESSOR_SOURCE_H_
#define SETPOINT_PROCESSOR_SOURCE_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/store.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {

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
  int64_t updates_refused() const { return refused_.load(); }

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
  // Names the source's thread's log lines.
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
  // Waits after a failed list.
  // Default: 100 ms doubling to 5 minutes, jitter 0.2 (BackoffOptions).
  BackoffOptions backoff = {};
  // Same-value test for the diff; keep it equal to the store's.
  // Default: operator==.
  std::function<bool(const V&, const V&)> equal = nullptr;
  // Default: the runner's clock (Runner::clock()).
  Clock* clock = nullptr;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
  // No thread: the owner lists by calling RunUntilIdle() (tests on a simulated
  // clock).
  // Default: false.
  bool manual = false;
};

// Counters for operators and tests.
struct PollingSourceStats {
  int64_t lists = 0;  // List calls that returned.
  int64_t list_failures = 0;
  int64_t consecutive_failures = 0;
  int64_t changes_posted = 0;  // Sets and deletes sent to the store.
};

template <class K, class V>
class PollingSource : public Source<K, V> {
 public:
  using Map = absl::flat_hash_map<K, V>;
  using ListFn = absl::AnyInvocable<absl::StatusOr<Map>(const Context&)>;

  PollingSource(Runner* runner, Store<K, V>* store, ListFn list,
                PollingSourceOptions<V> options = {});
  // Calls Stop().
  ~PollingSource() override { Stop(); }

  // Starts the thread ("sp-source"), which lists at once; in manual mode
  // starts nothing. kFailedPrecondition if already started; kInvalidArgument
  // naming the field for bad options (interval <= 0, list_timeout < 0,
  // lose_sync_after < 1, bad backoff), and then nothing starts.
  absl::Status Start();
  // Cancels a list in progress (its context) and joins. Idempotent.
  void Stop();
  // Lists again now instead of at the end of the interval (any thread).
  void Trigger();

  // Manual mode, owner thread, between Start() and Stop(): lists once, on
  // the calling thread, if a list is due now on the source's clock (see
  // NextWakeTime), and posts the changes to the store as the thread would.
  // Returns whether it listed; false when not due, not in manual mode, not
  // started or stopped.
  bool RunUntilIdle();
  // When the next list is due: absl::InfinitePast() when it is due now (the
  // first list, after Trigger() or a filter change, or once the time came);
  // otherwise the end of the last list plus the interval (after a good list)
  // or the backoff (after a failed one).
  absl::Time NextWakeTime() const;

  // Any thread.
  PollingSourceStats stats() const {
    MutexLock l(&mu_);
    return stats_;
  }

 protected:
  void OnFilterChanged() override { Trigger(); }

 private:
  // The thread: polls whenever a list is due, else waits on the clock.
  void Loop(std::stop_token stop);
  // Whoever drives the source (the thread, or the owner in manual mode):
  // lists once under `background` (each list gets its own timeout), posts
  // the changes and sets when the next list is due. Returns false when
  // `background` was cancelled during the list: the result is not used.
  bool PollOnce(const Context& background);
  absl::StatusOr<Map> ListOnce(const Context& ctx);
  bool Equal(const V& a, const V& b) const {
    return options_.equal ? options_.equal(a, b) : a == b;
  }

  ListFn list_;
  PollingSourceOptions<V> options_;
  Clock* const clock_;
  mutable Mutex mu_;
  CondVar cv_;
  // Trigger() or a filter change: list now.
  bool triggered_ ABSL_GUARDED_BY(mu_) = false;
  // When the next list is due, if not triggered; InfinitePast() before the
  // first.
  absl::Time next_poll_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  PollingSourceStats stats_ ABSL_GUARDED_BY(mu_);

  // The driver's state, touched only by whichever drives the source.
  ThreadChecker driver_;
  // The last good list, filtered, under `last_generation_`.
  Map last_ ABSL_GUARDED_BY(driver_);
  uint64_t last_generation_ ABSL_GUARDED_BY(driver_) = 0;
  // `last_` is a complete list under last_generation_.
  bool have_list_ ABSL_GUARDED_BY(driver_) = false;
  // The store was told it is out of sync (or never was in sync).
  bool lost_ ABSL_GUARDED_BY(driver_) = true;
  // std::mt19937_64, not absl::BitGen: Debian's prebuilt Abseil seeds BitGen
  // from a pool ThreadSanitizer reports as racing between threads.
  std::mt19937_64 jitter_ ABSL_GUARDED_BY(driver_);

  std::jthread thread_;
  // Owner thread only.
  bool started_ = false;
  bool stopped_ = false;
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

template <class K, class V>
PollingSource<K, V>::PollingSource(Runner* runner, Store<K, V>* store,
                                   ListFn list, PollingSourceOptions<V> options)
    : Source<K, V>(runner, store, options.logger),
      list_(std::move(list)),
      options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : runner->clock()),
      jitter_(std::random_device{}()) {}

template <class K, class V>
absl::Status PollingSource<K, V>::Start() {
  if (started_) {
    return absl::FailedPreconditionError("start polling source " +
                                         options_.name + ": already started");
  }
  const auto invalid = [this](const std::string& field,
                              const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start polling source ", options_.name, ": ", field, " ", what));
  };
  if (options_.interval <= absl::ZeroDuration()) {
    return invalid("interval",
                   absl::StrCat("must be > 0, got ",
                                absl::FormatDuration(options_.interval)));
  }
  if (options_.list_timeout < absl::ZeroDuration()) {
    return invalid("list_timeout",
                   absl::StrCat("must be >= 0, got ",
                                absl::FormatDuration(options_.list_timeout)));
  }
  if (options_.lose_sync_after < 1) {
    return invalid("lose_sync_after", absl::StrCat("must be >= 1, got ",
                                                   options_.lose_sync_after));
  }
  if (absl::Status s = ValidateBackoffOptions(options_.backoff); !s.ok()) {
    return invalid("backoff", std::string(s.message()));
  }
  started_ = true;
  if (options_.manual) return absl::OkStatus();
  thread_ = std::jthread([this](std::stop_token stop) {
    pthread_setname_np(pthread_self(), "sp-source");
    Loop(stop);
  });
  return absl::OkStatus();
}

template <class K, class V>
void PollingSource<K, V>::Stop() {
  if (started_) stopped_ = true;
  if (!thread_.joinable()) return;
  thread_.request_stop();
  {
    MutexLock l(&mu_);
    cv_.SignalAll();
  }
  thread_.join();
}

template <class K, class V>
void PollingSource<K, V>::Trigger() {
  MutexLock l(&mu_);
  triggered_ = true;
  cv_.SignalAll();
}

template <class K, class V>
bool PollingSource<K, V>::RunUntilIdle() {
  if (!options_.manual || !started_ || stopped_) return false;
  if (NextWakeTime() > clock_->Now()) return false;
  PollOnce(Context::Background(clock_));
  return true;
}

template <class K, class V>
absl::Time PollingSource<K, V>::NextWakeTime() const {
  const absl::Time now = clock_->Now();
  MutexLock l(&mu_);
  if (triggered_ || next_poll_ <= now) return absl::InfinitePast();
  return next_poll_;
}

template <class K, class V>
absl::StatusOr<absl::flat_hash_map<K, V>> PollingSource<K, V>::ListOnce(
    const Context& ctx) {
  try {
    return list_(ctx);
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("list threw: ") + e.what());
  } catch (...) {
    return absl::InternalError("list threw a non-exception");
  }
}

template <class K, class V>
void PollingSource<K, V>::Loop(std::stop_token stop) {
  const Context background(stop, clock_);
  while (!stop.stop_requested()) {
    if (!PollOnce(background)) break;
    MutexLock l(&mu_);
    clock_->AwaitWithDeadline(
        &mu_, &cv_, next_poll_, stop,
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return triggered_; });
  }
}

template <class K, class V>
bool PollingSource<K, V>::PollOnce(const Context& background) {
  SETPOINT_DCHECK_THREAD(driver_);
  using Sync = typename StoreUpdate<K, V>::Sync;
  {
    MutexLock l(&mu_);
    triggered_ = false;
  }
  auto [filter, generation] = this->CurrentFilter();
  Context ctx = options_.list_timeout > absl::ZeroDuration()
                    ? background.WithTimeout(options_.list_timeout)
                    : background;
  absl::StatusOr<Map> listed = ListOnce(ctx);
  if (background.Cancelled()) return false;
  absl::Duration wait = options_.interval;
  if (!listed.ok()) {
    int64_t failures;
    {
      MutexLock l(&mu_);
      ++stats_.lists;
      ++stats_.list_failures;
      failures = ++stats_.consecutive_failures;
    }
    wait = BackoffDelay(options_.backoff, static_cast<int>(failures - 1),
                        std::uniform_real_distribution<double>(0, 1)(jitter_));
    SPDLOG_LOGGER_WARN(this->logger_,
                       "list failed source={} failures={} retry_in={}: {}",
                       options_.name, failures, wait, listed.status());
    if (!lost_ && failures >= options_.lose_sync_after) {
      lost_ = true;
      this->Post({.generation = generation, .sync = Sync::kLostSync},
                 "polling source lost sync");
      SPDLOG_LOGGER_WARN(this->logger_, "source lost sync source={}",
                         options_.name);
    }
  } else {
    Map now;
    now.reserve(listed->size());
    for (auto& [key, value] : *listed) {
      if (!filter || filter(key)) now.emplace(key, std::move(value));
    }
    StoreUpdate<K, V> update{.generation = generation};
    if (!have_list_ || generation != last_generation_) {
      // First list, or the filter changed: send everything.
      update.replace = true;
      update.sets.reserve(now.size());
      for (const auto& kv : now) update.sets.push_back(kv);
    } else {
      for (const auto& [key, value] : now) {
        auto it = last_.find(key);
        if (it == last_.end() || !Equal(it->second, value)) {
          update.sets.emplace_back(key, value);
        }
      }
      for (const auto& [key, value] : last_) {
        if (!now.contains(key)) update.deletes.push_back(key);
      }
    }
    // A filter change made the store lose sync; the replace restores it.
    if (lost_ || update.replace) update.sync = Sync::kSynced;
    int64_t changes =
        static_cast<int64_t>(update.sets.size() + update.deletes.size());
    if (changes > 0 || update.replace || lost_) {
      this->Post(std::move(update), "polling source list");
    }
    if (lost_) {
      SPDLOG_LOGGER_INFO(this->logger_, "source in sync source={} keys={}",
                         options_.name, now.size());
    }
    lost_ = false;
    last_ = std::move(now);
    last_generation_ = generation;
    have_list_ = true;
    MutexLock l(&mu_);
    ++stats_.lists;
    stats_.consecutive_failures = 0;
    stats_.changes_posted += changes;
  }
  const absl::Time ended = clock_->Now();
  MutexLock l(&mu_);
  next_poll_ = ended + wait;
  return true;
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SOURCE_H_
