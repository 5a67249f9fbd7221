// CallDispatcher: the Syncer's hand-off between its runner and the threads
// that call the client. It knows nothing of keys or values: the Syncer
// hands it DispatchedCalls (its own type derives from it), and it runs them
// on an UpdaterPool's threads (or on the caller's, in manual mode), one
// operation per call or many per batch call, and hands them back.
//
//   CallDispatcher d(&host, {.name = "vms", .max_batch = 0});
//   d.Start(&pool);
//   d.Submit(calls);          // runner: one lock and one wake-up
//   ...                       // pool threads: host.Execute(ctx, {call})
//   d.TakeResults(&done);     // runner, after host.ResultsReady()
//
// What it guarantees, for the Syncer's promises:
// - Calls start in the order handed over; at most `max_batches` batch calls
//   run at once (batch mode); every operation of a batch call runs under
//   the same call values.
// - Fence(filter): from then on no call starts for a key the filter rejects
//   (those queued become not-started results at once); the running calls
//   of such keys have their context cancelled. A batch call cancelled so
//   returns its other operations marked `requeue` when they failed: their
//   failure is not theirs. AwaitNoneOutside(filter) waits until no
//   running call is outside a filter.
// - Stop(): no call starts afterwards; running calls are cancelled and
//   waited for; the ones never started are returned.
//
// Thread safety: Submit, TakeResults and SetValues on the Syncer's runner;
// Start, Stop and RunUntilIdle on the owner thread; Fence, queued() from
// any thread; AwaitNoneOutside from any thread but a serving one. The Host
// is called on serving threads (Execute) and on any thread (ResultsReady).
#ifndef SETPOINT_PROCESSOR_INTERNAL_CALL_DISPATCHER_H_
#define SETPOINT_PROCESSOR_INTERNAL_CALL_DISPATCHER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stop_token>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/internal/sync_rules.h"
#include "setpoint/processor/updater_pool.h"
#include "spdlog/logger.h"

namespace setpoint::internal {

// One operation handed to a CallDispatcher. The Syncer's call type derives
// from it and adds the key, the operation and its values.
struct DispatchedCall {
  uint32_t slot = kNoSlot;  // The Syncer's entry; the dispatcher ignores it.
  // Written by the dispatcher (under its lock, or by the serving thread
  // while the call runs) and read by the runner after TakeResults.
  uint32_t values_version = 0;  // Call values it started under.
  bool started = false;
  bool requeue = false;     // Failed in a batch cancelled for another key.
  bool threw = false;       // Set by the Host.
  bool fenced = false;      // Its key left: cancelled or never started.
  int64_t duration_ns = 0;  // How long its call (or batch call) took.
  absl::Status status;      // Set by the Host; never-started ones get
                            // kCancelled.
};

struct CallDispatcherOptions {
  // Names the syncer in logs and errors.
  std::string name = "syncer";
  // 0: one client call per operation. N >= 1: batch calls of up to N
  // operations (of different keys).
  int max_batch = 0;
  // Batch calls running at once (batch mode).
  int max_batches = 1;
  // Finished calls handed back to the runner at once, at most (per-key
  // mode): small enough that the runner refills the queue while the
  // updater still runs calls, so neither thread waits for the other.
  int hand_back = 16;
  // Each client call's context gets this deadline; zero: none.
  absl::Duration operation_timeout = absl::ZeroDuration();
  Clock* clock = nullptr;  // For the calls' contexts. Required.
  std::shared_ptr<spdlog::logger> logger = nullptr;  // Required.
};

class CallDispatcher final : private UpdaterPool::Queue {
 public:
  // True for a call whose key may be acted on (a fence, an await filter).
  using Filter = std::function<bool(const DispatchedCall&)>;

  class Host {
   public:
    // On a serving thread: runs `calls` (one, or one batch) under `ctx`
    // and sets each call's status (and threw). Must not throw.
    virtual void Execute(const Context& ctx,
                         std::span<DispatchedCall* const> calls) = 0;
    // Any thread: finished calls wait; have the runner call TakeResults.
    // Called again only after TakeResults.
    virtual void ResultsReady() = 0;

   protected:
    ~Host() = default;
  };

  CallDispatcher(Host* host, CallDispatcherOptions options);
  CallDispatcher(const CallDispatcher&) = delete;
  CallDispatcher& operator=(const CallDispatcher&) = delete;
  // Stop() must have been called if Start() was.
  ~CallDispatcher() override;

