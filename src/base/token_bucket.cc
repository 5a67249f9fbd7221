#include "setpoint/base/token_bucket.h"

#include <algorithm>

namespace setpoint {

TokenBucket::TokenBucket(double rate, double burst)
    : rate_(rate > 0 ? rate : 0),
      burst_(std::max(1.0, burst)),
      tokens_(burst_) {}

double TokenBucket::TokensAt(absl::Time now) const {
  if (at_ == absl::InfinitePast() || now <= at_) return tokens_;
  return std::min(burst_, tokens_ + absl::ToDoubleSeconds(now - at_) * rate_);
}

bool TokenBucket::Take(absl::Time now) {
  if (unlimited()) return true;
  tokens_ = TokensAt(now);
  if (now > at_) at_ = now;
  if (tokens_ < 1) return false;
  tokens_ -= 1;
  return true;
}

absl::Time TokenBucket::NextToken(absl::Time now) const {
  if (unlimited()) return absl::InfinitePast();
  const double tokens = TokensAt(now);
  if (tokens >= 1) return now;
  const absl::Time from = std::max(now, at_);
  return from + absl::Seconds((1 - tokens) / rate_);
}

}  // namespace setpoint
