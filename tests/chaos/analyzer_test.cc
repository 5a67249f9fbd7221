// The chaos analyzer on synthetic pod logs: ownership from B/E/F lines, the
// death, validity and SIGSTOP cuts, double ownership, tokens, takeover,
// convergence, late fences and the client-call check.
#include "chaos/analyzer.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace setpoint::chaos {
namespace {

// Log text builders (times in ns; small numbers keep tests readable).
std::string S(const std::string& pod, int64_t t, int nodes = 1,
              uint32_t ring = 8) {
  return absl::StrCat("S ", t, " ", pod, " 123 ", nodes, " ", ring,
                      " 1500 250 0\n");
}
std::string B(const std::string& node, uint32_t b, uint32_t e, uint64_t tok,
              int64_t t) {
  return absl::StrCat("B ", node, " ", b, " ", e, " ", tok, " ", t, "\n");
}
std::string E(const std::string& node, int64_t t) {
  return absl::StrCat("E ", node, " ", t, "\n");
}
std::string F(const std::string& node, int64_t t, int code = 4) {
  return absl::StrCat("F ", node, " ", t, " ", code, "\n");
}
std::string C(const std::string& node, uint32_t shard, uint64_t tok,
              int64_t start, int64_t end, int code = 0) {
  return absl::StrCat("C ", node, " ", shard, " ", tok, " ", start, " ", end,
                      " ", code, "\n");
}
std::string R(int64_t at, int64_t until) {
  return absl::StrCat("R ", at, " ", until, "\n");
}

PodRecord Rec(const std::string& text, int64_t death = kNever,
              std::vector<Span> stops = {}) {
  return PodRecord{ParsePodLog(text), death, std::move(stops)};
}

std::vector<Interval> All(const std::vector<PodRecord>& recs, Cut cut) {
  std::vector<Interval> out;
  for (const PodRecord& r : recs) {
    for (const Interval& iv : Intervals(r, cut)) out.push_back(iv);
  }
  return out;
}

const Interval* Find(const std::vector<Interval>& ivs, uint32_t shard,
                     int64_t start) {
  for (const Interval& iv : ivs) {
    if (iv.shard == shard && iv.start == start) return &iv;
  }
  return nullptr;
}

TEST(ChaosAnalyzerTest, ParsesEveryLineKindAndIgnoresAnIncompleteLast) {
  std::string text = S("a", 10, 2, 16) + R(20, 500) +
                     B("a/work/0", 0, 8, 7, 30) + E("a/work/0", 31) +
                     "garbage line\n" + "T 40 15\n" + "X 50\n" +
                     "B a/work/1 8 16 9 6";  // No newline.
  PodLog log = ParsePodLog(text);
  EXPECT_EQ(log.pod, "a");
  EXPECT_EQ(log.started, 10);
  EXPECT_EQ(log.nodes, 2);
  EXPECT_EQ(log.ring, 16u);
  EXPECT_EQ(log.lease_ms, 1500);
  ASSERT_EQ(log.renewals.size(), 1u);
  EXPECT_EQ(log.renewals[0].until, 500);
  ASSERT_EQ(log.calls["a/work/0"].size(), 1u);
  EXPECT_EQ(log.calls["a/work/0"][0].to, (Range{0, 8}));
  EXPECT_EQ(log.calls["a/work/0"][0].token, 7u);
  EXPECT_EQ(log.calls["a/work/0"][0].end, 31);
  EXPECT_EQ(log.calls.count("a/work/1"), 0u);
  EXPECT_EQ(log.stop_requested, 40);
  EXPECT_EQ(log.exited, 50);
  EXPECT_EQ(log.bad_lines, 1);
  EXPECT_EQ(log.last_line, 50);
}

TEST(ChaosAnalyzerTest, OwnershipRunsFromTheGrantingBToTheRemovingE) {
  // [0,4) at 100, shrink to [0,2) (B 200, E 210), then a call without its
  // E (the pod died inside it) to the empty range.
  PodRecord rec = Rec(S("a", 1) + B("a/work/0", 0, 4, 5, 100) +
                          E("a/work/0", 101) + B("a/work/0", 0, 2, 5, 200) +
                          E("a/work/0", 210) + B("a/work/0", 0, 0, 0, 300),
                      /*death=*/400);
  std::vector<Interval> ivs = Intervals(rec, Cut::kRaw);
  ASSERT_EQ(ivs.size(), 4u);
  EXPECT_EQ(Find(ivs, 0, 100)->end, 400);  // Still held when it died.
  EXPECT_EQ(Find(ivs, 1, 100)->end, 400);
  EXPECT_EQ(Find(ivs, 2, 100)->end, 210);  // Until the shrink returned.
  EXPECT_EQ(Find(ivs, 3, 100)->end, 210);
  EXPECT_EQ(Find(ivs, 0, 100)->token, 5u);
}

TEST(ChaosAnalyzerTest, ValidityEndsAnIntervalAtTheFirstLapse) {
  // Valid [50,150), extended by an R logged at 140 to 300; lapses at 300;
  // a renewal at 400 does not bring the interval back.
  PodRecord rec = Rec(S("a", 1) + R(50, 150) + B("a/work/0", 0, 1, 5, 100) +
                      E("a/work/0", 101) + R(140, 300) + R(400, 900));
  EXPECT_EQ(ValiditySpans(rec.log.renewals),
            (std::vector<Span>{{50, 300}, {400, 900}}));
  EXPECT_EQ(ValidUntil(ValiditySpans(rec.log.renewals), 120), 300);
  EXPECT_EQ(ValidUntil(ValiditySpans(rec.log.renewals), 350), 350);
  std::vector<Interval> ivs = Intervals(rec, Cut::kValidity);
  ASSERT_EQ(ivs.size(), 1u);
  EXPECT_EQ(ivs[0].end, 300);
  // A grant logged while not valid is never in force.
  PodRecord late = Rec(S("a", 1) + R(50, 150) + B("a/work/0", 0, 1, 5, 200) +
                       E("a/work/0", 201));
  EXPECT_TRUE(Intervals(late, Cut::kValidity).empty());
  EXPECT_EQ(Intervals(late, Cut::kRaw).size(), 1u);
  // A renewal whose validity is already over when logged starts nothing.
  EXPECT_TRUE(ValiditySpans({{100, 90}}).empty());
}

TEST(ChaosAnalyzerTest, DoubleOwnershipIsFoundAndMeasured) {
  PodRecord a =
      Rec(S("a", 1) + B("a/work/0", 0, 2, 5, 100) + E("a/work/0", 101) +
          B("a/work/0", 0, 0, 0, 300) + E("a/work/0", 310));
  // b starts on shard 1 at 250 (a still owns it until 310), and on shard 0
  // exactly when a's E returns (touching, no overlap).
  PodRecord b =
      Rec(S("b", 1) + B("b/work/0", 1, 2, 6, 250) + E("b/work/0", 251) +
          B("b/work/0", 0, 2, 7, 310) + E("b/work/0", 311));
  OwnerCheck check = CheckOneOwner(All({a, b}, Cut::kRaw), 2);
  ASSERT_EQ(check.overlaps.size(), 1u);
  EXPECT_EQ(check.overlaps[0].shard, 1u);
  EXPECT_EQ(check.overlaps[0].first.node, "a/work/0");
  EXPECT_EQ(check.overlaps[0].second.node, "b/work/0");
  EXPECT_EQ(check.overlaps[0].from, 250);
  EXPECT_EQ(check.overlaps[0].to, 310);
  EXPECT_EQ(check.shard_ns, 60);
  EXPECT_EQ(check.wall_ns, 60);
  // Without b's early start nothing overlaps.
  PodRecord b2 =
      Rec(S("b", 1) + B("b/work/0", 0, 2, 7, 310) + E("b/work/0", 311));
  EXPECT_TRUE(CheckOneOwner(All({a, b2}, Cut::kRaw), 2).overlaps.empty());
}

TEST(ChaosAnalyzerTest, TwoProcessesOfOnePodIdAreTwoOwnersOnceNamedApart) {
  // Two incarnations of pod "a" (a restart under the same id) both own
  // shard 1 from 250 to 310, and the later one calls the client there.
  const std::string first = S("a", 1) + B("a/work/0", 0, 2, 5, 100) +
                            E("a/work/0", 101) + B("a/work/0", 0, 0, 0, 300) +
                            E("a/work/0", 310);
  const std::string second = S("a", 200) + B("a/work/0", 1, 2, 6, 250) +
                             E("a/work/0", 251) + C("a/work/0", 1, 6, 260, 270);
  PodRecord a1 = Rec(first);
  PodRecord a2 = Rec(second);
  // Under one name the analyzer sees one node, which owns shard 1 once.
  EXPECT_TRUE(CheckOneOwner(All({a1, a2}, Cut::kRaw), 2).overlaps.empty());
  NameIncarnation(&a1.log, "a", "a#0");
  NameIncarnation(&a2.log, "a", "a#1");
  EXPECT_EQ(a2.log.pod, "a#1");
  ASSERT_EQ(a2.log.client_calls.size(), 1u);
  EXPECT_EQ(a2.log.client_calls[0].node, "a#1/work/0");
  EXPECT_EQ(a2.log.calls.count("a#1/work/0"), 1u);
  EXPECT_EQ(a2.log.calls.count("a/work/0"), 0u);
  OwnerCheck check = CheckOneOwner(All({a1, a2}, Cut::kRaw), 2);
  ASSERT_EQ(check.overlaps.size(), 1u);
  EXPECT_EQ(check.overlaps[0].first.node, "a#0/work/0");
  EXPECT_EQ(check.overlaps[0].second.node, "a#1/work/0");
  EXPECT_EQ(check.shard_ns, 60);
  // A node of another pod whose id starts alike is left as it is.
  PodLog other = ParsePodLog(S("ab", 1) + B("ab/work/0", 0, 1, 9, 5));
  NameIncarnation(&other, "a", "a#0");
  EXPECT_EQ(other.calls.count("ab/work/0"), 1u);
}

TEST(ChaosAnalyzerTest, ThreeOwnersCountOnceInTimeAndTwiceInPairs) {
  PodRecord a = Rec(S("a", 1) + B("a/work/0", 0, 1, 1, 0) + E("a/work/0", 1),
                    /*death=*/100);
  PodRecord b = Rec(S("b", 1) + B("b/work/0", 0, 1, 2, 10) + E("b/work/0", 11),
                    /*death=*/100);
  PodRecord c = Rec(S("c", 1) + B("c/work/0", 0, 1, 3, 20) + E("c/work/0", 21),
                    /*death=*/100);
  OwnerCheck check = CheckOneOwner(All({a, b, c}, Cut::kRaw), 1);
  EXPECT_EQ(check.overlaps.size(), 3u);
  EXPECT_EQ(check.shard_ns, 90);  // [10,100) with >= 2 owners.
  EXPECT_EQ(check.windows, (std::vector<Span>{{10, 100}}));
}

TEST(ChaosAnalyzerTest, ASigstopPastValidityIsExcusedOnlyUntilTheFence) {
  // a: valid until 300, SIGSTOPped at 200, SIGCONTed at 1000, fences
  // (empty range) by 1010. b takes shard 0 at 600.
  std::string a_log = S("a", 1) + R(50, 300) + B("a/work/0", 0, 1, 5, 100) +
                      E("a/work/0", 101) + B("a/work/0", 0, 0, 0, 1005) +
                      E("a/work/0", 1010);
  PodRecord a = Rec(a_log, kNever, {{200, 1000}});
  PodRecord b = Rec(S("b", 1) + R(550, 5000) + B("b/work/0", 0, 1, 6, 600) +
                    E("b/work/0", 601));
  EXPECT_EQ(CheckOneOwner(All({a, b}, Cut::kRaw), 1).overlaps.size(), 1u);
  EXPECT_TRUE(CheckOneOwner(All({a, b}, Cut::kValidity), 1).overlaps.empty());
  EXPECT_TRUE(CheckOneOwner(All({a, b}, Cut::kCalls), 1).overlaps.empty());
  std::vector<Interval> calls = Intervals(a, Cut::kCalls);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].end, 200);
  // A stop that ends while the pod is still valid excuses nothing.
  PodRecord short_stop =
      Rec(S("a", 1) + R(50, 5000) + B("a/work/0", 0, 1, 5, 100) +
              E("a/work/0", 101) + B("a/work/0", 0, 0, 0, 1005) +
              E("a/work/0", 1010),
          kNever, {{200, 1000}});
  EXPECT_EQ(CheckOneOwner(All({short_stop, b}, Cut::kCalls), 1).overlaps.size(),
            1u);
  // A pod that reports validity again (R at 1002) before its fence owns
  // again from then: b and it overlap in [1002,1010).
  PodRecord resumed =
      Rec(S("a", 1) + R(50, 300) + B("a/work/0", 0, 1, 5, 100) +
              E("a/work/0", 101) + R(1002, 2000) +
              B("a/work/0", 0, 0, 0, 1005) + E("a/work/0", 1010),
          kNever, {{200, 1000}});
  OwnerCheck check = CheckOneOwner(All({resumed, b}, Cut::kCalls), 1);
  ASSERT_EQ(check.overlaps.size(), 1u);
  EXPECT_EQ(check.overlaps[0].from, 1002);
  EXPECT_EQ(check.overlaps[0].to, 1010);
  // A range granted after the SIGCONT is not excused.
  PodRecord regranted =
      Rec(S("a", 1) + R(50, 300) + B("a/work/0", 0, 0, 0, 1005) +
              E("a/work/0", 1010) + R(1020, 5000) +
              B("a/work/0", 0, 1, 9, 1030) + E("a/work/0", 1031) +
              B("a/work/0", 0, 0, 0, 3000) + E("a/work/0", 3001),
          kNever, {{200, 1000}});
  EXPECT_EQ(CheckOneOwner(All({regranted, b}, Cut::kCalls), 1).overlaps.size(),
            1u);
}

