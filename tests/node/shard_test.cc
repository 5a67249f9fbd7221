#include "setpoint/node/shard.h"

#include <string>
#include <vector>

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

}  // namespace
}  // namespace setpoint
