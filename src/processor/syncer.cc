// The Syncer's compiled part that is not a unit of its own: the checks of
// its options (the rest is in sync_rules.cc, call_dispatcher.cc and
// syncer_counters.cc).
#include "setpoint/processor/syncer.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "setpoint/base/status.h"

namespace setpoint::internal {

absl::Status ValidateSyncerLimits(
    const std::string& name, bool batch, int max_in_flight, int updater_threads,
    int max_batch, int max_batches_in_flight, double rate_limit, int rate_burst,
    absl::Duration batch_delay, absl::Duration execution_delay,
    absl::Duration expectation_timeout, absl::Duration operation_timeout,
    int pause_after, const BackoffOptions& backoff,
    const BackoffOptions& pause_probe) {
  auto invalid = [&](const char* field, auto value, const char* rule) {
    return absl::InvalidArgumentError(absl::StrCat("start syncer ", name, ": ",
                                                   field, " must be ", rule,
                                                   ", got ", value));
  };
  if (batch && max_batch < 1) return invalid("max_batch", max_batch, ">= 1");
  if (batch && max_batches_in_flight < 1) {
    return invalid("max_batches_in_flight", max_batches_in_flight, ">= 1");
  }
  if (max_in_flight < 1) {
    return invalid("max_in_flight", max_in_flight, ">= 1 (0: the default)");
  }
  if (updater_threads < 0) {
    return invalid("updater_threads", updater_threads, ">= 0");
  }
  if (!(rate_limit >= 0)) return invalid("rate_limit", rate_limit, ">= 0");
  if (rate_burst < 1) return invalid("rate_burst", rate_burst, ">= 1");
  if (pause_after < 0) return invalid("pause_after", pause_after, ">= 0");
  for (const auto& [field, value] :
       {std::pair<const char*, absl::Duration>{"batch_delay", batch_delay},
        {"execution_delay", execution_delay},
        {"expectation_timeout", expectation_timeout},
        {"operation_timeout", operation_timeout}}) {
    if (value < absl::ZeroDuration()) {
      return invalid(field, absl::FormatDuration(value), ">= 0");
    }
  }
  if (absl::Status s = ValidateBackoffOptions(backoff); !s.ok()) {
    return Annotate(s, absl::StrCat("start syncer ", name, ": backoff"));
  }
  if (absl::Status s = ValidateBackoffOptions(pause_probe); !s.ok()) {
    return Annotate(s, absl::StrCat("start syncer ", name, ": pause_probe"));
  }
  return absl::OkStatus();
}

}  // namespace setpoint::internal
