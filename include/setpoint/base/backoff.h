// Backoff: capped exponential delays with jitter, for retries.
//
//   Backoff backoff({.initial = absl::Milliseconds(100),
//                    .max = absl::Minutes(5)});
//   while (!TryOnce().ok()) ctx.Wait(backoff.Next());
//   backoff.Reset();  // after a success
//
// The n-th delay (n from 0) is min(max, initial * multiplier^n), reduced by a
// random fraction in [0, jitter). With the same seed the sequence is the same.
//
// Thread safety: not thread-safe; one owner at a time.
#ifndef SETPOINT_BASE_BACKOFF_H_
#define SETPOINT_BASE_BACKOFF_H_

#include <cstdint>
#include <random>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace setpoint {

struct BackoffOptions {
  // The first delay.
  // Default: 100 ms.
  absl::Duration initial = absl::Milliseconds(100);
  // No delay is longer than this.
  // Default: 5 minutes.
  absl::Duration max = absl::Minutes(5);
  // Growth factor per attempt; at least 1.
  // Default: 2.
  double multiplier = 2.0;
  // Each delay is shortened by a random fraction in [0, jitter); in [0, 1].
  // Default: 0.2.
  double jitter = 0.2;
};

// Returns kInvalidArgument naming the field when `options` is unusable:
// initial <= 0, max < initial, multiplier < 1, jitter outside [0, 1].
absl::Status ValidateBackoffOptions(const BackoffOptions& options);

// The delay before retry number `attempt` (from 0) without a Backoff object:
// min(max, initial * multiplier^attempt) shortened by `jitter_fraction` (in
// [0, 1), scaled by options.jitter). For callers that track many keys and
// cannot afford a random engine per key. `options` must be valid: the
// components that take BackoffOptions refuse bad ones when they start.
absl::Duration BackoffDelay(const BackoffOptions& options, int attempt,
                            double jitter_fraction);

class Backoff {
 public:
  // kInvalidArgument naming the field for bad options (ValidateBackoffOptions);
  // use it for options that come from input. A nonzero `seed` makes the
  // jitter reproducible; 0 picks a random one.
  static absl::StatusOr<Backoff> Create(BackoffOptions options,
                                        uint64_t seed = 0);
  // `options` must be valid: invalid ones are a bug (the caller skipped
  // ValidateBackoffOptions) and abort, naming the field. A fixed `seed`
  // makes the jitter reproducible; by default each Backoff gets a random
  // seed.
  explicit Backoff(BackoffOptions options = {});
  Backoff(BackoffOptions options, uint64_t seed);

  // Returns the next delay and counts an attempt.
  absl::Duration Next();
  // Starts over from `initial` (call after a success).
  void Reset() { attempts_ = 0; }
  // Number of delays handed out since construction or the last Reset().
  int attempts() const { return attempts_; }

 private:
  BackoffOptions options_;
  std::mt19937_64 rng_;
  int attempts_ = 0;
};

}  // namespace setpoint

#endif  // SETPOINT_BASE_BACKOFF_H_
