// The Syncer's rules, as pure functions of one key's state, the time and
// the options: what to do with a key now (Evaluate), what a call's result
// does to it (ApplyResult), and when the whole syncer pauses because the
// world is down (WorldPause). No threads, no clock, no keys or values: the
// Syncer keeps those and asks these functions; tests drive them directly.
//
// Times are Unix nanoseconds (kPast and kFuture stand for the infinite
// past and future), so a key's state stays small.
//
// Thread safety: plain values and functions; the Syncer calls them on its
// runner.
#ifndef SETPOINT_PROCESSOR_INTERNAL_SYNC_RULES_H_
#define SETPOINT_PROCESSOR_INTERNAL_SYNC_RULES_H_

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/processor/sync_types.h"

namespace setpoint::internal {

inline constexpr int64_t kPast = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kFuture = std::numeric_limits<int64_t>::max();
// No slot (the end of a list of slots).
inline constexpr uint32_t kNoSlot = std::numeric_limits<uint32_t>::max();

// absl::Time <-> Unix nanoseconds, infinities included.
int64_t ToNanos(absl::Time t);
absl::Time FromNanos(int64_t ns);
// a + b without overflow past kPast / kFuture.
int64_t AddNanos(int64_t a, int64_t b);

// What the Syncer knows of one key besides its key and values.
struct KeyState {
  int64_t not_before = kPast;           // Backoff or retry-after ends.
  int64_t pending_since = kFuture;      // Needs work since (execution_delay).
  int64_t unconverged_since = kFuture;  // Has not matched since.
  int64_t expect_until = kPast;         // Read-your-own-writes wait ends.
  int64_t wake_at = kFuture;            // Due in the wake heap at this time.
  absl::Status last_error;
  uint32_t desired_version = 0;        // Counts changes of the desired value.
  uint32_t observed_seq = 0;           // Counts changes of the observed value.
  uint32_t expect_observed_seq = 0;    // observed_seq the success saw.
  uint32_t terminal_version = 0;       // desired_version of the terminal
  uint32_t terminal_observed_seq = 0;  // failure, and its observed_seq.
  uint32_t epoch = 0;  // Rescope generation the key was (re)joined in.
  // The expectation list: keys awaiting an observation, by expect_until.
  uint32_t expect_prev = kNoSlot;
  uint32_t expect_next = kNoSlot;
  uint16_t failures = 0;             // In a row (saturates).
  SyncOp in_flight = SyncOp::kNone;  // The operation handed over, if any.
  SyncOp expect_op = SyncOp::kNone;  // The success awaiting observation.
  bool terminal : 1 = false;         // Failed terminally: waits for a change.
  bool stale : 1 = false;   // Refused as a stale owner: waits for values.
  bool dirty : 1 = false;   // In the syncer's dirty list.
  bool queued : 1 = false;  // In the syncer's ready queue.
  bool expect_linked : 1 = false;  // In the expectation list.
};

// The options Evaluate reads.
struct KeyRules {
  int64_t execution_delay = 0;  // Nanoseconds.
  bool create = true;           // Operations enabled.
  bool update = true;
  bool delete_ = true;
  bool Enabled(SyncOp op) const;
};

// What to do with a key, by Evaluate.
enum class Next : uint8_t {
  kConverged,  // Nothing to do: the world matches. Erase it if empty.
  kIdle,       // Waits for an event: its result, a change of the key,
               // new call values, the syncer's sync or a switch.
  kExpect,     // Waits for its success to be observed, until `until`.
  kWait,       // Waits until `until` (backoff, execution_delay).
  kReady,      // Start `op` now.
};

struct Decision {
  Next next = Next::kIdle;
  int64_t until = kFuture;
};

// The operation that makes the world match: from which of the desired and
// observed values there are and whether they differ.
SyncOp ComputeOp(bool has_desired, bool has_observed, bool differ);

// True while the key's last success waits to be observed (until
// expect_until); ends the wait (clears expect_op) once it is seen or timed
// out. Evaluate starts with it; the Syncer calls it first on its hot path,
// before it computes the key's operation.
inline bool AwaitingObservation(KeyState& s, bool has_observed, int64_t now) {
  if (s.expect_op == SyncOp::kNone) return false;
  const bool seen =
      s.observed_seq != s.expect_observed_seq &&
      (s.expect_op == SyncOp::kDelete ? !has_observed : has_observed);
  if (!seen && now < s.expect_until) return true;
  s.expect_op = SyncOp::kNone;
  return false;
}

// Works the key out: its wait, or ready to start `op` (ComputeOp of its
// values). `in_sync`: the syncer's inputs are complete. Updates the
// bookkeeping that depends only on these inputs (clears the failures of a
// converged key, ends a satisfied expectation, starts the pending clocks).
Decision Evaluate(KeyState& s, SyncOp op, bool has_observed, int64_t now,
                  bool in_sync, const KeyRules& rules);

// A ready key may still start when the dispatcher reaches it: `op` is still
// its operation, enabled, nothing in flight and its wait is over.
bool StillReady(const KeyState& s, SyncOp op, int64_t now,
                const KeyRules& rules);

// What a finished (or never started) call says.
struct CallReport {
  SyncOp op = SyncOp::kNone;
  const absl::Status* status = nullptr;
  bool started = false;
  bool threw = false;
  // Not the key's own failure: it ran in a batch cancelled for another
  // key, or it failed while the syncer paused for a world that is down.
  bool requeue = false;
  uint32_t epoch = 0;           // The key's epoch when handed over.
  uint32_t values_version = 0;  // Call values it ran under.
  uint32_t desired_version = 0;
  uint32_t observed_seq = 0;
};

// The syncer's side of ApplyResult.
struct ResultRules {
  uint32_t epoch = 0;           // The key's epoch now.
  bool selected = true;         // The key is in the syncer's range.
  uint32_t values_version = 0;  // Call values now.
  bool stopped = false;         // The syncer stopped.
  const std::vector<absl::StatusCode>* terminal_codes = nullptr;
  const BackoffOptions* backoff = nullptr;
  int64_t expectation_timeout = 0;  // Nanoseconds.
};

// How ApplyResult classified a result.
enum class Outcome : uint8_t {
  kDiscarded,   // The key left the range meanwhile: nothing applies.
  kNotStarted,  // Never ran: the intent is still pending.
  kRequeued,    // Not the key's failure: tried again, nothing counted.
  kStaleOld,    // Refused as stale under call values replaced since.
  kStale,       // Refused as stale: waits for new call values.
  kSuccess,
  kTerminal,  // Not retried until the key changes.
  kRetry,     // Retried after `retry_in`.
};

struct ResultEffect {
  Outcome outcome = Outcome::kSuccess;
  absl::Duration retry_in = absl::ZeroDuration();  // kRetry, kNotStarted.
  bool stale_refusal = false;  // Count a stale refusal (kStale*, or a
                               // discarded one).
};

// Applies a call's result to the key: clears in_flight and sets failures,
// backoff, expectation, terminal and stale marks. `jitter` in [0, 1)
// spreads the backoff. The caller counts, logs and then Evaluates again
// (except after kDiscarded).
ResultEffect ApplyResult(KeyState& s, const CallReport& r,
                         const ResultRules& rules, int64_t now, double jitter);

// True when `code` is one of `codes`.
bool HasCode(const std::vector<absl::StatusCode>& codes, absl::StatusCode code);

// When writes fail because the world is unreachable across many keys in a
// row, the syncer pauses: one probe call at a time, backing off, until one
// gets an answer; then full speed again.
struct PauseRules {
  // Unreachable results in a row (no answer from the world between them),
  // from at least two keys, that pause writes. 0: never pause.
  int after = 8;
  // The codes that say the world is unreachable.
  std::vector<absl::StatusCode> codes = {absl::StatusCode::kUnavailable,
                                         absl::StatusCode::kDeadlineExceeded};
  // Delays between probes while paused.
  BackoffOptions probe = {.initial = absl::Milliseconds(250),
                          .max = absl::Seconds(1),
                          .multiplier = 2,
                          .jitter = 0.2};
};

class WorldPause {
 public:
  enum class Change : uint8_t { kNone, kPaused, kResumed };

