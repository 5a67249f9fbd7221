// Tests for setpoint/processor/source.h.
#include "setpoint/processor/source.h"

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::IsOk;
using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

using Map = absl::flat_hash_map<std::string, int>;
using IntStore = Store<std::string, int>;

// Logs the store's changes as "kind key old->new" and its transitions as
// "synced" / "lost", on the runner.
void Record(IntStore* store, std::vector<std::string>* log) {
  store->Subscribe([log](const Change<std::string, int>& c) {
    auto show = [](const int* v) {
      return v == nullptr ? std::string("_") : absl::StrCat(*v);
    };
    log->push_back(absl::StrCat(ChangeKindName(c.kind), " ", c.key, " ",
                                show(c.old_value), "->", show(c.new_value)));
  });
  store->AddSyncObserver(
      [log](bool in_sync) { log->push_back(in_sync ? "synced" : "lost"); });
}

bool StartsWithA(const std::string& key) { return key[0] == 'a'; }

// The list function: returns what the test scripted, fails, throws, or
// blocks until released (to hold a list in progress).
class FakeList {
 public:
  void Return(Map items) {
    MutexLock l(&mu_);
    items_ = std::move(items);
    error_ = absl::OkStatus();
    throws_ = 0;
  }
  void Fail(absl::Status error) {
    MutexLock l(&mu_);
    error_ = std::move(error);
  }
  // 1: a std::exception, 2: something else.
  void Throw(int kind) {
    MutexLock l(&mu_);
    throws_ = kind;
  }
  // The next list blocks until Release() and then returns `items`.
  void Block(Map items) {
    MutexLock l(&mu_);
    block_ = true;
    blocked_items_ = std::move(items);
  }
  void Release() {
    MutexLock l(&mu_);
    block_ = false;
    cv_.SignalAll();
  }
  bool blocked() {
    MutexLock l(&mu_);
    return blocked_;
  }

  absl::StatusOr<Map> List(const Context& ctx) {
    MutexLock l(&mu_);
    if (block_) {
      blocked_ = true;
      // Also wakes on Stop(), so a failed test does not hang.
      cv_.Wait(&mu_, ctx.stop_token(),
               [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !block_; });
      blocked_ = false;
      return blocked_items_;
    }
    if (throws_ == 1) throw std::runtime_error("cloud exploded");
    if (throws_ == 2) throw 7;
    if (!error_.ok()) return error_;
    return items_;
  }

 private:
  Mutex mu_;
  CondVar cv_;
  Map items_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  int throws_ ABSL_GUARDED_BY(mu_) = 0;
  bool block_ ABSL_GUARDED_BY(mu_) = false;
  bool blocked_ ABSL_GUARDED_BY(mu_) = false;
  Map blocked_items_ ABSL_GUARDED_BY(mu_);
};

constexpr absl::Duration kInterval = absl::Seconds(10);

// Lists every 10 s; after a failure backs off 1 s, 2 s, 4 s...; loses sync
// after two failures in a row.
PollingSourceOptions<int> TestOptions(Clock* clock) {
  return {.name = "test",
          .interval = kInterval,
          .lose_sync_after = 2,
          .backoff = {.initial = absl::Seconds(1),
                      .max = absl::Minutes(1),
                      .multiplier = 2.0,
                      .jitter = 0.0},
          .clock = clock,
          .logger = NullLogger()};
}

// The source lists on a simulated clock; the runner keeps the real one (it
// sets no timers here), so the source's thread is the clock's only waiter.
class PollingSourceTest : public ::testing::Test {
 protected:
  PollingSourceTest() { Record(&store_, &log_); }

  void SetUp() override { ASSERT_THAT(runner_.Start(), IsOk()); }

  PollingSourceOptions<int> Options() { return TestOptions(&clock_); }

  void StartSource(PollingSourceOptions<int> options) {
    source_ = std::make_unique<PollingSource<std::string, int>>(
        &runner_, &store_,
        [this](const Context& ctx) { return list_.List(ctx); },
        std::move(options));
    ASSERT_THAT(source_->Start(), IsOk());
  }

