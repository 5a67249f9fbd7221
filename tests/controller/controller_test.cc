// Controller: the one-owner promise down to each client call and plan step,
// fresh pieces for each Run, nothing acting without an assignment. Most
// tests run a whole node on the test's thread (ControllerHarness, a
// SimulatedClock); the ones about a call that is running during a handoff
// use real threads and poll conditions.
#include "setpoint/controller/controller.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "recording_api.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/planner/plan.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/controller_harness.h"
#include "setpoint/testing/metrics_snapshot.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::ControllerHarness;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using Map = absl::flat_hash_map<std::string, int>;
using controller_test::ApiClient;
using controller_test::Catalog;
using controller_test::Keys;
using controller_test::kRing;
using controller_test::Node;
using controller_test::RecordingApi;

// The controller under test: API -> "seen", catalog -> "want", one syncer.
ControllerBuildFn SyncBuild(RecordingApi* api, Catalog* catalog,
                            ApiClient* client,
                            absl::Duration interval = absl::Seconds(1)) {
  return [=](ControllerBuilder& b) {
    auto* seen = b.Poll<std::string, int>(
        "seen", [api](const Context& ctx) { return api->List(ctx); },
        {.interval = interval});
    auto* want = b.Poll<std::string, int>(
        "want", [catalog](const Context&) { return catalog->Get(); },
        {.interval = interval});
    b.Sync<std::string, int, int>(
        "sync", client, seen, want,
        {.max_in_flight = 4, .backoff = {.initial = absl::Milliseconds(10)}});
    return absl::OkStatus();
  };
}

// A client whose creates and updates are `write` (deletes succeed): for
// tests that look at the calls, not at a world.
class WriteClient : public SyncerClient<std::string, int, int> {
 public:
  explicit WriteClient(std::function<absl::Status(const Context&)> write)
      : write_(std::move(write)) {}
  absl::Status Create(const Context& ctx, const std::string&,
                      const int&) override {
    return write_(ctx);
  }
  absl::Status Update(const Context& ctx, const std::string&, const int&,
                      const int&) override {
    return write_(ctx);
  }
  absl::Status Delete(const Context&, const std::string&, const int&) override {
    return absl::OkStatus();
  }

 private:
  std::function<absl::Status(const Context&)> write_;
};

// Syncs the catalog to a world that never shows anything: every key is a
// create. `syncer`, if given, receives the syncer of each build.
ControllerBuildFn WantOnlyBuild(
    Catalog* catalog, SyncerClient<std::string, int, int>* client,
    Syncer<std::string, int, int>** syncer = nullptr) {
  return [=](ControllerBuilder& b) {
    auto* seen = b.Poll<std::string, int>(
        "seen", [](const Context&) { return absl::StatusOr<Map>(Map{}); });
    auto* want = b.Poll<std::string, int>(
        "want", [catalog](const Context&) { return catalog->Get(); });
    auto* made = b.Sync<std::string, int, int>("sync", client, seen, want);
    if (syncer != nullptr) *syncer = made;
    return absl::OkStatus();
  };
}

// --- One node on the test's thread ------------------------------------

