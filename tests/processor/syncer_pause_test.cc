// The Syncer while the world is down: writes pause to one probe at a time,
// no key's failures grow, and everything converges soon after the world is
// back. And the default backoff's cap.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "processor/syncer_rig.h"
#include "setpoint/base/metrics.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/testing/metrics_snapshot.h"
#include "setpoint/testing/status_matchers.h"
#include "spdlog/logger.h"
#include "spdlog/sinks/ringbuffer_sink.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::SyncerRig;
using ::testing::Le;

std::string Key(int i) { return absl::StrCat("rec-", i); }

// A logger that keeps its lines, for counting warnings.
struct Lines {
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink =
      std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(1000);
  std::shared_ptr<spdlog::logger> logger =
      std::make_shared<spdlog::logger>("t", sink);
  int Count(const std::string& text) const {
    int n = 0;
    for (const std::string& line : sink->last_formatted()) {
      if (line.find(text) != std::string::npos) ++n;
    }
    return n;
  }
};

class SyncerPauseTest : public ::testing::TestWithParam<bool> {};

// The target: an API down for 10 s gets at most about one call per
// second per syncer while down, and everything converges within 1 s of its
// return.
TEST_P(SyncerPauseTest, AWorldDownForTenSecondsGetsAboutOneCallASecond) {
  const bool batch = GetParam();
  Lines lines;
  SyncerRig rig({.batch = batch, .logger = lines.logger});
  ASSERT_THAT(rig.Start(), IsOk());
  for (int i = 0; i < 200; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Seconds(1));
  ASSERT_TRUE(rig.Converged(200));
  auto calls = [&] {
    return batch ? rig.batch().stats().batches : rig.world().stats().calls;
  };

  // Down: every call is refused as unreachable. 200 changes wait.
  rig.world().SetFailureRate(1.0, absl::UnavailableError("connection refused"));
  for (int i = 0; i < 200; ++i) rig.SetDesired(Key(i), i + 1000);
  rig.Advance(absl::Seconds(1));
  SyncerStatus<std::string> paused = rig.Status();
  ASSERT_TRUE(paused.paused);
  EXPECT_EQ(paused.pause_error.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(rig.syncer().stats().pauses, 1);
  const int64_t at_pause = calls();
  // Before the pause: the operations in flight when the world went down.
  EXPECT_THAT(at_pause - (batch ? 2 : 200), Le(batch ? 5 : 70));
  std::vector<int> failures_at_pause;
  for (const auto& f : rig.syncer().StatusSnapshot(1000).failures) {
    failures_at_pause.push_back(f.failures);
  }

  rig.Advance(absl::Seconds(9));
  const int64_t while_down = calls() - at_pause;
  EXPECT_GE(while_down, 5) << "no probes";
  EXPECT_THAT(while_down, Le(12)) << "more than about one call a second";
  // No key's failures grew while paused.
  std::vector<int> failures_at_end;
  for (const auto& f : rig.syncer().StatusSnapshot(1000).failures) {
    failures_at_end.push_back(f.failures);
  }
  EXPECT_EQ(failures_at_end, failures_at_pause);
  EXPECT_EQ(lines.Count("syncer paused"), 1) << "one warning";

  // Back: converged within 1 s.
  rig.world().SetFailureRate(0);
  auto took =
      rig.AdvanceUntil([&] { return rig.Converged(200); }, absl::Seconds(5));
  ASSERT_TRUE(took.has_value());
  EXPECT_THAT(*took, Le(absl::Seconds(1)));
  EXPECT_FALSE(rig.Status().paused);
  EXPECT_EQ(rig.world().Get(Key(7)), 1007);
  EXPECT_EQ(lines.Count("syncer resumed"), 1);
}

INSTANTIATE_TEST_SUITE_P(PerKeyAndBatch, SyncerPauseTest, ::testing::Bool());

TEST(SyncerPauseOnlyTest, ErrorsFromAWorldThatAnswersDoNotPause) {
  SyncerRig rig;
  ASSERT_THAT(rig.Start(), IsOk());
  // A busy API answering 500: per-key backoff, no pause.
  rig.world().SetFailureRate(1.0, absl::InternalError("500"));
  for (int i = 0; i < 50; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Seconds(2));
  EXPECT_FALSE(rig.Status().paused);
  EXPECT_EQ(rig.syncer().stats().pauses, 0);
  // One key timing out alone does not pause either.
  rig.world().SetFailureRate(0);
  rig.Advance(absl::Seconds(40));
  ASSERT_TRUE(rig.Converged(50));
  rig.world().FailNextFor(Key(0), 20, absl::DeadlineExceededError("slow"));
  rig.SetDesired(Key(0), 100);
  rig.Advance(absl::Seconds(60));
  EXPECT_EQ(rig.syncer().stats().pauses, 0);
}

TEST(SyncerPauseOnlyTest, PauseAfterZeroNeverPauses) {
  SyncerRig rig({.options = {.pause_after = 0}});
  ASSERT_THAT(rig.Start(), IsOk());
  rig.world().SetFailureRate(1.0, absl::UnavailableError("down"));
  for (int i = 0; i < 50; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Seconds(5));
  EXPECT_FALSE(rig.Status().paused);
  EXPECT_GT(rig.world().stats().calls, 100);
}

TEST(SyncerPauseOnlyTest, ThePauseShowsInTheMetrics) {
  MetricsRegistry metrics;
  SyncerRig rig({.options = {.name = "records", .metrics = &metrics}});
  ASSERT_THAT(rig.Start(), IsOk());
  rig.world().SetFailureRate(1.0, absl::UnavailableError("down"));
  for (int i = 0; i < 20; ++i) rig.SetDesired(Key(i), i);
  rig.Advance(absl::Seconds(3));
  rig.syncer().PublishStatusMetrics();
  testing::MetricsSnapshot m(metrics);
  EXPECT_EQ(m.Value("setpoint_syncer_paused", {{"syncer", "records"}}), 1);
  EXPECT_EQ(m.Value("setpoint_syncer_pauses_total", {{"syncer", "records"}}),
            1);
  EXPECT_GE(m.Value("setpoint_syncer_probes_total", {{"syncer", "records"}}),
            2);
}

// The default per-key backoff is capped at 30 s.
TEST(SyncerBackoffTest, TheDefaultCapIsThirtySeconds) {
  SyncerRig rig;
  ASSERT_THAT(rig.Start(), IsOk());
  rig.world().FailNextFor(Key(0), 1000, absl::InternalError("always"));
  rig.SetDesired(Key(0), 1);
  absl::Duration longest = absl::ZeroDuration();
  for (int i = 0; i < 40; ++i) {
    rig.Advance(absl::Seconds(31));
    SyncerStatus<std::string> s = rig.Status();
    ASSERT_EQ(s.failures.size(), 1u);
    longest = std::max(longest, s.failures[0].next_attempt - rig.clock().Now());
  }
  EXPECT_THAT(longest, Le(absl::Seconds(30)));
  EXPECT_GT(longest, absl::Seconds(20));  // It did grow to the cap.
  EXPECT_GE(rig.world().CallsFor(Key(0)), 40);
}

}  // namespace
}  // namespace setpoint
