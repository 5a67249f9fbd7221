#include "node/node_manager_fixture.h"

namespace setpoint {
namespace {

using namespace node_manager_testing;  // NOLINT(google-build-using-namespace)

TEST_F(NodeManagerTest, OnePodSplitsTheRingBetweenItsNodes) {
  NodeManager& a = StartPod("a");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  auto nodes = a.Nodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].id, "a/vm/0");
  EXPECT_EQ(nodes[0].active.range, (ShardRange{0, 32}));
  EXPECT_EQ(nodes[1].active.range, (ShardRange{32, 64}));
  EXPECT_GT(nodes[0].active.token, 0u);
  EXPECT_NE(nodes[0].active.token, nodes[1].active.token);
}

TEST_F(NodeManagerTest, JoiningPodTakesItsShareWithoutOverlap) {
  NodeManager& a = StartPod("a");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  EXPECT_EQ(tracker_.OwnedBy("a/"), 32);
  EXPECT_EQ(tracker_.OwnedBy("b/"), 32);
  EXPECT_GT(a.stats().releases, 0);
  EXPECT_GT(b.stats().grants, 0);
}

TEST_F(NodeManagerTest, GracefulStopHandsOverWithoutWaitingForTheLease) {
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  // Let the nudge rate limit refill (the handoff's own nudges used it).
  AdvanceUntil([] { return false; }, absl::Milliseconds(300));
  StopPod(b);
  for (const NodeState& n : b.Nodes()) {
    EXPECT_TRUE(n.active.range.Empty()) << n.id;
    EXPECT_FALSE(n.registered) << n.id;
  }
  // No simulated time passes: the takeover comes from the notification.
  EXPECT_TRUE(AwaitCondition([&] { return Balanced({&a}, 2); }));
  b.Stop();  // Idempotent.
}

TEST_F(NodeManagerTest, UnreachableRegistryFencesBeforeOthersTakeOver) {
  FaultyNodeRegistry& faulty = faulty_;
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPod("b", &faulty);
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  faulty.SetDown(true);
  // b stops working on its own; a takes everything once b's lease expired.
  // The tracker checks at every step that b stopped before a started.
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  EXPECT_GE(b.stats().fences, 2);
  for (const NodeState& n : b.Nodes()) EXPECT_TRUE(n.active.range.Empty());
  // Back online: b re-registers and gets its share again.
  faulty.SetDown(false);
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
}

TEST_F(NodeManagerTest, NodeThatRefusesItsShrinkKeepsItsShardsUntilItAccepts) {
  std::atomic<int>& refusals = refusals_;
  refusals = 3;
  NodeManagerOptions options = Options("a", &registry_);
  options.kinds[0].factory = [this](const NodeInfo& info) {
    return std::make_unique<RefusingNode>(info.id, &tracker_, &refusals_);
  };
  NodeManager& a = StartPodWith(std::move(options));
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  NodeManager& b = StartPod("b");
  // The tracker checks at every step that no shard b starts on is still
  // worked on by a: the refused shrinks keep a's record, so b waits.
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  EXPECT_EQ(a.stats().update_failures, 3);
  EXPECT_LE(refusals.load(), 0);
  EXPECT_EQ(tracker_.OwnedBy("b/"), 32);
}

// A refused shrink whose target then moves back (the joining pod left
// again) is still asked for until the node confirms one: a node that
// re-scoped part way (as a controller does) must not be left there.
TEST_F(NodeManagerTest,
       RefusedChangeIsAskedForUntilConfirmedEvenIfTheTargetMovesBack) {
  std::atomic<int>& refusals = refusals_;
  refusals = 1000;  // Refuse every shrink for now.
  NodeManagerOptions options = Options("a", &registry_, /*count=*/1);
  options.kinds[0].factory = [this](const NodeInfo& info) {
    return std::make_unique<RefusingNode>(info.id, &tracker_, &refusals_);
  };
  NodeManager& a = StartPodWith(std::move(options));
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 1); }));
  NodeManager& b = StartPod("b", nullptr, /*count=*/1);
  ASSERT_TRUE(AdvanceUntil([&] { return a.stats().update_failures >= 2; }));
  StopPod(b);  // The target is the whole ring again.
  refusals = 0;
  const int64_t delivered = a.stats().updates_delivered;
  ASSERT_TRUE(
      AdvanceUntil([&] { return a.stats().updates_delivered > delivered; }));
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 1); }));
}

