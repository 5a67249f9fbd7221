#include "setpoint/processor/source_driver.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "setpoint/base/status.h"
#include "spdlog/spdlog.h"

// Design.
//
// A driver is one task of an executor (or of its own private executor):
// each run of the task is one Step, and the step says when the next is
// due. Trigger() wakes the task (due at once, or once the step in progress
// returns). In manual mode the same steps run inside RunUntilIdle() on the
// owner's thread, so a test on a simulated clock sees exactly the calls a
// thread would make, at the same times.
//
// AwaitFresh counts lists: the waiter takes the number the next list will
// get, asks for a list (RequestList, Trigger), and waits until a list with
// that number or a later one landed or failed.

namespace setpoint {
namespace {

// A bound on the steps one RunUntilIdle runs (a stream that never runs
// dry would otherwise keep the caller forever).
constexpr int kMaxManualSteps = 10'000;

}  // namespace

SourceDriver::SourceDriver(SourceDriverOptions options)
    : name_(std::move(options.name)),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      executor_(options.executor),
      manual_(options.manual),
      logger_(options.logger != nullptr ? std::move(options.logger)
                                        : spdlog::default_logger()) {}

SourceDriver::~SourceDriver() { Stop(); }

absl::Status SourceDriver::Start() {
  if (started_) {
    return absl::FailedPreconditionError(
        absl::StrCat("start source ", name_, ": already started"));
  }
  SETPOINT_RETURN_IF_ERROR(Validate());
  if (!manual_) {
    if (executor_ == nullptr) {
      own_executor_ = std::make_unique<SourceExecutor>(SourceExecutorOptions{
          .name = name_, .max_threads = 1, .clock = clock_, .logger = logger_});
      SETPOINT_RETURN_IF_ERROR(own_executor_->Start());
      executor_ = own_executor_.get();
    }
    {
      // Before the attach: the first run may trigger.
      MutexLock l(&mu_);
      running_ = true;
      wake_ = executor_;
    }
    absl::Status attached = executor_->Attach(this);
    if (!attached.ok()) {
      MutexLock l(&mu_);
      running_ = false;
      wake_ = nullptr;
      return Annotate(attached, absl::StrCat("start source ", name_));
    }
    attached_ = true;
  } else {
    MutexLock l(&mu_);
    running_ = true;
  }
  started_ = true;
  return absl::OkStatus();
}

void SourceDriver::Stop() {
  {
    MutexLock l(&mu_);
    running_ = false;
    wake_ = nullptr;
    cv_.SignalAll();
  }
  if (started_) stopped_ = true;
  if (attached_) {
    executor_->Detach(this);
    attached_ = false;
  }
  if (own_executor_ != nullptr) own_executor_->Stop();
}

void SourceDriver::Trigger() {
  MutexLock l(&mu_);
  triggered_ = true;
  // The executor's lock comes after ours (Wake never calls back).
  if (wake_ != nullptr) wake_->Wake(this);
}

absl::Time SourceDriver::NextWakeTime() const {
  const absl::Time now = clock_->Now();
  MutexLock l(&mu_);
  if (triggered_ || next_ <= now) return absl::InfinitePast();
  return next_;
}

SourceDriver::StepResult SourceDriver::RunStep(const Context& ctx) {
  {
    MutexLock l(&mu_);
    triggered_ = false;
  }
  StepResult r = Step(ctx);
  MutexLock l(&mu_);
  next_ = r.next;
  return r;
}

absl::Time SourceDriver::Run(std::stop_token stop) {
  StepResult r = RunStep(Context(std::move(stop), clock_));
  return r.next;
}

bool SourceDriver::RunUntilIdle() {
  if (!manual_ || !started_ || stopped_) return false;
  const Context ctx = Context::Background(clock_);
  bool progressed = false;
  for (int i = 0; i < kMaxManualSteps; ++i) {
    if (NextWakeTime() > clock_->Now() && !HasInput()) break;
    if (!RunStep(ctx).progressed) break;
    progressed = true;
  }
  return progressed;
}

int64_t SourceDriver::ListBegins() {
  MutexLock l(&mu_);
  return ++lists_begun_;
}

void SourceDriver::ListEnded(int64_t seq, const absl::Status& status,
                             bool landed) {
  MutexLock l(&mu_);
  if (status.ok() && landed) {
    landed_seq_ = std::max(landed_seq_, seq);
  } else if (!status.ok() && seq > failed_seq_) {
    failed_seq_ = seq;
    failed_status_ = status;
  }
  cv_.SignalAll();
}

absl::Status SourceDriver::AwaitFresh(const Context& ctx) {
  int64_t target;
  {
    MutexLock l(&mu_);
    if (!running_) {
      return absl::FailedPreconditionError(
          absl::StrCat("fresh list from source ", name_, ": not running"));
    }
    target = lists_begun_ + 1;
  }
  RequestList();
  Trigger();
  if (manual_) RunUntilIdle();
  MutexLock l(&mu_);
  if (!manual_) {
    clock_->AwaitWithDeadline(&mu_, &cv_, ctx.deadline(), ctx.stop_token(),
                              [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                return landed_seq_ >= target ||
                                       failed_seq_ >= target || !running_;
                              });
  }
  if (landed_seq_ >= target) return absl::OkStatus();
  if (failed_seq_ >= target) {
    return Annotate(failed_status_,
                    absl::StrCat("fresh list from source ", name_));
  }
  if (!running_) {
    return absl::FailedPreconditionError(
        absl::StrCat("fresh list from source ", name_, ": stopped"));
  }
  absl::Status err = ctx.Err();
  if (!err.ok()) return err;
  return absl::DeadlineExceededError(absl::StrCat(
      "fresh list from source ", name_, ": no list landed (manual mode)"));
}

}  // namespace setpoint