  // True once the source has returned from `lists` lists and waits on the
  // clock: everything it posted for them is then queued on the runner ahead
  // of anything the test posts.
  bool AwaitIdle(int64_t lists) {
    return AwaitCondition([&] {
      return source_->stats().lists == lists && clock_.num_waiters() == 1;
    });
  }
  // The time the waiting source lists next, from now.
  absl::Duration NextListIn() { return clock_.NextDeadline() - clock_.Now(); }

  // Returns the log (and clears it), read on the runner.
  std::vector<std::string> TakeLog() {
    auto log = runner_.PostAndWait(Context(),
                                   [this] { return std::exchange(log_, {}); });
    EXPECT_THAT(log, IsOk());
    return log.value_or(std::vector<std::string>{});
  }
  Map Items() {
    auto items =
        runner_.PostAndWait(Context(), [this] { return store_.items(); });
    EXPECT_THAT(items, IsOk());
    return items.value_or(Map{});
  }
  bool StoreInSync() {
    return runner_.PostAndWait(Context(), [this] { return store_.InSync(); })
        .value_or(false);
  }

  SimulatedClock clock_;
  FakeList list_;
  std::vector<std::string> log_;  // Runner only.
  IntStore store_{{.name = "observed", .logger = NullLogger()}};
  // Destroyed before the store: Stop() runs the events still queued.
  Runner runner_{{.name = "test", .logger = NullLogger()}};
  std::unique_ptr<PollingSource<std::string, int>> source_;
};

TEST_F(PollingSourceTest, InSyncAfterTheFirstListThenPostsOnlyChanges) {
  list_.Return({{"a", 1}, {"b", 2}});
  StartSource(Options());
  ASSERT_TRUE(AwaitIdle(1));
  EXPECT_EQ(NextListIn(), kInterval);
  std::vector<std::string> log = TakeLog();
  EXPECT_THAT(log, UnorderedElementsAre("set a _->1", "set b _->2", "synced"));
  EXPECT_EQ(log.back(), "synced");  // After the content it vouches for.
  EXPECT_EQ(source_->stats().changes_posted, 2);

  list_.Return({{"a", 1}, {"b", 3}, {"c", 4}});
  clock_.AdvanceTime(kInterval);
  ASSERT_TRUE(AwaitIdle(2));
  EXPECT_THAT(TakeLog(), UnorderedElementsAre("set b 2->3", "set c _->4"));
  EXPECT_EQ(source_->stats().changes_posted, 4);

  // b vanished from the list: deleted.
  list_.Return({{"a", 1}, {"c", 4}});
  clock_.AdvanceTime(kInterval);
  ASSERT_TRUE(AwaitIdle(3));
  EXPECT_THAT(TakeLog(), ElementsAre("delete b 3->_"));

  // Nothing changed: nothing reaches the store, not even an equal value.
  clock_.AdvanceTime(kInterval);
  ASSERT_TRUE(AwaitIdle(4));
  EXPECT_THAT(TakeLog(), IsEmpty());
  EXPECT_EQ(source_->stats().changes_posted, 5);
  EXPECT_EQ(runner_.PostAndWait(Context(), [this] { return store_.stats(); })
                .value_or(StoreStats{})
                .unchanged_sets,
            0);
  EXPECT_THAT(Items(), UnorderedElementsAre(Pair("a", 1), Pair("c", 4)));
  EXPECT_TRUE(StoreInSync());
}

TEST_F(PollingSourceTest, LosesSyncAfterFailedListsBacksOffAndResyncs) {
  list_.Return({{"a", 1}});
  StartSource(Options());  // lose_sync_after = 2, backoff 1 s doubling.
  ASSERT_TRUE(AwaitIdle(1));
  EXPECT_TRUE(StoreInSync());
  TakeLog();

  list_.Fail(absl::UnavailableError("cloud down"));
  clock_.AdvanceTime(kInterval);
  ASSERT_TRUE(AwaitIdle(2));
  EXPECT_EQ(NextListIn(), absl::Seconds(1));
  EXPECT_TRUE(StoreInSync());  // One failure is not enough.
  EXPECT_EQ(source_->stats().consecutive_failures, 1);

  clock_.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitIdle(3));
  EXPECT_EQ(NextListIn(), absl::Seconds(2));
  EXPECT_FALSE(StoreInSync());
  EXPECT_THAT(TakeLog(), ElementsAre("lost"));
  PollingSourceStats stats = source_->stats();
  EXPECT_EQ(stats.list_failures, 2);
  EXPECT_EQ(stats.consecutive_failures, 2);

  // A third failure does not announce the loss again.
  clock_.AdvanceTime(absl::Seconds(2));
  ASSERT_TRUE(AwaitIdle(4));
  EXPECT_EQ(NextListIn(), absl::Seconds(4));

  list_.Return({{"a", 2}});
  clock_.AdvanceTime(absl::Seconds(4));
  ASSERT_TRUE(AwaitIdle(5));
  EXPECT_EQ(NextListIn(), kInterval);
  EXPECT_THAT(TakeLog(), ElementsAre("set a 1->2", "synced"));
  EXPECT_EQ(source_->stats().consecutive_failures, 0);
  EXPECT_THAT(Items(), UnorderedElementsAre(Pair("a", 2)));
}