TEST_F(NodeManagerTest, FailedNodeLeavesTheRingAndRestarts) {
  NodeManager& a = StartPod("a", nullptr, 2, /*fail_runs=*/1);
  // Both nodes fail once, leave, wait 1 s and come back. The failures are
  // the nodes' own threads, which Idle() cannot see coming: wait for them
  // in real time before time moves.
  ASSERT_TRUE(AwaitCondition([&] { return a.stats().restarts == 2; }));
  ASSERT_TRUE(AdvanceUntil([&] {
    auto nodes = a.Nodes();
    return nodes[0].restarts == 1 && nodes[1].restarts == 1 &&
           Balanced({&a}, 2);
  }));
  EXPECT_EQ(a.stats().restarts, 2);
}

TEST_F(NodeManagerTest, ThreadlessNodesGetNoThreadAndAreHaltedAfterHandoff) {
  ThreadlessNode::Log log;
  NodeManagerOptions o = Options("a", &registry_, 3);
  o.kinds[0].factory = [this, &log](const NodeInfo& info) {
    return std::make_unique<ThreadlessNode>(info.id, &tracker_, 0, &log);
  };
  NodeManager& a = StartPodWith(std::move(o));
  // Launched before Start returned, on the caller's thread.
  EXPECT_EQ(log.launches.load(), 3);
  EXPECT_EQ(ThreadsNamed("sp-node"), 0);
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 3); }));
  for (const NodeState& n : a.Nodes()) EXPECT_TRUE(n.running) << n.id;
  EXPECT_EQ(ThreadsNamed("sp-node"), 0);
  StopPod(a);
  // Halted once each, after the shards were handed back; never run.
  EXPECT_EQ(log.halts.load(), 3);
  EXPECT_EQ(log.halted_holding.load(), 0);
  EXPECT_EQ(log.runs.load(), 0);
  for (const NodeState& n : a.Nodes()) EXPECT_FALSE(n.running) << n.id;
}

TEST_F(NodeManagerTest, AThreadlessNodeWhoseLaunchFailsIsLaunchedAgain) {
  ThreadlessNode::Log log;
  NodeManagerOptions o = Options("a", &registry_, 2);
  o.kinds[0].factory = [this, &log](const NodeInfo& info) {
    return std::make_unique<ThreadlessNode>(info.id, &tracker_,
                                            info.index == 0 ? 2 : 0, &log);
  };
  NodeManager& a = StartPodWith(std::move(o));
  // Node 0 failed its launch on Start; its restart thread backs off 1 s,
  // fails again, backs off 2 s and launches.
  ASSERT_TRUE(AwaitCondition([&] { return a.stats().restarts == 1; }));
  ASSERT_TRUE(AdvanceUntil(
      [&] { return a.Nodes()[0].restarts == 2 && Balanced({&a}, 2); }));
  EXPECT_EQ(log.launches.load(), 4);
  // The restart thread ended once the launch succeeded.
  EXPECT_TRUE(AwaitCondition([] { return ThreadsNamed("sp-node") == 0; }));
  StopPod(a);
  EXPECT_EQ(log.halts.load(), 2);
  EXPECT_EQ(log.runs.load(), 0);
}

TEST_F(NodeManagerTest, RegistryThatForgotFencesEveryoneThenRecovers) {
  NodeManager& a = StartPod("a");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  uint64_t old_token = a.Nodes()[0].active.token;
  registry_.ForgetEverything(absl::Seconds(3));
  ASSERT_TRUE(AdvanceUntil([&] { return a.stats().epoch_changes == 1; }));
  for (const NodeState& n : a.Nodes()) EXPECT_TRUE(n.active.range.Empty());
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  EXPECT_GT(a.Nodes()[0].active.token, old_token);
}

