// Controller sources in whole nodes: a Watch piece through disconnects and
// an expiry; shared sources across random handoffs under the one-owner
// check of controller_test.cc (RecordingApi); one list per interval per
// pod; keys entering a range acted on from the shared cache; readiness and
// status that say what is wrong now; and plans whose rounds must read
// fresher state than the round before. Every node runs on the test's
// thread (ControllerHarness, a SimulatedClock).
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "recording_api.h"
#include "setpoint/base/status.h"
#include "setpoint/controller/controller.h"
#include "setpoint/controller/pod_sources.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/planner/plan.h"
#include "setpoint/processor/updater_pool.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/controller_harness.h"
#include "setpoint/testing/fake_watch_world.h"
#include "setpoint/testing/metrics_snapshot.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using controller_test::ApiClient;
using controller_test::Catalog;
using controller_test::Keys;
using controller_test::kRing;
using controller_test::Map;
using controller_test::Node;
using controller_test::RecordingApi;
using ::setpoint::testing::ControllerHarness;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::MetricsSnapshot;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using World = ::setpoint::testing::FakeWatchWorld<std::string, int>;

// "seen": the API's records, watched through the world the API mirrors its
// accepted writes to; "want": the catalog, polled every 50 ms. `shared`:
// both are shared by the pod's nodes of the kind.
ControllerBuildFn WatchBuild(World* world, Catalog* catalog, ApiClient* client,
                             bool shared) {
  return [=](ControllerBuilder& b) {
    auto list = [world](const Context& ctx) { return world->List(ctx); };
    auto watch = [world](const Context& ctx, const std::string& token) {
      return world->Watch(ctx, token);
    };
    auto want = [catalog](const Context&) {
      return absl::StatusOr<Map>(catalog->Get());
    };
    WatchSourceOptions<int> wo;
    wo.backoff = {.initial = absl::Milliseconds(10), .jitter = 0};
    PollingSourceOptions<int> po{.interval = absl::Milliseconds(50)};
    Store<std::string, int>* seen =
        shared ? b.SharedWatch<std::string, int>("seen", list, watch, wo)
               : b.Watch<std::string, int>("seen", list, watch, wo);
    Store<std::string, int>* desired =
        shared ? b.SharedPoll<std::string, int>("want", want, po)
               : b.Poll<std::string, int>("want", want, po);
    b.Sync<std::string, int, int>(
        "sync", client, seen, desired,
        {.max_in_flight = 4, .backoff = {.initial = absl::Milliseconds(10)}});
    return absl::OkStatus();
  };
}

// Writers with a fresh token for shards they own (the managers' test sets
// every node's truth to the whole ring).
void ExpectNoViolationButTruth(const RecordingApi& api) {
  RecordingApi::Counts c = api.counts();
  EXPECT_EQ(c.stale, 0);
  EXPECT_EQ(c.unowned, 0);
  EXPECT_EQ(c.max_running_per_key, 1);
}

void ExpectNoViolation(const RecordingApi& api) {
  RecordingApi::Counts c = api.counts();
  EXPECT_EQ(c.outside_truth, 0);
  EXPECT_EQ(c.stale, 0);
  EXPECT_EQ(c.unowned, 0);
  EXPECT_EQ(c.max_running_per_key, 1);
}

