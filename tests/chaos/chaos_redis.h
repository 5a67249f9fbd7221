// ChaosRedis: a redis-server for the chaos test, on a free loopback TCP port
// with its data directory in a temporary directory, RDB enabled but never
// automatic (`save ""`): snapshots are taken only when the test asks
// (Save()), so it decides exactly which state a restart brings back.
// Kill() is a crash (SIGKILL, nothing saved); Start() again comes up on the
// same port and loads `dump.rdb` from the directory if there is one:
//
//   ChaosRedis redis(dir);
//   ASSERT_OK(redis.Start());
//   redis.Command({"SAVE"});                   // snapshot now
//   copy(redis.dump_path(), "older.rdb");      // keep it aside
//   redis.Kill();                              // crash
//   copy("older.rdb", redis.dump_path());      // roll back ...
//   redis.Start();                             // ... and come back from it
//
// DEBUG is enabled (`enable-debug-command yes`, for DEBUG SLEEP). Children
// get PR_SET_PDEATHSIG, so a killed test leaves no server behind.
//
// Also: RedisCommand, a blocking RESP client for one command on a fresh
// connection (the test's own commands never share the pods' connections).
//
// Thread safety: ChaosRedis has one owner thread; RedisCommand is
// thread-safe.
#ifndef SETPOINT_TESTS_CHAOS_CHAOS_REDIS_H_
#define SETPOINT_TESTS_CHAOS_CHAOS_REDIS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace setpoint::chaos {

// Sends `args` to 127.0.0.1:port and reads one reply, giving up after
// `timeout` (connect + write + read). Returns the reply's text: a status or
// bulk string, or an integer as decimal; an error reply is returned as
// kInternal with its text; kUnavailable when it cannot connect;
// kDeadlineExceeded on timeout.
absl::StatusOr<std::string> RedisCommand(int port,
                                         const std::vector<std::string>& args,
                                         absl::Duration timeout);

class ChaosRedis {
 public:
  // `dir` must exist; the server's files (conf, log, dump.rdb) go there.
  explicit ChaosRedis(std::string dir);
  ~ChaosRedis();  // Kill().
  ChaosRedis(const ChaosRedis&) = delete;
  ChaosRedis& operator=(const ChaosRedis&) = delete;

  // Starts the server (port chosen on the first start, then kept) and waits
  // until it answers PING with PONG (after loading dump.rdb). kNotFound
  // without the binary; kDeadlineExceeded if not up within 10 s.
  absl::Status Start();
  // SIGKILL (SIGCONT first, should it be stopped) and wait for it.
  void Kill();
  bool running() const { return pid_ > 0; }

  // One command on a fresh connection (see RedisCommand).
  absl::StatusOr<std::string> Command(
      const std::vector<std::string>& args,
      absl::Duration timeout = absl::Seconds(2)) const;

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  const std::string& dir() const { return dir_; }
  std::string dump_path() const { return dir_ + "/dump.rdb"; }

 private:
  const std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace setpoint::chaos

#endif  // SETPOINT_TESTS_CHAOS_CHAOS_REDIS_H_
