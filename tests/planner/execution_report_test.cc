#include "setpoint/planner/execution_report.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace setpoint {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ExecutionReport Sample() {
  ExecutionReport r;
  r.plan = "cucumber";
  r.execution_id = 7;
  r.status = absl::UnavailableError("dns \"zone\"\n503");
  r.rounds = 1;
  r.steps_run = 2;
  r.steps_failed = 1;
  r.steps_not_run = 1;
  r.started = absl::FromUnixSeconds(0);
  r.duration = absl::Milliseconds(12);
  r.steps.push_back({.id = 0,
                     .parent = -1,
                     .round = 1,
                     .name = "reconcile nodes",
                     .outcome = StepOutcome::kSucceeded,
                     .status = {},
                     .attempts = 1,
                     .start = absl::ZeroDuration(),
                     .duration = absl::Milliseconds(2)});
  r.steps.push_back({.id = 1,
                     .parent = 0,
                     .round = 1,
                     .name = "update \"dns\"",
                     .outcome = StepOutcome::kFailed,
                     .status = absl::UnavailableError("503"),
                     .attempts = 3,
                     .start = absl::Milliseconds(2),
                     .duration = absl::Milliseconds(9)});
  r.steps.push_back({.id = 2,
                     .parent = 0,
                     .round = 1,
                     .name = "tag",
                     .outcome = StepOutcome::kNotRun});
  return r;
}

TEST(ExecutionReport, SummaryIsOneLineWithTheCounters) {
  std::string s = Sample().Summary();
  EXPECT_THAT(s,
              HasSubstr("plan=cucumber execution=7 status=UNAVAILABLE rounds=1 "
                        "steps=2 failed=1 not_run=1 retries=0 duration=12ms"));
}

TEST(ExecutionReport, JsonEscapesAndKeepsTheTree) {
  std::string j = Sample().ToJson();
  EXPECT_THAT(j, HasSubstr("\"plan\":\"cucumber\""));
  EXPECT_THAT(j, HasSubstr("\"ok\":false"));
  EXPECT_THAT(j, HasSubstr("\"code\":\"UNAVAILABLE\""));
  EXPECT_THAT(j, HasSubstr("\"message\":\"dns \\\"zone\\\"\\n503\""));
  EXPECT_THAT(
      j,
      HasSubstr(
          "{\"id\":1,\"parent\":0,\"round\":1,\"name\":\"update \\\"dns\\\"\","
          "\"outcome\":\"failed\",\"error\":\"UNAVAILABLE: 503\","
          "\"attempts\":3,\"start_ms\":2.000,\"duration_ms\":9.000}"));
  EXPECT_THAT(j, HasSubstr("\"outcome\":\"not_run\""));
  EXPECT_THAT(j, Not(HasSubstr("\n")));
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(j.back(), '}');
}

TEST(ExecutionReport, DotDrawsEdgesFromParentsAndRounds) {
  std::string d = Sample().ToDot();
  EXPECT_THAT(d, HasSubstr("digraph execution {"));
  EXPECT_THAT(d, HasSubstr("round1 -> s0;"));
  EXPECT_THAT(d, HasSubstr("s0 -> s1;"));
  EXPECT_THAT(d, HasSubstr("s0 -> s2;"));
  EXPECT_THAT(
      d,
      HasSubstr(
          "label=\"update \\\"dns\\\"\\nUNAVAILABLE: 503\", fillcolor=salmon"));
  EXPECT_THAT(d, HasSubstr("(not run)"));
}

TEST(ExecutionReport, OutcomeNames) {
  EXPECT_EQ(StepOutcomeName(StepOutcome::kSucceeded), "succeeded");
  EXPECT_EQ(StepOutcomeName(StepOutcome::kFailed), "failed");
  EXPECT_EQ(StepOutcomeName(StepOutcome::kNotRun), "not_run");
}

}  // namespace
}  // namespace setpoint
