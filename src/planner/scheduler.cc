#include "setpoint/planner/scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/retry.h"
#include "setpoint/base/status.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

std::atomic<uint64_t> g_next_execution_id{1};

// How many names an error message lists before it says "+N more".
constexpr size_t kMaxNamesInMessage = 10;

std::string ExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "a non-standard exception";
  }
}

absl::StatusOr<Procedures> SafeCreate(Plan& plan, const Context& ctx) {
  try {
    return plan.Create(ctx);
  } catch (...) {
    return absl::UnknownError(absl::StrCat("threw: ", ExceptionText()));
  }
}

absl::StatusOr<Procedures> SafeDo(Procedure& procedure, const Context& ctx,
                                  bool* threw) {
  try {
    return procedure.Do(ctx);
  } catch (...) {
    *threw = true;
    return absl::UnknownError(absl::StrCat("threw: ", ExceptionText()));
  }
}

std::string SafePlanName(const Plan& plan) {
  try {
    std::string name = plan.Name();
    return name.empty() ? std::string("(unnamed plan)") : name;
  } catch (...) {
    return "(plan name threw)";
  }
}

// Checks a returned list for null procedures. It reads only the pointers:
// touching every procedure here would cost a pass over their memory, so an
// empty name is refused when the step is about to run (see NameError).
absl::Status CheckNotNull(const Procedures& list) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (ABSL_PREDICT_FALSE(list[i] == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "returned a null procedure at index ", i, " of ", list.size()));
    }
  }
  return absl::OkStatus();
}

// The error for a procedure without a name, which is refused before it runs.
absl::Status NameError(int64_t parent) {
  return absl::InvalidArgumentError(
      parent < 0 ? std::string("refused a procedure with an empty name "
                               "returned by create")
                 : absl::StrCat("refused a procedure with an empty name "
                                "returned by step id=",
                                parent));
}

std::string NameList(const Procedures& list) {
  std::vector<absl::string_view> names;
  for (size_t i = 0; i < list.size() && i < kMaxNamesInMessage; ++i) {
    names.push_back(list[i]->Name());
  }
  std::string out = absl::StrJoin(names, ", ");
  if (list.size() > kMaxNamesInMessage) {
    absl::StrAppend(&out, " (+", list.size() - kMaxNamesInMessage, " more)");
  }
  return out;
}

SchedulerOptions Clamp(SchedulerOptions o) {
  o.max_rounds = std::max(o.max_rounds, 1);
  o.max_recorded_steps = std::max<int64_t>(o.max_recorded_steps, 0);
  o.parallelism = std::max(o.parallelism, 1);
  o.default_retry.max_attempts = std::max(o.default_retry.max_attempts, 1);
  if (o.logger == nullptr) o.logger = spdlog::default_logger();
  // The application may have dropped the default logger: log nowhere then.
  if (o.logger == nullptr)
    o.logger = std::make_shared<spdlog::logger>("setpoint");
  return o;
}

// A procedure accepted but not yet started.
struct Pending {
  std::unique_ptr<Procedure> procedure;
  int64_t parent = -1;  // Step id of the one that returned it; -1: Create.
};

// The outcome of one step (all attempts).
struct StepResult {
  absl::Status status;
  Procedures children;
  int attempts = 0;
};

// The state of one Execute call.
class Execution {
 public:
  Execution(const SchedulerOptions& options, const Context& ctx, Plan& plan)
      : options_(options),
        ctx_(ctx),
        plan_(plan),
        clock_(ctx.clock()),
        logger_(options.logger.get()),
        debug_(logger_ != nullptr &&
               logger_->should_log(spdlog::level::debug)) {
    report_.plan = SafePlanName(plan);
    report_.execution_id = g_next_execution_id.fetch_add(1);
    report_.started = clock_->Now();
  }

