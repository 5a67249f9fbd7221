// Store: the observed state of one kind of object, as a map on the runner.
// Sources feed it; subscribers (transformers, syncers, user code) hear about
// a key only when its value really changed.
//
//   Store<std::string, Vm> vms({.name = "vms"});
//   vms.Subscribe([](const Change<std::string, Vm>& c) {
//     if (c.kind == ChangeKind::kSet) Log(c.key, *c.new_value);
//   });
//   PollingSource<std::string, Vm> source(&runner, &vms, ListVms);
//
// A store is in sync once its source says its view is complete (after the
// first good list) and loses sync when the source does or when its key
// filter changes. Rescope() re-scopes the store to a new shard range: keys
// that left it are *forgotten* (ChangeKind::kForget), which is not a delete
// in the world, and every listener must treat it that way.
//
// Thread safety: runner thread only. Sources post their updates to the
// runner; Apply() is the entry point those posts call.
#ifndef SETPOINT_PROCESSOR_STORE_H_
#define SETPOINT_PROCESSOR_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "setpoint/base/logging.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/synchronizable.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {

// Selects the keys a node is responsible for (its shard range). An empty
// filter selects every key.
template <class K>
using KeyFilter = std::function<bool(const K&)>;

enum class ChangeKind {
  kSet,     // Added or changed: new_value set; old_value set if it existed.
  kDelete,  // Gone from the world: old_value set.
  kForget,  // Left this node's key filter; still in the world: old_value set.
};

// "set", "delete" or "forget", for logs.
inline const char* ChangeKindName(ChangeKind kind) {
  switch (kind) {
    case ChangeKind::kSet:
      return "set";
    case ChangeKind::kDelete:
      return "delete";
    case ChangeKind::kForget:
      return "forget";
  }
  return "unknown";
}

// One change of one key, passed to listeners. The pointers are valid only
// during the call.
template <class K, class V>
struct Change {
  ChangeKind kind;
  const K& key;
  const V* old_value;  // nullptr when the key is new.
  const V* new_value;  // nullptr for kDelete and kForget.
};

// What a source sends to a store in one runner event.
template <class K, class V>
struct StoreUpdate {
  enum class Sync { kUnchanged, kSynced, kLostSync };
  // The store's filter generation the source listed under; updates from an
  // older generation (listed before a filter change) are dropped.
  uint64_t generation = 0;
  // True when `sets` is the whole content within the filter: keys the store
  // holds and `sets` lacks are deleted.
  bool replace = false;
  std::vector<std::pair<K, V>> sets = {};
  std::vector<K> deletes = {};
  Sync sync = Sync::kUnchanged;
};

template <class V>
struct StoreOptions {
  // Names the store in logs and in the sync graph.
  // Default: "store".
  std::string name = "store";
  // Two values are the same when this returns true; a Set with an equal
  // value notifies nobody.
  // Default: operator==.
  std::function<bool(const V&, const V&)> equal = nullptr;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Counters for operators and tests.
struct StoreStats {
  int64_t sets = 0;            // Changes notified as kSet.
  int64_t unchanged_sets = 0;  // Sets with an equal value: not notified.
  int64_t deletes = 0;
  int64_t forgets = 0;
  int64_t ignored = 0;  // Outside the filter, or from an old generation.
};

template <class K, class V>
class Store : public Synchronizable {
 public:
  using Map = absl::flat_hash_map<K, V>;
  using Listener = absl::AnyInvocable<void(const Change<K, V>&)>;

  explicit Store(StoreOptions<V> options = {});

  // Ties the store to `runner`: from then on, builds without NDEBUG check
  // that every call below runs on it (SETPOINT_DCHECK_ON_RUNNER). The
  // sources, transformers and syncers that use the store call it; a second,
  // different runner is a bug and aborts. Call before the runner starts.
  void BindRunner(const Runner* runner) {
    SETPOINT_CHECK_MSG(runner_ == nullptr || runner_ == runner,
                       "store {} used on two runners", name());
    runner_ = runner;
  }

  // The value of `key`, or nullptr. Valid until the next change.
  const V* Find(const K& key) const;
  const Map& items() const {
    CheckOnRunner();
    return items_;
  }
  size_t size() const {
    CheckOnRunner();
    return items_.size();
  }
  // Runner thread only, like every other method here.
  const StoreStats& stats() const {
    CheckOnRunner();
    return stats_;
  }

  // Calls `listener` after every change. Listeners run in subscription order
  // and must not change this store from inside the call.
  void Subscribe(Listener listener) {
    CheckOnRunner();
    listeners_.push_back(std::move(listener));
  }

  // Direct mutations, for sources and tests. Keys outside the filter are
  // ignored. Each returns true when listeners were notified.
  bool Set(K key, V value);
  bool Delete(const K& key);
  // Applies a source's update (see StoreUpdate).
  void Apply(StoreUpdate<K, V> update);
  void MarkSynced() {
    CheckOnRunner();
    SetSelfSynced(true);
  }
  void MarkLostSync() {
    CheckOnRunner();
    SetSelfSynced(false);
  }

