// RunOnRunner: runs a function on a started Runner and waits for its result,
// so a test thread can read or change runner-only state (a Syncer's status,
// a Store's items) without a data race.
//
//   auto status = setpoint::testing::RunOnRunner(
//       runner, [&] { return syncer.StatusSnapshot(); });
//   ASSERT_TRUE(status.has_value());
//
// Thread safety: call from any thread except the runner's own (it would
// wait for itself).
#ifndef SETPOINT_TESTING_RUN_ON_RUNNER_H_
#define SETPOINT_TESTING_RUN_ON_RUNNER_H_

#include <future>
#include <optional>
#include <type_traits>
#include <utility>

#include "absl/time/time.h"
#include "setpoint/processor/runner.h"

namespace setpoint::testing {

// Returns fn()'s result, or nullopt if the runner refused the post (stopped)
// or did not run it within `timeout` of real time. For a void `fn`, returns
// whether it ran.
template <typename Fn>
auto RunOnRunner(Runner& runner, Fn fn,
                 absl::Duration timeout = absl::Seconds(10)) {
  using R = std::invoke_result_t<Fn&>;
  using Out = std::conditional_t<std::is_void_v<R>, bool, std::optional<R>>;
  auto promise = std::make_shared<
      std::promise<std::conditional_t<std::is_void_v<R>, bool, R>>>();
  auto future = promise->get_future();
  absl::Status posted = runner.Post(
      [promise, fn = std::move(fn)]() mutable {
        if constexpr (std::is_void_v<R>) {
          fn();
          promise->set_value(true);
        } else {
          promise->set_value(fn());
        }
      },
      "test RunOnRunner");
  if (!posted.ok() || future.wait_for(absl::ToChronoNanoseconds(timeout)) !=
                          std::future_status::ready) {
    return Out{};
  }
  return Out{future.get()};
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_RUN_ON_RUNNER_H_
