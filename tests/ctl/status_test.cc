// setpointctl's status: a RegistryDescription sorted into rows, the table,
// the JSON and the watch fingerprint.
#include "status.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace setpoint::ctl {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

const absl::Time kNow = absl::FromUnixMillis(1'800'000'000'000);

MemberDescription Member(const std::string& id, std::optional<Assignment> held,
                         absl::Duration lease_left = absl::Seconds(2)) {
  return {.id = id, .lease_expiry = kNow + lease_left, .held = held};
}

RegistryDescription Sample() {
  RegistryDescription d;
  d.epoch = "e1";
  d.version = 7;
  d.server_time = kNow;
  d.grants_from = kNow - absl::Seconds(10);
  d.kinds["vm"] =
      KindDescription{.ring_size = 100,
                      .members = {Member("a/vm/0", Assignment{{0, 50}, 11}),
                                  Member("b/vm/0", Assignment{{60, 100}, 12}),
                                  Member("c/vm/0", std::nullopt)},
                      .last_token = 12};
  return d;
}

TEST(StatusTest, AnErrorRedrawsOnlyWhenItBecomesAnotherOne) {
  EXPECT_EQ(ErrorFingerprint(absl::UnavailableError("retry in 89.9ms")),
            ErrorFingerprint(absl::UnavailableError("retry in 12.1ms")));
  EXPECT_NE(ErrorFingerprint(absl::UnavailableError("x")),
            ErrorFingerprint(absl::PermissionDeniedError("x")));
}

TEST(StatusTest, APodsShardsAreCountedByKindNeverAddedUp) {
  RegistryDescription d = Sample();
  d.kinds["zone"] =
      KindDescription{.ring_size = 1,
                      .members = {Member("a/zone/0", Assignment{{0, 1}, 13})},
                      .last_token = 13};
  Status s = BuildStatus(d);
  ASSERT_EQ(s.pods.size(), 3u);
  const PodRow& a = s.pods[0];
  EXPECT_EQ(a.pod, "a");
  EXPECT_EQ(a.nodes, 2);
  ASSERT_EQ(a.kinds.size(), 2u);
  EXPECT_EQ(a.kinds[0].kind, "vm");
  EXPECT_EQ(a.kinds[0].shards, 50u);
  EXPECT_EQ(a.kinds[1].kind, "zone");
  EXPECT_EQ(a.kinds[1].shards, 1u);
  const std::string text = StatusText(s, {});
  EXPECT_THAT(text, HasSubstr("  POD  KIND  STATE   NODES  SHARDS  DRAINED "
                              "SINCE\n"));
  EXPECT_THAT(text, HasSubstr("  a    vm    active  1      50      -\n"));
  EXPECT_THAT(text, HasSubstr("  a    zone  active  1      1       -\n"));
  const std::string json = StatusJson(s, {});
  EXPECT_THAT(json, HasSubstr("\"pod\":\"a\",\"state\":\"active\","
                              "\"drained\":false,\"drained_since\":null,"
                              "\"nodes\":2,\"kinds\":[{\"kind\":\"vm\","
                              "\"nodes\":1,\"shards\":50},{\"kind\":\"zone\","
                              "\"nodes\":1,\"shards\":1}]}"));
  // A node that holds nothing: the empty range and token 0, as /statusz.
  EXPECT_THAT(json, HasSubstr("\"id\":\"c/vm/0\",\"pod\":\"c\","
                              "\"state\":\"active\",\"range\":[0,0],"
                              "\"shards\":[],\"token\":0,"));
}

TEST(StatusTest, RowsSharesAndUnownedRanges) {
  Status s = BuildStatus(Sample());
  ASSERT_EQ(s.kinds.size(), 1u);
  const KindRows& vm = s.kinds[0];
  ASSERT_EQ(vm.nodes.size(), 3u);
  EXPECT_EQ(vm.nodes[0].state, "active");
  EXPECT_DOUBLE_EQ(vm.nodes[0].share_percent, 50.0);
  EXPECT_DOUBLE_EQ(vm.nodes[1].share_percent, 40.0);
  EXPECT_FALSE(vm.nodes[2].held.has_value());
  EXPECT_THAT(vm.unowned, ElementsAre(ShardRange{50, 60}));
  EXPECT_EQ(vm.unowned_shards, 10u);
  EXPECT_FALSE(s.all_drained);
  EXPECT_THAT(s.warnings, IsEmpty());
  std::string text = StatusText(s, {.address = "h:1", .ns = "demo"});
  EXPECT_THAT(text, HasSubstr("registry h:1 namespace demo\n"));
  EXPECT_THAT(text, HasSubstr("  unowned: [50,60) (10 shards, 10.0%)\n"));
  EXPECT_THAT(text, HasSubstr("  a/vm/0  a    active  [0,50)    50.0%  11     "
                              "2.0s\n"));
  EXPECT_THAT(text, HasSubstr("  c/vm/0  c    active  -         0.0%   -      "
                              "2.0s\n"));
  EXPECT_THAT(text, Not(HasSubstr("warnings")));
}

