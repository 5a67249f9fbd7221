// Status helpers: propagation macros and annotation for absl::Status.
//
// Debian's abseil (20220623) has no status macros, so setpoint brings its own
// in the shape of Abseil's:
//
//   absl::StatusOr<int> ParsePort(std::string_view s);
//   absl::Status Connect(std::string_view addr) {
//     SETPOINT_ASSIGN_OR_RETURN(int port, ParsePort(addr));
//     SETPOINT_RETURN_IF_ERROR(Dial(port));
//     return absl::OkStatus();
//   }
//
// Thread safety: stateless; safe from any thread.
#ifndef SETPOINT_BASE_STATUS_H_
#define SETPOINT_BASE_STATUS_H_

#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace setpoint {

// Returns `status` with `message` prepended as context ("message: original").
// An OK status is returned unchanged. The code and payloads are kept.
absl::Status Annotate(const absl::Status& status, std::string_view message);

// The codes a retry cannot fix, setpoint's one definition of a terminal
// error: kInvalidArgument, kPermissionDenied, kFailedPrecondition,
// kUnimplemented, kUnauthenticated and kOutOfRange. RetryPolicy (through
// IsTerminalError) and SyncerOptions::terminal_codes default to it.
const std::vector<absl::StatusCode>& TerminalErrorCodes();

// Returns true when `status`'s code is one of TerminalErrorCodes(): the
// default "do not retry" rule across setpoint.
bool IsTerminalError(const absl::Status& status);

// Returns `status` carrying a retry-after hint: the caller asks to be retried
// no sooner than `delay` from now (an HTTP 429/503 "Retry-After", a Redis
// "-BUSY"). The Syncer honours it instead of its own backoff. An OK status or
// a negative delay returns `status` unchanged.
absl::Status WithRetryAfter(absl::Status status, absl::Duration delay);
// Returns the hint set by WithRetryAfter, or nullopt when there is none (or
// the payload was written by someone else and does not parse).
std::optional<absl::Duration> RetryAfterHint(const absl::Status& status);

// A write refused because the writer's fencing token is older than one the
// system has already seen for that shard: the writer no longer owns it. The
// code is kFailedPrecondition; the mark survives Annotate. Syncers and
// reconcile loops count it and do not retry under the same assignment.
absl::Status StaleOwnerError(std::string_view message);
// Marks an existing error as a stale-owner refusal (OK stays OK).
absl::Status AsStaleOwner(absl::Status status);
// True for statuses made by StaleOwnerError or AsStaleOwner.
bool IsStaleOwner(const absl::Status& status);

// A copy of `status` that shares no storage with it: the same code,
// message and payloads, each copied. For a status kept by one thread and
// read by another (a health record, a last error): a plain copy shares one
// reference-counted representation, and a ThreadSanitizer build against a
// prebuilt abseil (Debian's) cannot see that count, so it reports the last
// owner's free as a race with the other thread's read.
absl::Status UnsharedCopy(const absl::Status& status);

namespace internal {
inline absl::Status AsStatus(absl::Status s) { return s; }
template <typename T>
absl::Status AsStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace internal

}  // namespace setpoint

#define SETPOINT_INTERNAL_CONCAT_IMPL(a, b) a##b
#define SETPOINT_INTERNAL_CONCAT(a, b) SETPOINT_INTERNAL_CONCAT_IMPL(a, b)

// Evaluates `expr` (an absl::Status or absl::StatusOr) and returns its status
// from the enclosing function when it is not OK.
#define SETPOINT_RETURN_IF_ERROR(expr)                                      \
  do {                                                                      \
    ::absl::Status setpoint_status_ = ::setpoint::internal::AsStatus(expr); \
    if (!setpoint_status_.ok()) return setpoint_status_;                    \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status from
// the enclosing function, otherwise moves the value into `lhs`, which may be a
// declaration (`auto x`) or an existing variable.
#define SETPOINT_ASSIGN_OR_RETURN(lhs, rexpr) \
  SETPOINT_INTERNAL_ASSIGN_OR_RETURN(         \
      SETPOINT_INTERNAL_CONCAT(setpoint_statusor_, __LINE__), lhs, rexpr)

#define SETPOINT_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                       \
  if (!tmp.ok()) return std::move(tmp).status();            \
  lhs = std::move(tmp).value()

#endif  // SETPOINT_BASE_STATUS_H_
