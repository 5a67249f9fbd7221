// Cloud: the API the cucumber controller drives (instances and a DNS zone),
// and SimulatedCloud, an in-process implementation of it with latency,
// eventually consistent DNS, injected 5xx errors and fault hooks.
//
//   cucumber::SimulatedCloud cloud({.latency = absl::Milliseconds(10),
//                                   .error_rate = 0.2, .seed = 7});
//   setpoint::Context ctx;
//   absl::StatusOr<cucumber::Instance> vm =
//       cloud.RunInstance(ctx, {{cucumber::kClusterTag, "demo"}});
//   absl::StatusOr<cucumber::DnsChange> change =
//       cloud.UpsertRecord(ctx, "demo.example.com", {vm->private_ip});
//   // Reads show the old record until the change is in sync:
//   cloud.GetChange(ctx, change->id);  // status kPending, later kInSync
//
// Every API call waits `latency` on the caller's Context (so it is
// cancellable; the Context should use the cloud's clock), may fail with
// kUnavailable ("... 503 service unavailable (injected)") at `error_rate`,
// and is counted per kind in stats(). Injected errors happen before a call
// takes effect, so a failed write changed nothing and may simply be retried.
//
// DNS is eventually consistent, like Route 53: a write returns a DnsChange in
// status kPending and becomes visible to GetRecord only `dns_propagation`
// later, when the change turns kInSync. Until then reads return the old
// value. Callers that remember the change id can tell "my write is still
// propagating" from "somebody changed the record".
//
// The Inject*/SetErrorRate hooks play the world behind the controller's back
// (an instance dies, someone deletes the record); they act at once, cost no
// latency, never fail and are not counted. Inspect() is a free, exact view
// for tests and for the demo's verdict.
//
// Thread safety: Cloud implementations must be thread-safe. SimulatedCloud
// is: every method may be called from any thread; blocking waits happen
// without its lock held.
#ifndef SETPOINT_EXAMPLES_CUCUMBER_CLOUD_H_
#define SETPOINT_EXAMPLES_CUCUMBER_CLOUD_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "spdlog/logger.h"

namespace cucumber {

// The tag whose value names the cluster an instance belongs to.
inline constexpr char kClusterTag[] = "cucumber/cluster";

using Tags = std::map<std::string, std::string>;

enum class InstanceState {
  kRunning,     // Up and serving; has a private address.
  kTerminated,  // Gone (terminated by a call or lost); still listed.
};

std::string_view InstanceStateName(InstanceState state);

struct Instance {
  std::string id;  // "i-0001", increasing with every launch.
  Tags tags;
  std::string private_ip;  // "10.0.0.10"; unique per instance.
  InstanceState state = InstanceState::kRunning;
  absl::Time launch_time;
};

// An A record: a name and its addresses (never empty).
struct DnsRecord {
  std::string name;
  std::set<std::string> addresses;
};

enum class ChangeStatus {
  kPending,  // Submitted; reads do not show it yet.
  kInSync,   // Visible to every read.
};

std::string_view ChangeStatusName(ChangeStatus status);

// A submitted DNS write, as Route 53's ChangeInfo.
struct DnsChange {
  std::string id;  // "C0001".
  ChangeStatus status = ChangeStatus::kPending;
  absl::Time submitted;
};

// The instances and DNS API the controller is written against. A real
// implementation would wrap a cloud SDK; SimulatedCloud below fakes one.
// Errors: kUnavailable for transient failures (retry them), kNotFound,
// kInvalidArgument, and the Context's kCancelled/kDeadlineExceeded.
class Cloud {
 public:
  virtual ~Cloud() = default;

