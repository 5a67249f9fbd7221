#include "setpoint/planner/scheduler.h"

#include <pthread.h>

#include <atomic>
#include <stdexcept>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

using ::setpoint::testing::IsOk;
using ::setpoint::testing::SimulatedClock;
using ::setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

SchedulerOptions Quiet(SchedulerOptions o = {}) {
  o.logger = ::setpoint::testing::NullLogger(spdlog::level::trace);
  return o;
}

// Records the order procedures run in.
struct Trace {
  Mutex mu;
  std::vector<std::string> order ABSL_GUARDED_BY(mu);
  void Add(const std::string& s) {
    MutexLock l(&mu);
    order.push_back(s);
  }
  std::vector<std::string> Get() {
    MutexLock l(&mu);
    return order;
  }
};

// A node of a static tree: runs, logs its name, returns its children.
struct TreeSpec {
  std::string name;
  std::vector<TreeSpec> children;
};

std::unique_ptr<Procedure> Build(Trace* trace, const TreeSpec& spec) {
  return MakeProcedure(
      spec.name, [trace, spec](const Context&) -> absl::StatusOr<Procedures> {
        trace->Add(spec.name);
        Procedures out;
        for (const auto& c : spec.children) out.push_back(Build(trace, c));
        return out;
      });
}

// A plan that returns `rounds[i]` on the i-th Create call, then nothing.
class ScriptedPlan : public Plan {
 public:
  ScriptedPlan(Trace* trace, std::vector<std::vector<TreeSpec>> rounds)
      : trace_(trace), rounds_(std::move(rounds)) {}
  std::string Name() const override { return "scripted"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    ++creates;
    Procedures out;
    if (next_ < rounds_.size()) {
      for (const auto& spec : rounds_[next_])
        out.push_back(Build(trace_, spec));
      ++next_;
    }
    return out;
  }
  int creates = 0;

 private:
  Trace* trace_;
  std::vector<std::vector<TreeSpec>> rounds_;
  size_t next_ = 0;
};

TEST(Scheduler, ChildrenRunRightAfterTheirParentBeforeItsNextSibling) {
  Trace trace;
  ScriptedPlan plan(&trace, {{{"a", {{"a1", {{"a1x", {}}}}, {"a2", {}}}},
                              {"b", {{"b1", {}}}}},
                             {{"c", {}}}});
  Scheduler scheduler(Quiet());
  ExecutionReport r = scheduler.Execute(Context(), plan);
  ASSERT_THAT(r.status, IsOk());
  EXPECT_THAT(trace.Get(), ElementsAre("a", "a1", "a1x", "a2", "b", "b1", "c"));
  EXPECT_EQ(r.rounds, 2);
  EXPECT_EQ(plan.creates, 3);
  EXPECT_EQ(r.steps_run, 7);
  EXPECT_EQ(r.steps_failed, 0);
  ASSERT_EQ(r.steps.size(), 7u);
  // Parents are recorded: a1x's parent is a1, whose parent is a (a root).
  EXPECT_EQ(r.steps[0].name, "a");
  EXPECT_EQ(r.steps[0].parent, -1);
  EXPECT_EQ(r.steps[2].name, "a1x");
  EXPECT_EQ(r.steps[2].parent, 1);
  EXPECT_EQ(r.steps[1].parent, 0);
  EXPECT_EQ(r.steps[6].round, 2);
  EXPECT_FALSE(r.steps_truncated);
}

TEST(Scheduler, EmptyPlanConvergesWithoutRounds) {
  Trace trace;
  ScriptedPlan plan(&trace, {});
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(r.rounds, 0);
  EXPECT_EQ(r.steps_run, 0);
  EXPECT_EQ(r.plan, "scripted");
}

TEST(Scheduler, ExecutionIdsIncrease) {
  Trace trace;
  ScriptedPlan plan(&trace, {});
  Scheduler s(Quiet());
  uint64_t a = s.Execute(Context(), plan).execution_id;
  uint64_t b = s.Execute(Context(), plan).execution_id;
  EXPECT_GT(b, a);
}

