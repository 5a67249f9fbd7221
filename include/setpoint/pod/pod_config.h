// PodConfig: a pod's NodeManager and registry settings from a YAML file and
// from command-line style overrides, validated with errors that name the
// field.
//
//   # pod.yaml
//   pod_id: pod-a              # default: <hostname>-<pid>
//   poll_interval: 500ms
//   nudge_burst: 4             # change-driven polls in a burst
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
// Passwords never appear in errors or in ToString().
//
// Rules (each refusal is kInvalidArgument naming the field, and the line
// when it comes from the file):
//  - Unknown keys are errors whatever their value (a typo must not silently
//    keep a default); a known key with an empty or null value is an error
//    ("lease:" is not "the default lease"). A key given twice in one YAML
//    map is an error naming both lines. registry.* settings need an explicit
//    registry.type (else every pod would use the in-memory registry and own
//    the whole ring). password, password_env and password_file exclude each
//    other (an override of one replaces the file's).
//  - Durations are finite whole milliseconds (the registry counts ms),
//    1ms..24h; fence_margin may also be 0 (the default margin).
//  - The node manager's own rules (ValidateNodeManagerSettings, the one
//    place they are written): lease >= 2 * poll_interval, so a renewal
//    may fail once and still leave time before the fence; the effective
//    fence margin
//    (fence_margin, or max(20% of lease, poll_interval) when 0) must leave
//    more than poll_interval of the lease, or a node would fence before
//    every renewal.
//  - count is 1..kPodConfigMaxCount per kind, at most kPodConfigMaxKinds
//    kinds, ring_size 1..kPodConfigMaxRingSize, db 0..2^31-1.
//  - pod_id, kind names, registry.namespace and registry.username are
//    printable ASCII without spaces (the error names the offending byte as
//    \xNN); kind names have no '.' or '/'. No other value but the password
//    may hold control characters. Overrides get the same checks.
//  - One YAML document per file, nested at most 32 deep, at most 100000
//    nodes and kPodConfigMaxBytes. YAML aliases (*name, and merge keys using
//    them) are refused: a pod config has no need for them, and they let a small
//    file expand exponentially ("billion laughs") or refer to itself.
//  - LoadPodConfig reads only regular files (a directory, FIFO or device such
//    as /dev/zero is refused without reading it); the same holds for
//    registry.password_file, whose first line must be a non-empty password
//    (else AUTH would silently be skipped).
//
// Thread safety: value types and pure functions.
#ifndef SETPOINT_POD_POD_CONFIG_H_
#define SETPOINT_POD_POD_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/registry/redis_node_registry.h"

namespace setpoint {

// The largest pod config text or file (1 MiB).
inline constexpr size_t kPodConfigMaxBytes = size_t{1} << 20;
// The most nodes of one kind in one pod (each runs two threads).
inline constexpr int kPodConfigMaxCount = 1024;
// The most kinds in one pod.
inline constexpr size_t kPodConfigMaxKinds = 64;
// The largest ring (1 << 20 shards).
inline constexpr int64_t kPodConfigMaxRingSize = int64_t{1} << 20;

struct PodConfig {
  // Everything but the factories, registry, clock and logger, which code
  // supplies.
  NodeManagerOptions manager = {};
  // Threads of the pod's updater pool, which PodMain starts before the
  // node manager and hands to every node (NodeManagerOptions::updaters):
  // every node's syncers share it, each within its own max_in_flight. Size
  // it for the client calls the pod should run at once. 0: no shared pool
  // (each syncer owns threads).
  int updater_threads = 16;
  // The most threads of the pod's loop pool, which PodMain starts before
  // the node manager and hands to every node (NodeManagerOptions::loops):
  // every node's reconcile loops share it; it grows to this many while
  // plan executions run, and shrinks when idle. Size it for the plan
  // executions the pod should run at once. 0: no shared pool (each loop
  // owns a thread).
  int loop_threads = 16;
  // Threads of the pod's runner pool, which PodMain starts before the node
  // manager and hands to every node (NodeManagerOptions::runners): every
  // node's runner runs its events there, one at a time each. Runner events
  // do no IO: size it for cores. 0: no shared pool (each runner owns a
  // thread).
  int runner_threads = 4;
  // "memory" or "redis".
  std::string registry_type = "memory";
  RedisNodeRegistryOptions redis = {};
  // The operators' HTTP listener (OpsServer): "host:port", empty for none.
  std::string http_address = "127.0.0.1:9464";
  // /healthz fails after this long without progress.
  absl::Duration stuck_after = absl::Seconds(30);

  // Every key with its value, "path=value" in the order of
  // PodConfigKeys() (kinds.<kind>.* once per kind; registry.* only for
  // redis), the password redacted and its sources left out.
  std::string ToString() const;
};

// One setting a file or an override may set, for help texts.
struct PodConfigKey {
  // The YAML path, which is also the override's name: "lease",
  // "registry.address", "kinds.<kind>.count".
  std::string_view path;
  // What the value looks like: "<duration>", "memory|redis".
  std::string_view value;
  // One line: what it does.
  std::string_view help;
  // What the key is when it is not given, from PodConfig's own defaults
  // ("500ms"), or how it is found ("the program's, else 1"); empty when
  // there is none (a password's sources).
  std::string default_value;
};

// Every setting, from the one table that parsing and ToString use too: the
// top-level ones, the per-kind ones, the listener's, then the registry's.
std::span<const PodConfigKey> PodConfigKeys();

// Parses YAML text, then applies `overrides` ("--path=value", a later one
// wins over an earlier one and over the file), then validates by the rules
// above. `kinds` are the kinds the program runs: the config starts from
// them (count, ring_size and factory as given), the file and the overrides
// change their count and ring_size by name, and a kind only they name is
// added after them without a factory (the caller decides whether that is
// an error). Returns kInvalidArgument naming the field (or the YAML line);
// the caller should print it and exit: retrying cannot help.
absl::StatusOr<PodConfig> ParsePodConfig(
    const std::string& yaml, const std::vector<std::string>& overrides = {},
    const std::vector<NodeKindOptions>& kinds = {});
// Reads `path` and parses it as above; errors start with
// "pod config <path>:". Returns kNotFound if it does not exist,
// kPermissionDenied if it cannot be opened, kInvalidArgument if it is not a
// regular file or larger than kPodConfigMaxBytes, or as ParsePodConfig. An
// empty path starts from the defaults.
absl::StatusOr<PodConfig> LoadPodConfig(
    const std::string& path, const std::vector<std::string>& overrides = {},
    const std::vector<NodeKindOptions>& kinds = {});

}  // namespace setpoint

#endif  // SETPOINT_POD_POD_CONFIG_H_