TEST(ChaosAnalyzerTest, ParsesRefusalsAndClientCalls) {
  PodLog log = ParsePodLog(S("a", 1) + B("a/work/0", 0, 4, 7, 10) +
                           F("a/work/0", 20, 4) + C("a/work/0", 3, 7, 30, 40) +
                           B("a/work/0", 0, 4, 7, 50) + E("a/work/0", 51) +
                           "C a/work/0 3 7 30\n");  // Too short.
  ASSERT_EQ(log.calls["a/work/0"].size(), 2u);
  EXPECT_TRUE(log.calls["a/work/0"][0].refused);
  EXPECT_EQ(log.calls["a/work/0"][0].code, 4);
  EXPECT_EQ(log.calls["a/work/0"][0].end, 20);
  EXPECT_FALSE(log.calls["a/work/0"][1].refused);
  ASSERT_EQ(log.client_calls.size(), 1u);
  EXPECT_EQ(log.client_calls[0].node, "a/work/0");
  EXPECT_EQ(log.client_calls[0].shard, 3u);
  EXPECT_EQ(log.client_calls[0].token, 7u);
  EXPECT_EQ(log.client_calls[0].start, 30);
  EXPECT_EQ(log.client_calls[0].end, 40);
  EXPECT_EQ(log.unmatched, 0);
  EXPECT_EQ(log.bad_lines, 1);
}

