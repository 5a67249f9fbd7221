// The Syncer's rules as pure functions: no threads, no clock, no syncer.
#include "setpoint/processor/internal/sync_rules.h"

#include <vector>

#include "gtest/gtest.h"
#include "setpoint/base/status.h"

namespace setpoint::internal {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
const KeyRules kRules{};
const std::vector<absl::StatusCode> kTerminal = TerminalErrorCodes();
const BackoffOptions kBackoff{.initial = absl::Seconds(1),
                              .max = absl::Seconds(8),
                              .multiplier = 2,
                              .jitter = 0};

ResultRules Rules(const KeyState& s) {
  return ResultRules{.epoch = s.epoch,
                     .selected = true,
                     .values_version = 1,
                     .terminal_codes = &kTerminal,
                     .backoff = &kBackoff,
                     .expectation_timeout = 30 * kSecond};
}

CallReport Report(SyncOp op, const absl::Status* status) {
  return CallReport{
      .op = op, .status = status, .started = true, .values_version = 1};
}

TEST(ComputeOpTest, FromWhatIsDesiredAndObserved) {
  EXPECT_EQ(ComputeOp(true, false, false), SyncOp::kCreate);
  EXPECT_EQ(ComputeOp(true, true, true), SyncOp::kUpdate);
  EXPECT_EQ(ComputeOp(true, true, false), SyncOp::kNone);
  EXPECT_EQ(ComputeOp(false, true, false), SyncOp::kDelete);
  EXPECT_EQ(ComputeOp(false, false, false), SyncOp::kNone);
}

TEST(EvaluateTest, ReadyWhenInSyncAndNothingWaits) {
  KeyState s;
  EXPECT_EQ(Evaluate(s, SyncOp::kCreate, false, 10, true, kRules).next,
            Next::kReady);
  EXPECT_EQ(s.pending_since, 10);
  EXPECT_EQ(s.unconverged_since, 10);
}

TEST(EvaluateTest, OutOfSyncDisabledOrInFlightKeysWait) {
  KeyState s;
  EXPECT_EQ(Evaluate(s, SyncOp::kCreate, false, 10, false, kRules).next,
            Next::kIdle);
  KeyRules no_create = kRules;
  no_create.create = false;
  EXPECT_EQ(Evaluate(s, SyncOp::kCreate, false, 10, true, no_create).next,
            Next::kIdle);
  s.in_flight = SyncOp::kUpdate;
  EXPECT_EQ(Evaluate(s, SyncOp::kCreate, false, 10, true, kRules).next,
            Next::kIdle);
}

TEST(EvaluateTest, ExecutionDelayAndBackoffAreWaits) {
  KeyRules delayed = kRules;
  delayed.execution_delay = 5;
  KeyState s;
  Decision d = Evaluate(s, SyncOp::kCreate, false, 100, true, delayed);
  EXPECT_EQ(d.next, Next::kWait);
  EXPECT_EQ(d.until, 105);
  EXPECT_EQ(Evaluate(s, SyncOp::kCreate, false, 105, true, delayed).next,
            Next::kReady);
  s.not_before = 200;
  d = Evaluate(s, SyncOp::kCreate, false, 150, true, delayed);
  EXPECT_EQ(d.next, Next::kWait);
  EXPECT_EQ(d.until, 200);
}

TEST(EvaluateTest, AConvergedKeyForgetsItsFailures) {
  KeyState s;
  s.failures = 3;
  s.terminal = true;
  s.last_error = absl::InternalError("x");
  s.not_before = 1000;
  EXPECT_EQ(Evaluate(s, SyncOp::kNone, true, 10, true, kRules).next,
            Next::kConverged);
  EXPECT_EQ(s.failures, 0);
  EXPECT_FALSE(s.terminal);
  EXPECT_TRUE(s.last_error.ok());
  EXPECT_EQ(s.not_before, kPast);
}

TEST(EvaluateTest, ASuccessWaitsForItsObservationOrTheTimeout) {
  KeyState s;
  const absl::Status ok = absl::OkStatus();
  ApplyResult(s, Report(SyncOp::kCreate, &ok), Rules(s), 0, 0);
  Decision d = Evaluate(s, SyncOp::kCreate, false, 1, true, kRules);
  EXPECT_EQ(d.next, Next::kExpect);
  EXPECT_EQ(d.until, 30 * kSecond);
  // Seen: a new observation with a value.
  ++s.observed_seq;
  EXPECT_EQ(Evaluate(s, SyncOp::kNone, true, 2, true, kRules).next,
            Next::kConverged);
  // Not seen, but the timeout passed: worked out again.
  ApplyResult(s, Report(SyncOp::kUpdate, &ok), Rules(s), 10, 0);
  EXPECT_EQ(
      Evaluate(s, SyncOp::kUpdate, true, 10 + 30 * kSecond, true, kRules).next,
      Next::kReady);
}

TEST(EvaluateTest, TerminalWaitsForAChangeOfTheKey) {
  KeyState s;
  const absl::Status bad = absl::InvalidArgumentError("bad");
  ResultEffect e =
      ApplyResult(s, Report(SyncOp::kCreate, &bad), Rules(s), 0, 0);
  EXPECT_EQ(e.outcome, Outcome::kTerminal);
  EXPECT_EQ(Evaluate(s, SyncOp::kCreate, false, 1, true, kRules).next,
            Next::kIdle);
  ++s.desired_version;
  EXPECT_EQ(Evaluate(s, SyncOp::kCreate, false, 2, true, kRules).next,
            Next::kReady);
  EXPECT_FALSE(s.terminal);
}

TEST(ApplyResultTest, RetriesBackOffPerKeyAndHonourHints) {
  KeyState s;
  const absl::Status down = absl::UnavailableError("down");
  std::vector<absl::Duration> delays;
  for (int i = 0; i < 5; ++i) {
    s.in_flight = SyncOp::kCreate;
    ResultEffect e =
        ApplyResult(s, Report(SyncOp::kCreate, &down), Rules(s), 0, 0);
    EXPECT_EQ(e.outcome, Outcome::kRetry);
    delays.push_back(e.retry_in);
  }
  EXPECT_EQ(delays, (std::vector<absl::Duration>{
                        absl::Seconds(1), absl::Seconds(2), absl::Seconds(4),
                        absl::Seconds(8), absl::Seconds(8)}));
  EXPECT_EQ(s.failures, 5);
  const absl::Status hint =
      WithRetryAfter(absl::UnavailableError("busy"), absl::Seconds(42));
  ResultEffect e =
      ApplyResult(s, Report(SyncOp::kCreate, &hint), Rules(s), 7, 0);
  EXPECT_EQ(e.retry_in, absl::Seconds(42));
  EXPECT_EQ(s.not_before, 7 + 42 * kSecond);
}

TEST(ApplyResultTest, StaleRefusalsWaitForNewValuesUnlessAlreadyReplaced) {
  KeyState s;
  const absl::Status stale = StaleOwnerError("old token");
  ResultEffect e =
      ApplyResult(s, Report(SyncOp::kUpdate, &stale), Rules(s), 0, 0);
  EXPECT_EQ(e.outcome, Outcome::kStale);
  EXPECT_TRUE(e.stale_refusal);
  EXPECT_TRUE(s.stale);
  KeyState t;
  CallReport r = Report(SyncOp::kUpdate, &stale);
  r.values_version = 0;  // Replaced since.
  e = ApplyResult(t, r, Rules(t), 0, 0);
  EXPECT_EQ(e.outcome, Outcome::kStaleOld);
  EXPECT_TRUE(e.stale_refusal);
  EXPECT_FALSE(t.stale);
}

TEST(ApplyResultTest, DiscardedNotStartedAndRequeuedCountNoFailure) {
  KeyState s;
  s.epoch = 2;
  const absl::Status down = absl::UnavailableError("down");
  CallReport old = Report(SyncOp::kCreate, &down);
  old.epoch = 1;
  EXPECT_EQ(ApplyResult(s, old, Rules(s), 0, 0).outcome, Outcome::kDiscarded);
  CallReport never = Report(SyncOp::kCreate, &down);
  never.started = false;
  never.epoch = 2;
  EXPECT_EQ(ApplyResult(s, never, Rules(s), 0, 0).outcome,
            Outcome::kNotStarted);
  CallReport requeue = Report(SyncOp::kCreate, &down);
  requeue.requeue = true;
  requeue.epoch = 2;
  EXPECT_EQ(ApplyResult(s, requeue, Rules(s), 0, 0).outcome,
            Outcome::kRequeued);
  EXPECT_EQ(s.failures, 0);
  EXPECT_EQ(s.not_before, kPast);
  // A requeued operation that succeeded is a success.
  const absl::Status ok = absl::OkStatus();
  CallReport done = Report(SyncOp::kCreate, &ok);
  done.requeue = true;
  done.epoch = 2;
  EXPECT_EQ(ApplyResult(s, done, Rules(s), 0, 0).outcome, Outcome::kSuccess);
}

PauseRules Pause(int after) {
  return PauseRules{.after = after,
                    .probe = {.initial = absl::Milliseconds(250),
                              .max = absl::Seconds(1),
                              .multiplier = 2,
                              .jitter = 0}};
}

TEST(WorldPauseTest, PausesAfterUnreachableResultsInARowFromSeveralKeys) {
  WorldPause p;
  const PauseRules rules = Pause(3);
  const absl::Status down = absl::UnavailableError("down");
  // One key alone never pauses.
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(p.OnResult(rules, false, 7, false, i, 0, down),
              WorldPause::Change::kNone);
  }
  // An answer ends the streak.
  p.OnResult(rules, true, 0, false, 10, 0, absl::OkStatus());
  EXPECT_EQ(p.OnResult(rules, false, 1, false, 11, 0, down),
            WorldPause::Change::kNone);
  EXPECT_EQ(p.OnResult(rules, false, 2, false, 12, 0, down),
            WorldPause::Change::kNone);
  EXPECT_EQ(p.OnResult(rules, false, 3, false, 13, 0, down),
            WorldPause::Change::kPaused);
  EXPECT_TRUE(p.paused());
  EXPECT_EQ(p.paused_since(), 13);
  EXPECT_EQ(p.last_error().message(), "down");
}

