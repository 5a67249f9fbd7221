// LoopPool: threads ("sp-loop") that several ReconcileLoops share, so a
// pod's thread count does not grow with its node count. A loop started on a
// pool (ReconcileLoopOptions::pool) has no thread of its own: when one of
// its executions is due (its interval passed, a Trigger, a Resume), a pool
// thread runs it; while it waits, it holds no thread.
//
//   LoopPool pool({.name = "pod-a/loops", .max_threads = 16});
//   pool.Start();
//   ReconcileLoop a(plan_a, {.pool = &pool});
//   ReconcileLoop b(plan_b, {.pool = &pool});
//   a.Start(); b.Start();
//   ...
//   a.Stop(); b.Stop();  // Each cancels and waits for its own execution.
//   pool.Stop();         // After every loop that uses it stopped.
//
// Executions do IO and may take long, so the pool grows: one thread waits
// for the next due loop, and whenever a thread takes an execution while no
// other waits, another starts, up to max_threads. A thread that found
// nothing to run for idle_timeout leaves (one always stays). With
// max_threads executions running, a due loop waits for one of them to end:
// size max_threads for the executions a pod should run at once.
//
// Thread safety: Start() and Stop() belong to the owner thread; stats() any
// thread; the rest is called by the loops attached to the pool. Stop the
// loops that use a pool before the pool; destroy it after them.
#ifndef SETPOINT_PLANNER_LOOP_POOL_H_
#define SETPOINT_PLANNER_LOOP_POOL_H_

#include <cstdint>
#include <list>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/mutex.h"
#include "spdlog/logger.h"

namespace setpoint {

class ReconcileLoop;

struct LoopPoolOptions {
  // Names the pool in logs.
  // Default: "loops".
  std::string name = "loops";
  // Executions that may run at once, and so the most threads (>= 1).
  // Default: 16.
  int max_threads = 16;
  // A thread that found nothing to run for this long leaves (> 0).
  // Default: 1 s.
  absl::Duration idle_timeout = absl::Seconds(1);
  // The clock the pool waits on; every loop on the pool must use it
  // (ReconcileLoopOptions::clock), or its Start() is refused.
  // Default: Clock::Real().
  Clock* clock = Clock::Real();
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Counters for operators and tests.
struct LoopPoolStats {
  int threads = 0;   // Threads now.
  int busy = 0;      // Of those, running an execution now.
  int loops = 0;     // Loops attached.
  int64_t runs = 0;  // Times a thread took a due loop.
  int64_t threads_started = 0;
};

class LoopPool {
 public:
  explicit LoopPool(LoopPoolOptions options = {});
  LoopPool(const LoopPool&) = delete;
  LoopPool& operator=(const LoopPool&) = delete;
  // Calls Stop().
  ~LoopPool();

  // Starts the first thread. kInvalidArgument naming the field for bad
  // options; kFailedPrecondition if started or stopped before.
  absl::Status Start();
  // Ends the threads once they return from the executions they run (loops
  // still attached have their executions cancelled first, and run no more).
  // Idempotent.
  void Stop();

  LoopPoolStats stats() const;
  Clock* clock() const { return clock_; }
  const std::string& name() const { return options_.name; }

 private:
  friend class ReconcileLoop;
  struct Entry {
    ReconcileLoop* loop = nullptr;
    std::stop_source stop;  // Cancels the execution a thread runs for it.
    bool busy = false;      // A thread runs it now.
  };

  // For ReconcileLoop::Start: attaches `loop` (its executions run here from
  // now on). kFailedPrecondition when the pool is not running.
  absl::Status Attach(ReconcileLoop* loop);
  // For ReconcileLoop::Stop: cancels the loop's running execution, waits
  // until it returned and detaches the loop.
  void Detach(ReconcileLoop* loop);
  // For the loops: something may be due sooner than the threads wait for
  // (a Trigger, a Resume).
  void Notify();

  void Work(std::stop_token stop);
  // Starts a thread (under mu_); joins those that left.
  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LoopPoolOptions options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;

  mutable Mutex mu_;
  CondVar cv_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set by Notify(), cleared by the thread that looks again.
  bool notified_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Entry> entries_ ABSL_GUARDED_BY(mu_);
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;  // Threads looking for work.
  LoopPoolStats stats_ ABSL_GUARDED_BY(mu_);
  uint64_t next_thread_ ABSL_GUARDED_BY(mu_) = 0;
  std::list<std::pair<uint64_t, std::jthread>> threads_ ABSL_GUARDED_BY(mu_);
  // Threads that left, joined by the next StartThreadLocked or Stop.
  std::vector<std::jthread> retired_ ABSL_GUARDED_BY(mu_);
};

}  // namespace setpoint

#endif  // SETPOINT_PLANNER_LOOP_POOL_H_
