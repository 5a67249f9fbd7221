// Runner: the single thread that runs every event of a processor, so the
// logic of a node's modules needs no locks. Events are closures posted from
// any thread; timers run them later, on the injected Clock.
//
//   setpoint::Runner runner({.name = "pod-a/1"});
//   runner.Start();                                   // thread "sp-runner"
//   runner.Post([&] { store.Apply(change); }, "store apply");
//   auto timer = runner.PostAfter(absl::Seconds(5), [&] { Resync(); });
//   timer->Cancel();
//   absl::StatusOr<size_t> n = runner.PostAndWait(ctx, [&] {
//     return store.size();  // runner-only state, read from another thread
//   });
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
// On a pool (RunnerOptions::pool, runner_pool.h) the runner has no thread of
// its own: the pool's threads run its events, one at a time and in order as
// on its own thread, while it has work. Everything above holds there too;
// an event must not wait (PostAndWait) for another runner of the same pool.
//
// Thread safety: Post, PostAfter, PostAt, stats() and TimerHandle::Cancel are
// thread-safe, and so is PostAndWait on a started runner. Start, Stop,
// RunUntilIdle and PostAndWait in manual mode belong to one owner thread.
#ifndef SETPOINT_PROCESSOR_RUNNER_H_
#define SETPOINT_PROCESSOR_RUNNER_H_

#include <atomic>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/check.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "spdlog/logger.h"

namespace setpoint {

class RunnerPool;

struct RunnerOptions {
  // Names the runner in logs (for example the node id).
  // Default: "runner".
  std::string name = "runner";
  // Timers (PostAfter, PostAt) use this clock.
  // Default: Clock::Real().
  Clock* clock = Clock::Real();
  // Events that take longer (measured on the monotonic clock, coarse: a few
  // milliseconds of resolution) are logged as warnings. Zero disables it;
  // a negative value is refused by Start.
  // Default: 100 ms.
  absl::Duration slow_event_threshold = absl::Milliseconds(100);
  // Where the runner publishes setpoint_runner_* (docs/operations.md),
  // labelled with metric_labels and runner=<name>. The latency and duration
  // histograms time one event in 64.
  // Default: none (nothing is published or timed).
  MetricsRegistry* metrics = nullptr;
  MetricLabels metric_labels = {};
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
  // Runs the events on these shared threads instead of a thread of the
  // runner's own (Start refuses a pool that is not running, or whose clock
  // is not `clock`). It must outlive the runner's Stop().
  // Default: none (Start() starts the runner's own thread).
  RunnerPool* pool = nullptr;
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

namespace runner_internal {
// What PostAndWait returns for a function returning R (cv and & removed).
template <class R>
struct WaitResult {
  using type = absl::StatusOr<R>;
};
template <>
struct WaitResult<void> {
  using type = absl::Status;
};
template <>
struct WaitResult<absl::Status> {
  using type = absl::Status;
};
template <class T>
struct WaitResult<absl::StatusOr<T>> {
  using type = absl::StatusOr<T>;
};
}  // namespace runner_internal

// What Runner::PostAndWait(ctx, fn) returns: absl::Status when fn returns
// void or absl::Status; absl::StatusOr<T> when it returns T or
// absl::StatusOr<T>.
template <class Fn>
using PostAndWaitResult = typename runner_internal::WaitResult<
    std::remove_cvref_t<std::invoke_result_t<Fn&>>>::type;

// A function Runner::PostAndWait can run: movable, callable with no
// arguments.
template <class Fn>
concept PostAndWaitFn = std::move_constructible<Fn> && std::invocable<Fn&>;

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

  // Starts the runner's thread ("sp-runner"), or puts it on options.pool.
  // kFailedPrecondition if already started or stopped, or the pool is not
  // running; kInvalidArgument naming the field for bad options.
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

