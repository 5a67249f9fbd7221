// SourceExecutor: the threads that run sources' lists and watch streams, so
// a pod's thread count follows the IO in progress, not its number of
// sources. A source is a Task: the executor runs it when it is due, on one
// of its threads, and the task says when it is due next.
//
//   SourceExecutor executor({.name = "pod-a"});
//   SETPOINT_RETURN_IF_ERROR(executor.Start());
//   PollingSource<std::string, Vm> a(&runner_a, &vms_a, list,
//                                    {.executor = &executor});
//   PollingSource<std::string, Vm> b(&runner_b, &vms_b, list,
//                                    {.executor = &executor});
//   a.Start(); b.Start();  // Two sources, one thread while neither lists.
//   ...
//   a.Stop(); b.Stop();    // Each cancels and waits for its own call.
//   executor.Stop();       // After every task detached.
//
// Threads ("sp-source") start on demand: one waits on the clock for the
// next task due; when it takes a task, another waiting thread takes its
// place, or a new one starts if none waits. A task that runs (a list in
// progress, a watch stream blocked on its next event) holds its thread; a
// thread that found nothing to do for `idle_exit` leaves (but the last).
// So an idle executor has one thread, and one more per call in progress.
//
// Thread safety: Start() and Stop() belong to the owner thread; Attach,
// Wake and Detach are for tasks, from any thread. Detach every task before
// Stop(); destroy the executor after them.
#ifndef SETPOINT_PROCESSOR_SOURCE_EXECUTOR_H_
#define SETPOINT_PROCESSOR_SOURCE_EXECUTOR_H_

#include <cstdint>
#include <map>
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

struct SourceExecutorOptions {
  // Names the executor in logs.
  // Default: "sources".
  std::string name = "sources";
  // Threads at most (>= 1). Each list in progress and each open watch
  // stream holds one while it runs; a task due while every thread is busy
  // and the limit is reached waits for one.
  // Default: 256.
  int max_threads = 256;
  // A thread (but the last) that found no task for this long leaves.
  // Real time, not the clock's. > 0.
  // Default: 1 s.
  absl::Duration idle_exit = absl::Seconds(1);
  // Tasks' due times are on this clock.
  // Default: Clock::Real().
  Clock* clock = nullptr;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Counters for operators and tests.
struct SourceExecutorStats {
  int64_t runs = 0;             // Task runs that returned.
  int64_t threads_started = 0;  // Over the executor's life.
  int64_t threads_exited = 0;   // Left after idling.
  int64_t threads = 0;          // Now.
  int64_t threw = 0;            // Task runs that threw (a bug; logged).
};

class SourceExecutor {
 public:
  // Something the executor runs: a source's list or watch loop.
  class Task {
   public:
    virtual ~Task() = default;

   protected:
    Task() = default;
    // Runs on an executor thread, never twice at once. `stop` is requested
    // when the task is detached or the executor stops: return soon then.
    // Returns when the task is due next (absl::InfiniteFuture(): only when
    // woken; a time not after now: at once).
    virtual absl::Time Run(std::stop_token stop) = 0;

   private:
    friend class SourceExecutor;
    // Guarded by the executor's mutex.
    bool attached_ = false;
    bool running_ = false;
    bool detaching_ = false;
    absl::Time due_ = absl::InfiniteFuture();
    // Woken while running: due no later than this after the run.
    absl::Time wake_due_ = absl::InfiniteFuture();
    std::stop_source stop_;
  };

  explicit SourceExecutor(SourceExecutorOptions options = {});
  SourceExecutor(const SourceExecutor&) = delete;
  SourceExecutor& operator=(const SourceExecutor&) = delete;
  // Calls Stop().
  ~SourceExecutor();

  // Starts the first thread. kInvalidArgument naming the field for bad
  // options; kFailedPrecondition if started twice or after Stop().
  absl::Status Start();
  // Owner thread: asks every running task to stop, then joins the threads.
  // Tasks still attached never run again. Idempotent.
  void Stop();

  // Any thread. Attach makes `task` due at `due`: kFailedPrecondition
  // when the executor is not running (not started, or stopped), and then
  // the task never runs. Wake makes an attached task due at `due` if that
  // is earlier than planned (after the run in progress, if it runs).
  // Detach asks a run in progress to stop, returns once it has returned,
  // and the task never runs again; not from inside the task's own Run.
  absl::Status Attach(Task* task, absl::Time due = absl::InfinitePast());
  void Wake(Task* task, absl::Time due = absl::InfinitePast());
  void Detach(Task* task);

  const std::string& name() const { return options_.name; }
  Clock* clock() const { return clock_; }
  // Any thread.
  SourceExecutorStats stats() const;

 private:
  void Loop(int64_t id, std::stop_token stop);
  // The attached, idle task due first, and when (InfiniteFuture: none).
  Task* Earliest(absl::Time* due) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `task` (taken: running) without the lock, then makes it due
  // again as it asks, or wakes its detacher.
  void RunTask(Task* task) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a task other than `except` is attached and idle.
  bool OthersWaiting(const Task* except) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes sure a thread waits for the next due task: wakes the leader or
  // a follower, or starts a thread (within max_threads).
  void EnsureWaiter() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartThread() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Threads that left, taken out for joining without the lock.
  std::vector<std::jthread> TakeRetired() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SourceExecutorOptions options_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;

  // An idle thread waiting (real time) to become the leader.
  struct Follower {
    CondVar cv;
    bool woken = false;  // Guarded by mu_.
  };

  mutable Mutex mu_;
  // The leader waits on it, on the clock, for the next due task; every
  // change of a due time signals it.
  CondVar changed_;
  // A running task of a detaching caller returned.
  CondVar returned_;
  // Idle followers, the most recently idle last: the last is woken first,
  // so the others stay idle and leave.
  std::vector<Follower*> followers_ ABSL_GUARDED_BY(mu_);
  std::vector<Task*> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;  // Bumped on every change.
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool leader_ ABSL_GUARDED_BY(mu_) = false;  // A thread waits on the clock.
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int live_ ABSL_GUARDED_BY(mu_) = 0;  // Threads not retired.
  // Threads on their way to look for due tasks (started and not in their
  // loop yet, or followers woken and not awake yet): no other is needed.
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::jthread> threads_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> retired_ ABSL_GUARDED_BY(mu_);
  SourceExecutorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SOURCE_EXECUTOR_H_
