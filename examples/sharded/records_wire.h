// The HTTP protocol between HttpRecordsApi (records_http_client.h) and the
// records API service (records_api_service.h): paths, the headers that
// carry a write's assignment, and the JSON of bodies and errors.
//
//   GET    /v1/records            {"records": {"<name>": {"address": "a"}},
//                                  "serial": 12}
//   GET    /v1/records/<name>     {"name": "<name>", "address": "a"} or 404
//   PUT    /v1/records/<name>     body {"address": "a"}, assignment headers
//   DELETE /v1/records/<name>     assignment headers
//   GET    /v1/serial             {"serial": 12}
//   PUT    /v1/serial             body {"serial": 12}, assignment headers
//   GET    /v1/stats              counters, per writer node and per pod
//   GET    /v1/writes?from=<i>    the accepted writes from the i-th on
//   GET    /healthz               "ok"
//
// A write's assignment (setpoint::AssignmentOf(ctx)) travels in
// X-Setpoint-Node, X-Setpoint-Kind, X-Setpoint-Range ("<begin>-<end>"),
// X-Setpoint-Token and X-Setpoint-Ring. Refusals answer with a status and
// {"error": "<code>", "message": "..."}: 409 stale_token (a newer token was
// seen for the shard), 403 not_owner (no assignment, or the key is not in
// its range), 400 bad_request, 413 (body too large), 429 throttled (with
// Retry-After-Ms), 503 unavailable, 504 timeout.
//
// Thread safety: pure functions.
#ifndef SETPOINT_EXAMPLES_SHARDED_RECORDS_WIRE_H_
#define SETPOINT_EXAMPLES_SHARDED_RECORDS_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "setpoint/base/json.h"
#include "setpoint/controller/controller.h"

namespace sharded::wire {

inline constexpr char kNodeHeader[] = "X-Setpoint-Node";
inline constexpr char kKindHeader[] = "X-Setpoint-Kind";
inline constexpr char kRangeHeader[] = "X-Setpoint-Range";
inline constexpr char kTokenHeader[] = "X-Setpoint-Token";
inline constexpr char kRingHeader[] = "X-Setpoint-Ring";
inline constexpr char kRetryAfterMsHeader[] = "Retry-After-Ms";

// A record name as the service accepts it: 1..253 bytes of letters,
// digits, '.', '-' and '_'.
inline bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

// Node ids and kinds: 1..256 printable ASCII bytes without spaces.
inline bool ValidId(std::string_view id) {
  if (id.empty() || id.size() > 256) return false;
  for (char c : id) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// "<begin>-<end>[,<begin>-<end>...]" (the runs of a node's shards) as a
// ShardSet.
inline bool ParseRange(std::string_view text, setpoint::ShardSet* out) {
  std::vector<setpoint::ShardRange> runs;
  for (absl::string_view run :
       absl::StrSplit(absl::string_view(text.data(), text.size()), ',')) {
    size_t dash = run.find('-');
    if (dash == absl::string_view::npos) return false;
    uint32_t begin = 0;
    uint32_t end = 0;
    if (!absl::SimpleAtoi(run.substr(0, dash), &begin) ||
        !absl::SimpleAtoi(run.substr(dash + 1), &end) || begin > end) {
      return false;
    }
    runs.push_back({begin, end});
  }
  *out = setpoint::ShardSet::Of(std::move(runs));
  return true;
}

inline std::string FormatRange(const setpoint::ShardSet& s) {
  if (s.Empty()) return "0-0";
  std::string out;
  for (const setpoint::ShardRange& r : s.runs()) {
    absl::StrAppend(&out, out.empty() ? "" : ",", r.begin, "-", r.end);
  }
  return out;
}

// {"error": code, "message": message}
inline std::string ErrorBody(std::string_view code, std::string_view message) {
  std::string out = "{\"error\":";
  setpoint::AppendJsonString(&out, code);
  out += ",\"message\":";
  setpoint::AppendJsonString(&out, message);
  out += "}";
  return out;
}

// Percent-encodes every byte but letters, digits and "-._~".
inline std::string EscapePath(std::string_view s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' ||
                 c == '~';
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace sharded::wire

#endif  // SETPOINT_EXAMPLES_SHARDED_RECORDS_WIRE_H_
