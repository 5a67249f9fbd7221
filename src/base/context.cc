#include "setpoint/base/context.h"

#include <algorithm>

namespace setpoint {

Context Context::WithDeadline(absl::Time deadline) const {
  Context child = *this;
  child.deadline_ = std::min(deadline_, deadline);
  return child;
}

Context Context::WithTimeout(absl::Duration timeout) const {
  return WithDeadline(clock_->Now() + timeout);
}

absl::Status Context::Err() const {
  if (stop_.stop_requested()) {
    return absl::CancelledError("context cancelled");
  }
  if (deadline_ != absl::InfiniteFuture() && clock_->Now() >= deadline_) {
    return absl::DeadlineExceededError("context deadline exceeded");
  }
  return absl::OkStatus();
}

absl::Status Context::Wait(absl::Duration timeout) const {
  absl::Time until = std::min(deadline_, clock_->Now() + timeout);
  clock_->SleepUntil(until, stop_);
  return Err();
}

CancelScope::CancelScope(const Context& parent)
    : context_(Context(source_.get_token(), parent.clock())
                   .WithDeadline(parent.deadline())
                   .WithValuesOf(parent)) {
  link_.emplace(parent.stop_token(), Forward{&source_});
}

}  // namespace setpoint
