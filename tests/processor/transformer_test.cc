// Tests for setpoint/processor/transformer.h.
#include "setpoint/processor/transformer.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"

namespace setpoint {
namespace {

using ::setpoint::testing::NullLogger;
using ::setpoint::testing::SimulatedClock;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

using Map = absl::flat_hash_map<std::string, int>;
using IntStore = Store<std::string, int>;
using IntTransformer = Transformer<std::string, int>;
using Diff = DesiredDiff<std::string, int>;

// Stands in for a Syncer: keeps the desired set it is given, logs each call
// and its own transitions, and is in sync only while its producer is.
class RecordingSink : public Synchronizable,
                      public DesiredSink<std::string, int> {
 public:
  RecordingSink() : Synchronizable("sink") {}

  void ReplaceDesired(Map all) override {
    ++replaces;
    desired = std::move(all);
    log.push_back("replace");
  }
  void SetDesired(std::string key, int value) override {
    log.push_back(absl::StrCat("set ", key, " ", value));
    desired[key] = value;
  }
  void DeleteDesired(const std::string& key) override {
    log.push_back("delete " + key);
    desired.erase(key);
  }
  void DependOnDesired(Synchronizable* producer) override {
    DependOn(producer);
    SetSelfSynced(true);
  }

  Map desired;
  int replaces = 0;
  std::vector<std::string> log;

 protected:
  void OnSynced() override { log.push_back("synced"); }
  void OnLostSync() override { log.push_back("lost"); }
};

// A manual-mode runner on a simulated clock: timers run only when the test
// moves time and calls Run().
class TransformerTest : public ::testing::Test {
 protected:
  TransformerOptions Options() { return {.name = "t", .logger = NullLogger()}; }
  // The snapshot under test: both stores merged; counts its runs.
  IntTransformer::SnapshotFn Snapshot() {
    return [this] {
      ++runs_;
      Map out = a_.items();
      for (const auto& [k, v] : b_.items()) out[k] = v;
      return out;
    };
  }
  void Run() { runner_.RunUntilIdle(); }
  void Advance(absl::Duration d) {
    clock_.AdvanceTime(d);
    runner_.RunUntilIdle();
  }

