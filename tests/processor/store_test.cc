// Tests for setpoint/processor/store.h.
#include "setpoint/processor/store.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/null_logger.h"
#include "spdlog/logger.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/ringbuffer_sink.h"

namespace setpoint {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

using IntStore = Store<std::string, int>;
using Update = StoreUpdate<std::string, int>;

// Renders each change as "kind key old->new" ("_" for a missing value).
template <class V>
void Record(Store<std::string, V>* store, std::vector<std::string>* log) {
  store->Subscribe([log](const Change<std::string, V>& c) {
    auto show = [](const V* v) {
      return v == nullptr ? std::string("_") : absl::StrCat(*v);
    };
    log->push_back(absl::StrCat(ChangeKindName(c.kind), " ", c.key, " ",
                                show(c.old_value), "->", show(c.new_value)));
  });
}

StoreOptions<int> Options() {
  return {.name = "test", .logger = ::setpoint::testing::NullLogger()};
}

TEST(Store, SetNotifiesOnlyOnARealChange) {
  IntStore store(Options());
  std::vector<std::string> log;
  Record(&store, &log);
  EXPECT_TRUE(store.Set("a", 1));
  EXPECT_FALSE(store.Set("a", 1));
  EXPECT_TRUE(store.Set("a", 2));
  EXPECT_THAT(log, ElementsAre("set a _->1", "set a 1->2"));
  ASSERT_NE(store.Find("a"), nullptr);
  EXPECT_EQ(*store.Find("a"), 2);
  EXPECT_EQ(store.Find("b"), nullptr);
  EXPECT_EQ(store.stats().sets, 2);
  EXPECT_EQ(store.stats().unchanged_sets, 1);
}

TEST(Store, CustomEqualDecidesWhatIsAChange) {
  // Only the tens count: 11 and 19 are the same value.
  Store<std::string, int> store(
      {.name = "tens",
       .equal = [](const int& a, const int& b) { return a / 10 == b / 10; },
       .logger = ::setpoint::testing::NullLogger()});
  std::vector<std::string> log;
  Record(&store, &log);
  EXPECT_TRUE(store.Set("a", 11));
  EXPECT_FALSE(store.Set("a", 19));
  EXPECT_TRUE(store.Set("a", 21));
  EXPECT_THAT(log, ElementsAre("set a _->11", "set a 11->21"));
  EXPECT_EQ(store.stats().unchanged_sets, 1);
}

TEST(Store, ListenersRunInSubscriptionOrder) {
  IntStore store(Options());
  std::vector<int> order;
  store.Subscribe([&](const Change<std::string, int>&) { order.push_back(1); });
  store.Subscribe([&](const Change<std::string, int>&) { order.push_back(2); });
  store.Set("a", 1);
  EXPECT_THAT(order, ElementsAre(1, 2));
}

TEST(Store, DeleteNotifiesWithTheOldValue) {
  IntStore store(Options());
  std::vector<std::string> log;
  Record(&store, &log);
  store.Set("a", 7);
  EXPECT_TRUE(store.Delete("a"));
  EXPECT_FALSE(store.Delete("a"));
  EXPECT_FALSE(store.Delete("never"));
  EXPECT_THAT(log, ElementsAre("set a _->7", "delete a 7->_"));
  EXPECT_EQ(store.size(), 0u);
  EXPECT_EQ(store.stats().deletes, 1);
}

TEST(Store, ApplyWithReplaceDeletesKeysTheListLacks) {
  IntStore store(Options());
  store.Set("a", 1);
  store.Set("b", 2);
  store.Set("c", 3);
  std::vector<std::string> log;
  Record(&store, &log);
  store.Apply({.replace = true,
               .sets = {{"b", 2}, {"c", 30}, {"d", 4}},
               .sync = Update::Sync::kSynced});
  // Deletes come first; b did not change.
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0], "delete a 1->_");
  EXPECT_THAT(std::vector<std::string>(log.begin() + 1, log.end()),
              UnorderedElementsAre("set c 3->30", "set d _->4"));
  EXPECT_THAT(store.items(),
              UnorderedElementsAre(Pair("b", 2), Pair("c", 30), Pair("d", 4)));
  EXPECT_TRUE(store.InSync());
}

TEST(Store, ApplyWithoutReplaceTouchesOnlyWhatItNames) {
  IntStore store(Options());
  store.Set("a", 1);
  store.Set("b", 2);
  store.MarkSynced();
  std::vector<std::string> log;
  Record(&store, &log);
  store.Apply({.sets = {{"c", 3}}, .deletes = {"a", "missing"}});
  EXPECT_THAT(log, ElementsAre("set c _->3", "delete a 1->_"));
  EXPECT_THAT(store.items(), UnorderedElementsAre(Pair("b", 2), Pair("c", 3)));
  EXPECT_TRUE(store.InSync());  // kUnchanged.
  store.Apply({.sync = Update::Sync::kLostSync});
  EXPECT_FALSE(store.InSync());
}