TEST_F(NodeManagerTest, RecordThatDiffersFromWhatTheNodeHoldsStopsItAtOnce) {
  NodeManager& a = StartPod("a");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  NodeState n = a.Nodes()[0];
  // Same range, another token (someone rewrote the record, or a grant the
  // node never heard of): the node stops, then is granted afresh.
  registry_.OverwriteHeld("vm", n.id, {n.active.range, n.active.token + 7});
  ASSERT_TRUE(AdvanceUntil([&] { return a.stats().fences == 1; }));
  ASSERT_TRUE(AdvanceUntil([&] {
    return Balanced({&a}, 2) && a.Nodes()[0].active.token > n.active.token;
  }));
  // The right token, but a record that does not cover the node's range:
  // others could be granted the rest.
  n = a.Nodes()[0];
  registry_.OverwriteHeld(
      "vm", n.id,
      {ShardRange{n.active.range.Hull().begin, n.active.range.Hull().begin + 1},
       n.active.token});
  ASSERT_TRUE(AdvanceUntil([&] { return a.stats().fences == 2; }));
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
}

TEST_F(NodeManagerTest, GrantWhoseReplyWasLostStopsTheNodeAndRecovers) {
  NodeManager& a = StartPod("a", &faulty_);
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  // a's next two grants (each node grows) happen in the registry, but a
  // hears timeouts: a node works on less than the record says, under
  // another token, so it stops before it is granted again.
  faulty_.LoseNextGrantReplies(2);
  StopPod(b);
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  EXPECT_GE(a.stats().fences, 1);
}

TEST_F(NodeManagerTest, HungRegistryFencesEveryNodeAtTheDeadline) {
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPod("b", &faulty_, 4);
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 6); }));
  // b's next registry call blocks and ignores its deadline (a Redis that
  // hangs). b renewed less than one poll (500 ms) ago, so its fence
  // deadline (renewal + 3 s - 600 ms) comes within 2.45 s and its lease in
  // the registry (renewal + 3 s) not before 2.5 s.
  faulty_.SetHang(true);
  AdvanceWith({&a}, absl::Milliseconds(2450));
  EXPECT_TRUE(AwaitCondition([&] { return AllEmpty(b); }));
  EXPECT_GE(faulty_.hanging(), 1)
      << "the fence must not wait for the hung call";
  EXPECT_EQ(b.stats().fences, 4);
  AdvanceWith({&a}, absl::Seconds(1));
  ASSERT_TRUE(AwaitCondition([&] { return Balanced({&a}, 2); }));
  faulty_.SetHang(false);
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 6); }));
}

TEST_F(NodeManagerTest, NodesShareThePodsUpdaterPool) {
  // The pod owns the pool; the manager hands it to every node.
  UpdaterPool pool({.name = "u/updaters", .threads = 5});
  ASSERT_THAT(pool.Start(), IsOk());
  std::vector<UpdaterPool*> seen;
  NodeManagerOptions o = Options("u", &registry_, 3);
  o.updaters = &pool;
  o.kinds[0].factory = [&](const NodeInfo& info) {
    seen.push_back(info.updaters);
    return std::make_unique<TestNode>(info.id, &tracker_, 0);
  };
  NodeManager& u = StartPodWith(std::move(o));
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0], &pool);
  EXPECT_EQ(seen[1], &pool);
  EXPECT_EQ(seen[2], &pool);

  std::vector<UpdaterPool*> none;
  NodeManagerOptions off = Options("v", &registry_, 1);
  off.kinds[0].factory = [&](const NodeInfo& info) {
    none.push_back(info.updaters);
    return std::make_unique<TestNode>(info.id, &tracker_, 0);
  };
  StartPodWith(std::move(off));
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0], nullptr);
  StopPod(u);  // The nodes stop before their pool does.
  pool.Stop();
}

