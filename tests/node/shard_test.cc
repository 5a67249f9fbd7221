#include "setpoint/node/shard.h"

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fmt/format.h"
#include "gtest/gtest.h"

namespace setpoint {
namespace {

// Vectors from the FNV reference and Go's hash/fnv tests (New64a).
TEST(ShardTest, Fnv1a64MatchesGo) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(ShardTest, ShardOfIsHashModuloRing) {
  EXPECT_EQ(ShardOf(""), 0xcbf29ce484222325ULL % 4096);
  EXPECT_EQ(ShardOf("a"), 3212u);
  EXPECT_EQ(ShardOf("foobar"), 2024u);
  EXPECT_EQ(ShardOf("foobar", 1), 0u);
  EXPECT_EQ(ShardOf("foobar", 7), 0x85944171f73967e8ULL % 7);
  // Bytes, not characters: a NUL inside the key counts.
  EXPECT_NE(ShardOf(std::string("a\0b", 3)), ShardOf("ab"));
}

TEST(ShardTest, ShardOfZeroRingAborts) {
  EXPECT_DEATH(ShardOf("a", 0), "ring size");
}

TEST(ShardTest, RangeBasics) {
  ShardRange r{10, 20};
  EXPECT_FALSE(r.Empty());
  EXPECT_EQ(r.size(), 10u);
  EXPECT_TRUE(r.Contains(10));
  EXPECT_TRUE(r.Contains(19));
  EXPECT_FALSE(r.Contains(20));
  EXPECT_FALSE(r.Contains(9));
  EXPECT_TRUE((ShardRange{5, 5}).Empty());
  EXPECT_TRUE((ShardRange{6, 5}).Empty());
  EXPECT_EQ((ShardRange{6, 5}).size(), 0u);
  EXPECT_FALSE((ShardRange{}).Contains(0));
  EXPECT_EQ(r.ToString(), "[10,20)");
  EXPECT_EQ(fmt::format("range={}", r), "range=[10,20)");
}

TEST(ShardTest, RangeSetOperations) {
  ShardRange r{10, 20};
  EXPECT_EQ(r.Intersect({15, 30}), (ShardRange{15, 20}));
  EXPECT_EQ(r.Intersect({20, 30}), ShardRange{});
  EXPECT_EQ(r.Intersect({0, 5}), ShardRange{});
  EXPECT_TRUE(r.Intersects({19, 25}));
  EXPECT_FALSE(r.Intersects({20, 25}));
  EXPECT_FALSE(r.Intersects({}));
  EXPECT_TRUE(r.Covers({12, 18}));
  EXPECT_TRUE(r.Covers({}));
  EXPECT_FALSE(r.Covers({12, 21}));
}

TEST(ShardTest, SplitRingIsEvenContiguousAndComplete) {
  for (uint32_t ring : {1u, 7u, 64u, 4096u}) {
    for (uint32_t parts = 1; parts <= 70; ++parts) {
      uint32_t next = 0;
      uint32_t min_size = ring, max_size = 0;
      for (uint32_t i = 0; i < parts; ++i) {
        ShardRange r = SplitRing(ring, parts, i);
        if (r.Empty()) {
          EXPECT_GE(parts, ring) << "only with more parts than shards";
          min_size = 0;
          continue;
        }
        EXPECT_EQ(r.begin, next) << "ring=" << ring << " parts=" << parts;
        next = r.end;
        min_size = std::min(min_size, r.size());
        max_size = std::max(max_size, r.size());
      }
      EXPECT_EQ(next, ring) << "ring=" << ring << " parts=" << parts;
      EXPECT_LE(max_size - min_size, 1u)
          << "ring=" << ring << " parts=" << parts;
    }
  }
  EXPECT_EQ(SplitRing(10, 3, 0), (ShardRange{0, 4}));
  EXPECT_EQ(SplitRing(10, 3, 1), (ShardRange{4, 7}));
  EXPECT_EQ(SplitRing(10, 3, 2), (ShardRange{7, 10}));
  EXPECT_EQ(SplitRing(10, 0, 0), ShardRange{});
  EXPECT_EQ(SplitRing(10, 3, 3), ShardRange{});
}

TEST(ShardTest, AssignShardsSortsIdsAndIgnoresDuplicates) {
  auto a = AssignShards(
      {"pod-b/vm/0", "pod-a/vm/1", "pod-a/vm/0", "pod-a/vm/1"}, 4096);
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a["pod-a/vm/0"], (ShardRange{0, 1366}));
  EXPECT_EQ(a["pod-a/vm/1"], (ShardRange{1366, 2731}));
  EXPECT_EQ(a["pod-b/vm/0"], (ShardRange{2731, 4096}));
  // The same set in another order gives the same answer.
  EXPECT_EQ(AssignShards({"pod-a/vm/0", "pod-b/vm/0", "pod-a/vm/1"}, 4096), a);
  EXPECT_TRUE(AssignShards({}, 4096).empty());
  EXPECT_EQ(AssignShards({"only"}, 4096)["only"], (ShardRange{0, 4096}));
}

TEST(ShardSetTest, NormalizesRuns) {
  ShardSet s = ShardSet::Of({{20, 30}, {0, 5}, {5, 10}, {25, 40}, {50, 50}});
  EXPECT_EQ(s.runs(), (std::vector<ShardRange>{{0, 10}, {20, 40}}));
  EXPECT_EQ(s.size(), 30u);
  EXPECT_EQ(s.ToString(), "[0,10)+[20,40)");
  EXPECT_EQ(fmt::format("range={}", s), "range=[0,10)+[20,40)");
  EXPECT_EQ(s.Hull(), (ShardRange{0, 40}));
  EXPECT_EQ(ShardSet().ToString(), "[0,0)");
  EXPECT_TRUE(ShardSet(ShardRange{3, 3}).Empty());
  EXPECT_EQ(ShardSet(ShardRange{3, 9}), ShardSet::Of({{3, 5}, {5, 9}}));
  // A range compares with the set of its shards.
  EXPECT_EQ(ShardSet(ShardRange{0, 10}), (ShardRange{0, 10}));
}

TEST(ShardSetTest, SetOperations) {
  ShardSet a = ShardSet::Of({{0, 10}, {20, 30}});
  ShardSet b = ShardSet::Of({{5, 25}});
  EXPECT_TRUE(a.Contains(0));
  EXPECT_TRUE(a.Contains(9));
  EXPECT_FALSE(a.Contains(10));
  EXPECT_TRUE(a.Contains(20));
  EXPECT_FALSE(a.Contains(30));
  EXPECT_EQ(a.Intersect(b), ShardSet::Of({{5, 10}, {20, 25}}));
  EXPECT_EQ(a.Union(b), ShardSet(ShardRange{0, 30}));
  EXPECT_EQ(a.Minus(b), ShardSet::Of({{0, 5}, {25, 30}}));
  EXPECT_EQ(b.Minus(a), ShardSet(ShardRange{10, 20}));
  EXPECT_TRUE(a.Intersects(b));
  EXPECT_FALSE(a.Intersects(ShardRange{10, 20}));
  EXPECT_TRUE(a.Covers(ShardSet::Of({{1, 3}, {22, 30}})));
  EXPECT_FALSE(a.Covers(b));
  EXPECT_TRUE(a.Covers(ShardSet()));
  EXPECT_TRUE(ShardSet().Covers(ShardSet()));
  EXPECT_EQ(a.Minus(a), ShardSet());
}

TEST(ShardSetTest, OperationsAgreeWithShardByShard) {
  std::mt19937 rng(7);
  auto random_set = [&] {
    std::vector<ShardRange> runs;
    for (int i = std::uniform_int_distribution<int>(0, 5)(rng); i > 0; --i) {
      uint32_t b = std::uniform_int_distribution<uint32_t>(0, 99)(rng);
      uint32_t e = std::uniform_int_distribution<uint32_t>(b, 100)(rng);
      runs.push_back({b, e});
    }
    return ShardSet::Of(runs);
  };
  for (int round = 0; round < 500; ++round) {
    ShardSet a = random_set(), b = random_set();
    ShardSet both = a.Intersect(b), any = a.Union(b), only = a.Minus(b);
    for (uint32_t s = 0; s < 100; ++s) {
      EXPECT_EQ(both.Contains(s), a.Contains(s) && b.Contains(s));
      EXPECT_EQ(any.Contains(s), a.Contains(s) || b.Contains(s));
      EXPECT_EQ(only.Contains(s), a.Contains(s) && !b.Contains(s));
    }
    EXPECT_EQ(a.Intersects(b), !both.Empty());
    EXPECT_EQ(a.Covers(b), both == b);
    for (size_t i = 1; i < any.runs().size(); ++i) {
      EXPECT_LT(any.runs()[i - 1].end, any.runs()[i].begin) << "merged";
    }
  }
}

// The rule's promises, checked on one answer: every shard once, shares
// within one of each other.
void ExpectPartition(const absl::flat_hash_map<std::string, ShardSet>& t,
                     uint32_t ring) {
  std::vector<int> owners(ring, 0);
  uint32_t lo = ring, hi = 0;
  for (const auto& [id, set] : t) {
    for (const ShardRange& r : set.runs()) {
      ASSERT_LE(r.end, ring);
      for (uint32_t s = r.begin; s < r.end; ++s) ++owners[s];
    }
    lo = std::min(lo, set.size());
    hi = std::max(hi, set.size());
  }
  for (uint32_t s = 0; s < ring; ++s) ASSERT_EQ(owners[s], 1) << "shard " << s;
  EXPECT_EQ(lo, ring / t.size());
  EXPECT_LE(hi - lo, 1u);
}

std::map<std::string, ShardSet> AsHeld(
    const absl::flat_hash_map<std::string, ShardSet>& t) {
  return std::map<std::string, ShardSet>(t.begin(), t.end());
}

uint32_t Moved(const std::map<std::string, ShardSet>& before,
               const absl::flat_hash_map<std::string, ShardSet>& after) {
  uint32_t moved = 0;
  for (const auto& [id, set] : after) {
    auto it = before.find(id);
    moved += it == before.end() ? set.size() : set.Minus(it->second).size();
  }
  return moved;
}

// The rule as its header states it, one shard at a time: the reference the
// run-by-run implementation must agree with.
std::vector<ShardSet> AssignShardByShard(
    const std::vector<const ShardSet*>& held, uint32_t ring) {
  const size_t n = held.size();
  // A shard's holder: of the runs containing it, the one that begins
  // lowest (ties: the lower id).
  std::vector<size_t> holder(ring, n);
  for (uint32_t s = 0; s < ring; ++s) {
    uint32_t best_begin = ring;
    for (size_t i = 0; i < n; ++i) {
      if (held[i] == nullptr) continue;
      for (const ShardRange& r : held[i]->runs()) {
        if (r.begin <= s && s < r.end && r.begin < best_begin) {
          best_begin = r.begin;
          holder[s] = i;
        }
      }
    }
  }
  std::vector<uint32_t> has(n, 0);
  for (uint32_t s = 0; s < ring; ++s) {
    if (holder[s] < n) ++has[holder[s]];
  }
  std::vector<uint32_t> share(n, ring / static_cast<uint32_t>(n));
  uint32_t extra = ring % static_cast<uint32_t>(n);
  for (size_t i = 0; i < n && extra > 0; ++i) {
    if (has[i] > ring / n) ++share[i], --extra;
  }
  for (size_t i = 0; i < n && extra > 0; ++i) {
    if (has[i] <= ring / n) ++share[i], --extra;
  }
  std::vector<std::vector<ShardRange>> got(n);
  std::vector<uint32_t> count(n, 0);
  std::vector<uint32_t> pool;
  for (uint32_t s = 0; s < ring; ++s) {  // Lowest first: the kept ones.
    const size_t h = holder[s];
    if (h < n && count[h] < share[h]) {
      got[h].push_back({s, s + 1});
      ++count[h];
    } else {
      pool.push_back(s);
    }
  }
  size_t next = 0;
  for (size_t i = 0; i < n; ++i) {
    for (; count[i] < share[i]; ++count[i]) {
      got[i].push_back({pool[next], pool[next] + 1});
      ++next;
    }
  }
  std::vector<ShardSet> out;
  for (auto& runs : got) out.push_back(ShardSet::Of(std::move(runs)));
  return out;
}

TEST(AssignShardsTest, AgreesWithTheRuleShardByShard) {
  std::mt19937 rng(11);
  for (int round = 0; round < 2000; ++round) {
    const uint32_t ring = std::uniform_int_distribution<uint32_t>(1, 200)(rng);
    const size_t n = std::uniform_int_distribution<size_t>(1, 12)(rng);
    std::vector<ShardSet> sets(n);
    std::vector<const ShardSet*> held(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 4 == 0) continue;  // Holds nothing.
      std::vector<ShardRange> runs;
      for (int k = std::uniform_int_distribution<int>(0, 3)(rng); k > 0; --k) {
        // Overlapping, past the ring's end, empty: a registry's nonsense.
        uint32_t b = std::uniform_int_distribution<uint32_t>(0, ring + 5)(rng);
        uint32_t len =
            std::uniform_int_distribution<uint32_t>(0, ring / 2 + 2)(rng);
        runs.push_back({b, b + len});
      }
      sets[i] = ShardSet::Of(runs);
      held[i] = &sets[i];
    }
    const std::vector<ShardSet> want = AssignShardByShard(held, ring);
    ASSERT_EQ(AssignSortedShards(held, ring), want) << "round " << round;
    // Only some ids asked for, in any order, some past the end.
    std::vector<size_t> wanted;
    for (size_t k = rng() % (n + 3); k > 0; --k)
      wanted.push_back(rng() % (n + 2));
    const std::vector<ShardSet> some = AssignSortedShards(held, ring, wanted);
    ASSERT_EQ(some.size(), wanted.size());
    for (size_t k = 0; k < wanted.size(); ++k) {
      EXPECT_EQ(some[k], wanted[k] < n ? want[wanted[k]] : ShardSet{})
          << "round " << round << " id " << wanted[k];
    }
  }
}

