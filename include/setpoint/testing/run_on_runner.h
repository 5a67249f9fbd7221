// RunOnRunner: runs a function on a Runner and waits for its result, so a
// test thread can read or change runner-only state (a Syncer's status, a
// Store's items) without a data race. Kept for existing tests: it is
// Runner::PostAndWait with a real-time timeout and an optional result; new
// code calls PostAndWait directly.
//
//   auto status = setpoint::testing::RunOnRunner(
//       runner, [&] { return syncer.StatusSnapshot(); });
//   ASSERT_TRUE(status.has_value());
//
// Thread safety: as Runner::PostAndWait: any thread on a started runner
// (inline on the runner's own), the owner thread in manual mode.
#ifndef SETPOINT_TESTING_RUN_ON_RUNNER_H_
#define SETPOINT_TESTING_RUN_ON_RUNNER_H_

#include <optional>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/processor/runner.h"

namespace setpoint::testing {

// Returns fn()'s result, or nullopt if the runner refused the post (stopped),
// fn threw, or the runner did not start it within `timeout` of real time (it
// then never runs). For a void `fn`, returns whether it ran.
template <typename Fn>
auto RunOnRunner(Runner& runner, Fn fn,
                 absl::Duration timeout = absl::Seconds(10)) {
  using R = std::invoke_result_t<Fn&>;
  const Context ctx = Context::Background().WithTimeout(timeout);
  if constexpr (std::is_void_v<R>) {
    return runner.PostAndWait(ctx, std::move(fn), "test RunOnRunner").ok();
  } else {
    // Written by fn on the runner; PostAndWait returns after fn returned,
    // or without ever running it.
    std::optional<R> result;
    absl::Status ran = runner.PostAndWait(
        ctx, [&] { result.emplace(fn()); }, "test RunOnRunner");
    if (!ran.ok()) return std::optional<R>();
    return result;
  }
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_RUN_ON_RUNNER_H_