TEST_F(NodeManagerTest, NoValidityIsReportedWhileAFenceIsBeingDelivered) {
  Gate& gate = gate_;
  std::atomic<int>& reports = reports_;
  NodeManagerOptions o = Options("g", &faulty_, 1);
  o.kinds[0].factory = [&](const NodeInfo& info) {
    return std::make_unique<GatedNode>(info.id, &tracker_, &gate);
  };
  o.on_lease_renewed = [&](absl::Time) { ++reports; };
  NodeManager& g = StartPodWith(std::move(o));
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&g}, 1); }));
  gate.Close();
  faulty_.SetDown(true);
  // Past the deadline the relay starts the fence and blocks in it.
  for (int i = 0; i < 60 && gate.waiting() == 0; ++i) {
    clock_.AdvanceTime(absl::Milliseconds(50));
    ASSERT_TRUE(AwaitCondition([&] { return g.Idle() || gate.waiting() > 0; }));
  }
  ASSERT_EQ(gate.waiting(), 1);
  int before = reports.load();
  int64_t ok_polls = g.stats().polls - g.stats().poll_failures;
  faulty_.SetDown(false);
  // Renewals work again, but the node has not stopped yet: nothing valid
  // may be reported.
  auto ok = [&] { return g.stats().polls - g.stats().poll_failures; };
  for (int i = 0; i < 2; ++i) {
    int64_t seen = ok();
    clock_.AdvanceTime(absl::Milliseconds(600));
    ASSERT_TRUE(AwaitCondition([&] { return ok() > seen; }));
  }
  EXPECT_GT(g.stats().polls - g.stats().poll_failures, ok_polls);
  EXPECT_EQ(reports.load(), before);
  gate.Open();
  ASSERT_TRUE(AdvanceUntil(
      [&] { return reports.load() > before && Balanced({&g}, 1); }));
}

TEST_F(NodeManagerTest, RestoredOlderSnapshotFencesEveryoneForOneLease) {
  NodeManager& a = StartPod("a");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  InMemoryNodeRegistry::Snapshot old = registry_.TakeSnapshot();
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  // Redis restarts from a snapshot taken before b joined: it records a's
  // old ranges and knows nothing of b.
  registry_.Restore(old);
  ASSERT_TRUE(AdvanceUntil([&] {
    // One each, or two when the second poller had seen a newer version
    // than the first one's new epoch.
    return a.stats().epoch_changes >= 1 && b.stats().epoch_changes >= 1;
  }));
  absl::Time restored = clock_.Now();
  ASSERT_TRUE(AdvanceUntil([&] { return AllEmpty(a) && AllEmpty(b); }));
  int64_t grants = a.stats().grants + b.stats().grants;
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  EXPECT_GT(a.stats().grants + b.stats().grants, grants);
  EXPECT_GE(clock_.Now() - restored, absl::Seconds(2.5))
      << "no grant for one lease after the restart";
}

TEST_F(NodeManagerTest, TokensNeverGoBackAfterAFailoverThatLostGrants) {
  // A failover to a replica that lacks b's join and every grant since,
  // token counter included (no clock floor either, as with a primary whose
  // clock is behind): the pods report the highest tokens they hold or saw,
  // so every grant after it is larger (the tracker checks every shard's
  // tokens grow, at teardown).
  NodeManager& a = StartPod("a");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  InMemoryNodeRegistry::Snapshot old = registry_.TakeSnapshot();
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  uint64_t highest = 0;
  for (NodeManager* m : {&a, &b}) {
    for (const NodeState& n : m->Nodes()) {
      highest = std::max(highest, n.active.token);
    }
  }
  registry_.FailOverTo(old);
  ASSERT_TRUE(AdvanceUntil([&] {
    return a.stats().epoch_changes >= 1 && b.stats().epoch_changes >= 1;
  }));
  ASSERT_TRUE(AdvanceUntil([&] { return AllEmpty(a) && AllEmpty(b); }));
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  for (NodeManager* m : {&a, &b}) {
    for (const NodeState& n : m->Nodes()) EXPECT_GT(n.active.token, highest);
  }
}

