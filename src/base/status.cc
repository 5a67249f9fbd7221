#include "setpoint/base/status.h"

#include <algorithm>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace setpoint {

absl::Status Annotate(const absl::Status& status, std::string_view message) {
  if (status.ok() || message.empty()) return status;
  absl::Status annotated(
      status.code(),
      absl::StrCat(absl::string_view(message.data(), message.size()), ": ",
                   status.message()));
  status.ForEachPayload(
      [&annotated](absl::string_view type_url, const absl::Cord& payload) {
        annotated.SetPayload(type_url, payload);
      });
  return annotated;
}

const std::vector<absl::StatusCode>& TerminalErrorCodes() {
  static const std::vector<absl::StatusCode>* const codes =
      new std::vector<absl::StatusCode>{absl::StatusCode::kInvalidArgument,
                                        absl::StatusCode::kPermissionDenied,
                                        absl::StatusCode::kFailedPrecondition,
                                        absl::StatusCode::kUnimplemented,
                                        absl::StatusCode::kUnauthenticated,
                                        absl::StatusCode::kOutOfRange};
  return *codes;
}

bool IsTerminalError(const absl::Status& status) {
  const std::vector<absl::StatusCode>& codes = TerminalErrorCodes();
  return std::find(codes.begin(), codes.end(), status.code()) != codes.end();
}

namespace {
constexpr absl::string_view kRetryAfterUrl = "type.setpoint.dev/retry-after";
constexpr absl::string_view kStaleOwnerUrl = "type.setpoint.dev/stale-owner";
}  // namespace

absl::Status StaleOwnerError(std::string_view message) {
  return AsStaleOwner(absl::FailedPreconditionError(
      absl::string_view(message.data(), message.size())));
}

absl::Status AsStaleOwner(absl::Status status) {
  if (status.ok()) return status;
  status.SetPayload(kStaleOwnerUrl, absl::Cord("1"));
  return status;
}

bool IsStaleOwner(const absl::Status& status) {
  return status.GetPayload(kStaleOwnerUrl).has_value();
}

absl::Status WithRetryAfter(absl::Status status, absl::Duration delay) {
  if (status.ok() || delay < absl::ZeroDuration()) return status;
  status.SetPayload(kRetryAfterUrl,
                    absl::Cord(absl::StrCat(absl::ToInt64Nanoseconds(delay))));
  return status;
}

std::optional<absl::Duration> RetryAfterHint(const absl::Status& status) {
  auto payload = status.GetPayload(kRetryAfterUrl);
  if (!payload.has_value()) return std::nullopt;
  int64_t nanos = 0;
  if (!absl::SimpleAtoi(std::string(*payload), &nanos) || nanos < 0) {
    return std::nullopt;
  }
  return absl::Nanoseconds(nanos);
}

absl::Status UnsharedCopy(const absl::Status& status) {
  if (status.ok()) return absl::OkStatus();
  absl::Status copy(status.code(), std::string(status.message()));
  status.ForEachPayload(
      [&copy](absl::string_view url, const absl::Cord& payload) {
        copy.SetPayload(url, absl::Cord(std::string(payload)));
      });
  return copy;
}

}  // namespace setpoint
