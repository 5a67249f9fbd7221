#include "node/view_sync.h"

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace setpoint {
namespace {

Assignment Holding(uint32_t begin, uint32_t end, uint64_t token) {
  return Assignment{ShardSet(begin, end), token};
}

TEST(ViewSyncTest, EqualViewsChangeNothing) {
  KindView v{{"a/k/0", "b/k/0"}, {{"a/k/0", Holding(0, 5, 1)}}};
  KindView to = v;
  ViewSync s = SyncView(v, {}, &to);
  EXPECT_FALSE(s.changed());
  EXPECT_EQ(to.members, v.members);
  EXPECT_EQ(to.held, v.held);
}

TEST(ViewSyncTest, SaysWhoCameAndWentAndCopiesTheRecords) {
  KindView from{{"a/k/0", "c/k/0"},
                {{"a/k/0", Holding(0, 5, 2)}, {"c/k/0", Holding(5, 9, 3)}}};
  KindView to{{"a/k/0", "b/k/0"},
              {{"a/k/0", Holding(0, 5, 1)}, {"b/k/0", Holding(5, 9, 1)}}};
  ViewSync s = SyncView(from, {}, &to);
  EXPECT_TRUE(s.joined);
  EXPECT_TRUE(s.left);
  EXPECT_TRUE(s.held_changed);
  EXPECT_EQ(to.members, from.members);
  EXPECT_EQ(to.held, from.held);
  // Only a record changed (a grant elsewhere): no join, no leave.
  from.held["c/k/0"] = Holding(5, 10, 4);
  s = SyncView(from, {}, &to);
  EXPECT_FALSE(s.joined);
  EXPECT_FALSE(s.left);
  EXPECT_TRUE(s.held_changed);
  EXPECT_EQ(to.held, from.held);
}

TEST(ViewSyncTest, OwnRecordsStayAsTheCallerHasThem) {
  // The cache lags our own handoff (token 9), and has dropped our other
  // node's record, which we still hold.
  KindView from{{"a/k/0", "a/k/1", "b/k/0"},
                {{"a/k/0", Holding(0, 5, 1)}, {"b/k/0", Holding(9, 12, 2)}}};
  KindView to{{"a/k/0", "a/k/1", "b/k/0"},
              {{"a/k/0", Holding(0, 8, 9)}, {"a/k/1", Holding(8, 9, 9)}}};
  ViewSync s = SyncView(from, {"a/k/0", "a/k/1"}, &to);
  EXPECT_FALSE(s.joined || s.left);
  EXPECT_TRUE(s.held_changed);  // b's record came.
  EXPECT_EQ(to.held.at("a/k/0"), Holding(0, 8, 9));
  EXPECT_EQ(to.held.at("a/k/1"), Holding(8, 9, 9));
  EXPECT_EQ(to.held.at("b/k/0"), Holding(9, 12, 2));
  // An own record the caller does not have is not taken from the cache.
  KindView mine{{"a/k/0"}, {}};
  s = SyncView(KindView{{"a/k/0"}, {{"a/k/0", Holding(0, 1, 1)}}}, {"a/k/0"},
               &mine);
  EXPECT_FALSE(s.changed());
  EXPECT_TRUE(mine.held.empty());
}

TEST(ViewSyncTest, AgreesWithACopyOnRandomViews) {
  // Against what a copy of the cache with our own records put back gives.
  std::mt19937 rng(7);
  auto random_view = [&] {
    KindView v;
    for (int i = 0; i < 30; ++i) {
      if (rng() % 2 == 0) continue;
      std::string id = absl::StrCat(
          std::string(1, static_cast<char>('a' + i % 5)), "/k/", i);
      v.members.push_back(id);
      if (rng() % 3 != 0) {
        v.held[id] = Holding(rng() % 50, 50 + rng() % 50, rng() % 4);
      }
    }
    std::sort(v.members.begin(), v.members.end());
    return v;
  };
  for (int round = 0; round < 2000; ++round) {
    const KindView from = random_view();
    KindView to = random_view();
    std::vector<std::string> own;
    for (int i = 0; i < 30; i += 5 + static_cast<int>(rng() % 5)) {
      own.push_back(absl::StrCat("a/k/", i));
    }
    std::sort(own.begin(), own.end());
    KindView want = from;
    for (const std::string& id : own) {
      want.held.erase(id);
      if (auto it = to.held.find(id); it != to.held.end()) {
        want.held.emplace(id, it->second);
      }
    }
    const KindView before = to;
    ViewSync s = SyncView(from, own, &to);
    ASSERT_EQ(to.members, want.members);
    ASSERT_EQ(to.held, want.held);
    EXPECT_EQ(s.changed(),
              before.members != want.members || before.held != want.held);
  }
}

TEST(ViewSyncTest, LookingOnlyAtTheChangedIdsGivesTheSameAsComparingAll) {
  // `to` starts equal to a view (but for our own records); the view then
  // changes at random ids, which are named. Syncing with the names must
  // give what comparing everything gives, and say the same about it.
  std::mt19937 rng(11);
  auto id_of = [](uint32_t i) { return absl::StrCat("p", i % 40, "/k/0"); };
  for (int round = 0; round < 500; ++round) {
    KindView from;
    for (uint32_t i = 0; i < 40; ++i) {
      if (rng() % 3 == 0) continue;
      from.members.push_back(id_of(i));
      if (rng() % 2 == 0) from.held[id_of(i)] = Holding(i, i + 1, rng() % 9);
    }
    std::sort(from.members.begin(), from.members.end());
    const std::vector<std::string> own = {"p3/k/0", "p7/k/0"};
    KindView to;
    to.held["p3/k/0"] = Holding(3, 4, 99);  // Ours, as our handoffs left it.
    SyncView(from, own, &to);
    // Changes at random ids: joins, leaves, records set and dropped.
    std::vector<std::string> changed;
    for (int c = static_cast<int>(rng() % 12); c > 0; --c) {
      const std::string id = id_of(static_cast<uint32_t>(rng()));
      changed.push_back(id);
      auto pos = std::lower_bound(from.members.begin(), from.members.end(), id);
      const bool member = pos != from.members.end() && *pos == id;
      switch (rng() % 4) {
        case 0:
          if (!member) from.members.insert(pos, id);
          break;
        case 1:
          if (member) from.members.erase(pos);
          from.held.erase(id);
          break;
        case 2:
          from.held[id] = Holding(rng() % 50, 60, rng() % 9);
          break;
        default:
          from.held.erase(id);
          break;
      }
    }
    KindView whole = to;
    const ViewSync by_all = SyncView(from, own, &whole);
    const ViewSync by_name = SyncView(from, own, &to, &changed);
    ASSERT_EQ(to.members, whole.members) << round;
    ASSERT_EQ(to.held, whole.held) << round;
    EXPECT_EQ(by_name.joined, by_all.joined) << round;
    EXPECT_EQ(by_name.left, by_all.left) << round;
    EXPECT_EQ(by_name.held_changed, by_all.held_changed) << round;
    EXPECT_EQ(by_name.max_token, by_all.max_token) << round;
  }
}

}  // namespace
}  // namespace setpoint
