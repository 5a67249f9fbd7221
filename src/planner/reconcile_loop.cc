#include "setpoint/planner/reconcile_loop.h"

#include <pthread.h>

#include <algorithm>
#include <exception>
#include <random>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/base/status.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

// Fills in the defaults (logger, seed); bad values are left for
// ValidateReconcileLoopOptions to refuse.
ReconcileLoopOptions WithDefaults(ReconcileLoopOptions o) {
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

// Attached to each execution's context, so Pause() can tell a call made from
// inside one of this loop's executions on any thread (parallel steps).
struct ExecutionMark {
  const ReconcileLoop* loop;
};

// Whether the execution was refused as a stale owner: its status, or, with
// continue_on_failure, a later failed step's.
bool StaleRefusal(const ExecutionReport& report) {
  if (report.status.ok()) return false;
  if (IsStaleOwner(report.status)) return true;
  for (const StepRecord& step : report.steps) {
    if (step.outcome == StepOutcome::kFailed && IsStaleOwner(step.status)) {
      return true;
    }
  }
  return false;
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
  if (o.pool != nullptr && o.pool->clock() != o.clock) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconcile loop options: clock is not the clock of pool ",
                     o.pool->name()));
  }
  absl::Status s = ValidateBackoffOptions(o.failure_backoff);
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reconcile loop options: failure_backoff: ", s.message()));
  }
  return ValidateSchedulerOptions(o.scheduler);
}

void ReconcileLoop::InitCounters() {
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) return;
  // Every series exists from the start, at 0, so alert rules see them.
  const MetricLabels base =
      WithLabels(options_.metric_labels, {{"plan", plan_name_}});
  for (const char* result : {"converged", "failed", "stale", "interrupted"}) {
    m->GetCounter("setpoint_plan_executions_total",
                  "Plan executions, by result (converged, failed, stale, "
                  "interrupted by a pause or stop).",
                  WithLabels(base, {{"result", result}}));
  }
  for (const char* result : {"succeeded", "failed", "not_run"}) {
    m->GetCounter("setpoint_plan_steps_total",
                  "Plan steps, by result (succeeded, failed, not run).",
                  WithLabels(base, {{"result", result}}));
  }
  m->GetCounter("setpoint_plan_retries_total", "Step attempts retried.", base);
  m->GetCounter("setpoint_plan_rounds_total",
                "Create calls that returned work (rounds run).", base);
  m->GetHistogram("setpoint_plan_execution_duration_seconds",
                  "How long plan executions took.", base,
                  Histogram::DurationBuckets());
}

void ReconcileLoop::CountReport(const ExecutionReport& report, bool interrupted,
                                bool stale) {
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) return;
  const MetricLabels base =
      WithLabels(options_.metric_labels, {{"plan", plan_name_}});
  const char* result = interrupted          ? "interrupted"
                       : stale              ? "stale"
                       : report.status.ok() ? "converged"
                                            : "failed";
  m->GetCounter("setpoint_plan_executions_total",
                "Plan executions, by result (converged, failed, stale, "
                "interrupted by a pause or stop).",
                WithLabels(base, {{"result", result}}))
      .Increment();
  m->GetHistogram("setpoint_plan_execution_duration_seconds",
                  "How long plan executions took.", base,
                  Histogram::DurationBuckets())
      .ObserveDuration(report.duration);
  const std::pair<const char*, int64_t> steps[] = {
      {"succeeded", report.steps_run - report.steps_failed},
      {"failed", report.steps_failed},
      {"not_run", report.steps_not_run}};
  for (const auto& [what, n] : steps) {
    if (n <= 0) continue;
    m->GetCounter("setpoint_plan_steps_total",
                  "Plan steps, by result (succeeded, failed, not run).",
                  WithLabels(base, {{"result", what}}))
        .Increment(static_cast<double>(n));
  }
  if (report.retries > 0) {
    m->GetCounter("setpoint_plan_retries_total", "Step attempts retried.", base)
        .Increment(static_cast<double>(report.retries));
  }
  if (report.rounds > 0) {
    m->GetCounter("setpoint_plan_rounds_total",
                  "Create calls that returned work (rounds run).", base)
        .Increment(report.rounds);
  }
}