  // A result from the world. `answered`: the world answered (success or
  // an error not in rules.codes); otherwise it was unreachable. `key_hash`
  // tells keys apart in a streak. `was_probe`: the call was the probe.
  Change OnResult(const PauseRules& rules, bool answered, uint64_t key_hash,
                  bool was_probe, int64_t now, double jitter,
                  const absl::Status& status);
  // The pause ended for another reason (the syncer was re-scoped).
  void Clear();

  bool paused() const { return paused_; }
  // Paused, or a streak of unreachable results has begun: a success must
  // be reported (OnResult) to end it. When false, successes need not be.
  bool busy() const { return paused_ || streak_ > 0; }
  // Paused and a probe may start at `now`.
  bool ProbeDue(int64_t now) const;
  // Paused: a probe started now.
  void ProbeStarted();
  // The probe handed over never ran (its key left, or the syncer stopped).
  void ProbeAbandoned() { probe_in_flight_ = false; }
  // When the next probe may start (kFuture while one is in flight).
  int64_t next_probe() const;
  int64_t paused_since() const { return paused_since_; }
  int64_t probes() const { return probes_; }
  // The unreachable error that paused it (or the last probe's).
  const absl::Status& last_error() const { return last_error_; }

 private:
  bool paused_ = false;
  bool probe_in_flight_ = false;
  int streak_ = 0;       // Unreachable results in a row.
  int streak_keys_ = 0;  // Key changes within the streak, plus one.
  uint64_t last_key_ = 0;
  int probe_failures_ = 0;
  int64_t paused_since_ = kFuture;
  int64_t next_probe_ = kPast;
  int64_t probes_ = 0;
  absl::Status last_error_;
};

}  // namespace setpoint::internal

#endif  // SETPOINT_PROCESSOR_INTERNAL_SYNC_RULES_H_