  // Runs `fn` on the runner and waits until it returned: how another thread
  // reads or changes runner-only state. Returns fn's result (see
  // PostAndWaitResult), or instead:
  //   kFailedPrecondition: the runner was stopped; fn never runs.
  //   ctx.Err() (kCancelled, kDeadlineExceeded): `ctx` ended, on
  //     ctx.clock(), before fn started. fn never runs and is destroyed
  //     before this returns, so it may capture references to the caller's
  //     locals. Retry with a live context, or give up.
  //   kInternal: fn threw; the message says what. The runner goes on.
  // Once fn has started this waits for it to return, whatever `ctx` does.
  // On the runner's own thread (IsCurrent()) fn runs inline. In manual mode
  // (never started, not stopped) the calling thread, which must be the
  // owner's, runs the queue (RunUntilIdle) until fn ran, so a test needs no
  // second thread. With a SimulatedClock set to auto_advance, a deadline in
  // `ctx` is reached at once unless fn already ran. `origin` names the
  // event in logs and must outlive it (a literal).
  template <PostAndWaitFn Fn>
  PostAndWaitResult<Fn> PostAndWait(const Context& ctx, Fn fn,
                                    const char* origin = "post and wait");

  // Manual mode (no Start()): runs, on the calling thread, queued events and
  // due timers until none is left, including those they post. Returns how
  // many ran. Calling it after Start() returns 0 and runs nothing.
  int64_t RunUntilIdle();

  // When the earliest pending timer is due (a cancelled one may still be
  // counted), or InfiniteFuture. For manual-mode drivers that move a
  // simulated clock to the next moment something can run. Thread-safe.
  absl::Time NextWakeTime() const;

  // True on the runner's thread (or inside RunUntilIdle).
  bool IsCurrent() const;
  // True where runner-only state may be touched: on the runner's thread,
  // inside RunUntilIdle, or while no thread runs the runner's events (before
  // Start, after Stop, between RunUntilIdle calls in manual mode). What
  // SETPOINT_DCHECK_ON_RUNNER asserts. Thread-safe.
  bool OnRunner() const;

  // The clock its timers use (RunnerOptions::clock). Pieces that run on this
  // runner default to it. Thread-safe.
  Clock* clock() const { return clock_; }

  // Any thread.
  RunnerStats stats() const;
  const std::string& name() const { return name_; }
  // How long the started runner has been busy without finishing a batch of
  // events (one event that does not return, or a queue it cannot keep up
  // with); zero while it waits for work, and in manual mode. Resolution: a
  // few milliseconds. For liveness probes. Thread-safe.
  absl::Duration BusyFor() const;

 private:
  friend class RunnerPool;
  struct Tally;  // Counts of one batch, published to the stats at its end.

  // On a pool: runs one turn on the calling pool thread (due timers and
  // events, a bounded number); returns true when the runner has work left
  // (the pool queues it again), false when it went idle or finished its
  // Stop.
  bool RunTurn();
  // On a pool: takes an idle runner (clears its sleeping flag) so the
  // caller queues its turn; false when it is not idle.
  bool ClaimIdle();
  // Stop() on a pool: has the pool run what is left, and waits for it.
  void StopOnPool();

  void Loop();
  // Takes the timers due on the clock and runs them; returns how many ran.
  int64_t RunDueTimers();
  // Runs up to `max` queued events; returns how many ran. With `lag`, stops
  // where the slot `lag` places ahead is not published yet.
  int64_t RunEvents(int64_t max, uint64_t lag);
  // Runs one event, catching what it throws and timing it.
  void RunEvent(Event& event, const char* origin, Tally& tally);
  // RunEvent, timing the event's wait in the queue and its run (metrics).
  void RunSampled(Event& event, const char* origin, Tally& tally, uint64_t pos);
  // Adds a batch's counts to the stats.
  void Publish(const Tally& tally);
  // Loop: waits (spinning first, then sleeping on the clock) until there may
  // be work; sets the `lag` for RunEvents. Returns false once stopped with
  // nothing left to run.
  bool AwaitWork(uint64_t* lag);
  // AwaitWork's spin (pausing for as many rounds as recent spins earned,
  // then yielding): returns true (and sets `lag`) when a published event
  // came up.
  bool SpinForWork(uint64_t* lag);
  // Manual mode Stop: destroys the queued events; returns how many.
  int64_t DropQueuedEvents();

