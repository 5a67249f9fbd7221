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

ShardSet::ShardSet(ShardRange range) {
  if (!range.Empty()) runs_.push_back(range);
}

ShardSet ShardSet::Of(std::vector<ShardRange> runs) {
  std::sort(runs.begin(), runs.end(),
            [](const ShardRange& a, const ShardRange& b) {
              return a.begin < b.begin;
            });
  ShardSet out;
  for (const ShardRange& r : runs) {
    if (r.Empty()) continue;
    if (!out.runs_.empty() && r.begin <= out.runs_.back().end) {
      out.runs_.back().end = std::max(out.runs_.back().end, r.end);
    } else {
      out.runs_.push_back(r);
    }
  }
  return out;
}

uint32_t ShardSet::size() const {
  uint64_t n = 0;
  for (const ShardRange& r : runs_) n += r.size();
  return static_cast<uint32_t>(n);
}

bool ShardSet::Contains(uint32_t shard) const {
  // The first run that ends after `shard`.
  auto it = std::upper_bound(
      runs_.begin(), runs_.end(), shard,
      [](uint32_t s, const ShardRange& r) { return s < r.end; });
  return it != runs_.end() && it->begin <= shard;
}

bool ShardSet::Covers(const ShardSet& other) const {
  return other.Minus(*this).Empty();
}