TEST(ControllerTest, NodeNeverGrantedAnythingMakesNoCallsAndNoPlanSteps) {
  SimulatedClock clock;
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(100, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  std::atomic<int> creates{0}, steps{0};
  ControllerBuildFn sync = SyncBuild(&api, &catalog, &client);
  ControllerHarness h(
      [&](ControllerBuilder& b) {
        SETPOINT_RETURN_IF_ERROR(sync(b));
        b.Reconcile(MakePlan(
            "count", [&](const Context&) -> absl::StatusOr<Procedures> {
              ++creates;
              return ProcedureList(MakeProcedure(
                  "step", [&](const Context&) -> absl::StatusOr<Procedures> {
                    ++steps;
                    return Procedures{};
                  }));
            }));
        return absl::OkStatus();
      },
      {.clock = &clock, .node = Node("p/k/0"), .logger = NullLogger()});
  ASSERT_THAT(h.Start(), IsOk());
  h.Advance(absl::Minutes(1));
  ASSERT_THAT(h.Assign(ShardRange{}, 0), IsOk());  // Told: nothing.
  h.Advance(absl::Minutes(1));
  EXPECT_EQ(api.entered(), 0);
  EXPECT_EQ(creates.load(), 0);
  EXPECT_EQ(steps.load(), 0);
  // Given the ring, the same node converges and its plan runs.
  api.SetTruth("p/k/0", ShardRange{0, kRing});
  ASSERT_THAT(h.Assign(ShardRange{0, kRing}, 7), IsOk());
  h.Advance(absl::Seconds(5));
  EXPECT_EQ(api.world(), catalog.Get());
  EXPECT_GT(creates.load(), 0);
  EXPECT_GT(steps.load(), 0);
}

TEST(ControllerTest, CallsAndPlanStepsReadTheAssignmentTheyRunUnder) {
  SimulatedClock clock;
  Catalog catalog;
  catalog.Set("key-1", 1);
  std::vector<Assignment> seen_by_plan;
  Mutex mu;
  std::vector<Assignment> seen_by_calls;  // The test's thread only.
  WriteClient client([&](const Context& ctx) {
    if (const Assignment* a = AssignmentOf(ctx)) seen_by_calls.push_back(*a);
    return absl::OkStatus();
  });
  ControllerBuildFn sync = WantOnlyBuild(&catalog, &client);
  ControllerHarness h(
      [&](ControllerBuilder& b) {
        SETPOINT_RETURN_IF_ERROR(sync(b));
        b.Reconcile(MakePlan(
            "look", [&](const Context& ctx) -> absl::StatusOr<Procedures> {
              MutexLock l(&mu);
              if (const Assignment* a = AssignmentOf(ctx)) {
                seen_by_plan.push_back(*a);
              }
              return Procedures{};
            }));
        return absl::OkStatus();
      },
      {.clock = &clock, .node = Node("p/k/3"), .logger = NullLogger()});
  ASSERT_THAT(h.Start(), IsOk());
  ASSERT_THAT(h.Assign(ShardRange{0, kRing}, 42), IsOk());
  h.Advance(absl::Seconds(1));
  ASSERT_FALSE(seen_by_calls.empty());
  EXPECT_EQ(seen_by_calls[0].token, 42u);
  EXPECT_EQ(seen_by_calls[0].node_id, "p/k/3");
  EXPECT_EQ(seen_by_calls[0].range, (ShardRange{0, kRing}));
  MutexLock l(&mu);
  ASSERT_FALSE(seen_by_plan.empty());
  EXPECT_EQ(seen_by_plan.back().token, 42u);
}

// A fence that comes after the lease already ended (the manager passes the
// lease's end as the deadline) still empties the node when nothing runs.
TEST(ControllerTest, HandoffPastTheLeaseEndStillEmptiesTheNode) {
  SimulatedClock clock;
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(20, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  ControllerHarness h(
      SyncBuild(&api, &catalog, &client),
      {.clock = &clock, .node = Node("p/k/0"), .logger = NullLogger()});
  ASSERT_THAT(h.Start(), IsOk());
  api.SetTruth("p/k/0", {0, kRing});
  ASSERT_THAT(h.Assign({0, kRing}, 1), IsOk());
  h.Advance(absl::Seconds(2));
  ASSERT_EQ(api.world(), catalog.Get());
  const Context expired =
      Context::Background(&clock).WithDeadline(absl::InfinitePast());
  EXPECT_THAT(h.controller().UpdateShardRange(expired, {{}, 1}), IsOk());
  api.SetTruth("p/k/0", {});
  for (auto& [k, v] : Keys(20, 2)) catalog.Set(k, v);
  const int64_t entered = api.entered();
  h.Advance(absl::Seconds(5));
  EXPECT_EQ(api.entered(), entered);
}

TEST(ControllerTest, RunThatFailsOnceComesBackWithFreshPiecesAndConverges) {
  SimulatedClock clock;
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(50, 3)) catalog.Set(k, v);
  ApiClient client(&api);
  int builds = 0;
  ControllerBuildFn sync = SyncBuild(&api, &catalog, &client);
  ControllerHarness h(
      [&](ControllerBuilder& b) -> absl::Status {
        if (++builds == 1) return absl::UnavailableError("catalog is down");
        return sync(b);
      },
      {.clock = &clock, .node = Node("p/k/0"), .logger = NullLogger()});
  EXPECT_THAT(h.Start(), StatusIs(absl::StatusCode::kUnavailable));
  api.SetTruth("p/k/0", ShardRange{0, kRing});
  ASSERT_THAT(h.Assign(ShardRange{0, kRing}, 1), IsOk());  // Between runs.
  ASSERT_THAT(h.Start(), IsOk());
  h.Advance(absl::Seconds(3));
  EXPECT_EQ(api.world(), catalog.Get());
  // Stopped and started again: new pieces, the same assignment.
  h.Stop();
  catalog.Set("key-0", 9);
  ASSERT_THAT(h.Start(), IsOk());
  h.Advance(absl::Seconds(3));
  EXPECT_EQ(api.world(), catalog.Get());
  EXPECT_EQ(builds, 3);
  EXPECT_EQ(h.controller().stats().build_failures, 1);
}

TEST(ControllerTest, StaleRefusalIsCountedAndNotRetriedUnderTheSameAssignment) {
  SimulatedClock clock;
  Catalog catalog;
  catalog.Set("key-1", 1);
  int calls = 0;  // The test's thread only.
  WriteClient client([&](const Context& ctx) {
    ++calls;
    return AssignmentOf(ctx)->token < 5 ? StaleOwnerError("token < 5")
                                        : absl::OkStatus();
  });
  Syncer<std::string, int, int>* syncer = nullptr;
  ControllerHarness h(
      WantOnlyBuild(&catalog, &client, &syncer),
      {.clock = &clock, .node = Node("p/k/0"), .logger = NullLogger()});
  ASSERT_THAT(h.Start(), IsOk());
  ASSERT_THAT(h.Assign(ShardRange{0, kRing}, 3), IsOk());
  h.Advance(absl::Minutes(10));  // Far past any backoff.
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(syncer->stats().stale_refusals, 1);
  ASSERT_THAT(h.Assign(ShardRange{0, kRing}, 5), IsOk());  // A new grant.
  h.Advance(absl::Seconds(1));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(syncer->stats().creates, 1);
}

// Desired state worked out from another store whose keys differ: each
// replica set "set-i" x3 becomes "set-i-0".."set-i-2", which fall in any
// shard; two nodes on halves of the ring create exactly the replicas of
// their halves, and together all of them.
TEST(ControllerTest, TransformFromEveryKeyCreatesOnlyTheRangesReplicas) {
  SimulatedClock clock;
  RecordingApi api;
  Map sets;
  for (int i = 0; i < 30; ++i) sets[absl::StrCat("set-", i)] = 3;
  ApiClient client(&api);
  auto build = [&](ControllerBuilder& b) {
    auto* wanted_sets = b.PollAll<std::string, int>(
        "sets", [&](const Context&) { return absl::StatusOr<Map>(sets); },
        {.interval = absl::Seconds(1)});
    auto* want = b.Transform<std::string, int>(
        "expand",
        [wanted_sets] {
          Map replicas;
          for (const auto& [name, n] : wanted_sets->items()) {
            for (int r = 0; r < n; ++r)
              replicas[absl::StrCat(name, "-", r)] = 1;
          }
          return replicas;
        },
        wanted_sets);
    auto* seen = b.Poll<std::string, int>(
        "seen", [&](const Context& ctx) { return api.List(ctx); });
    b.Sync<std::string, int, int>("replicas", &client, seen, want);
    return absl::OkStatus();
  };
  ControllerHarness a(
      build, {.clock = &clock, .node = Node("p/k/0"), .logger = NullLogger()});
  ControllerHarness b(
      build, {.clock = &clock, .node = Node("q/k/0"), .logger = NullLogger()});
  ASSERT_THAT(a.Start(), IsOk());
  ASSERT_THAT(b.Start(), IsOk());
  api.SetTruth("p/k/0", {0, kRing / 2});
  api.SetTruth("q/k/0", {kRing / 2, kRing});
  ASSERT_THAT(a.Assign({0, kRing / 2}, 1), IsOk());
  ASSERT_THAT(b.Assign({kRing / 2, kRing}, 2), IsOk());
  for (int i = 0; i < 5; ++i) {
    a.Advance(absl::Seconds(1));
    b.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(api.world().size(), 90u);
  EXPECT_EQ(api.counts().outside_truth, 0);
  EXPECT_EQ(api.counts().unowned, 0);
  // The range moves: a shrinks, b grows; the replicas stay, none is
  // deleted or written by the wrong node.
  ASSERT_THAT(a.Assign({0, kRing / 4}, 1), IsOk());
  api.SetTruth("p/k/0", {0, kRing / 4});
  api.SetTruth("q/k/0", {kRing / 4, kRing});
  ASSERT_THAT(b.Assign({kRing / 4, kRing}, 3), IsOk());
  sets["set-0"] = 5;  // Two more replicas.
  for (int i = 0; i < 5; ++i) {
    a.Advance(absl::Seconds(1));
    b.Advance(absl::Seconds(1));
  }
  EXPECT_EQ(api.world().size(), 92u);
  EXPECT_EQ(api.counts().outside_truth, 0);
  EXPECT_EQ(api.counts().stale, 0);
}

// The property: over 1,000 random range changes between two nodes, after
// each UpdateShardRange returns no call for a key outside the node's new
// range starts (the API checks every call against what the node truly
// owns at that moment), and the API accepts nothing with a stale token or
// for a key its writer does not own. Calls handed to the updaters but not
// yet run when the range changes are the case this exercises: runner
// events are run without the calls (dispatch), then the range moves.
TEST(ControllerTest, ThousandRandomRangeChangesNeverLetAnOldOwnerWrite) {
  SimulatedClock clock;
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(400, 0)) catalog.Set(k, v);
  ApiClient client(&api);
  ControllerBuildFn build =
      SyncBuild(&api, &catalog, &client, absl::Milliseconds(50));
  ControllerHarness a(
      build, {.clock = &clock, .node = Node("p/k/0"), .logger = NullLogger()});
  ControllerHarness b(
      build, {.clock = &clock, .node = Node("q/k/0"), .logger = NullLogger()});
  ASSERT_THAT(a.Start(), IsOk());
  ASSERT_THAT(b.Start(), IsOk());
  std::mt19937_64 rng(20261201);
  uint64_t token = 0;
  // a owns [0, split), b owns [split, kRing).
  uint32_t split = kRing / 2;
  uint64_t token_a = ++token, token_b = ++token;
  api.SetTruth("p/k/0", {0, split});
  api.SetTruth("q/k/0", {split, kRing});
  ASSERT_THAT(a.Assign({0, split}, token_a), IsOk());
  ASSERT_THAT(b.Assign({split, kRing}, token_b), IsOk());
  auto drive = [&](ControllerHarness& h) {
    switch (rng() % 4) {
      case 0:  // Dispatch only: calls wait for their updater.
        h.controller().runner()->RunUntilIdle();
        break;
      case 1:
        h.RunUntilIdle();
        break;
      case 2:
        h.Advance(absl::Milliseconds(rng() % 120));
        break;
      default:
        break;
    }
  };
  for (int i = 0; i < 1000; ++i) {
    for (int j = 0; j < 8; ++j) {
      catalog.Set(absl::StrCat("key-", rng() % 400), static_cast<int>(i));
    }
    drive(a);
    drive(b);
    uint32_t next = static_cast<uint32_t>(rng() % (kRing + 1));
    if (next == split) continue;
    // Shrink first, and only once it returned grow the other node.
    ControllerHarness& shrinking = next < split ? a : b;
    ControllerHarness& growing = next < split ? b : a;
    const bool a_shrinks = next < split;
    ShardRange smaller =
        a_shrinks ? ShardRange{0, next} : ShardRange{next, kRing};
    ShardRange larger =
        a_shrinks ? ShardRange{next, kRing} : ShardRange{0, next};
    const std::string shrink_id = a_shrinks ? "p/k/0" : "q/k/0";
    const std::string grow_id = a_shrinks ? "q/k/0" : "p/k/0";
    uint64_t keep = a_shrinks ? token_a : token_b;
    ASSERT_THAT(shrinking.controller().UpdateShardRange(
                    Context::Background(&clock), {smaller, keep}),
                IsOk());
    EXPECT_EQ(api.RunningOutside(shrink_id, smaller), 0);
    api.SetTruth(shrink_id, smaller);
    drive(shrinking);
    uint64_t fresh = ++token;
    (a_shrinks ? token_b : token_a) = fresh;
    api.SetTruth(grow_id, larger);
    ASSERT_THAT(growing.controller().UpdateShardRange(
                    Context::Background(&clock), {larger, fresh}),
                IsOk());
    split = next;
    RecordingApi::Counts c = api.counts();
    ASSERT_EQ(c.outside_truth, 0) << "change " << i;
    ASSERT_EQ(c.stale, 0) << "change " << i;
    ASSERT_EQ(c.unowned, 0) << "change " << i;
  }
  for (int i = 0; i < 100 && api.world() != catalog.Get(); ++i) {
    a.Advance(absl::Milliseconds(100));
    b.Advance(absl::Milliseconds(100));
  }
  EXPECT_EQ(api.world(), catalog.Get());
  RecordingApi::Counts c = api.counts();
  EXPECT_EQ(c.outside_truth, 0);
  EXPECT_EQ(c.stale, 0);
  EXPECT_EQ(c.unowned, 0);
  EXPECT_GT(c.writes, 1000);
  EXPECT_EQ(c.max_running_per_key, 1);
}

// --- Calls running during a handoff (real threads) ---------------------

class RunningController {
 public:
  RunningController(NodeInfo info, ControllerBuildFn build,
                    absl::Duration handoff_timeout = absl::Seconds(10))
      : controller_(
            std::move(info), std::move(build),
            {.handoff_timeout = handoff_timeout, .logger = NullLogger()}) {
    thread_ = std::jthread([this](std::stop_token stop) {
      status_ = controller_.Run(Context(stop));
    });
  }
  ~RunningController() {
    thread_.request_stop();
    thread_.join();
  }
  Controller& operator*() { return controller_; }
  Controller* operator->() { return &controller_; }

 private:
  Controller controller_;
  absl::Status status_;
  std::jthread thread_;
};

TEST(ControllerTest, HeldCallForAKeyLeavingIsCancelledAndAwaitedByTheHandoff) {
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(40, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  RunningController node(
      Node("p/k/0"), SyncBuild(&api, &catalog, &client, absl::Milliseconds(5)));
  api.SetTruth("p/k/0", {0, kRing});
  api.Hold(/*ignore_cancel=*/true);
  ASSERT_THAT(node->UpdateShardRange(Context(), {{0, kRing}, 1}), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return api.entered() >= 4; }));
  // Move to the empty range on another thread: it must wait for the held
  // calls, which see their context cancelled.
  std::atomic<bool> returned{false};
  absl::Status handoff;
  std::thread relay([&] {
    handoff = node->UpdateShardRange(Context(), {{}, 1});
    returned = true;
  });
  ASSERT_TRUE(AwaitCondition([&] { return api.CancelsSeen() == 4; }));
  // The four calls saw their context cancelled and still run: the handoff
  // has not returned.
  EXPECT_EQ(api.RunningOutside("p/k/0", {}), 4);
  EXPECT_FALSE(returned.load());
  api.Open();
  relay.join();
  EXPECT_THAT(handoff, IsOk());
  EXPECT_EQ(api.RunningOutside("p/k/0", {}), 0);
  api.SetTruth("p/k/0", {});
  // Nothing starts afterwards.
  int64_t entered = api.entered();
  for (int i = 0; i < 40; ++i) catalog.Set(absl::StrCat("key-", i), 2);
  ASSERT_THAT(node->UpdateShardRange(Context(), {{}, 1}), IsOk());
  EXPECT_EQ(api.entered(), entered);
  EXPECT_EQ(api.counts().outside_truth, 0);
}

