// AwaitCondition: polls a condition until it holds or a real-time deadline
// passes, for tests that must observe another thread's progress. Prefer
// SimulatedClock::AwaitWaiters or a callback that signals; use this when the
// state can only be read.
//
//   ASSERT_TRUE(setpoint::testing::AwaitCondition(
//       [&] { return loop.stats().executions >= 2; }));
//
// Thread safety: `pred` is called on the calling thread only.
#ifndef SETPOINT_TESTING_AWAIT_H_
#define SETPOINT_TESTING_AWAIT_H_

#include <chrono>
#include <thread>

#include "absl/time/time.h"

namespace setpoint::testing {

// Returns true as soon as `pred()` holds; false if it still does not after
// `timeout` of real time.
template <typename Pred>
bool AwaitCondition(Pred pred, absl::Duration timeout = absl::Seconds(10)) {
  auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (!pred()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_AWAIT_H_
