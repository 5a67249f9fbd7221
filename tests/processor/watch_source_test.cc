// Tests for setpoint/processor/watch_source.h, against the testing kit's
// FakeWatchWorld: every case of the list-and-watch loop in manual mode on a
// simulated clock (deterministic), and the threaded loop once.
#include "setpoint/processor/watch_source.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/metrics.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/fake_watch_world.h"
#include "setpoint/testing/metrics_snapshot.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::FakeWatchWorld;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::MetricsSnapshot;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

using IntStore = Store<std::string, int>;
using World = FakeWatchWorld<std::string, int>;

constexpr absl::Duration kIdle = absl::Seconds(30);

bool StartsWithA(const std::string& key) { return key[0] == 'a'; }

// Backoff 1 s doubling, no jitter; idle after 30 s; loses sync after 3.
WatchSourceOptions<int> TestOptions(Clock* clock) {
  return {.name = "test",
          .idle_timeout = kIdle,
          .lose_sync_after = 3,
          .backoff = {.initial = absl::Seconds(1),
                      .max = absl::Seconds(30),
                      .multiplier = 2.0,
                      .jitter = 0.0},
          .backoff_reset_after = absl::Minutes(2),
          .clock = clock,
          .logger = NullLogger(),
          .manual = true};
}

// No threads: the source and the runner run on the test's thread.
class WatchSourceTest : public ::testing::Test {
 protected:
  WatchSourceTest() {
    store_.Subscribe([this](const Change<std::string, int>& c) {
      auto show = [](const int* v) {
        return v == nullptr ? std::string("_") : absl::StrCat(*v);
      };
      log_.push_back(absl::StrCat(ChangeKindName(c.kind), " ", c.key, " ",
                                  show(c.old_value), "->", show(c.new_value)));
    });
    store_.AddSyncObserver(
        [this](bool in_sync) { log_.push_back(in_sync ? "synced" : "lost"); });
  }

  void Make(WatchSourceOptions<int> options) {
    source_ = std::make_unique<WatchSource<std::string, int>>(
        &runner_, &store_,
        [this](const Context& ctx) { return world_.List(ctx); },
        [this](const Context& ctx, const std::string& token) {
          return world_.Watch(ctx, token);
        },
        std::move(options));
  }
  void Start(WatchSourceOptions<int> options) {
    Make(std::move(options));
    ASSERT_THAT(source_->Start(), IsOk());
    Drive();
  }
  // What a harness does at each moment: the source, then the runner.
  bool Drive() {
    bool progressed = source_->RunUntilIdle();
    runner_.RunUntilIdle();
    return progressed;
  }
  // Moves to the source's next wake-up (at most `limit` ahead) and drives.
  void AdvanceTo(absl::Time t) {
    clock_.AdvanceTo(t);
    Drive();
  }
  absl::Time Next() { return source_->NextWakeTime(); }
  std::vector<std::string> TakeLog() { return std::exchange(log_, {}); }
  std::vector<std::string> WatchedFrom() { return world_.stats().watched_from; }

  SimulatedClock clock_;
  World world_;
  std::vector<std::string> log_;
  IntStore store_{{.name = "observed", .logger = NullLogger()}};
  Runner runner_{{.name = "test", .clock = &clock_, .logger = NullLogger()}};
  std::unique_ptr<WatchSource<std::string, int>> source_;
};

TEST_F(WatchSourceTest, InSyncAfterTheListThenFollowsTheStream) {
  world_.Set("a", 1);
  world_.Set("b", 2);
  Start(TestOptions(&clock_));
  std::vector<std::string> log = TakeLog();
  EXPECT_THAT(log, UnorderedElementsAre("set a _->1", "set b _->2", "synced"));
  EXPECT_EQ(log.back(), "synced");
  EXPECT_THAT(WatchedFrom(), ElementsAre("2"));  // The list's token.

  world_.Set("c", 3);
  world_.Delete("a");
  world_.Set("b", 5);
  EXPECT_TRUE(Drive());
  EXPECT_THAT(TakeLog(), UnorderedElementsAre("set c _->3", "delete a 1->_",
                                              "set b 2->5"));
  EXPECT_THAT(store_.items(), UnorderedElementsAre(Pair("b", 5), Pair("c", 3)));
  SourceStatus s = source_->status();
  EXPECT_TRUE(s.in_sync);
  EXPECT_EQ(s.lists, 1);
  EXPECT_EQ(s.watch_events, 3);
  EXPECT_EQ(s.token, "5");
  EXPECT_EQ(s.items, 2);
  // A key set then deleted in one batch ends deleted.
  world_.Set("d", 1);
  world_.Delete("d");
  Drive();
  EXPECT_FALSE(store_.Find("d"));
  // Quiet: the next wake-up is the idle deadline.
  EXPECT_FALSE(Drive());
  EXPECT_EQ(Next(), clock_.Now() + kIdle);
}

