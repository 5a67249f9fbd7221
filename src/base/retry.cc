#include "setpoint/base/retry.h"

#include <random>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"

namespace setpoint {

bool IsRetryable(const RetryPolicy& policy, const absl::Status& error) {
  if (error.ok()) return false;
  if (!policy.retryable) return !IsTerminalError(error);
  absl::StatusOr<bool> retry =
      CallUserCode("retryable", [&] { return policy.retryable(error); });
  return retry.ok() && *retry;
}

absl::Status ValidateRetryPolicy(const RetryPolicy& policy) {
  if (policy.max_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "retry policy: max_attempts must be >= 1, got ", policy.max_attempts));
  }
  if (absl::Status s = ValidateBackoffOptions(policy.backoff); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("retry policy: backoff: ", s.message()));
  }
  return absl::OkStatus();
}

namespace internal {
uint64_t RandomRetrySeed() {
  // std::random_device, not absl::BitGen: Debian's prebuilt Abseil seeds
  // BitGen from a shared pool that ThreadSanitizer cannot see into (false
  // races).
  std::random_device rd;
  uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return seed | 1;
}
}  // namespace internal

}  // namespace setpoint