TEST(ChaosAnalyzerTest, ARefusedHandoffTakesNothingAway) {
  // a asks to shrink [0,2) -> [0,1) at 200 and refuses (F 210): it still
  // owns shard 1 until the shrink asked again returns (E 260). A refused
  // grow (to [0,3)) gives shard 2 from its B.
  PodRecord a =
      Rec(S("a", 1) + B("a/work/0", 0, 2, 5, 100) + E("a/work/0", 101) +
          B("a/work/0", 0, 1, 5, 200) + F("a/work/0", 210) +
          B("a/work/0", 0, 1, 5, 250) + E("a/work/0", 260) +
          B("a/work/0", 0, 3, 6, 300) + F("a/work/0", 310));
  std::vector<Interval> ivs = Intervals(a, Cut::kRaw);
  ASSERT_EQ(ivs.size(), 4u);
  EXPECT_EQ(Find(ivs, 1, 100)->end, 260);
  EXPECT_EQ(Find(ivs, 0, 100)->end, kNever);
  EXPECT_EQ(Find(ivs, 1, 300)->end, kNever);
  EXPECT_EQ(Find(ivs, 2, 300)->granted, 310);
  // The refused shrink is no grant; the refused grow is (a new token).
  std::vector<Grant> grants = Grants(a);
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_EQ(grants[1].token, 6u);
  EXPECT_EQ(grants[1].at, 300);
}