  // Re-scopes the store: forgets keys outside `filter` (kForget), loses sync
  // until the source lists within the new filter, and drops updates listed
  // under the old one. The loss of sync is announced before the forgets, so
  // no listener takes them for news of an in-sync view. Returns the new
  // generation for the source.
  uint64_t Rescope(KeyFilter<K> filter);
  const KeyFilter<K>& filter() const { return filter_; }
  uint64_t generation() const { return generation_; }
  bool Selected(const K& key) const { return !filter_ || filter_(key); }

 private:
  void CheckOnRunner() const {
    if (runner_ != nullptr) SETPOINT_DCHECK_ON_RUNNER(runner_);
  }
  bool Equal(const V& a, const V& b) const {
    return equal_ ? equal_(a, b) : a == b;
  }
  void Notify(ChangeKind kind, const K& key, const V* old_value,
              const V* new_value) {
    Change<K, V> change{kind, key, old_value, new_value};
    for (auto& listener : listeners_) listener(change);
  }

  std::function<bool(const V&, const V&)> equal_;
  std::shared_ptr<spdlog::logger> logger_;
  Map items_;
  KeyFilter<K> filter_;
  uint64_t generation_ = 0;
  std::vector<Listener> listeners_;
  StoreStats stats_;
  // The runner the store is used on (BindRunner); null: not checked.
  const Runner* runner_ = nullptr;
};

// ---------------------------------------------------------------------------

template <class K, class V>
Store<K, V>::Store(StoreOptions<V> options)
    : Synchronizable(std::move(options.name)),
      equal_(std::move(options.equal)),
      logger_(options.logger != nullptr ? std::move(options.logger)
                                        : spdlog::default_logger()) {}

template <class K, class V>
const V* Store<K, V>::Find(const K& key) const {
  CheckOnRunner();
  auto it = items_.find(key);
  return it == items_.end() ? nullptr : &it->second;
}

template <class K, class V>
bool Store<K, V>::Set(K key, V value) {
  CheckOnRunner();
  if (!Selected(key)) {
    ++stats_.ignored;
    return false;
  }
  auto [it, inserted] = items_.try_emplace(std::move(key), std::move(value));
  if (inserted) {
    ++stats_.sets;
    Notify(ChangeKind::kSet, it->first, nullptr, &it->second);
    return true;
  }
  if (Equal(it->second, value)) {
    ++stats_.unchanged_sets;
    return false;
  }
  V old = std::exchange(it->second, std::move(value));
  ++stats_.sets;
  // Listeners must not change the store, so `it` stays valid.
  Notify(ChangeKind::kSet, it->first, &old, &it->second);
  return true;
}

template <class K, class V>
bool Store<K, V>::Delete(const K& key) {
  CheckOnRunner();
  auto node = items_.extract(key);
  if (node.empty()) return false;
  ++stats_.deletes;
  Notify(ChangeKind::kDelete, node.key(), &node.mapped(), nullptr);
  return true;
}

template <class K, class V>
void Store<K, V>::Apply(StoreUpdate<K, V> update) {
  CheckOnRunner();
  if (update.generation != generation_) {
    ++stats_.ignored;
    SETPOINT_LOG_DEBUG(logger_,
                       "store update from an old filter dropped store={} "
                       "generation={} current={}",
                       name(), update.generation, generation_);
    return;
  }
  if (update.replace) {
    // Delete what the complete list lacks, then set what it has.
    absl::flat_hash_set<K> listed;
    listed.reserve(update.sets.size());
    for (const auto& [key, value] : update.sets) listed.insert(key);
    std::vector<K> gone;
    for (const auto& [key, value] : items_) {
      if (!listed.contains(key)) gone.push_back(key);
    }
    for (const K& key : gone) Delete(key);
  }
  for (auto& [key, value] : update.sets) Set(std::move(key), std::move(value));
  for (const K& key : update.deletes) Delete(key);
  switch (update.sync) {
    case StoreUpdate<K, V>::Sync::kSynced:
      MarkSynced();
      break;
    case StoreUpdate<K, V>::Sync::kLostSync:
      MarkLostSync();
      break;
    case StoreUpdate<K, V>::Sync::kUnchanged:
      break;
  }
}

template <class K, class V>
uint64_t Store<K, V>::Rescope(KeyFilter<K> filter) {
  CheckOnRunner();
  filter_ = std::move(filter);
  ++generation_;
  MarkLostSync();
  std::vector<K> left;
  for (const auto& [key, value] : items_) {
    if (!Selected(key)) left.push_back(key);
  }
  for (const K& key : left) {
    auto node = items_.extract(key);
    ++stats_.forgets;
    Notify(ChangeKind::kForget, node.key(), &node.mapped(), nullptr);
  }
  SETPOINT_LOG_DEBUG(logger_, "store filter changed store={} forgot={} kept={}",
                     name(), left.size(), items_.size());
  return generation_;
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_STORE_H_