  const std::string name_;
  Clock* const clock_;
  const absl::Duration slow_threshold_;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<TimerHandle::Shared> shared_;
  RunnerPool* const pool_;
  std::jthread thread_;
  // The thread running events (the loop or RunUntilIdle); empty otherwise.
  std::atomic<std::thread::id> current_{};
  // Start() was called: PostAndWait waits instead of running the queue.
  std::atomic<bool> started_{false};
  // options.metrics' cells (null without metrics), and the collector of the
  // counters the runner keeps anyway.
  Histogram* latency_ = nullptr;
  Histogram* duration_ = nullptr;
  MetricsCollectorHandle collector_;
};

// ---------------------------------------------------------------------------

namespace runner_internal {

// Runs `call`; returns kInternal naming the runner, the origin and what it
// threw if it throws, OK otherwise.
absl::Status CallCatching(const std::string& runner, const char* origin,
                          absl::FunctionRef<void()> call);

// Calls fn as PostAndWait does: its result as Out, or kInternal if it threw.
template <class Out, class Fn>
Out CallAs(Fn& fn, const std::string& runner, const char* origin) {
  std::optional<Out> out;
  absl::Status threw = CallCatching(runner, origin, [&] {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn&>>) {
      std::invoke(fn);
      out.emplace(absl::OkStatus());
    } else {
      out.emplace(std::invoke(fn));
    }
  });
  if (!threw.ok()) return threw;
  return *std::move(out);
}

// One PostAndWait call, shared by the caller and the event. `phase` leaves
// kQueued once, and whoever moves it takes fn: the runner (for kRunning)
// to run it, the caller (for kFinished) when its context ended first, or
// the event's destructor (through kRunning) when it was dropped.
template <class Fn, class Out>
struct WaitState {
  enum class Phase { kQueued, kRunning, kFinished };

  explicit WaitState(Fn f) : fn(std::move(f)) {}

  // Leaves kQueued for `to`, moving fn into `into` (lambdas cannot be
  // assigned, so the caller's optional is filled in place).
  void Claim(Phase to, std::optional<Fn>& into)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    into.emplace(std::move(*fn));
    fn.reset();
    phase = to;
  }
  // Finishes with `why` unless fn was claimed already. fn is destroyed
  // (without the lock) before the caller wakes.
  void Abandon(absl::Status why) {
    {
      std::optional<Fn> taken;
      {
        MutexLock l(&mu);
        if (phase != Phase::kQueued) return;
        Claim(Phase::kRunning, taken);
      }
    }
    MutexLock l(&mu);
    result = std::move(why);
    phase = Phase::kFinished;
    cv.SignalAll();
  }

  Mutex mu;
  CondVar cv;
  Phase phase ABSL_GUARDED_BY(mu) = Phase::kQueued;
  std::optional<Fn> fn ABSL_GUARDED_BY(mu);  // Until claimed.
  Out result ABSL_GUARDED_BY(mu);            // Once kFinished.
};

// The event PostAndWait posts. Destroyed without running (the runner was
// stopped in manual mode, or refused the post), it finishes the call with
// kFailedPrecondition.
template <class Fn, class Out>
class WaitEvent {
 public:
  using State = WaitState<Fn, Out>;
  using Phase = typename State::Phase;

  WaitEvent(std::shared_ptr<State> state, Context ctx,
            const std::string* runner, const char* origin)
      : state_(std::move(state)),
        ctx_(std::move(ctx)),
        runner_(runner),
        origin_(origin) {}
  WaitEvent(WaitEvent&&) = default;  // Leaves state_ null.
  WaitEvent& operator=(WaitEvent&&) = delete;
  ~WaitEvent() {
    if (state_ != nullptr) {
      state_->Abandon(absl::FailedPreconditionError(
          absl::StrCat("post and wait on runner ", *runner_,
                       " origin=", origin_, ": runner stopped before it ran")));
    }
  }