// Pod a holds shard 1 (token 5) and gives it up at B 200 / E 230; pod b is
// granted it at B 240 (token 6).
std::string HandoffA(const std::string& calls) {
  return S("a", 1) + R(50, 5000) + B("a/work/0", 0, 2, 5, 100) +
         E("a/work/0", 110) + calls + B("a/work/0", 0, 1, 5, 200) +
         E("a/work/0", 230);
}
std::string HandoffB(const std::string& calls) {
  return S("b", 1) + R(50, 5000) + B("b/work/0", 1, 2, 6, 240) +
         E("b/work/0", 250) + calls;
}

TEST(ChaosAnalyzerTest, ClientCallsOfACleanHandoffAreAccepted) {
  // a's call on shard 1 ends (cancelled) before its shrink returns; b's
  // calls start after its grant, one of them before the grant returned.
  PodRecord a = Rec(HandoffA(C("a/work/0", 1, 5, 105, 180) +
                             C("a/work/0", 0, 5, 150, 225) +
                             C("a/work/0", 1, 5, 190, 228, 1)));
  PodRecord b = Rec(
      HandoffB(C("b/work/0", 1, 6, 245, 300) + C("b/work/0", 1, 6, 260, 320)));
  CallCheck check = CheckClientCalls({&a, &b}, 2);
  EXPECT_EQ(check.calls, 5);
  EXPECT_TRUE(check.violations.empty());
  EXPECT_TRUE(check.excused.empty());
  EXPECT_EQ(check.started_inside_grant, 2);  // a at 105, b at 245.
  EXPECT_EQ(check.by_code[0], 4);
  EXPECT_EQ(check.by_code[1], 1);
}