ReconcileLoop::ReconcileLoop(Plan& plan, ReconcileLoopOptions options)
    : plan_(plan),
      options_(WithDefaults(std::move(options))),
      options_status_(ValidateReconcileLoopOptions(options_)),
      scheduler_(options_.scheduler),
      // A null clock is refused (options_status_); nothing runs then, but
      // NextWakeTime() still reads a clock.
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      logger_(options_.logger.get()),
      paused_(options_.start_paused),
      failure_backoff_(options_.failure_backoff, options_.seed),
      rng_(options_.seed + 1) {
  absl::StatusOr<std::string> name =
      CallUserCode("plan name", [this] { return plan_.Name(); });
  plan_name_ = name.ok() ? *std::move(name) : "(plan name threw)";
  if (options_status_.ok()) InitCounters();
}

ReconcileLoop::~ReconcileLoop() { Stop(); }

absl::Status ReconcileLoop::Start() {
  if (!options_status_.ok()) {
    return Annotate(options_status_,
                    absl::StrCat("start reconcile loop plan=", plan_name_));
  }
  {
    MutexLock l(&mu_);
    if (running_ || thread_.joinable()) {
      return absl::FailedPreconditionError(
          "start reconcile loop: already running");
    }
  }
  if (options_.pool != nullptr) {
    {
      MutexLock l(&mu_);
      if (attached_) {
        return absl::FailedPreconditionError(
            "start reconcile loop: already running");
      }
      running_ = true;
      next_ = absl::InfinitePast();  // The first execution starts at once.
    }
    absl::Status s = options_.pool->Attach(this);
    if (!s.ok()) {
      MutexLock l(&mu_);
      running_ = false;
      return Annotate(s,
                      absl::StrCat("start reconcile loop plan=", plan_name_));
    }
    attached_ = true;
    return absl::OkStatus();
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
  if (attached_) {
    options_.pool->Detach(this);
    attached_ = false;
    MutexLock l(&mu_);
    running_ = false;
    return;
  }
  if (!thread_.joinable()) return;
  thread_.request_stop();
  thread_.join();
  thread_ = std::jthread();
}

void ReconcileLoop::Trigger() {
  {
    MutexLock l(&mu_);
    ++stats_.triggers;
    triggered_ = true;
    cv_.SignalAll();
  }
  if (options_.pool != nullptr) options_.pool->Notify();
}

absl::Status ReconcileLoop::Pause(const Context& ctx) {
  const ExecutionMark* mark = ctx.Value<ExecutionMark>();
  bool was_paused;
  {
    MutexLock l(&mu_);
    if ((running_ && loop_thread_ == std::this_thread::get_id()) ||
        (mark != nullptr && mark->loop == this)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pause reconcile loop plan=", plan_name_,
          ": called from inside an execution, which it would wait for"));
    }
    was_paused = paused_;
    paused_ = true;
    if (current_scope_ != nullptr) current_scope_->Cancel();
    cv_.SignalAll();
  }
  if (!was_paused) {
    SPDLOG_LOGGER_INFO(logger_, "reconcile loop paused plan={}", plan_name_);
  }
  MutexLock l(&mu_);
  bool ended = ctx.clock()->AwaitWithDeadline(&mu_, &cv_, ctx.deadline(),
                                              ctx.stop_token(), [this] {
                                                mu_.AssertHeld();
                                                return !executing_;
                                              });
  if (!ended) return ctx.Err();
  return absl::OkStatus();
}

void ReconcileLoop::Resume() {
  {
    MutexLock l(&mu_);
    if (!paused_) return;
    paused_ = false;
    triggered_ = true;  // Run one at once, without counting a Trigger().
    cv_.SignalAll();
  }
  if (options_.pool != nullptr) options_.pool->Notify();
  SPDLOG_LOGGER_INFO(logger_, "reconcile loop resumed plan={}", plan_name_);
}