// A plan that always wants the same step: it never converges.
class NeverConverges : public Plan {
 public:
  std::string Name() const override { return "stubborn"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    ++creates;
    return ProcedureList(MakeProcedure(
        "poke the api", [](const Context&) -> absl::StatusOr<Procedures> {
          return Procedures{};
        }));
  }
  int creates = 0;
};

TEST(Scheduler, MaxRoundsAbortsAPlanThatNeverConverges) {
  NeverConverges plan;
  ExecutionReport r =
      Scheduler(Quiet({.max_rounds = 5})).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kAborted,
                                 AllOf(HasSubstr("plan=stubborn"),
                                       HasSubstr("max_rounds=5"),
                                       HasSubstr("poke the api"))));
  EXPECT_EQ(r.rounds, 5);
  EXPECT_EQ(plan.creates, 6);
  EXPECT_EQ(r.steps_run, 5);
  // What the last Create still wanted is reported as not run.
  EXPECT_EQ(r.steps_not_run, 1);
  ASSERT_EQ(r.steps.size(), 6u);
  EXPECT_EQ(r.steps.back().outcome, StepOutcome::kNotRun);
  EXPECT_EQ(r.steps.back().round, 6);
}

TEST(Scheduler, DefaultMaxRoundsIs100) {
  NeverConverges plan;
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kAborted));
  EXPECT_EQ(r.rounds, 100);
}

TEST(Scheduler, CancelledBeforeTheFirstCreate) {
  Trace trace;
  ScriptedPlan plan(&trace, {{{"a", {}}}});
  std::stop_source stop;
  stop.request_stop();
  ExecutionReport r =
      Scheduler(Quiet()).Execute(Context(stop.get_token()), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kCancelled,
                                 HasSubstr("stopped before create round=1")));
  EXPECT_EQ(plan.creates, 0);
  EXPECT_TRUE(r.stopped_before.empty());
}

// Cancels the context when the step named `at` runs; checks the run stops
// before the next step and reports the rest as not run.
TEST(Scheduler, CancelledBeforeEachStepReportsWhereItStopped) {
  const std::vector<std::string> names = {"a", "a1", "b", "c"};
  for (size_t cut = 0; cut < names.size(); ++cut) {
    SCOPED_TRACE("cancel during " + names[cut]);
    std::stop_source stop;
    std::vector<std::string> ran;
    auto step = [&](const std::string& name, Procedures children) {
      auto shared = std::make_shared<Procedures>(std::move(children));
      return MakeProcedure(
          name,
          [&, name, shared](const Context&) -> absl::StatusOr<Procedures> {
            ran.push_back(name);
            if (name == names[cut]) stop.request_stop();
            return std::move(*shared);
          });
    };
    auto plan = PlanFunc(
        "cancel",
        [&,
         first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
          if (!first) return Procedures{};
          first = false;
          return ProcedureList(step("a", ProcedureList(step("a1", {}))),
                               step("b", {}), step("c", {}));
        });
    ExecutionReport r =
        Scheduler(Quiet()).Execute(Context(stop.get_token()), plan);
    EXPECT_EQ(ran.size(), cut + 1);
    EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kCancelled));
    if (cut + 1 < names.size()) {
      EXPECT_EQ(r.stopped_before, names[cut + 1]);
      EXPECT_THAT(r.status.message(),
                  HasSubstr("stopped before step=\"" + names[cut + 1] + "\""));
      EXPECT_EQ(r.steps_not_run, static_cast<int64_t>(names.size() - cut - 1));
    } else {
      // Cancelled during the last step: stopped before the next Create.
      EXPECT_THAT(r.status.message(),
                  HasSubstr("stopped before create round=2"));
      EXPECT_EQ(r.steps_not_run, 0);
    }
    EXPECT_EQ(r.steps_run, static_cast<int64_t>(cut + 1));
  }
}