TEST_F(PollingSourceTest, AThrowingListIsAFailedList) {
  PollingSourceOptions<int> options = Options();
  options.lose_sync_after = 1;
  list_.Return({{"a", 1}});
  StartSource(std::move(options));
  ASSERT_TRUE(AwaitIdle(1));
  TakeLog();

  list_.Throw(1);
  clock_.AdvanceTime(kInterval);
  ASSERT_TRUE(AwaitIdle(2));
  EXPECT_THAT(TakeLog(), ElementsAre("lost"));
  list_.Throw(2);  // Not a std::exception.
  clock_.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitIdle(3));
  EXPECT_EQ(source_->stats().list_failures, 2);
  EXPECT_EQ(NextListIn(), absl::Seconds(2));

  list_.Return({{"a", 1}});
  clock_.AdvanceTime(absl::Seconds(2));
  ASSERT_TRUE(AwaitIdle(4));
  EXPECT_THAT(TakeLog(), ElementsAre("synced"));
}

TEST_F(PollingSourceTest, FailuresBeforeTheFirstGoodListKeepItOutOfSync) {
  list_.Fail(absl::UnavailableError("cloud down"));
  StartSource(Options());
  ASSERT_TRUE(AwaitIdle(1));
  clock_.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(AwaitIdle(2));
  EXPECT_FALSE(StoreInSync());
  EXPECT_THAT(TakeLog(), IsEmpty());  // Never synced, so never "lost".

  list_.Return({{"a", 1}});
  clock_.AdvanceTime(absl::Seconds(2));
  ASSERT_TRUE(AwaitIdle(3));
  EXPECT_THAT(TakeLog(), ElementsAre("set a _->1", "synced"));
}

TEST_F(PollingSourceTest, TriggerListsAtOnce) {
  list_.Return({{"a", 1}});
  StartSource(Options());
  ASSERT_TRUE(AwaitIdle(1));
  TakeLog();
  absl::Time before = clock_.Now();

  list_.Return({{"a", 2}});
  source_->Trigger();
  ASSERT_TRUE(AwaitIdle(2));
  EXPECT_EQ(clock_.Now(), before);
  EXPECT_THAT(TakeLog(), ElementsAre("set a 1->2"));
}

TEST_F(PollingSourceTest, SetFilterForgetsRelistsWithinItAndResyncs) {
  list_.Return({{"a1", 1}, {"a2", 2}, {"b1", 3}});
  StartSource(Options());
  ASSERT_TRUE(AwaitIdle(1));
  TakeLog();

  list_.Return({{"a1", 1}, {"a2", 2}, {"a3", 3}, {"b1", 3}});
  auto during = runner_.PostAndWait(Context(), [this] {
    source_->Rescope(StartsWithA);
    // Within the same event: forgotten (not deleted) and out of sync.
    return std::make_pair(std::exchange(log_, {}), store_.InSync());
  });
  ASSERT_THAT(during, IsOk());
  EXPECT_THAT(during->first, UnorderedElementsAre("lost", "forget b1 3->_"));
  EXPECT_FALSE(during->second);

  // The source lists again at once, within the filter.
  ASSERT_TRUE(AwaitIdle(2));
  EXPECT_THAT(TakeLog(), ElementsAre("set a3 _->3", "synced"));
  EXPECT_THAT(Items(), UnorderedElementsAre(Pair("a1", 1), Pair("a2", 2),
                                            Pair("a3", 3)));
  EXPECT_EQ(NextListIn(), kInterval);
}