bool ShardSet::Intersects(const ShardSet& other) const {
  size_t i = 0, j = 0;
  while (i < runs_.size() && j < other.runs_.size()) {
    if (runs_[i].Intersects(other.runs_[j])) return true;
    if (runs_[i].end <= other.runs_[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return false;
}

ShardSet ShardSet::Intersect(const ShardSet& other) const {
  ShardSet out;
  size_t i = 0, j = 0;
  while (i < runs_.size() && j < other.runs_.size()) {
    ShardRange both = runs_[i].Intersect(other.runs_[j]);
    if (!both.Empty()) out.runs_.push_back(both);
    if (runs_[i].end <= other.runs_[j].end) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;  // Pieces of disjoint, non-adjacent runs stay so.
}

ShardSet ShardSet::Union(const ShardSet& other) const {
  std::vector<ShardRange> all = runs_;
  all.insert(all.end(), other.runs_.begin(), other.runs_.end());
  return Of(std::move(all));
}

ShardSet ShardSet::Minus(const ShardSet& other) const {
  ShardSet out;
  size_t j = 0;
  for (ShardRange r : runs_) {
    while (j < other.runs_.size() && other.runs_[j].end <= r.begin) ++j;
    for (size_t k = j; k < other.runs_.size() && other.runs_[k].begin < r.end;
         ++k) {
      const ShardRange& cut = other.runs_[k];
      if (cut.begin > r.begin) out.runs_.push_back({r.begin, cut.begin});
      r.begin = std::max(r.begin, cut.end);
      if (r.Empty()) break;
    }
    if (!r.Empty()) out.runs_.push_back(r);
  }
  return out;
}

ShardRange ShardSet::Hull() const {
  if (runs_.empty()) return ShardRange{};
  return ShardRange{runs_.front().begin, runs_.back().end};
}

std::string ShardSet::ToString() const {
  if (runs_.empty()) return ShardRange{}.ToString();
  std::string out;
  for (size_t i = 0; i < runs_.size(); ++i) {
    if (i > 0) out += "+";
    out += runs_[i].ToString();
  }
  return out;
}

std::string ShardSet::RunsJson() const {
  std::string out = "[";
  for (size_t i = 0; i < runs_.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? "," : "", "[", runs_[i].begin, ",",
                    runs_[i].end, "]");
  }
  return out + "]";
}

namespace {

// The lowest `n` shards of `set`.
ShardSet Lowest(const ShardSet& set, uint64_t n) {
  std::vector<ShardRange> out;
  for (const ShardRange& r : set.runs()) {
    if (n == 0) break;
    const uint64_t take = std::min<uint64_t>(n, r.size());
    out.push_back({r.begin, static_cast<uint32_t>(r.begin + take)});
    n -= take;
  }
  return ShardSet::Of(std::move(out));
}

}  // namespace

absl::flat_hash_map<std::string, ShardSet> AssignShards(
    std::vector<std::string> node_ids, uint32_t ring_size,
    const std::map<std::string, ShardSet>& held) {
  std::sort(node_ids.begin(), node_ids.end());
  node_ids.erase(std::unique(node_ids.begin(), node_ids.end()), node_ids.end());
  std::vector<const ShardSet*> holds(node_ids.size(), nullptr);
  for (size_t i = 0; i < node_ids.size(); ++i) {
    if (auto it = held.find(node_ids[i]); it != held.end()) {
      holds[i] = &it->second;
    }
  }
  std::vector<ShardSet> shares = AssignSortedShards(holds, ring_size);
  absl::flat_hash_map<std::string, ShardSet> out;
  for (size_t i = 0; i < node_ids.size(); ++i) {
    out.emplace(std::move(node_ids[i]), std::move(shares[i]));
  }
  return out;
}

std::vector<ShardSet> AssignSortedShards(
    const std::vector<const ShardSet*>& held, uint32_t ring_size) {
  const size_t n = held.size();
  std::vector<ShardSet> out(n);
  if (n == 0) return out;
  const ShardSet ring = ShardRange{0, ring_size};

  // What each id holds inside the ring; where records overlap, the first
  // holder in ring order keeps the shards (ties: the lower id).
  struct Run {
    ShardRange range;
    size_t id;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < n; ++i) {
    if (held[i] == nullptr) continue;
    const ShardSet inside = held[i]->Intersect(ring);
    for (const ShardRange& r : inside.runs()) runs.push_back({r, i});
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
    return a.range.begin != b.range.begin ? a.range.begin < b.range.begin
                                          : a.id < b.id;
  });
  std::vector<std::vector<ShardRange>> holds(n);
  uint32_t covered = 0;
  for (const Run& r : runs) {
    ShardRange mine{std::max(r.range.begin, covered), r.range.end};
    if (mine.Empty()) continue;
    holds[r.id].push_back(mine);
    covered = mine.end;
  }
  std::vector<ShardSet> has(n);
  for (size_t i = 0; i < n; ++i) has[i] = ShardSet::Of(std::move(holds[i]));

  // Shares: q each, q + 1 for R % n ids: those holding more than q first,
  // then those holding less, each in id order.
  const uint64_t q = ring_size / n;
  uint64_t extra = ring_size % n;
  std::vector<uint64_t> share(n, q);
  for (size_t i = 0; i < n && extra > 0; ++i) {
    if (has[i].size() > q) {
      share[i] = q + 1;
      --extra;
    }
  }
  for (size_t i = 0; i < n && extra > 0; ++i) {
    if (has[i].size() <= q) {
      share[i] = q + 1;
      --extra;
    }
  }

  // Each keeps its lowest shards up to its share; the rest of the ring, in
  // shard order, fills the missing parts in id order.
  std::vector<ShardSet> kept(n);
  std::vector<ShardRange> all_kept;
  for (size_t i = 0; i < n; ++i) {
    kept[i] = Lowest(has[i], share[i]);
    all_kept.insert(all_kept.end(), kept[i].runs().begin(),
                    kept[i].runs().end());
  }
  const ShardSet pool = ring.Minus(ShardSet::Of(std::move(all_kept)));
  size_t run = 0;
  uint32_t at = pool.runs().empty() ? 0 : pool.runs()[0].begin;
  for (size_t i = 0; i < n; ++i) {
    uint64_t need = share[i] - kept[i].size();
    std::vector<ShardRange> got = kept[i].runs();
    while (need > 0 && run < pool.runs().size()) {
      const ShardRange& r = pool.runs()[run];
      const uint64_t take = std::min<uint64_t>(need, r.end - at);
      got.push_back({at, static_cast<uint32_t>(at + take)});
      at += static_cast<uint32_t>(take);
      need -= take;
      if (at == r.end && ++run < pool.runs().size()) {
        at = pool.runs()[run].begin;
      }
    }
    out[i] = ShardSet::Of(std::move(got));
  }
  return out;
}

}  // namespace setpoint