TEST(Scheduler, DeadlineIsCheckedBeforeEveryStep) {
  SimulatedClock clock;
  Context ctx = Context::Background(&clock).WithTimeout(absl::Seconds(10));
  int ran = 0;
  auto plan =
      PlanFunc("slow", [&](const Context&) -> absl::StatusOr<Procedures> {
        Procedures out;
        for (int i = 0; i < 5; ++i) {
          out.push_back(
              MakeProcedure("tick " + std::to_string(i),
                            [&](const Context&) -> absl::StatusOr<Procedures> {
                              ++ran;
                              clock.AdvanceTime(absl::Seconds(4));
                              return Procedures{};
                            }));
        }
        return out;
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(ctx, plan);
  EXPECT_EQ(ran, 3);  // t=0, 4, 8 run; at t=12 the deadline has passed.
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ(r.stopped_before, "tick 3");
  EXPECT_EQ(r.steps_not_run, 2);
}

TEST(Scheduler, FirstFailureAbortsAndPendingStepsAreReportedNotRun) {
  Trace trace;
  auto plan = PlanFunc(
      "fails",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        return ProcedureList(
            Build(&trace, {"ok", {}}),
            MakeProcedure("broken",
                          [](const Context&) -> absl::StatusOr<Procedures> {
                            return absl::UnavailableError("503 from api");
                          }),
            Build(&trace, {"after", {}}));
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kUnavailable,
                                 AllOf(HasSubstr("step=\"broken\""),
                                       HasSubstr("503 from api"))));
  EXPECT_THAT(trace.Get(), ElementsAre("ok"));
  EXPECT_EQ(r.steps_failed, 1);
  EXPECT_EQ(r.steps_not_run, 1);
  EXPECT_EQ(r.stopped_before, "");
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.steps[1].outcome, StepOutcome::kFailed);
  EXPECT_EQ(r.steps[2].name, "after");
  EXPECT_EQ(r.steps[2].outcome, StepOutcome::kNotRun);
}

// A plan that returns the same failing step every time: the execution ends
// at the first failure (or, with continue_on_failure, after the first round)
// instead of calling the failing API again and again.
TEST(Scheduler, SameFailingStepForeverEndsAtOnce) {
  for (bool keep_going : {false, true}) {
    int creates = 0, calls = 0;
    auto plan =
        PlanFunc("doomed", [&](const Context&) -> absl::StatusOr<Procedures> {
          ++creates;
          return ProcedureList(
              MakeProcedure("call broken api",
                            [&](const Context&) -> absl::StatusOr<Procedures> {
                              ++calls;
                              return absl::InternalError("500");
                            }));
        });
    ExecutionReport r = Scheduler(Quiet({.continue_on_failure = keep_going}))
                            .Execute(Context(), plan);
    EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInternal,
                                   HasSubstr("step=\"call broken api\"")));
    EXPECT_EQ(creates, 1);
    EXPECT_EQ(calls, 1);
  }
}

TEST(Scheduler, ContinueOnFailureRunsTheRestOfTheRoundThenReports) {
  Trace trace;
  auto plan = PlanFunc(
      "fails",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        return ProcedureList(
            MakeProcedure("broken",
                          [](const Context&) -> absl::StatusOr<Procedures> {
                            return absl::InternalError("bad");
                          }),
            Build(&trace, {"after", {{"child", {}}}}));
      });
  ExecutionReport r =
      Scheduler(Quiet({.continue_on_failure = true})).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInternal));
  EXPECT_THAT(trace.Get(), ElementsAre("after", "child"));
  EXPECT_EQ(r.steps_run, 3);
  EXPECT_EQ(r.steps_failed, 1);
  EXPECT_EQ(r.rounds, 1);  // No new round after a failed one.
}

TEST(Scheduler, ExceptionsBecomeFailedSteps) {
  auto plan =
      PlanFunc("throws", [](const Context&) -> absl::StatusOr<Procedures> {
        return ProcedureList(MakeProcedure(
            "explode", [](const Context&) -> absl::StatusOr<Procedures> {
              throw std::runtime_error("kaboom");
            }));
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInternal,
                                 AllOf(HasSubstr("step=\"explode\""),
                                       HasSubstr("threw: kaboom"))));
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].outcome, StepOutcome::kFailed);
}

TEST(Scheduler, NonStandardExceptionsToo) {
  auto plan =
      PlanFunc("throws", [](const Context&) -> absl::StatusOr<Procedures> {
        return ProcedureList(MakeProcedure(
            "explode",
            [](const Context&) -> absl::StatusOr<Procedures> { throw 42; }));
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInternal,
                                 HasSubstr("non-standard exception")));
}