TEST(StatusTest, DrainingThenDrainedAndEveryPodDrained) {
  RegistryDescription d = Sample();
  d.drained["b"] = kNow - absl::Seconds(1);
  d.drained["c"] = kNow - absl::Seconds(1);
  Status s = BuildStatus(d);
  ASSERT_EQ(s.pods.size(), 3u);
  EXPECT_EQ(s.pods[1].state, "draining") << "b still holds [60,100)";
  EXPECT_EQ(s.pods[2].state, "drained");
  EXPECT_EQ(s.kinds[0].nodes[1].state, "draining");
  EXPECT_FALSE(s.all_drained);
  d.drained["a"] = kNow;
  d.kinds["vm"].members[0].held.reset();
  d.kinds["vm"].members[1].held.reset();
  s = BuildStatus(d);
  EXPECT_TRUE(s.all_drained);
  for (const PodRow& p : s.pods) EXPECT_EQ(p.state, "drained") << p.pod;
  std::string text = StatusText(s, {});
  EXPECT_THAT(text, HasSubstr("EVERY POD: nobody owns anything"));
  EXPECT_THAT(text, HasSubstr("  unowned: [0,100) (100 shards, 100.0%)"));
  EXPECT_THAT(StatusJson(s, {}), HasSubstr("\"all_drained\":true"));
}

TEST(StatusTest, ExpiredMembersHoldNothingAndOverlapsAreFlagged) {
  RegistryDescription d = Sample();
  d.kinds["vm"].members[1].lease_expiry = kNow - absl::Milliseconds(300);
  d.kinds["vm"].members[2].held = Assignment{{40, 55}, 13};
  Status s = BuildStatus(d);
  const KindRows& vm = s.kinds[0];
  EXPECT_EQ(vm.nodes[1].state, "expired");
  EXPECT_FALSE(vm.nodes[1].held.has_value());
  EXPECT_THAT(vm.unowned, ElementsAre(ShardRange{55, 100}));
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_THAT(s.warnings[0], HasSubstr("a/vm/0 [0,50) and c/vm/0 [40,55)"));
  std::string text = StatusText(s, {});
  EXPECT_THAT(text, HasSubstr("expired 300ms ago"));
  EXPECT_THAT(text, HasSubstr("\nwarnings\n  kind vm: a/vm/0"));
}

TEST(StatusTest, GrantsRefusedUnknownRingAndNoState) {
  RegistryDescription d = Sample();
  d.grants_from = kNow + absl::Milliseconds(1500);
  d.kinds["vm"].ring_size = 0;
  Status s = BuildStatus(d);
  EXPECT_FALSE(s.kinds[0].ring_size_recorded);
  EXPECT_EQ(s.kinds[0].ring_size, kDefaultRingSize);
  std::string text = StatusText(s, {});
  EXPECT_THAT(text, HasSubstr("grants   refused until 2027-01-15T08:00:01.500Z "
                              "(1.5s more"));
  EXPECT_THAT(text, HasSubstr("ring 4096 (not recorded; assumed)"));
  EXPECT_THAT(StatusJson(s, {}), HasSubstr("\"grants_refused_for_ms\":1500,"));
  RegistryDescription empty;
  empty.server_time = kNow;
  empty.warnings = {"no epoch: nobody polled"};
  std::string none = StatusText(BuildStatus(empty), {});
  EXPECT_THAT(none, HasSubstr("epoch    none yet"));
  EXPECT_THAT(none, HasSubstr("\npods\n  none\n"));
  EXPECT_THAT(none, HasSubstr("\nwarnings\n  no epoch: nobody polled\n"));
  EXPECT_THAT(StatusJson(BuildStatus(empty), {.address = "a\"b", .ns = "n"}),
              HasSubstr("{\"address\":\"a\\\"b\",\"namespace\":\"n\","
                        "\"epoch\":null,"));
}

TEST(StatusTest, FingerprintIgnoresRenewalsButNotOwnership) {
  RegistryDescription d = Sample();
  const std::string before = StatusFingerprint(BuildStatus(d));
  d.version += 40;
  d.server_time += absl::Milliseconds(500);
  for (auto& m : d.kinds["vm"].members) m.lease_expiry += absl::Seconds(1);
  EXPECT_EQ(StatusFingerprint(BuildStatus(d)), before);
  d.kinds["vm"].members[0].held->token = 99;
  EXPECT_NE(StatusFingerprint(BuildStatus(d)), before);
  d = Sample();
  d.drained["c"] = kNow;
  EXPECT_NE(StatusFingerprint(BuildStatus(d)), before);
}

}  // namespace
}  // namespace setpoint::ctl
