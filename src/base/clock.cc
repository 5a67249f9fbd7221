#include "setpoint/base/clock.h"

#include <algorithm>
#include <chrono>

#include "absl/time/clock.h"

namespace setpoint {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() override { return absl::Now(); }

  bool AwaitWithDeadline(Mutex* mu, CondVar* cv, absl::Time deadline,
                         std::stop_token stop,
                         absl::FunctionRef<bool()> pred) override
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    // Wall time may jump; wait in steady-clock slices of at most one minute
    // and re-read the wall clock between them.
    constexpr absl::Duration kMaxSlice = absl::Minutes(1);
    while (true) {
      if (pred()) return true;
      if (stop.stop_requested()) return false;
      absl::Duration remaining = kMaxSlice;
      if (deadline != absl::InfiniteFuture()) {
        absl::Time now = Now();
        if (now >= deadline) return false;
        remaining = std::min(deadline - now, kMaxSlice);
      }
      auto until = std::chrono::steady_clock::now() +
                   absl::ToChronoNanoseconds(remaining);
      if (cv->WaitUntil(mu, stop, until, pred)) return true;
    }
  }
};

// Steady time shown as an absl::Time (since an arbitrary origin): never jumps,
// so leases measured on it are not fooled by NTP steps.
class MonotonicClock final : public RealClock {
 public:
  absl::Time Now() override {
    return absl::UnixEpoch() +
           absl::FromChrono(
               std::chrono::steady_clock::now().time_since_epoch());
  }
};

}  // namespace

Clock* Clock::Monotonic() {
  static MonotonicClock* clock = new MonotonicClock();
  return clock;
}

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

bool Clock::SleepUntil(absl::Time deadline, std::stop_token stop) {
  Mutex mu;
  CondVar cv;
  MutexLock l(&mu);
  AwaitWithDeadline(&mu, &cv, deadline, stop, [] { return false; });
  return !stop.stop_requested() && Now() >= deadline;
}

bool Clock::SleepFor(absl::Duration d, std::stop_token stop) {
  return SleepUntil(Now() + d, std::move(stop));
}

}  // namespace setpoint