TEST(Scheduler, ExceptionFromCreateIsAClearError) {
  auto plan =
      PlanFunc("bad-create", [](const Context&) -> absl::StatusOr<Procedures> {
        throw std::logic_error("inventory corrupt");
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInternal,
                                 AllOf(HasSubstr("plan=bad-create"),
                                       HasSubstr("create round=1"),
                                       HasSubstr("inventory corrupt"))));
}

TEST(Scheduler, CreateErrorIsAnnotated) {
  auto plan = PlanFunc("p", [](const Context&) -> absl::StatusOr<Procedures> {
    return absl::UnavailableError("list instances: 503");
  });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status,
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("create round=1: list instances: 503")));
}

TEST(Scheduler, NullProcedureFromCreateIsRefused) {
  auto plan =
      PlanFunc("nulls", [](const Context&) -> absl::StatusOr<Procedures> {
        Procedures out;
        out.push_back(MakeProcedure(
            "fine", [](const Context&) -> absl::StatusOr<Procedures> {
              return Procedures{};
            }));
        out.push_back(nullptr);
        return out;
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("null procedure at index 1 of 2")));
  EXPECT_EQ(r.steps_run, 0);
  EXPECT_EQ(r.steps_not_run, 1);  // "fine" is reported, not dropped.
}

TEST(Scheduler, NullChildFailsItsParentAndSiblingsAreReported) {
  auto plan = PlanFunc(
      "nulls",
      [first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        return ProcedureList(MakeProcedure(
            "parent", [](const Context&) -> absl::StatusOr<Procedures> {
              Procedures out;
              out.push_back(nullptr);
              out.push_back(MakeProcedure(
                  "sibling", [](const Context&) -> absl::StatusOr<Procedures> {
                    return Procedures{};
                  }));
              return out;
            }));
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("step=\"parent\""),
                             HasSubstr("null procedure at index 0"))));
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[1].name, "sibling");
  EXPECT_EQ(r.steps[1].outcome, StepOutcome::kNotRun);
  EXPECT_EQ(r.steps[1].parent, 0);
}

TEST(Scheduler, EmptyNameIsRefused) {
  auto plan =
      PlanFunc("unnamed", [](const Context&) -> absl::StatusOr<Procedures> {
        return ProcedureList(
            MakeProcedure("", [](const Context&) -> absl::StatusOr<Procedures> {
              return Procedures{};
            }));
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("refused a procedure with an empty name "
                                 "returned by create")));
  EXPECT_EQ(r.steps_failed, 1);
}