  void operator()() && {
    std::shared_ptr<State> state = std::move(state_);
    std::optional<Fn> fn;
    {
      MutexLock l(&state->mu);
      // The caller gave up (its context ended): fn's captures may be gone.
      if (state->phase != Phase::kQueued) return;
      state->Claim(Phase::kRunning, fn);
    }
    absl::Status ended = ctx_.Err();
    Out out = ended.ok() ? CallAs<Out>(*fn, *runner_, origin_) : Out(ended);
    fn.reset();
    MutexLock l(&state->mu);
    state->result = std::move(out);
    state->phase = Phase::kFinished;
    state->cv.SignalAll();
  }

 private:
  std::shared_ptr<State> state_;
  Context ctx_;
  const std::string* runner_;
  const char* origin_;
};

// The caller's side: waits, on ctx's clock, until the runner takes fn or
// ctx ends (then gives up unless the runner took it meanwhile), and then
// until fn returned.
template <class Fn, class Out>
Out AwaitResult(WaitState<Fn, Out>& state, const Context& ctx) {
  using Phase = typename WaitState<Fn, Out>::Phase;
  Clock* const clock = ctx.clock();
  std::optional<Fn> abandoned;  // Destroyed after the lock is released.
  Out out;
  {
    MutexLock l(&state.mu);
    while (state.phase == Phase::kQueued) {
      clock->AwaitWithDeadline(&state.mu, &state.cv, ctx.deadline(),
                               ctx.stop_token(), [&state] {
                                 state.mu.AssertHeld();
                                 return state.phase != Phase::kQueued;
                               });
      if (state.phase != Phase::kQueued) break;
      absl::Status ended = ctx.Err();
      if (!ended.ok()) {
        state.Claim(Phase::kFinished, abandoned);
        state.result = std::move(ended);
      }
    }
    clock->AwaitWithDeadline(&state.mu, &state.cv, absl::InfiniteFuture(), {},
                             [&state] {
                               state.mu.AssertHeld();
                               return state.phase == Phase::kFinished;
                             });
    out = std::move(state.result);
  }
  return out;
}

}  // namespace runner_internal

template <PostAndWaitFn Fn>
PostAndWaitResult<Fn> Runner::PostAndWait(const Context& ctx, Fn fn,
                                          const char* origin) {
  using Out = PostAndWaitResult<Fn>;
  using State = runner_internal::WaitState<Fn, Out>;
  if (origin == nullptr) origin = "post and wait";
  if (absl::Status ended = ctx.Err(); !ended.ok()) return ended;
  if (IsCurrent()) return runner_internal::CallAs<Out>(fn, name_, origin);
  auto state = std::make_shared<State>(std::move(fn));
  absl::Status posted = Post(
      runner_internal::WaitEvent<Fn, Out>(state, ctx, &name_, origin), origin);
  if (!posted.ok()) return posted;  // The event finished the state.
  if (!started_.load(std::memory_order_acquire)) RunUntilIdle();
  return runner_internal::AwaitResult(*state, ctx);
}

}  // namespace setpoint

// Asserts, in builds without NDEBUG, that the caller may touch `runner`'s
// runner-only state (Runner::OnRunner). Every runner-only public method of
// the processor pieces starts with it; a failure logs the runner's name and
// aborts.
#ifdef NDEBUG
#define SETPOINT_DCHECK_ON_RUNNER(runner) \
  do {                                    \
  } while (false)
#else
#define SETPOINT_DCHECK_ON_RUNNER(runner)                                      \
  SETPOINT_CHECK_MSG((runner)->OnRunner(),                                     \
                     "runner-only call off runner {} (post it to the runner)", \
                     (runner)->name())
#endif

#endif  // SETPOINT_PROCESSOR_RUNNER_H_
