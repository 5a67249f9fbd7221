// The Lua scripts of RedisNodeRegistry, one per operation, each run after
// kPrelude (the functions they share). docs/registry.md documents the keys and
// what each script guarantees; redis_node_registry.cc builds their KEYS
// and ARGV.
//
// Thread safety: constants.
#ifndef SETPOINT_SRC_REGISTRY_REDIS_REGISTRY_SCRIPTS_H_
#define SETPOINT_SRC_REGISTRY_REDIS_REGISTRY_SCRIPTS_H_

namespace setpoint::redis {

extern const char kPrelude[];
extern const char kPollScript[];
extern const char kReleaseScript[];
extern const char kGrantScript[];
extern const char kHandoffScript[];
extern const char kDeregisterScript[];
extern const char kDrainScript[];
extern const char kKindsScript[];
extern const char kDescribeScript[];

}  // namespace setpoint::redis

#endif  // SETPOINT_SRC_REGISTRY_REDIS_REGISTRY_SCRIPTS_H_
