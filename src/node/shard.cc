#include "setpoint/node/shard.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "setpoint/base/check.h"

namespace setpoint {

uint64_t Fnv1a64(std::string_view bytes) {
  uint64_t hash = 0xcbf29ce484222325ULL;  // Offset basis.
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 0x100000001b3ULL;  // FNV prime.
  }
  return hash;
}

uint32_t ShardOf(std::string_view key, uint32_t ring_size) {
  SETPOINT_CHECK_MSG(ring_size > 0, "ShardOf: ring size must be > 0");
  return static_cast<uint32_t>(Fnv1a64(key) % ring_size);
}

ShardRange ShardRange::Intersect(const ShardRange& other) const {
  ShardRange r{std::max(begin, other.begin), std::min(end, other.end)};
  if (r.Empty()) return ShardRange{};
  return r;
}

std::string ShardRange::ToString() const {
  return absl::StrCat("[", begin, ",", end, ")");
}

ShardRange SplitRing(uint32_t ring_size, uint32_t parts, uint32_t index) {
  if (parts == 0 || index >= parts) return ShardRange{};
  uint64_t base = ring_size / parts;
  uint64_t extra = ring_size % parts;  // The first `extra` parts get one more.
  uint64_t begin = index * base + std::min<uint64_t>(index, extra);
  uint64_t size = base + (index < extra ? 1 : 0);
  if (size == 0) return ShardRange{};
  return ShardRange{static_cast<uint32_t>(begin),
                    static_cast<uint32_t>(begin + size)};
}

absl::flat_hash_map<std::string, ShardRange> AssignShards(
    std::vector<std::string> node_ids, uint32_t ring_size) {
  std::sort(node_ids.begin(), node_ids.end());
  node_ids.erase(std::unique(node_ids.begin(), node_ids.end()), node_ids.end());
  absl::flat_hash_map<std::string, ShardRange> out;
  const auto n = static_cast<uint32_t>(node_ids.size());
  for (uint32_t i = 0; i < n; ++i) {
    out.emplace(std::move(node_ids[i]), SplitRing(ring_size, n, i));
  }
  return out;
}

}  // namespace setpoint
