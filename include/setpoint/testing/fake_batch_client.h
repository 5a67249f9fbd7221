// FakeBatchClient: a FakeClient's world behind the BatchSyncerClient
// interface, for testing syncers whose client takes batches (setpoint's own
// and users'). Each operation of a batch call goes to the FakeClient as one
// call, so its world, observations, per-key faults and per-key accounting
// all apply; on top, the batch fake records every batch call and injects
// faults of whole calls.
//
//   FakeClient<std::string, int> world({.watcher = ...});
//   FakeBatchClient<std::string, int> fake(&world);
//   Syncer<std::string, int, int> syncer(&runner, &fake, {.max_batch = 50});
//   fake.FailNextBatches(1, absl::InternalError("500"));  // the whole call
//   world.FailNextFor("web-1", 1, absl::InvalidArgumentError("bad"));
//   fake.HoldBatches();                  // batch calls wait at the gate...
//   fake.AwaitHeldBatches(1);            // ...until one is there
//   fake.ReleaseBatches();
//   EXPECT_EQ(fake.stats().max_concurrent, 1);
//
// A batch call goes through, in order: the gate (HoldBatches), the latency
// (SetLatency: per call, plus per operation), an injected throw, an
// injected failure of the whole call (FailNextBatches), the single-writer
// check (a call that starts while another runs fails whole with kInternal
// "busy"), then each operation in order through the FakeClient. A call
// whose context ends while it waits returns ctx.Err() for the whole call
// and changes nothing.
//
// Thread safety: thread-safe, like FakeClient.
#ifndef SETPOINT_TESTING_FAKE_BATCH_CLIENT_H_
#define SETPOINT_TESTING_FAKE_BATCH_CLIENT_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/testing/fake_client.h"

namespace setpoint::testing {

// One batch call, as recorded by the fake.
template <class K>
struct FakeBatch {
  std::vector<K> keys;               // In the order given.
  absl::Status result;               // What the whole call returned.
  const Context* context = nullptr;  // Null once the call returned.
};

struct FakeBatchStats {
  int64_t batches = 0;     // Batch calls, whatever they returned.
  int64_t operations = 0;  // Operations in them.
  int64_t failed = 0;      // Calls that failed whole.
  int max_concurrent = 0;  // Batch calls running at once, at most.
  int max_size = 0;        // Operations in one call, at most.
};

template <class K, class D, class O = D>
class FakeBatchClient final : public BatchSyncerClient<K, D, O> {
 public:
  struct Options {
    // A call that starts while another runs fails whole with kInternal:
    // an API that allows one writer at a time.
    // Default: false.
    bool single_writer = false;
    // Waits use this clock.
    // Default: Clock::Real().
    Clock* clock = nullptr;
  };

  explicit FakeBatchClient(FakeClient<K, D, O>* world, Options options = {})
      : world_(world),
        single_writer_(options.single_writer),
        clock_(options.clock != nullptr ? options.clock : Clock::Real()) {}

  absl::Status Apply(const Context& ctx,
                     std::span<SyncOperation<K, D, O>> ops) override;

  // --- Fault injection ------------------------------------------------------
  // The next `n` batch calls fail whole with `status`, changing nothing.
  void FailNextBatches(int n, absl::Status status = absl::UnavailableError(
                                  "fake batch client: injected failure"));
  // The next `n` batch calls throw std::runtime_error.
  void ThrowNextBatches(int n);
  // Every call waits `per_call` plus `per_operation` for each of its
  // operations, on the clock (cancellable by its context).
  void SetLatency(absl::Duration per_call,
                  absl::Duration per_operation = absl::ZeroDuration());
  // Calls from now on wait in the gate until ReleaseBatches() or until
  // their context ends (they then fail whole with ctx.Err()).
  void HoldBatches();
  void ReleaseBatches();
  // Blocks (real time, up to `timeout`) until `n` calls wait in the gate.
  bool AwaitHeldBatches(int n, absl::Duration timeout = absl::Seconds(10));

  // --- Accounting -----------------------------------------------------------
  FakeBatchStats stats() const;
  // Every batch call so far (contexts of finished ones are null).
  std::vector<FakeBatch<K>> batches() const;
  // Runs `fn(ctx)` with the context of every batch call running now (for
  // assertions on their cancellation or values).
  template <class Fn>
  void ForEachHeld(Fn fn) const;

 private:
  // Each operation through the world, in order.
  absl::Status Run(const Context& ctx, std::span<SyncOperation<K, D, O>> ops);

  FakeClient<K, D, O>* const world_;
  const bool single_writer_;
  Clock* const clock_;

