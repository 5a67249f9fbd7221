// CallUserCode: the one boundary where setpoint meets user callbacks that
// may throw (a client's call, a plan's Create, a procedure's Do, a
// transform, a list function). What the callback returns comes back
// unchanged; what it throws becomes a Status with one code everywhere:
//
//   absl::Status s = CallUserCode("create", [&] {
//     return client->Create(ctx, key, value);
//   });
//   if (ThrewException(s)) ++threw;  // kInternal "create threw: <what()>"
//
// The callback may return void (OK when it returns), absl::Status,
// absl::StatusOr<T> or a plain T (then the result is absl::StatusOr<T>).
// setpoint never throws on purpose; this is where it stops a user's
// exception from unwinding through its threads.
//
// Thread safety: stateless; safe from any thread.
#ifndef SETPOINT_BASE_CALLBACK_H_
#define SETPOINT_BASE_CALLBACK_H_

#include <optional>
#include <type_traits>
#include <utility>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace setpoint {

// The code of every error made from an exception a user callback threw.
inline constexpr absl::StatusCode kThrewCode = absl::StatusCode::kInternal;

// True for a status CallUserCode made from an exception (it survives
// Annotate). Such a failure is retried like any other non-terminal error.
bool ThrewException(const absl::Status& status);

namespace internal {

// Runs `fn`; returns OK, or the thrown error ("<what> threw: <message>").
absl::Status CatchAll(absl::string_view what, absl::FunctionRef<void()> fn);

template <class R>
struct CallResult {
  using type = absl::StatusOr<R>;
};
template <>
struct CallResult<void> {
  using type = absl::Status;
};
template <>
struct CallResult<absl::Status> {
  using type = absl::Status;
};
template <class T>
struct CallResult<absl::StatusOr<T>> {
  using type = absl::StatusOr<T>;
};

}  // namespace internal

// What CallUserCode returns for a callback that returns R.
template <class Fn>
using CallUserCodeResult = typename internal::CallResult<
    std::remove_cvref_t<std::invoke_result_t<Fn&>>>::type;

// Calls `fn()` and returns its result; if it throws, returns kInternal
// "<what> threw: <what the exception says>" marked for ThrewException.
// `what` names the callback in the message (a literal is enough).
template <class Fn>
CallUserCodeResult<Fn> CallUserCode(absl::string_view what, Fn&& fn) {
  using R = std::remove_cvref_t<std::invoke_result_t<Fn&>>;
  if constexpr (std::is_void_v<R>) {
    return internal::CatchAll(what, [&] { fn(); });
  } else {
    std::optional<R> out;
    absl::Status threw = internal::CatchAll(what, [&] { out.emplace(fn()); });
    if (!threw.ok()) return threw;
    return *std::move(out);
  }
}

}  // namespace setpoint

#endif  // SETPOINT_BASE_CALLBACK_H_