TEST(Store, UpdatesFromAnOldGenerationAreDropped) {
  IntStore store(Options());
  EXPECT_EQ(store.generation(), 0u);
  EXPECT_EQ(store.Rescope(nullptr), 1u);
  std::vector<std::string> log;
  Record(&store, &log);
  store.Apply({.generation = 0,
               .replace = true,
               .sets = {{"a", 1}},
               .sync = Update::Sync::kSynced});
  EXPECT_THAT(log, IsEmpty());
  EXPECT_EQ(store.size(), 0u);
  EXPECT_FALSE(store.InSync());
  EXPECT_EQ(store.stats().ignored, 1);

  store.Apply({.generation = 1,
               .replace = true,
               .sets = {{"a", 1}},
               .sync = Update::Sync::kSynced});
  EXPECT_THAT(log, ElementsAre("set a _->1"));
  EXPECT_TRUE(store.InSync());
}

TEST(Store, SetFilterForgetsKeysOutsideLosesSyncAndIgnoresThem) {
  IntStore store(Options());
  store.Set("a1", 1);
  store.Set("a2", 2);
  store.Set("b1", 3);
  store.MarkSynced();
  std::vector<bool> sync;
  store.AddSyncObserver([&](bool in_sync) { sync.push_back(in_sync); });
  std::vector<std::string> log;
  Record(&store, &log);

  uint64_t generation =
      store.Rescope([](const std::string& k) { return k[0] == 'a'; });
  EXPECT_EQ(generation, store.generation());
  // Forgotten, not deleted: b1 still exists in the world.
  EXPECT_THAT(log, ElementsAre("forget b1 3->_"));
  EXPECT_THAT(store.items(),
              UnorderedElementsAre(Pair("a1", 1), Pair("a2", 2)));
  EXPECT_FALSE(store.InSync());
  EXPECT_THAT(sync, ElementsAre(false));
  EXPECT_EQ(store.stats().forgets, 1);
  EXPECT_EQ(store.stats().deletes, 0);
  EXPECT_TRUE(store.Selected("a9"));
  EXPECT_FALSE(store.Selected("b9"));

  log.clear();
  EXPECT_FALSE(store.Set("b2", 4));
  store.Apply({.generation = generation,
               .replace = true,
               .sets = {{"a1", 1}, {"b1", 3}},
               .sync = Update::Sync::kSynced});
  EXPECT_THAT(log, ElementsAre("delete a2 2->_"));
  EXPECT_THAT(store.items(), UnorderedElementsAre(Pair("a1", 1)));
  EXPECT_EQ(store.stats().ignored, 2);  // b2 and b1.
  EXPECT_TRUE(store.InSync());

  // An empty filter selects everything again; nothing is forgotten.
  log.clear();
  store.Rescope(nullptr);
  EXPECT_THAT(log, IsEmpty());
  EXPECT_TRUE(store.Set("b2", 4));
}

TEST(Store, StatsCountEveryKindOfOutcome) {
  IntStore store(Options());
  store.Set("a", 1);                                             // sets 1
  store.Set("a", 1);                                             // unchanged 1
  store.Set("b", 2);                                             // sets 2
  store.Set("b", 3);                                             // sets 3
  store.Delete("a");                                             // deletes 1
  store.Rescope([](const std::string& k) { return k != "b"; });  // forget
  store.Set("b", 4);                                             // ignored 1
  store.Apply({.generation = 0, .sets = {{"c", 1}}});            // ignored 2
  const StoreStats& s = store.stats();
  EXPECT_EQ(s.sets, 3);
  EXPECT_EQ(s.unchanged_sets, 1);
  EXPECT_EQ(s.deletes, 1);
  EXPECT_EQ(s.forgets, 1);
  EXPECT_EQ(s.ignored, 2);
}

// Store's debug lines are in a template, compiled here with spdlog's default
// SPDLOG_ACTIVE_LEVEL (info): they must still reach a logger at debug level,
// with their source location, and be filtered out at info.
TEST(Store, DebugLinesFromTheHeaderFollowTheLoggersLevel) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  sink->set_formatter(std::make_unique<spdlog::pattern_formatter>(
      "%l %s %v", spdlog::pattern_time_type::local, /*eol=*/""));
  auto logger = std::make_shared<spdlog::logger>("store", sink);
  IntStore store({.name = "logged", .logger = logger});

  logger->set_level(spdlog::level::info);
  store.Rescope(nullptr);
  EXPECT_THAT(sink->last_formatted(), IsEmpty());

  logger->set_level(spdlog::level::debug);
  store.Rescope(nullptr);
  store.Apply({.generation = 0});
  EXPECT_THAT(
      sink->last_formatted(),
      ElementsAre(
          "debug store.h store filter changed store=logged forgot=0 kept=0",
          "debug store.h store update from an old filter dropped "
          "store=logged generation=0 current=2"));
}

}  // namespace
}  // namespace setpoint
