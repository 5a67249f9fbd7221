// PollCache on its own (no Redis): how it merges the poll script's answers
// into views, and when it refuses to.
#include "registry/redis/poll_cache.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace setpoint::redis {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const PollRequest kRequest{.kinds = {{"vm", {"a/vm/0"}}}};

// A full answer for "vm" at `seq`: members and records as given.
DecodedPoll Full(uint64_t seq, std::vector<std::string> members,
                 std::map<std::string, Assignment> held,
                 const std::string& epoch = "e1") {
  DecodedPoll d;
  d.result.epoch = epoch;
  d.result.kinds["vm"] = KindView{std::move(members), std::move(held)};
  d.answers["vm"] = KindAnswer{.changes_only = false, .seq = seq};
  return d;
}

// Changes only, up to `seq`, with the caller's own records.
DecodedPoll Changes(uint64_t seq, std::vector<LoggedChange> changes,
                    std::map<std::string, Assignment> own = {}) {
  DecodedPoll d;
  d.result.epoch = "e1";
  d.result.kinds["vm"] = KindView{{}, std::move(own)};
  d.answers["vm"] = KindAnswer{
      .changes_only = true, .seq = seq, .changes = std::move(changes)};
  return d;
}

TEST(PollCacheTest, AppliesJoinsRecordsAndLeavesInOrder) {
  PollCache cache;
  std::vector<std::string> warnings;
  DecodedPoll first = Full(5, {"a/vm/0", "b/vm/0"}, {{"b/vm/0", {{0, 4}, 9}}});
  ASSERT_TRUE(cache.Merge(&first, kRequest, &warnings));
  EXPECT_EQ(cache.epoch(), "e1");
  EXPECT_EQ(cache.Since("vm"), 5u);
  DecodedPoll next = Changes(8, {{6, '+', "c/vm/0", ""},
                                 {7, 'h', "c/vm/0", "4 8 10"},
                                 {8, '-', "b/vm/0", ""}});
  ASSERT_TRUE(cache.Merge(&next, kRequest, &warnings));
  EXPECT_THAT(next.result.kinds["vm"].members, ElementsAre("a/vm/0", "c/vm/0"));
  EXPECT_THAT(next.result.kinds["vm"].held,
              ElementsAre(std::pair<const std::string, Assignment>(
                  "c/vm/0", Assignment{{4, 8}, 10})));
  EXPECT_EQ(cache.Since("vm"), 8u);
  EXPECT_THAT(warnings, IsEmpty());
  EXPECT_EQ(cache.change_polls(), 1);
  EXPECT_EQ(cache.changes_applied(), 3);
}

TEST(PollCacheTest, ARecordOfAnIdThatIsNotAMemberShowsOnceItJoins) {
  // As a full read: records of non-members are out of view, not gone.
  PollCache cache;
  std::vector<std::string> warnings;
  DecodedPoll first = Full(5, {"a/vm/0"}, {});
  ASSERT_TRUE(cache.Merge(&first, kRequest, &warnings));
  DecodedPoll record = Changes(6, {{6, 'h', "c/vm/0", "0 4 11"}});
  ASSERT_TRUE(cache.Merge(&record, kRequest, &warnings));
  EXPECT_THAT(record.result.kinds["vm"].held, IsEmpty());
  DecodedPoll join = Changes(7, {{7, '+', "c/vm/0", ""}});
  ASSERT_TRUE(cache.Merge(&join, kRequest, &warnings));
  EXPECT_THAT(join.result.kinds["vm"].members, ElementsAre("a/vm/0", "c/vm/0"));
  EXPECT_THAT(join.result.kinds["vm"].held,
              ElementsAre(std::pair<const std::string, Assignment>(
                  "c/vm/0", Assignment{{0, 4}, 11})));
  DecodedPoll leave = Changes(8, {{8, '-', "c/vm/0", ""}});
  ASSERT_TRUE(cache.Merge(&leave, kRequest, &warnings));
  EXPECT_THAT(leave.result.kinds["vm"].held, IsEmpty());
  EXPECT_THAT(warnings, IsEmpty());
}

