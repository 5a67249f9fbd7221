// Tests for setpoint/processor/shared_source.h, source_cache.h and
// source_executor.h: one list or watch feeding several stores each with its
// own filter, re-scoped from the cache; and the threads sources run on.
#include "setpoint/processor/shared_source.h"

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/source_executor.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/fake_watch_world.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::FakeWatchWorld;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

using Map = absl::flat_hash_map<std::string, int>;
using IntStore = Store<std::string, int>;
using Shared = SharedSource<std::string, int>;

KeyFilter<std::string> Prefix(char c) {
  return [c](const std::string& k) { return k[0] == c; };
}

// One node: a manual runner and its store, with a log of its changes.
struct Node {
  explicit Node(SimulatedClock* clock, const std::string& name)
      : store({.name = name, .logger = NullLogger()}),
        runner({.name = name, .clock = clock, .logger = NullLogger()}) {
    store.Subscribe([this](const Change<std::string, int>& c) {
      log.push_back(absl::StrCat(ChangeKindName(c.kind), " ", c.key));
    });
    store.AddSyncObserver(
        [this](bool in_sync) { log.push_back(in_sync ? "synced" : "lost"); });
  }
  std::vector<std::string> TakeLog() { return std::exchange(log, {}); }
  // The re-scope in one runner event, then what it posted.
  void Rescope(Shared::Subscription* sub, KeyFilter<std::string> filter) {
    ASSERT_THAT(
        runner.PostAndWait(Context(), [&] { sub->Rescope(std::move(filter)); }),
        IsOk());
    runner.RunUntilIdle();
  }

  std::vector<std::string> log;
  IntStore store;
  Runner runner;
};

class SharedPollTest : public ::testing::Test {
 protected:
  SharedPollTest() {
    source_ = Shared::Poll(
        [this](const Context&) -> absl::StatusOr<Map> {
          ++lists_;
          if (!error_.ok()) return error_;
          return world_;
        },
        {.name = "zone",
         .interval = absl::Seconds(10),
         .lose_sync_after = 1,
         .backoff = {.initial = absl::Seconds(1), .jitter = 0},
         .clock = &clock_,
         .logger = NullLogger(),
         .manual = true});
    for (char c : {'a', 'b', 'c'}) {
      nodes_.push_back(std::make_unique<Node>(&clock_, std::string(1, c)));
      subs_.push_back(
          source_->Subscribe(&nodes_.back()->runner, &nodes_.back()->store));
    }
  }
  void Drive() {
    source_->RunUntilIdle();
    for (auto& n : nodes_) n->runner.RunUntilIdle();
  }

  SimulatedClock clock_;
  Map world_ = {{"a1", 1}, {"a2", 1}, {"b1", 1}, {"c1", 1}};
  absl::Status error_;
  int lists_ = 0;
  std::unique_ptr<Shared> source_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::unique_ptr<Shared::Subscription>> subs_;
};

TEST_F(SharedPollTest, OneListFeedsEveryStoreItsOwnPart) {
  for (size_t i = 0; i < 3; ++i) {
    nodes_[i]->Rescope(subs_[i].get(), Prefix(static_cast<char>('a' + i)));
  }
  ASSERT_THAT(source_->Start(), IsOk());
  Drive();
  EXPECT_EQ(lists_, 1);
  EXPECT_THAT(nodes_[0]->store.items(),
              UnorderedElementsAre(Pair("a1", 1), Pair("a2", 1)));
  EXPECT_THAT(nodes_[1]->store.items(), UnorderedElementsAre(Pair("b1", 1)));
  EXPECT_THAT(nodes_[2]->store.items(), UnorderedElementsAre(Pair("c1", 1)));
  for (auto& n : nodes_) EXPECT_TRUE(n->store.InSync());
  EXPECT_EQ(source_->Snapshot().size(), 4u);  // The cache keeps every key.

  // A change reaches only the store whose filter selects it.
  for (auto& n : nodes_) n->TakeLog();
  world_["b2"] = 1;
  world_.erase("a1");
  clock_.AdvanceTime(absl::Seconds(10));
  Drive();
  EXPECT_EQ(lists_, 2);
  EXPECT_THAT(nodes_[0]->TakeLog(), ElementsAre("delete a1"));
  EXPECT_THAT(nodes_[1]->TakeLog(), ElementsAre("set b2"));
  EXPECT_THAT(nodes_[2]->TakeLog(), IsEmpty());
}