  ExecutionReport Run() {
    for (int round = 1;; ++round) {
      if (ctx_.Done()) {
        Fail(Annotate(
            ctx_.Err(),
            absl::StrCat(Op(), ": stopped before create round=", round)));
        break;
      }
      absl::StatusOr<Procedures> created = SafeCreate(plan_, ctx_);
      if (created.ok()) {
        absl::Status valid = CheckNotNull(*created);
        if (!valid.ok()) {
          for (auto& p : *created) {
            if (p != nullptr) RecordNotRun(Pending{std::move(p), -1}, round);
          }
          created = valid;
        }
      }
      if (!created.ok()) {
        Fail(Annotate(created.status(),
                      absl::StrCat(Op(), " create round=", round)));
        break;
      }
      if (created->empty()) break;  // Converged.
      if (round > options_.max_rounds) {
        Fail(absl::AbortedError(absl::StrCat(
            Op(), ": did not converge after max_rounds=", options_.max_rounds,
            "; create still returns ", created->size(),
            " procedures: ", NameList(*created))));
        for (auto& p : *created) RecordNotRun(Pending{std::move(p), -1}, round);
        break;
      }
      report_.rounds = round;
      round_ = round;
      // The round's list runs in place; only children go on the stack.
      round_list_ = std::move(created).value();
      round_next_ = 0;
      if (report_.steps.empty()) {
        report_.steps.reserve(static_cast<size_t>(
            std::min<int64_t>(options_.max_recorded_steps,
                              static_cast<int64_t>(round_list_.size()))));
      }
      if (options_.parallelism == 1) {
        RunSerial();
      } else {
        RunParallel();
      }
      RecordLeftovers(round);
      if (!failure_.ok()) break;
    }
    return Complete();
  }

 private:
  std::string Op() const {
    return absl::StrCat("execute plan=", report_.plan,
                        " execution=", report_.execution_id);
  }

  void Fail(absl::Status status) {
    if (failure_.ok()) failure_ = std::move(status);
  }

  bool Recording() const {
    return static_cast<int64_t>(report_.steps.size()) <
           options_.max_recorded_steps;
  }

  // Takes the next procedure to run: the latest children first, then the
  // round's list in order (depth first). Returns false when the round is done.
  bool PopNext(Pending* out) {
    if (!stack_.empty()) {
      *out = std::move(stack_.back());
      stack_.pop_back();
      return true;
    }
    if (round_next_ < round_list_.size()) {
      *out = Pending{std::move(round_list_[round_next_++]), -1};
      return true;
    }
    return false;
  }

  // Everything accepted but not run when the round ended early is reported.
  void RecordLeftovers(int round) {
    while (!stack_.empty()) {
      RecordNotRun(std::move(stack_.back()), round);
      stack_.pop_back();
    }
    for (; round_next_ < round_list_.size(); ++round_next_) {
      RecordNotRun(Pending{std::move(round_list_[round_next_]), -1}, round);
    }
    round_list_.clear();
  }

  // Runs one procedure with its retry policy. Called without the parallel
  // mutex held.
  StepResult RunStep(Procedure& procedure, int64_t parent, uint64_t step_seq) {
    StepResult result;
    if (ABSL_PREDICT_FALSE(procedure.Name().empty())) {
      result.status = NameError(parent);
      return result;
    }
    const RetryPolicy& policy = procedure.retry_policy() != nullptr
                                    ? *procedure.retry_policy()
                                    : options_.default_retry;
    bool threw = false;
    absl::StatusOr<Procedures> out = Retry(
        ctx_, policy, [&] { return SafeDo(procedure, ctx_, &threw); },
        [&](int attempt, const absl::Status& error, absl::Duration delay) {
          // An exception is a bug in the step, not a transient fault.
          if (threw) return false;
          if (logger_ != nullptr && logger_->should_log(spdlog::level::warn)) {
            SPDLOG_LOGGER_WARN(logger_,
                               "retrying step plan={} execution={} "
                               "step=\"{}\" attempt={}/{} after={} err={}",
                               report_.plan, report_.execution_id,
                               procedure.Name(), attempt, policy.max_attempts,
                               delay, error);
          }
          ++retries_;
          return true;
        },
        options_.seed == 0 ? 0 : options_.seed + step_seq, &result.attempts);
    if (out.ok()) {
      if (!out->empty()) result.status = CheckNotNull(*out);
      result.children = std::move(out).value();
    } else {
      result.status = std::move(out).status();
    }
    return result;
  }

  // Records a finished step and queues its children. Returns false when the
  // execution must stop (a failure without continue_on_failure).
  bool Finish(Pending& pending, StepResult& result, absl::Time started,
              absl::Duration took) {
    ++report_.steps_run;
    int64_t id = -1;
    if (Recording()) {
      id = static_cast<int64_t>(report_.steps.size());
      StepRecord& rec = report_.steps.emplace_back();
      rec.id = id;
      rec.parent = pending.parent;
      rec.round = round_;
      rec.name = pending.procedure->Name();
      rec.outcome =
          result.status.ok() ? StepOutcome::kSucceeded : StepOutcome::kFailed;
      rec.status = result.status;
      rec.attempts = result.attempts;
      rec.start = started - report_.started;
      rec.duration = took;
    } else {
      report_.steps_truncated = true;
    }
    if (debug_) {
      SPDLOG_LOGGER_DEBUG(logger_,
                          "step done plan={} execution={} step=\"{}\" id={} "
                          "parent={} attempts={} status={}",
                          report_.plan, report_.execution_id,
                          pending.procedure->Name(), id, pending.parent,
                          result.attempts, result.status);
    }
    if (!result.status.ok()) {
      ++report_.steps_failed;
      // Children returned along with the failure (nulls refused) never run;
      // they are reported, not dropped.
      for (auto& child : result.children) {
        if (child != nullptr) {
          RecordNotRun(Pending{std::move(child), id}, round_);
        }
      }
      Fail(Annotate(result.status,
                    absl::StrCat(Op(), " step=\"", pending.procedure->Name(),
                                 "\" attempts=", result.attempts)));
      return options_.continue_on_failure;
    }
    for (auto it = result.children.rbegin(); it != result.children.rend();
         ++it) {
      stack_.push_back(Pending{std::move(*it), id});
    }
    return true;
  }

