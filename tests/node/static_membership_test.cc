// Static membership (NodeManagerOptions::static_membership): a pod that
// stops gracefully keeps its places for a successor with the same pod id,
// and the rest of the fleet moves nothing.
#include <map>
#include <string>

#include "node/node_manager_fixture.h"

namespace setpoint {
namespace {

using namespace node_manager_testing;  // NOLINT(google-build-using-namespace)

class StaticMembershipTest : public NodeManagerTest {
 protected:
  // A pod with static membership whose nodes report as "<id><mark>": the
  // tracker tells a successor's nodes from its predecessor's.
  NodeManager& StartStatic(const std::string& pod, int count,
                           const std::string& mark) {
    NodeManagerOptions o = Options(pod, &registry_, count);
    o.static_membership = true;
    o.kinds[0].factory = [this, mark](const NodeInfo& info) {
      return std::make_unique<TestNode>(info.id + mark, &tracker_, 0);
    };
    return StartPodWith(std::move(o));
  }
  static std::map<std::string, ShardSet> Ranges(NodeManager& pod) {
    std::map<std::string, ShardSet> out;
    for (const NodeState& n : pod.Nodes()) out[n.id] = n.active.range;
    return out;
  }
};

TEST_F(StaticMembershipTest, ASuccessorWithTheSamePodIdTakesThePlacesBack) {
  NodeManager& a = StartStatic("a", 2, "");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  const std::map<std::string, ShardSet> b_before = Ranges(b);
  const int b_calls = tracker_.CallsBy("b/");
  const int64_t released = a.stats().releases;
  StopPod(a);
  EXPECT_EQ(tracker_.OwnedBy("a/"), 0);
  EXPECT_EQ(a.stats().releases, released + 2);
  // Most of a lease passes: a's nodes are still members, so nobody takes
  // their shards and b moves nothing.
  AdvanceUntil([] { return false; }, absl::Seconds(2));
  EXPECT_EQ(Ranges(b), b_before);
  EXPECT_EQ(tracker_.CallsBy("b/"), b_calls);
  EXPECT_EQ(tracker_.OwnedBy("b/"), 32);
  // The successor renews the same nodes and takes the same shares.
  NodeManager& a2 = StartStatic("a", 2, "'");
  ASSERT_TRUE(AdvanceUntil(
      [&] {
        return Balanced({&a2, &b}, 4);
      },
      absl::Milliseconds(500)));
  EXPECT_EQ(tracker_.OwnedBy("a/"), 32);
  EXPECT_EQ(Ranges(b), b_before);
  EXPECT_EQ(tracker_.CallsBy("b/"), b_calls);
}

TEST_F(StaticMembershipTest, WithoutASuccessorTheOthersTakeOverAtTheLeaseEnd) {
  NodeManager& a = StartStatic("a", 2, "");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  const std::map<std::string, ShardSet> b_before = Ranges(b);
  StopPod(a);
  AdvanceUntil([] { return false; }, absl::Seconds(2));
  EXPECT_EQ(Ranges(b), b_before);
  // The lease (3 s from a's last renewal) ends; the next poll drops a's
  // nodes and b takes the whole ring.
  ASSERT_TRUE(
      AdvanceUntil([&] { return Balanced({&b}, 2); }, absl::Seconds(3)));
}

TEST_F(StaticMembershipTest, ASuccessorWithFewerNodesLetsTheOthersGoAtOnce) {
  NodeManager& a = StartStatic("a", 3, "");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 5); }));
  StopPod(a);
  // a/vm/2 has no successor: the new pod deregisters it at its first poll,
  // well within the lease it would otherwise hold its share for.
  NodeManager& a2 = StartStatic("a", 2, "'");
  ASSERT_TRUE(AdvanceUntil(
      [&] {
        return Balanced({&a2, &b}, 4);
      },
      absl::Seconds(1)));
  auto d = registry_.Describe(Context::Background(&clock_));
  ASSERT_THAT(d.status(), IsOk());
  for (const MemberDescription& m : d->kinds.at("vm").members) {
    EXPECT_NE(m.id, "a/vm/2");
  }
}

TEST_F(StaticMembershipTest, NeedsAnExplicitPodId) {
  NodeManagerOptions o = Options("", &registry_);
  o.static_membership = true;
  EXPECT_THAT(ValidateNodeManagerOptions(o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("static_membership")));
  o.pod_id = "a";
  EXPECT_THAT(ValidateNodeManagerOptions(o), IsOk());
}

}  // namespace
}  // namespace setpoint
