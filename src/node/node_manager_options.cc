// The node manager's options: their checks, the effective fence margin and
// the default pod id.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "setpoint/node/node_manager.h"

namespace setpoint {

namespace {

absl::Status Invalid(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "node manager options: ", absl::string_view(field.data(), field.size()),
      " ", absl::string_view(what.data(), what.size())));
}

}  // namespace

absl::Duration EffectiveFenceMargin(const NodeManagerOptions& o) {
  return o.fence_margin > absl::ZeroDuration()
             ? o.fence_margin
             : std::max(o.lease / 5, o.poll_interval);
}

std::string DefaultPodId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "pod");
  }
  std::string id = absl::StrCat(host, "-", getpid());
  std::replace(id.begin(), id.end(), '/', '_');
  return id;
}

absl::Status ValidateNodeManagerOptions(const NodeManagerOptions& o) {
  if (o.registry == nullptr) return Invalid("registry", "is required");
  for (size_t i = 0; i < o.kinds.size(); ++i) {
    if (o.kinds[i].factory == nullptr) {
      return Invalid(absl::StrCat("kinds[", i, "].factory"), "is required");
    }
  }
  return ValidateNodeManagerSettings(o);
}

absl::Status ValidateNodeManagerSettings(const NodeManagerOptions& o) {
  if (o.pod_id.find('/') != std::string::npos) {
    return Invalid(
        "pod_id", absl::StrCat("must not contain '/', got \"", o.pod_id, "\""));
  }
  if (o.static_membership && o.pod_id.empty()) {
    return Invalid("static_membership",
                   "needs a pod_id that stays the same across restarts (the "
                   "default <hostname>-<pid> changes with every start: the "
                   "kept places would only leave shards unowned for a lease)");
  }
  if (o.kinds.empty()) return Invalid("kinds", "must name at least one kind");
  std::set<std::string> seen;
  for (size_t i = 0; i < o.kinds.size(); ++i) {
    const NodeKindOptions& k = o.kinds[i];
    std::string field = absl::StrCat("kinds[", i, "]");
    if (k.kind.empty()) return Invalid(field + ".kind", "must not be empty");
    if (k.kind.find('/') != std::string::npos) {
      return Invalid(
          field + ".kind",
          absl::StrCat("must not contain '/', got \"", k.kind, "\""));
    }
    if (!seen.insert(k.kind).second) {
      return Invalid(field + ".kind",
                     absl::StrCat("\"", k.kind,
                                  "\" appears twice: node ids would repeat"));
    }
    if (k.count <= 0) {
      return Invalid(field + ".count",
                     absl::StrCat("must be > 0, got ", k.count));
    }
    if (k.ring_size == 0) return Invalid(field + ".ring_size", "must be > 0");
  }
  if (o.poll_interval <= absl::ZeroDuration()) {
    return Invalid("poll_interval", "must be > 0");
  }
  // A renewal must be able to fail once and still leave time before the
  // fence.
  const char* why =
      ": a renewal must be able to fail once and still leave time before the "
      "fence";
  if (o.lease <= o.poll_interval) {
    return Invalid("lease", absl::StrCat("(", absl::FormatDuration(o.lease),
                                         ") must be > poll_interval (",
                                         absl::FormatDuration(o.poll_interval),
                                         "), and >= 2 * poll_interval", why));
  }
  if (o.lease < 2 * o.poll_interval) {
    return Invalid(
        "lease", absl::StrCat("(", absl::FormatDuration(o.lease),
                              ") must be >= 2 * poll_interval (",
                              absl::FormatDuration(o.poll_interval), ")", why));
  }
  if (o.fence_margin < absl::ZeroDuration() || o.fence_margin >= o.lease) {
    return Invalid("fence_margin", "must be >= 0 and < lease");
  }
  // The nodes must be able to work between two renewals: a margin that
  // leaves less than one poll interval fences on every cycle.
  const absl::Duration margin = EffectiveFenceMargin(o);
  if (o.lease - margin <= o.poll_interval) {
    return Invalid(
        "fence_margin",
        absl::StrCat("(", absl::FormatDuration(margin),
                     o.fence_margin > absl::ZeroDuration()
                         ? ""
                         : ", the default max(20% of lease, poll_interval)",
                     ") must leave more than poll_interval (",
                     absl::FormatDuration(o.poll_interval), ") of the lease (",
                     absl::FormatDuration(o.lease),
                     "); raise lease or lower the margin"));
  }
  if (o.operation_timeout <= absl::ZeroDuration()) {
    return Invalid("operation_timeout", "must be > 0");
  }
  if (o.nudge_burst <= 0) {
    return Invalid("nudge_burst",
                   absl::StrCat("must be > 0, got ", o.nudge_burst));
  }
  if (absl::Status s = ValidateBackoffOptions(o.restart_backoff); !s.ok()) {
    return Invalid("restart_backoff", std::string(s.message()));
  }
  return absl::OkStatus();
}

}  // namespace setpoint