TEST_F(WatchSourceTest, ResumesFromTheTokenAfterADisconnect) {
  world_.Set("a", 1);
  Start(TestOptions(&clock_));
  world_.Set("b", 2);
  Drive();
  TakeLog();
  ASSERT_EQ(source_->status().token, "2");

  world_.Disconnect();
  world_.Set("c", 3);  // While the stream is down.
  Drive();
  EXPECT_EQ(Next(), clock_.Now() + absl::Seconds(1));  // Backoff.
  EXPECT_TRUE(store_.InSync());  // One failure loses nothing.
  EXPECT_THAT(TakeLog(), IsEmpty());
  AdvanceTo(Next());
  // Resumed from the token: no list, the missed change arrives.
  EXPECT_THAT(WatchedFrom(), ElementsAre("1", "2"));
  EXPECT_THAT(TakeLog(), ElementsAre("set c _->3"));
  SourceStatus s = source_->status();
  EXPECT_EQ(s.lists, 1);
  EXPECT_EQ(s.relists, 0);
  EXPECT_EQ(s.watch_failures, 1);
  EXPECT_EQ(s.consecutive_failures, 0);  // The event was a success.
}

TEST_F(WatchSourceTest, ExpiryRelistsAndDeletesExactlyWhatIsGone) {
  for (const char* k : {"a", "b", "c", "d"}) world_.Set(k, 1);
  Start(TestOptions(&clock_));
  TakeLog();

  // The server compacts underneath the open stream.
  world_.Delete("b");
  world_.Set("c", 2);
  world_.Set("e", 1);
  world_.Compact();
  Drive();
  // One list: only b is deleted, only c and e set; a and d untouched.
  EXPECT_THAT(TakeLog(), UnorderedElementsAre("delete b 1->_", "set c 1->2",
                                              "set e _->1"));
  EXPECT_EQ(store_.stats().deletes, 1);
  SourceStatus s = source_->status();
  EXPECT_EQ(s.lists, 2);
  EXPECT_EQ(s.relists, 1);
  EXPECT_EQ(s.expiries, 1);
  EXPECT_TRUE(s.in_sync);
  EXPECT_EQ(WatchedFrom().back(), "7");  // The new list's token.

  // A resume whose token was compacted while the stream was down: the
  // open says expired, and the source lists again.
  world_.Disconnect();
  world_.Delete("a");
  world_.Compact();
  Drive();
  AdvanceTo(Next());
  EXPECT_THAT(TakeLog(), ElementsAre("delete a 1->_"));
  EXPECT_EQ(source_->status().lists, 3);
  EXPECT_EQ(source_->status().expiries, 2);
  EXPECT_THAT(store_.items(),
              UnorderedElementsAre(Pair("c", 2), Pair("d", 1), Pair("e", 1)));
}

TEST_F(WatchSourceTest, BookmarksMoveTheTokenAndKeepAQuietStreamAlive) {
  world_.Set("a", 1);
  Start(TestOptions(&clock_));
  // Other kinds' changes move the server's revision; no event for us.
  for (int i = 0; i < 3; ++i) world_.BumpRevision();
  clock_.AdvanceTime(kIdle - absl::Seconds(1));
  world_.Bookmark();
  EXPECT_TRUE(Drive());
  SourceStatus s = source_->status();
  EXPECT_EQ(s.bookmarks, 1);
  EXPECT_EQ(s.token, "4");
  // The bookmark counted as life: no idle timeout at the old deadline.
  AdvanceTo(clock_.Now() + absl::Seconds(2));
  EXPECT_EQ(source_->status().watch_failures, 0);
  EXPECT_EQ(Next(), clock_.Now() - absl::Seconds(2) + kIdle);

  // After a disconnect and a compaction, the bookmarked token still
  // resumes: no list.
  world_.Disconnect();
  world_.Compact();
  Drive();
  AdvanceTo(Next());
  EXPECT_THAT(WatchedFrom(), ElementsAre("1", "4"));
  EXPECT_EQ(source_->status().lists, 1);
}