TEST(Scheduler, UnnamedChildIsRefusedBeforeItRuns) {
  bool ran = false;
  auto plan = PlanFunc(
      "unnamed",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        return ProcedureList(MakeProcedure(
            "parent", [&](const Context&) -> absl::StatusOr<Procedures> {
              return ProcedureList(MakeProcedure(
                  "", [&](const Context&) -> absl::StatusOr<Procedures> {
                    ran = true;
                    return Procedures{};
                  }));
            }));
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_FALSE(ran);
  EXPECT_THAT(r.status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty name returned by step id=0")));
  // Past max_recorded_steps the same check runs on the fast path.
  ran = false;
  auto plan2 = PlanFunc(
      "unnamed2",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        return ProcedureList(MakeProcedure(
            "", [&](const Context&) -> absl::StatusOr<Procedures> {
              ran = true;
              return Procedures{};
            }));
      });
  ExecutionReport r2 =
      Scheduler(Quiet({.max_recorded_steps = 0})).Execute(Context(), plan2);
  EXPECT_FALSE(ran);
  EXPECT_THAT(r2.status, StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(Scheduler, RetriesWithBackoffOnTheClockThenSucceeds) {
  SimulatedClock clock({.auto_advance = true});
  int attempts = 0;
  auto plan = PlanFunc(
      "retry",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        auto p = MakeProcedure(
            "flaky", [&](const Context&) -> absl::StatusOr<Procedures> {
              if (++attempts < 3) return absl::UnavailableError("503");
              return Procedures{};
            });
        p->set_retry_policy({.max_attempts = 5,
                             .backoff = {.initial = absl::Seconds(1),
                                         .max = absl::Seconds(8),
                                         .jitter = 0}});
        return ProcedureList(std::move(p));
      });
  absl::Time t0 = clock.Now();
  ExecutionReport r =
      Scheduler(Quiet()).Execute(Context::Background(&clock), plan);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(attempts, 3);
  EXPECT_EQ(r.retries, 2);
  ASSERT_EQ(r.steps.size(), 1u);
  EXPECT_EQ(r.steps[0].attempts, 3);
  EXPECT_EQ(clock.Now() - t0, absl::Seconds(3));  // 1 s + 2 s of backoff.
  EXPECT_EQ(r.steps[0].duration, absl::Seconds(3));
}

TEST(Scheduler, RetriesStopAtMaxAttemptsAndSkipTerminalErrors) {
  SimulatedClock clock({.auto_advance = true});
  int unavailable = 0, invalid = 0;
  auto plan =
      PlanFunc("retry", [&](const Context&) -> absl::StatusOr<Procedures> {
        return ProcedureList(
            MakeProcedure("always 503",
                          [&](const Context&) -> absl::StatusOr<Procedures> {
                            ++unavailable;
                            return absl::UnavailableError("503");
                          }),
            MakeProcedure("invalid",
                          [&](const Context&) -> absl::StatusOr<Procedures> {
                            ++invalid;
                            return absl::InvalidArgumentError("bad request");
                          }));
      });
  SchedulerOptions o = Quiet({.continue_on_failure = true});
  o.default_retry = {.max_attempts = 4, .backoff = {.jitter = 0}};
  ExecutionReport r = Scheduler(o).Execute(Context::Background(&clock), plan);
  EXPECT_EQ(unavailable, 4);
  EXPECT_EQ(invalid, 1);
  EXPECT_EQ(r.steps_failed, 2);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kUnavailable,
                                 HasSubstr("attempts=4")));
}

TEST(Scheduler, CustomRetryablePredicate) {
  SimulatedClock clock({.auto_advance = true});
  int calls = 0;
  auto plan = PlanFunc(
      "retry",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        auto p = MakeProcedure(
            "precondition", [&](const Context&) -> absl::StatusOr<Procedures> {
              if (++calls < 2) return absl::FailedPreconditionError("not yet");
              return Procedures{};
            });
        p->set_retry_policy(
            {.max_attempts = 3, .retryable = [](const absl::Status& s) {
               return absl::IsFailedPrecondition(s);
             }});
        return ProcedureList(std::move(p));
      });
  ExecutionReport r =
      Scheduler(Quiet()).Execute(Context::Background(&clock), plan);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(calls, 2);
}

TEST(Scheduler, CancelDuringRetryBackoffStopsPromptly) {
  SimulatedClock clock;
  std::stop_source stop;
  auto plan =
      PlanFunc("retry", [&](const Context&) -> absl::StatusOr<Procedures> {
        auto p = MakeProcedure(
            "down", [](const Context&) -> absl::StatusOr<Procedures> {
              return absl::UnavailableError("503");
            });
        p->set_retry_policy(
            {.max_attempts = 100,
             .backoff = {.initial = absl::Hours(1), .max = absl::Hours(1)}});
        return ProcedureList(std::move(p));
      });
  ExecutionReport r;
  std::jthread runner([&] {
    r = Scheduler(Quiet()).Execute(Context(stop.get_token(), &clock), plan);
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));  // Blocked in the backoff wait.
  stop.request_stop();
  runner.join();
  // The run was cancelled; the step's own last error is kept in the message.
  EXPECT_THAT(r.status,
              StatusIs(absl::StatusCode::kCancelled,
                       HasSubstr("failed with \"UNAVAILABLE: 503\"")));
  EXPECT_EQ(r.steps[0].attempts, 1);
}