TEST(PollCacheTest, AGapOrAnOwnRecordThatDisagreesDropsEverything) {
  PollCache cache;
  std::vector<std::string> warnings;
  DecodedPoll first = Full(5, {"a/vm/0"}, {{"a/vm/0", {{0, 4}, 9}}});
  ASSERT_TRUE(cache.Merge(&first, kRequest, &warnings));
  // Seq 6 is missing.
  DecodedPoll gap =
      Changes(7, {{7, 'd', "x/vm/0", ""}}, {{"a/vm/0", {{0, 4}, 9}}});
  EXPECT_FALSE(cache.Merge(&gap, kRequest, &warnings));
  EXPECT_EQ(cache.Since("vm"), std::nullopt);
  // Again from a full read; then the own record read with the changes is
  // not what the view says.
  DecodedPoll again = Full(7, {"a/vm/0"}, {{"a/vm/0", {{0, 4}, 9}}});
  ASSERT_TRUE(cache.Merge(&again, kRequest, &warnings));
  DecodedPoll edited = Changes(7, {}, {});
  EXPECT_FALSE(cache.Merge(&edited, kRequest, &warnings));
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("a/vm/0")));
  EXPECT_EQ(cache.Since("vm"), std::nullopt);
  EXPECT_EQ(cache.change_polls(), 0);
}

TEST(PollCacheTest, AnotherEpochOrAnUncacheableReadForgetsTheView) {
  PollCache cache;
  std::vector<std::string> warnings;
  DecodedPoll first = Full(5, {"a/vm/0"}, {});
  ASSERT_TRUE(cache.Merge(&first, kRequest, &warnings));
  DecodedPoll other = Full(2, {"a/vm/0"}, {}, "e2");
  ASSERT_TRUE(cache.Merge(&other, kRequest, &warnings));
  EXPECT_EQ(cache.epoch(), "e2");
  EXPECT_EQ(cache.Since("vm"), 2u);
  DecodedPoll far = Full(3, {"a/vm/0"}, {}, "e2");
  far.answers["vm"].seq.reset();  // Members beyond the horizon.
  ASSERT_TRUE(cache.Merge(&far, kRequest, &warnings));
  EXPECT_EQ(cache.Since("vm"), std::nullopt);
}

TEST(PollCacheTest, EverySixteenthPollReadsEverythingAndNamesWhatItMissed) {
  PollCache cache;
  std::vector<std::string> warnings;
  DecodedPoll first = Full(5, {"a/vm/0", "b/vm/0"}, {});
  ASSERT_TRUE(cache.Merge(&first, kRequest, &warnings));
  for (int i = 1; i < 16; ++i) {
    ASSERT_EQ(cache.Since("vm"), 5u) << i;
    DecodedPoll none = Changes(5, {});
    ASSERT_TRUE(cache.Merge(&none, kRequest, &warnings));
  }
  EXPECT_EQ(cache.Since("vm"), std::nullopt);
  // The full read at the same seq holds a record the log never carried.
  DecodedPoll full = Full(5, {"a/vm/0", "b/vm/0"}, {{"b/vm/0", {{0, 1}, 3}}});
  ASSERT_TRUE(cache.Merge(&full, kRequest, &warnings));
  EXPECT_THAT(warnings, ElementsAre(HasSubstr("without an entry")));
  EXPECT_EQ(cache.Since("vm"), 5u);
}

