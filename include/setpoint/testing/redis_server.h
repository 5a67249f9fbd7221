// RedisServer: a real redis-server for integration tests, started on a unix
// socket in a fresh temporary directory (and, if asked, on a free loopback
// TCP port), without automatic persistence. Stop() kills it; Restart()
// starts it again on the same socket and port with empty memory, as a crash
// would leave it; SaveSnapshot() and RestartFrom() play a restart from an
// RDB file written earlier.
//
//   RedisServer server;
//   ASSERT_OK(server.Start());
//   auto registry = RedisNodeRegistry::Create({.address = server.address()});
//
// When redis-server is not installed, Start() returns kNotFound: tests skip
// locally and fail when the CI environment variable is set (see
// SETPOINT_START_REDIS_OR_SKIP). Part of setpoint::testing; it needs the
// redis-server binary (Debian: redis-server) at run time only.
//
// Thread safety: one owner thread.
#ifndef SETPOINT_TESTING_REDIS_SERVER_H_
#define SETPOINT_TESTING_REDIS_SERVER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace setpoint::testing {

struct RedisServerOptions {
  // Also listen on a free loopback TCP port.
  bool tcp = false;
  // requirepass (AUTH <password>); empty: none.
  std::string requirepass = "";
  // Extra ACL users, each a full "user ..." rule line.
  std::vector<std::string> acl_users = {};
};

class RedisServer {
 public:
  explicit RedisServer(RedisServerOptions options = {});
  ~RedisServer();  // Stops the server and removes the directory.
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Starts it and waits until it answers PING. kNotFound without the
  // binary; kDeadlineExceeded if it does not come up within 10 s.
  absl::Status Start();
  // SIGKILL, and wait for the process.
  void Stop();
  // SIGKILL, and start again with empty memory (as after a crash without
  // persistence).
  absl::Status Restart();
  // SAVE, and keep a copy of the snapshot under `name`.
  absl::Status SaveSnapshot(const std::string& name);
  // SIGKILL, and start again from the snapshot saved under `name` (as a
  // crash-restart from an RDB file written some time before).
  absl::Status RestartFrom(const std::string& name);
  // SIGSTOP / SIGCONT: the server stops answering without closing sockets.
  void Pause();
  void Resume();

  // "unix:///tmp/.../redis.sock".
  std::string address() const { return "unix://" + socket_; }
  // "127.0.0.1:<port>" (tcp only).
  std::string tcp_address() const;
  pid_t pid() const { return pid_; }

 private:
  RedisServerOptions options_;
  std::string dir_;
  std::string socket_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// True when the CI environment variable is set: missing redis-server is
// then a failure, not a skip.
bool RedisRequired();

// The redis-server binary, or "" when it is not installed.
std::string FindRedisServer();

// A loopback port nobody listens on right now (0 if none found).
int FreeLoopbackPort();

// SIGKILLs `pid` (continuing it first if it was stopped) and waits for it.
void KillAndReap(pid_t pid);

}  // namespace setpoint::testing

// In a test: start `server` or skip (locally) / fail (CI) when the binary is
// missing.
#define SETPOINT_START_REDIS_OR_SKIP(server)                                   \
  do {                                                                         \
    absl::Status started_ = (server).Start();                                  \
    if (absl::IsNotFound(started_) && !::setpoint::testing::RedisRequired()) { \
      GTEST_SKIP() << started_;                                                \
    }                                                                          \
    ASSERT_TRUE(started_.ok()) << started_;                                    \
  } while (false)

#endif  // SETPOINT_TESTING_REDIS_SERVER_H_