TEST(AssignShardsTest, NothingHeldIsTheEvenSplit) {
  for (uint32_t ring : {1u, 7u, 256u, 4096u}) {
    for (uint32_t n : {1u, 2u, 3u, 10u, 300u}) {
      std::vector<std::string> ids;
      for (uint32_t i = 0; i < n; ++i) ids.push_back(absl::StrCat("p/k/", i));
      std::vector<std::string> sorted = ids;
      std::sort(sorted.begin(), sorted.end());
      auto t = AssignShards(ids, ring);
      for (uint32_t i = 0; i < n; ++i) {
        EXPECT_EQ(t[sorted[i]], SplitRing(ring, n, i))
            << "ring=" << ring << " n=" << n;
      }
    }
  }
}

TEST(AssignShardsTest, KeepsWhatEachHoldsUpToItsShare) {
  // a holds too much, b its share, c nothing.
  std::map<std::string, ShardSet> held = {{"a", ShardRange{0, 60}},
                                          {"b", ShardRange{60, 90}}};
  auto t = AssignShards({"a", "b", "c"}, 90, held);
  EXPECT_EQ(t["a"], ShardSet(ShardRange{0, 30}));
  EXPECT_EQ(t["b"], ShardSet(ShardRange{60, 90}));
  EXPECT_EQ(t["c"], ShardSet(ShardRange{30, 60}));
  // Holdings outside the ring and of ids that are not sharing are ignored;
  // overlapping records: the first holder in ring order keeps the shards.
  held = {{"a", ShardRange{0, 50}},
          {"b", ShardSet::Of({{40, 60}, {95, 120}})},
          {"gone", ShardRange{60, 90}}};
  t = AssignShards({"a", "b", "c"}, 90, held);
  ExpectPartition(t, 90);
  EXPECT_EQ(t["a"], ShardSet(ShardRange{0, 30}));
  EXPECT_EQ(t["b"], ShardSet(ShardRange{50, 60}).Union(t["b"]));
}