TEST_F(PollingSourceTest, AListInProgressUnderTheOldFilterIsDropped) {
  list_.Return({{"a1", 1}, {"b1", 1}});
  StartSource(Options());
  ASSERT_TRUE(AwaitIdle(1));
  TakeLog();

  list_.Block({{"a1", 99}, {"b1", 1}});
  source_->Trigger();
  ASSERT_TRUE(AwaitCondition([&] { return list_.blocked(); }));
  ASSERT_THAT(
      runner_.PostAndWait(Context(), [this] { source_->Rescope(StartsWithA); }),
      IsOk());
  list_.Return({{"a1", 2}, {"b1", 1}});
  list_.Release();

  // The held list (a1=99) arrives under the old filter and is dropped; the
  // source lists again within the new one.
  ASSERT_TRUE(AwaitIdle(3));
  std::vector<std::string> log = TakeLog();
  EXPECT_THAT(log, Not(Contains(HasSubstr("99"))));
  EXPECT_THAT(log,
              ElementsAre("lost", "forget b1 1->_", "set a1 1->2", "synced"));
  // Dropped by the source itself: it never reached the store.
  EXPECT_EQ(runner_.PostAndWait(Context(), [this] { return store_.stats(); })
                .value_or(StoreStats{})
                .ignored,
            0);
  EXPECT_EQ(source_->stats().lists, 3);
  EXPECT_EQ(source_->status().relists, 1);
  EXPECT_TRUE(StoreInSync());
}

