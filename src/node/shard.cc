#include "setpoint/node/shard.h"

#include <algorithm>
#include <limits>

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
  std::vector<size_t> all(held.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  return AssignSortedShards(held, ring_size, all);
}

std::vector<ShardSet> AssignSortedShards(
    const std::vector<const ShardSet*>& held, uint32_t ring_size,
    const std::vector<size_t>& wanted, SharePlaces* places) {
  // Counts and offsets for every id, sets only for the wanted ones: a pod
  // asks for its own few nodes out of the whole fleet, so nothing here
  // allocates per id.
  const size_t n = held.size();
  std::vector<ShardSet> out(wanted.size());
  if (places != nullptr) {
    *places = SharePlaces{};
    places->place.assign(wanted.size(), std::numeric_limits<uint64_t>::max());
    places->over.assign(wanted.size(), false);
  }
  if (n == 0) return out;

  // What each id holds inside the ring; where records overlap, the first
  // holder in ring order keeps the shards (ties: the lower id).
  struct Run {
    ShardRange range;
    size_t id;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < n; ++i) {
    if (held[i] == nullptr) continue;
    for (const ShardRange& r : held[i]->runs()) {
      const ShardRange inside{r.begin, std::min(r.end, ring_size)};
      if (!inside.Empty()) runs.push_back({inside, i});
    }
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) {
    return a.range.begin != b.range.begin ? a.range.begin < b.range.begin
                                          : a.id < b.id;
  });
  // Cut to what each keeps of the overlaps: disjoint, in ring order.
  std::vector<uint64_t> has(n, 0);
  size_t kept_runs = 0;
  uint32_t covered = 0;
  for (const Run& r : runs) {
    const ShardRange mine{std::max(r.range.begin, covered), r.range.end};
    if (mine.Empty()) continue;
    runs[kept_runs++] = {mine, r.id};
    has[r.id] += mine.size();
    covered = mine.end;
  }
  runs.resize(kept_runs);

  // Shares: q each, q + 1 for R % n ids: those holding more than q first,
  // then those holding less, each in id order.
  const uint64_t q = ring_size / n;
  uint64_t extra = ring_size % n;
  std::vector<uint64_t> share(n, q);
  for (size_t i = 0; i < n && extra > 0; ++i) {
    if (has[i] > q) {
      share[i] = q + 1;
      --extra;
    }
  }
  for (size_t i = 0; i < n && extra > 0; ++i) {
    if (has[i] <= q) {
      share[i] = q + 1;
      --extra;
    }
  }

  if (places != nullptr) {
    places->q = q;
    places->odd = ring_size % n;
    uint64_t over = 0;
    for (size_t i = 0; i < n; ++i) over += has[i] > q ? 1 : 0;
    // Place of id i: the ids over q before it, or all those over q and
    // the others before it.
    std::vector<uint64_t> place(n);
    uint64_t next_over = 0, next_rest = over;
    for (size_t i = 0; i < n; ++i) {
      place[i] = has[i] > q ? next_over++ : next_rest++;
    }
    for (size_t w = 0; w < wanted.size(); ++w) {
      const size_t i = wanted[w];
      if (i >= n) continue;
      places->place[w] = place[i];
      places->over[w] = has[i] > q;
    }
  }

  // Each keeps its lowest shards up to its share (its runs come in ring
  // order); the rest of the ring, in shard order, is the pool.
  std::vector<uint64_t> left = share;  // Of its share, not yet kept.
  std::vector<ShardRange> pool;
  uint32_t at = 0;
  size_t kept = 0;
  for (const Run& r : runs) {
    const uint64_t take = std::min<uint64_t>(left[r.id], r.range.size());
    if (take == 0) continue;
    left[r.id] -= take;
    const ShardRange k{r.range.begin,
                       static_cast<uint32_t>(r.range.begin + take)};
    if (k.begin > at) pool.push_back({at, k.begin});
    at = k.end;
    runs[kept++] = {k, r.id};
  }
  if (at < ring_size) pool.push_back({at, ring_size});
  runs.resize(kept);

  // The pool is cut into the missing parts in id order: id i's part starts
  // where the parts of the ids before it end.
  std::vector<uint64_t> pool_end(pool.size());  // Shards up to each run's end.
  uint64_t total = 0;
  for (size_t p = 0; p < pool.size(); ++p) {
    total += pool[p].size();
    pool_end[p] = total;
  }
  std::vector<uint64_t> part_begin(n + 1, 0);
  for (size_t i = 0; i < n; ++i) part_begin[i + 1] = part_begin[i] + left[i];

  // The kept runs grouped by id (a counting sort: still in ring order).
  std::vector<size_t> by_id_begin(n + 1, 0);
  for (const Run& r : runs) ++by_id_begin[r.id + 1];
  for (size_t i = 0; i < n; ++i) by_id_begin[i + 1] += by_id_begin[i];
  std::vector<ShardRange> by_id(runs.size());
  {
    std::vector<size_t> next(by_id_begin.begin(), by_id_begin.end() - 1);
    for (const Run& r : runs) by_id[next[r.id]++] = r.range;
  }

  for (size_t w = 0; w < wanted.size(); ++w) {
    const size_t i = wanted[w];
    if (i >= n) continue;
    std::vector<ShardRange> got(by_id.begin() + by_id_begin[i],
                                by_id.begin() + by_id_begin[i + 1]);
    uint64_t from = part_begin[i];
    const uint64_t to = std::min(part_begin[i + 1], total);
    // The first pool run that ends after `from`.
    size_t p = static_cast<size_t>(
        std::upper_bound(pool_end.begin(), pool_end.end(), from) -
        pool_end.begin());
    while (from < to && p < pool.size()) {
      const uint64_t run_start = pool_end[p] - pool[p].size();
      const uint64_t upto = std::min(to, pool_end[p]);
      got.push_back(
          {static_cast<uint32_t>(pool[p].begin + (from - run_start)),
           static_cast<uint32_t>(pool[p].begin + (upto - run_start))});
      from = upto;
      ++p;
    }
    out[w] = ShardSet::Of(std::move(got));
  }
  return out;
}

}  // namespace setpoint