// A plan step slow to notice its cancellation does not delay the calls':
// they are cancelled, and no new one starts, before the step has ended.
TEST(ControllerTest, SlowPlanStepDoesNotHoldUpTheCancellationOfCalls) {
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(40, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  Mutex mu;
  CondVar cv;
  bool release = false, in_step = false;
  ControllerBuildFn sync =
      SyncBuild(&api, &catalog, &client, absl::Milliseconds(5));
  RunningController node(Node("p/k/0"), [&](ControllerBuilder& b) {
    SETPOINT_RETURN_IF_ERROR(sync(b));
    b.Reconcile(
        MakePlan("slow", [&](const Context&) -> absl::StatusOr<Procedures> {
          MutexLock l(&mu);
          in_step = true;
          // Ignores its context until the test lets it go.
          cv.Wait(&mu, {},
                  [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return release; });
          in_step = false;
          return Procedures{};
        }));
    return absl::OkStatus();
  });
  api.SetTruth("p/k/0", {0, kRing});
  api.Hold(/*ignore_cancel=*/false);
  ASSERT_THAT(node->UpdateShardRange(Context(), {{0, kRing}, 1}), IsOk());
  ASSERT_TRUE(AwaitCondition([&] {
    MutexLock l(&mu);
    return in_step && api.entered() >= 4;
  }));
  absl::Status handoff;
  std::thread relay([&] {
    handoff = node->UpdateShardRange(Context(), {{}, 1});
  });
  // The held calls return cancelled while the step still runs.
  ASSERT_TRUE(AwaitCondition([&] { return api.CancelsSeen() == 4; }));
  ASSERT_TRUE(
      AwaitCondition([&] { return api.RunningOutside("p/k/0", {}) == 0; }));
  int64_t entered = api.entered();
  {
    MutexLock l(&mu);
    EXPECT_TRUE(in_step);
    release = true;
    cv.SignalAll();
  }
  relay.join();
  EXPECT_THAT(handoff, IsOk());
  EXPECT_EQ(api.entered(), entered);  // Nothing started meanwhile.
}

TEST(ControllerTest, CallIgnoringCancellationPastTheBoundFailsTheHandoff) {
  RecordingApi api;
  Catalog catalog;
  catalog.Set("key-1", 1);
  ApiClient client(&api);
  RunningController node(
      Node("p/k/0"), SyncBuild(&api, &catalog, &client, absl::Milliseconds(5)),
      /*handoff_timeout=*/absl::Milliseconds(50));
  api.SetTruth("p/k/0", {0, kRing});
  api.Hold(/*ignore_cancel=*/true);
  ASSERT_THAT(node->UpdateShardRange(Context(), {{0, kRing}, 1}), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return api.entered() >= 1; }));
  EXPECT_THAT(node->UpdateShardRange(Context(), {{}, 1}),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(node->stats().handoff_failures, 1);
  api.Open();
  EXPECT_THAT(node->UpdateShardRange(Context(), {{}, 1}), IsOk());
}

