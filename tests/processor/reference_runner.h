// ReferenceRunner: a plain runner (one mutex, a deque of events and an
// ordered map of timers) with the Runner's semantics, for differential tests
// of the lock-free Runner (runner_differential_test.cc). Obviously correct
// beats fast: every operation takes the one mutex, and nothing is pooled,
// sampled or spun.
//
//   SimulatedClock clock;
//   ReferenceRunner runner(&clock);
//   (void)runner.Post([] { ... });
//   auto timer = runner.PostAfter(absl::Seconds(1), [] { ... });
//   clock.AdvanceTime(absl::Seconds(1));
//   runner.RunUntilIdle();  // or Start() and Stop()
//
// What it mirrors of the Runner (runner.h), and so what the differential
// test holds the Runner to:
//   - One producer's posts run in posting order; timers by time, ties by
//     posting order (one sequence for all timers).
//   - A round takes up to kTimerBatch timers due at the clock's now and runs
//     them, then runs up to kEventBatch queued events, including those they
//     post. RunUntilIdle repeats rounds until one runs nothing; the started
//     runner repeats them on its thread and sleeps on the clock in between.
//     A timer taken into a round runs even if an earlier one of the round
//     cancels it (Cancel then returns false): taken is as good as fired.
//   - Stop: posts are refused from then on (kFailedPrecondition). Started:
//     queued events and due timers run, timers not yet due are dropped.
//     Manual mode (never started): queued events and every timer are
//     dropped, and nothing runs after it, not even the rest of the queue
//     when an event calls it.
//   - An event that throws is counted and the runner goes on.
//   - Stats: events_run counts events and timers run; timers_fired counts
//     timers taken; closures of cancelled, dropped or refused work are
//     destroyed without the mutex held.
//
// Thread safety: as Runner. Post, PostAfter, PostAt, stats() and
// ReferenceTimerHandle::Cancel are thread-safe; Start, Stop and RunUntilIdle
// belong to one owner thread.
#ifndef SETPOINT_TESTS_PROCESSOR_REFERENCE_RUNNER_H_
#define SETPOINT_TESTS_PROCESSOR_REFERENCE_RUNNER_H_

#include <cstdint>
#include <deque>
#include <exception>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"

namespace setpoint::testing {

// The Runner's batch sizes, which decide how timers and events interleave
// within one RunUntilIdle (src/processor/runner.cc: kTimerBatch, kBatch).
inline constexpr size_t kReferenceTimerBatch = 256;
inline constexpr int64_t kReferenceEventBatch = 1024;

class ReferenceRunner;

// Cancels a timer of a ReferenceRunner; as TimerHandle.
class ReferenceTimerHandle {
 public:
  ReferenceTimerHandle() = default;
  // True if the timer will not run (cancelled now); false if it was taken
  // to run, cancelled before, dropped, or the runner is gone.
  bool Cancel();

 private:
  friend class ReferenceRunner;
  struct State;
  ReferenceTimerHandle(std::weak_ptr<State> state, uint64_t seq)
      : state_(std::move(state)), seq_(seq) {}
  std::weak_ptr<State> state_;
  uint64_t seq_ = 0;
};

class ReferenceRunner {
 public:
  using Event = absl::AnyInvocable<void() &&>;

  explicit ReferenceRunner(Clock* clock)
      : clock_(clock),
        state_(std::make_shared<ReferenceTimerHandle::State>()) {}
  ~ReferenceRunner() { Stop(); }
  ReferenceRunner(const ReferenceRunner&) = delete;
  ReferenceRunner& operator=(const ReferenceRunner&) = delete;

  absl::Status Start();
  void Stop();

  absl::Status Post(Event event);
  absl::StatusOr<ReferenceTimerHandle> PostAfter(absl::Duration delay,
                                                 Event event) {
    return PostAt(clock_->Now() + delay, std::move(event));
  }
  absl::StatusOr<ReferenceTimerHandle> PostAt(absl::Time when, Event event);

  int64_t RunUntilIdle();
  // The earliest pending timer, or InfiniteFuture.
  absl::Time NextWakeTime() const;
  RunnerStats stats() const;

 private:
  using State = ReferenceTimerHandle::State;

  // One round: due timers, then queued events. Returns how many ran.
  int64_t RunRound();
  void RunOne(Event& event);
  void Loop();

  Clock* const clock_;
  std::shared_ptr<State> state_;
  std::jthread thread_;
};

// ---------------------------------------------------------------------------

struct ReferenceTimerHandle::State {
  using Key = std::pair<absl::Time, uint64_t>;  // (when, posting number)

  Mutex mu;
  CondVar cv;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool started ABSL_GUARDED_BY(mu) = false;
  // Bumped by every post: the started loop re-plans its sleep.
  uint64_t posts ABSL_GUARDED_BY(mu) = 0;
  std::deque<ReferenceRunner::Event> queue ABSL_GUARDED_BY(mu);
  std::map<Key, ReferenceRunner::Event> timers ABSL_GUARDED_BY(mu);
  std::map<uint64_t, absl::Time> when_of ABSL_GUARDED_BY(mu);  // Pending.
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  RunnerStats stats ABSL_GUARDED_BY(mu);