TEST_F(PollingSourceTest, StopCancelsAListBlockedOnItsContext) {
  std::atomic<bool> started{false};
  absl::Status seen;  // Written by the source's thread, read after the join.
  PollingSourceOptions<int> options = Options();
  options.list_timeout = absl::ZeroDuration();
  source_ = std::make_unique<PollingSource<std::string, int>>(
      &runner_, &store_,
      [&](const Context& ctx) -> absl::StatusOr<Map> {
        started = true;
        seen = ctx.Wait(absl::InfiniteDuration());
        return seen;
      },
      std::move(options));
  ASSERT_THAT(source_->Start(), IsOk());
  EXPECT_THAT(source_->Start(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_TRUE(AwaitCondition([&] { return started.load(); }));
  source_->Stop();
  EXPECT_THAT(seen, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(source_->stats().lists, 0);  // Stopped: the result is not used.
  source_->Stop();                       // Idempotent.
  EXPECT_FALSE(StoreInSync());
}

// PollingSource in manual mode ---------------------------------------------

// No threads: the test polls the source and runs the runner, both on the
// test thread, on one simulated clock.
class ManualPollingSourceTest : public ::testing::Test {
 protected:
  ManualPollingSourceTest() { Record(&store_, &log_); }

  void SetUp() override {
    PollingSourceOptions<int> options = TestOptions(&clock_);
    options.manual = true;
    source_ = std::make_unique<PollingSource<std::string, int>>(
        &runner_, &store_,
        [this](const Context& ctx) {
          list_thread_ = std::this_thread::get_id();
          return list_.List(ctx);
        },
        std::move(options));
    ASSERT_THAT(source_->Start(), IsOk());
  }

  // Polls if due, then runs what the source posted.
  bool Poll() {
    bool listed = source_->RunUntilIdle();
    runner_.RunUntilIdle();
    return listed;
  }
  std::vector<std::string> TakeLog() { return std::exchange(log_, {}); }

  SimulatedClock clock_;
  FakeList list_;
  std::thread::id list_thread_;
  std::vector<std::string> log_;
  IntStore store_{{.name = "observed", .logger = NullLogger()}};
  Runner runner_{{.name = "test", .clock = &clock_, .logger = NullLogger()}};
  std::unique_ptr<PollingSource<std::string, int>> source_;
};

TEST_F(ManualPollingSourceTest, TheFirstPollListsThenEveryInterval) {
  EXPECT_EQ(source_->NextWakeTime(), absl::InfinitePast());
  EXPECT_EQ(clock_.num_waiters(), 0);  // No thread.
  list_.Return({{"a", 1}, {"b", 2}});
  ASSERT_TRUE(Poll());
  EXPECT_EQ(list_thread_, std::this_thread::get_id());
  std::vector<std::string> log = TakeLog();
  EXPECT_THAT(log, UnorderedElementsAre("set a _->1", "set b _->2", "synced"));
  EXPECT_EQ(log.back(), "synced");
  EXPECT_THAT(store_.items(), UnorderedElementsAre(Pair("a", 1), Pair("b", 2)));
  EXPECT_TRUE(store_.InSync());
  const absl::Time first_ended = clock_.Now();
  EXPECT_EQ(source_->NextWakeTime(), first_ended + kInterval);

  // Not due until the interval has passed on the clock.
  list_.Return({{"a", 1}, {"b", 3}});
  EXPECT_FALSE(Poll());
  clock_.AdvanceTime(kInterval - absl::Milliseconds(1));
  EXPECT_FALSE(Poll());
  EXPECT_EQ(source_->NextWakeTime(), first_ended + kInterval);
  EXPECT_EQ(source_->stats().lists, 1);
  clock_.AdvanceTime(absl::Milliseconds(1));
  EXPECT_EQ(source_->NextWakeTime(), absl::InfinitePast());
  ASSERT_TRUE(Poll());
  EXPECT_THAT(TakeLog(), ElementsAre("set b 2->3"));
  EXPECT_EQ(source_->NextWakeTime(), clock_.Now() + kInterval);
  PollingSourceStats stats = source_->stats();
  EXPECT_EQ(stats.lists, 2);
  EXPECT_EQ(stats.changes_posted, 3);
}

TEST_F(ManualPollingSourceTest, FailuresBackOffAndLoseSync) {
  list_.Return({{"a", 1}});
  ASSERT_TRUE(Poll());
  TakeLog();

  // lose_sync_after = 2; backoff 1 s, 2 s, 4 s.
  list_.Fail(absl::UnavailableError("cloud down"));
  clock_.AdvanceTime(kInterval);
  ASSERT_TRUE(Poll());
  EXPECT_EQ(source_->NextWakeTime(), clock_.Now() + absl::Seconds(1));
  EXPECT_TRUE(store_.InSync());  // One failure is not enough.
  EXPECT_EQ(source_->stats().consecutive_failures, 1);

  clock_.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(Poll());
  EXPECT_FALSE(store_.InSync());
  EXPECT_THAT(TakeLog(), ElementsAre("lost"));
  EXPECT_EQ(source_->NextWakeTime(), clock_.Now() + absl::Seconds(2));

  clock_.AdvanceTime(absl::Seconds(1));
  EXPECT_FALSE(Poll());
  clock_.AdvanceTime(absl::Seconds(1));
  ASSERT_TRUE(Poll());
  EXPECT_THAT(TakeLog(), IsEmpty());  // The loss is announced once.
  EXPECT_EQ(source_->NextWakeTime(), clock_.Now() + absl::Seconds(4));
  PollingSourceStats stats = source_->stats();
  EXPECT_EQ(stats.list_failures, 3);
  EXPECT_EQ(stats.consecutive_failures, 3);

  list_.Return({{"a", 2}});
  clock_.AdvanceTime(absl::Seconds(4));
  ASSERT_TRUE(Poll());
  EXPECT_THAT(TakeLog(), ElementsAre("set a 1->2", "synced"));
  EXPECT_TRUE(store_.InSync());
  EXPECT_EQ(source_->stats().consecutive_failures, 0);
  EXPECT_EQ(source_->NextWakeTime(), clock_.Now() + kInterval);
}

TEST_F(ManualPollingSourceTest, TriggerAndSetFilterMakeItDueAtOnce) {
  list_.Return({{"a1", 1}, {"b1", 2}});
  ASSERT_TRUE(Poll());
  TakeLog();
  const absl::Time now = clock_.Now();

  list_.Return({{"a1", 5}, {"b1", 2}});
  source_->Trigger();
  EXPECT_EQ(source_->NextWakeTime(), absl::InfinitePast());
  ASSERT_TRUE(Poll());
  EXPECT_THAT(TakeLog(), ElementsAre("set a1 1->5"));
  EXPECT_FALSE(Poll());

  list_.Return({{"a1", 5}, {"a2", 3}, {"b1", 2}});
  ASSERT_THAT(runner_.PostAndWait(Context::Background(&clock_),
                                  [this] { source_->Rescope(StartsWithA); }),
              IsOk());
  EXPECT_THAT(TakeLog(), UnorderedElementsAre("lost", "forget b1 2->_"));
  EXPECT_EQ(source_->NextWakeTime(), absl::InfinitePast());
  ASSERT_TRUE(Poll());
  EXPECT_THAT(TakeLog(), ElementsAre("set a2 _->3", "synced"));
  EXPECT_THAT(store_.items(),
              UnorderedElementsAre(Pair("a1", 5), Pair("a2", 3)));
  EXPECT_EQ(clock_.Now(), now);
  EXPECT_EQ(source_->NextWakeTime(), now + kInterval);
}

TEST_F(ManualPollingSourceTest, PollsOnlyInManualModeBetweenStartAndStop) {
  PollingSource<std::string, int> threaded(
      &runner_, &store_, [this](const Context& ctx) { return list_.List(ctx); },
      TestOptions(&clock_));
  EXPECT_FALSE(threaded.RunUntilIdle());  // Not manual.

  PollingSourceOptions<int> options = TestOptions(&clock_);
  options.manual = true;
  PollingSource<std::string, int> manual(
      &runner_, &store_, [this](const Context& ctx) { return list_.List(ctx); },
      std::move(options));
  EXPECT_FALSE(manual.RunUntilIdle());  // Not started.
  ASSERT_THAT(manual.Start(), IsOk());
  EXPECT_THAT(manual.Start(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(manual.RunUntilIdle());
  manual.Stop();
  manual.Trigger();
  EXPECT_FALSE(manual.RunUntilIdle());  // Stopped.
  EXPECT_EQ(manual.stats().lists, 1);
}

// PushSource -------------------------------------------------------------

class PushSourceTest : public ::testing::Test {
 protected:
  PushSourceTest() { Record(&store_, &log_); }
  void SetUp() override { ASSERT_THAT(runner_.Start(), IsOk()); }

  std::vector<std::string> TakeLog() {
    auto log = runner_.PostAndWait(Context(),
                                   [this] { return std::exchange(log_, {}); });
    EXPECT_THAT(log, IsOk());
    return log.value_or(std::vector<std::string>{});
  }

  std::vector<std::string> log_;  // Runner only.
  IntStore store_{{.name = "observed", .logger = NullLogger()}};
  Runner runner_{{.name = "test", .logger = NullLogger()}};
};

TEST_F(PushSourceTest, UpdatesFromAnotherThreadLandInOrder) {
  PushSource<std::string, int> source(&runner_, &store_,
                                      {.logger = NullLogger()});
  std::thread watcher([&] {
    source.Set("a", 1);
    source.Set("b", 2);
    source.Set("c", 9);
    source.Delete("a");
    source.Replace({{"b", 3}});  // Complete content, then in sync.
    source.Set("d", 5);
    source.MarkLostSync();
    source.MarkSynced();
  });
  watcher.join();
  EXPECT_THAT(TakeLog(),
              ElementsAre("set a _->1", "set b _->2", "set c _->9",
                          "delete a 1->_", "delete c 9->_", "set b 2->3",
                          "synced", "set d _->5", "lost", "synced"));
  EXPECT_EQ(source.updates_refused(), 0);
}

TEST_F(PushSourceTest, ReplaceCanLeaveTheStoreOutOfSync) {
  PushSource<std::string, int> source(&runner_, &store_,
                                      {.logger = NullLogger()});
  source.Replace({{"a", 1}}, /*synced=*/false);
  EXPECT_THAT(TakeLog(), ElementsAre("set a _->1"));
}

TEST_F(PushSourceTest, OnFilterChangeIsCalledAfterSetFilter) {
  struct Seen {
    bool selects_a1;
    bool selects_b1;
    bool store_in_sync;
    size_t store_size;
  };
  std::vector<Seen> seen;  // Runner only.
  PushSource<std::string, int>* self = nullptr;
  PushSource<std::string, int> source(
      &runner_, &store_,
      {.on_filter_change =
           [&](const KeyFilter<std::string>& filter) {
             // The store was re-scoped before the call.
             seen.push_back(
                 {filter("a1"), filter("b1"), store_.InSync(), store_.size()});
             // What a user does: list again and replace.
             self->Replace({{"a1", 1}, {"a2", 2}, {"b2", 5}});
           },
       .logger = NullLogger()});
  self = &source;
  source.Replace({{"a1", 1}, {"b1", 2}});
  TakeLog();

  ASSERT_THAT(
      runner_.PostAndWait(Context(), [&] { source.Rescope(StartsWithA); }),
      IsOk());
  auto after = runner_.PostAndWait(Context(), [&] {
    return std::make_pair(seen.size() == 1 ? seen[0] : Seen{}, store_.InSync());
  });
  ASSERT_THAT(after, IsOk());
  EXPECT_TRUE(after->first.selects_a1);
  EXPECT_FALSE(after->first.selects_b1);
  EXPECT_FALSE(after->first.store_in_sync);
  EXPECT_EQ(after->first.store_size, 1u);
  EXPECT_TRUE(after->second);
  std::vector<std::string> log = TakeLog();
  EXPECT_THAT(log, Contains("forget b1 2->_"));
  EXPECT_THAT(log, Contains("set a2 _->2"));
  EXPECT_THAT(log, Not(Contains(HasSubstr("b2"))));
  EXPECT_EQ(log.back(), "synced");
}

TEST_F(PushSourceTest, PostsAfterTheRunnerStoppedAreRefused) {
  PushSource<std::string, int> source(&runner_, &store_,
                                      {.logger = NullLogger()});
  source.Set("a", 1);
  runner_.Stop();  // Runs the set posted before.
  EXPECT_EQ(store_.size(), 1u);
  source.Set("b", 2);
  source.Delete("a");
  source.MarkSynced();
  EXPECT_EQ(source.updates_refused(), 3);
  EXPECT_EQ(store_.size(), 1u);
  EXPECT_FALSE(store_.InSync());
}

TEST(PollingSourceOptionsTest, StartRefusesBadOptionsNamingTheField) {
  SimulatedClock clock;
  Runner runner({.clock = &clock, .logger = NullLogger()});
  IntStore store;
  struct Case {
    const char* field;
    PollingSourceOptions<int> options;
  };
  std::vector<Case> cases;
  cases.push_back({"interval", TestOptions(&clock)});
  cases.back().options.interval = absl::ZeroDuration();
  cases.push_back({"list_timeout", TestOptions(&clock)});
  cases.back().options.list_timeout = -absl::Seconds(1);
  cases.push_back({"lose_sync_after", TestOptions(&clock)});
  cases.back().options.lose_sync_after = 0;
  cases.push_back({"backoff", TestOptions(&clock)});
  cases.back().options.backoff.jitter = 2;
  for (Case& c : cases) {
    PollingSource<std::string, int> source(
        &runner, &store, [](const Context&) { return Map{}; },
        std::move(c.options));
    EXPECT_THAT(source.Start(), StatusIs(absl::StatusCode::kInvalidArgument,
                                         HasSubstr(c.field)))
        << c.field;
    EXPECT_FALSE(source.RunUntilIdle()) << "a refused source never lists";
  }
}

TEST(PollingSourceOptionsTest, DefaultsToTheRunnersClock) {
  SimulatedClock clock;
  Runner runner({.clock = &clock, .logger = NullLogger()});
  IntStore store;
  PollingSourceOptions<int> options = TestOptions(nullptr);
  options.manual = true;
  int lists = 0;
  PollingSource<std::string, int> source(
      &runner, &store,
      [&](const Context&) {
        ++lists;
        return Map{};
      },
      options);
  ASSERT_THAT(source.Start(), IsOk());
  EXPECT_TRUE(source.RunUntilIdle());
  EXPECT_FALSE(source.RunUntilIdle());  // Not due before the interval.
  clock.AdvanceTime(kInterval);         // Only the runner's clock moves.
  EXPECT_TRUE(source.RunUntilIdle());
  EXPECT_EQ(lists, 2);
}

#ifndef NDEBUG
TEST(StoreDeathTest, RunnerOnlyCallsAbortOffTheRunnerInDebugBuilds) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto set_off_runner = [] {
    Runner runner({.logger = NullLogger()});
    IntStore store;
    PushSource<std::string, int> source(&runner, &store);
    (void)runner.Start();
    (void)AwaitCondition([&] { return !runner.OnRunner(); });
    store.Set("a", 1);
  };
  EXPECT_DEATH(set_off_runner(), "runner-only call off runner");
}
#endif

}  // namespace
}  // namespace setpoint