TEST_F(SharedPollTest, RescopeDeliversEnteringKeysFromTheCacheWithNoList) {
  nodes_[0]->Rescope(subs_[0].get(), Prefix('a'));
  nodes_[1]->Rescope(subs_[1].get(), Prefix('b'));
  ASSERT_THAT(source_->Start(), IsOk());
  Drive();
  for (auto& n : nodes_) n->TakeLog();

  // Node b takes over node a's keys: one runner event, no list.
  nodes_[0]->Rescope(subs_[0].get(), [](const std::string&) { return false; });
  nodes_[1]->Rescope(subs_[1].get(), [](const std::string& k) {
    return k[0] == 'a' || k[0] == 'b';
  });
  EXPECT_EQ(lists_, 1);
  // Node a holds nothing now, and has observed all of that.
  std::vector<std::string> a = nodes_[0]->TakeLog();
  EXPECT_THAT(a,
              UnorderedElementsAre("lost", "forget a1", "forget a2", "synced"));
  EXPECT_EQ(a.front(), "lost");
  EXPECT_EQ(a.back(), "synced");
  EXPECT_EQ(nodes_[0]->store.size(), 0u);
  // The forget comes first, then the part from the cache, in sync.
  std::vector<std::string> b = nodes_[1]->TakeLog();
  EXPECT_THAT(b, UnorderedElementsAre("lost", "set a1", "set a2", "synced"));
  EXPECT_EQ(b.front(), "lost");
  EXPECT_EQ(b.back(), "synced");
  EXPECT_TRUE(nodes_[1]->store.InSync());
  EXPECT_EQ(nodes_[1]->store.size(), 3u);
}

TEST_F(SharedPollTest, LossOfSyncReachesEveryStoreAndAGoodListEndsIt) {
  nodes_[0]->Rescope(subs_[0].get(), Prefix('a'));
  nodes_[1]->Rescope(subs_[1].get(), Prefix('b'));
  ASSERT_THAT(source_->Start(), IsOk());
  Drive();
  for (auto& n : nodes_) n->TakeLog();
  error_ = absl::UnavailableError("api down");
  clock_.AdvanceTime(absl::Seconds(10));
  Drive();  // lose_sync_after = 1.
  EXPECT_THAT(nodes_[0]->TakeLog(), ElementsAre("lost"));
  EXPECT_THAT(nodes_[1]->TakeLog(), ElementsAre("lost"));
  EXPECT_EQ(nodes_[0]->store.size(), 2u);  // Values are kept.
  // A store re-scoped meanwhile gets its part, but not in sync.
  nodes_[2]->Rescope(subs_[2].get(), Prefix('c'));
  EXPECT_EQ(nodes_[2]->store.size(), 1u);
  EXPECT_FALSE(nodes_[2]->store.InSync());
  nodes_[2]->TakeLog();
  error_ = absl::OkStatus();
  clock_.AdvanceTime(absl::Seconds(1));
  Drive();
  for (auto& n : nodes_) {
    EXPECT_THAT(n->TakeLog(), ElementsAre("synced"));
    EXPECT_TRUE(n->store.InSync());
  }
}

TEST_F(SharedPollTest, AnUnsubscribedStoreHearsNothingMore) {
  nodes_[0]->Rescope(subs_[0].get(), Prefix('a'));
  ASSERT_THAT(source_->Start(), IsOk());
  Drive();
  nodes_[0]->TakeLog();
  subs_[0].reset();
  world_["a3"] = 1;
  source_->Trigger();
  Drive();
  EXPECT_EQ(lists_, 2);
  EXPECT_THAT(nodes_[0]->TakeLog(), IsEmpty());
  // A store subscribed after the first list gets its part at once.
  Node late(&clock_, "late");
  auto sub = source_->Subscribe(&late.runner, &late.store);
  late.runner.RunUntilIdle();
  EXPECT_EQ(late.store.size(), 5u);
  EXPECT_TRUE(late.store.InSync());
}

TEST_F(SharedPollTest, AwaitFreshListsOnceForItsCaller) {
  ASSERT_THAT(source_->Start(), IsOk());
  Drive();
  world_["a9"] = 9;
  EXPECT_THAT(source_->AwaitFresh(Context::Background(&clock_)), IsOk());
  EXPECT_EQ(lists_, 2);
  EXPECT_TRUE(source_->Snapshot().contains("a9"));
  EXPECT_EQ(source_->status().relists, 0);  // A poll's list is no relist.
}

