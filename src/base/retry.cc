#include "setpoint/base/retry.h"

#include <random>

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
  // std::random_device, not absl::BitGen: Debian's prebuilt Abseil seeds
  // BitGen from a shared pool that ThreadSanitizer cannot see into (false
  // races).
  std::random_device rd;
  uint64_t seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return seed | 1;
}
}  // namespace internal

}  // namespace setpoint