std::optional<ExecutionReport> ReconcileLoop::last_report() const {
  MutexLock l(&mu_);
  return last_report_;
}

ReconcileLoopStats ReconcileLoop::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

absl::Time ReconcileLoop::NextWakeTime() const {
  MutexLock l(&mu_);
  return NextWakeTimeLocked();
}

absl::Duration ReconcileLoop::NextWaitLocked(Outcome outcome) {
  if (outcome == Outcome::kFailed) return failure_backoff_.Next();
  // A gate skip neither proves nor disproves the plan: keep the backoff.
  if (outcome == Outcome::kConverged) failure_backoff_.Reset();
  std::uniform_real_distribution<double> frac(0.0, options_.jitter);
  double extra = options_.jitter > 0.0 ? frac(rng_) : 0.0;
  return options_.interval * (1.0 + extra);
}

bool ReconcileLoop::GateOpen() {
  if (!options_.gate) return true;
  absl::StatusOr<bool> open =
      CallUserCode("reconcile gate", [this] { return options_.gate(); });
  if (open.ok()) return *open;
  SPDLOG_LOGGER_WARN(logger_, "reconcile gate failed plan={}: {}", plan_name_,
                     open.status());
  return false;
}

absl::Time ReconcileLoop::NextWakeTimeLocked() const {
  if (paused_) return absl::InfiniteFuture();
  if (triggered_) return absl::InfinitePast();
  if (next_ == absl::InfiniteFuture()) return next_;
  if (next_ <= clock_->Now()) return absl::InfinitePast();
  return next_;
}

bool ReconcileLoop::ClaimIfDueLocked() {
  if (executing_ || NextWakeTimeLocked() != absl::InfinitePast()) return false;
  // A trigger that arrives while this execution runs leads to another.
  triggered_ = false;
  executing_ = true;
  next_ = absl::InfiniteFuture();  // Set when this one ends.
  return true;
}

void ReconcileLoop::EndClaimLocked(absl::Time next) {
  next_ = next;
  executing_ = false;
  cv_.SignalAll();
}

bool ReconcileLoop::RunClaimed(const Context& ctx) {
  if (!GateOpen()) {
    {
      MutexLock l(&mu_);
      ++stats_.skipped_by_gate;
      EndClaimLocked(clock_->Now() + NextWaitLocked(Outcome::kSkipped));
    }
    SPDLOG_LOGGER_DEBUG(logger_, "reconcile skipped by gate plan={}",
                        plan_name_);
    return false;
  }
  CancelScope scope(ctx);
  {
    MutexLock l(&mu_);
    if (paused_) {
      // Paused while the gate ran: this one never starts.
      EndClaimLocked(absl::InfinitePast());
      return false;
    }
    current_scope_ = &scope;
  }
  Context exec_ctx = scope.context().WithValue(
      std::make_shared<const ExecutionMark>(ExecutionMark{this}));
  std::optional<std::string> hook_error;
  if (options_.execution_context) {
    absl::StatusOr<Context> hooked = CallUserCode("execution_context", [&] {
      return options_.execution_context(exec_ctx);
    });
    if (hooked.ok()) {
      exec_ctx = *std::move(hooked);
    } else {
      hook_error = std::string(hooked.status().message());
    }
  }
  if (hook_error.has_value()) {
    absl::Duration wait;
    {
      MutexLock l(&mu_);
      current_scope_ = nullptr;
      ++stats_.failures;
      ++stats_.consecutive_failures;
      wait = NextWaitLocked(Outcome::kFailed);
      EndClaimLocked(clock_->Now() + wait);
    }
    SPDLOG_LOGGER_WARN(logger_,
                       "reconcile execution_context threw, skipped, backing "
                       "off plan={} after={} err=\"{}\"",
                       plan_name_, wait, *hook_error);
    return false;
  }

  ExecutionReport report = scheduler_.Execute(exec_ctx, plan_);
  // An execution cut short by this loop's own stop or by Pause() is not a
  // failure of the plan: it is recorded as the last report but not counted.
  const bool interrupted = ctx.Done() || scope.context().Cancelled();
  const bool failed = !report.status.ok() && !interrupted;
  // Under another owner's newer fencing token every run would be refused
  // again: pause until told the assignment changed. Being paused, the loop
  // runs nothing more, so this logs once per Resume().
  const bool stale = StaleRefusal(report);
  absl::Duration wait = absl::ZeroDuration();
  {
    MutexLock l(&mu_);
    current_scope_ = nullptr;
    if (!interrupted) ++stats_.executions;
    if (failed) {
      ++stats_.failures;
      ++stats_.consecutive_failures;
    } else if (!interrupted) {
      stats_.consecutive_failures = 0;
    }
    if (stale) {
      ++stats_.stale_refusals;
      paused_ = true;
    } else if (!interrupted) {
      // A stale refusal does not lengthen the backoff: the next run (after
      // Resume) is under a new assignment.
      wait = NextWaitLocked(failed ? Outcome::kFailed : Outcome::kConverged);
    }
    last_report_ = report;
  }
  CountReport(report, interrupted, stale);
  if (stale) {
    SPDLOG_LOGGER_WARN(logger_,
                       "reconcile paused until resumed, write refused as "
                       "stale owner plan={} err={}",
                       plan_name_, report.status);
  } else if (failed) {
    SPDLOG_LOGGER_WARN(logger_,
                       "reconcile failed, backing off plan={} after={}",
                       plan_name_, wait);
  }
  if (options_.on_report) {
    absl::Status s =
        CallUserCode("on_report", [&] { options_.on_report(report); });
    if (!s.ok()) {
      SPDLOG_LOGGER_WARN(logger_, "reconcile on_report failed plan={}: {}",
                         plan_name_, s);
    }
  }
  MutexLock l(&mu_);
  // The wait counts from the end of the execution, on_report included. A cut
  // short one is due again at once (when resumed or run again).
  EndClaimLocked(interrupted || stale ? absl::InfinitePast()
                                      : clock_->Now() + wait);
  return true;
}

