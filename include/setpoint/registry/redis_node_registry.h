// RedisNodeRegistry: the NodeRegistry many pods share through one Redis
// (docs/registry.md documents the keys, the scripts and the guarantees).
//
//   auto registry = RedisNodeRegistry::Create({
//       .address = "10.0.0.5:6379",
//       .username = "setpoint", .password = secret,
//       .ns = "prod",
//   });
//   if (!registry.ok()) return registry.status();
//   NodeManager manager({.registry = registry->get(), ...});
//
// Every operation is one Lua script (EVALSHA) over one connection; expiry
// is computed from the Redis server's clock inside the scripts. All keys
// share the hash tag {setpoint:<ns>}, so the same code works on Redis
// Cluster. A second connection subscribes to the namespace's change channel
// and wakes the listeners; polling stays the safety net. Values in our keys
// that someone else wrote and that do not parse are logged and treated
// conservatively (as held by their owner), never trusted, never a crash.
//
// With Sentinel, the master is discovered instead of configured:
//
//   auto registry = RedisNodeRegistry::Create({
//       .sentinels = {"10.0.0.7:26379", "10.0.0.8:26379", "10.0.0.9:26379"},
//       .master_name = "setpoint",
//       .password = secret, .sentinel_password = sentinel_secret,
//   });
//
// Every new connection asks the sentinels in turn for the master
// (SENTINEL get-master-addr-by-name), moves the one that answered to the
// front of the list, and confirms with ROLE that the address is a master;
// a thread subscribed to +switch-master on a sentinel drops the connections
// when the master changes, and a READONLY reply (a demoted master) does too.
// Optionally every grant is acknowledged only once WAIT saw it on a replica
// (grant_wait_replicas).
//
// Cached views: the scripts log every change to a kind's members and
// records, and a poll sends the position of the view it got last, so Redis
// answers with the changes since then and the caller's own records, not
// the whole fleet; every 16th poll of a kind reads everything again, and
// a new epoch, a gap in the log or an own record that disagrees with the
// view does too. What the lease protocol checks about the caller's own
// nodes always comes from Redis. Announcements carry the entries their
// script logged; the registry applies them to the cached views as they
// arrive (when they follow the view), so CachedView and a notice with
// view_current let a NodeManager follow joins and leaves without a poll.
//
// Thread safety: thread-safe; calls are serialized on the one connection.
#ifndef SETPOINT_REGISTRY_REDIS_NODE_REGISTRY_H_
#define SETPOINT_REGISTRY_REDIS_NODE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/node/node_registry.h"
#include "spdlog/logger.h"