TEST(AssignShardsTest, IsAFixedPointOnceHeld) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    const uint32_t ring = std::uniform_int_distribution<uint32_t>(1, 600)(rng);
    std::vector<std::string> ids;
    std::map<std::string, ShardSet> held;
    for (int i = std::uniform_int_distribution<int>(1, 40)(rng); i > 0; --i) {
      std::string id = absl::StrCat("p", rng() % 50, "/k/", rng() % 4);
      ids.push_back(id);
      uint32_t b = std::uniform_int_distribution<uint32_t>(0, ring)(rng);
      uint32_t e = std::uniform_int_distribution<uint32_t>(b, ring + 5)(rng);
      held[id] = held[id].Union(ShardRange{b, e});
    }
    auto t = AssignShards(ids, ring, held);
    ExpectPartition(t, ring);
    // Deterministic: the order of the ids does not matter.
    std::shuffle(ids.begin(), ids.end(), rng);
    EXPECT_EQ(AssignShards(ids, ring, held), t);
    // Held as assigned: nothing moves.
    EXPECT_EQ(AssignShards(ids, ring, AsHeld(t)), t);
  }
}

TEST(AssignShardsTest, FollowingTheMovesKeepsTheAnswer) {
  // From any holdings (disjoint, as a registry records them): every node
  // shrinks to its target, then the nodes grow one at a time; the answer
  // computed on every state in between is the same.
  std::mt19937 rng(5);
  for (int round = 0; round < 200; ++round) {
    const uint32_t ring = std::uniform_int_distribution<uint32_t>(1, 1000)(rng);
    const int n = std::uniform_int_distribution<int>(1, 30)(rng);
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(absl::StrCat("p", i, "/k/0"));
    // Disjoint holdings: random cuts of the ring, some left free.
    std::map<std::string, ShardSet> held;
    for (uint32_t s = 0; s < ring;) {
      uint32_t len = std::uniform_int_distribution<uint32_t>(1, 80)(rng);
      ShardRange r{s, std::min(ring, s + len)};
      int who = std::uniform_int_distribution<int>(-3, n - 1)(rng);
      if (who >= 0) held[ids[who]] = held[ids[who]].Union(r);
      s = r.end;
    }
    const auto t = AssignShards(ids, ring, held);
    for (auto& [id, set] : held) {
      set = set.Intersect(t.at(id));
      ASSERT_EQ(AssignShards(ids, ring, held), t)
          << "after " << id << " shrank";
    }
    std::shuffle(ids.begin(), ids.end(), rng);
    for (const std::string& id : ids) {
      held[id] = t.at(id);
      ASSERT_EQ(AssignShards(ids, ring, held), t) << "after " << id << " grew";
    }
  }
}

