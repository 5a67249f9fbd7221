// UpdaterPool: a fixed set of updater threads ("sp-updater") that several
// Syncers share, so a pod's thread count does not grow with its node count.
// Each syncer keeps its own limit (SyncerOptions::max_in_flight) and its own
// queue of calls; the pool serves the syncers with queued calls in turn
// (round robin, a bounded turn each), so one busy syncer does not starve the
// others.
//
//   UpdaterPool pool({.name = "pod-a", .threads = 8});
//   pool.Start();
//   Syncer<std::string, Spec, Vm> a(&runner_a, &client, {.pool = &pool});
//   Syncer<std::string, Spec, Vm> b(&runner_b, &client, {.pool = &pool});
//   a.Start(); b.Start();
//   ...
//   a.Stop(); b.Stop();  // Each waits for its own calls only.
//   pool.Stop();         // After every syncer that uses it stopped.
//
// A syncer without a pool owns a private one (SyncerOptions::updater_threads
// threads), as before.
//
// Thread safety: Start() and Stop() belong to the owner thread; the rest is
// called by the syncers attached to the pool, from any thread. Stop the
// syncers that use a pool before the pool; destroy it after them.
#ifndef SETPOINT_PROCESSOR_UPDATER_POOL_H_
#define SETPOINT_PROCESSOR_UPDATER_POOL_H_

#include <atomic>
#include <deque>
#include <memory>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "setpoint/base/mutex.h"
#include "spdlog/logger.h"

namespace setpoint {

struct UpdaterPoolOptions {
  // Names the pool in logs.
  // Default: "updaters".
  std::string name = "updaters";
  // Threads, fixed for the pool's life (>= 1). They block in client calls:
  // size the pool for the calls a pod should run at once, not for its cores.
  // Default: 8.
  int threads = 8;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

class UpdaterPool {
 public:
  // A source of calls: one per syncer (the Syncer implements it). The pool
  // calls Serve() on one of its threads when the queue has calls, possibly
  // on several threads at once.
  class Queue {
   public:
    virtual ~Queue() = default;

   protected:
    Queue() = default;
    // Runs queued calls on the calling pool thread for one turn (a bounded
    // number of calls or time); true when calls are still queued, and the
    // pool serves the queue again after the others' turns.
    virtual bool Serve() = 0;

   private:
    friend class UpdaterPool;
    // Guarded by the pool's mutex.
    bool attached_ = false;
    bool in_ring_ = false;
    int serving_ = 0;  // Pool threads inside Serve() now.
  };

  explicit UpdaterPool(UpdaterPoolOptions options = {});
  UpdaterPool(const UpdaterPool&) = delete;
  UpdaterPool& operator=(const UpdaterPool&) = delete;
  // Calls Stop().
  ~UpdaterPool();

  // Starts the threads. kInvalidArgument naming the field for bad options;
  // kFailedPrecondition if started twice or after Stop().
  absl::Status Start();
  // Owner thread: stops and joins the threads once each finished the call
  // it runs; calls still queued do not run (stop the syncers first, which
  // report them as not started). Idempotent.
  void Stop();

  const std::string& name() const { return options_.name; }
  int threads() const { return options_.threads; }

  // For syncers (any thread). Attach before the first Notify; Notify says
  // the queue has calls (it is served soon); Detach returns once no pool
  // thread serves the queue, and it is not served again.
  void Attach(Queue* queue);
  void Notify(Queue* queue);
  void Detach(Queue* queue);
  // Some queue waits for a thread (a moment's view, any thread): a thread
  // that waits for more of its own queue's calls gives way.
  bool has_work() const { return has_work_.load(std::memory_order_acquire); }

 private:
  void Loop(std::stop_token stop);
  // Spins briefly (one thread at a time) waiting for a queue with calls;
  // true when one appeared.
  bool SpinForWork();

  const UpdaterPoolOptions options_;
  std::shared_ptr<spdlog::logger> logger_;

  Mutex mu_;
  CondVar cv_;        // A queue has calls, or stopping.
  CondVar detached_;  // A queue's serving_ reached 0.
  std::deque<Queue*> ring_ ABSL_GUARDED_BY(mu_);
  int sleeping_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Mirrors !ring_.empty() for the spinning thread, which reads it without
  // the mutex.
  std::atomic<bool> has_work_{false};
  // A thread is spinning (at most one): Notify need not wake a sleeper.
  std::atomic<bool> spinning_{false};
  std::vector<std::jthread> threads_;
};

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_UPDATER_POOL_H_
