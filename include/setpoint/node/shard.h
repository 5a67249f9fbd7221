// Shards: how keys are split between the nodes of a kind. A key maps to a
// shard of a ring (FNV-1a 64 of its bytes modulo the ring size, the same
// function Goten uses, so shard numbers agree with Goten-stamped resources);
// each live node owns a ShardSet of the ring: one or a few runs (ShardRange)
// of consecutive shards.
//
//   uint32_t shard = setpoint::ShardOf("vm/web-1");        // ring of 4096
//   auto targets = setpoint::AssignShards({"pod-b/vm/0", "pod-a/vm/0"});
//   targets["pod-a/vm/0"];  // [0,2048): nothing held yet, an even split
//   targets = setpoint::AssignShards(ids, 4096, held);  // sticky: each keeps
//                                                       // what it holds
//   if (assignment.range.Contains(shard)) ...
//
// Thread safety: pure functions and value types; safe from any thread.
#ifndef SETPOINT_NODE_SHARD_H_
#define SETPOINT_NODE_SHARD_H_

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "fmt/format.h"

namespace setpoint {

// The default number of shards in a ring.
inline constexpr uint32_t kDefaultRingSize = 4096;

// FNV-1a 64 of `bytes` (Go's hash/fnv New64a).
uint64_t Fnv1a64(std::string_view bytes);

// The shard of `key` in a ring of `ring_size` shards (> 0; 0 is a bug and
// aborts).
uint32_t ShardOf(std::string_view key, uint32_t ring_size = kDefaultRingSize);

// A half-open interval [begin, end) of shards. Empty when begin >= end.
struct ShardRange {
  uint32_t begin = 0;
  uint32_t end = 0;

  bool Empty() const { return begin >= end; }
  uint32_t size() const { return Empty() ? 0 : end - begin; }
  bool Contains(uint32_t shard) const { return shard >= begin && shard < end; }
  // True when every shard of `other` is in this range (an empty `other` is
  // in every range).
  bool Covers(const ShardRange& other) const {
    return other.Empty() || (other.begin >= begin && other.end <= end);
  }
  bool Intersects(const ShardRange& other) const {
    return !Empty() && !other.Empty() && begin < other.end && other.begin < end;
  }
  // The shards in both; an empty range ([0,0)) when there are none.
  ShardRange Intersect(const ShardRange& other) const;
  std::string ToString() const;

  friend bool operator==(const ShardRange&, const ShardRange&) = default;
};

// A set of shards: sorted, disjoint runs, never empty and never adjacent
// (adjacent runs merge), so two sets with the same shards are equal. A
// ShardRange converts to the set of its shards. What a node owns
// (Assignment::range) is one: a node may hold a few runs of the ring.
class ShardSet {
 public:
  ShardSet() = default;
  // The shards of `range` (none when it is empty).
  ShardSet(ShardRange range);  // NOLINT(google-explicit-constructor)
  // The shards [begin, end).
  ShardSet(uint32_t begin, uint32_t end) : ShardSet(ShardRange{begin, end}) {}
  // The union of `runs`, in any order, overlapping or not.
  static ShardSet Of(std::vector<ShardRange> runs);

  bool Empty() const { return runs_.empty(); }
  // The number of shards.
  uint32_t size() const;
  bool Contains(uint32_t shard) const;
  // True when every shard of `other` is in this set.
  bool Covers(const ShardSet& other) const;
  bool Intersects(const ShardSet& other) const;
  ShardSet Intersect(const ShardSet& other) const;
  ShardSet Union(const ShardSet& other) const;
  // The shards of this set that are not in `other`.
  ShardSet Minus(const ShardSet& other) const;
  // The runs, sorted.
  const std::vector<ShardRange>& runs() const { return runs_; }
  // The smallest range holding every shard ([0,0) when empty).
  ShardRange Hull() const;
  // "[0,10)" for one run, "[0,10)+[20,30)" for more, "[0,0)" when empty.
  std::string ToString() const;
  // The runs as JSON: [[0,10],[20,30]] ([] when empty).
  std::string RunsJson() const;

  friend bool operator==(const ShardSet&, const ShardSet&) = default;
  friend std::ostream& operator<<(std::ostream& os, const ShardSet& s) {
    return os << s.ToString();
  }