TEST(ControllerTest, LeadershipMovesWhileALeaderExecutionRuns) {
  struct Log {
    Mutex mu;
    std::vector<std::string> events ABSL_GUARDED_BY(mu);
    void Add(std::string e) {
      MutexLock l(&mu);
      events.push_back(std::move(e));
    }
    bool Has(const std::string& e) {
      MutexLock l(&mu);
      return std::find(events.begin(), events.end(), e) != events.end();
    }
  } log;
  auto build = [&log](ControllerBuilder& b) {
    const std::string id = b.node().id;
    b.Reconcile(
        MakePlan("lead",
                 [&log, id](const Context& ctx) -> absl::StatusOr<Procedures> {
                   uint64_t token = AssignmentOf(ctx)->token;
                   return ProcedureList(MakeProcedure(
                       "long step",
                       [&log, id, token](
                           const Context& step) -> absl::StatusOr<Procedures> {
                         log.Add(absl::StrCat(id, " start ", token));
                         (void)step.Wait(absl::InfiniteDuration());
                         log.Add(absl::StrCat(id, " end ", token));
                         return step.Err();
                       }));
                 }),
        {.interval = absl::Milliseconds(1)});
    return absl::OkStatus();
  };
  ControllerKind kind = LeaderKind("lead", build);
  ASSERT_EQ(kind.ring_size, 1u);
  RunningController a(Node("p/lead/0", 1), kind.build);
  RunningController b(Node("q/lead/0", 1), kind.build);
  ASSERT_THAT(a->UpdateShardRange(Context(), {{0, 1}, 1}), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return log.Has("p/lead/0 start 1"); }));
  ASSERT_THAT(a->UpdateShardRange(Context(), {{}, 1}), IsOk());
  // Returned: the old leader's step was cancelled and has ended.
  EXPECT_TRUE(log.Has("p/lead/0 end 1"));
  ASSERT_THAT(b->UpdateShardRange(Context(), {{0, 1}, 2}), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return log.Has("q/lead/0 start 2"); }));
  EXPECT_FALSE(log.Has("p/lead/0 start 2"));
}

