#include "cucumber/cucumber_plan.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "setpoint/base/format.h"
#include "setpoint/base/retry.h"
#include "setpoint/base/status.h"
#include "spdlog/fmt/fmt.h"
#include "spdlog/spdlog.h"

namespace cucumber {

// The last DNS change the plan submitted, so a later round can tell "my
// write is still propagating" (wait for it) from "the record is wrong"
// (write again).
class CucumberPlan::DnsChangeLog {
 public:
  struct Entry {
    std::string change_id;
    std::string name;
    std::set<std::string> addresses;  // Empty for a delete.
  };

  void Record(Entry entry) {
    setpoint::MutexLock l(&mu_);
    last_ = std::move(entry);
  }
  std::optional<Entry> Last() const {
    setpoint::MutexLock l(&mu_);
    return last_;
  }

 private:
  mutable setpoint::Mutex mu_;
  std::optional<Entry> last_ ABSL_GUARDED_BY(mu_);
};

namespace {

using setpoint::Context;
using setpoint::Procedure;
using setpoint::Procedures;
using DnsChangeLog = CucumberPlan::DnsChangeLog;

std::string FormatAddresses(const std::set<std::string>& addresses) {
  return fmt::format("[{}]", fmt::join(addresses, " "));
}

std::string FormatRecord(const std::optional<std::set<std::string>>& record) {
  return record.has_value() ? FormatAddresses(*record) : "missing";
}

// What every step of one Create() call needs.
struct StepEnv {
  Cloud* cloud;
  std::shared_ptr<DnsChangeLog> changes;
  std::shared_ptr<spdlog::logger> logger;
  setpoint::RetryPolicy retry;
  absl::Duration poll_interval;
  absl::Duration change_timeout;
  ClusterRequest request;
};

// The running instances of the cluster, in launch order.
absl::StatusOr<std::vector<Instance>> ListRunning(const Context& ctx,
                                                  const StepEnv& env) {
  SETPOINT_ASSIGN_OR_RETURN(
      std::vector<Instance> all,
      env.cloud->DescribeInstances(ctx, kClusterTag, env.request.name));
  std::vector<Instance> running;
  for (Instance& vm : all) {
    if (vm.state == InstanceState::kRunning) running.push_back(std::move(vm));
  }
  return running;
}

// The record's addresses as reads see them; nullopt when it is absent.
absl::StatusOr<std::optional<std::set<std::string>>> ReadRecord(
    const Context& ctx, const StepEnv& env) {
  absl::StatusOr<DnsRecord> record =
      env.cloud->GetRecord(ctx, env.request.dns_name);
  if (absl::IsNotFound(record.status())) {
    return std::optional<std::set<std::string>>();
  }
  if (!record.ok()) return record.status();
  return std::optional<std::set<std::string>>(std::move(record->addresses));
}

// The instances a scale-down terminates: the newest first. `running` is in
// launch order, so these are its last have - want entries, reversed.
std::vector<Instance> PickVictims(const std::vector<Instance>& running,
                                  int want) {
  std::vector<Instance> victims;
  for (size_t i = running.size(); i > static_cast<size_t>(want); --i) {
    victims.push_back(running[i - 1]);
  }
  return victims;
}

// The addresses the record should list now: those of the running instances
// that stay (all of them unless scaling down).
std::set<std::string> KeptAddresses(const std::vector<Instance>& running,
                                    int want) {
  std::set<std::string> kept;
  for (size_t i = 0; i < running.size() && i < static_cast<size_t>(want); ++i) {
    kept.insert(running[i].private_ip);
  }
  return kept;
}

bool RecordMatches(const std::optional<std::set<std::string>>& record,
                   const std::set<std::string>& want) {
  return record.has_value() ? *record == want : want.empty();
}

std::string JoinIds(const std::vector<Instance>& instances) {
  std::vector<std::string> ids;
  for (const Instance& vm : instances) ids.push_back(vm.id);
  return fmt::format("{}", fmt::join(ids, ", "));
}

// Polls a DNS change until it is INSYNC.
class WaitForDnsChange final : public Procedure {
 public:
  WaitForDnsChange(std::shared_ptr<const StepEnv> env, std::string change_id)
      : Procedure(fmt::format("wait for dns change {}", change_id)),
        env_(std::move(env)),
        change_id_(std::move(change_id)) {
    set_retry_policy(env_->retry);
  }

