#include "setpoint/processor/internal/sync_rules.h"

#include <algorithm>
#include <optional>

#include "setpoint/base/status.h"

namespace setpoint {

const char* SyncOpName(SyncOp op) {
  switch (op) {
    case SyncOp::kCreate:
      return "create";
    case SyncOp::kUpdate:
      return "update";
    case SyncOp::kDelete:
      return "delete";
    case SyncOp::kNone:
      break;
  }
  return "none";
}

namespace internal {

int64_t ToNanos(absl::Time t) {
  if (t == absl::InfinitePast()) return kPast;
  if (t == absl::InfiniteFuture()) return kFuture;
  return absl::ToUnixNanos(t);
}

absl::Time FromNanos(int64_t ns) {
  if (ns == kPast) return absl::InfinitePast();
  if (ns == kFuture) return absl::InfiniteFuture();
  return absl::FromUnixNanos(ns);
}

int64_t AddNanos(int64_t a, int64_t b) {
  if (a == kPast || a == kFuture) return a;
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return b > 0 ? kFuture : kPast;
  return out;
}

bool KeyRules::Enabled(SyncOp op) const {
  switch (op) {
    case SyncOp::kCreate:
      return create;
    case SyncOp::kUpdate:
      return update;
    case SyncOp::kDelete:
      return delete_;
    case SyncOp::kNone:
      break;
  }
  return false;
}

SyncOp ComputeOp(bool has_desired, bool has_observed, bool differ) {
  if (has_desired) {
    if (!has_observed) return SyncOp::kCreate;
    return differ ? SyncOp::kUpdate : SyncOp::kNone;
  }
  return has_observed ? SyncOp::kDelete : SyncOp::kNone;
}

namespace {

// The moment a pending key may start: after its backoff and its delay.
int64_t StartTime(const KeyState& s, const KeyRules& rules) {
  return std::max(s.not_before,
                  AddNanos(s.pending_since, rules.execution_delay));
}

void ClearFailures(KeyState& s) {
  s.failures = 0;
  s.terminal = false;
  s.stale = false;
  s.last_error = absl::OkStatus();
  s.not_before = kPast;
}

}  // namespace

Decision Evaluate(KeyState& s, SyncOp op, bool has_observed, int64_t now,
                  bool in_sync, const KeyRules& rules) {
  if (s.in_flight != SyncOp::kNone) return {Next::kIdle};  // Its result.
  if (AwaitingObservation(s, has_observed, now)) {
    return {Next::kExpect, s.expect_until};
  }
  if (op == SyncOp::kNone) {
    // In sync with the world: whatever failed before is moot.
    ClearFailures(s);
    s.pending_since = kFuture;
    s.unconverged_since = kFuture;
    return {Next::kConverged};
  }
  if (s.unconverged_since == kFuture) s.unconverged_since = now;
  if (s.stale) return {Next::kIdle};  // Waits for new call values.
  if (s.terminal) {
    if (s.terminal_version == s.desired_version &&
        s.terminal_observed_seq == s.observed_seq) {
      return {Next::kIdle};  // Waits for a change of the key.
    }
    s.terminal = false;
    s.failures = 0;
    s.not_before = kPast;
  }
  if (!in_sync || !rules.Enabled(op)) return {Next::kIdle};
  if (s.pending_since == kFuture) s.pending_since = now;
  const int64_t start = StartTime(s, rules);
  if (start > now) return {Next::kWait, start};
  return {Next::kReady};
}

bool StillReady(const KeyState& s, SyncOp op, int64_t now,
                const KeyRules& rules) {
  return op != SyncOp::kNone && rules.Enabled(op) &&
         s.in_flight == SyncOp::kNone && !s.stale && !s.terminal &&
         s.expect_op == SyncOp::kNone && StartTime(s, rules) <= now;
}

bool HasCode(const std::vector<absl::StatusCode>& codes,
             absl::StatusCode code) {
  return std::find(codes.begin(), codes.end(), code) != codes.end();
}

ResultEffect ApplyResult(KeyState& s, const CallReport& r,
                         const ResultRules& rules, int64_t now, double jitter) {
  const absl::Status& status = *r.status;
  s.in_flight = SyncOp::kNone;
  ResultEffect effect;
  if (r.epoch != s.epoch || !rules.selected) {
    // A stale writer's refusal that came back after the key left (a pod
    // that froze and thawed) is still a refusal operators must see.
    effect.outcome = Outcome::kDiscarded;
    effect.stale_refusal = r.started && IsStaleOwner(status);
    return effect;
  }
  if (!r.started) {
    // Handed over, never started: the intent is still pending. A call a
    // fence refused before the re-scope caught up is worked out later.
    s.last_error = status;
    effect.outcome = Outcome::kNotStarted;
    effect.retry_in = rules.backoff->initial;
    return effect;
  }
  if (r.requeue && !status.ok() && !IsStaleOwner(status)) {
    s.last_error = status;
    effect.outcome = Outcome::kRequeued;
    return effect;
  }
  if (IsStaleOwner(status)) {
    effect.stale_refusal = true;
    if (r.values_version != rules.values_version) {
      // Refused under values replaced since: that says nothing of the new
      // ones, under which the key is tried again now.
      effect.outcome = Outcome::kStaleOld;
      return effect;
    }
    // The system saw a newer owner's token: not ours to retry under this
    // assignment; new call values let the key try again.
    s.stale = true;
    s.last_error = status;
    if (s.failures < UINT16_MAX) ++s.failures;
    effect.outcome = Outcome::kStale;
    return effect;
  }
  if (status.ok()) {
    ClearFailures(s);
    s.expect_op = r.op;
    s.expect_observed_seq = r.observed_seq;
    s.expect_until = AddNanos(now, rules.expectation_timeout);
    effect.outcome = Outcome::kSuccess;
    return effect;
  }
  if (s.failures < UINT16_MAX) ++s.failures;
  s.last_error = status;
  if (HasCode(*rules.terminal_codes, status.code())) {
    s.terminal = true;
    s.terminal_version = r.desired_version;
    s.terminal_observed_seq = r.observed_seq;
    effect.outcome = Outcome::kTerminal;
    return effect;
  }
  std::optional<absl::Duration> hint = RetryAfterHint(status);
  effect.retry_in = hint.has_value()
                        ? *hint
                        : BackoffDelay(*rules.backoff, s.failures - 1, jitter);
  s.not_before = AddNanos(now, absl::ToInt64Nanoseconds(effect.retry_in));
  effect.outcome = Outcome::kRetry;
  return effect;
}

WorldPause::Change WorldPause::OnResult(const PauseRules& rules, bool answered,
                                        uint64_t key_hash, bool was_probe,
                                        int64_t now, double jitter,
                                        const absl::Status& status) {
  if (was_probe) probe_in_flight_ = false;
  if (answered) {
    streak_ = 0;
    streak_keys_ = 0;
    if (!paused_) return Change::kNone;
    paused_ = false;
    probe_failures_ = 0;
    paused_since_ = kFuture;
    return Change::kResumed;
  }
  if (paused_) {
    last_error_ = status;
    if (was_probe) {
      next_probe_ = AddNanos(now, absl::ToInt64Nanoseconds(BackoffDelay(
                                      rules.probe, probe_failures_, jitter)));
      ++probe_failures_;
    }
    return Change::kNone;
  }
  if (streak_ == 0 || key_hash != last_key_) ++streak_keys_;
  last_key_ = key_hash;
  ++streak_;
  if (rules.after <= 0 || streak_ < rules.after || streak_keys_ < 2) {
    return Change::kNone;
  }
  paused_ = true;
  paused_since_ = now;
  last_error_ = status;
  probe_failures_ = 1;
  next_probe_ = AddNanos(
      now, absl::ToInt64Nanoseconds(BackoffDelay(rules.probe, 0, jitter)));
  streak_ = 0;
  streak_keys_ = 0;
  return Change::kPaused;
}

void WorldPause::Clear() {
  paused_ = false;
  probe_in_flight_ = false;
  streak_ = 0;
  streak_keys_ = 0;
  probe_failures_ = 0;
  paused_since_ = kFuture;
}

bool WorldPause::ProbeDue(int64_t now) const {
  return paused_ && !probe_in_flight_ && now >= next_probe_;
}

void WorldPause::ProbeStarted() {
  probe_in_flight_ = true;
  ++probes_;
}

int64_t WorldPause::next_probe() const {
  return probe_in_flight_ ? kFuture : next_probe_;
}

}  // namespace internal
}  // namespace setpoint