TEST_F(NodeManagerTest, FloodOfAnnouncementsIsABoundedNumberOfPolls) {
  NodeManager& a = StartPod("a", &faulty_);
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  Settle();
  int64_t polls = a.stats().polls;
  faulty_.Announce(10000);
  Settle();
  // A burst, then nothing until the clock refills the bucket.
  EXPECT_LE(a.stats().polls - polls, 4);
  EXPECT_GE(a.stats().nudges, 10000);
  polls = a.stats().polls;
  for (int i = 0; i < 20; ++i) {
    faulty_.Announce(100);
    Settle();
    clock_.AdvanceTime(absl::Milliseconds(50));
  }
  Settle();
  // One second: at most one poll per 50 ms (poll_interval / 10), plus the
  // two the interval asks for.
  EXPECT_LE(a.stats().polls - polls, 20 + 2 + 1);
  EXPECT_TRUE(Balanced({&a}, 2));
}

TEST_F(NodeManagerTest, FloodOfFreedShardNoticesIsABoundedNumberOfLooks) {
  // Someone else holds the whole ring, so both of a's grants wait (its
  // view shows the shards held: nothing is sent); every notice that frees
  // shards of them asks for a look, within the nudge rate limit.
  Context ctx = Context::Background(&clock_);
  auto keep_x = [&] {
    return registry_.Poll(
        ctx, {.kinds = {{"vm", {"x/vm/0"}}}, .lease = absl::Seconds(3)});
  };
  ASSERT_THAT(keep_x().status(), IsOk());
  clock_.AdvanceTime(absl::Seconds(4));  // Past the new epoch's grace.
  auto view = keep_x();
  ASSERT_THAT(view.status(), IsOk());
  ASSERT_THAT(
      registry_.Grant(ctx, "vm", "x/vm/0", {0, kRing}, view->epoch).status(),
      IsOk());
  NodeManager& a = StartPod("a", &faulty_);
  ASSERT_TRUE(AwaitCondition([&] { return a.stats().grants_waited >= 2; }));
  Settle();
  const int64_t waited = a.stats().grants_waited;
  const int64_t polls = a.stats().polls;
  faulty_.AnnounceFreed("vm", {{0, kRing}}, 10000);
  Settle();
  for (int i = 0; i < 50; ++i) {  // One at a time, each looked at alone.
    // (The last shard: x keeps the lowest third of the ring, its share.)
    faulty_.AnnounceFreed("vm", {{kRing - 1, kRing}}, 1);
    Settle();
  }
  // Heard every one, looked again (a poll: these notices carry no view)
  // only within the nudge burst (4); the two grants waited again each
  // time and were never sent, as x still holds everything.
  EXPECT_EQ(a.stats().grant_retries, 10050);
  EXPECT_LE(a.stats().polls - polls, 4);
  EXPECT_GE(a.stats().polls - polls, 1);
  EXPECT_LE(a.stats().grants_waited - waited, 2 * 4);
  EXPECT_EQ(a.stats().grant_conflicts, 0);
  // Notices of shards nobody here waits for are ignored.
  faulty_.AnnounceFreed("other", {{0, kRing}}, 100);
  faulty_.AnnounceFreed("vm", {{kRing, kRing + 10}}, 100);
  Settle();
  EXPECT_EQ(a.stats().grant_retries, 10050);
  for (const NodeState& n : a.Nodes()) EXPECT_TRUE(n.active.range.Empty());
  ASSERT_THAT(keep_x().status(), IsOk());
}

TEST_F(NodeManagerTest, GrantsWaitWhileTheViewShowsTheirShardsHeld) {
  // b joins while a holds the whole ring: b's grants wait for a's
  // releases instead of being sent and refused, and go out once a poll
  // (after a's release notice) shows the shards free.
  NodeManager& a = StartPod("a");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  EXPECT_GE(b.stats().grants_waited, 1);
  EXPECT_EQ(b.stats().grant_conflicts, 0);
  EXPECT_EQ(tracker_.OwnedBy("b/"), 32);
}