  void RecordNotRun(Pending pending, int round) {
    ++report_.steps_not_run;
    if (!Recording()) {
      report_.steps_truncated = true;
      return;
    }
    StepRecord& rec = report_.steps.emplace_back();
    rec.id = static_cast<int64_t>(report_.steps.size()) - 1;
    rec.parent = pending.parent;
    rec.round = round;
    rec.name = pending.procedure->Name();
    rec.outcome = StepOutcome::kNotRun;
  }

  void StopBefore(const Pending& pending) {
    report_.stopped_before = pending.procedure->Name();
    Fail(Annotate(ctx_.Err(), absl::StrCat(Op(), ": stopped before step=\"",
                                           pending.procedure->Name(), "\"")));
  }

  void RunSerial() {
    // The end of one recorded step is the start of the next: one clock read
    // per step instead of two.
    absl::Time next_start = absl::InfinitePast();
    const bool plain_default = options_.default_retry.max_attempts <= 1;
    Pending pending;
    while (PopNext(&pending)) {
      if (ABSL_PREDICT_FALSE(ctx_.Done())) {
        StopBefore(pending);
        stack_.push_back(std::move(pending));
        return;
      }
      Procedure& procedure = *pending.procedure;
      if (ABSL_PREDICT_TRUE(!Recording() && !debug_ && plain_default &&
                            procedure.retry_policy() == nullptr &&
                            !procedure.Name().empty())) {
        // The hot path once recording has stopped: one attempt, nothing to
        // record or log; failures take the general path below.
        ++next_seq_;
        bool threw = false;
        absl::StatusOr<Procedures> out = SafeDo(procedure, ctx_, &threw);
        if (ABSL_PREDICT_TRUE(out.ok()) &&
            (out->empty() || CheckNotNull(*out).ok())) {
          ++report_.steps_run;
          report_.steps_truncated = true;
          for (auto it = out->rbegin(); it != out->rend(); ++it) {
            stack_.push_back(Pending{std::move(*it), -1});
          }
          continue;
        }
        StepResult result;
        result.attempts = 1;
        if (out.ok()) {
          result.status = CheckNotNull(*out);
          result.children = std::move(out).value();
        } else {
          result.status = std::move(out).status();
        }
        if (!Finish(pending, result, absl::InfinitePast(),
                    absl::ZeroDuration())) {
          return;
        }
        continue;
      }
      bool timed = Recording();
      absl::Time started = absl::InfinitePast();
      if (timed) {
        started =
            next_start != absl::InfinitePast() ? next_start : clock_->Now();
      }
      StepResult result = RunStep(procedure, pending.parent, next_seq_++);
      absl::Duration took = absl::ZeroDuration();
      if (timed) {
        next_start = clock_->Now();
        took = next_start - started;
      }
      if (!Finish(pending, result, started, took)) return;
    }
  }

  void RunParallel() {
    Mutex mu;
    CondVar cv;
    int in_flight = 0;
    bool stop = false;
    auto has_work = [&] {
      return !stack_.empty() || round_next_ < round_list_.size();
    };
    auto worker = [&] {
      mu.Lock();
      while (true) {
        cv.Wait(&mu, {}, [&] { return stop || has_work() || in_flight == 0; });
        Pending pending;
        if (stop || !PopNext(&pending)) break;
        if (ctx_.Done()) {
          StopBefore(pending);
          stack_.push_back(std::move(pending));
          stop = true;
          break;
        }
        ++in_flight;
        uint64_t seq = next_seq_++;
        bool timed = Recording();
        mu.Unlock();
        absl::Time started = timed ? clock_->Now() : absl::InfinitePast();
        StepResult result = RunStep(*pending.procedure, pending.parent, seq);
        absl::Duration took =
            timed ? clock_->Now() - started : absl::ZeroDuration();
        mu.Lock();
        --in_flight;
        if (!Finish(pending, result, started, took)) stop = true;
        cv.SignalAll();
        // The user's destructor runs without the lock held.
        std::unique_ptr<Procedure> finished = std::move(pending.procedure);
        mu.Unlock();
        finished.reset();
        mu.Lock();
      }
      cv.SignalAll();
      mu.Unlock();
    };
    std::vector<std::jthread> threads;
    threads.reserve(options_.parallelism - 1);
    for (int i = 1; i < options_.parallelism; ++i) {
      threads.emplace_back([&worker] {
        pthread_setname_np(pthread_self(), "sp-planner");
        worker();
      });
    }
    worker();
    threads.clear();  // Joins.
  }