  // Returns every instance (terminated ones too) whose tag `tag_key` equals
  // `tag_value`, in launch order.
  virtual absl::StatusOr<std::vector<Instance>> DescribeInstances(
      const setpoint::Context& ctx, const std::string& tag_key,
      const std::string& tag_value) = 0;
  // Launches one instance with `tags`; it is running when this returns.
  virtual absl::StatusOr<Instance> RunInstance(const setpoint::Context& ctx,
                                               const Tags& tags) = 0;
  // Terminates instance `id`. Terminating a terminated instance is OK;
  // kNotFound for an unknown id.
  virtual absl::Status TerminateInstance(const setpoint::Context& ctx,
                                         const std::string& id) = 0;

  // Returns the record `name` as reads currently see it; kNotFound if absent.
  virtual absl::StatusOr<DnsRecord> GetRecord(const setpoint::Context& ctx,
                                              const std::string& name) = 0;
  // Creates or replaces record `name`. kInvalidArgument for an empty or
  // malformed address list. The write is visible once the change is kInSync.
  virtual absl::StatusOr<DnsChange> UpsertRecord(
      const setpoint::Context& ctx, const std::string& name,
      const std::set<std::string>& addresses) = 0;
  // Deletes record `name`; kNotFound if it does not exist (counting writes
  // still propagating). Visible once the change is kInSync.
  virtual absl::StatusOr<DnsChange> DeleteRecord(const setpoint::Context& ctx,
                                                 const std::string& name) = 0;
  // Returns the current status of change `change_id`; kNotFound if unknown.
  virtual absl::StatusOr<DnsChange> GetChange(const setpoint::Context& ctx,
                                              const std::string& change_id) = 0;
};

struct CloudOptions {
  // Where time comes from: latency, propagation and launch times.
  // Default: setpoint::Clock::Real().
  setpoint::Clock* clock = setpoint::Clock::Real();
  // How long every API call takes, waited on the caller's Context.
  // Default: 10 ms.
  absl::Duration latency = absl::Milliseconds(10);
  // How long a DNS write takes to become visible to reads.
  // Default: 300 ms.
  absl::Duration dns_propagation = absl::Milliseconds(300);
  // Fraction of API calls that fail with an injected 503; in [0, 1].
  // Default: 0 (none).
  double error_rate = 0.0;
  // Seed of the error injection; the same seed and call sequence give the
  // same errors.
  // Default: 1.
  uint64_t seed = 1;
  // Where per-call trace lines and injected-error debug lines go.
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Returns kInvalidArgument naming the field when `options` is unusable:
// null clock, negative latency or dns_propagation, error_rate outside [0, 1].
absl::Status ValidateCloudOptions(const CloudOptions& options);

// API calls made, per kind (injected failures included).
struct CloudStats {
  int64_t describe_instances = 0;
  int64_t run_instance = 0;
  int64_t terminate_instance = 0;
  int64_t get_record = 0;
  int64_t upsert_record = 0;
  int64_t delete_record = 0;
  int64_t get_change = 0;
  // Calls that failed with an injected 503.
  int64_t injected_errors = 0;

  int64_t calls() const {
    return describe_instances + run_instance + terminate_instance + get_record +
           upsert_record + delete_record + get_change;
  }
  // Calls that (try to) change the world.
  int64_t writes() const {
    return run_instance + terminate_instance + upsert_record + delete_record;
  }
};

// An exact view of the simulated world, free of latency and errors.
struct CloudSnapshot {
  std::vector<Instance> instances;  // All of them, in launch order.
  // Records as reads see them now (pending changes not applied).
  std::map<std::string, std::set<std::string>> records;
  // Changes submitted but not yet visible.
  int pending_changes = 0;
};

class SimulatedCloud final : public Cloud {
 public:
  // Invalid options are clamped (check them first with ValidateCloudOptions).
  explicit SimulatedCloud(CloudOptions options = {});
  SimulatedCloud(const SimulatedCloud&) = delete;
  SimulatedCloud& operator=(const SimulatedCloud&) = delete;