TEST(ChaosAnalyzerTest, ClientCallViolationsAreCaught) {
  // a's call on shard 1 ends after the E that took the shard away (and
  // so overlaps b's), another one starts before a's grant, one carries a
  // token a was never given, and one ran without an assignment.
  PodRecord a = Rec(
      HandoffA(C("a/work/0", 1, 5, 190, 245) + C("a/work/0", 0, 5, 90, 120) +
               C("a/work/0", 0, 9, 150, 160) + C("-", 0, 0, 150, 160)));
  PodRecord b = Rec(HandoffB(C("b/work/0", 1, 6, 241, 300)));
  CallCheck check = CheckClientCalls({&a, &b}, 2);
  EXPECT_EQ(check.calls, 5);
  std::map<CallViolation::Kind, int> kinds;
  for (const CallViolation& v : check.violations) ++kinds[v.kind];
  EXPECT_EQ(kinds[CallViolation::Kind::kOutsideOwnership], 2);
  EXPECT_EQ(kinds[CallViolation::Kind::kForeignToken], 1);
  EXPECT_EQ(kinds[CallViolation::Kind::kNoAssignment], 1);
  ASSERT_EQ(kinds[CallViolation::Kind::kOverlap], 1);
  for (const CallViolation& v : check.violations) {
    if (v.kind == CallViolation::Kind::kOutsideOwnership && v.call.shard == 1) {
      EXPECT_EQ(v.owned.end, 230);  // The interval the call outlived.
    }
    if (v.kind != CallViolation::Kind::kOverlap) continue;
    EXPECT_EQ(v.call.node, "a/work/0");
    EXPECT_EQ(v.other.node, "b/work/0");
    EXPECT_EQ(v.from, 241);
    EXPECT_EQ(v.to, 245);
  }
  // Calls of two nodes of one pod overlap just as well.
  PodRecord two =
      Rec(S("a", 1, 2) + B("a/work/0", 0, 1, 5, 100) + E("a/work/0", 101) +
          B("a/work/1", 0, 1, 6, 100) + E("a/work/1", 101) +
          C("a/work/0", 0, 5, 110, 130) + C("a/work/1", 0, 6, 120, 140));
  check = CheckClientCalls({&two}, 1);
  ASSERT_EQ(check.violations.size(), 1u);
  EXPECT_EQ(check.violations[0].kind, CallViolation::Kind::kOverlap);
}

