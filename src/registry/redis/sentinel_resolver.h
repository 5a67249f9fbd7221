// SentinelResolver: finds the Redis master through Redis Sentinel, as the
// Sentinel client guide describes: ask the sentinels in turn for the master
// by name, and move the first one that answers to the front of the list so
// the next question goes to it first. RedisClient confirms the address with
// ROLE after connecting. A generation counter, bumped on +switch-master,
// tells connected clients to drop their connection and resolve again.
//
//   SentinelResolver resolver(sentinels, "setpoint", options, logger);
//   absl::StatusOr<RedisEndpoint> master = resolver.Resolve(budget);
//
// Each question runs on a fresh connection to that sentinel (with the
// sentinel user and password), closed after the answer: questions come only
// when a client connects, so there is nothing to keep open.
//
// Thread safety: thread-safe (the order of sentinels is under a mutex; the
// generation is atomic).
#ifndef SETPOINT_SRC_REGISTRY_REDIS_SENTINEL_RESOLVER_H_
#define SETPOINT_SRC_REGISTRY_REDIS_SENTINEL_RESOLVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "registry/redis/redis_client.h"
#include "setpoint/base/mutex.h"
#include "setpoint/registry/redis_node_registry.h"
#include "spdlog/logger.h"

namespace setpoint::redis {

class SentinelResolver {
 public:
  // `options` carries the sentinel auth and the timeouts; `sentinels` are
  // parsed TCP endpoints, at least one.
  SentinelResolver(std::vector<RedisEndpoint> sentinels,
                   std::string master_name,
                   const RedisNodeRegistryOptions& options,
                   std::shared_ptr<spdlog::logger> logger);

  // Asks each sentinel in turn, within `budget` in all, for the address of
  // the master. Returns the first answer and moves that sentinel to the
  // front. kUnavailable when none answered with an address: the message
  // names every sentinel asked and what it said (could not connect, an
  // error reply, does not know the master name, a reply that is not an
  // address); kPermissionDenied when every sentinel refused the auth.
  absl::StatusOr<RedisEndpoint> Resolve(absl::Duration budget);

  // The sentinels, the one that answered last first.
  std::vector<RedisEndpoint> sentinels() const;
  const std::string& master_name() const { return master_name_; }
  // Options for a connection to a sentinel (its auth, db 0).
  const RedisNodeRegistryOptions& sentinel_options() const {
    return sentinel_options_;
  }

  // Bumped when a sentinel announces +switch-master for our master: a
  // client connected under an older generation drops its connection.
  int64_t generation() const { return generation_.load(); }
  void MasterSwitched() { generation_.fetch_add(1); }

 private:
  const std::string master_name_;
  RedisNodeRegistryOptions sentinel_options_;
  std::shared_ptr<spdlog::logger> logger_;
  mutable Mutex mu_;
  std::vector<RedisEndpoint> order_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> generation_{0};
};

// Parses one SENTINEL get-master-addr-by-name reply: a two-element array
// [host, port]. kNotFound for a nil reply (the sentinel does not monitor
// that name); kInternal for an error reply (its text) or any other shape.
absl::StatusOr<RedisEndpoint> ParseMasterAddrReply(const RedisReply& reply);

// True when a ROLE reply says "master".
bool RoleIsMaster(const RedisReply& reply, std::string* role);

}  // namespace setpoint::redis

#endif  // SETPOINT_SRC_REGISTRY_REDIS_SENTINEL_RESOLVER_H_