TEST(WorldPauseTest, ProbesOneAtATimeBackingOffToTheCapUntilAnAnswer) {
  WorldPause p;
  const PauseRules rules = Pause(2);
  const absl::Status down = absl::UnavailableError("down");
  p.OnResult(rules, false, 1, false, 0, 0, down);
  p.OnResult(rules, false, 2, false, 0, 0, down);
  ASSERT_TRUE(p.paused());
  std::vector<int64_t> gaps;
  int64_t now = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(p.ProbeDue(now));
    gaps.push_back(p.next_probe() - now);
    now = p.next_probe();
    ASSERT_TRUE(p.ProbeDue(now));
    p.ProbeStarted();
    EXPECT_FALSE(p.ProbeDue(now + 10 * kSecond)) << "two probes at once";
    p.OnResult(rules, false, 1, true, now, 0, down);
  }
  EXPECT_EQ(gaps, (std::vector<int64_t>{250'000'000, 500'000'000, 1'000'000'000,
                                        1'000'000'000, 1'000'000'000}));
  EXPECT_EQ(p.probes(), 5);
  p.ProbeStarted();
  EXPECT_EQ(p.OnResult(rules, true, 0, true, now, 0, absl::OkStatus()),
            WorldPause::Change::kResumed);
  EXPECT_FALSE(p.paused());
}

TEST(WorldPauseTest, AnAbandonedProbeLetsTheNextOneGo) {
  WorldPause p;
  const PauseRules rules = Pause(2);
  const absl::Status down = absl::UnavailableError("down");
  p.OnResult(rules, false, 1, false, 0, 0, down);
  p.OnResult(rules, false, 2, false, 0, 0, down);
  const int64_t at = p.next_probe();
  p.ProbeStarted();
  EXPECT_FALSE(p.ProbeDue(at));
  p.ProbeAbandoned();
  EXPECT_TRUE(p.ProbeDue(at));
}

TEST(NanosTest, InfinitiesAndSaturation) {
  EXPECT_EQ(ToNanos(absl::InfinitePast()), kPast);
  EXPECT_EQ(ToNanos(absl::InfiniteFuture()), kFuture);
  EXPECT_EQ(FromNanos(kFuture), absl::InfiniteFuture());
  EXPECT_EQ(AddNanos(kFuture, -5), kFuture);
  EXPECT_EQ(AddNanos(kFuture - 1, 10), kFuture);
  EXPECT_EQ(AddNanos(5, 10), 15);
}

}  // namespace
}  // namespace setpoint::internal
