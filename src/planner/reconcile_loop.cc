#include "setpoint/planner/reconcile_loop.h"

#include <pthread.h>

#include <algorithm>
#include <exception>
#include <random>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/format.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

ReconcileLoopOptions Clamp(ReconcileLoopOptions o) {
  if (o.interval <= absl::ZeroDuration()) o.interval = absl::Milliseconds(1);
  if (!(o.jitter >= 0.0)) o.jitter = 0.0;
  if (o.jitter > 1.0) o.jitter = 1.0;
  if (o.clock == nullptr) o.clock = Clock::Real();
  if (o.logger == nullptr) o.logger = spdlog::default_logger();
  // The application may have dropped the default logger: log nowhere then.
  if (o.logger == nullptr)
    o.logger = std::make_shared<spdlog::logger>("setpoint");
  if (o.scheduler.logger == nullptr) o.scheduler.logger = o.logger;
  if (o.seed == 0) {
    // std::random_device, not absl::BitGen (see backoff.cc).
    std::random_device rd;
    o.seed = ((static_cast<uint64_t>(rd()) << 32) ^ rd()) | 1;
  }
  return o;
}

}  // namespace

absl::Status ValidateReconcileLoopOptions(const ReconcileLoopOptions& o) {
  if (o.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconcile loop options: interval must be > 0, got ",
                     absl::FormatDuration(o.interval)));
  }
  if (!(o.jitter >= 0.0 && o.jitter <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reconcile loop options: jitter must be in [0, 1], got ", o.jitter));
  }
  if (o.clock == nullptr) {
    return absl::InvalidArgumentError("reconcile loop options: clock is null");
  }
  absl::Status s = ValidateBackoffOptions(o.failure_backoff);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconcile loop options: failure_backoff: ", s.message()));
  }
  return ValidateSchedulerOptions(o.scheduler);
}

ReconcileLoop::ReconcileLoop(Plan& plan, ReconcileLoopOptions options)
    : plan_(plan),
      options_(Clamp(std::move(options))),
      scheduler_(options_.scheduler),
      clock_(options_.clock),
      logger_(options_.logger.get()),
      failure_backoff_(options_.failure_backoff, options_.seed),
      rng_(options_.seed + 1) {
  try {
    plan_name_ = plan_.Name();
  } catch (...) {
    plan_name_ = "(plan name threw)";
  }
}

ReconcileLoop::~ReconcileLoop() { Stop(); }

absl::Status ReconcileLoop::Start() {
  {
    MutexLock l(&mu_);
    if (running_ || thread_.joinable()) {
      return absl::FailedPreconditionError(
          "start reconcile loop: already running");
    }
  }
  thread_ = std::jthread([this](std::stop_token stop) {
    pthread_setname_np(pthread_self(), "sp-reconcile");
    absl::Status s = Run(Context(stop, clock_));
    if (!s.ok() && !absl::IsCancelled(s)) {
      SPDLOG_LOGGER_ERROR(logger_, "reconcile loop ended plan={} err={}",
                          plan_name_, s);
    }
  });
  return absl::OkStatus();
}

void ReconcileLoop::Stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  thread_.join();
  thread_ = std::jthread();
}

void ReconcileLoop::Trigger() {
  MutexLock l(&mu_);
  ++stats_.triggers;
  triggered_ = true;
  cv_.SignalAll();
}

std::optional<ExecutionReport> ReconcileLoop::last_report() const {
  MutexLock l(&mu_);
  return last_report_;
}

ReconcileLoopStats ReconcileLoop::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

absl::Duration ReconcileLoop::NextWait(Outcome outcome) {
  MutexLock l(&mu_);
  if (outcome == Outcome::kFailed) return failure_backoff_.Next();
  // A gate skip neither proves nor disproves the plan: keep the backoff.
  if (outcome == Outcome::kConverged) failure_backoff_.Reset();
  std::uniform_real_distribution<double> frac(0.0, options_.jitter);
  double extra = options_.jitter > 0.0 ? frac(rng_) : 0.0;
  return options_.interval * (1.0 + extra);
}

bool ReconcileLoop::GateOpen() {
  if (!options_.gate) return true;
  try {
    return options_.gate();
  } catch (const std::exception& e) {
    SPDLOG_LOGGER_WARN(logger_, "reconcile gate threw plan={} err=\"{}\"",
                       plan_name_, e.what());
  } catch (...) {
    SPDLOG_LOGGER_WARN(logger_, "reconcile gate threw plan={}", plan_name_);
  }
  return false;
}

absl::Status ReconcileLoop::Run(const Context& ctx) {
  {
    MutexLock l(&mu_);
    if (running_) {
      return absl::FailedPreconditionError(
          "run reconcile loop: already running");
    }
    running_ = true;
  }
  absl::Time next = clock_->Now();  // The first execution starts at once.
  while (true) {
    {
      MutexLock l(&mu_);
      // The context's deadline, if any, ends the wait too.
      clock_->AwaitWithDeadline(&mu_, &cv_, std::min(next, ctx.deadline()),
                                ctx.stop_token(), [this] {
                                  mu_.AssertHeld();
                                  return triggered_;
                                });
      if (ctx.Done()) {
        running_ = false;
        return ctx.Err();
      }
      // A trigger that arrives while this execution runs leads to another.
      triggered_ = false;
    }
    if (!GateOpen()) {
      {
        MutexLock l(&mu_);
        ++stats_.skipped_by_gate;
      }
      SPDLOG_LOGGER_DEBUG(logger_, "reconcile skipped by gate plan={}",
                          plan_name_);
      next = clock_->Now() + NextWait(Outcome::kSkipped);
      continue;
    }
    ExecutionReport report = scheduler_.Execute(ctx, plan_);
    // An execution cut short by this loop's own stop is not a failure of the
    // plan: it is recorded as the last report but not counted.
    bool stopped = ctx.Done();
    bool failed = !report.status.ok() && !stopped;
    {
      MutexLock l(&mu_);
      if (!stopped) ++stats_.executions;
      if (failed) {
        ++stats_.failures;
        ++stats_.consecutive_failures;
      } else if (!stopped) {
        stats_.consecutive_failures = 0;
      }
      last_report_ = report;
    }
    if (options_.on_report) {
      try {
        options_.on_report(report);
      } catch (const std::exception& e) {
        SPDLOG_LOGGER_WARN(logger_,
                           "reconcile on_report threw plan={} err=\"{}\"",
                           plan_name_, e.what());
      } catch (...) {
        SPDLOG_LOGGER_WARN(logger_, "reconcile on_report threw plan={}",
                           plan_name_);
      }
    }
    if (stopped) continue;  // The wait above returns at once and ends Run.
    absl::Duration wait =
        NextWait(failed ? Outcome::kFailed : Outcome::kConverged);
    if (failed) {
      SPDLOG_LOGGER_WARN(logger_,
                         "reconcile failed, backing off plan={} after={}",
                         plan_name_, wait);
    }
    next = clock_->Now() + wait;
  }
}

}  // namespace setpoint
