#include "cucumber/cloud.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "setpoint/base/format.h"
#include "setpoint/base/status.h"
#include "spdlog/fmt/fmt.h"
#include "spdlog/spdlog.h"

namespace cucumber {
namespace {

CloudOptions Clamp(CloudOptions o) {
  if (o.clock == nullptr) o.clock = setpoint::Clock::Real();
  o.latency = std::max(o.latency, absl::ZeroDuration());
  o.dns_propagation = std::max(o.dns_propagation, absl::ZeroDuration());
  if (!(o.error_rate >= 0.0)) o.error_rate = 0.0;  // Also catches NaN.
  o.error_rate = std::min(o.error_rate, 1.0);
  if (o.logger == nullptr) o.logger = spdlog::default_logger();
  return o;
}

double ClampRate(double rate) {
  if (!(rate >= 0.0)) return 0.0;
  return std::min(rate, 1.0);
}

std::string FormatAddresses(const std::set<std::string>& addresses) {
  return fmt::format("[{}]", fmt::join(addresses, " "));
}

}  // namespace

std::string_view InstanceStateName(InstanceState state) {
  switch (state) {
    case InstanceState::kRunning:
      return "running";
    case InstanceState::kTerminated:
      return "terminated";
  }
  return "unknown";
}

std::string_view ChangeStatusName(ChangeStatus status) {
  switch (status) {
    case ChangeStatus::kPending:
      return "PENDING";
    case ChangeStatus::kInSync:
      return "INSYNC";
  }
  return "UNKNOWN";
}

bool IsIpv4Address(std::string_view address) {
  std::vector<absl::string_view> parts =
      absl::StrSplit(absl::string_view(address.data(), address.size()), '.');
  if (parts.size() != 4) return false;
  for (absl::string_view part : parts) {
    if (part.empty() || part.size() > 3) return false;
    if (part.size() > 1 && part[0] == '0') return false;
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 0 || value > 255) {
      return false;
    }
    for (char c : part) {
      if (c < '0' || c > '9') return false;
    }
  }
  return true;
}

absl::Status ValidateCloudOptions(const CloudOptions& o) {
  if (o.clock == nullptr) {
    return absl::InvalidArgumentError("cloud options: clock is null");
  }
  if (o.latency < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        fmt::format("cloud options: latency must be >= 0, got {}", o.latency));
  }
  if (o.dns_propagation < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        fmt::format("cloud options: dns_propagation must be >= 0, got {}",
                    o.dns_propagation));
  }
  if (!(o.error_rate >= 0.0 && o.error_rate <= 1.0)) {
    return absl::InvalidArgumentError(fmt::format(
        "cloud options: error_rate must be in [0, 1], got {}", o.error_rate));
  }
  return absl::OkStatus();
}

SimulatedCloud::SimulatedCloud(CloudOptions options)
    : options_(Clamp(std::move(options))),
      clock_(options_.clock),
      logger_(options_.logger.get()),
      error_rate_(options_.error_rate),
      rng_(options_.seed) {}

absl::Status SimulatedCloud::BeginCall(const setpoint::Context& ctx,
                                       std::string_view op,
                                       int64_t CloudStats::*counter) {
  if (options_.latency > absl::ZeroDuration()) {
    SETPOINT_RETURN_IF_ERROR(
        setpoint::Annotate(ctx.Wait(options_.latency), op));
  } else {
    SETPOINT_RETURN_IF_ERROR(setpoint::Annotate(ctx.Err(), op));
  }
  setpoint::MutexLock l(&mu_);
  ++(stats_.*counter);
  if (error_rate_ > 0.0) {
    std::uniform_real_distribution<double> draw(0.0, 1.0);
    if (draw(rng_) < error_rate_) {
      ++stats_.injected_errors;
      SPDLOG_LOGGER_DEBUG(logger_, "cloud error injected op=\"{}\"", op);
      return absl::UnavailableError(
          fmt::format("{}: 503 service unavailable (injected)", op));
    }
  }
  SPDLOG_LOGGER_TRACE(logger_, "cloud call op=\"{}\"", op);
  return absl::OkStatus();
}

