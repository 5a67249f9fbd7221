// Shards: how keys are split between the nodes of a kind. A key maps to a
// shard of a ring (FNV-1a 64 of its bytes modulo the ring size, the same
// function Goten uses, so shard numbers agree with Goten-stamped resources);
// each live node owns one contiguous ShardRange of the ring.
//
//   uint32_t shard = setpoint::ShardOf("vm/web-1");        // ring of 4096
//   auto ranges = setpoint::AssignShards({"pod-b/vm/0", "pod-a/vm/0"});
//   ranges["pod-a/vm/0"];  // [0,2048): ids sorted, ring split evenly
//   if (range.Contains(shard)) ...
//
// Thread safety: pure functions and value types; safe from any thread.
#ifndef SETPOINT_NODE_SHARD_H_
#define SETPOINT_NODE_SHARD_H_

#include <cstdint>
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

// A node's share of the ring with its fencing token (a number that grows
// with every grant of these shards, for the systems the node writes to).
// The registry records range and token per node; a node is told, and every
// client call and plan step of a controller can read (AssignmentOf), the
// whole of it: also who holds it, its kind and the ring's size.
struct Assignment {
  ShardRange range = {};
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

// Assigns a range to each of `node_ids` (duplicates count once): the ids are
// sorted as byte strings and the i-th id gets SplitRing(ring_size, n, i).
// Every process that sees the same live ids computes the same answer.
absl::flat_hash_map<std::string, ShardRange> AssignShards(
    std::vector<std::string> node_ids, uint32_t ring_size = kDefaultRingSize);

}  // namespace setpoint

template <>
struct fmt::formatter<setpoint::ShardRange> : fmt::formatter<std::string> {
  template <typename Ctx>
  auto format(const setpoint::ShardRange& r, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(r.ToString(), ctx);
  }
};

#endif  // SETPOINT_NODE_SHARD_H_