// ---- Drain -------------------------------------------------------------

TEST_F(NodeManagerTest, DrainedPodHandsEveryShardOverAndUndrainGivesThemBack) {
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  const int64_t releases = b.stats().releases;
  Context ctx = Context::Background(&clock_);
  ASSERT_THAT(registry_.SetDrained(ctx, "b", true), IsOk());
  // b's nodes shrink to the empty range, release, and a grows into the
  // whole ring; the tracker checks at every step that a never starts on a
  // shard b still works on.
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2) && AllEmpty(b); }));
  EXPECT_GT(b.stats().releases, releases);
  EXPECT_TRUE(b.stats().drained);
  EXPECT_FALSE(a.stats().drained);
  EXPECT_EQ(tracker_.OwnedBy("b/"), 0);
  EXPECT_EQ(tracker_.OwnedBy("a/"), static_cast<int>(kRing));
  // Idle but alive: several leases later b still renews and holds nothing.
  AdvanceUntil([] { return false; }, absl::Seconds(7));
  for (const NodeState& n : b.Nodes()) {
    EXPECT_TRUE(n.registered) << n.id;
    EXPECT_TRUE(n.drained) << n.id;
    EXPECT_TRUE(n.active.range.Empty()) << n.id;
  }
  absl::StatusOr<RegistryDescription> d = registry_.Describe(ctx);
  ASSERT_THAT(d.status(), IsOk());
  ASSERT_EQ(d->kinds["vm"].members.size(), 4u);
  for (const MemberDescription& m : d->kinds["vm"].members) {
    EXPECT_GT(m.lease_expiry, d->server_time) << m.id << " keeps renewing";
    EXPECT_EQ(m.held.has_value(), m.id.rfind("a/", 0) == 0) << m.id;
  }
  EXPECT_EQ(b.stats().fences, 0) << "a drain is a handoff, not a fence";
  ASSERT_THAT(registry_.SetDrained(ctx, "b", false), IsOk());
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  EXPECT_FALSE(b.stats().drained);
  EXPECT_EQ(tracker_.OwnedBy("b/"), static_cast<int>(kRing / 2));
}

TEST_F(NodeManagerTest, WhenEveryPodIsDrainedNobodyOwnsAnything) {
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPod("b");
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  Context ctx = Context::Background(&clock_);
  ASSERT_THAT(registry_.SetDrained(ctx, "a", true), IsOk());
  ASSERT_THAT(registry_.SetDrained(ctx, "b", true), IsOk());
  ASSERT_TRUE(AdvanceUntil([&] { return AllEmpty(a) && AllEmpty(b); }));
  AdvanceUntil([] { return false; }, absl::Seconds(4));
  EXPECT_TRUE(AllEmpty(a));
  EXPECT_TRUE(AllEmpty(b));
  EXPECT_EQ(tracker_.OwnedBy(""), 0);
  absl::StatusOr<RegistryDescription> d = registry_.Describe(ctx);
  ASSERT_THAT(d.status(), IsOk());
  for (const MemberDescription& m : d->kinds["vm"].members) {
    EXPECT_FALSE(m.held.has_value()) << m.id;
  }
  // One pod back: it takes the whole ring.
  ASSERT_THAT(registry_.SetDrained(ctx, "a", false), IsOk());
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  EXPECT_TRUE(AllEmpty(b));
}