  SimulatedClock clock_;
  Runner runner_{{.name = "test", .clock = &clock_, .logger = NullLogger()}};
  IntStore a_{{.name = "a", .logger = NullLogger()}};
  IntStore b_{{.name = "b", .logger = NullLogger()}};
  RecordingSink sink_;
  int runs_ = 0;
};

TEST_F(TransformerTest, SnapshotRunsOnceEveryWatchedStoreIsInSync) {
  IntTransformer t(&runner_, &sink_, Snapshot(), Options());
  t.Watch(&a_);
  t.Watch(&b_);
  a_.Set("x", 1);
  a_.MarkSynced();
  Run();
  EXPECT_EQ(runs_, 0);
  EXPECT_FALSE(t.InSync());

  // The change above must not delay the first snapshot by a window.
  b_.MarkSynced();
  EXPECT_FALSE(t.InSync());
  Run();
  EXPECT_EQ(runs_, 1);
  EXPECT_TRUE(t.InSync());
  EXPECT_THAT(sink_.desired, UnorderedElementsAre(Pair("x", 1)));
  // The sink is complete only once the snapshot has reached it.
  EXPECT_THAT(sink_.log, ElementsAre("replace", "synced"));
  EXPECT_EQ(t.stats().snapshots, 1);

  Advance(absl::Seconds(10));
  EXPECT_EQ(runs_, 1);  // Nothing changed since.
}

TEST_F(TransformerTest, WatchingStoresAlreadyInSyncSnapshotsAtOnce) {
  a_.Set("x", 1);
  a_.MarkSynced();
  IntTransformer t(&runner_, &sink_, Snapshot(), Options());
  EXPECT_FALSE(t.InSync());  // It has a snapshot to deliver first.
  t.Watch(&a_);
  Run();
  EXPECT_EQ(runs_, 1);
  EXPECT_TRUE(t.InSync());
  EXPECT_TRUE(sink_.InSync());
}

TEST_F(TransformerTest, ABurstOfChangesRunsOneSnapshotAWindowAfterTheFirst) {
  IntTransformer t(&runner_, &sink_, Snapshot(), Options());  // 100 ms.
  t.Watch(&a_);
  t.Watch(&b_);
  a_.MarkSynced();
  b_.MarkSynced();
  Run();
  ASSERT_EQ(runs_, 1);

  a_.Set("x", 1);
  Advance(absl::Milliseconds(40));
  a_.Set("y", 2);
  Advance(absl::Milliseconds(40));
  b_.Set("z", 3);
  Advance(absl::Milliseconds(19));
  EXPECT_EQ(runs_, 1);
  Advance(absl::Milliseconds(1));
  EXPECT_EQ(runs_, 2);
  EXPECT_THAT(sink_.desired,
              UnorderedElementsAre(Pair("x", 1), Pair("y", 2), Pair("z", 3)));
  Advance(absl::Seconds(1));
  EXPECT_EQ(runs_, 2);

  // The next change opens a new window.
  a_.Delete("x");
  Advance(absl::Milliseconds(99));
  EXPECT_EQ(runs_, 2);
  Advance(absl::Milliseconds(1));
  EXPECT_EQ(runs_, 3);
  EXPECT_THAT(sink_.desired, UnorderedElementsAre(Pair("y", 2), Pair("z", 3)));
  EXPECT_EQ(sink_.replaces, 3);
}

TEST_F(TransformerTest, LosingAnInputLosesSyncAndResnapshotsWhenItReturns) {
  IntTransformer t(&runner_, &sink_, Snapshot(), Options());
  t.Watch(&a_);
  t.Watch(&b_);
  a_.MarkSynced();
  b_.MarkSynced();
  Run();
  ASSERT_TRUE(t.InSync());
  sink_.log.clear();

  a_.MarkLostSync();
  // At once, within the call, down to the sink.
  EXPECT_FALSE(t.InSync());
  EXPECT_FALSE(t.SelfSynced());
  EXPECT_THAT(sink_.log, ElementsAre("lost"));
  a_.Set("x", 5);  // A change while out of sync.
  Advance(absl::Seconds(1));
  EXPECT_EQ(runs_, 1);  // No snapshot from an incomplete view.

  a_.MarkSynced();
  EXPECT_FALSE(t.InSync());  // Not before a fresh snapshot.
  Run();                     // Without waiting for a window.
  EXPECT_EQ(runs_, 2);
  EXPECT_TRUE(t.InSync());
  EXPECT_THAT(sink_.desired, UnorderedElementsAre(Pair("x", 5)));
  EXPECT_THAT(sink_.log, ElementsAre("lost", "replace", "synced"));
}

TEST_F(TransformerTest, AnInputReturningCutsAPendingWindowShort) {
  IntTransformer t(&runner_, &sink_, Snapshot(), Options());
  t.Watch(&a_);
  a_.MarkSynced();
  Run();
  a_.Set("x", 1);  // A snapshot is due in 100 ms.
  a_.MarkLostSync();
  a_.MarkSynced();
  Run();
  EXPECT_EQ(runs_, 2);
  EXPECT_TRUE(t.InSync());
  Advance(absl::Seconds(1));
  EXPECT_EQ(runs_, 2);  // The window's run was replaced, not added.
}

TEST_F(TransformerTest, HooksDeliverEachChangeAtOnceWithoutASnapshot) {
  IntTransformer t(&runner_, &sink_, nullptr, Options());
  t.Watch(&a_, [](const Change<std::string, int>& c) {
    Diff diff;
    if (c.kind == ChangeKind::kSet)
      diff.set.emplace_back(c.key, *c.new_value * 10);
    if (c.kind == ChangeKind::kDelete) diff.remove.push_back(c.key);
    return diff;  // A forget is not a delete: nothing to do.
  });
  EXPECT_FALSE(t.InSync());  // Its input is not in sync yet.
  sink_.log.clear();
  a_.Set("x", 1);
  a_.Set("y", 2);
  EXPECT_THAT(sink_.log, ElementsAre("set x 10", "set y 20"));
  a_.MarkSynced();
  EXPECT_TRUE(t.InSync());  // No snapshot to wait for.
  EXPECT_TRUE(sink_.InSync());
  a_.Delete("x");
  a_.Rescope([](const std::string& k) { return k != "y"; });
  EXPECT_THAT(sink_.log, ElementsAre("set x 10", "set y 20", "synced",
                                     "delete x", "lost"));
  Advance(absl::Seconds(1));
  EXPECT_EQ(sink_.replaces, 0);
  EXPECT_THAT(sink_.desired, UnorderedElementsAre(Pair("y", 20)));
  EXPECT_EQ(t.stats().hook_diffs, 4);
  EXPECT_EQ(t.stats().snapshots, 0);
}

TEST_F(TransformerTest, AThrowingSnapshotIsRetriedWithBackoffOutOfSync) {
  IntTransformer t(
      &runner_, &sink_,
      [this]() -> Map {
        ++runs_;
        if (runs_ == 1) throw std::runtime_error("bad spec");
        if (runs_ == 2) throw 3;  // Not a std::exception.
        return {{"ok", 1}};
      },
      Options());
  t.Watch(&a_);
  a_.MarkSynced();
  Run();
  EXPECT_EQ(runs_, 1);
  EXPECT_EQ(t.stats().snapshot_failures, 1);
  EXPECT_FALSE(t.InSync());
  EXPECT_FALSE(sink_.InSync());

  // Retries back off from the window: 100 ms, then 200 ms.
  Advance(absl::Milliseconds(99));
  EXPECT_EQ(runs_, 1);
  Advance(absl::Milliseconds(1));
  EXPECT_EQ(runs_, 2);
  EXPECT_EQ(t.stats().snapshot_failures, 2);
  EXPECT_FALSE(t.InSync());
  Advance(absl::Milliseconds(199));
  EXPECT_EQ(runs_, 2);
  Advance(absl::Milliseconds(1));
  EXPECT_EQ(runs_, 3);
  EXPECT_TRUE(t.InSync());
  EXPECT_EQ(t.stats().snapshots, 1);
  EXPECT_EQ(sink_.replaces, 1);
  EXPECT_THAT(sink_.desired, UnorderedElementsAre(Pair("ok", 1)));
}

TEST_F(TransformerTest, AThrowingHookIsCountedAndSchedulesASnapshot) {
  IntTransformer t(&runner_, &sink_, Snapshot(), Options());
  t.Watch(&a_);
  t.Watch(&b_, [](const Change<std::string, int>& c) {
    if (c.key == "bad") throw std::runtime_error("cannot map");
    Diff diff;
    if (c.new_value != nullptr) diff.set.emplace_back(c.key, *c.new_value);
    return diff;
  });
  a_.MarkSynced();
  b_.MarkSynced();
  Run();
  ASSERT_EQ(runs_, 1);
  sink_.log.clear();

  b_.Set("bad", 1);
  EXPECT_EQ(t.stats().hook_failures, 1);
  Advance(absl::Milliseconds(99));
  EXPECT_EQ(runs_, 1);
  Advance(absl::Milliseconds(1));
  EXPECT_EQ(runs_, 2);  // The snapshot covers the skipped change.

  b_.Set("good", 2);
  EXPECT_EQ(t.stats().hook_diffs, 1);
  EXPECT_THAT(sink_.log, ElementsAre("replace", "set good 2"));
}

TEST_F(TransformerTest, AThrowingHookWithoutASnapshotIsOnlyCounted) {
  IntTransformer t(&runner_, &sink_, nullptr, Options());
  t.Watch(&a_, [](const Change<std::string, int>&) -> Diff { throw 1; });
  a_.MarkSynced();
  a_.Set("x", 1);
  Advance(absl::Seconds(1));
  EXPECT_EQ(t.stats().hook_failures, 1);
  EXPECT_EQ(t.stats().hook_diffs, 0);
  EXPECT_THAT(sink_.desired, IsEmpty());
  EXPECT_TRUE(t.InSync());
}

TEST_F(TransformerTest, InvalidateRunsTheSnapshotAfterTheWindow) {
  IntTransformer t(&runner_, &sink_, Snapshot(),
                   {.name = "t",
                    .accumulation_window = absl::Seconds(2),
                    .logger = NullLogger()});
  t.Watch(&a_);
  a_.MarkSynced();
  Run();
  t.Invalidate();
  t.Invalidate();
  Advance(absl::Milliseconds(1999));
  EXPECT_EQ(runs_, 1);
  Advance(absl::Milliseconds(1));
  EXPECT_EQ(runs_, 2);
}

TEST_F(TransformerTest, ADestroyedTransformerNoLongerHearsItsStores) {
  int hook_calls = 0;
  auto t =
      std::make_unique<IntTransformer>(&runner_, &sink_, Snapshot(), Options());
  t->Watch(&a_);
  t->Watch(&b_, [&](const Change<std::string, int>&) {
    ++hook_calls;
    return Diff{};
  });
  a_.MarkSynced();
  b_.MarkSynced();
  Run();
  ASSERT_EQ(runs_, 1);
  a_.Set("x", 1);  // A snapshot is pending.
  t.reset();

  a_.Set("y", 2);
  b_.Set("z", 3);
  a_.MarkLostSync();
  a_.MarkSynced();
  Advance(absl::Seconds(1));
  EXPECT_EQ(runs_, 1);
  EXPECT_EQ(hook_calls, 0);
  EXPECT_THAT(sink_.log, ElementsAre("replace", "synced"));
}

TEST(TransformerOptionsTest, ValidateNamesTheField) {
  EXPECT_TRUE(ValidateTransformerOptions({}).ok());
  absl::Status s = ValidateTransformerOptions(
      {.name = "web", .accumulation_window = -absl::Seconds(1)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              ::testing::AllOf(::testing::HasSubstr("web"),
                               ::testing::HasSubstr("accumulation_window")));
}

TEST(TransformerDeathTest, ConstructorAbortsOnOptionsNobodyValidated) {
  const auto build = [] {
    SimulatedClock clock;
    Runner runner({.clock = &clock, .logger = NullLogger()});
    RecordingSink sink;
    TransformerOptions bad{.accumulation_window = -absl::Seconds(1),
                           .logger = NullLogger()};
    Transformer<std::string, int> t(
        &runner, &sink, [] { return Map{}; }, std::move(bad));
  };
  EXPECT_DEATH(build(), "accumulation_window");
}

}  // namespace
}  // namespace setpoint