  // Owner thread: serves calls on `pool`'s threads; with a null pool only
  // RunUntilIdle runs them. kFailedPrecondition when started twice or
  // after Stop().
  absl::Status Start(UpdaterPool* pool);
  // Owner thread: see the file comment. Returns the calls handed over and
  // never started (fenced ones are results already). Idempotent.
  std::vector<DispatchedCall*> Stop();

  // Runner: hands `calls` over in order. False when stopped (nothing is
  // taken; the caller still owns them).
  bool Submit(std::span<DispatchedCall* const> calls);
  // Runner: appends the finished calls to `*out`.
  void TakeResults(std::vector<DispatchedCall*>* out);
  // Runner: calls that start from now on carry the values of `values`.
  void SetValues(const Context& values, uint32_t version);

  // Any thread: see the file comment; a null filter lets every key pass.
  // Returns how many calls it cancelled (running or queued).
  int64_t Fence(Filter filter);
  // Blocks until no running call is rejected by `filter` (null: none is),
  // or `ctx` ends: then kDeadlineExceeded (or kCancelled) naming how many
  // still run.
  absl::Status AwaitNoneOutside(const Filter& filter, const Context& ctx) const;

  // Manual mode: runs every queued call on this thread; returns how many
  // operations ran.
  int RunUntilIdle();
  // Calls handed over, not started: a moment's view.
  int64_t queued() const { return queued_.load(std::memory_order_relaxed); }

 private:
  // A thread serving calls: the calls it runs now and their cancellation.
  struct Seat {
    std::vector<DispatchedCall*> calls;  // Empty: idle.
    std::stop_source stop;   // Reused until a fence or Stop stops it.
    bool cancelled = false;  // stop was requested during this run.
    Context ctx;             // Cached for values_version_ and stop.
    uint32_t ctx_version = 0;
    bool ctx_valid = false;
  };
  // Queued calls, in order: a vector read from `head` (a deque would
  // allocate a block every few calls).
  struct Queue {
    std::vector<DispatchedCall*> items;
    size_t head = 0;
    bool empty() const { return head == items.size(); }
    size_t size() const { return items.size() - head; }
    DispatchedCall* PopFront();
  };

  // UpdaterPool::Queue: one turn on a pool thread.
  bool Serve() override;
  // Runs calls on this thread: at most `max_ops` operations (or about a
  // millisecond with `turn`); sets `*more` when calls are still queued.
  int ServeCalls(int max_ops, bool turn, bool* more);
  // Moves the next call (or batch) onto `seat`; false when nothing may
  // start. Fenced calls met on the way become results.
  bool TakeLocked(Seat* seat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The seat's calls returned: they become results.
  void FinishLocked(Seat* seat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fenced queued call: never starts.
  void RefuseLocked(DispatchedCall* call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // True when a drain should be requested now (and marks it requested).
  bool WantDrainLocked(bool now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Spins up to 50 us for calls to be queued (while `pool` has no other
  // queue with calls); true when some are.
  bool AwaitMoreCalls(const UpdaterPool* pool) const;
  Context SeatContextLocked(Seat* seat) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Allowed(const DispatchedCall& call) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !fence_ || fence_(call);
  }
  Seat* AcquireSeatLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Host* const host_;
  const CallDispatcherOptions options_;
  const bool batch_;

  mutable Mutex mu_;
  Queue queue_ ABSL_GUARDED_BY(mu_);
  std::vector<DispatchedCall*> results_ ABSL_GUARDED_BY(mu_);
  bool drain_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Filter fence_ ABSL_GUARDED_BY(mu_);
  Context values_ ABSL_GUARDED_BY(mu_);
  uint32_t values_version_ ABSL_GUARDED_BY(mu_) = 0;
  // One per thread serving at once; the running calls are on them.
  std::vector<std::unique_ptr<Seat>> seats_ ABSL_GUARDED_BY(mu_);
  std::vector<Seat*> free_seats_ ABSL_GUARDED_BY(mu_);
  int batches_running_ ABSL_GUARDED_BY(mu_) = 0;
  mutable int awaiters_ ABSL_GUARDED_BY(mu_) = 0;
  mutable CondVar call_done_;  // A seat finished, while awaiters_ > 0.
  UpdaterPool* pool_ ABSL_GUARDED_BY(mu_) = nullptr;

  std::atomic<int64_t> queued_{0};
  // Moving average of a call's duration: calls under 20 us are run back to
  // back by one thread; slower ones get a thread each (help is asked for).
  std::atomic<int64_t> average_call_ns_{1'000'000};
};

}  // namespace setpoint::internal

#endif  // SETPOINT_PROCESSOR_INTERNAL_CALL_DISPATCHER_H_
