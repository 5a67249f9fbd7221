// SourceCache: what a source knows of the world, and the stores it feeds.
// A source's driver (a poll or a watch) gives it complete lists and watch
// events from its own thread; the cache diffs them against what it holds
// and posts each subscribed store, on that store's runner, only the
// changes within the store's key filter.
//
//   SourceCache<std::string, Vm> cache({.name = "vms"});
//   int64_t a = cache.Subscribe(&runner_a, &vms_a);   // before the runners
//   int64_t b = cache.Subscribe(&runner_b, &vms_b);   // start
//   cache.Replace(ListVms(), cache.epoch());          // both in sync
//   cache.Apply({{"web-1", std::nullopt}});           // deleted for both
//   // On runner_a, after vms_a.Rescope(filter) returned `generation`:
//   cache.Rescope(a, filter, generation);  // vms_a gets its part at once
//
// Two modes:
// - Shared (the default): the cache keeps every key and each store gets
//   its part. A store re-scoped to a new filter gets its part of the cache
//   at once (in sync if the cache is): keys entering its range are acted
//   on from the cache, with no list.
// - Filtered (`filtered`, one store): the cache keeps only the store's
//   keys. A new filter prunes it, and the store stays out of sync until a
//   list that began after the change lands (Rescope returns true: list
//   again); lists begun before it are dropped (epoch()).
//
// A store is in sync once the cache is (a complete list landed) and its
// own part was delivered under its current filter; it loses sync when the
// cache does (LoseSync). Posts refused by a stopped runner are counted.
//
// Thread safety: thread-safe. Rescope runs on the subscribed store's
// runner; Subscribe there or before that runner starts.
#ifndef SETPOINT_PROCESSOR_SOURCE_CACHE_H_
#define SETPOINT_PROCESSOR_SOURCE_CACHE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/watch.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {

template <class V>
struct SourceCacheOptions {
  // Names the cache in logs.
  // Default: "source".
  std::string name = "source";
  // Keep only the keys of the one subscribed store (see the file comment).
  // Default: false (shared: every key).
  bool filtered = false;
  // Same-value test for the diff; keep it equal to the stores'.
  // Default: operator==.
  std::function<bool(const V&, const V&)> equal = nullptr;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

template <class K, class V>
class SourceCache {
 public:
  using Map = absl::flat_hash_map<K, V>;

  explicit SourceCache(SourceCacheOptions<V> options = {});
  SourceCache(const SourceCache&) = delete;
  SourceCache& operator=(const SourceCache&) = delete;

  // Feeds `store` (with its current filter and generation) from now on;
  // when the cache holds a complete list (shared mode), its part is posted
  // at once. Returns the subscription's id.
  int64_t Subscribe(Runner* runner, Store<K, V>* store);
  // On the store's runner, after store->Rescope(filter) returned
  // `generation`. Shared: posts the store's part of the cache (in sync if
  // the cache is) and returns false. Filtered: prunes the cache to
  // `filter` and returns true: the driver must list again.
  bool Rescope(int64_t id, KeyFilter<K> filter, uint64_t generation);
  // Posts nothing more to the store. Events posted before still run.
  void Unsubscribe(int64_t id);

  // The driver's side. epoch() changes when a filtered cache is
  // re-scoped: pass the epoch read when a list began to Replace, which
  // drops the list (returns nullopt) when it moved.
  uint64_t epoch() const;
  // A complete list: the cache becomes `items` (filtered mode: those the
  // store selects), is in sync, and each store gets what changed (or its
  // whole part, if it had none under its filter). Returns the number of
  // keys set or deleted in the cache.
  std::optional<int64_t> Replace(Map items, uint64_t epoch);
  // Watch events, in order; the last event of a key wins. Dropped while a
  // filtered cache waits for a list. Returns the keys set or deleted.
  int64_t Apply(std::vector<WatchEvent<K, V>> events);
  // The view is no longer complete (failures): the stores lose sync, and
  // keep their values. Returns true if it was in sync.
  bool LoseSync();
  // The view is complete again without a list (a watch resumed from its
  // token): the stores that have their part are in sync again.
  void MarkSynced();

  bool InSync() const;
  // A complete list ever landed.
  bool Listed() const;
  size_t size() const;
  // A copy of what the cache holds (every key, when shared).
  Map Snapshot() const;
  // Posts a stopped runner refused.
  int64_t updates_refused() const { return refused_.load(); }

 private:
  struct Sub {
    int64_t id;
    Runner* runner;
    Store<K, V>* store;
    KeyFilter<K> filter;
    uint64_t generation;
    // Its whole part was posted under `generation`: changes follow.
    bool primed = false;
  };
  using Sync = typename StoreUpdate<K, V>::Sync;