TEST_F(WatchSourceTest, WithoutABookmarkTheSameResumeHasExpired) {
  world_.Set("a", 1);
  Start(TestOptions(&clock_));
  for (int i = 0; i < 3; ++i) world_.BumpRevision();
  world_.Disconnect();
  world_.Compact();
  Drive();
  AdvanceTo(Next());
  EXPECT_EQ(source_->status().expiries, 1);
  EXPECT_EQ(source_->status().lists, 2);
  EXPECT_THAT(WatchedFrom(), ElementsAre("1", "1", "4"));
}

TEST_F(WatchSourceTest, IdleStreamIsTakenForDeadAndResumed) {
  world_.Set("a", 1);
  Start(TestOptions(&clock_));
  TakeLog();
  world_.SetSilent(true);  // A dead connection nobody noticed.
  world_.Set("b", 2);
  EXPECT_EQ(Next(), clock_.Now() + kIdle);
  AdvanceTo(Next());
  SourceStatus s = source_->status();
  EXPECT_EQ(s.watch_failures, 1);
  EXPECT_THAT(s.last_error.message(), HasSubstr("idle"));
  EXPECT_TRUE(store_.InSync());
  world_.SetSilent(false);
  AdvanceTo(Next());  // After the backoff: a new stream from the token.
  EXPECT_THAT(WatchedFrom(), ElementsAre("1", "1"));
  EXPECT_THAT(TakeLog(), ElementsAre("set b _->2"));
  EXPECT_EQ(source_->status().lists, 1);
}

TEST_F(WatchSourceTest, BackoffGrowsWhileFailingAndStartsOverWhenHealthy) {
  WatchSourceOptions<int> options = TestOptions(&clock_);
  options.lose_sync_after = 100;
  world_.Set("a", 1);
  Start(std::move(options));

  auto wait_after_failure = [&] {
    const absl::Time now = clock_.Now();
    Drive();
    absl::Duration wait = Next() - now;
    clock_.AdvanceTo(Next());
    return wait;
  };
  // A disconnect, then two failed opens, then success: 1 s, 2 s, 4 s.
  world_.Disconnect();
  world_.FailWatches(absl::UnavailableError("refused"), 2);
  EXPECT_EQ(wait_after_failure(), absl::Seconds(1));
  EXPECT_EQ(wait_after_failure(), absl::Seconds(2));
  EXPECT_EQ(wait_after_failure(), absl::Seconds(4));
  Drive();
  EXPECT_EQ(world_.stats().open_streams, 1);

  // A stream that breaks again soon after keeps growing the backoff...
  clock_.AdvanceTime(absl::Seconds(10));
  world_.Disconnect();
  EXPECT_EQ(wait_after_failure(), absl::Seconds(8));
  Drive();
  // ...one healthy for backoff_reset_after starts over.
  world_.Bookmark();
  Drive();
  clock_.AdvanceTime(absl::Minutes(2));
  world_.Bookmark();
  Drive();
  world_.Disconnect();
  EXPECT_EQ(wait_after_failure(), absl::Seconds(1));
  EXPECT_TRUE(store_.InSync());
}

TEST_F(WatchSourceTest, FailuresInARowLoseSyncAndAListBringsItBack) {
  world_.Set("a", 1);
  Start(TestOptions(&clock_));  // lose_sync_after = 3.
  TakeLog();
  world_.Disconnect();
  world_.FailWatches(absl::UnavailableError("refused"), 5);
  Drive();            // 1: the stream broke.
  AdvanceTo(Next());  // 2: the open failed.
  EXPECT_TRUE(store_.InSync());
  AdvanceTo(Next());  // 3: lost; the next attempt lists.
  EXPECT_FALSE(store_.InSync());
  EXPECT_THAT(TakeLog(), ElementsAre("lost"));
  EXPECT_THAT(source_->health().NotReady(),
              HasSubstr("source test: not in sync: last watch failed 0s "
                        "ago: UNAVAILABLE: refused (3 failures in a row; last "
                        "success"));
  world_.Set("b", 2);
  AdvanceTo(Next());  // A list, then an open that still fails.
  EXPECT_THAT(TakeLog(), ElementsAre("set b _->2", "synced"));
  SourceStatus s = source_->status();
  EXPECT_EQ(s.lists, 2);
  EXPECT_EQ(s.relists, 1);
  EXPECT_TRUE(s.in_sync);
  EXPECT_EQ(source_->health().NotReady(), "");
}

