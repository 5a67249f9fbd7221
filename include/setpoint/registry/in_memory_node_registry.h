// InMemoryNodeRegistry: a NodeRegistry inside one process, with the same
// semantics as the Redis one (leases on its clock, tokens that only grow,
// grants only into free space). The embedded default for a single pod, and
// what unit tests use with a SimulatedClock.
//
//   InMemoryNodeRegistry registry;                 // real clock
//   NodeManager manager({.registry = &registry, ...});
//
// ForgetEverything() plays a registry that lost its state, drain flags
// included (a Redis restart without persistence), for tests of the epoch rule.
// Tokens keep growing across it, as they do on Redis.
//
// Thread safety: thread-safe. Change listeners run on the thread whose
// operation changed something, after the registry's state lock is released;
// they must not call back into the registry.
#ifndef SETPOINT_REGISTRY_IN_MEMORY_NODE_REGISTRY_H_
#define SETPOINT_REGISTRY_IN_MEMORY_NODE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/mutex.h"
#include "setpoint/node/node_registry.h"

namespace setpoint {

struct InMemoryNodeRegistryOptions {
  // Leases expire on this clock, and Describe() reports its times on it
  // (server_time, lease expiries, drained since): compare them with
  // server_time; with the monotonic default they are not dates. Must not
  // step, like NodeManagerOptions::clock.
  // Default: Clock::Monotonic().
  Clock* clock = nullptr;
};

class InMemoryNodeRegistry : public NodeRegistry {
 public:
  explicit InMemoryNodeRegistry(InMemoryNodeRegistryOptions options = {});

  absl::StatusOr<PollResult> Poll(const Context& ctx,
                                  const PollRequest& request) override;
  absl::Status Release(const Context& ctx, const std::string& kind,
                       const std::string& node_id, Assignment keep) override;
  absl::StatusOr<uint64_t> Grant(const Context& ctx, const std::string& kind,
                                 const std::string& node_id, ShardSet target,
                                 const std::string& epoch) override;
  absl::Status Deregister(const Context& ctx, const std::string& kind,
                          const std::vector<std::string>& node_ids) override;
  absl::Status SetDrained(const Context& ctx, const std::string& pod_id,
                          bool drained) override;
  absl::StatusOr<RegistryDescription> Describe(const Context& ctx) override;
  int64_t AddChangeListener(std::function<void()> listener) override;
  void RemoveChangeListener(int64_t id) override;

  // Drops every member, range and token counter and starts a new epoch;
  // grants are refused for `grace` (give the lease length).
  void ForgetEverything(absl::Duration grace);

  // A copy of the whole state, and putting one back: plays a Redis that
  // restarts from an older snapshot. Restore brings back the snapshot's
  // epoch and version, as Redis would; like the Redis registry (which sees
  // the server's run id change), the next poll starts a new epoch with
  // grants refused for one lease. Tokens keep growing across it.
  struct Snapshot;
  Snapshot TakeSnapshot() const;
  void Restore(const Snapshot& snapshot);
  // Restore, as a failover to a replica that lacks everything after the
  // snapshot, token counters included: the tokens granted since are
  // forgotten (Restore keeps them as a floor). Only what the pods report
  // (PollRequest::min_tokens) keeps the next grants above them.
  void FailOverTo(const Snapshot& snapshot);

  // Writes a record for `node_id` as someone else might (tests of the rule
  // that a node whose record differs from what it holds stops at once).
  void OverwriteHeld(const std::string& kind, const std::string& node_id,
                     Assignment record);

  // Operations served so far (for tests that count round trips).
  int64_t operations() const;

 private:
  struct Kind {
    std::map<std::string, absl::Time> expiry;  // Live members' leases.
    std::map<std::string, Assignment> held;
    uint64_t last_token = 0;
    uint32_t ring_size = 0;  // From the last poll that gave one.
  };
  // Drops members of `kind` whose lease ended by `now`; true if any.
  static bool Expire(Kind& kind, absl::Time now);
  void Changed();
  void NewEpochLocked(absl::Duration grace) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

 public:
  struct Snapshot {
    std::map<std::string, Kind> kinds;
    std::map<std::string, absl::Time> drained;
    std::string epoch;
    absl::Time grants_from;
    uint64_t version = 0;
  };

 private:
  Clock* const clock_;
  mutable Mutex mu_;
  std::map<std::string, Kind> kinds_ ABSL_GUARDED_BY(mu_);
  // Drained pod -> when it was drained.
  std::map<std::string, absl::Time> drained_ ABSL_GUARDED_BY(mu_);
  std::string epoch_ ABSL_GUARDED_BY(mu_);
  uint64_t epochs_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time grants_from_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t operations_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool restarted_ ABSL_GUARDED_BY(mu_) = false;  // Restore() ran.
  uint64_t token_floor_ ABSL_GUARDED_BY(mu_) = 0;
  // Held while listeners run, so removal waits for a running one.
  Mutex listeners_mu_;
  std::map<int64_t, std::function<void()>> listeners_
      ABSL_GUARDED_BY(listeners_mu_);
  int64_t next_listener_ ABSL_GUARDED_BY(listeners_mu_) = 1;
};

}  // namespace setpoint

#endif  // SETPOINT_REGISTRY_IN_MEMORY_NODE_REGISTRY_H_
