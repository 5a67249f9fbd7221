// RunnerPool: threads ("sp-runners") that several Runners share, so a pod's
// thread count does not grow with its node count. A runner started on a pool
// (RunnerOptions::pool) has no thread of its own: while it has events or due
// timers a pool thread runs them, a bounded turn at a time (the others' turns
// come in between); while it waits, it holds no thread and the pool wakes it
// when its earliest timer is due. Each runner still runs one event at a time,
// in order, so the logic on it needs no locks, exactly as on a runner's own
// thread.
//
//   RunnerPool pool({.name = "pod-a/runners", .threads = 4});
//   pool.Start();
//   Runner a({.name = "pod-a/vm/0", .pool = &pool});
//   Runner b({.name = "pod-a/vm/1", .pool = &pool});
//   a.Start(); b.Start();
//   ...
//   a.Stop(); b.Stop();  // Each runs what was posted before, as always.
//   pool.Stop();         // After every runner that uses it stopped.
//
// Runner events do no IO, so size the pool for cores, not for waits. An event
// that does not return holds a pool thread: the others share the rest (the
// pod's /healthz names the stuck runner).
//
// Thread safety: Start() and Stop() belong to the owner thread; stats() any
// thread; the rest is called by the runners on the pool. Stop the runners
// that use a pool before the pool; destroy it after them.
#ifndef SETPOINT_PROCESSOR_RUNNER_POOL_H_
#define SETPOINT_PROCESSOR_RUNNER_POOL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/mutex.h"
#include "spdlog/logger.h"

namespace setpoint {

class Runner;

struct RunnerPoolOptions {
  // Names the pool in logs.
  // Default: "runners".
  std::string name = "runners";
  // Threads, fixed for the pool's life (>= 1).
  // Default: 4.
  int threads = 4;
  // The clock the pool waits on for the runners' timers; every runner on
  // the pool must use it (RunnerOptions::clock), or its Start() is refused.
  // Default: Clock::Real().
  Clock* clock = Clock::Real();
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Counters for operators and tests.
struct RunnerPoolStats {
  int threads = 0;
  int64_t turns = 0;        // Turns given to runners.
  int64_t timer_wakes = 0;  // Idle runners woken for a due timer.
  int idle = 0;             // Threads waiting for a turn to run, now.
};

class RunnerPool {
 public:
  explicit RunnerPool(RunnerPoolOptions options = {});
  RunnerPool(const RunnerPool&) = delete;
  RunnerPool& operator=(const RunnerPool&) = delete;
  // Calls Stop().
  ~RunnerPool();

  // Starts the threads. kInvalidArgument naming the field for bad options;
  // kFailedPrecondition if started or stopped before.
  absl::Status Start();
  // Joins the threads once they finished the turns they run. Runners still
  // on the pool are not run any more (stop them first). Idempotent.
  void Stop();

  RunnerPoolStats stats() const;
  Clock* clock() const { return clock_; }
  const std::string& name() const { return options_.name; }
  // True once Start() succeeded and until Stop().
  bool running() const;

 private:
  friend class Runner;
  struct Wake {
    absl::Time when;
    Runner* runner;
  };
  // One pool thread's wait: each waits on its own condition variable, so
  // a runner given a turn wakes exactly one thread, the one that went idle
  // last (its core and caches most likely still hold what the runner's
  // last turn touched).
  struct Worker {
    CondVar cv;
    bool woken = false;  // Guarded by the pool's mu_.
  };

  // `runner` has work and no turn queued or running: queue one.
  void Schedule(Runner* runner);
  // Wake the idle `runner` once the clock reaches `when` (one pending wake
  // per runner: the earliest asked for).
  void WakeAt(Runner* runner, absl::Time when);
  // `runner` stopped: no wake for it remains, none of its turns is queued.
  void Forget(Runner* runner);

  void Work(std::stop_token stop, Worker* self);
  // Wakes the thread that went idle last, if any is idle.
  void WakeOne() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WakeAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RunnerPoolOptions options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;

  mutable Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Idle threads, in the order they went idle (the last one at the back).
  std::vector<Worker*> idle_ ABSL_GUARDED_BY(mu_);
  std::deque<Runner*> ready_ ABSL_GUARDED_BY(mu_);
  // Min-heap by time; an entry counts only while pending_ holds its time.
  std::vector<Wake> wakes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Runner*, absl::Time> pending_ ABSL_GUARDED_BY(mu_);
  RunnerPoolStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Worker>> workers_;  // Made by Start, kept.
  std::vector<std::jthread> threads_;             // Owner thread (Start, Stop).
};

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_RUNNER_POOL_H_