void SimulatedCloud::PromoteDnsLocked(absl::Time now) {
  size_t applied = 0;
  for (; applied < pending_.size(); ++applied) {
    PendingWrite& w = pending_[applied];
    if (w.visible_at > now) break;
    if (w.addresses.has_value()) {
      visible_[w.name] = std::move(*w.addresses);
    } else {
      visible_.erase(w.name);
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + applied);
}

std::optional<std::set<std::string>> SimulatedCloud::LatestRecordLocked(
    const std::string& name) {
  std::optional<std::set<std::string>> latest;
  if (auto it = visible_.find(name); it != visible_.end()) latest = it->second;
  for (const PendingWrite& w : pending_) {
    if (w.name == name) latest = w.addresses;
  }
  return latest;
}

Instance SimulatedCloud::NewInstanceLocked(const Tags& tags, absl::Time now) {
  int64_t n = next_instance_++;
  Instance vm;
  vm.id = fmt::format("i-{:04d}", n);
  vm.tags = tags;
  vm.private_ip = fmt::format("10.0.{}.{}", (n - 1) / 200, 10 + (n - 1) % 200);
  vm.state = InstanceState::kRunning;
  vm.launch_time = now;
  instances_.emplace(n, vm);
  return vm;
}

Instance* SimulatedCloud::FindInstanceLocked(const std::string& id) {
  for (auto& [n, vm] : instances_) {
    if (vm.id == id) return &vm;
  }
  return nullptr;
}

DnsChange SimulatedCloud::SubmitLocked(
    const std::string& name, std::optional<std::set<std::string>> addresses,
    absl::Time now) {
  DnsChange change;
  change.id = fmt::format("C{:04d}", next_change_++);
  change.status = options_.dns_propagation > absl::ZeroDuration()
                      ? ChangeStatus::kPending
                      : ChangeStatus::kInSync;
  change.submitted = now;
  absl::Time visible_at = now + options_.dns_propagation;
  changes_[change.id] = ChangeEntry{change, visible_at};
  pending_.push_back(
      PendingWrite{change.id, name, std::move(addresses), visible_at});
  PromoteDnsLocked(now);
  return change;
}

absl::StatusOr<std::vector<Instance>> SimulatedCloud::DescribeInstances(
    const setpoint::Context& ctx, const std::string& tag_key,
    const std::string& tag_value) {
  std::string op = fmt::format("describe instances {}={}", tag_key, tag_value);
  SETPOINT_RETURN_IF_ERROR(BeginCall(ctx, op, &CloudStats::describe_instances));
  setpoint::MutexLock l(&mu_);
  std::vector<Instance> out;
  for (const auto& [n, vm] : instances_) {
    auto it = vm.tags.find(tag_key);
    if (it != vm.tags.end() && it->second == tag_value) out.push_back(vm);
  }
  return out;
}

absl::StatusOr<Instance> SimulatedCloud::RunInstance(
    const setpoint::Context& ctx, const Tags& tags) {
  auto cluster = tags.find(kClusterTag);
  std::string op = fmt::format(
      "run instance {}={}", kClusterTag,
      cluster == tags.end() ? std::string("(none)") : cluster->second);
  SETPOINT_RETURN_IF_ERROR(BeginCall(ctx, op, &CloudStats::run_instance));
  setpoint::MutexLock l(&mu_);
  Instance vm = NewInstanceLocked(tags, clock_->Now());
  SPDLOG_LOGGER_DEBUG(logger_, "cloud instance launched id={} ip={}", vm.id,
                      vm.private_ip);
  return vm;
}

absl::Status SimulatedCloud::TerminateInstance(const setpoint::Context& ctx,
                                               const std::string& id) {
  std::string op = fmt::format("terminate instance {}", id);
  SETPOINT_RETURN_IF_ERROR(BeginCall(ctx, op, &CloudStats::terminate_instance));
  setpoint::MutexLock l(&mu_);
  Instance* vm = FindInstanceLocked(id);
  if (vm == nullptr) {
    return absl::NotFoundError(fmt::format("{}: no such instance", op));
  }
  if (vm->state != InstanceState::kTerminated) {
    vm->state = InstanceState::kTerminated;
    SPDLOG_LOGGER_DEBUG(logger_, "cloud instance terminated id={} ip={}",
                        vm->id, vm->private_ip);
  }
  return absl::OkStatus();
}

absl::StatusOr<DnsRecord> SimulatedCloud::GetRecord(
    const setpoint::Context& ctx, const std::string& name) {
  std::string op = fmt::format("get record {}", name);
  SETPOINT_RETURN_IF_ERROR(BeginCall(ctx, op, &CloudStats::get_record));
  setpoint::MutexLock l(&mu_);
  PromoteDnsLocked(clock_->Now());
  auto it = visible_.find(name);
  if (it == visible_.end()) {
    return absl::NotFoundError(fmt::format("{}: no such record", op));
  }
  return DnsRecord{name, it->second};
}

absl::StatusOr<DnsChange> SimulatedCloud::UpsertRecord(
    const setpoint::Context& ctx, const std::string& name,
    const std::set<std::string>& addresses) {
  std::string op =
      fmt::format("upsert record {} {}", name, FormatAddresses(addresses));
  if (addresses.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: an A record needs at least one address", op));
  }
  for (const std::string& a : addresses) {
    if (!IsIpv4Address(a)) {
      return absl::InvalidArgumentError(
          fmt::format("{}: \"{}\" is not an IPv4 address", op, a));
    }
  }
  SETPOINT_RETURN_IF_ERROR(BeginCall(ctx, op, &CloudStats::upsert_record));
  setpoint::MutexLock l(&mu_);
  DnsChange change = SubmitLocked(name, addresses, clock_->Now());
  SPDLOG_LOGGER_DEBUG(logger_, "cloud dns change submitted change={} op=\"{}\"",
                      change.id, op);
  return change;
}

absl::StatusOr<DnsChange> SimulatedCloud::DeleteRecord(
    const setpoint::Context& ctx, const std::string& name) {
  std::string op = fmt::format("delete record {}", name);
  SETPOINT_RETURN_IF_ERROR(BeginCall(ctx, op, &CloudStats::delete_record));
  setpoint::MutexLock l(&mu_);
  absl::Time now = clock_->Now();
  PromoteDnsLocked(now);
  if (!LatestRecordLocked(name).has_value()) {
    return absl::NotFoundError(fmt::format("{}: no such record", op));
  }
  DnsChange change = SubmitLocked(name, std::nullopt, now);
  SPDLOG_LOGGER_DEBUG(logger_, "cloud dns change submitted change={} op=\"{}\"",
                      change.id, op);
  return change;
}

absl::StatusOr<DnsChange> SimulatedCloud::GetChange(
    const setpoint::Context& ctx, const std::string& change_id) {
  std::string op = fmt::format("get change {}", change_id);
  SETPOINT_RETURN_IF_ERROR(BeginCall(ctx, op, &CloudStats::get_change));
  setpoint::MutexLock l(&mu_);
  absl::Time now = clock_->Now();
  PromoteDnsLocked(now);
  auto it = changes_.find(change_id);
  if (it == changes_.end()) {
    return absl::NotFoundError(fmt::format("{}: no such change", op));
  }
  DnsChange change = it->second.change;
  change.status = now >= it->second.visible_at ? ChangeStatus::kInSync
                                               : ChangeStatus::kPending;
  return change;
}

Instance SimulatedCloud::InjectInstance(const Tags& tags) {
  setpoint::MutexLock l(&mu_);
  return NewInstanceLocked(tags, clock_->Now());
}

absl::Status SimulatedCloud::InjectLoseInstance(const std::string& id) {
  setpoint::MutexLock l(&mu_);
  Instance* vm = FindInstanceLocked(id);
  if (vm == nullptr) {
    return absl::NotFoundError(
        fmt::format("lose instance {}: no such instance", id));
  }
  if (vm->state == InstanceState::kTerminated) {
    return absl::FailedPreconditionError(
        fmt::format("lose instance {}: already terminated", id));
  }
  vm->state = InstanceState::kTerminated;
  return absl::OkStatus();
}

absl::Status SimulatedCloud::InjectDeleteRecord(const std::string& name) {
  setpoint::MutexLock l(&mu_);
  PromoteDnsLocked(clock_->Now());
  if (visible_.erase(name) == 0) {
    return absl::NotFoundError(
        fmt::format("inject delete record {}: no such record", name));
  }
  return absl::OkStatus();
}

void SimulatedCloud::InjectSetRecord(const std::string& name,
                                     const std::set<std::string>& addresses) {
  setpoint::MutexLock l(&mu_);
  PromoteDnsLocked(clock_->Now());
  if (addresses.empty()) {
    visible_.erase(name);
  } else {
    visible_[name] = addresses;
  }
}

void SimulatedCloud::SetErrorRate(double rate) {
  setpoint::MutexLock l(&mu_);
  error_rate_ = ClampRate(rate);
}

double SimulatedCloud::error_rate() const {
  setpoint::MutexLock l(&mu_);
  return error_rate_;
}

CloudSnapshot SimulatedCloud::Inspect() {
  setpoint::MutexLock l(&mu_);
  PromoteDnsLocked(clock_->Now());
  CloudSnapshot snap;
  snap.instances.reserve(instances_.size());
  for (const auto& [n, vm] : instances_) snap.instances.push_back(vm);
  snap.records = visible_;
  snap.pending_changes = static_cast<int>(pending_.size());
  return snap;
}

CloudStats SimulatedCloud::stats() const {
  setpoint::MutexLock l(&mu_);
  return stats_;
}

}  // namespace cucumber
