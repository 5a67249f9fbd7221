// CucumberPlan: the reactive plan that keeps a cluster of `nodes_num`
// running instances and a DNS record listing exactly their addresses.
//
//   cucumber::SimulatedCloud cloud;
//   cucumber::CucumberPlan plan(&cloud, {.name = "demo", .nodes_num = 3,
//                                        .dns_name = "demo.example.com"});
//   setpoint::Scheduler scheduler;
//   setpoint::ExecutionReport report = scheduler.Execute(ctx, plan);
//
// Create() only observes (instances tagged with the cluster's name, the
// record, the status of the plan's last DNS change) and returns what the
// world still needs, in this order:
//
//   scale up:    reconcile nodes     -> run instance (have 2, want 3) ...
//                update dns record   -> wait for dns change C0004
//   scale down:  update dns record   -> wait for dns change C0007
//                reconcile nodes     -> terminate instance i-0005 ...
//   DNS only:    update dns record   -> wait for dns change ...
//   propagating: wait for dns change (a change the plan made is PENDING)
//
// When scaling down, the record first drops the instances about to go
// (newest first), so clients are not sent to dying instances. Each step
// re-observes when it runs, so it acts on the world as it is then, and the
// next round's Create() catches whatever changed meanwhile (an instance lost
// mid-way, a record edited by hand). The Scheduler repeats rounds until
// Create() returns nothing.
//
// Calls to the cloud may fail with kUnavailable: steps carry a RetryPolicy
// that retries those with backoff on the Context's clock, and Create()
// retries its own reads the same way (the Scheduler does not retry Create).
//
// Thread safety: Create() and the procedures it returns are used by one
// Scheduler at a time (run them with parallelism 1: the steps of a round
// depend on each other's order). SetRequest() and request() may be called
// from any thread; a change applies from the next Create().
#ifndef SETPOINT_EXAMPLES_CUCUMBER_CUCUMBER_PLAN_H_
#define SETPOINT_EXAMPLES_CUCUMBER_CUCUMBER_PLAN_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cucumber/cloud.h"
#include "cucumber/request.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/procedure.h"
#include "spdlog/logger.h"

namespace cucumber {

// The retry policy the plan uses by default for cloud calls: 10 attempts,
// 50 ms doubling to 1 s with 20% jitter, retrying kUnavailable only.
setpoint::RetryPolicy DefaultCloudRetryPolicy();

struct CucumberPlanOptions {
  // Retry policy of every step that calls the cloud.
  // Default: DefaultCloudRetryPolicy().
  setpoint::RetryPolicy step_retry = DefaultCloudRetryPolicy();
  // How Create() retries its reads; `retryable` empty means kUnavailable.
  // Default: DefaultCloudRetryPolicy().
  setpoint::RetryPolicy observe_retry = DefaultCloudRetryPolicy();
  // Time between two polls of a pending DNS change.
  // Default: 50 ms.
  absl::Duration dns_poll_interval = absl::Milliseconds(50);
  // How long one attempt of "wait for dns change" polls before it fails with
  // kDeadlineExceeded (which is not retried).
  // Default: 2 minutes.
  absl::Duration dns_change_timeout = absl::Minutes(2);
  // Seed for the jitter of Create()'s read retries.
  // Default: 1.
  uint64_t seed = 1;
  // Where per-round decisions (debug) and actions (info) are logged.
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

class CucumberPlan final : public setpoint::Plan {
 public:
  // `cloud` must outlive the plan and every procedure it returns. `request`
  // should be valid (see ValidateClusterRequest).
  CucumberPlan(Cloud* cloud, ClusterRequest request,
               CucumberPlanOptions options = {});
  ~CucumberPlan() override;

  // "cucumber/<name>".
  std::string Name() const override;

  // Observes the cloud and returns the steps still needed (see the file
  // comment); empty once the cluster and the record match the request.
  // Errors: a read that failed after every retry (usually kUnavailable,
  // naming the call), or the Context's kCancelled/kDeadlineExceeded.
  absl::StatusOr<setpoint::Procedures> Create(
      const setpoint::Context& ctx) override;

  // Replaces the request (e.g. to scale); used from the next Create() on.
  // Changing name or dns_name leaves the old instances and record alone.
  void SetRequest(ClusterRequest request);
  ClusterRequest request() const;

  // The state shared by the plan and its steps: the last DNS change the
  // plan submitted. Public only so the steps (in the .cc) can name it.
  class DnsChangeLog;

 private:
  Cloud* const cloud_;
  const CucumberPlanOptions options_;
  spdlog::logger* const logger_;
  const std::shared_ptr<DnsChangeLog> changes_;
  std::atomic<uint64_t> observe_seed_;

  mutable setpoint::Mutex mu_;
  ClusterRequest request_ ABSL_GUARDED_BY(mu_);
};

// The running instances of `cluster` in `snapshot`, in launch order.
std::vector<Instance> RunningInstances(const CloudSnapshot& snapshot,
                                       const std::string& cluster);

// Returns OK when `snapshot` matches `request`: exactly nodes_num running
// instances tagged with its name, and the record dns_name (as reads see it)
// listing exactly their addresses (absent when nodes_num is 0). Otherwise
// kFailedPrecondition saying what differs:
//   cluster demo: 2 running instances, want 3
//   dns demo.example.com: has [10.0.0.10], want [10.0.0.10 10.0.0.11]
absl::Status CheckConverged(const CloudSnapshot& snapshot,
                            const ClusterRequest& request);

}  // namespace cucumber

#endif  // SETPOINT_EXAMPLES_CUCUMBER_CUCUMBER_PLAN_H_