// End to end through a NodeManager: a node whose Run fails once is
// restarted by the manager and converges.
TEST(ControllerTest, ManagedNodeWhoseRunFailsOnceConverges) {
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(30, 4)) catalog.Set(k, v);
  ApiClient client(&api);
  api.SetTruth("pod/k/0", {0, kRing});
  std::atomic<int> builds{0};
  ControllerBuildFn sync =
      SyncBuild(&api, &catalog, &client, absl::Milliseconds(5));
  ControllerKind kind{.kind = "k",
                      .count = 1,
                      .ring_size = kRing,
                      .build = [&](ControllerBuilder& b) -> absl::Status {
                        if (++builds == 1) return absl::InternalError("once");
                        return sync(b);
                      },
                      .options = {.logger = NullLogger()}};
  InMemoryNodeRegistry registry;
  NodeManager manager({.pod_id = "pod",
                       .kinds = {kind.ToNodeKind()},
                       .registry = &registry,
                       .poll_interval = absl::Milliseconds(20),
                       .lease = absl::Milliseconds(200),
                       .restart_backoff = {.initial = absl::Milliseconds(10)},
                       .logger = NullLogger()});
  ASSERT_THAT(manager.Start(), IsOk());
  EXPECT_TRUE(AwaitCondition([&] { return api.world() == catalog.Get(); }));
  manager.Stop();
  EXPECT_GE(builds.load(), 2);
  EXPECT_EQ(api.counts().unowned, 0);
  EXPECT_EQ(api.counts().stale, 0);
}

