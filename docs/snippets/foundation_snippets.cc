// The C++ snippets of docs/foundation.md, compiled (and some run) by
// doc_snippets_test, which also checks that the doc shows them as they are
// here. Between "clang-format off" and "on" the text is the doc's, layout
// included; edit both together.

#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/check.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"
#include "spdlog/spdlog.h"

namespace foundation_snippets {

// ## Clock
// clang-format off
setpoint::Mutex mu;
setpoint::CondVar cv;
bool ready = false;  // guarded by mu

// Waiter: true once ready, false at the deadline or on a stop.
bool AwaitReady(setpoint::Clock* clock, std::stop_token stop) {
  setpoint::MutexLock l(&mu);
  return clock->AwaitWithDeadline(&mu, &cv, clock->Now() + absl::Seconds(1),
                                  stop, [&] { return ready; });
}

// Another thread:
void SetReady() { setpoint::MutexLock l(&mu); ready = true; cv.SignalAll(); }
// clang-format on

TEST(FoundationSnippets, Clock) {
  SetReady();
  EXPECT_TRUE(AwaitReady(setpoint::Clock::Real(), {}));
}

// ## SimulatedClock
TEST(FoundationSnippets, SimulatedClock) {
  // clang-format off
setpoint::testing::SimulatedClock clock;
std::jthread t([&](std::stop_token st) { clock.SleepFor(absl::Seconds(5), st); });
ASSERT_TRUE(clock.AwaitWaiters(1));   // the thread is blocked on the clock
clock.AdvanceTime(absl::Seconds(5));  // ...and now it wakes
                                        // clang-format on
}

// ## Context
absl::Status ContextSnippet() {
  // clang-format off
std::stop_source stop;
setpoint::Context ctx(stop.get_token());                    // cancelled by stop
setpoint::Context step = ctx.WithTimeout(absl::Seconds(5)); // shorter deadline
if (step.Done()) return step.Err();       // kCancelled or kDeadlineExceeded
SETPOINT_RETURN_IF_ERROR(step.Wait(absl::Milliseconds(100)));  // cancellable sleep
  // clang-format on
  return absl::OkStatus();
}

struct Worker {
  void Run(const setpoint::Context&) {}
};

void CancelScopeSnippet(const setpoint::Context& ctx, Worker& worker) {
  // clang-format off
setpoint::CancelScope scope(ctx);
worker.Run(scope.context());
scope.Cancel();  // stops worker, leaves ctx alone
                   // clang-format on
}

// ## Backoff
absl::Status TryOnce() { return absl::OkStatus(); }

void BackoffSnippet(const setpoint::Context& ctx) {
  // clang-format off
setpoint::Backoff backoff({.initial = absl::Milliseconds(100), .max = absl::Minutes(5)});
while (!TryOnce().ok()) {
  if (!ctx.Wait(backoff.Next()).ok()) break;
}
backoff.Reset();  // after a success
                    // clang-format on
}

// ## Status helpers
absl::Status Dial(int port) {
  return port > 0 ? absl::OkStatus() : absl::UnavailableError("dial: refused");
}

// clang-format off
absl::StatusOr<int> ParsePort(std::string_view s);

absl::Status Connect(std::string_view addr) {
  SETPOINT_ASSIGN_OR_RETURN(int port, ParsePort(addr));  // or an existing variable
  SETPOINT_RETURN_IF_ERROR(Dial(port));  // accepts Status or StatusOr
  return absl::OkStatus();
}
// clang-format on

absl::StatusOr<int> ParsePort(std::string_view s) {
  int port = 0;
  if (!absl::SimpleAtoi(absl::string_view(s.data(), s.size()), &port)) {
    return absl::InvalidArgumentError("parse port: not a number");
  }
  return port;
}

// ### Status matchers for tests
absl::Status DoThing() { return absl::OkStatus(); }
absl::StatusOr<int> Parse(std::string_view s) { return ParsePort(s); }

TEST(FoundationSnippets, StatusMatchers) {
  // clang-format off
using ::setpoint::testing::IsOk;
using ::setpoint::testing::StatusIs;

EXPECT_THAT(DoThing(), IsOk());
EXPECT_THAT(Parse("x"), StatusIs(absl::StatusCode::kInvalidArgument));
EXPECT_THAT(Parse("x"), StatusIs(absl::StatusCode::kInvalidArgument,
                                 ::testing::HasSubstr("port")));
SETPOINT_EXPECT_OK(DoThing());
SETPOINT_ASSERT_OK(DoThing());
SETPOINT_ASSERT_OK_AND_ASSIGN(int port, Parse("80"));
  // clang-format on
  EXPECT_EQ(port, 80);
}

// ## Check macros
void CheckSnippet(const std::vector<int>& stack, int n) {
  // clang-format off
SETPOINT_CHECK(stack.empty());
SETPOINT_CHECK_MSG(n >= 0, "negative count n={}", n);  // fmt-style, formatted only on failure
                          // clang-format on
}

// ## fmt formatters
void FormatSnippet(const std::shared_ptr<spdlog::logger>& logger,
                   const std::string& op, const absl::Status& status,
                   absl::Duration delay) {
  // clang-format off
SPDLOG_LOGGER_WARN(logger, "retrying op={} err={} after={}", op, status, delay);
  // clang-format on
}

// ## Mutex, CondVar and ThreadChecker
// clang-format off
class Counter {
 public:
  void Add() { setpoint::MutexLock l(&mu_); ++n_; cv_.SignalAll(); }
 private:
  setpoint::Mutex mu_;
  setpoint::CondVar cv_;
  int n_ ABSL_GUARDED_BY(mu_) = 0;
};

class Module {
 public:
  void OnEvent() { SETPOINT_DCHECK_THREAD(runner_checker_); ++state_; }

 private:
  setpoint::ThreadChecker runner_checker_;
  int state_ ABSL_GUARDED_BY(runner_checker_) = 0;
};
// clang-format on

TEST(FoundationSnippets, CounterAndModule) {
  Counter counter;
  counter.Add();
  Module module;
  module.OnEvent();
}

}  // namespace foundation_snippets