TEST(Scheduler, ExceptionsAreNotRetried) {
  int calls = 0;
  auto plan =
      PlanFunc("throws", [&](const Context&) -> absl::StatusOr<Procedures> {
        auto p = MakeProcedure(
            "bug", [&](const Context&) -> absl::StatusOr<Procedures> {
              ++calls;
              throw std::out_of_range("vector::at");
            });
        p->set_retry_policy({.max_attempts = 5});
        return ProcedureList(std::move(p));
      });
  ExecutionReport r = Scheduler(Quiet()).Execute(Context(), plan);
  EXPECT_THAT(r.status,
              StatusIs(absl::StatusCode::kInternal, HasSubstr("vector::at")));
  EXPECT_EQ(calls, 1);
}

TEST(Scheduler, RetryJitterIsReproducibleWithASeed) {
  auto run = [](uint64_t seed) {
    SimulatedClock clock({.auto_advance = true});
    auto plan = PlanFunc(
        "jitter",
        [first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
          if (!first) return Procedures{};
          first = false;
          return ProcedureList(MakeProcedure(
              "flaky",
              [n = 0](const Context&) mutable -> absl::StatusOr<Procedures> {
                if (++n < 4) return absl::UnavailableError("503");
                return Procedures{};
              }));
        });
    SchedulerOptions o = Quiet({.seed = seed});
    o.default_retry = {.max_attempts = 4,
                       .backoff = {.initial = absl::Seconds(1), .jitter = 0.9}};
    absl::Time t0 = clock.Now();
    EXPECT_THAT(Scheduler(o).Execute(Context::Background(&clock), plan).status,
                IsOk());
    return clock.Now() - t0;
  };
  EXPECT_EQ(run(11), run(11));
  EXPECT_NE(run(11), run(12));
}