TEST(AssignShardsTest, AJoinOrALeaveMovesAtMostOneShare) {
  // Random joins and leaves, each from the settled state: the shards that
  // change owner are at most ceil(R / n) (n the larger member count), and
  // the runs per node stay few.
  std::mt19937 rng(3);
  for (uint32_t ring : {256u, 4096u}) {
    std::vector<std::string> ids;
    for (int i = 0; i < 20; ++i) ids.push_back(absl::StrCat("p", i, "/k/0"));
    std::map<std::string, ShardSet> held = AsHeld(AssignShards(ids, ring));
    size_t max_runs = 0;
    int next = 20;
    for (int step = 0; step < 1000; ++step) {
      const bool join = ids.size() < 3 || (ids.size() < 60 && rng() % 2 == 0);
      if (join) {
        ids.push_back(absl::StrCat("p", next++, "/k/0"));
      } else {
        size_t at = rng() % ids.size();
        held.erase(ids[at]);
        ids.erase(ids.begin() + static_cast<ptrdiff_t>(at));
      }
      const size_t n = ids.size() + (join ? 0 : 1);
      auto t = AssignShards(ids, ring, held);
      ExpectPartition(t, ring);
      EXPECT_LE(Moved(held, t), (ring + n - 1) / n)
          << "ring=" << ring << " step=" << step << (join ? " join" : " leave");
      held = AsHeld(t);
      for (const auto& [id, set] : t) {
        max_runs = std::max(max_runs, set.runs().size());
      }
    }
    RecordProperty(absl::StrCat("max_runs_ring_", ring), max_runs);
    std::printf("ring=%u: at most %zu runs per node over 1000 changes\n", ring,
                max_runs);
  }
}

