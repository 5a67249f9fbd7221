// ClusterRequest: what the user asks the cucumber controller for — a cluster
// `name` of `nodes_num` running instances and a DNS record `dns_name` whose A
// addresses are exactly those instances' addresses — and how it is read from
// YAML and checked.
//
//   # cluster.yaml
//   name: demo
//   nodes_num: 3
//   dns_name: demo.example.com
//
//   absl::StatusOr<cucumber::ClusterRequest> request =
//       cucumber::LoadClusterRequest("cluster.yaml");
//   if (!request.ok()) { std::cerr << request.status().message(); return 2; }
//
// Bad input never crashes: every problem comes back as kInvalidArgument
// naming the field (or the YAML line) and what was wrong.
//
// Thread safety: plain values and stateless functions; safe from any thread.
#ifndef SETPOINT_EXAMPLES_CUCUMBER_REQUEST_H_
#define SETPOINT_EXAMPLES_CUCUMBER_REQUEST_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cucumber {

// The largest nodes_num a request may ask for.
inline constexpr int kMaxNodes = 1000;

struct ClusterRequest {
  // The cluster's name: 1-63 lowercase letters, digits and '-', starting with
  // a letter and not ending with '-'. Instances carry it in kClusterTag.
  std::string name;
  // Running instances wanted, in [0, kMaxNodes]. With 0 the record is
  // deleted.
  int nodes_num = 0;
  // The A record to keep pointing at the instances, e.g. "demo.example.com"
  // (at least two labels; lowercase after NormalizeClusterRequest).
  std::string dns_name;

  bool operator==(const ClusterRequest&) const = default;
};

// Returns OK when `request` is usable, else kInvalidArgument whose message
// starts with "invalid request: " and names the field:
//   invalid request: nodes_num must be between 0 and 1000, got 5000
// Upper-case letters and one trailing dot in dns_name are accepted (see
// NormalizeClusterRequest).
absl::Status ValidateClusterRequest(const ClusterRequest& request);

// Returns `request` validated, with dns_name lowercased and without a
// trailing dot; kInvalidArgument as ValidateClusterRequest otherwise.
absl::StatusOr<ClusterRequest> NormalizeClusterRequest(ClusterRequest request);

// Parses a request from YAML text: a mapping with exactly the keys name,
// nodes_num and dns_name. `source` names the input in messages (a file
// path, "flags", ...). Returns the normalized request, or kInvalidArgument:
//   parse request cluster.yaml: line 3: nodes_num must be an integer, got
//   "three" parse request cluster.yaml: malformed YAML at line 2, column 7: ...
//   parse request cluster.yaml: line 4: unknown key "nodes" (allowed: ...)
absl::StatusOr<ClusterRequest> ParseClusterRequest(
    std::string_view yaml_text, std::string_view source = "request");

// Reads and parses the YAML file at `path`. Returns kNotFound when it does
// not exist, kInvalidArgument when it is not a readable regular file of at
// most 1 MiB or does not parse (see ParseClusterRequest).
absl::StatusOr<ClusterRequest> LoadClusterRequest(const std::string& path);

}  // namespace cucumber

#endif  // SETPOINT_EXAMPLES_CUCUMBER_REQUEST_H_