// Runs `fn` on a thread with a small native stack (256 KiB): anything
// recursive per procedure would overflow it.
void RunOnSmallStack(std::function<void()> fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t thread;
  auto* heap_fn = new std::function<void()>(std::move(fn));
  ASSERT_EQ(pthread_create(
                &thread, &attr,
                [](void* arg) -> void* {
                  auto* f = static_cast<std::function<void()>*>(arg);
                  (*f)();
                  delete f;
                  return nullptr;
                },
                heap_fn),
            0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

class Link : public Procedure {
 public:
  Link(int64_t remaining, int64_t* counter)
      : Procedure("link"), remaining_(remaining), counter_(counter) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    ++*counter_;
    Procedures out;
    if (remaining_ > 1)
      out.push_back(std::make_unique<Link>(remaining_ - 1, counter_));
    return out;
  }

 private:
  int64_t remaining_;
  int64_t* counter_;
};

// Deep enough that one native frame per procedure would overflow the 256 KiB
// stack many times over; smaller where sanitizers or -O0 slow every step.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || \
    !defined(NDEBUG)
constexpr int64_t kDepth = 200'000;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int64_t kDepth = 200'000;
#else
constexpr int64_t kDepth = 1'000'000;
#endif
#else
constexpr int64_t kDepth = 1'000'000;
#endif

TEST(Scheduler, DeepChainRunsIterativelyOnASmallStack) {
  int64_t counter = 0;
  ExecutionReport r;
  RunOnSmallStack([&] {
    auto plan = PlanFunc(
        "chain",
        [&,
         first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
          if (!first) return Procedures{};
          first = false;
          return ProcedureList(std::make_unique<Link>(kDepth, &counter));
        });
    r = Scheduler(Quiet()).Execute(Context(), plan);
  });
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(counter, kDepth);
  EXPECT_EQ(r.steps_run, kDepth);
  // Recording stops at max_recorded_steps; memory does not grow with depth.
  EXPECT_EQ(r.steps.size(), 10'000u);
  EXPECT_TRUE(r.steps_truncated);
  EXPECT_EQ(r.steps.back().parent, 9'998);
}

TEST(Scheduler, MaxRecordedStepsZeroKeepsOnlyCounters) {
  int64_t counter = 0;
  auto plan = PlanFunc(
      "chain",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        return ProcedureList(std::make_unique<Link>(10, &counter));
      });
  ExecutionReport r =
      Scheduler(Quiet({.max_recorded_steps = 0})).Execute(Context(), plan);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(r.steps_run, 10);
  EXPECT_TRUE(r.steps.empty());
  EXPECT_TRUE(r.steps_truncated);
}

TEST(Scheduler, ParallelismRunsSiblingsConcurrentlyWithinTheBound) {
  constexpr int kSiblings = 16;
  constexpr int kParallelism = 4;
  Mutex mu;
  CondVar cv;
  int running = 0, max_running = 0, done = 0;
  auto plan = PlanFunc(
      "parallel",
      [&, first = true](const Context&) mutable -> absl::StatusOr<Procedures> {
        if (!first) return Procedures{};
        first = false;
        Procedures out;
        for (int i = 0; i < kSiblings; ++i) {
          out.push_back(MakeProcedure(
              "work " + std::to_string(i),
              [&](const Context&) -> absl::StatusOr<Procedures> {
                MutexLock l(&mu);
                ++running;
                max_running = std::max(max_running, running);
                cv.SignalAll();
                // Hold the slot until the pool is full (or
                // the round is almost done), so the test
                // sees real overlap without sleeping.
                cv.Wait(&mu, {}, [&] {
                  return running >= kParallelism || done + running >= kSiblings;
                });
                --running;
                ++done;
                cv.SignalAll();
                return ProcedureList(MakeProcedure(
                    "child", [](const Context&) -> absl::StatusOr<Procedures> {
                      return Procedures{};
                    }));
              }));
        }
        return out;
      });
  ExecutionReport r =
      Scheduler(Quiet({.parallelism = kParallelism})).Execute(Context(), plan);
  EXPECT_THAT(r.status, IsOk());
  EXPECT_EQ(r.steps_run, 2 * kSiblings);
  MutexLock l(&mu);
  EXPECT_EQ(max_running, kParallelism);
  // Every child ran after its parent.
  for (const StepRecord& s : r.steps) {
    if (s.name == "child") {
      ASSERT_GE(s.parent, 0);
      EXPECT_LT(s.parent, s.id);
      EXPECT_NE(r.steps[s.parent].name, "child");
    }
  }
}

TEST(Scheduler, ParallelFailureStopsNewWork) {
  // The work steps wait until the failing step returned, so the failure
  // lands while most of them are still queued. A worker preempted right
  // after that (a loaded machine) could still let the other run them all,
  // so a few attempts are allowed: a scheduler that never stops new work
  // fails every one.
  int64_t not_run = 0;
  for (int attempt = 0; attempt < 5 && not_run == 0; ++attempt) {
    std::atomic<int> ran{0};
    std::atomic<bool> failed{false};
    auto plan =
        PlanFunc("parallel", [&](const Context&) -> absl::StatusOr<Procedures> {
          Procedures out;
          out.push_back(MakeProcedure(
              "fail", [&](const Context&) -> absl::StatusOr<Procedures> {
                ++ran;
                failed.store(true);
                failed.notify_all();
                return absl::InternalError("boom");
              }));
          for (int i = 0; i < 50; ++i) {
            out.push_back(MakeProcedure(
                "work", [&](const Context&) -> absl::StatusOr<Procedures> {
                  failed.wait(false);
                  ++ran;
                  return Procedures{};
                }));
          }
          return out;
        });
    ExecutionReport r =
        Scheduler(Quiet({.parallelism = 2})).Execute(Context(), plan);
    EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInternal));
    EXPECT_EQ(r.steps_run, ran.load());
    EXPECT_EQ(r.steps_run + r.steps_not_run, 51);
    not_run = r.steps_not_run;
  }
  EXPECT_GT(not_run, 0);
}

TEST(Scheduler, PreviewShowsTheNextRoundWithoutRunningIt) {
  int ran = 0;
  auto plan =
      PlanFunc("preview", [&](const Context&) -> absl::StatusOr<Procedures> {
        return ProcedureList(
            MakeProcedure(
                "run instance",
                [&](const Context&) -> absl::StatusOr<Procedures> {
                  ++ran;
                  return Procedures{};
                },
                "start 1 instance (have 2, want 3)"),
            MakeProcedure("update dns",
                          [&](const Context&) -> absl::StatusOr<Procedures> {
                            ++ran;
                            return Procedures{};
                          }));
      });
  Scheduler s(Quiet());
  SETPOINT_ASSERT_OK_AND_ASSIGN(std::vector<PreviewItem> items,
                                s.Preview(Context(), plan));
  EXPECT_EQ(ran, 0);
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].name, "run instance");
  EXPECT_EQ(items[0].description, "start 1 instance (have 2, want 3)");
  EXPECT_EQ(items[1].description, "");
  EXPECT_EQ(FormatPreview(items),
            "  1. run instance — start 1 instance (have 2, want 3)\n"
            "  2. update dns\n");
  EXPECT_EQ(FormatPreview({}), "  (nothing to do: converged)\n");
}