// A shared watch: every store follows the one stream; an expiry's re-list
// deletes in each store exactly its keys that are gone.
TEST(SharedWatchTest, EventsAndTombstonesFanOutToEachStoresPart) {
  SimulatedClock clock;
  FakeWatchWorld<std::string, int> world;
  for (const char* k : {"a1", "a2", "b1", "b2"}) world.Set(k, 1);
  auto source =
      Shared::Watch([&](const Context& ctx) { return world.List(ctx); },
                    [&](const Context& ctx, const std::string& t) {
                      return world.Watch(ctx, t);
                    },
                    {.name = "zone",
                     .clock = &clock,
                     .logger = NullLogger(),
                     .manual = true});
  Node a(&clock, "a"), b(&clock, "b");
  auto sa = source->Subscribe(&a.runner, &a.store);
  auto sb = source->Subscribe(&b.runner, &b.store);
  a.Rescope(sa.get(), Prefix('a'));
  b.Rescope(sb.get(), Prefix('b'));
  ASSERT_THAT(source->Start(), IsOk());
  auto drive = [&] {
    source->RunUntilIdle();
    a.runner.RunUntilIdle();
    b.runner.RunUntilIdle();
  };
  drive();
  a.TakeLog();
  b.TakeLog();
  world.Set("a3", 1);
  world.Set("b1", 2);
  drive();
  EXPECT_THAT(a.TakeLog(), ElementsAre("set a3"));
  EXPECT_THAT(b.TakeLog(), ElementsAre("set b1"));

  world.Delete("a1");
  world.Delete("b2");
  world.Compact();
  world.ExpireStreams();
  drive();
  EXPECT_THAT(a.TakeLog(), ElementsAre("delete a1"));
  EXPECT_THAT(b.TakeLog(), ElementsAre("delete b2"));
  EXPECT_EQ(source->status().relists, 1);
  EXPECT_EQ(world.stats().lists, 2);
  EXPECT_EQ(world.stats().open_streams, 1);  // One stream for both.
}

// --- SourceExecutor --------------------------------------------------------

// A task that counts its runs and can be held inside one.
class CountingTask : public SourceExecutor::Task {
 public:
  explicit CountingTask(absl::Duration every) : every_(every) {}
  int runs() const { return runs_.load(); }
  void Hold() {
    MutexLock l(&mu_);
    hold_ = true;
  }
  void Release() {
    MutexLock l(&mu_);
    hold_ = false;
    cv_.SignalAll();
  }
  bool held() {
    MutexLock l(&mu_);
    return inside_;
  }
  bool saw_stop() const { return saw_stop_.load(); }

 protected:
  absl::Time Run(std::stop_token stop) override {
    ++runs_;
    MutexLock l(&mu_);
    inside_ = true;
    cv_.Wait(&mu_, stop,
             [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !hold_; });
    inside_ = false;
    if (stop.stop_requested()) saw_stop_ = true;
    return Clock::Real()->Now() + every_;
  }

 private:
  const absl::Duration every_;
  std::atomic<int> runs_{0};
  std::atomic<bool> saw_stop_{false};
  Mutex mu_;
  CondVar cv_;
  bool hold_ ABSL_GUARDED_BY(mu_) = false;
  bool inside_ ABSL_GUARDED_BY(mu_) = false;
};

TEST(SourceExecutorTest, ManyQuickTasksShareAFewThreads) {
  SourceExecutor executor({.name = "test",
                           .idle_exit = absl::Milliseconds(50),
                           .logger = NullLogger()});
  ASSERT_THAT(executor.Start(), IsOk());
  std::vector<std::unique_ptr<CountingTask>> tasks;
  for (int i = 0; i < 20; ++i) {
    tasks.push_back(std::make_unique<CountingTask>(absl::Milliseconds(50)));
    ASSERT_THAT(executor.Attach(tasks.back().get()), IsOk());
  }
  ASSERT_TRUE(AwaitCondition([&] {
    for (auto& t : tasks) {
      if (t->runs() < 3) return false;
    }
    return true;
  }));
  // Quick tasks need a leader and the thread running one: threads that
  // started in a burst leave after idling.
  ASSERT_TRUE(AwaitCondition([&] { return executor.stats().threads <= 4; }));
  for (size_t i = 1; i < tasks.size(); ++i) executor.Detach(tasks[i].get());
  ASSERT_TRUE(AwaitCondition([&] { return executor.stats().threads == 1; }));
  executor.Detach(tasks[0].get());
  executor.Stop();
}

