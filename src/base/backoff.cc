#include "setpoint/base/backoff.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/check.h"

namespace setpoint {
namespace {

BackoffOptions Clamp(BackoffOptions o) {
  if (o.initial <= absl::ZeroDuration()) o.initial = absl::Nanoseconds(1);
  if (o.max < o.initial) o.max = o.initial;
  if (!(o.multiplier >= 1.0)) o.multiplier = 1.0;
  if (!(o.jitter >= 0.0)) o.jitter = 0.0;
  if (o.jitter > 1.0) o.jitter = 1.0;
  return o;
}

uint64_t RandomSeed() {
  // std::random_device, not absl::BitGen: Debian's prebuilt Abseil seeds
  // BitGen from a shared pool that ThreadSanitizer cannot see into (false
  // races).
  std::random_device rd;
  uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return seed;
}

}  // namespace

absl::Status ValidateBackoffOptions(const BackoffOptions& o) {
  if (o.initial <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("backoff options: initial must be > 0, got ",
                     absl::FormatDuration(o.initial)));
  }
  if (o.max < o.initial) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff options: max (", absl::FormatDuration(o.max),
        ") must be >= initial (", absl::FormatDuration(o.initial), ")"));
  }
  if (!(o.multiplier >= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff options: multiplier must be >= 1, got ", o.multiplier));
  }
  if (!(o.jitter >= 0.0 && o.jitter <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff options: jitter must be in [0, 1], got ", o.jitter));
  }
  return absl::OkStatus();
}

absl::StatusOr<Backoff> Backoff::Create(BackoffOptions options, uint64_t seed) {
  if (absl::Status s = ValidateBackoffOptions(options); !s.ok()) return s;
  return Backoff(options, seed != 0 ? seed : RandomSeed());
}

Backoff::Backoff(BackoffOptions options) : Backoff(options, RandomSeed()) {}

Backoff::Backoff(BackoffOptions options, uint64_t seed)
    : options_(options), rng_(seed) {
  const absl::Status valid = ValidateBackoffOptions(options_);
  SETPOINT_CHECK_MSG(valid.ok(), "{}", std::string(valid.message()));
}

absl::Duration BackoffDelay(const BackoffOptions& options, int attempt,
                            double jitter_fraction) {
  BackoffOptions o = Clamp(options);
  double base = absl::ToDoubleSeconds(o.initial) *
                std::pow(o.multiplier, std::max(attempt, 0));
  double cap = absl::ToDoubleSeconds(o.max);
  if (!(base < cap)) base = cap;
  if (jitter_fraction > 0.0 && jitter_fraction < 1.0) {
    base *= 1.0 - o.jitter * jitter_fraction;
  }
  return std::max(absl::Seconds(base), absl::Nanoseconds(1));
}

absl::Duration Backoff::Next() {
  // Grow in floating point, capped, so large attempt counts cannot overflow.
  double base = absl::ToDoubleSeconds(options_.initial) *
                std::pow(options_.multiplier, attempts_);
  double cap = absl::ToDoubleSeconds(options_.max);
  if (!(base < cap)) base = cap;
  if (attempts_ < (1 << 20)) ++attempts_;
  if (options_.jitter > 0.0) {
    std::uniform_real_distribution<double> frac(0.0, options_.jitter);
    base *= 1.0 - frac(rng_);
  }
  return std::max(absl::Seconds(base), absl::Nanoseconds(1));
}

}  // namespace setpoint
