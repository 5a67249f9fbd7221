// RedisClient: setpoint's small RAII wrapper over one hiredis connection.
// Private to the library: hiredis never appears in public headers.
//
//   RedisClient client(options, logger);
//   absl::StatusOr<RedisReply> r = client.Command({"PING"});
//   RedisScript script("return 1");
//   r = client.Eval(script, /*keys=*/{}, /*args=*/{});
//
// Connects lazily and again after any error, backing off between failed
// connects; AUTH (ACL user or password only) and SELECT run on every new
// connection. Built on a SentinelResolver, it asks the sentinels for the
// master before every connect, confirms with ROLE that it reached a master,
// drops the connection when the resolver's generation moves
// (+switch-master) or the server answers READONLY (a demoted master), and
// connects again at once after a switch instead of waiting out its backoff.
// Each command waits at most command_timeout. Errors map to canonical codes:
// kUnavailable (cannot connect, connection lost), kDeadlineExceeded (timed
// out), kPermissionDenied (AUTH refused, NOPERM), kInternal (a Redis error
// reply). EVALSHA reloads the script on NOSCRIPT.
//
// Thread safety: not thread-safe; one owner (callers hold a mutex).
#ifndef SETPOINT_SRC_REGISTRY_REDIS_REDIS_CLIENT_H_
#define SETPOINT_SRC_REGISTRY_REDIS_REDIS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/registry/redis_node_registry.h"
#include "spdlog/logger.h"

struct redisContext;

namespace setpoint::redis {

class SentinelResolver;

// A reply, copied out of hiredis.
struct RedisReply {
  enum class Type { kNil, kInteger, kString, kArray, kStatus, kError };
  Type type = Type::kNil;
  int64_t integer = 0;
  std::string str;  // kString, kStatus, kError.
  std::vector<RedisReply> elements;
};

// A Lua script and its SHA1, computed by Redis on first load.
struct RedisScript {
  explicit RedisScript(std::string text) : source(std::move(text)) {}
  std::string source;
  std::string sha;  // Empty until loaded.
};

// Where and how to connect; a parsed RedisNodeRegistryOptions.
struct RedisEndpoint {
  std::string host;  // TCP, or empty for a unix socket.
  int port = 0;
  std::string unix_path;  // Unix socket, or empty for TCP.
  std::string ToString() const;
};

// Maps a Redis error reply to a Status: NOPERM/WRONGPASS/NOAUTH ->
// kPermissionDenied; LOADING/BUSY/MASTERDOWN/TRYAGAIN/CLUSTERDOWN and
// READONLY anywhere in the text (a script that wrote on a replica) ->
// kUnavailable; anything else kInternal. `what` starts the message.
absl::Status StatusFromErrorReply(const std::string& what,
                                  const std::string& message);

// Parses "host:port", "tcp://host:port", "[::1]:port" or "unix:///path".
absl::StatusOr<RedisEndpoint> ParseRedisAddress(const std::string& address);

class RedisClient {
 public:
  RedisClient(RedisEndpoint endpoint, const RedisNodeRegistryOptions& options,
              std::shared_ptr<spdlog::logger> logger);
  // Follows the master `resolver` names (shared with other clients).
  RedisClient(std::shared_ptr<SentinelResolver> resolver,
              const RedisNodeRegistryOptions& options,
              std::shared_ptr<spdlog::logger> logger);
  ~RedisClient();
  RedisClient(const RedisClient&) = delete;
  RedisClient& operator=(const RedisClient&) = delete;

  // Runs one command. A Redis error reply is returned as a reply of type
  // kError (the command reached Redis), not as a Status.
  // `budget` shortens the connect and command timeouts for this call (a
  // caller's deadline).
  absl::StatusOr<RedisReply> Command(
      const std::vector<std::string>& argv,
      absl::Duration budget = absl::InfiniteDuration());
  // EVALSHA, loading the script first if needed and again on NOSCRIPT.
  // An error reply from the script is returned as a kError reply, for the
  // caller to map (StatusFromErrorReply).
  // The whole call (a reload included) waits at most `budget`.
  absl::StatusOr<RedisReply> Eval(
      RedisScript& script, const std::vector<std::string>& keys,
      const std::vector<std::string>& args,
      absl::Duration budget = absl::InfiniteDuration());
  // Blocks until a message arrives or `timeout` passes, for a subscribed
  // connection. Returns the message, or nullopt-like kNil reply on timeout.
  // With `wake_fd` (>= 0) it also returns the kNil reply as soon as that
  // descriptor is readable (an eventfd its owner writes to stop a reader
  // thread without waiting out the timeout).
  absl::StatusOr<RedisReply> ReadPushed(absl::Duration timeout,
                                        int wake_fd = -1);
  // Round trips made (commands sent), for cost accounting.
  int64_t round_trips() const { return round_trips_; }
  // Drops the connection (the next command reconnects).
  void Disconnect();
  bool connected() const { return ctx_ != nullptr; }
  // The server connected to last (with Sentinel: the master last named;
  // empty host and path before the first connect).
  const RedisEndpoint& endpoint() const { return endpoint_; }

 private:
  absl::Status EnsureConnected(absl::Duration budget);
  // Sets the socket timeout for the next command to min(command_timeout,
  // budget) if it differs from the one in force.
  absl::Status UseTimeout(absl::Duration budget);
  absl::Status Fail(const char* what);
  // Runs one command on the fresh connection during the handshake.
  absl::StatusOr<RedisReply> Handshake(const std::vector<std::string>& args,
                                       const char* what);
  // With a resolver: true when a switch happened since this connection was
  // made (the caller drops it).
  bool Switched() const;

  std::shared_ptr<SentinelResolver> resolver_;
  RedisEndpoint endpoint_;
  const std::string username_;
  const std::string password_;
  const int db_;
  const absl::Duration connect_timeout_;
  const absl::Duration command_timeout_;
  std::shared_ptr<spdlog::logger> logger_;
  redisContext* ctx_ = nullptr;
  absl::Duration timeout_in_force_ = absl::ZeroDuration();
  int64_t round_trips_ = 0;
  Backoff backoff_;
  absl::Time next_connect_ = absl::InfinitePast();  // Monotonic clock.
  // The resolver's generation when the connection (or the failed connect)
  // was made.
  int64_t generation_ = 0;
};

}  // namespace setpoint::redis

#endif  // SETPOINT_SRC_REGISTRY_REDIS_REDIS_CLIENT_H_