TEST(SourceExecutorTest, ABlockedTaskDoesNotHoldUpTheOthers) {
  SourceExecutor executor({.name = "test",
                           .idle_exit = absl::Milliseconds(50),
                           .logger = NullLogger()});
  ASSERT_THAT(executor.Start(), IsOk());
  CountingTask blocked(absl::Milliseconds(1)), quick(absl::Milliseconds(1));
  blocked.Hold();
  ASSERT_THAT(executor.Attach(&blocked), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return blocked.held(); }));
  ASSERT_THAT(executor.Attach(&quick), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return quick.runs() >= 5; }));
  EXPECT_EQ(executor.stats().threads, 2);
  // Detach cancels the blocked run and waits for it.
  executor.Detach(&blocked);
  EXPECT_TRUE(blocked.saw_stop());
  EXPECT_FALSE(blocked.held());
  // The extra thread leaves once idle.
  ASSERT_TRUE(AwaitCondition([&] { return executor.stats().threads == 1; }));
  executor.Detach(&quick);
  executor.Stop();
  EXPECT_THAT(executor.Attach(&quick),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST(SourceExecutorTest, WakeRunsATaskEarlyAndStopCancelsRunningOnes) {
  SourceExecutor executor({.name = "test", .logger = NullLogger()});
  ASSERT_THAT(executor.Start(), IsOk());
  CountingTask slow(absl::Hours(1));
  ASSERT_THAT(executor.Attach(&slow), IsOk());
  ASSERT_TRUE(AwaitCondition([&] { return slow.runs() == 1; }));
  executor.Wake(&slow);
  ASSERT_TRUE(AwaitCondition([&] { return slow.runs() == 2; }));
  slow.Hold();
  executor.Wake(&slow);
  ASSERT_TRUE(AwaitCondition([&] { return slow.held(); }));
  executor.Stop();  // Cancels the held run and joins.
  EXPECT_TRUE(slow.saw_stop());
  executor.Detach(&slow);
}

TEST(SourceExecutorTest, BadOptionsAreRefusedNamingTheField) {
  SourceExecutor a({.max_threads = 0});
  EXPECT_THAT(a.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr("max_threads")));
  SourceExecutor b({.idle_exit = absl::ZeroDuration()});
  EXPECT_THAT(b.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                  ::testing::HasSubstr("idle_exit")));
}

// Sources on one executor: many polls, one thread while they wait.
TEST(SourceExecutorTest, PollingSourcesShareTheExecutorsThreads) {
  SourceExecutor executor({.name = "pod",
                           .idle_exit = absl::Milliseconds(50),
                           .logger = NullLogger()});
  ASSERT_THAT(executor.Start(), IsOk());
  Runner runner({.name = "test", .logger = NullLogger()});
  ASSERT_THAT(runner.Start(), IsOk());
  std::vector<std::unique_ptr<IntStore>> stores;
  std::vector<std::unique_ptr<PollingSource<std::string, int>>> sources;
  std::atomic<int> lists{0};
  for (int i = 0; i < 20; ++i) {
    stores.push_back(std::make_unique<IntStore>(
        StoreOptions<int>{.name = "s", .logger = NullLogger()}));
    sources.push_back(std::make_unique<PollingSource<std::string, int>>(
        &runner, stores.back().get(),
        [&lists](const Context&) -> absl::StatusOr<Map> {
          ++lists;
          return Map{{"k", 1}};
        },
        PollingSourceOptions<int>{.interval = absl::Milliseconds(100),
                                  .executor = &executor,
                                  .logger = NullLogger()}));
    ASSERT_THAT(sources.back()->Start(), IsOk());
  }
  ASSERT_TRUE(AwaitCondition([&] { return lists.load() >= 60; }));
  // Twenty sources whose lists are quick: a leader and a thread or two
  // listing (more for a while if the machine descheduled one mid-list).
  EXPECT_TRUE(AwaitCondition([&] { return executor.stats().threads <= 4; }));
  for (auto& s : sources) s->Stop();
  executor.Stop();
  runner.Stop();
}

}  // namespace
}  // namespace setpoint