  ExecutionReport Complete() {
    report_.retries = retries_.load();
    report_.status = failure_;
    report_.duration = clock_->Now() - report_.started;
    spdlog::level::level_enum level =
        report_.status.ok() ? spdlog::level::info : spdlog::level::warn;
    if (logger_ != nullptr && logger_->should_log(level)) {
      if (report_.status.ok()) {
        SPDLOG_LOGGER_INFO(logger_, "plan executed {}", report_.Summary());
      } else {
        SPDLOG_LOGGER_WARN(logger_, "plan failed {}", report_.Summary());
      }
    }
    return std::move(report_);
  }

  const SchedulerOptions& options_;
  const Context& ctx_;
  Plan& plan_;
  Clock* const clock_;
  spdlog::logger* const logger_;
  const bool debug_;

  // With parallelism > 1 the members below are guarded by RunParallel's
  // mutex while workers run (but retries_, an atomic bumped without it);
  // otherwise only the calling thread touches them.
  ExecutionReport report_;
  Procedures round_list_;       // The current round's procedures, run in place.
  size_t round_next_ = 0;       // The next of round_list_ to run.
  std::vector<Pending> stack_;  // Children waiting to run, latest last.
  absl::Status failure_;
  int round_ = 0;
  std::atomic<int64_t> retries_{0};
  uint64_t next_seq_ = 0;  // Steps started; seeds each step's retry jitter.
};

}  // namespace

absl::Status ValidateSchedulerOptions(const SchedulerOptions& o) {
  if (o.max_rounds < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler options: max_rounds must be >= 1, got ", o.max_rounds));
  }
  if (o.max_recorded_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler options: max_recorded_steps must be >= 0, got ",
                     o.max_recorded_steps));
  }
  if (o.parallelism < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scheduler options: parallelism must be >= 1, got ", o.parallelism));
  }
  if (o.default_retry.max_attempts < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("scheduler options: default_retry.max_attempts must be "
                     ">= 1, got ",
                     o.default_retry.max_attempts));
  }
  return Annotate(ValidateBackoffOptions(o.default_retry.backoff),
                  "scheduler options: default_retry");
}

std::string FormatPreview(const std::vector<PreviewItem>& items) {
  if (items.empty()) return "  (nothing to do: converged)\n";
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    absl::StrAppend(&out, "  ", i + 1, ". ", items[i].name);
    if (!items[i].description.empty()) {
      absl::StrAppend(&out, " — ", items[i].description);
    }
    out.push_back('\n');
  }
  return out;
}

Scheduler::Scheduler(SchedulerOptions options)
    : options_(Clamp(std::move(options))) {}

ExecutionReport Scheduler::Execute(const Context& ctx, Plan& plan) const {
  Execution execution(options_, ctx, plan);
  return execution.Run();
}

absl::StatusOr<std::vector<PreviewItem>> Scheduler::Preview(const Context& ctx,
                                                            Plan& plan) const {
  std::string op = absl::StrCat("preview plan=", SafePlanName(plan));
  if (ctx.Done()) return Annotate(ctx.Err(), op);
  absl::StatusOr<Procedures> created = SafeCreate(plan, ctx);
  if (!created.ok()) return Annotate(created.status(), op + " create");
  SETPOINT_RETURN_IF_ERROR(Annotate(CheckNotNull(*created), op + " create"));
  for (size_t i = 0; i < created->size(); ++i) {
    if ((*created)[i]->Name().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(op,
                       " create: returned a procedure with an empty name "
                       "at index ",
                       i, " of ", created->size()));
    }
  }
  std::vector<PreviewItem> items;
  items.reserve(created->size());
  for (const auto& p : *created) {
    PreviewItem item{.name = p->Name(), .description = {}};
    try {
      item.description = p->Description();
    } catch (...) {
      item.description =
          absl::StrCat("(description threw: ", ExceptionText(), ")");
    }
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace setpoint