  std::string Description() const override {
    return fmt::format(
        "change {} to {} is PENDING (reads show the old record); wait until "
        "it is INSYNC",
        change_id_, env_->request.dns_name);
  }

  absl::StatusOr<Procedures> Do(const Context& ctx) override {
    absl::Time start = ctx.clock()->Now();
    while (true) {
      SETPOINT_ASSIGN_OR_RETURN(DnsChange change,
                                env_->cloud->GetChange(ctx, change_id_));
      if (change.status == ChangeStatus::kInSync) {
        SPDLOG_LOGGER_DEBUG(env_->logger,
                            "dns change in sync cluster={} change={}",
                            env_->request.name, change_id_);
        return Procedures{};
      }
      absl::Duration waited = ctx.clock()->Now() - start;
      if (waited >= env_->change_timeout) {
        return absl::DeadlineExceededError(fmt::format(
            "wait for dns change {} record={}: still {} after {}", change_id_,
            env_->request.dns_name, ChangeStatusName(change.status), waited));
      }
      SETPOINT_RETURN_IF_ERROR(ctx.Wait(
          std::min(env_->poll_interval, env_->change_timeout - waited)));
    }
  }

 private:
  std::shared_ptr<const StepEnv> env_;
  std::string change_id_;
};

// Points the record at the instances that stay (deletes it when none do),
// then waits for the change to propagate.
class UpdateDnsRecord final : public Procedure {
 public:
  UpdateDnsRecord(std::shared_ptr<const StepEnv> env, std::string description)
      : Procedure("update dns record"),
        env_(std::move(env)),
        description_(std::move(description)) {
    set_retry_policy(env_->retry);
  }

  std::string Description() const override { return description_; }

  absl::StatusOr<Procedures> Do(const Context& ctx) override {
    const ClusterRequest& req = env_->request;
    SETPOINT_ASSIGN_OR_RETURN(std::vector<Instance> running,
                              ListRunning(ctx, *env_));
    std::set<std::string> want = KeptAddresses(running, req.nodes_num);
    SETPOINT_ASSIGN_OR_RETURN(auto record, ReadRecord(ctx, *env_));
    if (RecordMatches(record, want)) {
      SPDLOG_LOGGER_DEBUG(env_->logger,
                          "dns already up to date cluster={} record={} "
                          "addresses={}",
                          req.name, req.dns_name, FormatRecord(record));
      return Procedures{};
    }
    // A change of ours to exactly these addresses may still be propagating.
    std::optional<DnsChangeLog::Entry> last = env_->changes->Last();
    if (last.has_value() && last->name == req.dns_name &&
        last->addresses == want) {
      absl::StatusOr<DnsChange> change =
          env_->cloud->GetChange(ctx, last->change_id);
      if (!change.ok() && !absl::IsNotFound(change.status())) {
        return change.status();
      }
      if (change.ok() && change->status == ChangeStatus::kPending) {
        return setpoint::ProcedureList(
            std::make_unique<WaitForDnsChange>(env_, change->id));
      }
    }
    DnsChange change;
    if (want.empty()) {
      absl::StatusOr<DnsChange> deleted =
          env_->cloud->DeleteRecord(ctx, req.dns_name);
      if (absl::IsNotFound(deleted.status())) {
        return Procedures{};  // A delete is already on its way.
      }
      if (!deleted.ok()) return deleted.status();
      change = *deleted;
    } else {
      SETPOINT_ASSIGN_OR_RETURN(
          change, env_->cloud->UpsertRecord(ctx, req.dns_name, want));
    }
    env_->changes->Record({change.id, req.dns_name, want});
    SPDLOG_LOGGER_INFO(
        env_->logger,
        "dns change submitted cluster={} record={} change={} "
        "from={} to={}",
        req.name, req.dns_name, change.id, FormatRecord(record),
        want.empty() ? std::string("deleted") : FormatAddresses(want));
    if (change.status == ChangeStatus::kInSync) return Procedures{};
    return setpoint::ProcedureList(
        std::make_unique<WaitForDnsChange>(env_, change.id));
  }