 private:
  std::vector<ShardRange> runs_;
};

// A node's share of the ring with its fencing token (a number that grows
// with every grant of these shards, for the systems the node writes to).
// The registry records range and token per node; a node is told, and every
// client call and plan step of a controller can read (AssignmentOf), the
// whole of it: also who holds it, its kind and the ring's size.
struct Assignment {
  // The node's shards: one run or a few (AssignShards).
  ShardSet range = {};
  uint64_t token = 0;
  // Set when a node is told (UpdateShardRange); empty in registry records,
  // which are keyed by node id already.
  std::string node_id = "";
  std::string kind = "";
  uint32_t ring_size = kDefaultRingSize;

  // True when `key` falls in `range` (on a ring of ring_size).
  bool Owns(std::string_view key) const {
    return range.Contains(ShardOf(key, ring_size));
  }
  friend bool operator==(const Assignment&, const Assignment&) = default;
};

// The i-th of `parts` contiguous ranges that split a ring of `ring_size`
// shards evenly: sizes differ by at most one, the larger ones first. With
// more parts than shards the last parts are empty.
ShardRange SplitRing(uint32_t ring_size, uint32_t parts, uint32_t index);

// The share of each of `node_ids` (duplicates count once), given what each
// holds now (`held`; ids not in `node_ids` are ignored, and so are shards
// outside the ring). The rule is sticky and balanced, and every process
// that sees the same ids and holdings computes the same answer:
//   - Every shard goes to exactly one id, and each id gets q = R / n or
//     q + 1 shards (R the ring size, n the ids): R % n ids get q + 1. Those
//     are the ids holding more than q, in id order; when there are fewer,
//     then the other ids, in id order.
//   - Each id keeps the lowest shards it holds, up to its share. Where
//     holdings overlap (a registry that records nonsense), the lower
//     shards' first holder in ring order keeps them.
//   - The rest of the ring, in shard order, is cut into the missing parts
//     of the ids that need more, in id order.
// So nothing moves when everyone holds its share; from such a state one id
// joining or leaving moves at most ceil(R / n) shards (n the larger count),
// the fewest that any split within one shard can move; and following the
// moves (shrinking to the target, then growing into free shards) leaves
// the answer unchanged. With nothing held it is SplitRing's even split in
// sorted id order.
absl::flat_hash_map<std::string, ShardSet> AssignShards(
    std::vector<std::string> node_ids, uint32_t ring_size = kDefaultRingSize,
    const std::map<std::string, ShardSet>& held = {});

// AssignShards for ids already sorted and unique, given by position:
// `held[i]` is what the i-th id holds (null: nothing); the i-th result is
// its share. The same answer, without a map of the ids.
std::vector<ShardSet> AssignSortedShards(
    const std::vector<const ShardSet*>& held,
    uint32_t ring_size = kDefaultRingSize);

// Where the wanted ids stand in the order that hands out the odd shards.
// A share is q or q + 1: the first `odd` (R mod n) ids of the order get
// q + 1, and the order is the ids that hold more than q ("over"), then the
// others, each in id order. So while the ids stay the same, a share moves
// only when some id's holding crosses q (a grant or a release elsewhere),
// and a pod can follow its own places from such changes alone (see
// NodeManager) instead of computing the rule again for every one.
struct SharePlaces {
  uint64_t q = 0;    // R / n (0 with no ids).
  uint64_t odd = 0;  // R mod n: the places below it get q + 1.
  // Per wanted position: its place in the order and whether it is over
  // q; UINT64_MAX and false for a position past the end.
  std::vector<uint64_t> place;
  std::vector<bool> over;
};

// The shares of the ids at positions `wanted` only (in that order; a
// position past the end gets nothing): the same answer as above for them,
// in time linear in the ids and runs, building sets only for the wanted.
// What a pod needs for its own nodes out of the fleet. With `places`,
// also where the wanted ids stand (SharePlaces).
std::vector<ShardSet> AssignSortedShards(
    const std::vector<const ShardSet*>& held, uint32_t ring_size,
    const std::vector<size_t>& wanted, SharePlaces* places = nullptr);

}  // namespace setpoint

template <>
struct fmt::formatter<setpoint::ShardRange> : fmt::formatter<std::string> {
  template <typename Ctx>
  auto format(const setpoint::ShardRange& r, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(r.ToString(), ctx);
  }
};

template <>
struct fmt::formatter<setpoint::ShardSet> : fmt::formatter<std::string> {
  template <typename Ctx>
  auto format(const setpoint::ShardSet& s, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(s.ToString(), ctx);
  }
};

#endif  // SETPOINT_NODE_SHARD_H_
