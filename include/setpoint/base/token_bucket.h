// TokenBucket: a rate limit that allows short bursts. Tokens refill at
// `rate` per second up to `burst`; each action takes one. A bucket starts
// full, so the first `burst` actions pass at once.
//
//   TokenBucket limit(/*rate=*/10, /*burst=*/3);
//   if (limit.Take(clock->Now())) Send();
//   else wake_at = limit.NextToken(clock->Now());
//
// A rate of 0 means no limit: Take always succeeds. Time comes from the
// caller (any clock, real or simulated), so the bucket is deterministic.
//
// Thread safety: not thread-safe; one owner at a time.
#ifndef SETPOINT_BASE_TOKEN_BUCKET_H_
#define SETPOINT_BASE_TOKEN_BUCKET_H_

#include "absl/time/time.h"

namespace setpoint {

class TokenBucket {
 public:
  // `rate`: tokens per second (0: unlimited; must not be negative).
  // `burst`: the bucket's size (at least 1; smaller values count as 1).
  explicit TokenBucket(double rate = 0, double burst = 1);

  // Takes a token if one is there at `now`; returns whether it did.
  bool Take(absl::Time now);
  // When Take(now') would next succeed: `now` when a token is there, else
  // the moment the next one is refilled. InfinitePast when unlimited.
  absl::Time NextToken(absl::Time now) const;

  bool unlimited() const { return rate_ <= 0; }
  double rate() const { return rate_; }
  double burst() const { return burst_; }

 private:
  // The tokens at `now` (refilled since the last take), at most burst_.
  double TokensAt(absl::Time now) const;

  double rate_;
  double burst_;
  double tokens_;
  absl::Time at_ = absl::InfinitePast();  // When tokens_ was counted.
};

}  // namespace setpoint

#endif  // SETPOINT_BASE_TOKEN_BUCKET_H_