 private:
  std::shared_ptr<const StepEnv> env_;
  std::string description_;
};

class RunInstance final : public Procedure {
 public:
  RunInstance(std::shared_ptr<const StepEnv> env, int have)
      : Procedure(fmt::format("run instance (have {}, want {})", have,
                              env->request.nodes_num)),
        env_(std::move(env)),
        have_(have) {
    set_retry_policy(env_->retry);
  }

  std::string Description() const override {
    return fmt::format("run instance in cluster {} (have {}, want {})",
                       env_->request.name, have_, env_->request.nodes_num);
  }

  absl::StatusOr<Procedures> Do(const Context& ctx) override {
    SETPOINT_ASSIGN_OR_RETURN(
        Instance vm,
        env_->cloud->RunInstance(ctx, {{kClusterTag, env_->request.name},
                                       {"managed-by", "cucumber"}}));
    SPDLOG_LOGGER_INFO(env_->logger, "instance started cluster={} id={} ip={}",
                       env_->request.name, vm.id, vm.private_ip);
    return Procedures{};
  }

 private:
  std::shared_ptr<const StepEnv> env_;
  int have_;
};

class TerminateInstance final : public Procedure {
 public:
  TerminateInstance(std::shared_ptr<const StepEnv> env, Instance vm, int have)
      : Procedure(fmt::format("terminate instance {}", vm.id)),
        env_(std::move(env)),
        vm_(std::move(vm)),
        have_(have) {
    set_retry_policy(env_->retry);
  }

  std::string Description() const override {
    return fmt::format(
        "terminate instance {} ({}) in cluster {} (have {}, "
        "want {})",
        vm_.id, vm_.private_ip, env_->request.name, have_,
        env_->request.nodes_num);
  }

  absl::StatusOr<Procedures> Do(const Context& ctx) override {
    absl::Status s = env_->cloud->TerminateInstance(ctx, vm_.id);
    if (!s.ok() && !absl::IsNotFound(s)) return s;  // NotFound: gone already.
    SPDLOG_LOGGER_INFO(env_->logger,
                       "instance terminated cluster={} id={} ip={}",
                       env_->request.name, vm_.id, vm_.private_ip);
    return Procedures{};
  }

 private:
  std::shared_ptr<const StepEnv> env_;
  Instance vm_;
  int have_;
};

// Looks at the cluster again and returns the run/terminate steps that bring
// it to nodes_num.
class ReconcileNodes final : public Procedure {
 public:
  ReconcileNodes(std::shared_ptr<const StepEnv> env, std::string description)
      : Procedure("reconcile nodes"),
        env_(std::move(env)),
        description_(std::move(description)) {
    set_retry_policy(env_->retry);
  }

  std::string Description() const override { return description_; }

  absl::StatusOr<Procedures> Do(const Context& ctx) override {
    SETPOINT_ASSIGN_OR_RETURN(std::vector<Instance> running,
                              ListRunning(ctx, *env_));
    const int have = static_cast<int>(running.size());
    const int want = env_->request.nodes_num;
    SPDLOG_LOGGER_DEBUG(env_->logger,
                        "nodes reconciling cluster={} have={} want={}",
                        env_->request.name, have, want);
    Procedures steps;
    for (int n = have; n < want; ++n) {
      steps.push_back(std::make_unique<RunInstance>(env_, n));
    }
    int n = have;
    for (Instance& vm : PickVictims(running, want)) {
      steps.push_back(
          std::make_unique<TerminateInstance>(env_, std::move(vm), n--));
    }
    return steps;
  }

