#include "setpoint/processor/source.h"

#include "absl/strings/str_cat.h"

namespace setpoint::source_internal {

absl::Status ValidateCommon(const std::string& what, const std::string& name,
                            absl::Duration list_timeout, int lose_sync_after,
                            const BackoffOptions& backoff) {
  const auto invalid = [&](const char* field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("start ", what, " ", name, ": ", field, " ", why));
  };
  if (list_timeout < absl::ZeroDuration()) {
    return invalid(
        "list_timeout",
        absl::StrCat("must be >= 0, got ", absl::FormatDuration(list_timeout)));
  }
  if (lose_sync_after < 1) {
    return invalid("lose_sync_after",
                   absl::StrCat("must be >= 1, got ", lose_sync_after));
  }
  if (absl::Status s = ValidateBackoffOptions(backoff); !s.ok()) {
    return invalid("backoff", std::string(s.message()));
  }
  return absl::OkStatus();
}

}  // namespace setpoint::source_internal
