// Runner: the single thread that runs every event of a processor, so the
// logic of a node's modules needs no locks. Events are closures posted from
// any thread; timers run them later, on the injected Clock.
//
//   setpoint::Runner runner({.name = "pod-a/1"});
//   runner.Start();                                   // thread "sp-runner"
//   runner.Post([&] { store.Apply(change); }, "store apply");
//   auto timer = runner.PostAfter(absl::Seconds(5), [&] { Resync(); });
//   timer->Cancel();
//   runner.Stop();  // runs what was posted before, reports dropped timers
//
// No IO on the runner: an event that runs longer than slow_event_threshold is
// logged as a warning naming its origin. An event that throws is caught,
// logged with its origin and counted; the runner goes on.
//
// Stop(): new posts are refused (kFailedPrecondition); events posted before
// run; timers not yet due are dropped, counted in stats().timers_dropped and
// logged. In manual mode (no Start(), RunUntilIdle() in tests) Stop() runs
// nothing: queued events are counted as events_dropped and logged.
//
// Thread safety: Post, PostAfter, PostAt, stats() and TimerHandle::Cancel are
// thread-safe. Start, Stop and RunUntilIdle belong to one owner thread.
#ifndef SETPOINT_PROCESSOR_RUNNER_H_
#define SETPOINT_PROCESSOR_RUNNER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "spdlog/logger.h"

namespace setpoint {

struct RunnerOptions {
  // Names the runner in logs (for example the node id).
  // Default: "runner".
  std::string name = "runner";
  // Timers (PostAfter, PostAt) use this clock.
  // Default: Clock::Real().
  Clock* clock = Clock::Real();
  // Events that take longer (measured on the monotonic clock, coarse: a few
  // milliseconds of resolution) are logged as warnings. Zero disables it.
  // Default: 100 ms.
  absl::Duration slow_event_threshold = absl::Milliseconds(100);
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Counters for operators and tests.
struct RunnerStats {
  int64_t events_run = 0;      // Events and fired timers run.
  int64_t events_threw = 0;    // Of those, how many threw.
  int64_t slow_events = 0;     // Of those, how many ran past the threshold.
  int64_t events_dropped = 0;  // Queued but never run (manual-mode Stop).
  int64_t timers_fired = 0;
  int64_t timers_cancelled = 0;
  int64_t timers_dropped = 0;  // Not yet due at Stop().
};

class Runner;

// Cancels a timer posted with PostAfter/PostAt. Copyable; safe to use after
// the Runner is gone (Cancel then returns false).
class TimerHandle {
 public:
  TimerHandle() = default;
  // Returns true if the timer will not run (cancelled now); false if it
  // already ran, was cancelled before, or the runner is gone.
  bool Cancel();

 private:
  friend class Runner;
  struct Shared;
  TimerHandle(std::weak_ptr<Shared> shared, uint64_t id, uint32_t slot)
      : shared_(std::move(shared)), id_(id), slot_(slot) {}
  std::weak_ptr<Shared> shared_;
  uint64_t id_ = 0;    // The timer's posting sequence number (never reused).
  uint32_t slot_ = 0;  // Where the timer waits in the runner's slot table.
};

class Runner {
 public:
  using Event = absl::AnyInvocable<void() &&>;

  explicit Runner(RunnerOptions options = {});
  // Calls Stop().
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  // Starts the runner's thread ("sp-runner"). kFailedPrecondition if already
  // started or stopped.
  absl::Status Start();
  // See the file comment. Idempotent; joins the thread.
  void Stop();

  // Queues `event` to run on the runner, after the events posted before it.
  // `origin` names it in logs and must outlive the event (a literal).
  // kFailedPrecondition once Stop() was called.
  absl::Status Post(Event event, const char* origin = "event");
  // Runs `event` once `delay` has passed on the clock. Returns a handle that
  // can cancel it, or kFailedPrecondition once Stop() was called.
  absl::StatusOr<TimerHandle> PostAfter(absl::Duration delay, Event event,
                                        const char* origin = "timer");
  absl::StatusOr<TimerHandle> PostAt(absl::Time when, Event event,
                                     const char* origin = "timer");

  // Manual mode (no Start()): runs, on the calling thread, queued events and
  // due timers until none is left, including those they post. Returns how
  // many ran. Calling it after Start() returns 0 and runs nothing.
  int64_t RunUntilIdle();

  // True on the runner's thread (or inside RunUntilIdle).
  bool IsCurrent() const;

  RunnerStats stats() const;
  const std::string& name() const { return name_; }

 private:
  struct Tally;  // Counts of one batch, published to the stats at its end.

  void Loop();
  // Takes the timers due on the clock and runs them; returns how many ran.
  int64_t RunDueTimers();
  // Runs up to `max` queued events; returns how many ran. With `lag`, stops
  // where the slot `lag` places ahead is not published yet.
  int64_t RunEvents(int64_t max, uint64_t lag);
  // Runs one event, catching what it throws and timing it.
  void RunEvent(Event& event, const char* origin, Tally& tally);
  // Adds a batch's counts to the stats.
  void Publish(const Tally& tally);
  // Loop: waits (spinning first, then sleeping on the clock) until there may
  // be work; sets the `lag` for RunEvents. Returns false once stopped with
  // nothing left to run.
  bool AwaitWork(uint64_t* lag);
  // Manual mode Stop: destroys the queued events; returns how many.
  int64_t DropQueuedEvents();

  const std::string name_;
  Clock* const clock_;
  const absl::Duration slow_threshold_;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<TimerHandle::Shared> shared_;
  std::jthread thread_;
  // The thread running events (the loop or RunUntilIdle); empty otherwise.
  std::atomic<std::thread::id> current_{};
};

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_RUNNER_H_
