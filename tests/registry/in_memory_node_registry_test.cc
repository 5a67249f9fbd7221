#include "setpoint/registry/in_memory_node_registry.h"

#include <atomic>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

class InMemoryNodeRegistryTest : public ::testing::Test {
 protected:
  absl::StatusOr<PollResult> Poll(std::vector<std::string> ids,
                                  absl::Duration lease = absl::Seconds(3)) {
    auto r = registry_.Poll(ctx_, {.kinds = {{"vm", ids}}, .lease = lease});
    if (r.ok()) epoch_ = r->epoch;
    return r;
  }
  // Grants under the epoch of the last poll, as a NodeManager does.
  absl::StatusOr<uint64_t> Grant(const std::string& id, ShardRange range) {
    return registry_.Grant(ctx_, "vm", id, range, epoch_);
  }
  std::string epoch_;
  SimulatedClock clock_;
  InMemoryNodeRegistry registry_{{.clock = &clock_}};
  Context ctx_ = Context::Background(&clock_);
};

TEST_F(InMemoryNodeRegistryTest, PollRegistersAndListsSortedMembers) {
  ASSERT_THAT(Poll({"b/vm/0"}).status(), IsOk());
  auto r = Poll({"a/vm/0", "a/vm/1"});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_THAT(r->kinds["vm"].members,
              ElementsAre("a/vm/0", "a/vm/1", "b/vm/0"));
  EXPECT_THAT(r->kinds["vm"].held, IsEmpty());
  EXPECT_FALSE(r->epoch.empty());
}

TEST_F(InMemoryNodeRegistryTest, LeasesExpireOnTheRegistryClock) {
  ASSERT_THAT(Poll({"a/vm/0"}).status(), IsOk());
  ASSERT_THAT(Poll({"b/vm/0"}).status(), IsOk());
  ASSERT_THAT(Grant("a/vm/0", {0, 10}).status(), IsOk());
  clock_.AdvanceTime(absl::Seconds(2));
  ASSERT_THAT(Poll({"b/vm/0"}).status(), IsOk());  // b renews, a does not.
  clock_.AdvanceTime(absl::Seconds(1));            // a's lease ends now.
  auto r = Poll({"b/vm/0"});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_THAT(r->kinds["vm"].members, ElementsAre("b/vm/0"));
  // a's held range went with it, so b can take those shards.
  EXPECT_THAT(r->kinds["vm"].held, IsEmpty());
  EXPECT_THAT(Grant("b/vm/0", {0, 10}).status(), IsOk());
}

TEST_F(InMemoryNodeRegistryTest, GrantOnlyIntoFreeShardsWithGrowingTokens) {
  ASSERT_THAT(Poll({"a/vm/0", "b/vm/0"}).status(), IsOk());
  auto t1 = Grant("a/vm/0", {0, 100});
  ASSERT_THAT(t1.status(), IsOk());
  EXPECT_THAT(Grant("b/vm/0", {50, 200}).status(),
              StatusIs(absl::StatusCode::kAborted));
  auto t2 = Grant("b/vm/0", {100, 200});
  ASSERT_THAT(t2.status(), IsOk());
  EXPECT_GT(*t2, *t1);
  // a shrinks and publishes; then b may grow into what a gave up.
  ASSERT_THAT(registry_.Release(ctx_, "vm", "a/vm/0", {{0, 50}, *t1}), IsOk());
  auto t3 = Grant("b/vm/0", {50, 200});
  ASSERT_THAT(t3.status(), IsOk());
  EXPECT_GT(*t3, *t2);
  auto r = Poll({});
  EXPECT_EQ(r->kinds["vm"].held["a/vm/0"], (Assignment{{0, 50}, *t1}));
  EXPECT_EQ(r->kinds["vm"].held["b/vm/0"], (Assignment{{50, 200}, *t3}));
}