 private:
  std::shared_ptr<const StepEnv> env_;
  std::string description_;
};

// Runs one read of Create() with setpoint::Retry, logging each retry: a 503
// while observing should not abort the whole execution.
template <typename T, typename Fn>
absl::StatusOr<T> Observe(const Context& ctx,
                          const setpoint::RetryPolicy& policy, uint64_t seed,
                          spdlog::logger* logger, const std::string& plan,
                          Fn&& call) {
  int attempts = 0;
  absl::StatusOr<T> result = setpoint::Retry(
      ctx, policy, [&]() -> absl::StatusOr<T> { return call(); },
      [&](int attempt, const absl::Status& error, absl::Duration delay) {
        SPDLOG_LOGGER_WARN(
            logger, "retrying read plan={} attempt={}/{} after={} err={}", plan,
            attempt, policy.max_attempts, delay, error);
        return true;
      },
      seed, &attempts);
  if (!result.ok() && attempts > 1 && attempts >= policy.max_attempts) {
    return setpoint::Annotate(
        result.status(), fmt::format("gave up after {} attempts", attempts));
  }
  return result;
}

}  // namespace

setpoint::RetryPolicy DefaultCloudRetryPolicy() {
  return setpoint::RetryPolicy{
      .max_attempts = 10,
      .backoff = {.initial = absl::Milliseconds(50),
                  .max = absl::Seconds(1),
                  .multiplier = 2.0,
                  .jitter = 0.2},
      .retryable = [](const absl::Status& s) { return absl::IsUnavailable(s); },
  };
}

CucumberPlan::CucumberPlan(Cloud* cloud, ClusterRequest request,
                           CucumberPlanOptions options)
    : cloud_(cloud),
      options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger.get()
                                         : spdlog::default_logger().get()),
      changes_(std::make_shared<DnsChangeLog>()),
      observe_seed_(options_.seed),
      request_(std::move(request)) {
  SETPOINT_CHECK(cloud_ != nullptr);
}

CucumberPlan::~CucumberPlan() = default;

std::string CucumberPlan::Name() const {
  setpoint::MutexLock l(&mu_);
  return fmt::format("cucumber/{}", request_.name);
}

void CucumberPlan::SetRequest(ClusterRequest request) {
  setpoint::MutexLock l(&mu_);
  request_ = std::move(request);
}

ClusterRequest CucumberPlan::request() const {
  setpoint::MutexLock l(&mu_);
  return request_;
}