  // Moves every pending timer to `out`; returns how many.
  int64_t DropTimers(std::vector<ReferenceRunner::Event>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const auto n = static_cast<int64_t>(timers.size());
    for (auto& [key, event] : timers) out.push_back(std::move(event));
    timers.clear();
    when_of.clear();
    stats.timers_dropped += n;
    return n;
  }
};

inline bool ReferenceTimerHandle::Cancel() {
  std::shared_ptr<State> state = state_.lock();
  if (state == nullptr) return false;
  ReferenceRunner::Event cancelled;
  {
    MutexLock l(&state->mu);
    auto it = state->when_of.find(seq_);
    if (it == state->when_of.end()) return false;
    auto timer = state->timers.find({it->second, seq_});
    cancelled = std::move(timer->second);
    state->timers.erase(timer);
    state->when_of.erase(it);
    ++state->stats.timers_cancelled;
  }
  return true;  // The closure is destroyed here, without the mutex.
}

inline absl::Status ReferenceRunner::Start() {
  MutexLock l(&state_->mu);
  if (state_->stopping) {
    return absl::FailedPreconditionError("start reference: already stopped");
  }
  if (state_->started) {
    return absl::FailedPreconditionError("start reference: already started");
  }
  state_->started = true;
  thread_ = std::jthread([this] { Loop(); });
  return absl::OkStatus();
}

inline void ReferenceRunner::Stop() {
  bool started;
  {
    MutexLock l(&state_->mu);
    state_->stopping = true;
    started = state_->started;
    state_->cv.SignalAll();
  }
  if (started) {
    if (thread_.joinable()) thread_.join();  // The loop drains, then drops.
    return;
  }
  std::deque<Event> events;
  std::vector<Event> timers;
  {
    MutexLock l(&state_->mu);
    events.swap(state_->queue);
    state_->stats.events_dropped += static_cast<int64_t>(events.size());
    state_->DropTimers(timers);
  }
}

inline absl::Status ReferenceRunner::Post(Event event) {
  MutexLock l(&state_->mu);
  if (state_->stopping) {
    return absl::FailedPreconditionError("post to reference: stopped");
  }
  state_->queue.push_back(std::move(event));
  ++state_->posts;
  state_->cv.SignalAll();
  return absl::OkStatus();
}

inline absl::StatusOr<ReferenceTimerHandle> ReferenceRunner::PostAt(
    absl::Time when, Event event) {
  MutexLock l(&state_->mu);
  if (state_->stopping) {
    return absl::FailedPreconditionError("post timer to reference: stopped");
  }
  const uint64_t seq = state_->next_seq++;
  state_->timers.emplace(State::Key{when, seq}, std::move(event));
  state_->when_of.emplace(seq, when);
  ++state_->posts;
  state_->cv.SignalAll();
  return ReferenceTimerHandle(state_, seq);
}

inline void ReferenceRunner::RunOne(Event& event) {
  bool threw = false;
  try {
    std::move(event)();
  } catch (...) {
    threw = true;
  }
  event = nullptr;
  MutexLock l(&state_->mu);
  ++state_->stats.events_run;
  if (threw) ++state_->stats.events_threw;
}

inline int64_t ReferenceRunner::RunRound() {
  std::vector<Event> due;
  {
    MutexLock l(&state_->mu);
    const absl::Time now = clock_->Now();
    while (due.size() < kReferenceTimerBatch && !state_->timers.empty() &&
           state_->timers.begin()->first.first <= now) {
      auto first = state_->timers.begin();
      state_->when_of.erase(first->first.second);
      due.push_back(std::move(first->second));
      state_->timers.erase(first);
      ++state_->stats.timers_fired;
    }
  }
  int64_t ran = 0;
  for (Event& e : due) {
    RunOne(e);
    ++ran;
  }
  for (int64_t n = 0; n < kReferenceEventBatch; ++n) {
    Event event;
    {
      MutexLock l(&state_->mu);
      if (state_->queue.empty()) break;
      event = std::move(state_->queue.front());
      state_->queue.pop_front();
    }
    RunOne(event);
    ++ran;
  }
  return ran;
}

inline int64_t ReferenceRunner::RunUntilIdle() {
  {
    MutexLock l(&state_->mu);
    if (state_->started) return 0;
  }
  int64_t total = 0;
  while (int64_t ran = RunRound()) total += ran;
  return total;
}

inline void ReferenceRunner::Loop() {
  State& s = *state_;
  std::vector<Event> dropped;
  while (true) {
    if (RunRound() > 0) continue;
    MutexLock l(&s.mu);
    const bool due =
        !s.timers.empty() && s.timers.begin()->first.first <= clock_->Now();
    if (!s.queue.empty() || due) continue;
    if (s.stopping) {
      s.DropTimers(dropped);
      break;
    }
    const uint64_t posts = s.posts;
    const absl::Time next = s.timers.empty() ? absl::InfiniteFuture()
                                             : s.timers.begin()->first.first;
    clock_->AwaitWithDeadline(&s.mu, &s.cv, next, {}, [&] {
      s.mu.AssertHeld();
      return s.stopping || s.posts != posts;
    });
  }
  dropped.clear();  // Closures destroyed without the mutex.
}

inline absl::Time ReferenceRunner::NextWakeTime() const {
  MutexLock l(&state_->mu);
  return state_->timers.empty() ? absl::InfiniteFuture()
                                : state_->timers.begin()->first.first;
}

inline RunnerStats ReferenceRunner::stats() const {
  MutexLock l(&state_->mu);
  return state_->stats;
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTS_PROCESSOR_REFERENCE_RUNNER_H_