namespace setpoint {

struct RedisNodeRegistryOptions {
  // "host:port", "tcp://host:port", "[::1]:port" or "unix:///path/redis.sock".
  // Default: "127.0.0.1:6379".
  std::string address = "127.0.0.1:6379";
  // ACL user for AUTH; empty with a password: AUTH <password> (requirepass).
  // Default: none.
  std::string username = "";
  // Never logged. Empty: no AUTH.
  // Default: none.
  std::string password = "";
  // SELECT this database (>= 0; Redis Cluster supports only 0).
  // Default: 0.
  int db = 0;
  // Every key lives under "{setpoint:<ns>}:". Non-empty; no '{', '}'.
  // Default: "default".
  std::string ns = "default";
  // Default: 1 s.
  absl::Duration connect_timeout = absl::Seconds(1);
  // Each command (one round trip) gives up after this long, or at the
  // caller's context deadline if that comes first.
  // Default: 1 s.
  absl::Duration command_timeout = absl::Seconds(1);
  // Waits between failed connects.
  // Default: 100 ms doubling to 5 s, jitter 0.2.
  BackoffOptions reconnect_backoff = {.initial = absl::Milliseconds(100),
                                      .max = absl::Seconds(5)};
  // Redis Sentinel. Non-empty: `address` is not used; the master named
  // `master_name` is asked of these sentinels ("host:port" or
  // "[::1]:port" each, no unix sockets) on every connect.
  // Default: none (connect to `address`).
  std::vector<std::string> sentinels = {};
  // The name the sentinels monitor the master under. Required with
  // `sentinels`, refused without them.
  // Default: none.
  std::string master_name = "";
  // ACL user and password for the sentinels (their own, not the master's:
  // `username` and `password` are for the master). Same rules as above.
  // Default: none.
  std::string sentinel_username = "";
  std::string sentinel_password = "";
  // > 0: a grant (Grant, or a Handoff that granted something) returns only
  // after WAIT saw the write on this many replicas, and fails with
  // kUnavailable when fewer acknowledged it within grant_wait_timeout (the
  // grant may then be lost in a failover, and the caller treats it as a
  // lost reply). One more round trip per grant; 0: no WAIT.
  // Default: 0.
  int grant_wait_replicas = 0;
  // How long WAIT waits (with grant_wait_replicas > 0: > 0 and shorter
  // than command_timeout; also bounded by the caller's deadline).
  // Default: 500 ms.
  absl::Duration grant_wait_timeout = absl::Milliseconds(500);
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Returns kInvalidArgument naming the field: an address that does not
// parse, db < 0, an empty namespace or one with '{' or '}', timeouts <= 0,
// a sentinel address that does not parse or is a unix socket, sentinels
// without a master name or a master name without sentinels, a sentinel user
// without a sentinel password, grant_wait_replicas < 0.
absl::Status ValidateRedisNodeRegistryOptions(
    const RedisNodeRegistryOptions& options);

class RedisNodeRegistry : public NodeRegistry {
 public:
  // Validates the options; does not connect (the first call does, and
  // every call after a failure tries again).
  static absl::StatusOr<std::unique_ptr<RedisNodeRegistry>> Create(
      RedisNodeRegistryOptions options);
  ~RedisNodeRegistry() override;

  absl::StatusOr<PollResult> Poll(const Context& ctx,
                                  const PollRequest& request) override;
  absl::Status Release(const Context& ctx, const std::string& kind,
                       const std::string& node_id, Assignment keep) override;
  absl::StatusOr<uint64_t> Grant(const Context& ctx, const std::string& kind,
                                 const std::string& node_id, ShardSet target,
                                 const std::string& epoch) override;
  // One round trip and one script for all of them.
  absl::StatusOr<HandoffResult> Handoff(const Context& ctx,
                                        const HandoffRequest& request) override;
  absl::Status Deregister(const Context& ctx, const std::string& kind,
                          const std::vector<std::string>& node_ids) override;
  absl::Status SetDrained(const Context& ctx, const std::string& pod_id,
                          bool drained) override;
  absl::StatusOr<RegistryDescription> Describe(const Context& ctx) override;
  // Notices after releases name the shards they freed.
  int64_t AddNoticeListener(
      std::function<void(const ChangeNotice&)> listener) override;
  // The view the last poll left, with the changes announced since applied
  // (each announcement carries its change-log entries).
  std::optional<KindView> CachedView(const std::string& kind) override;
  bool ReadCachedView(
      const std::string& kind, const CachedViewMark& since,
      absl::FunctionRef<void(const CachedViewRead&)> read) override;
  int64_t AddChangeListener(std::function<void()> listener) override;
  void RemoveChangeListener(int64_t id) override;

  // Round trips to Redis so far (scripts and commands, not subscriptions).
  int64_t round_trips() const;
  // How often a poll answered a kind with the changes since the cached
  // view instead of every member and record (once per kind and poll; see
  // "Cached views" above).
  int64_t polls_with_changes_only() const;
  // The master's address as last connected ("host:port"), or "" before the
  // first connect; with Sentinel it changes after a failover.
  std::string master_address() const;
  // The key prefix, "{setpoint:<ns>}".
  const std::string& prefix() const;

 private:
  struct Impl;
  explicit RedisNodeRegistry(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace setpoint

#endif  // SETPOINT_REGISTRY_REDIS_NODE_REGISTRY_H_