TEST_F(InMemoryNodeRegistryTest, RefusesBadRequests) {
  ASSERT_THAT(Poll({"a/vm/0"}).status(), IsOk());
  EXPECT_THAT(Grant("ghost", {0, 1}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(Grant("a/vm/0", {5, 5}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto t = Grant("a/vm/0", {0, 10});
  ASSERT_THAT(t.status(), IsOk());
  // A release must lie within what is recorded, under the same token.
  EXPECT_THAT(registry_.Release(ctx_, "vm", "a/vm/0", {{5, 20}, *t}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(registry_.Release(ctx_, "vm", "a/vm/0", {{0, 5}, *t + 1}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(registry_.Release(ctx_, "vm", "b/vm/0", {{0, 5}, *t}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A grant decided on an older epoch is refused.
  EXPECT_THAT(registry_.Grant(ctx_, "vm", "a/vm/0", {0, 10}, "stale"),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(Poll({"a/vm/0"}, absl::ZeroDuration()).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  CancelScope scope(ctx_);
  scope.Cancel();
  EXPECT_THAT(registry_.Poll(scope.context(), {}).status(),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST_F(InMemoryNodeRegistryTest, DeregisterFreesShardsAndNotifies) {
  std::atomic<int> changes{0};
  int64_t id = registry_.AddChangeListener([&] { ++changes; });
  ASSERT_THAT(Poll({"a/vm/0", "b/vm/0"}).status(), IsOk());
  EXPECT_EQ(changes.load(), 1);  // Two joins, one change.
  // A grant is not announced: nobody waits for one.
  ASSERT_THAT(Grant("a/vm/0", {0, 10}).status(), IsOk());
  EXPECT_EQ(changes.load(), 1);
  ASSERT_THAT(registry_.Deregister(ctx_, "vm", {"a/vm/0"}), IsOk());
  EXPECT_EQ(changes.load(), 2);
  auto r = Poll({"b/vm/0"});
  EXPECT_THAT(r->kinds["vm"].members, ElementsAre("b/vm/0"));
  EXPECT_EQ(changes.load(), 2);  // A renewal is not a change.
  EXPECT_THAT(Grant("b/vm/0", {0, 10}).status(), IsOk());
  registry_.RemoveChangeListener(id);
  ASSERT_THAT(registry_.Deregister(ctx_, "vm", {"b/vm/0"}), IsOk());
  EXPECT_EQ(changes.load(), 2);
}

TEST_F(InMemoryNodeRegistryTest, ForgettingStartsANewEpochWithAGrace) {
  auto before = Poll({"a/vm/0"});
  auto t1 = Grant("a/vm/0", {0, 10});
  ASSERT_THAT(t1.status(), IsOk());
  registry_.ForgetEverything(absl::Seconds(3));
  auto after = Poll({"a/vm/0"});
  ASSERT_THAT(after.status(), IsOk());
  EXPECT_NE(after->epoch, before->epoch);
  EXPECT_THAT(after->kinds["vm"].held, IsEmpty());
  EXPECT_THAT(Grant("a/vm/0", {0, 10}).status(),
              StatusIs(absl::StatusCode::kAborted));
  clock_.AdvanceTime(absl::Seconds(2));
  ASSERT_THAT(Poll({"a/vm/0"}).status(), IsOk());
  clock_.AdvanceTime(absl::Seconds(1));
  auto t2 = Grant("a/vm/0", {0, 10});
  ASSERT_THAT(t2.status(), IsOk());
  EXPECT_GT(*t2, *t1) << "tokens keep growing across a loss of state";
}

TEST_F(InMemoryNodeRegistryTest, RestoringAnOlderSnapshotStartsANewEpoch) {
  ASSERT_THAT(Poll({"a/vm/0", "b/vm/0"}).status(), IsOk());
  InMemoryNodeRegistry::Snapshot old = registry_.TakeSnapshot();
  auto t1 = Grant("a/vm/0", {0, 10});
  ASSERT_THAT(t1.status(), IsOk());
  auto seen = Poll({"a/vm/0", "b/vm/0"});
  ASSERT_THAT(seen.status(), IsOk());
  registry_.Restore(old);
  // The restored state has no record of a's grant; whoever polls first
  // (even a pod that saw nothing before) gets a new epoch, and no grant
  // for one lease.
  auto r = registry_.Poll(ctx_, {.kinds = {{"vm", {"c/vm/0"}}}});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_NE(r->epoch, seen->epoch);
  EXPECT_THAT(registry_.Grant(ctx_, "vm", "c/vm/0", {0, 10}, r->epoch).status(),
              StatusIs(absl::StatusCode::kAborted));
  clock_.AdvanceTime(absl::Seconds(3));
  ASSERT_THAT(registry_.Poll(ctx_, {.kinds = {{"vm", {"c/vm/0"}}}}).status(),
              IsOk());
  auto t2 = registry_.Grant(ctx_, "vm", "c/vm/0", {0, 10}, r->epoch);
  ASSERT_THAT(t2.status(), IsOk());
  EXPECT_GT(*t2, *t1);
}

TEST_F(InMemoryNodeRegistryTest, AVersionOlderThanOneSeenStartsANewEpoch) {
  auto first = Poll({"a/vm/0"});
  ASSERT_THAT(first.status(), IsOk());
  auto r = registry_.Poll(ctx_, {.kinds = {{"vm", {"a/vm/0"}}},
                                 .min_version = first->version + 100});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_NE(r->epoch, first->epoch);
  EXPECT_GT(r->version, first->version + 100);
  EXPECT_GE(r->grants_from, clock_.Now() + absl::Seconds(3));
}

TEST_F(InMemoryNodeRegistryTest, DrainedPodsAreInEveryPollUntilUndrained) {
  std::atomic<int> changes{0};
  int64_t id = registry_.AddChangeListener([&] { ++changes; });
  ASSERT_THAT(Poll({"a/vm/0", "b/vm/0"}).status(), IsOk());
  const int joined = changes.load();
  auto before = Poll({"a/vm/0", "b/vm/0"});
  ASSERT_THAT(before.status(), IsOk());
  EXPECT_THAT(before->drained, IsEmpty());
  ASSERT_THAT(registry_.SetDrained(ctx_, "b", true), IsOk());
  EXPECT_EQ(changes.load(), joined + 1);
  // Setting what is set changes nothing and announces nothing.
  ASSERT_THAT(registry_.SetDrained(ctx_, "b", true), IsOk());
  ASSERT_THAT(registry_.SetDrained(ctx_, "nobody", false), IsOk());
  EXPECT_EQ(changes.load(), joined + 1);
  auto r = Poll({"a/vm/0", "b/vm/0"});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_THAT(r->drained, ElementsAre("b"));
  EXPECT_EQ(r->epoch, before->epoch) << "a drain is no new epoch";
  EXPECT_GT(r->version, before->version + 1) << "the drain is a write";
  // Members stay members: only the NodeManagers leave them out of the ring.
  EXPECT_THAT(r->kinds["vm"].members, ElementsAre("a/vm/0", "b/vm/0"));
  EXPECT_THAT(ShareMembers(r->kinds["vm"].members, r->drained),
              ElementsAre("a/vm/0"));
  ASSERT_THAT(registry_.SetDrained(ctx_, "b", false), IsOk());
  EXPECT_EQ(changes.load(), joined + 2);
  r = Poll({"a/vm/0", "b/vm/0"});
  EXPECT_THAT(r->drained, IsEmpty());
  for (const char* bad : {"", "b/vm/0", "with space", "\x01"}) {
    EXPECT_THAT(registry_.SetDrained(ctx_, bad, true),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::HasSubstr("pod id")))
        << bad;
  }
  registry_.RemoveChangeListener(id);
}

TEST_F(InMemoryNodeRegistryTest, DescribeShowsEverythingAndChangesNothing) {
  ASSERT_THAT(registry_
                  .Poll(ctx_, {.kinds = {{"vm", {"a/vm/0", "b/vm/0"}}},
                               .lease = absl::Seconds(3),
                               .ring_sizes = {{"vm", 64}}})
                  .status(),
              IsOk());
  auto polled = Poll({"a/vm/0", "b/vm/0"});
  ASSERT_THAT(polled.status(), IsOk());
  auto token = Grant("a/vm/0", {0, 32});
  ASSERT_THAT(token.status(), IsOk());
  ASSERT_THAT(registry_.SetDrained(ctx_, "b", true), IsOk());
  const absl::Time drained_at = clock_.Now();
  clock_.AdvanceTime(absl::Seconds(1));
  auto d = registry_.Describe(ctx_);
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_EQ(d->epoch, polled->epoch);
  EXPECT_EQ(d->version, polled->version + 2);  // The grant and the drain.
  EXPECT_EQ(d->server_time, clock_.Now());
  EXPECT_EQ(d->grants_from, polled->grants_from);
  ASSERT_EQ(d->drained.size(), 1u);
  EXPECT_EQ(d->drained.at("b"), drained_at);
  EXPECT_THAT(d->warnings, IsEmpty());
  ASSERT_TRUE(d->kinds.contains("vm"));
  const KindDescription& vm = d->kinds.at("vm");
  EXPECT_EQ(vm.ring_size, 64u);
  EXPECT_EQ(vm.last_token, *token);
  ASSERT_EQ(vm.members.size(), 2u);
  EXPECT_EQ(vm.members[0].id, "a/vm/0");
  EXPECT_EQ(vm.members[0].lease_expiry, drained_at + absl::Seconds(3));
  EXPECT_EQ(vm.members[0].held, (Assignment{{0, 32}, *token}));
  EXPECT_EQ(vm.members[1].id, "b/vm/0");
  EXPECT_FALSE(vm.members[1].held.has_value());
  // Reading expires nothing and advances nothing: past the lease the
  // members are still listed, with a lease that ended.
  clock_.AdvanceTime(absl::Seconds(5));
  auto later = registry_.Describe(ctx_);
  ASSERT_THAT(later.status(), IsOk());
  EXPECT_EQ(later->version, d->version);
  ASSERT_EQ(later->kinds.at("vm").members.size(), 2u);
  EXPECT_LE(later->kinds.at("vm").members[0].lease_expiry, later->server_time);
  // The next poll drops them.
  auto r = Poll({});
  EXPECT_THAT(r->kinds["vm"].members, IsEmpty());
}

TEST_F(InMemoryNodeRegistryTest, DrainsAreForgottenWithTheStateAndRestored) {
  ASSERT_THAT(Poll({"a/vm/0"}).status(), IsOk());
  ASSERT_THAT(registry_.SetDrained(ctx_, "a", true), IsOk());
  InMemoryNodeRegistry::Snapshot drained = registry_.TakeSnapshot();
  registry_.ForgetEverything(absl::Seconds(3));
  auto r = Poll({"a/vm/0"});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_THAT(r->drained, IsEmpty());
  registry_.Restore(drained);
  r = Poll({"a/vm/0"});
  ASSERT_THAT(r.status(), IsOk());
  EXPECT_THAT(r->drained, ElementsAre("a"));
}

TEST(InMemoryNodeRegistryClock, DefaultsToTheMonotonicClockLikeTheManager) {
  InMemoryNodeRegistry registry;
  const absl::Time before = Clock::Monotonic()->Now();
  absl::StatusOr<RegistryDescription> d =
      registry.Describe(Context::Background());
  const absl::Time after = Clock::Monotonic()->Now();
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_GE(d->server_time, before);
  EXPECT_LE(d->server_time, after);
}

}  // namespace
}  // namespace setpoint
