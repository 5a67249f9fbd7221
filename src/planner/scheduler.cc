#include "setpoint/planner/scheduler.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <limits>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "planner/procedure_arena.h"
#include "setpoint/base/callback.h"
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

// User code is called through CallUserCode, the one boundary for what
// it throws (kInternal "<what> threw: ...").
absl::StatusOr<Procedures> SafeCreate(Plan& plan, const Context& ctx) {
  return CallUserCode("create", [&] { return plan.Create(ctx); });
}

ABSL_ATTRIBUTE_ALWAYS_INLINE inline absl::StatusOr<Procedures> SafeDo(
    Procedure& procedure, const Context& ctx, bool* threw) {
  absl::StatusOr<Procedures> out =
      CallUserCode("do", [&] { return procedure.Do(ctx); });
  if (ABSL_PREDICT_FALSE(!out.ok()) && ThrewException(out.status())) {
    *threw = true;
  }
  return out;
}

std::string SafePlanName(const Plan& plan) {
  absl::StatusOr<std::string> name =
      CallUserCode("plan name", [&] { return plan.Name(); });
  if (!name.ok()) return "(plan name threw)";
  return name->empty() ? std::string("(unnamed plan)") : *std::move(name);
}

// Whether `list` holds a null procedure (reads only the pointers).
inline bool HasNull(const Procedures& list) {
  for (const auto& p : list) {
    if (ABSL_PREDICT_FALSE(p == nullptr)) return true;
  }
  return false;
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

// Fills in the defaults (the logger); bad values are left for
// ValidateSchedulerOptions to refuse.
SchedulerOptions WithDefaults(SchedulerOptions o) {
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
  Execution(const SchedulerOptions& options, const Context& ctx, Plan& plan,
            planner_internal::ArenaChunkCache* arenas)
      : options_(options),
        arenas_(arenas),
        ctx_(ctx),
        plan_(plan),
        clock_(ctx.clock()),
        real_clock_(clock_ == Clock::Real()),
        logger_(options.logger.get()),
        debug_(logger_ != nullptr &&
               logger_->should_log(spdlog::level::debug)) {
    report_.plan = SafePlanName(plan);
    report_.execution_id = g_next_execution_id.fetch_add(1);
    started_ns_ = NowNanos();
    report_.started = absl::FromUnixNanos(started_ns_);
  }

  // Refuses to run: `status` says which option is bad.
  ExecutionReport Refuse(const absl::Status& status) {
    Fail(Annotate(status, Op()));
    return Complete();
  }

  ExecutionReport Run() {
    {
      // Procedures (and their lists) made by Create and Do on this thread
      // come from this execution's arena.
      planner_internal::ProcedureArena arena(arenas_);
      planner_internal::ProcedureArena::Scope scope(&arena);
      RunRounds();
      chunks_taken_ += arena.chunks_taken();
    }
    // What this execution needed is what the next one is likely to need.
    arenas_->Trim(chunks_taken_.load());
    return Complete();
  }

 private:
  void RunRounds() {
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
  }

  std::string Op() const {
    return absl::StrCat("execute plan=", report_.plan,
                        " execution=", report_.execution_id);
  }

  void Fail(absl::Status status) {
    if (failure_.ok()) failure_ = std::move(status);
  }

  // Makes room for one more record (called while Recording()). Past 1,024
  // records it makes room for all max_recorded_steps at once: doubling up to
  // 10,000 would move every record again and touch half as much memory more.
  void ReserveRecord() {
    std::vector<StepRecord>& steps = report_.steps;
    if (ABSL_PREDICT_TRUE(steps.size() < steps.capacity())) return;
    const size_t max = static_cast<size_t>(options_.max_recorded_steps);
    steps.reserve(steps.size() < 1024
                      ? std::min(max, std::max<size_t>(16, 2 * steps.size()))
                      : max);
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
    // Its buffer came from the arena: give it back while the arena is active.
    round_list_ = Procedures();
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
      ReserveRecord();
      StepRecord& rec = report_.steps.emplace_back();
      rec.id = id;
      rec.parent = pending.parent;
      rec.round = round_;
      rec.name = pending.procedure->Name();
      rec.outcome =
          result.status.ok() ? StepOutcome::kSucceeded : StepOutcome::kFailed;
      rec.status = result.status;
      rec.attempts = result.attempts;
      if (started != absl::InfinitePast()) {
        rec.start = started - report_.started;
        rec.duration = took;
      }
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
    PushChildren(result.children, id);
    return true;
  }

  void RecordNotRun(Pending pending, int round) {
    ++report_.steps_not_run;
    if (!Recording()) {
      report_.steps_truncated = true;
      return;
    }
    ReserveRecord();
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

  // The clock in nanoseconds since the Unix epoch: absl's own reading for
  // the real clock (what absl::Now() wraps), the context's clock otherwise.
  int64_t NowNanos() const {
    return real_clock_ ? absl::GetCurrentTimeNanos()
                       : absl::ToUnixNanos(clock_->Now());
  }

  // Pushes `children` so that the first runs next.
  void PushChildren(Procedures& children, int64_t parent) {
    for (size_t i = children.size(); i-- > 0;) {
      stack_.push_back(Pending{std::move(children[i]), parent});
    }
  }

  // One step that ends the execution's recording or takes a path other than
  // the hot ones below (retries, a failure, debug logging, an empty name).
  // Returns false when the execution must stop.
  bool RunGeneral(Pending& pending, int64_t* next_start) {
    const bool timed = Recording();
    int64_t started = 0;
    if (timed) started = *next_start != kNoTime ? *next_start : NowNanos();
    StepResult result =
        RunStep(*pending.procedure, pending.parent, next_seq_++);
    absl::Duration took = absl::ZeroDuration();
    absl::Time start = absl::InfinitePast();
    if (timed) {
      *next_start = NowNanos();
      took = absl::Nanoseconds(*next_start - started);
      start = report_.started + absl::Nanoseconds(started - started_ns_);
    }
    return Finish(pending, result, start, took);
  }

  void RunSerial() {
    // The end of one recorded step is the start of the next: one clock read
    // per step instead of two.
    int64_t next_start = kNoTime;
    const bool plain_default = options_.default_retry.max_attempts <= 1;
    // ctx_.Done() per step, without its call: the stop token's flag, and the
    // clock only when there is a deadline.
    const std::stop_token& stop = ctx_.stop_token();
    const bool has_deadline = ctx_.deadline() != absl::InfiniteFuture();
    Pending pending;
    while (PopNext(&pending)) {
      if (ABSL_PREDICT_FALSE(stop.stop_requested() ||
                             (has_deadline && ctx_.Done()))) {
        StopBefore(pending);
        stack_.push_back(std::move(pending));
        return;
      }
      Procedure& procedure = *pending.procedure;
      if (ABSL_PREDICT_FALSE(debug_ || !plain_default ||
                             procedure.retry_policy() != nullptr ||
                             procedure.Name().empty())) {
        if (!RunGeneral(pending, &next_start)) return;
        continue;
      }
      // One attempt, nothing to log: success costs one Do call, a clock read
      // and a record while recording, and nothing else once it has stopped.
      const bool recording = Recording();
      if (recording && next_start == kNoTime) next_start = NowNanos();
      ++next_seq_;
      bool threw = false;
      absl::StatusOr<Procedures> out = SafeDo(procedure, ctx_, &threw);
      if (ABSL_PREDICT_FALSE(!out.ok() || HasNull(*out))) {
        StepResult result;
        result.attempts = 1;
        if (out.ok()) {
          result.status = CheckNotNull(*out);
          result.children = std::move(out).value();
        } else {
          result.status = std::move(out).status();
        }
        absl::Time start = absl::InfinitePast();
        absl::Duration took = absl::ZeroDuration();
        if (recording) {
          const int64_t now = NowNanos();
          start = report_.started + absl::Nanoseconds(next_start - started_ns_);
          took = absl::Nanoseconds(now - next_start);
          next_start = now;
        }
        if (!Finish(pending, result, start, took)) return;
        continue;
      }
      ++report_.steps_run;
      int64_t id = -1;
      if (recording) {
        const int64_t now = NowNanos();
        id = static_cast<int64_t>(report_.steps.size());
        ReserveRecord();
        report_.steps.push_back(
            StepRecord{.id = id,
                       .parent = pending.parent,
                       .round = round_,
                       .name = procedure.Name(),
                       .outcome = StepOutcome::kSucceeded,
                       .status = {},
                       .attempts = 1,
                       .start = absl::Nanoseconds(next_start - started_ns_),
                       .duration = absl::Nanoseconds(now - next_start)});
        next_start = now;
      } else {
        report_.steps_truncated = true;
      }
      PushChildren(*out, id);
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
      // Each thread has its own arena: what it creates in Do comes from it.
      planner_internal::ProcedureArena arena(arenas_);
      planner_internal::ProcedureArena::Scope scope(&arena);
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
      chunks_taken_ += arena.chunks_taken();
    };
    std::vector<std::jthread> threads;
    threads.reserve(options_.parallelism - 1);
    for (int i = 1; i < options_.parallelism; ++i) {
      threads.emplace_back([&worker] {
        pthread_setname_np(pthread_self(), "sp-planner");
        worker();
      });
    }
    // The calling thread's worker has an arena of its own too, released at
    // the end of the round like the others.
    worker();
    threads.clear();  // Joins.
  }

  ExecutionReport Complete() {
    report_.retries = retries_.load();
    report_.status = failure_;
    report_.duration = clock_->Now() - report_.started;
    // An execution that did nothing (the world already matched) is a
    // debug line: a leader's steady plan runs every interval.
    const bool idle = report_.rounds == 0 && report_.steps_run == 0;
    spdlog::level::level_enum level = !report_.status.ok() ? spdlog::level::warn
                                      : idle ? spdlog::level::debug
                                             : spdlog::level::info;
    if (logger_ != nullptr && logger_->should_log(level)) {
      if (report_.status.ok()) {
        logger_->log(level, "plan executed {}", report_.Summary());
      } else {
        SPDLOG_LOGGER_WARN(logger_, "plan failed {}", report_.Summary());
      }
    }
    return std::move(report_);
  }

  const SchedulerOptions& options_;
  planner_internal::ArenaChunkCache* const arenas_;
  const Context& ctx_;
  Plan& plan_;
  // No clock reading yet (NowNanos never returns it in practice).
  static constexpr int64_t kNoTime = std::numeric_limits<int64_t>::min();

  Clock* const clock_;
  const bool real_clock_;  // clock_ is Clock::Real(): read absl's directly.
  spdlog::logger* const logger_;
  const bool debug_;

  // With parallelism > 1 the members below are guarded by RunParallel's
  // mutex while workers run (but retries_, an atomic bumped without it);
  // otherwise only the calling thread touches them.
  int64_t started_ns_ = 0;  // report_.started in Unix nanoseconds.
  ExecutionReport report_;
  Procedures round_list_;       // The current round's procedures, run in place.
  size_t round_next_ = 0;       // The next of round_list_ to run.
  std::vector<Pending> stack_;  // Children waiting to run, latest last.
  absl::Status failure_;
  int round_ = 0;
  std::atomic<int64_t> retries_{0};
  // Arena chunks taken by this execution's threads (for ArenaChunkCache).
  std::atomic<size_t> chunks_taken_{0};
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
    : options_(WithDefaults(std::move(options))),
      options_status_(ValidateSchedulerOptions(options_)),
      arenas_(std::make_shared<planner_internal::ArenaChunkCache>()) {}

ExecutionReport Scheduler::Execute(const Context& ctx, Plan& plan) const {
  Execution execution(options_, ctx, plan, arenas_.get());
  if (!options_status_.ok()) return execution.Refuse(options_status_);
  return execution.Run();
}

absl::StatusOr<std::vector<PreviewItem>> Scheduler::Preview(const Context& ctx,
                                                            Plan& plan) const {
  std::string op = absl::StrCat("preview plan=", SafePlanName(plan));
  if (!options_status_.ok()) return Annotate(options_status_, op);
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
    absl::StatusOr<std::string> description =
        CallUserCode("description", [&] { return p->Description(); });
    item.description =
        description.ok()
            ? *std::move(description)
            : absl::StrCat("(", description.status().message(), ")");
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace setpoint
