// The lease protocol's decisions, without threads, locks or a registry: one
// node's facts and record in, the next step out.
#include "node/lease_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "setpoint/node/shard.h"

namespace setpoint::lease_protocol {
namespace {

using Kind = Decision::Kind;

ShardSet Range(uint32_t begin, uint32_t end) {
  return ShardSet(ShardRange{begin, end});
}

Assignment Holding(uint32_t begin, uint32_t end, uint64_t token) {
  return Assignment{Range(begin, end), token};
}

TEST(LeaseProtocolTest, NothingMovesWhileTheRelayIsBusyOrTheNodeIsFenced) {
  NodeFacts busy{.active = Holding(0, 10, 7), .relay_busy = true};
  EXPECT_EQ(Decide(busy, Holding(0, 10, 7), Range(0, 5)).kind, Kind::kNothing);
  NodeFacts fenced{.active = {}, .lease_fenced = true};
  EXPECT_EQ(Decide(fenced, std::nullopt, Range(0, 5)).kind, Kind::kNothing);
}

TEST(LeaseProtocolTest, ARecordThatDiffersStopsTheNode) {
  NodeFacts node{.active = Holding(0, 10, 7)};
  // No record, another token, a record that does not cover the work.
  EXPECT_EQ(Decide(node, std::nullopt, Range(0, 10)).kind, Kind::kStop);
  EXPECT_EQ(Decide(node, Holding(0, 10, 8), Range(0, 10)).kind, Kind::kStop);
  EXPECT_EQ(Decide(node, Holding(0, 5, 7), Range(0, 10)).kind, Kind::kStop);
  // A record larger than the work (between a shrink and its release) is
  // what it should be: the release comes next.
  Decision d = Decide(NodeFacts{.active = Holding(0, 5, 7)}, Holding(0, 10, 7),
                      Range(0, 5));
  EXPECT_EQ(d.kind, Kind::kRegistry);
  ASSERT_TRUE(d.release.has_value());
  EXPECT_EQ(d.release->range, Range(0, 5));
  EXPECT_FALSE(d.grant.has_value());
}

TEST(LeaseProtocolTest, ShrinkComesBeforeAnythingIsPublished) {
  NodeFacts node{.active = Holding(0, 10, 7)};
  Decision d = Decide(node, Holding(0, 10, 7), Range(5, 20));
  EXPECT_EQ(d.kind, Kind::kShrink);
  EXPECT_EQ(d.update.range, Range(5, 10));
  EXPECT_EQ(d.update.token, 7u);  // A shrink keeps the token.
  EXPECT_FALSE(d.release.has_value());
  EXPECT_FALSE(d.grant.has_value());
}

TEST(LeaseProtocolTest, ReleaseAndGrowGoInOneRoundTrip) {
  // The node works on [5,10) and still holds [0,10); its target is [5,20).
  NodeFacts node{.active = Holding(5, 10, 7)};
  Decision d = Decide(node, Holding(0, 10, 7), Range(5, 20));
  EXPECT_EQ(d.kind, Kind::kRegistry);
  ASSERT_TRUE(d.release.has_value());
  EXPECT_EQ(d.release->range, Range(5, 10));
  ASSERT_TRUE(d.grant.has_value());
  EXPECT_EQ(*d.grant, Range(5, 20));
}

TEST(LeaseProtocolTest, GrowsOnlyTowardsTheTargetAndSettlesOnIt) {
  EXPECT_EQ(Decide(NodeFacts{}, std::nullopt, Range(0, 10)).grant,
            std::optional<ShardSet>(Range(0, 10)));
  Decision settled = Decide(NodeFacts{.active = Holding(0, 10, 7)},
                            Holding(0, 10, 7), Range(0, 10));
  EXPECT_EQ(settled.kind, Kind::kNothing);
  EXPECT_EQ(Decide(NodeFacts{}, std::nullopt, ShardSet{}).kind, Kind::kNothing);
}

TEST(LeaseProtocolTest, ARefusedChangeIsAskedForAgainTowardsTheTarget) {
  NodeFacts node{.active = Holding(0, 10, 7), .unconfirmed = true};
  // The target moved back to cover everything: asked again all the same,
  // so the node confirms what it works on.
  Decision d = Decide(node, Holding(0, 10, 7), Range(0, 10));
  EXPECT_EQ(d.kind, Kind::kAskAgain);
  EXPECT_EQ(d.update.range, Range(0, 10));
  d = Decide(node, Holding(0, 10, 7), Range(0, 4));
  EXPECT_EQ(d.kind, Kind::kAskAgain);
  EXPECT_EQ(d.update.range, Range(0, 4));
}

TEST(LeaseProtocolTest, AFailedNodeEmptiesReleasesAndLeavesWithoutGrowing) {
  NodeFacts failed{.active = Holding(0, 10, 7), .failed = true};
  EXPECT_EQ(Decide(failed, Holding(0, 10, 7), Range(0, 20)).kind,
            Kind::kShrink);
  failed.active = Assignment{ShardSet{}, 7};
  Decision d = Decide(failed, Holding(0, 10, 7), Range(0, 20));
  EXPECT_EQ(d.kind, Kind::kRegistry);
  ASSERT_TRUE(d.release.has_value());
  EXPECT_TRUE(d.release->range.Empty());
  EXPECT_FALSE(d.grant.has_value());
  d = Decide(failed, std::nullopt, Range(0, 20));
  EXPECT_TRUE(d.deregister);
  EXPECT_FALSE(d.grant.has_value());
}

TEST(LeaseProtocolTest, MoveReasonNamesWhatChanged) {
  std::string e1 = "e1", e2 = "e2";
  std::set<std::string> none, drained = {"pod-b"};
  KindView ab, abc, ac;
  ab.members = {"a", "b"};
  abc.members = {"a", "b", "c"};
  ac.members = {"a", "c"};
  ViewState now{.epoch = &e1, .drained = &none, .kind = &abc};
  EXPECT_EQ(MoveReason(std::nullopt, now), "start");
  EXPECT_EQ(MoveReason(ViewState{&e2, &none, &abc}, now), "epoch");
  EXPECT_EQ(MoveReason(ViewState{&e1, &none, &ab}, now), "join");
  EXPECT_EQ(MoveReason(ViewState{&e1, &none, &abc}, ViewState{&e1, &none, &ab}),
            "leave");
  EXPECT_EQ(MoveReason(ViewState{&e1, &none, &ab}, ViewState{&e1, &none, &ac}),
            "join+leave");
  EXPECT_EQ(
      MoveReason(ViewState{&e1, &none, &abc}, ViewState{&e1, &drained, &abc}),
      "drain");
  EXPECT_EQ(MoveReason(ViewState{&e1, &none, nullptr}, now), "join");
  EXPECT_EQ(MoveReason(ViewState{&e1, &none, &abc}, now), "none");
}

TEST(LeaseProtocolTest, PlacesFollowedThroughCrossingsMatchTheRule) {
  // Random holdings of n ids (disjoint runs; the rule's order depends on
  // their sizes only), then one id's holding crosses q: every other id's
  // place, followed from the crossing alone, is the place the rule gives
  // on the new holdings.
  std::mt19937 rng(7);
  int checked = 0;
  for (int round = 0; round < 2000; ++round) {
    const size_t n = std::uniform_int_distribution<size_t>(2, 60)(rng);
    const uint32_t ring = std::vector<uint32_t>{
        64, 256, 4096}[std::uniform_int_distribution<>(0, 2)(rng)];
    const uint64_t q = ring / n;
    if (q < 2) continue;
    std::vector<uint64_t> count(n);
    for (auto& c : count) {
      c = q - 1 + std::uniform_int_distribution<uint64_t>(0, 2)(rng);
    }
    std::vector<std::string> ids(n);
    for (size_t i = 0; i < n; ++i) ids[i] = absl::StrFormat("p%03d/vm/0", i);
    std::vector<size_t> all(n);
    for (size_t i = 0; i < n; ++i) all[i] = i;
    auto places_of = [&](const std::vector<uint64_t>& counts,
                         SharePlaces* out) {
      std::vector<ShardSet> sets(n);
      std::vector<const ShardSet*> holds(n);
      uint64_t at = 0;
      for (size_t i = 0; i < n; ++i) {
        sets[i] = ShardSet(ShardRange{static_cast<uint32_t>(at),
                                      static_cast<uint32_t>(at + counts[i])});
        at += counts[i];
        holds[i] = &sets[i];
      }
      if (at > ring) return false;
      AssignSortedShards(holds, ring, all, out);
      return true;
    };
    SharePlaces before;
    if (!places_of(count, &before)) continue;
    const size_t x = std::uniform_int_distribution<size_t>(0, n - 1)(rng);
    const bool up = count[x] <= q;
    count[x] = up ? q + 1 : q;
    SharePlaces after;
    if (!places_of(count, &after)) continue;
    for (size_t y = 0; y < n; ++y) {
      if (y == x) continue;
      EXPECT_EQ(lease_protocol::PlaceAfterCrossing(
                    before.place[y], before.over[y], ids[y], ids[x], up),
                after.place[y])
          << "round " << round << " id " << y << " crossing " << x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10000);
}

}  // namespace
}  // namespace setpoint::lease_protocol
