// RedisSentinelSet: a Sentinel-managed Redis for integration tests — one
// master, replicas and redis-sentinel processes, each on a free loopback TCP
// port with its own directory, without persistence. Start() waits until
// every sentinel sees every replica and every other sentinel; KillMaster()
// sends the master a real SIGKILL, and AwaitFailover() waits until the
// sentinels agree on a promoted replica that answers ROLE as a master.
//
//   RedisSentinelSet redis({.down_after = absl::Milliseconds(1000)});
//   SETPOINT_START_REDIS_OR_SKIP(redis);
//   auto registry = RedisNodeRegistry::Create({
//       .sentinels = redis.sentinel_addresses(),
//       .master_name = redis.master_name()});
//   redis.KillMaster();
//   absl::StatusOr<std::string> promoted = redis.AwaitFailover(
//       absl::Seconds(30));
//
// When redis-server or redis-sentinel is not installed, Start() returns
// kNotFound (SETPOINT_START_REDIS_OR_SKIP skips locally and fails in CI).
// Part of setpoint::testing; it needs the binaries (Debian: redis-server,
// redis-sentinel) at run time only.
//
// Thread safety: one owner thread.
#ifndef SETPOINT_TESTING_REDIS_SENTINEL_SET_H_
#define SETPOINT_TESTING_REDIS_SENTINEL_SET_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace setpoint::testing {

struct RedisSentinelSetOptions {
  // The name the sentinels monitor the master under.
  // Default: "setpoint".
  std::string master_name = "setpoint";
  // Default: 2.
  int replicas = 2;
  // Default: 3.
  int sentinels = 3;
  // Sentinels that must agree the master is down before a failover.
  // Default: 2.
  int quorum = 2;
  // Sentinel's down-after-milliseconds.
  // Default: 1 s.
  absl::Duration down_after = absl::Milliseconds(1000);
  // Sentinel's failover-timeout.
  // Default: 3 s.
  absl::Duration failover_timeout = absl::Milliseconds(3000);
  // requirepass of the master and replicas (masterauth and Sentinel's
  // auth-pass follow); empty: none.
  std::string requirepass = "";
  // requirepass of the sentinels (and sentinel-pass between them); empty:
  // none.
  std::string sentinel_password = "";
  // min-replicas-to-write on every server (0: off), with
  // min-replicas-max-lag 10.
  int min_replicas_to_write = 0;
  // Keep the directory (configs and logs) after destruction, to read the
  // logs of a failed test.
  // Default: false.
  bool keep_dir = false;
};

class RedisSentinelSet {
 public:
  explicit RedisSentinelSet(RedisSentinelSetOptions options = {});
  ~RedisSentinelSet();  // Kills every process and removes the directories.
  RedisSentinelSet(const RedisSentinelSet&) = delete;
  RedisSentinelSet& operator=(const RedisSentinelSet&) = delete;

  // Starts the servers, then the sentinels, and waits (up to 60 s) until
  // each sentinel reports the master with all replicas and all other
  // sentinels. kNotFound without a binary; kDeadlineExceeded when they do
  // not come together; kInternal when a process exits at start (the
  // message names its log).
  absl::Status Start();

  // SIGKILLs the current master and reaps it. Returns its address.
  std::string KillMaster();
  // Waits until every running sentinel names a master other than
  // `old_master` and that server answers ROLE "master". Returns its
  // address; kDeadlineExceeded after `timeout`.
  absl::StatusOr<std::string> AwaitFailover(const std::string& old_master,
                                            absl::Duration timeout);
  // The master every running sentinel names now, once that server answers
  // ROLE "master" (with a very small down-after, a loaded machine can see
  // a second, spurious failover right after the first). Updates
  // master_address(); kDeadlineExceeded after `timeout`.
  absl::StatusOr<std::string> AwaitAgreedMaster(absl::Duration timeout) {
    return AwaitFailover("", timeout);
  }
  // Starts a server killed before (KillMaster) again, empty, as a replica
  // of the master the sentinels agree on (AwaitAgreedMaster), and waits
  // until that master reports it online.
  // kDeadlineExceeded after `timeout`; kInvalidArgument for an address that
  // is not a killed server of this set.
  absl::Status RestartAsReplica(const std::string& address,
                                absl::Duration timeout);
  // SIGKILLs sentinel `i` (its port stays reserved and refuses connects).
  void KillSentinel(int i);

  const std::string& master_name() const { return options_.master_name; }
  // "127.0.0.1:<port>" each, in start order.
  std::vector<std::string> sentinel_addresses() const;
  // The master as of Start() or the last AwaitFailover().
  std::string master_address() const;
  // Every data server ever started (master first), killed ones included.
  std::vector<std::string> server_addresses() const;
  // The directory holding every process's config and log.
  const std::string& dir() const { return dir_; }

 private:
  struct Process {
    int port = 0;
    pid_t pid = -1;
    std::string dir;
  };
  absl::Status StartProcess(const std::string& binary, Process& p,
                            const std::string& config, const char* what);
  // The config of data server `p`, a replica of `master_port` if not 0.
  std::string ServerConfig(const Process& p, int master_port) const;
  std::string Address(const Process& p) const;

  RedisSentinelSetOptions options_;
  std::string dir_;
  std::vector<Process> servers_;
  std::vector<Process> sentinels_;
  int master_ = 0;  // Index into servers_.
};

// The redis-sentinel binary, or "" when it is not installed.
std::string FindRedisSentinel();

// Sends one command (`argv`, sent as a RESP array) to 127.0.0.1:`port`,
// after AUTH `password` when it is not empty, and returns the reply in a
// flat text form: a status, error ("-ERR ..."), integer or bulk string as
// its text, nil as "(nil)", an array as its elements joined by '\n'.
// kUnavailable when nothing answered within `timeout`.
absl::StatusOr<std::string> RedisCommandAt(
    int port, const std::vector<std::string>& argv,
    const std::string& password = "",
    absl::Duration timeout = absl::Seconds(2));

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_REDIS_SENTINEL_SET_H_