TEST_F(WatchSourceTest, RescopeListsAgainWithinTheNewFilter) {
  for (const char* k : {"a1", "a2", "b1"}) world_.Set(k, 1);
  Start(TestOptions(&clock_));
  TakeLog();
  world_.Set("a3", 1);
  // The re-scope, in one runner event.
  ASSERT_THAT(runner_.PostAndWait(Context::Background(&clock_),
                                  [this] { source_->Rescope(StartsWithA); }),
              IsOk());
  EXPECT_THAT(TakeLog(), ElementsAre("lost", "forget b1 1->_"));
  EXPECT_EQ(Next(), absl::InfinitePast());
  Drive();
  // A list within the filter; the stream starts over from its token.
  EXPECT_THAT(TakeLog(), ElementsAre("set a3 _->1", "synced"));
  EXPECT_EQ(source_->status().lists, 2);
  EXPECT_EQ(WatchedFrom().back(), "4");
  // Events for keys outside the filter are not kept.
  world_.Set("b2", 1);
  world_.Set("a4", 1);
  Drive();
  EXPECT_THAT(TakeLog(), ElementsAre("set a4 _->1"));
  EXPECT_THAT(source_->Snapshot(),
              UnorderedElementsAre(Pair("a1", 1), Pair("a2", 1), Pair("a3", 1),
                                   Pair("a4", 1)));
}

TEST_F(WatchSourceTest, AStreamClosedCleanlyReopensAtOnceWithoutAFailure) {
  world_.Set("a", 1);
  Start(TestOptions(&clock_));
  world_.CloseStreams();
  world_.Set("b", 1);
  Drive();
  EXPECT_THAT(WatchedFrom(), ElementsAre("1", "1"));
  EXPECT_TRUE(store_.Find("b"));
  SourceStatus s = source_->status();
  EXPECT_EQ(s.watch_failures, 0);
  EXPECT_EQ(s.consecutive_failures, 0);
  EXPECT_EQ(s.watch_opens, 2);
}

TEST_F(WatchSourceTest, AwaitFreshListsAgainOnTheCallersThread) {
  world_.Set("a", 1);
  Start(TestOptions(&clock_));
  world_.Set("a", 2);
  EXPECT_THAT(source_->AwaitFresh(Context::Background(&clock_)), IsOk());
  runner_.RunUntilIdle();
  EXPECT_EQ(*store_.Find("a"), 2);
  EXPECT_EQ(source_->status().lists, 2);
  EXPECT_EQ(source_->status().relists, 1);
  world_.FailLists(absl::UnavailableError("api down"));
  EXPECT_THAT(source_->AwaitFresh(Context::Background(&clock_)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("api down")));
}

TEST_F(WatchSourceTest, ThrowingCallsAreFailures) {
  int throws = 1;
  source_ = std::make_unique<WatchSource<std::string, int>>(
      &runner_, &store_,
      [&](const Context& ctx) -> absl::StatusOr<WatchList<std::string, int>> {
        if (throws-- > 0) throw std::runtime_error("list exploded");
        return world_.List(ctx);
      },
      [&](const Context&, const std::string&)
          -> absl::StatusOr<std::unique_ptr<WatchStream<std::string, int>>> {
        throw 7;
      },
      TestOptions(&clock_));
  ASSERT_THAT(source_->Start(), IsOk());
  Drive();
  EXPECT_THAT(source_->status().last_error,
              StatusIs(absl::StatusCode::kInternal, HasSubstr("exploded")));
  AdvanceTo(Next());
  EXPECT_TRUE(store_.InSync());  // The list worked.
  EXPECT_THAT(source_->status().last_error,
              StatusIs(absl::StatusCode::kInternal,
                       HasSubstr("watch threw a non-standard exception")));
}

