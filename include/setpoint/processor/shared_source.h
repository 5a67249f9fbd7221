// SharedSource: one list (or watch) feeding the stores of several nodes,
// each store seeing only its own key filter. A pod whose four nodes of a
// kind share a source lists once per interval, not four times; a watch is
// one stream per pod.
//
//   auto zone = SharedSource<std::string, Record>::Poll(
//       [&](const Context& ctx) { return api.List(ctx); },
//       {.name = "zone", .interval = absl::Seconds(1)});
//   auto a = zone->Subscribe(&runner_a, &records_a);  // before the runners
//   auto b = zone->Subscribe(&runner_b, &records_b);  // start
//   SETPOINT_RETURN_IF_ERROR(zone->Start());
//   // On runner_a, at a handoff:
//   a->Rescope(FilterFor(range_a));  // its part of the cache, at once
//
// The source keeps every key it listed (SourceCache, shared mode) and posts
// each store what changed within its filter. Rescope on a subscription (the
// store's runner) forgets the keys that left and delivers the keys that
// entered from the cache at once, in sync if the source is: a node that is
// handed shards acts on them without waiting for a list. The cache is as
// complete as any list (a store is in sync only while the source is) and as
// fresh as the last list or watch event; docs/controller.md says why that
// is safe for a handoff. In sync, loss of sync, backoff and the watch's
// rules are those of PollingSource and WatchSource.
//
// Threads: as one PollingSource or WatchSource, whatever the number of
// stores.
//
// Thread safety: Start, Stop and RunUntilIdle on the owner thread;
// Subscribe on the store's runner or before it starts; a Subscription's
// Rescope on its store's runner; the rest from any thread. Destroy the
// subscriptions before the source.
#ifndef SETPOINT_PROCESSOR_SHARED_SOURCE_H_
#define SETPOINT_PROCESSOR_SHARED_SOURCE_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/watch_source.h"

namespace setpoint {

template <class K, class V>
class SharedSource {
 public:
  using Map = absl::flat_hash_map<K, V>;
  using ListFn = typename PollingSource<K, V>::ListFn;

  // A store fed from the source. Unsubscribes when destroyed (events
  // posted before still run on the store's runner).
  class Subscription final : public Source<K, V> {
   public:
    ~Subscription() override { source_->Cache().Unsubscribe(id_); }
    int64_t updates_refused() const override {
      return source_->Cache().updates_refused();
    }

   protected:
    void OnFilterChanged() override {
      auto [filter, generation] = this->CurrentFilter();
      source_->Cache().Rescope(id_, std::move(filter), generation);
    }

   private:
    friend class SharedSource;
    Subscription(SharedSource* source, Runner* runner, Store<K, V>* store)
        : Source<K, V>(runner, store, nullptr),
          source_(source),
          id_(source->Cache().Subscribe(runner, store)) {}
    SharedSource* const source_;
    const int64_t id_;
  };

  // A shared poll: lists with `list` every options.interval.
  // options.clock is required (there is no runner to take it from).
  static std::unique_ptr<SharedSource> Poll(ListFn list,
                                            PollingSourceOptions<V> options);
  // A shared watch: lists with `list`, then follows `watch`.
  // options.clock is required.
  static std::unique_ptr<SharedSource> Watch(WatchListFn<K, V> list,
                                             WatchFn<K, V> watch,
                                             WatchSourceOptions<V> options);
  // Calls Stop().
  ~SharedSource() { Stop(); }

  // See PollingSource / WatchSource.
  absl::Status Start() { return driver_->Start(); }
  void Stop() { driver_->Stop(); }
  // The next list (or, for a watch, a re-list) now.
  void Trigger() {
    if (watch_) {
      driver_->RequestRelist(SourceRelist::kFresh);
    } else {
      driver_->Trigger();
    }
  }
  bool RunUntilIdle() { return driver_->RunUntilIdle(); }
  absl::Time NextWakeTime() const { return driver_->NextWakeTime(); }
  absl::Status AwaitFresh(const Context& ctx) {
    return driver_->AwaitFresh(ctx);
  }

  // Feeds `store` (on `runner`) with the keys its filter selects; its
  // Rescope(filter) re-scopes it from the cache.
  std::unique_ptr<Subscription> Subscribe(Runner* runner, Store<K, V>* store) {
    return std::unique_ptr<Subscription>(new Subscription(this, runner, store));
  }

  // Every key the source holds. Any thread.
  Map Snapshot() const { return driver_->cache().Snapshot(); }
  SourceStatus status() const { return driver_->health().status(); }
  const SourceHealth& health() const { return driver_->health(); }
  bool is_watch() const { return watch_; }
  const std::string& name() const { return driver_->name(); }
  Clock* clock() const { return driver_->clock(); }
  bool manual() const { return driver_->manual(); }

 private:
  SharedSource(std::unique_ptr<source_internal::CachedDriver<K, V>> driver,
               bool watch)
      : driver_(std::move(driver)), watch_(watch) {}
  SourceCache<K, V>& Cache() { return driver_->cache(); }

  const std::unique_ptr<source_internal::CachedDriver<K, V>> driver_;
  const bool watch_;
};

// ---------------------------------------------------------------------------

template <class K, class V>
std::unique_ptr<SharedSource<K, V>> SharedSource<K, V>::Poll(
    ListFn list, PollingSourceOptions<V> options) {
  return std::unique_ptr<SharedSource>(new SharedSource(
      std::make_unique<source_internal::PollDriver<K, V>>(
          std::move(list), std::move(options), /*filtered=*/false,
          /*shared=*/true),
      /*watch=*/false));
}

template <class K, class V>
std::unique_ptr<SharedSource<K, V>> SharedSource<K, V>::Watch(
    WatchListFn<K, V> list, WatchFn<K, V> watch,
    WatchSourceOptions<V> options) {
  return std::unique_ptr<SharedSource>(new SharedSource(
      std::make_unique<source_internal::WatchDriver<K, V>>(
          std::move(list), std::move(watch), std::move(options),
          /*filtered=*/false, /*shared=*/true),
      /*watch=*/true));
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SHARED_SOURCE_H_
