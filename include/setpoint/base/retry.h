// RetryPolicy and Retry(): call something flaky again, with capped
// exponential backoff waited on the Context, until it succeeds or there is no
// point trying again.
//
//   RetryPolicy policy{.max_attempts = 5};
//   absl::StatusOr<Listing> listing =
//       Retry(ctx, policy, [&] { return cloud.List(ctx); });
//
// The Scheduler applies a Procedure's RetryPolicy this way; plans use Retry()
// directly for the reads inside Plan::Create.
//
// Thread safety: Retry() is a plain function; `fn` runs on the calling thread.
#ifndef SETPOINT_BASE_RETRY_H_
#define SETPOINT_BASE_RETRY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>

#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/context.h"
#include "setpoint/base/status.h"

namespace setpoint {

// How often to try an operation before its failure counts.
struct RetryPolicy {
  // Attempts in total, the first included; 1 means no retry (>= 1).
  // Default: 1.
  int max_attempts = 1;
  // Delays between attempts (waited on the context, so cancellable).
  // Default: 100 ms doubling to 10 s, 20% jitter.
  BackoffOptions backoff = {.initial = absl::Milliseconds(100),
                            .max = absl::Seconds(10)};
  // Which errors are worth another attempt. Default (empty): every error but
  // the terminal ones (IsTerminalError). Whatever this says, nothing is
  // retried once the context is done. A predicate that throws means "no".
  std::function<bool(const absl::Status&)> retryable = nullptr;
};

// Returns whether `policy` would retry after `error` (ignoring attempts).
bool IsRetryable(const RetryPolicy& policy, const absl::Status& error);

// Returns kInvalidArgument naming the field when `policy` is unusable:
// max_attempts < 1 or bad backoff options (ValidateBackoffOptions).
absl::Status ValidateRetryPolicy(const RetryPolicy& policy);

namespace internal {
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}
// A fresh random seed (used when the caller passes 0).
uint64_t RandomRetrySeed();
}  // namespace internal

// Calls `fn()` — returning absl::Status or absl::StatusOr<T> — until it
// succeeds, fails with an error the policy does not retry, has been called
// policy.max_attempts times, or `ctx` is done. Between attempts it waits
// Backoff delays on `ctx`.
//
// `before_retry(attempt, error, delay)` runs before each wait (for logging and
// counting); returning false stops with that error. `seed` fixes the jitter
// (0: random). `attempts`, if given, receives the number of calls made.
//
// Returns the last result of `fn`, except when `ctx` ends during a wait: then
// ctx.Err() (kCancelled/kDeadlineExceeded) annotated with the last error. A
// policy that ValidateRetryPolicy refuses is refused with its
// kInvalidArgument, and `fn` is not called.
namespace internal {
// The slow path of Retry(), entered only after a failed first attempt, so the
// common case (success at once) costs one call and one test.
template <typename Result, typename Fn, typename BeforeRetry>
Result RetryAfterFailure(const Context& ctx, const RetryPolicy& policy, Fn& fn,
                         BeforeRetry& before_retry, uint64_t seed,
                         int* attempts, Result result) {
  // Seeded here, on the rare path: a random seed costs a syscall.
  Backoff backoff(policy.backoff, seed != 0 ? seed : RandomRetrySeed());
  for (int attempt = 1;; ++attempt) {
    if (attempts != nullptr) *attempts = attempt;
    const absl::Status& status = StatusOf(result);
    if (status.ok() || attempt >= policy.max_attempts || ctx.Done() ||
        !IsRetryable(policy, status)) {
      return result;
    }
    absl::Duration delay = backoff.Next();
    if (!before_retry(attempt, status, delay)) return result;
    if (absl::Status waited = ctx.Wait(delay); !waited.ok()) {
      return Annotate(waited,
                      absl::StrCat("waiting to retry after attempt ", attempt,
                                   " failed with \"", status.ToString(), "\""));
    }
    result = fn();
  }
}
}  // namespace internal

template <typename Fn, typename BeforeRetry>
std::invoke_result_t<Fn&> Retry(const Context& ctx, const RetryPolicy& policy,
                                Fn&& fn, BeforeRetry&& before_retry,
                                uint64_t seed = 0, int* attempts = nullptr) {
  using Result = std::invoke_result_t<Fn&>;
  static_assert(std::is_invocable_r_v<bool, BeforeRetry&, int,
                                      const absl::Status&, absl::Duration>,
                "before_retry must be callable as "
                "bool(int attempt, const absl::Status& error, "
                "absl::Duration delay)");
  if (ABSL_PREDICT_FALSE(
          policy.max_attempts < 1 ||
          policy.backoff.initial <= absl::ZeroDuration() ||
          policy.backoff.max < policy.backoff.initial ||
          !(policy.backoff.multiplier >= 1.0) ||
          !(policy.backoff.jitter >= 0.0 && policy.backoff.jitter <= 1.0))) {
    if (attempts != nullptr) *attempts = 0;
    return Result(ValidateRetryPolicy(policy));
  }
  if (attempts != nullptr) *attempts = 1;
  Result result = fn();
  if (ABSL_PREDICT_TRUE(internal::StatusOf(result).ok()) ||
      policy.max_attempts <= 1) {
    return result;
  }
  return internal::RetryAfterFailure<Result>(ctx, policy, fn, before_retry,
                                             seed, attempts, std::move(result));
}

// Retry() without a hook.
template <typename Fn>
std::invoke_result_t<Fn&> Retry(const Context& ctx, const RetryPolicy& policy,
                                Fn&& fn) {
  return Retry(ctx, policy, std::forward<Fn>(fn),
               [](int, const absl::Status&, absl::Duration) { return true; });
}

}  // namespace setpoint

#endif  // SETPOINT_BASE_RETRY_H_