bool ReconcileLoop::RunUntilIdle(const Context& ctx) {
  if (!options_status_.ok()) return false;
  {
    MutexLock l(&mu_);
    if (running_ || ctx.Done() || !ClaimIfDueLocked()) return false;
    running_ = true;
    loop_thread_ = std::this_thread::get_id();
  }
  bool ran = RunClaimed(ctx);
  MutexLock l(&mu_);
  running_ = false;
  loop_thread_ = std::thread::id();
  return ran;
}

void ReconcileLoop::RunOnPool(const Context& ctx) {
  {
    MutexLock l(&mu_);
    if (ctx.Done() || !ClaimIfDueLocked()) return;
    loop_thread_ = std::this_thread::get_id();
  }
  RunClaimed(ctx);
  MutexLock l(&mu_);
  loop_thread_ = std::thread::id();
}

absl::Status ReconcileLoop::Run(const Context& ctx) {
  if (!options_status_.ok()) {
    return Annotate(options_status_,
                    absl::StrCat("run reconcile loop plan=", plan_name_));
  }
  {
    MutexLock l(&mu_);
    if (running_) {
      return absl::FailedPreconditionError(
          "run reconcile loop: already running");
    }
    running_ = true;
    loop_thread_ = std::this_thread::get_id();
    next_ = absl::InfinitePast();  // The first execution starts at once.
  }
  while (true) {
    {
      MutexLock l(&mu_);
      // The context's deadline, if any, ends the wait too. Pause() and
      // Resume() signal, so the wait follows them.
      clock_->AwaitWithDeadline(
          &mu_, &cv_, std::min(NextWakeTimeLocked(), ctx.deadline()),
          ctx.stop_token(), [this] {
            mu_.AssertHeld();
            return NextWakeTimeLocked() == absl::InfinitePast();
          });
      if (ctx.Done()) {
        running_ = false;
        loop_thread_ = std::thread::id();
        return ctx.Err();
      }
      // Woken at a deadline that a Pause() since made moot: wait again.
      if (!ClaimIfDueLocked()) continue;
    }
    RunClaimed(ctx);
  }
}

}  // namespace setpoint