TEST_F(NodeManagerTest, PodDrainedBeforeItJoinsNeverOwnsAnything) {
  Context ctx = Context::Background(&clock_);
  ASSERT_THAT(registry_.SetDrained(ctx, "c", true), IsOk());
  NodeManager& a = StartPod("a");
  NodeManager& c = StartPod("c");
  // c registers and renews, but a keeps the whole ring.
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2); }));
  AdvanceUntil([] { return false; }, absl::Seconds(4));
  EXPECT_TRUE(Balanced({&a}, 2));
  EXPECT_TRUE(AllEmpty(c));
  EXPECT_EQ(c.stats().grants, 0);
  EXPECT_TRUE(c.stats().drained);
  for (const NodeState& n : c.Nodes()) EXPECT_TRUE(n.registered) << n.id;
}

TEST_F(NodeManagerTest,
       DrainedNodeThatRefusesItsShrinkKeepsItsShardsMeanwhile) {
  std::atomic<int>& refusals = refusals_;
  NodeManagerOptions options = Options("b", &registry_);
  options.kinds[0].factory = [this](const NodeInfo& info) {
    return std::make_unique<RefusingNode>(info.id, &tracker_, &refusals_);
  };
  NodeManager& a = StartPod("a");
  NodeManager& b = StartPodWith(std::move(options));
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a, &b}, 4); }));
  refusals = 4;
  ASSERT_THAT(registry_.SetDrained(Context::Background(&clock_), "b", true),
              IsOk());
  // While b refuses, its record stays and a is not granted its shards (the
  // tracker would see two owners); once b accepts, a takes everything.
  ASSERT_TRUE(AdvanceUntil([&] { return Balanced({&a}, 2) && AllEmpty(b); }));
  EXPECT_GE(b.stats().update_failures, 4);
}

