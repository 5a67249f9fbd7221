// ControllerHarness: one controller node run on the test's own thread with
// a SimulatedClock — runner events, timers, lists, client calls and plan
// executions run only inside RunUntilIdle() / Advance(), so a test moves
// time and asserts with no sleep and no wait on real time.
//
//   setpoint::testing::SimulatedClock clock({.auto_advance = true});
//   setpoint::testing::ControllerHarness h(build, {.clock = &clock});
//   SETPOINT_ASSERT_OK(h.Start());
//   SETPOINT_ASSERT_OK(h.Assign({0, 4096}, /*token=*/1));  // the whole ring
//   h.Advance(absl::Seconds(5));                  // lists, calls, plans
//   EXPECT_EQ(api.size(), 100);
//
// Client calls run on the test's thread: a fake that waits on the clock
// (API latency) needs a clock with auto_advance, which moves time to the
// end of the wait at once. Watches run here too: a stream's Next gets a
// deadline of now and must return what it has (the testing kit's
// FakeWatchWorld does). Two nodes of one pod are two harnesses given one
// PodSources.
//
// Thread safety: one thread (the test's).
#ifndef SETPOINT_TESTING_CONTROLLER_HARNESS_H_
#define SETPOINT_TESTING_CONTROLLER_HARNESS_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/base/metrics.h"
#include "setpoint/controller/controller.h"
#include "setpoint/controller/pod_sources.h"
#include "setpoint/node/node.h"
#include "setpoint/node/shard.h"
#include "setpoint/testing/simulated_clock.h"

namespace setpoint::testing {

struct ControllerHarnessOptions {
  // Required: the clock every piece uses.
  SimulatedClock* clock = nullptr;
  // The node the controller plays.
  // Default: {"test/node/0", "node", 0, 4096}.
  NodeInfo node = {.id = "test/node/0", .kind = "node"};
  // Default: 2 s.
  absl::Duration handoff_timeout = absl::Seconds(2);
  // The pod the node is in: harnesses given the same one share their
  // shared sources (SharedPoll, SharedWatch) as nodes of one pod do. Each
  // harness drives the shared sources in its RunUntilIdle, on the test's
  // thread.
  // Default: one of its own.
  std::shared_ptr<PodSources> pod_sources = nullptr;
  // Where the pieces publish their series.
  // Default: options.node.metrics, else none.
  MetricsRegistry* metrics = nullptr;
  // Default: spdlog's default logger.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

class ControllerHarness {
 public:
  ControllerHarness(ControllerBuildFn build, ControllerHarnessOptions options)
      : clock_(options.clock),
        controller_(options.node, std::move(build),
                    {.handoff_timeout = options.handoff_timeout,
                     .clock = options.clock,
                     .manual = true,
                     .metrics = options.metrics,
                     .pod_sources = std::move(options.pod_sources),
                     .logger = options.logger}) {}

  // Builds and starts the pieces (a Run), then runs what is due.
  absl::Status Start() {
    absl::Status s = controller_.Start();
    if (s.ok()) RunUntilIdle();
    return s;
  }
  // Stops and destroys the pieces; Start() builds fresh ones again.
  void Stop() { controller_.Stop(); }

  // Gives the node `range` under `token` (UpdateShardRange on this
  // thread), then runs what is due.
  absl::Status Assign(ShardRange range, uint64_t token) {
    absl::Status s = controller_.UpdateShardRange(Context::Background(clock_),
                                                  Assignment{range, token});
    RunUntilIdle();
    return s;
  }

  // Runs everything that can run before the clock's now; returns how much.
  int64_t RunUntilIdle() { return controller_.RunUntilIdle(); }

  // Moves the clock forward by `d`, stopping at every moment something is
  // due on the way and running it.
  void Advance(absl::Duration d) {
    const absl::Time until = clock_->Now() + d;
    RunUntilIdle();
    // Each pass runs at least one due moment; the bound only stops a
    // piece that says it is due but runs nothing.
    for (int passes = 0; passes < 1'000'000; ++passes) {
      absl::Time next = std::max(controller_.NextWakeTime(), clock_->Now());
      if (next > until) break;
      if (next == clock_->Now()) {
        if (RunUntilIdle() == 0) clock_->AdvanceTime(absl::Nanoseconds(1));
        continue;
      }
      clock_->AdvanceTo(next);
      RunUntilIdle();
    }
    clock_->AdvanceTo(until);
    RunUntilIdle();
  }

  // Runs `fn` on the controller's runner (this thread) and returns its
  // result, as Runner::PostAndWait.
  template <class Fn>
  auto OnRunner(Fn fn) {
    return controller_.runner()->PostAndWait(Context::Background(clock_),
                                             std::move(fn), "test on runner");
  }

  Controller& controller() { return controller_; }
  SimulatedClock& clock() { return *clock_; }

 private:
  SimulatedClock* const clock_;
  Controller controller_;
};

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_CONTROLLER_HARNESS_H_