TEST_F(WatchSourceTest, PublishesItsSeries) {
  MetricsRegistry metrics;
  WatchSourceOptions<int> options = TestOptions(&clock_);
  options.metrics = &metrics;
  options.metric_labels = {{"kind", "k"}};
  world_.Set("a", 1);
  Start(std::move(options));
  world_.Set("b", 1);
  world_.Delete("a");
  Drive();
  world_.Bookmark();
  Drive();
  world_.Disconnect();
  Drive();
  clock_.AdvanceTime(absl::Seconds(3));
  MetricsSnapshot snap(metrics);
  const MetricLabels l = {{"kind", "k"}, {"source", "test"}};
  EXPECT_EQ(snap.Value("setpoint_source_lists_total",
                       WithLabels(l, {{"result", "success"}})),
            1);
  EXPECT_EQ(snap.Value("setpoint_source_watch_events_total",
                       WithLabels(l, {{"type", "set"}})),
            1);
  EXPECT_EQ(snap.Value("setpoint_source_watch_events_total",
                       WithLabels(l, {{"type", "delete"}})),
            1);
  EXPECT_EQ(snap.Value("setpoint_source_watch_events_total",
                       WithLabels(l, {{"type", "bookmark"}})),
            1);
  EXPECT_EQ(
      snap.Value("setpoint_source_errors_total",
                 WithLabels(l, {{"op", "watch"}, {"code", "UNAVAILABLE"}})),
      1);
  EXPECT_EQ(snap.Value("setpoint_source_watch_reconnects_total",
                       WithLabels(l, {{"reason", "error"}})),
            1);
  EXPECT_EQ(snap.Value("setpoint_source_items", l), 1);
  EXPECT_EQ(snap.Value("setpoint_source_in_sync", l), 1);
  EXPECT_EQ(snap.Value("setpoint_source_last_success_age_seconds", l), 3);
  EXPECT_EQ(snap.Count("setpoint_source_list_duration_seconds", l), 1);
  source_.reset();  // Its collector goes before the registry.
}

TEST(WatchSourceOptionsTest, StartRefusesBadOptionsNamingTheField) {
  SimulatedClock clock;
  Runner runner({.clock = &clock, .logger = NullLogger()});
  IntStore store;
  World world;
  struct Case {
    const char* field;
    WatchSourceOptions<int> options;
  };
  std::vector<Case> cases;
  cases.push_back({"idle_timeout", TestOptions(&clock)});
  cases.back().options.idle_timeout = absl::ZeroDuration();
  cases.push_back({"backoff_reset_after", TestOptions(&clock)});
  cases.back().options.backoff_reset_after = -absl::Seconds(1);
  cases.push_back({"list_timeout", TestOptions(&clock)});
  cases.back().options.list_timeout = -absl::Seconds(1);
  cases.push_back({"lose_sync_after", TestOptions(&clock)});
  cases.back().options.lose_sync_after = 0;
  cases.push_back({"backoff", TestOptions(&clock)});
  cases.back().options.backoff.multiplier = 0.5;
  for (Case& c : cases) {
    WatchSource<std::string, int> source(
        &runner, &store, [&](const Context& ctx) { return world.List(ctx); },
        [&](const Context& ctx, const std::string& t) {
          return world.Watch(ctx, t);
        },
        std::move(c.options));
    EXPECT_THAT(source.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr(c.field)))
        << c.field;
    EXPECT_FALSE(source.RunUntilIdle());
  }
  EXPECT_EQ(world.stats().lists, 0);
}

// The threaded loop: the stream blocks on the source's executor thread and
// events arrive with no step from the test; Stop closes it.
TEST(ThreadedWatchSourceTest, FollowsTheStreamAndStopClosesIt) {
  Runner runner({.name = "test", .logger = NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  IntStore store({.name = "observed", .logger = NullLogger()});
  World world;
  world.Set("a", 1);
  WatchSourceOptions<int> options;
  options.name = "threaded";
  options.backoff.initial = absl::Milliseconds(10);
  options.logger = NullLogger();
  WatchSource<std::string, int> source(
      &runner, &store, [&](const Context& ctx) { return world.List(ctx); },
      [&](const Context& ctx, const std::string& t) {
        return world.Watch(ctx, t);
      },
      std::move(options));
  ASSERT_THAT(source.Start(), IsOk());
  auto items = [&] {
    return runner.PostAndWait(Context(), [&] { return store.items(); })
        .value_or(absl::flat_hash_map<std::string, int>{});
  };
  ASSERT_TRUE(AwaitCondition([&] { return items().size() == 1; }));
  ASSERT_TRUE(AwaitCondition([&] { return world.stats().open_streams == 1; }));
  world.Set("b", 2);
  world.Delete("a");
  ASSERT_TRUE(AwaitCondition([&] {
    auto now = items();
    return now.size() == 1 && now.contains("b");
  }));
  world.Disconnect();
  world.Set("c", 3);
  // Resumed after the backoff (10 ms).
  ASSERT_TRUE(AwaitCondition([&] { return items().contains("c"); }));
  EXPECT_EQ(source.status().lists, 1);
  source.Stop();  // Cancels the Next blocked on its context.
  EXPECT_EQ(world.stats().open_streams, 0);
  runner.Stop();
}

}  // namespace
}  // namespace setpoint