TEST(PollCacheTest, AnnouncedChangesSayWhichMembersRecordsChangedSize) {
  PollCache cache;
  std::vector<std::string> warnings;
  DecodedPoll first = Full(5, {"a/vm/0", "b/vm/0"}, {{"b/vm/0", {{0, 4}, 9}}});
  ASSERT_TRUE(cache.Merge(&first, kRequest, &warnings));
  std::vector<ChangeNotice::Resized> resized;
  // b grows to 5 shards, a is granted 3, b's record is rewritten at the
  // same size (nothing to say), a record of a non-member (not in view) and
  // an entry the poll read already (seq 5) say nothing either; b leaves
  // with its record.
  EXPECT_EQ(cache.Apply("vm",
                        {{5, 'h', "a/vm/0", "0 1 3"},
                         {6, 'h', "b/vm/0", "0 5 11"},
                         {7, 'h', "a/vm/0", "10 13 12"},
                         {8, 'h', "b/vm/0", "1 6 13"},
                         {9, 'h', "z/vm/0", "20 30 14"},
                         {10, '-', "b/vm/0", ""}},
                        &resized),
            PollCache::Applied::kApplied);
  ASSERT_EQ(resized.size(), 3u);
  EXPECT_EQ(resized[0].id, "b/vm/0");
  EXPECT_EQ(resized[0].seq, 6u);
  EXPECT_EQ(resized[0].before, 4u);
  EXPECT_EQ(resized[0].after, 5u);
  EXPECT_EQ(resized[1].id, "a/vm/0");
  EXPECT_EQ(resized[1].before, 0u);
  EXPECT_EQ(resized[1].after, 3u);
  EXPECT_EQ(resized[2].id, "b/vm/0");
  EXPECT_EQ(resized[2].seq, 10u);
  EXPECT_EQ(resized[2].before, 5u);
  EXPECT_EQ(resized[2].after, 0u);
}

TEST(PollCacheTest, AnnouncedChangesFollowTheViewOrWaitForAPoll) {
  PollCache cache;
  std::vector<std::string> warnings;
  EXPECT_EQ(cache.Apply("vm", {{1, '+', "c/vm/0", ""}}),
            PollCache::Applied::kNotCached);
  EXPECT_EQ(cache.View("vm"), std::nullopt);
  DecodedPoll first = Full(5, {"a/vm/0", "b/vm/0"}, {{"b/vm/0", {{0, 4}, 9}}});
  ASSERT_TRUE(cache.Merge(&first, kRequest, &warnings));
  // Entries the poll read already are skipped; the new ones follow it.
  EXPECT_EQ(cache.Apply("vm", {{4, '-', "z/vm/0", ""},
                               {5, '+', "b/vm/0", ""},
                               {6, '+', "c/vm/0", ""},
                               {7, 'h', "c/vm/0", "4 8 10"}}),
            PollCache::Applied::kApplied);
  EXPECT_EQ(cache.seq("vm"), 7u);
  EXPECT_EQ(cache.Apply("vm", {{8, 'd', "b/vm/0", ""}}),
            PollCache::Applied::kApplied);
  std::optional<KindView> view = cache.View("vm");
  ASSERT_TRUE(view.has_value());
  EXPECT_THAT(view->members, ElementsAre("a/vm/0", "b/vm/0", "c/vm/0"));
  EXPECT_THAT(view->held, ElementsAre(std::pair<const std::string, Assignment>(
                              "c/vm/0", Assignment{{4, 8}, 10})));
  // A gap (entry 9 never arrived): nothing of it is applied, the view
  // stays at 8, and the next poll asks for the changes since 8.
  EXPECT_EQ(cache.Apply("vm", {{10, '-', "a/vm/0", ""}}),
            PollCache::Applied::kGap);
  EXPECT_EQ(cache.seq("vm"), 8u);
  EXPECT_THAT(cache.View("vm")->members,
              ElementsAre("a/vm/0", "b/vm/0", "c/vm/0"));
  EXPECT_EQ(cache.Since("vm"), 8u);
  DecodedPoll next =
      Changes(10, {{9, '+', "d/vm/0", ""}, {10, '-', "a/vm/0", ""}});
  ASSERT_TRUE(cache.Merge(&next, kRequest, &warnings));
  EXPECT_THAT(next.result.kinds["vm"].members,
              ElementsAre("b/vm/0", "c/vm/0", "d/vm/0"));
  EXPECT_THAT(warnings, IsEmpty());
}

}  // namespace
}  // namespace setpoint::redis