TEST_F(NodeManagerTest, FaultyRegistryRefusesDrainsAndDescribeWhileDown) {
  Context ctx = Context::Background(&clock_);
  faulty_.SetDown(true);
  EXPECT_THAT(faulty_.SetDrained(ctx, "a", true),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(faulty_.Describe(ctx).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  faulty_.SetDown(false);
  ASSERT_THAT(faulty_.SetDrained(ctx, "a", true), IsOk());
  absl::StatusOr<RegistryDescription> d = faulty_.Describe(ctx);
  ASSERT_THAT(d.status(), IsOk());
  EXPECT_TRUE(d->drained.contains("a"));
}

TEST(NodeManagerOptionsTest, EffectiveFenceMarginIsTheGivenOneOrTheDefault) {
  NodeManagerOptions o{.poll_interval = absl::Milliseconds(500),
                       .lease = absl::Seconds(3)};
  EXPECT_EQ(EffectiveFenceMargin(o), absl::Milliseconds(600));  // 20 %.
  o.lease = absl::Seconds(2);
  EXPECT_EQ(EffectiveFenceMargin(o), absl::Milliseconds(500));  // A poll.
  o.fence_margin = absl::Milliseconds(250);
  EXPECT_EQ(EffectiveFenceMargin(o), absl::Milliseconds(250));
}

TEST(NodeRegistryHelpersTest, KindTargetsIsAssignShardsOverTheSharingMembers) {
  KindView view;
  view.members = {"a/vm/0", "a/vm/1", "b/vm/0", "c/vm/0", "c/vm/1"};
  view.held["a/vm/0"] = Assignment{ShardSet(0, 40), 1};
  view.held["b/vm/0"] = Assignment{ShardSet::Of({{40, 50}, {60, 64}}), 2};
  view.held["c/vm/1"] = Assignment{ShardSet(50, 60), 3};
  const std::set<std::string> drained = {"c"};
  std::map<std::string, ShardSet> held;
  for (const auto& [id, a] : view.held) held[id] = a.range;
  auto want = AssignShards(ShareMembers(view.members, drained), 64, held);
  auto got = KindTargets(view, drained, 64, {"a/vm/0", "b/vm/0", "c/vm/1"});
  EXPECT_EQ(got["a/vm/0"], want["a/vm/0"]);
  EXPECT_EQ(got["b/vm/0"], want["b/vm/0"]);
  EXPECT_TRUE(got["c/vm/1"].Empty()) << "a drained pod's node gets nothing";
  EXPECT_EQ(got["a/vm/0"], ShardSet(0, 22));  // Keeps the lowest of its own.
}

TEST(NodeRegistryHelpersTest, ShareMembersLeavesDrainedPodsOut) {
  EXPECT_EQ(PodOfNodeId("pod-a/vm/3"), "pod-a");
  EXPECT_EQ(PodOfNodeId("odd"), "odd");
  std::vector<std::string> members = {"a/vm/0", "a/vm/1", "ab/vm/0", "b/vm/0"};
  EXPECT_EQ(ShareMembers(members, {}), members);
  EXPECT_THAT(ShareMembers(members, {"a"}),
              ::testing::ElementsAre("ab/vm/0", "b/vm/0"));
  EXPECT_THAT(ShareMembers(members, {"a", "ab", "b"}), IsEmpty());
  EXPECT_THAT(ValidatePodId("pod-a"), IsOk());
  for (const char* bad : {"", "a/b", "a b", "a\n"}) {
    EXPECT_THAT(ValidatePodId(bad), StatusIs(absl::StatusCode::kInvalidArgument,
                                             HasSubstr("pod id")))
        << bad;
  }
}

TEST(NodeManagerOptionsTest, RefusesBadOptionsNamingTheField) {
  InMemoryNodeRegistry registry;
  auto factory = [](const NodeInfo&) -> std::unique_ptr<Node> {
    return nullptr;
  };
  auto base = [&] {
    return NodeManagerOptions{
        .pod_id = "p",
        .kinds = {{.kind = "vm", .count = 1, .factory = factory}},
        .registry = &registry,
    };
  };
  EXPECT_THAT(ValidateNodeManagerOptions(base()), IsOk());
  struct Case {
    std::function<void(NodeManagerOptions&)> mutate;
    std::string field;
  };
  std::vector<Case> cases = {
      {[](auto& o) { o.registry = nullptr; }, "registry"},
      {[](auto& o) { o.kinds.clear(); }, "kinds"},
      {[](auto& o) { o.kinds[0].count = 0; }, "kinds[0].count"},
      {[](auto& o) { o.kinds[0].ring_size = 0; }, "kinds[0].ring_size"},
      {[](auto& o) { o.kinds[0].kind = ""; }, "kinds[0].kind"},
      {[](auto& o) { o.kinds[0].kind = "a/b"; }, "kinds[0].kind"},
      {[](auto& o) { o.kinds.push_back(o.kinds[0]); }, "kinds[1].kind"},
      {[](auto& o) { o.kinds[0].factory = nullptr; }, "kinds[0].factory"},
      {[](auto& o) { o.lease = o.poll_interval; }, "lease"},
      {[](auto& o) { o.fence_margin = o.lease; }, "fence_margin"},
      {[](auto& o) { o.pod_id = "x/y"; }, "pod_id"},
      {[](auto& o) { o.nudge_burst = 0; }, "nudge_burst"},
      {[](auto& o) {
         o.poll_interval = absl::Milliseconds(500);
         o.lease = absl::Seconds(1);  // default margin 500 ms
       },
       "fence_margin"},
      {[](auto& o) {
         o.poll_interval = absl::Milliseconds(500);
         o.lease = absl::Milliseconds(900);
         o.fence_margin = absl::Milliseconds(100);
       },
       "lease"},
  };
  for (const Case& c : cases) {
    NodeManagerOptions o = base();
    c.mutate(o);
    EXPECT_THAT(
        ValidateNodeManagerOptions(o),
        StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field + " ")))
        << c.field;
  }
  // A factory returning null is reported by Start, which starts nothing.
  NodeManager manager(base());
  EXPECT_THAT(manager.Start(),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("p/vm/0")));
  manager.Stop();
}

TEST(NodeManagerIdTest, DefaultPodIdIsHostAndPid) {
  std::string id = DefaultPodId();
  EXPECT_THAT(id, HasSubstr("-" + std::to_string(getpid())));
  EXPECT_EQ(id.find('/'), std::string::npos);
}

}  // namespace
}  // namespace setpoint