  mutable Mutex mu_;
  CondVar cv_;
  bool gate_closed_ ABSL_GUARDED_BY(mu_) = false;
  int in_gate_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status fail_status_ ABSL_GUARDED_BY(mu_);
  int throw_next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration per_call_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  absl::Duration per_op_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::vector<FakeBatch<K>> log_ ABSL_GUARDED_BY(mu_);
  FakeBatchStats stats_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------

template <class K, class D, class O>
absl::Status FakeBatchClient<K, D, O>::Apply(
    const Context& ctx, std::span<SyncOperation<K, D, O>> ops) {
  size_t index;
  absl::Duration latency;
  bool do_throw = false;
  absl::Status injected;
  bool busy = false;
  {
    MutexLock l(&mu_);
    index = log_.size();
    FakeBatch<K> batch;
    for (const auto& op : ops) batch.keys.push_back(*op.key);
    batch.context = &ctx;
    log_.push_back(std::move(batch));
    ++stats_.batches;
    stats_.operations += static_cast<int64_t>(ops.size());
    stats_.max_size = std::max(stats_.max_size, static_cast<int>(ops.size()));
    busy = single_writer_ && running_ > 0;
    ++running_;
    stats_.max_concurrent = std::max(stats_.max_concurrent, running_);
    if (gate_closed_) {
      ++in_gate_;
      cv_.SignalAll();
      auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !gate_closed_;
      };
      if (ctx.deadline() == absl::InfiniteFuture()) {
        cv_.Wait(&mu_, ctx.stop_token(), open);
      } else {
        ctx.clock()->AwaitWithDeadline(&mu_, &cv_, ctx.deadline(),
                                       ctx.stop_token(), open);
      }
      --in_gate_;
    }
    latency = per_call_ + per_op_ * static_cast<int64_t>(ops.size());
    if (throw_next_ > 0) {
      --throw_next_;
      do_throw = true;
    } else if (fail_next_ > 0) {
      --fail_next_;
      injected = absl::Status(fail_status_.code(), fail_status_.message());
    }
  }
  absl::Status result = ctx.Err();
  if (result.ok() && latency > absl::ZeroDuration()) {
    absl::Time until = clock_->Now() + latency;
    if (ctx.clock() == clock_) until = std::min(until, ctx.deadline());
    clock_->SleepUntil(until, ctx.stop_token());
    result = ctx.Err();
  }
  if (result.ok() && do_throw) {
    MutexLock l(&mu_);
    --running_;
    log_[index].result = absl::InternalError("threw");
    log_[index].context = nullptr;
    throw std::runtime_error("fake batch client: injected throw");
  }
  if (result.ok() && !injected.ok()) result = injected;
  if (result.ok() && busy) {
    result = absl::InternalError("fake batch client: busy, another writer");
  }
  if (result.ok()) result = Run(ctx, ops);
  MutexLock l(&mu_);
  --running_;
  if (!result.ok()) ++stats_.failed;
  log_[index].result = result;
  log_[index].context = nullptr;
  return result;
}

template <class K, class D, class O>
absl::Status FakeBatchClient<K, D, O>::Run(
    const Context& ctx, std::span<SyncOperation<K, D, O>> ops) {
  for (SyncOperation<K, D, O>& op : ops) {
    switch (op.op) {
      case SyncOp::kCreate:
        op.status = world_->Create(ctx, *op.key, *op.desired);
        break;
      case SyncOp::kUpdate:
        op.status = world_->Update(ctx, *op.key, *op.desired, *op.observed);
        break;
      case SyncOp::kDelete:
        op.status = world_->Delete(ctx, *op.key, *op.observed);
        break;
      case SyncOp::kNone:
        break;
    }
  }
  return absl::OkStatus();
}

template <class K, class D, class O>
void FakeBatchClient<K, D, O>::FailNextBatches(int n, absl::Status status) {
  MutexLock l(&mu_);
  fail_next_ = n;
  fail_status_ = std::move(status);
}

template <class K, class D, class O>
void FakeBatchClient<K, D, O>::ThrowNextBatches(int n) {
  MutexLock l(&mu_);
  throw_next_ = n;
}

template <class K, class D, class O>
void FakeBatchClient<K, D, O>::SetLatency(absl::Duration per_call,
                                          absl::Duration per_operation) {
  MutexLock l(&mu_);
  per_call_ = per_call;
  per_op_ = per_operation;
}

template <class K, class D, class O>
void FakeBatchClient<K, D, O>::HoldBatches() {
  MutexLock l(&mu_);
  gate_closed_ = true;
}

template <class K, class D, class O>
void FakeBatchClient<K, D, O>::ReleaseBatches() {
  MutexLock l(&mu_);
  gate_closed_ = false;
  cv_.SignalAll();
}

template <class K, class D, class O>
bool FakeBatchClient<K, D, O>::AwaitHeldBatches(int n, absl::Duration timeout) {
  MutexLock l(&mu_);
  auto until =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  return cv_.WaitUntil(
      &mu_, {}, until,
      [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_gate_ >= n; });
}

template <class K, class D, class O>
FakeBatchStats FakeBatchClient<K, D, O>::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

template <class K, class D, class O>
std::vector<FakeBatch<K>> FakeBatchClient<K, D, O>::batches() const {
  MutexLock l(&mu_);
  return log_;
}

template <class K, class D, class O>
template <class Fn>
void FakeBatchClient<K, D, O>::ForEachHeld(Fn fn) const {
  MutexLock l(&mu_);
  for (const FakeBatch<K>& b : log_) {
    if (b.context != nullptr) fn(*b.context);
  }
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_FAKE_BATCH_CLIENT_H_
