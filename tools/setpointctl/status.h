// What `setpointctl status` shows: a RegistryDescription turned into a
// readable table or one JSON object, and a fingerprint that changes only
// when ownership does (for `watch`). Pure functions over the description;
// nothing here talks to a registry.
//
//   absl::StatusOr<RegistryDescription> d = registry->Describe(ctx);
//   std::string table = ctl::StatusText(*d, {.address = a, .ns = "demo"});
//
// Thread safety: pure functions and value types.
#ifndef SETPOINT_TOOLS_SETPOINTCTL_STATUS_H_
#define SETPOINT_TOOLS_SETPOINTCTL_STATUS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/node/node_registry.h"
#include "setpoint/node/shard.h"

namespace setpoint::ctl {

// Where the description came from, for the heading.
struct StatusSource {
  std::string address = "";
  std::string ns = "";
};

// One node's row.
struct NodeRow {
  std::string id;
  std::string pod;
  // "active", "draining", "drained" (its pod's state), or "expired" (its
  // lease ended; the next poll of its kind drops it).
  std::string state;
  std::optional<Assignment> held;  // Only while live.
  double share_percent = 0;
  absl::Duration lease_left;  // Negative once expired.
};

struct KindRows {
  std::string kind;
  uint32_t ring_size = 0;
  bool ring_size_recorded = true;  // Else kDefaultRingSize is assumed.
  uint64_t last_token = 0;
  std::vector<NodeRow> nodes;
  // Ranges no live member holds, in order.
  std::vector<ShardRange> unowned;
  uint32_t unowned_shards = 0;
};

// A pod's live nodes of one kind, and the shards they hold (shards of
// different kinds are of different rings: they are never added up).
struct PodKindRow {
  std::string kind;
  int nodes = 0;
  uint64_t shards = 0;
};

struct PodRow {
  std::string pod;
  // "active"; "draining" (drained, still holds shards) or "drained" (holds
  // nothing); "drained (no nodes)" for a flag whose pod has no live node.
  std::string state;
  int nodes = 0;  // Live nodes, all kinds.
  // By kind, in the order of the kinds; kinds it has no live node of are
  // left out.
  std::vector<PodKindRow> kinds;
  bool holds_shards = false;
  absl::Time drained_since = absl::InfinitePast();
};

// The description, sorted out: what the table and the JSON show.
struct Status {
  RegistryDescription description;
  std::vector<KindRows> kinds;
  std::vector<PodRow> pods;
  // Every pod with live nodes is drained: nobody owns anything.
  bool all_drained = false;
  // The description's warnings, then overlaps (two live holders of a shard,
  // which the protocol never lets happen).
  std::vector<std::string> warnings;
};

Status BuildStatus(const RegistryDescription& description);

// The readable table (ends with a newline).
std::string StatusText(const Status& status, const StatusSource& source);
// One JSON object on one line (ends with a newline). Times are RFC 3339
// (UTC, ms) or null; durations are ms; tokens are integers; a node that
// holds nothing has the empty range [0,0] and token 0, as in a pod's
// /statusz.
std::string StatusJson(const Status& status, const StatusSource& source);
// Changes when ownership, membership, drains, the epoch or the warnings do,
// not when leases are merely renewed or the version moves.
std::string StatusFingerprint(const Status& status);

// What `watch` compares for a failed look: the status code only, so an
// error whose text changes on every look (a duration, a count) is shown
// once, and again only when it becomes another error or goes away.
std::string ErrorFingerprint(const absl::Status& error);

}  // namespace setpoint::ctl

#endif  // SETPOINT_TOOLS_SETPOINTCTL_STATUS_H_