TEST(ControllerTest, LaunchedControllerWorksWithoutACallerThreadUntilHalt) {
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(20, 3)) catalog.Set(k, v);
  ApiClient client(&api);
  Controller node(Node("p/k/0"),
                  SyncBuild(&api, &catalog, &client, absl::Milliseconds(5)),
                  {.logger = NullLogger()});
  EXPECT_TRUE(node.Threadless());
  api.SetTruth("p/k/0", {0, kRing});
  ASSERT_THAT(node.Launch(Context()), IsOk());
  EXPECT_THAT(node.Launch(Context()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("already launched")));
  ASSERT_THAT(node.UpdateShardRange(Context(), {{0, kRing}, 1}), IsOk());
  EXPECT_TRUE(AwaitCondition([&] { return api.world() == catalog.Get(); }));
  ASSERT_THAT(node.UpdateShardRange(Context(), {{}, 1}), IsOk());
  api.SetTruth("p/k/0", {});
  node.Halt();
  EXPECT_EQ(node.runner(), nullptr);
  EXPECT_EQ(node.stats().runs, 1);
  // Launched again after a halt: fresh pieces.
  ASSERT_THAT(node.Launch(Context()), IsOk());
  EXPECT_NE(node.runner(), nullptr);
  node.Halt();
  EXPECT_EQ(node.stats().runs, 2);
  EXPECT_EQ(api.counts().unowned, 0);
  EXPECT_EQ(api.counts().outside_truth, 0);
}

