// SyncTable: the Syncer's entries in a flat store: slots in fixed chunks
// (no heap node per key, stable addresses) and an index of slot ids by
// key that stores no key of its own, only each key's hash.
//
//   SyncTable<std::string, Spec, Vm> table;
//   auto [id, inserted] = table.FindOrInsert("web-1");
//   table[id].desired = Spec{...};
//   table.Erase(id);  // the id may be reused by a later insert
//
// Thread safety: not thread-safe; the Syncer's runner owns it. A slot's
// address is stable until it is erased.
#ifndef SETPOINT_PROCESSOR_INTERNAL_SYNC_TABLE_H_
#define SETPOINT_PROCESSOR_INTERNAL_SYNC_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "setpoint/processor/internal/sync_rules.h"

namespace setpoint::internal {

template <class K, class D, class O>
class SyncTable {
 public:
  struct Slot {
    K key;
    std::optional<D> desired;
    std::optional<O> observed;
    KeyState state;
  };

  SyncTable() : index_(0, IdHash{this}, IdEq{this}) {}
  SyncTable(const SyncTable&) = delete;
  SyncTable& operator=(const SyncTable&) = delete;
  ~SyncTable() {
    for (uint32_t id = 0; id < made_; ++id) {
      if (live_[id]) At(id).~Slot();
    }
  }

  // The slot of `key`, or kNoSlot.
  uint32_t Find(const K& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? kNoSlot : it->id;
  }
  // The slot of `key`, made empty when there was none; and whether it was.
  // One hash of the key per call: the index keeps each key's hash, so
  // neither the insert nor a rehash hashes a key again.
  template <class Key>
  std::pair<uint32_t, bool> FindOrInsert(Key&& key) {
    const size_t hash = absl::Hash<K>{}(key);
    auto it = index_.find(key, hash);
    if (it != index_.end()) return {it->id, false};
    const uint32_t id = Allocate();
    ::new (static_cast<void*>(&At(id)))
        Slot{K(std::forward<Key>(key)), std::nullopt, std::nullopt, KeyState{}};
    live_[id] = true;
    index_.insert(SlotId{id, hash});
    return {id, true};
  }
  void Erase(uint32_t id) {
    index_.erase(At(id).key);
    At(id).~Slot();
    live_[id] = false;
    free_.push_back(id);
  }

  Slot& operator[](uint32_t id) { return At(id); }
  const Slot& operator[](uint32_t id) const { return At(id); }
  bool Live(uint32_t id) const { return id < made_ && live_[id]; }
  size_t size() const { return index_.size(); }

  // Calls fn(id, slot) for every slot; fn may erase the slot it is given.
  template <class Fn>
  void ForEach(Fn&& fn) {
    for (uint32_t id = 0; id < made_; ++id) {
      if (live_[id]) fn(id, At(id));
    }
  }
  template <class Fn>
  void ForEach(Fn&& fn) const {
    for (uint32_t id = 0; id < made_; ++id) {
      if (live_[id]) fn(id, At(id));
    }
  }

 private:
  static constexpr uint32_t kChunkBits = 9;
  static constexpr uint32_t kChunk = 1u << kChunkBits;
  struct alignas(Slot) Storage {
    std::byte bytes[sizeof(Slot)];
  };
  // A slot id in the index (its own type, so keys that are integers do
  // not mix with ids).
  struct SlotId {
    uint32_t id;
    size_t hash;  // Of the slot's key.
  };
  struct IdHash {
    using is_transparent = void;
    const SyncTable* table;
    size_t operator()(const SlotId& s) const { return s.hash; }
    size_t operator()(const K& key) const { return absl::Hash<K>{}(key); }
  };
  struct IdEq {
    using is_transparent = void;
    const SyncTable* table;
    bool operator()(const SlotId& a, const SlotId& b) const {
      return a.id == b.id;
    }
    bool operator()(const SlotId& a, const K& b) const {
      return table->At(a.id).key == b;
    }
    bool operator()(const K& a, const SlotId& b) const {
      return a == table->At(b.id).key;
    }
  };

  Slot& At(uint32_t id) const {
    return *std::launder(
        reinterpret_cast<Slot*>(&chunks_[id >> kChunkBits][id & (kChunk - 1)]));
  }
  uint32_t Allocate() {
    if (!free_.empty()) {
      const uint32_t id = free_.back();
      free_.pop_back();
      return id;
    }
    if ((made_ & (kChunk - 1)) == 0) {
      chunks_.push_back(std::make_unique_for_overwrite<Storage[]>(kChunk));
      live_.resize(live_.size() + kChunk, false);
    }
    return made_++;
  }

  std::vector<std::unique_ptr<Storage[]>> chunks_;
  std::vector<bool> live_;
  std::vector<uint32_t> free_;
  uint32_t made_ = 0;  // Slots ever allocated (live or free).
  absl::flat_hash_set<SlotId, IdHash, IdEq> index_;
};

}  // namespace setpoint::internal

#endif  // SETPOINT_PROCESSOR_INTERNAL_SYNC_TABLE_H_
