// PodConfig: a pod's NodeManager and registry settings from a YAML file and
// from command-line style overrides, validated with errors that name the
// field.
//
//   # pod.yaml
//   pod_id: pod-a              # default: <hostname>-<pid>
//   poll_interval: 500ms
//   lease: 3s
//   kinds:
//     - {kind: vm, count: 2, ring_size: 4096}
//   registry:
//     type: redis              # or: memory (one process, no Redis)
//     address: 127.0.0.1:6379  # or unix:///run/redis.sock
//     username: setpoint
//     password_env: SETPOINT_REDIS_PASSWORD   # or password / password_file
//     db: 0
//     namespace: prod
//
//   auto config = setpoint::LoadPodConfig("pod.yaml", {"--lease=5s"});
//   if (!config.ok()) { std::cerr << config.status() << "\n"; return 2; }
//   NodeManagerOptions options = config->manager;   // add factories
//
// Overrides use the YAML paths: --pod_id=x, --lease=5s, --registry.address=h:1,
// --kinds.vm.count=4. Durations take absl's format ("500ms", "3s", "1m").
// Unknown keys are errors (a typo must not silently keep a default).
// Passwords never appear in errors or in ToString().
//
// Thread safety: value types and pure functions.
#ifndef SETPOINT_NODE_POD_CONFIG_H_
#define SETPOINT_NODE_POD_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/registry/redis_node_registry.h"

namespace setpoint {

struct PodConfig {
  // Everything but the factories, registry, clock and logger, which code
  // supplies.
  NodeManagerOptions manager = {};
  // "memory" or "redis".
  std::string registry_type = "memory";
  RedisNodeRegistryOptions redis = {};

  // A readable summary with the password redacted.
  std::string ToString() const;
};

// Parses YAML text, then applies `overrides` ("--path=value"), then
// validates. kInvalidArgument naming the field (or the YAML line) on error.
absl::StatusOr<PodConfig> ParsePodConfig(
    const std::string& yaml, const std::vector<std::string>& overrides = {});
// Reads `path` (kNotFound if missing) and parses it as above. An empty path
// starts from the defaults.
absl::StatusOr<PodConfig> LoadPodConfig(
    const std::string& path, const std::vector<std::string>& overrides = {});

}  // namespace setpoint

#endif  // SETPOINT_NODE_POD_CONFIG_H_