TEST(ControllerSourcesTest, WatchedNodeConvergesThroughDisconnectsAndExpiry) {
  SimulatedClock clock;
  RecordingApi api;
  World world;
  api.MirrorTo(&world);
  Catalog catalog;
  for (auto& [k, v] : Keys(40, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  ControllerHarness h(
      WatchBuild(&world, &catalog, &client, /*shared=*/false),
      {.clock = &clock, .node = Node("p/k/0"), .logger = NullLogger()});
  ASSERT_THAT(h.Start(), IsOk());
  api.SetTruth("p/k/0", {0, kRing});
  ASSERT_THAT(h.Assign({0, kRing}, 1), IsOk());
  h.Advance(absl::Seconds(2));
  ASSERT_EQ(api.world(), catalog.Get());
  // One list at the start (with no range: it keeps nothing) and one for
  // the range the node was given.
  EXPECT_EQ(world.stats().lists, 2);

  // The stream breaks; the source resumes from its token, no list.
  const int64_t watches = world.stats().watches;
  world.Disconnect();
  for (int i = 0; i < 10; ++i) catalog.Set(absl::StrCat("key-", i), 2);
  h.Advance(absl::Seconds(2));
  EXPECT_EQ(api.world(), catalog.Get());
  EXPECT_EQ(world.stats().lists, 2);
  EXPECT_EQ(world.stats().watches, watches + 1);

  // The server compacts under the stream: a list, and deletes still
  // converge.
  world.Compact();
  world.ExpireStreams();
  for (int i = 0; i < 5; ++i) catalog.Erase(absl::StrCat("key-", 30 + i));
  h.Advance(absl::Seconds(2));
  EXPECT_EQ(api.world(), catalog.Get());
  EXPECT_EQ(world.stats().lists, 3);
  // Every write was needed once: the watched view never made the syncer
  // write a key again.
  EXPECT_EQ(api.counts().writes, 40 + 10 + 5);
  ExpectNoViolation(api);
}

// Three nodes, two of them in one pod sharing its sources, the third in
// another pod; 500 random moves of the range boundaries, each a shrink
// (which must have stopped every call outside the smaller range when it
// returns) and then a grow with a newer token.
TEST(ControllerSourcesTest,
     SharedSourcesAcrossHandoffsNeverLetAnOldOwnerWrite) {
  SimulatedClock clock;
  RecordingApi api;
  World world;
  api.MirrorTo(&world);
  Catalog catalog;
  for (auto& [k, v] : Keys(300, 0)) catalog.Set(k, v);
  ApiClient client(&api);
  auto pod_p = std::make_shared<PodSources>();
  auto pod_q = std::make_shared<PodSources>();
  ControllerBuildFn build =
      WatchBuild(&world, &catalog, &client, /*shared=*/true);
  const std::vector<std::string> ids = {"p/k/0", "p/k/1", "q/k/0"};
  std::vector<std::unique_ptr<ControllerHarness>> nodes;
  for (const std::string& id : ids) {
    nodes.push_back(std::make_unique<ControllerHarness>(
        build, testing::ControllerHarnessOptions{
                   .clock = &clock,
                   .node = Node(id),
                   .pod_sources = id[0] == 'p' ? pod_p : pod_q,
                   .logger = NullLogger()}));
    ASSERT_THAT(nodes.back()->Start(), IsOk());
  }
  EXPECT_THAT(pod_p->SharedNames(), ::testing::ElementsAre("seen", "want"));
  // Node i owns [bound[i], bound[i + 1]).
  std::vector<uint32_t> bound = {0, kRing / 3, 2 * kRing / 3, kRing};
  std::vector<uint64_t> tokens(3);
  uint64_t token = 0;
  for (size_t i = 0; i < 3; ++i) {
    tokens[i] = ++token;
    api.SetTruth(ids[i], {bound[i], bound[i + 1]});
    ASSERT_THAT(nodes[i]->Assign({bound[i], bound[i + 1]}, tokens[i]), IsOk());
  }
  std::mt19937_64 rng(20261202);
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
  for (int step = 0; step < 500; ++step) {
    for (int j = 0; j < 8; ++j) {
      catalog.Set(absl::StrCat("key-", rng() % 300), step);
    }
    for (auto& n : nodes) drive(*n);
    const size_t b = 1 + rng() % 2;  // The boundary that moves.
    const uint32_t lo = bound[b - 1], hi = bound[b + 1];
    const uint32_t x = lo + static_cast<uint32_t>(rng() % (hi - lo + 1));
    if (x == bound[b]) continue;
    const bool left_shrinks = x < bound[b];
    const size_t shrink = left_shrinks ? b - 1 : b;
    const size_t grow = left_shrinks ? b : b - 1;
    const ShardRange smaller =
        left_shrinks ? ShardRange{lo, x} : ShardRange{x, hi};
    const ShardRange larger =
        left_shrinks ? ShardRange{x, hi} : ShardRange{lo, x};
    ASSERT_THAT(nodes[shrink]->controller().UpdateShardRange(
                    Context::Background(&clock), {smaller, tokens[shrink]}),
                IsOk());
    EXPECT_EQ(api.RunningOutside(ids[shrink], smaller), 0);
    api.SetTruth(ids[shrink], smaller);
    drive(*nodes[shrink]);
    tokens[grow] = ++token;
    api.SetTruth(ids[grow], larger);
    ASSERT_THAT(nodes[grow]->controller().UpdateShardRange(
                    Context::Background(&clock), {larger, tokens[grow]}),
                IsOk());
    bound[b] = x;
    RecordingApi::Counts c = api.counts();
    ASSERT_EQ(c.outside_truth, 0) << "step " << step;
    ASSERT_EQ(c.stale, 0) << "step " << step;
    ASSERT_EQ(c.unowned, 0) << "step " << step;
  }
  for (int i = 0; i < 100 && api.world() != catalog.Get(); ++i) {
    for (auto& n : nodes) n->Advance(absl::Milliseconds(100));
  }
  EXPECT_EQ(api.world(), catalog.Get());
  ExpectNoViolation(api);
  EXPECT_GT(api.counts().writes, 500);
  // One stream per pod, whatever its node count.
  EXPECT_EQ(world.stats().open_streams, 2);
}

// Four nodes of one pod: the shared poll lists once per interval for the
// pod; four Polls list four times.
TEST(ControllerSourcesTest, SharedPollListsOncePerIntervalForThePod) {
  for (bool shared : {true, false}) {
    SimulatedClock clock;
    std::atomic<int64_t> lists{0};
    auto build = [&lists, shared](ControllerBuilder& b) {
      auto list = [&lists](const Context&) {
        ++lists;
        return absl::StatusOr<Map>(Keys(100, 1));
      };
      PollingSourceOptions<int> o{.interval = absl::Seconds(1)};
      auto* store = shared ? b.SharedPoll<std::string, int>("want", list, o)
                           : b.Poll<std::string, int>("want", list, o);
      (void)store;
      return absl::OkStatus();
    };
    auto pod = std::make_shared<PodSources>();
    std::vector<std::unique_ptr<ControllerHarness>> nodes;
    for (uint32_t i = 0; i < 4; ++i) {
      nodes.push_back(std::make_unique<ControllerHarness>(
          build, testing::ControllerHarnessOptions{
                     .clock = &clock,
                     .node = Node(absl::StrCat("p/k/", i)),
                     .pod_sources = pod,
                     .logger = NullLogger()}));
      ASSERT_THAT(nodes.back()->Start(), IsOk());
      ASSERT_THAT(nodes.back()->Assign(SplitRing(kRing, 4, i), 1), IsOk());
    }
    for (int t = 0; t < 100; ++t) {  // 10 s.
      clock.AdvanceTime(absl::Milliseconds(100));
      for (auto& n : nodes) n->RunUntilIdle();
    }
    // The lists at 0 s, 1 s, ..., 10 s; each node's own Poll also lists
    // again for the range it was given.
    EXPECT_EQ(lists.load(), shared ? 11 : 4 * 11 + 4) << "shared=" << shared;
  }
}

// A node handed shards acts on their keys from the pod's shared cache at
// once: no list happens between the handoff and its writes.
TEST(ControllerSourcesTest, EnteringKeysAreActedOnFromTheSharedCache) {
  SimulatedClock clock;
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(60, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  std::atomic<int64_t> lists{0};
  auto build = [&](ControllerBuilder& b) {
    PollingSourceOptions<int> o{.interval = absl::Hours(1)};
    auto* seen = b.SharedPoll<std::string, int>(
        "seen",
        [&](const Context& ctx) {
          ++lists;
          return api.List(ctx);
        },
        o);
    auto* want = b.SharedPoll<std::string, int>(
        "want",
        [&](const Context&) {
          ++lists;
          return absl::StatusOr<Map>(catalog.Get());
        },
        o);
    b.Sync<std::string, int, int>("sync", &client, seen, want);
    return absl::OkStatus();
  };
  auto pod = std::make_shared<PodSources>();
  ControllerHarness a(build, {.clock = &clock,
                              .node = Node("p/k/0"),
                              .pod_sources = pod,
                              .logger = NullLogger()});
  ControllerHarness b(build, {.clock = &clock,
                              .node = Node("p/k/1"),
                              .pod_sources = pod,
                              .logger = NullLogger()});
  ASSERT_THAT(a.Start(), IsOk());
  ASSERT_THAT(b.Start(), IsOk());
  const ShardRange first{0, kRing / 2}, second{kRing / 2, kRing};
  api.SetTruth("p/k/0", first);
  ASSERT_THAT(a.Assign(first, 1), IsOk());
  a.RunUntilIdle();
  const int64_t written = api.counts().writes;
  ASSERT_GT(written, 0);
  ASSERT_LT(written, 60);
  EXPECT_EQ(lists.load(), 2);

  api.SetTruth("p/k/1", second);
  ASSERT_THAT(b.Assign(second, 2), IsOk());
  b.RunUntilIdle();
  EXPECT_EQ(lists.load(), 2);  // No list since the handoff.
  EXPECT_EQ(api.world(), catalog.Get());
  EXPECT_EQ(api.counts().writes, 60);
  ExpectNoViolation(api);
}

TEST(ControllerSourcesTest, ReadinessAndStatusSayWhatIsWrongWithASourceNow) {
  SimulatedClock clock;
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(20, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  MetricsRegistry metrics;
  NodeInfo node = Node("p/k/0");
  node.metrics = &metrics;
  auto build = [&](ControllerBuilder& b) {
    auto* seen = b.Poll<std::string, int>(
        "seen", [&](const Context& ctx) { return api.List(ctx); },
        {.interval = absl::Seconds(1)});
    auto* want = b.SharedPoll<std::string, int>(
        "want",
        [&](const Context&) { return absl::StatusOr<Map>(catalog.Get()); },
        {.interval = absl::Seconds(1)});
    b.Sync<std::string, int, int>("sync", &client, seen, want);
    return absl::OkStatus();
  };
  ControllerHarness h(build,
                      {.clock = &clock, .node = node, .logger = NullLogger()});
  ASSERT_THAT(h.Start(), IsOk());
  NodeReport before;
  h.controller().Report(absl::Seconds(30), before);
  // Not given a range yet: its stores have nothing to observe, all in
  // sync; the syncer is complete too.
  EXPECT_THAT(before.not_ready, IsEmpty());
  api.SetTruth("p/k/0", {0, kRing});
  ASSERT_THAT(h.Assign({0, kRing}, 1), IsOk());
  h.Advance(absl::Seconds(3));
  ASSERT_EQ(api.world(), catalog.Get());
  NodeReport ok;
  h.controller().Report(absl::Seconds(30), ok);
  EXPECT_THAT(ok.not_ready, IsEmpty());
  EXPECT_THAT(ok.status_json,
              HasSubstr("{\"source\":\"seen\",\"type\":\"poll\",\"shared\":"
                        "false,\"in_sync\":true,\"items\":20,"));
  EXPECT_THAT(ok.status_json,
              HasSubstr("{\"source\":\"want\",\"type\":\"poll\",\"shared\":"
                        "true,\"in_sync\":true,\"items\":20,"));
  EXPECT_THAT(ok.status_json, HasSubstr("\"keys\":20,\"store_in_sync\":true"));

  // An outage: after three failed lists the store is out of sync, and the
  // probe says so with the failure and its age, not "has not listed".
  api.FailLists(absl::UnavailableError("api down"));
  h.Advance(absl::Seconds(10));
  NodeReport down;
  h.controller().Report(absl::Seconds(30), down);
  EXPECT_THAT(down.not_ready,
              Contains(AllOf(HasSubstr("source seen: not in sync: last list "
                                       "failed "),
                             HasSubstr("ago: UNAVAILABLE: api down ("),
                             HasSubstr("failures in a row; last success "))));
  EXPECT_THAT(down.not_ready, Not(Contains(HasSubstr("has not listed"))));
  EXPECT_THAT(down.status_json,
              HasSubstr("\"last_error\":\"UNAVAILABLE: api down\""));
  MetricsSnapshot snap(metrics);
  const MetricLabels seen = {
      {"kind", "k"}, {"node", "p/k/0"}, {"source", "seen"}};
  EXPECT_GE(snap.Value("setpoint_source_lists_total",
                       WithLabels(seen, {{"result", "error"}})),
            3);
  EXPECT_GE(
      snap.Value("setpoint_source_errors_total",
                 WithLabels(seen, {{"op", "list"}, {"code", "UNAVAILABLE"}})),
      3);
  EXPECT_EQ(snap.Value("setpoint_source_in_sync", seen), 0);
  EXPECT_GE(snap.Value("setpoint_source_last_success_age_seconds", seen), 9);
  // The shared source is the pod's: labelled pod=, not node=.
  EXPECT_EQ(snap.Value("setpoint_source_in_sync",
                       {{"kind", "k"}, {"pod", "p"}, {"source", "want"}}),
            1);

  api.FailLists(absl::OkStatus());
  h.Advance(absl::Seconds(31));  // At most the 30 s cap of the backoff.
  NodeReport back;
  h.controller().Report(absl::Seconds(30), back);
  EXPECT_THAT(back.not_ready, IsEmpty());
}

// Plan rounds run back to back. A Create that reads a source's snapshot
// sees none of the previous round's writes (the source has not listed
// since), so it redoes them every round; AwaitFresh first makes it see
// them.
TEST(ControllerSourcesTest, PlanRoundsMustReadFresherStateThanTheLastRound) {
  for (bool fresh : {false, true}) {
    SimulatedClock clock;
    RecordingApi api;
    api.SetTruth("p/lead/0", {0, 1});
    const std::vector<std::string> want = {"a", "b", "c"};
    std::atomic<int64_t> serial{0};
    std::optional<ExecutionReport> report;
    auto build = [&](ControllerBuilder& b) {
      auto* zone = b.Poll<std::string, int>(
          "zone", [&](const Context& ctx) { return api.List(ctx); },
          {.interval = absl::Hours(1)});
      SourceReader<std::string, int> reader = b.Reader(zone);
      b.Reconcile(
          MakePlan(
              "records",
              [&, reader](const Context& ctx) -> absl::StatusOr<Procedures> {
                if (fresh) SETPOINT_RETURN_IF_ERROR(reader.AwaitFresh(ctx));
                SETPOINT_ASSIGN_OR_RETURN(Map now, reader.Snapshot());
                Procedures todo;
                for (const std::string& k : want) {
                  if (now.contains(k)) continue;
                  todo.push_back(MakeProcedure(
                      "create " + k,
                      [&,
                       k](const Context& step) -> absl::StatusOr<Procedures> {
                        SETPOINT_RETURN_IF_ERROR(api.Write(step, k, 1));
                        ++serial;  // The zone's serial, bumped per write.
                        return Procedures{};
                      }));
                }
                return todo;
              }),
          {.interval = absl::Hours(1),
           .on_report = [&](const ExecutionReport& r) { report = r; }});
      return absl::OkStatus();
    };
    ControllerHarness h(build, {.clock = &clock,
                                .node = Node("p/lead/0", /*ring=*/1),
                                .logger = NullLogger()});
    ASSERT_THAT(h.Start(), IsOk());
    ASSERT_THAT(h.Assign({0, 1}, 1), IsOk());
    ASSERT_TRUE(report.has_value());
    if (fresh) {
      EXPECT_EQ(serial.load(), 3);
      EXPECT_THAT(report->status, IsOk());
      EXPECT_EQ(report->rounds, 1);
    } else {
      // Every round until max_rounds wrote the three records again.
      EXPECT_EQ(serial.load(), 3 * 100);
      EXPECT_THAT(report->status, StatusIs(absl::StatusCode::kAborted));
      EXPECT_EQ(report->rounds, 100);
    }
    EXPECT_EQ(api.world().size(), 3u);
  }
}

// Through NodeManagers, on real threads: two pods of one program (as the
// demo runs them) with two nodes each list the catalog once per interval
// per pod, and converge.
TEST(ControllerSourcesTest, ManagedPodsListOncePerIntervalEach) {
  RecordingApi api;
  Catalog catalog;
  for (auto& [k, v] : Keys(50, 1)) catalog.Set(k, v);
  ApiClient client(&api);
  std::atomic<int64_t> lists{0};
  constexpr absl::Duration kInterval = absl::Milliseconds(50);
  ControllerKind kind{
      .kind = "k",
      .count = 2,
      .ring_size = kRing,
      .build =
          [&](ControllerBuilder& b) {
            auto* seen = b.SharedPoll<std::string, int>(
                "seen", [&](const Context& ctx) { return api.List(ctx); },
                {.interval = kInterval});
            auto* want = b.SharedPoll<std::string, int>(
                "want",
                [&](const Context&) {
                  ++lists;
                  return absl::StatusOr<Map>(catalog.Get());
                },
                {.interval = kInterval});
            b.Sync<std::string, int, int>("sync", &client, seen, want);
            return absl::OkStatus();
          },
      .options = {.logger = NullLogger()}};
  NodeKindOptions node_kind = kind.ToNodeKind();
  for (const char* pod : {"a", "b"}) {
    for (int i = 0; i < 2; ++i) {
      api.SetTruth(absl::StrCat(pod, "/k/", i), {0, kRing});
    }
  }
  InMemoryNodeRegistry registry;
  UpdaterPool updaters({.name = "updaters", .threads = 2});
  ASSERT_THAT(updaters.Start(), IsOk());
  std::vector<std::unique_ptr<NodeManager>> pods;
  for (const char* pod : {"a", "b"}) {
    pods.push_back(std::make_unique<NodeManager>(
        NodeManagerOptions{.pod_id = pod,
                           .kinds = {node_kind},
                           .registry = &registry,
                           .poll_interval = absl::Milliseconds(20),
                           .lease = absl::Milliseconds(500),
                           .updaters = &updaters,
                           .logger = NullLogger()}));
    ASSERT_THAT(pods.back()->Start(), IsOk());
  }
  ASSERT_TRUE(::setpoint::testing::AwaitCondition(
      [&] { return api.world() == catalog.Get(); }));
  // 40 more lists take about 20 intervals (two pods), not 10 (four
  // nodes). A loaded machine stretches intervals: fewer lists, never more.
  const int64_t before = lists.load();
  const absl::Time start = absl::Now();
  ASSERT_TRUE(::setpoint::testing::AwaitCondition(
      [&] { return lists.load() - before >= 40; }));
  const double intervals = (absl::Now() - start) / kInterval;
  EXPECT_LE(40 / intervals, 2.5);
  for (auto& p : pods) p->Stop();
  ExpectNoViolationButTruth(api);
}

TEST(ControllerSourcesTest, ASharedSourceDeclaredWithOtherTypesFailsTheBuild) {
  SimulatedClock clock;
  auto pod = std::make_shared<PodSources>();
  auto ints = [](ControllerBuilder& b) {
    b.SharedPoll<std::string, int>(
        "seen", [](const Context&) { return absl::StatusOr<Map>(Map{}); });
    return absl::OkStatus();
  };
  auto strings = [](ControllerBuilder& b) {
    b.SharedPoll<std::string, std::string>("seen", [](const Context&) {
      return absl::StatusOr<absl::flat_hash_map<std::string, std::string>>(
          absl::flat_hash_map<std::string, std::string>{});
    });
    return absl::OkStatus();
  };
  ControllerHarness a(ints, {.clock = &clock,
                             .node = Node("p/k/0"),
                             .pod_sources = pod,
                             .logger = NullLogger()});
  ControllerHarness b(strings, {.clock = &clock,
                                .node = Node("p/k/1"),
                                .pod_sources = pod,
                                .logger = NullLogger()});
  ASSERT_THAT(a.Start(), IsOk());
  EXPECT_THAT(b.Start(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shared source seen: declared with other key "
                                 "or value types")));
  EXPECT_EQ(b.controller().stats().build_failures, 1);
}

}  // namespace
}  // namespace setpoint