TEST(ChaosAnalyzerTest, AFrozenPodsCallOverlapsOnlyExcusedUntilItsFence) {
  // a: valid until 300, SIGSTOPped at 200 inside a call on shard 0 that
  // returns after the SIGCONT (1000), at 1003; it starts another at 1004
  // and fences (empty range) at 1005-1010. b is granted shard 0 at 600
  // with a higher token and calls during a's freeze and after its fence.
  std::string a_log = S("a", 1) + R(50, 300) + B("a/work/0", 0, 1, 5, 100) +
                      E("a/work/0", 101) + C("a/work/0", 0, 5, 150, 1003) +
                      C("a/work/0", 0, 5, 1004, 1008, 1) +
                      B("a/work/0", 0, 0, 0, 1005) + E("a/work/0", 1010);
  PodRecord a = Rec(a_log, kNever, {{200, 1000}});
  std::string b_log = S("b", 1) + R(550, 5000) + B("b/work/0", 0, 1, 6, 600) +
                      E("b/work/0", 601) + C("b/work/0", 0, 6, 610, 640) +
                      C("b/work/0", 0, 6, 990, 1006) +
                      C("b/work/0", 0, 6, 1020, 1030);
  PodRecord b = Rec(b_log);
  EXPECT_EQ(FrozenSpans(a, "a/work/0"), (std::vector<Span>{{200, 1010}}));
  CallCheck check = CheckClientCalls({&a, &b}, 1);
  EXPECT_EQ(check.calls, 5);
  EXPECT_TRUE(check.violations.empty());
  ASSERT_EQ(check.excused.size(), 3u);  // 610-640, 990-1003, 1004-1006.
  EXPECT_EQ(check.excused[0].frozen_pod, "a");
  EXPECT_EQ(check.excused[0].other.node, "b/work/0");
  EXPECT_EQ(check.excused[0].from, 610);
  EXPECT_EQ(check.excused[0].to, 640);
  // The frozen call must hold the lower token: with b's token lower, the
  // world's fencing would not refuse a's write.
  PodRecord b_low = Rec(S("b", 1) + R(550, 5000) + B("b/work/0", 0, 1, 4, 600) +
                        E("b/work/0", 601) + C("b/work/0", 0, 4, 610, 640));
  check = CheckClientCalls({&a, &b_low}, 1);
  EXPECT_TRUE(check.excused.empty());
  ASSERT_EQ(check.violations.size(), 1u);
  EXPECT_EQ(check.violations[0].kind, CallViolation::Kind::kOverlap);
  // A stop that ended while the pod was still valid excuses nothing.
  PodRecord valid =
      Rec(S("a", 1) + R(50, 5000) + B("a/work/0", 0, 1, 5, 100) +
              E("a/work/0", 101) + C("a/work/0", 0, 5, 150, 1003) +
              B("a/work/0", 0, 0, 0, 1005) + E("a/work/0", 1010),
          kNever, {{200, 1000}});
  check = CheckClientCalls({&valid, &b}, 1);
  EXPECT_TRUE(check.excused.empty());
  EXPECT_EQ(check.violations.size(), 2u);  // With 610-640 and 990-1006.
}

