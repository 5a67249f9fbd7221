#include "setpoint/base/retry.h"

#include "absl/random/random.h"

namespace setpoint {

bool IsRetryable(const RetryPolicy& policy, const absl::Status& error) {
  if (error.ok()) return false;
  if (!policy.retryable) return !IsTerminalError(error);
  try {
    return policy.retryable(error);
  } catch (...) {
    return false;
  }
}

namespace internal {
uint64_t RandomRetrySeed() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen) | 1;
}
}  // namespace internal

}  // namespace setpoint