  bool Equal(const V& a, const V& b) const {
    return options_.equal ? options_.equal(a, b) : a == b;
  }
  static bool Selects(const Sub& s, const K& key) {
    return !s.filter || s.filter(key);
  }
  // Posts `sub` its whole part of the cache, in sync if the cache is.
  void PostPart(Sub& sub) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Posts every store primed before (`fresh[i]` false) the changes within
  // its filter; `fresh` empty: every primed store.
  void PostChanges(std::vector<std::pair<K, V>> sets, std::vector<K> deletes,
                   Sync sync, const std::vector<bool>& fresh = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Post(const Sub& sub, StoreUpdate<K, V> update, const char* origin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SourceCacheOptions<V> options_;
  std::shared_ptr<spdlog::logger> logger_;
  mutable Mutex mu_;
  // Posts are made under mu_, so each store gets them in the cache's order.
  Map items_ ABSL_GUARDED_BY(mu_);
  std::vector<Sub> subs_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool in_sync_ ABSL_GUARDED_BY(mu_) = false;
  bool listed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Filtered: re-scoped, waiting for a list begun after it.
  bool awaiting_list_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> refused_{0};
};

// ---------------------------------------------------------------------------

template <class K, class V>
SourceCache<K, V>::SourceCache(SourceCacheOptions<V> options)
    : options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()) {}

template <class K, class V>
int64_t SourceCache<K, V>::Subscribe(Runner* runner, Store<K, V>* store) {
  store->BindRunner(runner);
  MutexLock l(&mu_);
  subs_.push_back(Sub{.id = next_id_++,
                      .runner = runner,
                      .store = store,
                      .filter = store->filter(),
                      .generation = store->generation()});
  Sub& sub = subs_.back();
  if (!options_.filtered && listed_) PostPart(sub);
  return sub.id;
}

template <class K, class V>
bool SourceCache<K, V>::Rescope(int64_t id, KeyFilter<K> filter,
                                uint64_t generation) {
  MutexLock l(&mu_);
  for (Sub& sub : subs_) {
    if (sub.id != id) continue;
    sub.filter = std::move(filter);
    sub.generation = generation;
    sub.primed = false;
    if (options_.filtered) {
      if (sub.filter) {
        absl::erase_if(
            items_, [&sub](const auto& kv) { return !sub.filter(kv.first); });
      }
      ++epoch_;
      awaiting_list_ = true;
      return true;
    }
    if (listed_) PostPart(sub);
    return false;
  }
  return options_.filtered;
}

template <class K, class V>
void SourceCache<K, V>::Unsubscribe(int64_t id) {
  MutexLock l(&mu_);
  std::erase_if(subs_, [id](const Sub& s) { return s.id == id; });
}

template <class K, class V>
uint64_t SourceCache<K, V>::epoch() const {
  MutexLock l(&mu_);
  return epoch_;
}

template <class K, class V>
std::optional<int64_t> SourceCache<K, V>::Replace(Map items, uint64_t epoch) {
  MutexLock l(&mu_);
  if (options_.filtered && epoch != epoch_) return std::nullopt;
  if (options_.filtered && !subs_.empty() && subs_.front().filter) {
    const Sub& only = subs_.front();
    absl::erase_if(items,
                   [&only](const auto& kv) { return !only.filter(kv.first); });
  }
  std::vector<std::pair<K, V>> sets;
  std::vector<K> deletes;
  for (const auto& [key, value] : items) {
    auto it = items_.find(key);
    if (it == items_.end() || !Equal(it->second, value)) {
      sets.emplace_back(key, value);
    }
  }
  for (const auto& [key, value] : items_) {
    if (!items.contains(key)) deletes.push_back(key);
  }
  const auto changes = static_cast<int64_t>(sets.size() + deletes.size());
  items_ = std::move(items);
  const bool was_in_sync = in_sync_;
  in_sync_ = true;
  listed_ = true;
  awaiting_list_ = false;
  // Stores without their part get it whole; the others get the changes.
  std::vector<bool> fresh(subs_.size(), false);
  for (size_t i = 0; i < subs_.size(); ++i) {
    if (subs_[i].primed) continue;
    PostPart(subs_[i]);
    fresh[i] = true;
  }
  PostChanges(std::move(sets), std::move(deletes),
              was_in_sync ? Sync::kUnchanged : Sync::kSynced, fresh);
  return changes;
}

template <class K, class V>
int64_t SourceCache<K, V>::Apply(std::vector<WatchEvent<K, V>> events) {
  MutexLock l(&mu_);
  if (awaiting_list_ || !listed_) return 0;
  const Sub* only =
      options_.filtered && !subs_.empty() ? &subs_.front() : nullptr;
  std::vector<K> touched;
  absl::flat_hash_set<K> seen;
  for (WatchEvent<K, V>& e : events) {
    if (only != nullptr && !Selects(*only, e.key)) continue;
    if (e.value.has_value()) {
      auto [it, inserted] = items_.try_emplace(e.key, *e.value);
      if (!inserted) {
        if (Equal(it->second, *e.value)) continue;
        it->second = std::move(*e.value);
      }
    } else if (items_.erase(e.key) == 0) {
      continue;
    }
    if (seen.insert(e.key).second) touched.push_back(std::move(e.key));
  }
  std::vector<std::pair<K, V>> sets;
  std::vector<K> deletes;
  for (K& key : touched) {
    auto it = items_.find(key);
    if (it != items_.end()) {
      sets.emplace_back(std::move(key), it->second);
    } else {
      deletes.push_back(std::move(key));
    }
  }
  const auto changes = static_cast<int64_t>(sets.size() + deletes.size());
  if (changes > 0) {
    PostChanges(std::move(sets), std::move(deletes), Sync::kUnchanged);
  }
  return changes;
}

template <class K, class V>
bool SourceCache<K, V>::LoseSync() {
  MutexLock l(&mu_);
  if (!in_sync_) return false;
  in_sync_ = false;
  for (const Sub& sub : subs_) {
    if (sub.primed) {
      Post(sub, {.generation = sub.generation, .sync = Sync::kLostSync},
           "source lost sync");
    }
  }
  return true;
}

template <class K, class V>
void SourceCache<K, V>::MarkSynced() {
  MutexLock l(&mu_);
  if (in_sync_ || !listed_) return;
  in_sync_ = true;
  for (const Sub& sub : subs_) {
    if (sub.primed) {
      Post(sub, {.generation = sub.generation, .sync = Sync::kSynced},
           "source in sync");
    }
  }
}

template <class K, class V>
bool SourceCache<K, V>::InSync() const {
  MutexLock l(&mu_);
  return in_sync_;
}

template <class K, class V>
bool SourceCache<K, V>::Listed() const {
  MutexLock l(&mu_);
  return listed_;
}

template <class K, class V>
size_t SourceCache<K, V>::size() const {
  MutexLock l(&mu_);
  return items_.size();
}

template <class K, class V>
absl::flat_hash_map<K, V> SourceCache<K, V>::Snapshot() const {
  MutexLock l(&mu_);
  return items_;
}

template <class K, class V>
void SourceCache<K, V>::PostPart(Sub& sub) {
  StoreUpdate<K, V> u{.generation = sub.generation,
                      .replace = true,
                      .sync = in_sync_ ? Sync::kSynced : Sync::kUnchanged};
  for (const auto& kv : items_) {
    if (Selects(sub, kv.first)) u.sets.push_back(kv);
  }
  sub.primed = true;
  Post(sub, std::move(u), "source part");
}

template <class K, class V>
void SourceCache<K, V>::PostChanges(std::vector<std::pair<K, V>> sets,
                                    std::vector<K> deletes, Sync sync,
                                    const std::vector<bool>& fresh) {
  for (size_t i = 0; i < subs_.size(); ++i) {
    const Sub& sub = subs_[i];
    if (!sub.primed || (!fresh.empty() && fresh[i])) continue;
    StoreUpdate<K, V> u{.generation = sub.generation, .sync = sync};
    const bool last = i + 1 == subs_.size();
    if (options_.filtered || !sub.filter) {
      // Everything the cache changed is the store's.
      // The last store takes the vectors (a swap with its empty ones, in
      // the loop's last pass); the others copy them first.
      if (last) {
        u.sets.swap(sets);
        u.deletes.swap(deletes);
      } else {
        u.sets = sets;
        u.deletes = deletes;
      }
    } else {
      for (const auto& kv : sets) {
        if (sub.filter(kv.first)) u.sets.push_back(kv);
      }
      for (const K& key : deletes) {
        if (sub.filter(key)) u.deletes.push_back(key);
      }
    }
    if (u.sets.empty() && u.deletes.empty() && u.sync == Sync::kUnchanged) {
      continue;
    }
    Post(sub, std::move(u), "source changes");
  }
}

template <class K, class V>
void SourceCache<K, V>::Post(const Sub& sub, StoreUpdate<K, V> update,
                             const char* origin) {
  Store<K, V>* store = sub.store;
  absl::Status posted = sub.runner->Post(
      [store, update = std::move(update)]() mutable {
        store->Apply(std::move(update));
      },
      origin);
  if (!posted.ok()) {
    ++refused_;
    SPDLOG_LOGGER_WARN(logger_, "source update refused source={} store={}: {}",
                       options_.name, store->name(), posted);
  }
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SOURCE_CACHE_H_