TEST(ChaosAnalyzerTest, TokensMustGrowPerShard) {
  PodRecord a = Rec(S("a", 1) + R(0, 10000) + B("a/work/0", 0, 4, 10, 100) +
                    E("a/work/0", 101) + B("a/work/0", 0, 2, 10, 200) +
                    E("a/work/0", 201));
  PodRecord b = Rec(S("b", 1) + R(0, 10000) + B("b/work/0", 2, 4, 9, 300) +
                    E("b/work/0", 301));
  std::vector<Grant> grants = Grants(a);
  ASSERT_EQ(grants.size(), 1u);  // The shrink keeps its token: no grant.
  for (const Grant& g : Grants(b)) grants.push_back(g);
  std::vector<TokenViolation> v = CheckTokens(grants, 4, true);
  ASSERT_EQ(v.size(), 2u);  // Shards 2 and 3.
  EXPECT_EQ(v[0].shard, 2u);
  EXPECT_EQ(v[0].earlier.token, 10u);
  EXPECT_EQ(v[0].later.token, 9u);
  // A grant logged without validity is left out with effective_only.
  PodRecord stale = Rec(S("b", 1) + R(0, 50) + B("b/work/0", 2, 4, 9, 300) +
                        E("b/work/0", 301));
  grants = Grants(a);
  for (const Grant& g : Grants(stale)) grants.push_back(g);
  EXPECT_FALSE(grants.back().effective);
  EXPECT_TRUE(CheckTokens(grants, 4, true).empty());
  EXPECT_EQ(CheckTokens(grants, 4, false).size(), 2u);
}

TEST(ChaosAnalyzerTest, TakeoverAfterAKillAndAGracefulLeave) {
  PodRecord a =
      Rec(S("a", 1) + B("a/work/0", 0, 2, 1, 100) + E("a/work/0", 101),
          /*death=*/1000);
  PodRecord b =
      Rec(S("b", 1) + B("b/work/0", 0, 1, 2, 2500) + E("b/work/0", 2501) +
          B("b/work/0", 0, 2, 3, 2700) + E("b/work/0", 2701));
  std::vector<Interval> raw = All({a, b}, Cut::kRaw);
  std::vector<Takeover> t = KillTakeovers(raw, "a", 1000);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].gap(), 1500);
  EXPECT_EQ(t[0].successor, "b/work/0");
  EXPECT_EQ(t[1].gap(), 1700);
  // Graceful: a's leave returns at 3010 (asked at 3000); b starts at 3020.
  PodRecord g =
      Rec(S("g", 1) + B("g/work/0", 0, 1, 1, 100) + E("g/work/0", 101) +
          B("g/work/0", 0, 0, 0, 3005) + E("g/work/0", 3010));
  PodRecord h =
      Rec(S("h", 1) + B("h/work/0", 0, 1, 2, 3020) + E("h/work/0", 3021));
  std::vector<Takeover> gt =
      GracefulTakeovers(All({g, h}, Cut::kRaw), "g", 3000);
  ASSERT_EQ(gt.size(), 1u);
  EXPECT_EQ(gt[0].from, 3010);
  EXPECT_EQ(gt[0].gap(), 10);
  // Never taken over.
  EXPECT_EQ(KillTakeovers(Intervals(a, Cut::kRaw), "a", 1000)[0].gap(), kNever);
}

TEST(ChaosAnalyzerTest, ConvergedWhenEveryShardHasOneOwnerAndEveryNodeARange) {
  // Ring of 2, one node per pod. a holds both until b joins at 500; a
  // shrinks (E 600), b is granted shard 1 at 650.
  PodRecord a =
      Rec(S("a", 0) + B("a/work/0", 0, 2, 1, 100) + E("a/work/0", 101) +
          B("a/work/0", 0, 1, 1, 590) + E("a/work/0", 600));
  PodRecord b =
      Rec(S("b", 500) + B("b/work/0", 1, 2, 2, 650) + E("b/work/0", 651));
  std::vector<Interval> raw = All({a, b}, Cut::kRaw);
  std::vector<Span> conv = ConvergedSpans({&a, &b}, raw, 2);
  EXPECT_EQ(conv, (std::vector<Span>{{100, 500}, {650, kNever}}));
  EXPECT_EQ(TimeToConverge(conv, 200, 0), 0);
  EXPECT_EQ(TimeToConverge(conv, 500, 0), 150);
  // Converged at 200, but not for 1000: the next stable span counts.
  EXPECT_EQ(TimeToConverge(conv, 200, 1000), 450);
  EXPECT_EQ(TimeToConverge({{100, 500}}, 600, 0), kNever);
  // A span cut by the end of the record is stable enough.
  EXPECT_EQ(TimeToConverge({{100, 500}}, 200, 1000), kNever);
  EXPECT_EQ(TimeToConverge({{100, 500}}, 200, 1000, /*horizon=*/500), 0);
  std::string why;
  EXPECT_TRUE(OwnedOnceAt({&a, &b}, 2, 700, false, &why)) << why;
  EXPECT_FALSE(OwnedOnceAt({&a, &b}, 2, 620, false, &why));
  EXPECT_EQ(why, "pod b: 0 of 1 nodes hold shards");
  EXPECT_FALSE(OwnedOnceAt({&a, &b}, 2, 700, true, &why));
  EXPECT_EQ(why, "pod a has no valid lease");
}

