// The PowerDNS example against real parts (PowerDnsFleet): a real
// pdns_server (sqlite backend), a real redis-server and three real pod
// processes of the example, on loopback. The zone read back through the
// API must equal the catalog exactly.
#include <signal.h>

#include <cstdio>
#include <set>
#include <string>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "powerdns_fleet.h"

namespace powerdns {
namespace {

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int kSlow = 2;  // Sanitized pods run slower (2x seen here).
#else
constexpr int kSlow = 1;
#endif
#else
constexpr int kSlow = 1;
#endif

std::string Ms(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

class PowerDnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status s = fleet_.Start();
    if (absl::IsNotFound(s) && !setpoint::testing::RedisRequired()) {
      GTEST_SKIP() << s;
    }
    ASSERT_TRUE(s.ok()) << s;
  }
  // Polls `done` for up to `limit` (longer when sanitized); false at once
  // when a pod ended by itself, which no wait would fix.
  bool Wait(const std::function<bool()>& done, absl::Duration limit) {
    bool ended = false;
    bool held = WaitFor(
        [&] {
          ended = !fleet_.Ended().empty();
          return ended || done();
        },
        limit * kSlow);
    return held && !ended;
  }
  // Progress on stderr (unbuffered): a test stopped by its timeout still
  // says how far it came.
  void Step(const char* what) {
    std::fprintf(stderr, "[%s] %s\n", Ms(absl::Now() - begin_).c_str(), what);
  }
  absl::Time begin_ = absl::Now();
  PowerDnsFleet fleet_{POWERDNS_POD};
};

TEST_F(PowerDnsTest,
       ConvergesTwoThousandRecordsFromEmptyThenFiveHundredChanges) {
  fleet_.WriteCatalog(2000, "10.0");
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(fleet_.StartPod(id));
  absl::Time start = absl::Now();
  ASSERT_TRUE(Wait([&] { return fleet_.AllReady(); }, absl::Seconds(30)))
      << fleet_.Logs();
  absl::Time ready = absl::Now();
  ASSERT_TRUE(Wait([&] { return fleet_.Converged(); }, absl::Seconds(60)))
      << fleet_.Logs();
  absl::Time done = absl::Now();
  double patches = fleet_.Sum("setpoint_syncer_batches_total");
  std::printf(
      "2000 records from an empty zone: %s after the pods started, %s after "
      "all were ready; %.0f PATCH calls (%.3f per record)\n",
      Ms(done - start).c_str(), Ms(done - ready).c_str(), patches,
      patches / 2000);
  EXPECT_GT(patches, 0);
  EXPECT_LE(patches / 2000, 0.3) << "the Syncer's batches: a PATCH for many";

  fleet_.WriteCatalog(2000, "10.0", 500, "10.9");
  absl::Time changed = absl::Now();
  ASSERT_TRUE(Wait([&] { return fleet_.Converged(); }, absl::Seconds(30)))
      << fleet_.Logs();
  double more = fleet_.Sum("setpoint_syncer_batches_total") - patches;
  std::printf("500 changed: %s, %.0f PATCH calls\n",
              Ms(absl::Now() - changed).c_str(), more);
  EXPECT_LE(more, 500 * 0.3);
  auto zone = fleet_.Zone();
  auto want = fleet_.Catalog();
  ASSERT_TRUE(zone.ok() && want.ok());
  EXPECT_EQ(zone->size(), 2000u);
  EXPECT_TRUE(*zone == *want);
  EXPECT_TRUE(fleet_.StopPods()) << fleet_.Logs();
}

TEST_F(PowerDnsTest, AnOutageAndAKilledPodLoseNothingAndEndExact) {
  fleet_.WriteCatalog(2000, "10.0");
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(fleet_.StartPod(id));
  Step("pods started");
  ASSERT_TRUE(Wait([&] { return fleet_.Converged(); }, absl::Seconds(45)))
      << fleet_.Logs();
  Step("converged on 2000");

  // Mid-sync: 500 records change and 300 are added; once some of it is in
  // the zone, pod c dies (SIGKILL) and PowerDNS goes down for 10 s, during
  // which 100 more change.
  fleet_.WriteCatalog(2300, "10.0", 500, "10.7");
  ASSERT_TRUE(Wait(
      [&] {
        auto zone = fleet_.Zone();
        return zone.ok() && zone->size() > 2000;
      },
      absl::Seconds(20)))
      << fleet_.Logs();
  Step("the change is in the zone in part");
  fleet_.KillPod("c");
  Step("pod c killed");
  double before = fleet_.Sum("setpoint_syncer_batches_total");
  fleet_.pdns().Stop();
  Step("PowerDNS stopped");
  // 100 more changes, so the pods left have writes to make during the
  // outage (on a loaded machine they may have finished theirs before it,
  // and c's ranges wait for a listing PowerDNS cannot answer).
  fleet_.WriteCatalog(2300, "10.0", 600, "10.7");
  absl::Time down_until = absl::Now() + absl::Seconds(10);
  bool paused = false;
  while (absl::Now() < down_until) {  // The outage itself lasts 10 s.
    paused = paused || fleet_.Sum("setpoint_syncer_paused") > 0;
    absl::SleepFor(absl::Milliseconds(250));
  }
  double during = fleet_.Sum("setpoint_syncer_batches_total") - before;
  absl::Status started = fleet_.pdns().Start();
  ASSERT_TRUE(started.ok()) << started;
  Step("PowerDNS started again");
  std::printf("PowerDNS down 10 s: %.0f batch calls by the 2 pods left\n",
              during);
  EXPECT_TRUE(paused) << "the syncers pause while PowerDNS is down";
  // 4 nodes: the failures before the pause, then a probe at most every
  // 250 ms.
  EXPECT_LE(during, 4 * (8 + 40 + 2));

  // Back: a record the catalog holds and the zone had never goes away.
  auto want = fleet_.Catalog();
  ASSERT_TRUE(want.ok());
  std::set<std::string> held;
  bool lost = false;
  ASSERT_TRUE(Wait(
      [&] {
        auto zone = fleet_.Zone();
        if (!zone.ok()) return false;
        for (const std::string& k : held) lost = lost || !zone->contains(k);
        for (const auto& [k, v] : *zone) {
          if (want->contains(k)) held.insert(k);
        }
        return *zone == *want;
      },
      absl::Seconds(45)))
      << fleet_.Logs();
  Step("converged on 2300");
  EXPECT_FALSE(lost) << "a record of the catalog was deleted";
  auto zone = fleet_.Zone();
  ASSERT_TRUE(zone.ok());
  EXPECT_EQ(zone->size(), 2300u);
  EXPECT_TRUE(*zone == *want);
}

TEST_F(PowerDnsTest, ABadCatalogOrMissingFlagIsABadConfiguration) {
  setpoint::testing::ChildProcess missing({POWERDNS_POD, "--zone=a."});
  EXPECT_EQ(missing.AwaitExit(), 2);
  EXPECT_NE(missing.err().find("--api"), std::string::npos) << missing.err();
  setpoint::testing::ChildProcess bad_zone({POWERDNS_POD, "--zone=a"});
  EXPECT_EQ(bad_zone.AwaitExit(), 2);
  EXPECT_NE(bad_zone.err().find("dot"), std::string::npos) << bad_zone.err();
}

}  // namespace
}  // namespace powerdns