TEST(AssignShardsTest, ARollingRestartMovesTwoSharesPerPod) {
  // 100 pods of 10 nodes on 4096 shards; each pod in turn is replaced by one
  // with a new id. Per step (a pod's 10 nodes leave, then 10 join) at most
  // 2 x 10 x ceil(R / n) shards change owner; the even split over sorted
  // ids (the rule before this one) moves almost the whole ring.
  const uint32_t ring = 4096;
  std::vector<std::string> ids;
  auto pod = [](const std::string& name) {
    std::vector<std::string> out;
    for (int i = 0; i < 10; ++i) out.push_back(absl::StrCat(name, "/k/", i));
    return out;
  };
  for (int p = 0; p < 100; ++p) {
    for (auto& id : pod(absl::StrCat("p", p))) ids.push_back(id);
  }
  std::map<std::string, ShardSet> held = AsHeld(AssignShards(ids, ring));
  uint32_t max_moved = 0, max_even = 0;
  size_t max_runs = 0;
  for (int p = 0; p < 100; ++p) {
    auto before = held;
    for (const std::string& id : pod(absl::StrCat("p", p))) {
      held.erase(id);
      ids.erase(std::find(ids.begin(), ids.end(), id));
    }
    held = AsHeld(AssignShards(ids, ring, held));
    for (auto& id : pod(absl::StrCat("r", p))) ids.push_back(id);
    held = AsHeld(AssignShards(ids, ring, held));
    ExpectPartition(AssignShards(ids, ring, held), ring);
    // Shards whose owner at the end of the step differs from the start,
    // plus those that moved twice (to a stayer, then to the new pod).
    uint32_t moved = 0;
    for (const auto& [id, set] : held) {
      auto it = before.find(id);
      moved += it == before.end() ? set.size() : set.Minus(it->second).size();
    }
    max_moved = std::max(max_moved, moved);
    for (const auto& [id, set] : held) {
      max_runs = std::max(max_runs, set.runs().size());
    }
    auto even = AssignShards(ids, ring);
    uint32_t even_moved = 0;
    auto even_before = AsHeld(AssignShards(
        [&] {
          std::vector<std::string> v;
          for (const auto& [id, set] : before) v.push_back(id);
          return v;
        }(),
        ring));
    even_moved = Moved(even_before, even);
    max_even = std::max(max_even, even_moved);
  }
  EXPECT_LE(max_moved, 2u * 10 * ((ring + 999) / 1000));
  EXPECT_GT(max_even, ring / 2);
  std::printf(
      "rolling restart 100x10: at most %u shards moved per step "
      "(even split: %u)\n",
      max_moved, max_even);
}

}  // namespace
}  // namespace setpoint