TEST(Scheduler, PreviewReportsBadPlans) {
  auto throws = PlanFunc("t", [](const Context&) -> absl::StatusOr<Procedures> {
    throw std::runtime_error("nope");
  });
  auto nulls = PlanFunc("n", [](const Context&) -> absl::StatusOr<Procedures> {
    Procedures out;
    out.push_back(nullptr);
    return out;
  });
  Scheduler s(Quiet());
  EXPECT_THAT(s.Preview(Context(), throws),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("nope")));
  EXPECT_THAT(s.Preview(Context(), nulls),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("preview plan=n create")));
  auto unnamed =
      PlanFunc("u", [](const Context&) -> absl::StatusOr<Procedures> {
        return ProcedureList(
            MakeProcedure("", [](const Context&) -> absl::StatusOr<Procedures> {
              return Procedures{};
            }));
      });
  EXPECT_THAT(s.Preview(Context(), unnamed),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("empty name at index 0")));
  std::stop_source stop;
  stop.request_stop();
  EXPECT_THAT(s.Preview(Context(stop.get_token()), nulls),
              StatusIs(absl::StatusCode::kCancelled));
}

TEST(Scheduler, WorksWhenTheApplicationDroppedTheDefaultLogger) {
  std::shared_ptr<spdlog::logger> saved = spdlog::default_logger();
  spdlog::drop_all();  // Also drops the default logger.
  NeverConverges plan;
  ExecutionReport r = Scheduler({.max_rounds = 2}).Execute(Context(), plan);
  spdlog::set_default_logger(saved);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kAborted));
}

TEST(SchedulerOptions, ValidateNamesTheField) {
  EXPECT_THAT(ValidateSchedulerOptions({}), IsOk());
  EXPECT_THAT(
      ValidateSchedulerOptions({.max_rounds = 0}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_rounds")));
  EXPECT_THAT(
      ValidateSchedulerOptions({.parallelism = 0}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("parallelism")));
  EXPECT_THAT(ValidateSchedulerOptions({.max_recorded_steps = -1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_recorded_steps")));
  SchedulerOptions o;
  o.default_retry.max_attempts = 0;
  EXPECT_THAT(
      ValidateSchedulerOptions(o),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_attempts")));
}

TEST(SchedulerOptions, BadOptionsAreRefusedBeforeCreate) {
  NeverConverges plan;
  Scheduler scheduler(Quiet({.max_rounds = -3, .parallelism = -1}));
  EXPECT_THAT(scheduler.options_status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_rounds must be >= 1, got -3")));
  ExecutionReport r = scheduler.Execute(Context(), plan);
  EXPECT_THAT(r.status, StatusIs(absl::StatusCode::kInvalidArgument,
                                 HasSubstr("max_rounds must be >= 1, got -3")));
  EXPECT_THAT(std::string(r.status.message()),
              HasSubstr("execute plan=stubborn"));
  EXPECT_EQ(plan.creates, 0);
  EXPECT_EQ(r.rounds, 0);
  EXPECT_EQ(r.steps_run, 0);
  EXPECT_THAT(
      scheduler.Preview(Context(), plan),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_rounds")));
  EXPECT_EQ(plan.creates, 0);

  Scheduler bad_parallelism(Quiet({.parallelism = 0}));
  EXPECT_THAT(bad_parallelism.Execute(Context(), plan).status,
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parallelism must be >= 1, got 0")));
  EXPECT_EQ(plan.creates, 0);
  EXPECT_THAT(Scheduler(Quiet()).options_status(), IsOk());
}

}  // namespace
}  // namespace setpoint