TEST(ControllerTest, ManualControllerIsNotThreadlessAndRefusesLaunch) {
  Controller node(Node("p/k/0"),
                  [](ControllerBuilder&) { return absl::OkStatus(); },
                  {.manual = true, .logger = NullLogger()});
  EXPECT_FALSE(node.Threadless());
  EXPECT_THAT(node.Launch(Context()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("manual mode")));
}

// --- What operators see ------------------------------------------------

TEST(ControllerTest, PublishesMetricsAndReportsStatusReadinessAndStaleness) {
  SimulatedClock clock;
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(40, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  MetricsRegistry metrics;
  NodeInfo node = Node("p/k/0");
  node.metrics = &metrics;
  ControllerBuildFn sync = SyncBuild(&api, &catalog, &client);
  ControllerHarness h(
      [&](ControllerBuilder& b) {
        SETPOINT_RETURN_IF_ERROR(sync(b));
        b.Reconcile(MakePlan("noop", [](const Context&) {
          return absl::StatusOr<Procedures>(Procedures{});
        }));
        return absl::OkStatus();
      },
      {.clock = &clock, .node = node, .logger = NullLogger()});
  NodeReport before;
  h.controller().Report(absl::Seconds(30), before);
  EXPECT_THAT(before.not_ready, ElementsAre(HasSubstr("not running")));
  ASSERT_THAT(h.Start(), IsOk());
  api.SetTruth("p/k/0", ShardRange{0, kRing});
  ASSERT_THAT(h.Assign(ShardRange{0, kRing}, 3), IsOk());
  h.Advance(absl::Seconds(5));
  ASSERT_EQ(api.world(), catalog.Get());

  ::setpoint::testing::MetricsSnapshot snap(metrics);
  const MetricLabels node_labels = {{"kind", "k"}, {"node", "p/k/0"}};
  EXPECT_EQ(snap.Value("setpoint_syncer_operations_total",
                       WithLabels(node_labels,
                                  {{"op", "create"}, {"result", "success"}})),
            40);
  EXPECT_EQ(snap.Count("setpoint_syncer_operation_duration_seconds",
                       WithLabels(node_labels, {{"op", "create"}})),
            40);
  EXPECT_EQ(snap.Value("setpoint_syncer_keys",
                       WithLabels(node_labels, {{"state", "converged"}})),
            40);
  EXPECT_EQ(snap.Value("setpoint_syncer_in_sync", node_labels), 1);
  EXPECT_GT(snap.Value("setpoint_runner_events_total", node_labels), 0);
  EXPECT_GE(snap.Value("setpoint_plan_executions_total",
                       WithLabels(node_labels, {{"result", "converged"}})),
            1);

  NodeReport report;
  h.controller().Report(absl::Seconds(30), report);
  EXPECT_THAT(report.stuck, IsEmpty());
  EXPECT_THAT(report.not_ready, IsEmpty());
  EXPECT_THAT(report.status_json,
              HasSubstr("\"assignment\":{\"range\":[0,64],\"shards\":[[0,64]],"
                        "\"token\":3}"));
  EXPECT_THAT(report.status_json, HasSubstr("\"keys\":40,\"converged\":40"));
  EXPECT_THAT(report.status_json, HasSubstr("{\"plan\":\"noop\""));
  h.Stop();
  NodeReport after;
  h.controller().Report(absl::Seconds(30), after);
  EXPECT_THAT(after.not_ready, ElementsAre(HasSubstr("not running")));
}

}  // namespace
}  // namespace setpoint