  absl::StatusOr<std::vector<Instance>> DescribeInstances(
      const setpoint::Context& ctx, const std::string& tag_key,
      const std::string& tag_value) override;
  absl::StatusOr<Instance> RunInstance(const setpoint::Context& ctx,
                                       const Tags& tags) override;
  absl::Status TerminateInstance(const setpoint::Context& ctx,
                                 const std::string& id) override;
  absl::StatusOr<DnsRecord> GetRecord(const setpoint::Context& ctx,
                                      const std::string& name) override;
  absl::StatusOr<DnsChange> UpsertRecord(
      const setpoint::Context& ctx, const std::string& name,
      const std::set<std::string>& addresses) override;
  absl::StatusOr<DnsChange> DeleteRecord(const setpoint::Context& ctx,
                                         const std::string& name) override;
  absl::StatusOr<DnsChange> GetChange(const setpoint::Context& ctx,
                                      const std::string& change_id) override;

  // ---- Faults and inspection (instant, never fail, not counted) ----------

  // Adds a running instance as if someone launched it by hand.
  Instance InjectInstance(const Tags& tags);
  // The instance dies behind the controller's back: it turns terminated.
  // Returns kNotFound for an unknown id, kFailedPrecondition if it is
  // already terminated.
  absl::Status InjectLoseInstance(const std::string& id);
  // Deletes record `name` at once (reads stop seeing it immediately).
  // Returns kNotFound if reads did not see it. Changes still propagating
  // land later on top of this.
  absl::Status InjectDeleteRecord(const std::string& name);
  // Sets record `name` to `addresses` at once (empty deletes it).
  void InjectSetRecord(const std::string& name,
                       const std::set<std::string>& addresses);
  // Changes the fraction of calls failing with an injected 503 (clamped to
  // [0, 1]).
  void SetErrorRate(double rate);
  double error_rate() const;

  CloudSnapshot Inspect();
  CloudStats stats() const;

 private:
  struct ChangeEntry {
    DnsChange change;  // `status` is derived from `visible_at` on read.
    absl::Time visible_at;
  };
  struct PendingWrite {
    std::string change_id;
    std::string name;
    std::optional<std::set<std::string>> addresses;  // nullopt: delete.
    absl::Time visible_at;
  };

  // The common prologue of every API call: waits the latency on `ctx`,
  // counts the call in `*counter`, and decides on an injected error. Returns
  // OK when the call should go ahead.
  absl::Status BeginCall(const setpoint::Context& ctx, std::string_view op,
                         int64_t CloudStats::*counter);
  // Applies pending DNS writes whose time has come.
  void PromoteDnsLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record `name` once every pending write lands.
  std::optional<std::set<std::string>> LatestRecordLocked(
      const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Instance NewInstanceLocked(const Tags& tags, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Instance* FindInstanceLocked(const std::string& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  DnsChange SubmitLocked(const std::string& name,
                         std::optional<std::set<std::string>> addresses,
                         absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CloudOptions options_;
  setpoint::Clock* const clock_;
  spdlog::logger* const logger_;

  mutable setpoint::Mutex mu_;
  double error_rate_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  CloudStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t next_instance_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_change_ ABSL_GUARDED_BY(mu_) = 1;
  // Instances by launch sequence number.
  std::map<int64_t, Instance> instances_ ABSL_GUARDED_BY(mu_);
  // Records as reads see them.
  std::map<std::string, std::set<std::string>> visible_ ABSL_GUARDED_BY(mu_);
  // Writes not yet visible, in submission order.
  std::vector<PendingWrite> pending_ ABSL_GUARDED_BY(mu_);
  // Every change ever submitted, by change id.
  std::map<std::string, ChangeEntry> changes_ ABSL_GUARDED_BY(mu_);
};

// Returns true when `address` is a dotted-quad IPv4 address.
bool IsIpv4Address(std::string_view address);

}  // namespace cucumber

#endif  // SETPOINT_EXAMPLES_CUCUMBER_CLOUD_H_