TEST(ChaosAnalyzerTest, LateFencesAndValidityGaps) {
  // Valid until 300; the fence returns at 450: 150 late. Then a second
  // holding with a gap: valid [1000,1200), renewed at 1250, released at
  // 2000 while valid.
  PodRecord rec = Rec(
      S("a", 1) + R(50, 300) + B("a/work/0", 0, 1, 5, 100) +
      E("a/work/0", 101) + B("a/work/0", 0, 0, 0, 440) + E("a/work/0", 450) +
      R(1000, 1200) + B("a/work/0", 0, 1, 6, 1100) + E("a/work/0", 1101) +
      R(1250, 2500) + B("a/work/0", 0, 0, 0, 2000) + E("a/work/0", 2001));
  std::vector<ValidityLapse> l = ValidityLapses(rec);
  ASSERT_EQ(l.size(), 2u);
  EXPECT_TRUE(l[0].fence());
  EXPECT_EQ(l[0].lapsed, 300);
  EXPECT_EQ(l[0].duration(), 150);
  EXPECT_FALSE(l[1].fence());
  EXPECT_EQ(l[1].lapsed, 1200);
  EXPECT_EQ(l[1].resumed, 1250);
  EXPECT_EQ(l[1].duration(), 50);
}

TEST(ChaosAnalyzerTest, IncidentsNameTheFaultsAroundThem) {
  PodRecord a = Rec(S("a", 1) + B("a/work/0", 0, 1, 1, 0) + E("a/work/0", 1),
                    /*death=*/1000);
  PodRecord b =
      Rec(S("b", 1) + B("b/work/0", 0, 1, 2, 900) + E("b/work/0", 901));
  OwnerCheck check = CheckOneOwner(All({a, b}, Cut::kRaw), 1);
  std::vector<FaultRecord> faults = {
      {.kind = "pod_kill", .target = "x", .start = 100, .end = 100},
      {.kind = "partition", .target = "a", .start = 700, .end = 850},
  };
  std::vector<Incident> inc = Incidents(check, faults, 100, 10);
  ASSERT_EQ(inc.size(), 1u);
  EXPECT_EQ(inc[0].from, 900);
  EXPECT_EQ(inc[0].to, 1000);
  EXPECT_EQ(inc[0].shards, (std::vector<uint32_t>{0}));
  EXPECT_EQ(inc[0].faults, (std::vector<size_t>{1}));
  EXPECT_FALSE(inc[0].faults_are_last_before);
  inc = Incidents(check, faults, 10, 10);
  EXPECT_EQ(inc[0].faults, (std::vector<size_t>{1}));
  EXPECT_TRUE(inc[0].faults_are_last_before);
}

TEST(ChaosAnalyzerTest, Quantiles) {
  EXPECT_EQ(Quantile({}, 0.5), 0);
  EXPECT_EQ(Quantile({5, 1, 3}, 0.5), 3);
  EXPECT_EQ(Quantile({5, 1, 3}, 0.0), 1);
  EXPECT_EQ(Quantile({5, 1, 3}, 1.0), 5);
  std::vector<int64_t> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(Quantile(v, 0.99), 99);
}

}  // namespace
}  // namespace setpoint::chaos
