// The testing kit's ChildProcess: Ended() tells a process that ended from
// one that runs, and leaves the exit code to AwaitExit.
#include "setpoint/testing/child_process.h"

#include <signal.h>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace setpoint::testing {
namespace {

// Polls Ended() with a deadline (the child's exit is asynchronous).
bool EndsWithin(const ChildProcess& p, absl::Duration limit) {
  absl::Time until = absl::Now() + limit;
  while (!p.Ended()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

TEST(ChildProcessTest, EndedSeesAnExitWithoutTakingItsCode) {
  ChildProcess p({"/bin/sh", "-c", "exit 3"});
  ASSERT_TRUE(p.started());
  ASSERT_TRUE(EndsWithin(p, absl::Seconds(10)));
  EXPECT_TRUE(p.Ended()) << "asking twice does not reap it";
  EXPECT_EQ(p.AwaitExit(), 3);
  EXPECT_TRUE(p.Ended());
}

TEST(ChildProcessTest, ARunningProcessHasNotEndedUntilKilled) {
  ChildProcess p({"/bin/sh", "-c", "exec sleep 60"});
  ASSERT_TRUE(p.started());
  EXPECT_FALSE(p.Ended());
  p.Signal(SIGKILL);
  EXPECT_TRUE(EndsWithin(p, absl::Seconds(10)));
  EXPECT_EQ(p.AwaitExit(), -1) << "died of a signal";
}

}  // namespace
}  // namespace setpoint::testing