absl::StatusOr<setpoint::Procedures> CucumberPlan::Create(const Context& ctx) {
  auto env = std::make_shared<StepEnv>(StepEnv{
      .cloud = cloud_,
      .changes = changes_,
      .logger = options_.logger != nullptr ? options_.logger
                                           : spdlog::default_logger(),
      .retry = options_.step_retry,
      .poll_interval = options_.dns_poll_interval,
      .change_timeout = options_.dns_change_timeout,
      .request = request(),
  });
  const ClusterRequest& req = env->request;
  const std::string plan = fmt::format("cucumber/{}", req.name);
  const uint64_t seed = observe_seed_.fetch_add(3);  // Three reads below.

  SETPOINT_ASSIGN_OR_RETURN(std::vector<Instance> running,
                            Observe<std::vector<Instance>>(
                                ctx, options_.observe_retry, seed, logger_,
                                plan, [&] { return ListRunning(ctx, *env); }));
  SETPOINT_ASSIGN_OR_RETURN(std::optional<std::set<std::string>> record,
                            Observe<std::optional<std::set<std::string>>>(
                                ctx, options_.observe_retry, seed + 1, logger_,
                                plan, [&] { return ReadRecord(ctx, *env); }));

  const int have = static_cast<int>(running.size());
  const int want = req.nodes_num;
  const std::set<std::string> kept = KeptAddresses(running, want);
  // Scaling up, the record must change once the new instances run.
  const bool dns_ok = have >= want && RecordMatches(record, kept);

  // The DNS step: wait for a change of ours that is still propagating, or
  // write the record.
  std::unique_ptr<Procedure> dns_step;
  if (!dns_ok) {
    std::optional<DnsChangeLog::Entry> last = changes_->Last();
    if (have >= want && last.has_value() && last->name == req.dns_name &&
        last->addresses == kept) {
      SETPOINT_ASSIGN_OR_RETURN(
          std::optional<DnsChange> change,
          Observe<std::optional<DnsChange>>(
              ctx, options_.observe_retry, seed + 2, logger_, plan,
              [&]() -> absl::StatusOr<std::optional<DnsChange>> {
                absl::StatusOr<DnsChange> c =
                    cloud_->GetChange(ctx, last->change_id);
                if (absl::IsNotFound(c.status())) return std::nullopt;
                if (!c.ok()) return c.status();
                return std::optional<DnsChange>(*c);
              }));
      if (change.has_value() && change->status == ChangeStatus::kPending) {
        dns_step = std::make_unique<WaitForDnsChange>(env, change->id);
      }
    }
    if (dns_step == nullptr) {
      std::string description;
      if (have < want) {
        description = fmt::format(
            "after the new instances run, set {} to the addresses of all {} "
            "(now {})",
            req.dns_name, want, FormatRecord(record));
      } else if (kept.empty()) {
        description = fmt::format("delete {}: cluster {} wants no instances",
                                  req.dns_name, req.name);
      } else if (have > want) {
        description = fmt::format(
            "first drop the {} leaving instances: set {} to {} (now {})",
            have - want, req.dns_name, FormatAddresses(kept),
            FormatRecord(record));
      } else {
        description = fmt::format("set {} to {} (now {})", req.dns_name,
                                  FormatAddresses(kept), FormatRecord(record));
      }
      dns_step = std::make_unique<UpdateDnsRecord>(env, std::move(description));
    }
  }

  Procedures steps;
  std::string nodes_description;
  if (have < want) {
    nodes_description =
        fmt::format("cluster {} has {} running instances, wants {}: run {}",
                    req.name, have, want, want - have);
  } else if (have > want) {
    nodes_description = fmt::format(
        "cluster {} has {} running instances, wants {}: terminate {} (newest "
        "first)",
        req.name, have, want, JoinIds(PickVictims(running, want)));
  }
  // Scaling down, the record drops the leaving instances before they go.
  if (have > want && dns_step != nullptr) steps.push_back(std::move(dns_step));
  if (have != want) {
    steps.push_back(
        std::make_unique<ReconcileNodes>(env, std::move(nodes_description)));
  }
  if (dns_step != nullptr) steps.push_back(std::move(dns_step));

  SPDLOG_LOGGER_DEBUG(logger_,
                      "plan decided plan={} have={} want={} record={} "
                      "kept={} steps={}",
                      plan, have, want, FormatRecord(record),
                      FormatAddresses(kept), steps.size());
  return steps;
}

std::vector<Instance> RunningInstances(const CloudSnapshot& snapshot,
                                       const std::string& cluster) {
  std::vector<Instance> running;
  for (const Instance& vm : snapshot.instances) {
    auto tag = vm.tags.find(kClusterTag);
    if (vm.state == InstanceState::kRunning && tag != vm.tags.end() &&
        tag->second == cluster) {
      running.push_back(vm);
    }
  }
  return running;
}

absl::Status CheckConverged(const CloudSnapshot& snapshot,
                            const ClusterRequest& request) {
  std::vector<Instance> running = RunningInstances(snapshot, request.name);
  if (static_cast<int>(running.size()) != request.nodes_num) {
    return absl::FailedPreconditionError(
        fmt::format("cluster {}: {} running instances, want {}", request.name,
                    running.size(), request.nodes_num));
  }
  std::set<std::string> want;
  for (const Instance& vm : running) want.insert(vm.private_ip);
  std::optional<std::set<std::string>> record;
  if (auto it = snapshot.records.find(request.dns_name);
      it != snapshot.records.end()) {
    record = it->second;
  }
  if (!RecordMatches(record, want)) {
    return absl::FailedPreconditionError(fmt::format(
        "dns {}: has {}, want {}", request.dns_name, FormatRecord(record),
        want.empty() ? std::string("no record") : FormatAddresses(want)));
  }
  return absl::OkStatus();
}

}  // namespace cucumber
