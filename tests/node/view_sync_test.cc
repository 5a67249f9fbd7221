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

}  // namespace
}  // namespace setpoint
