// FakeClient: an in-memory world behind the SyncerClient interface, with
// fault injection and call accounting, for testing syncers (setpoint's own
// and users') without a real backend.
//
//   PushSource<std::string, int> source(&runner, &store);
//   FakeClient<std::string, int> fake({
//       .watcher = [&](const std::string& key, const std::optional<int>& v) {
//         v.has_value() ? source.Set(key, *v) : source.Delete(key);
//       },
//   });
//   Syncer<std::string, int, int> syncer(&runner, &fake, {...});
//   fake.SetFailureRate(0.3);               // 30% of calls fail, retried
//   fake.FailNext(1, absl::InvalidArgumentError("bad spec"));
//   fake.HoldCalls();                       // calls block at the gate...
//   fake.AwaitHeldCalls(1);                 // ...until one is there
//   fake.ReleaseCalls();
//   EXPECT_EQ(fake.stats().max_concurrent_per_key, 1);
//
// The world is a map K -> O. Create of an existing key returns
// kAlreadyExists; Update and Delete of a missing key return kNotFound. A
// call goes through, in order: the gate (HoldCalls), the latency, an
// injected throw, injected failures (FailNextFor, FailNext,
// FailNextAfterApplying, then the failure rate), the world change, and the
// change's report to the watcher. A call whose context is cancelled (or past
// its deadline) while it waits returns ctx.Err() and changes nothing. Every
// call is counted, whatever it returns.
//
// Observations: with FakeObservation::kImmediate (the default) the watcher
// hears of each change before the call that made it returns, as a watch
// usually does; wire it to a PushSource (or post to a Store on the runner).
// kHeld keeps changes until DeliverHeld(), to test read-your-own-writes;
// kDropped never reports them. The watcher is called in the order the world
// changed, one call at a time, and must not call back into the fake.
//
// Thread safety: thread-safe; the SyncerClient methods are called
// concurrently by updater threads and every other method may be called from
// any thread while they run.
#ifndef SETPOINT_TESTING_FAKE_CLIENT_H_
#define SETPOINT_TESTING_FAKE_CLIENT_H_

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "setpoint/base/check.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/syncer.h"

namespace setpoint::testing {

// When the watcher hears of a change of the world.
enum class FakeObservation {
  kImmediate,  // Before the call that made the change returns.
  kHeld,       // When DeliverHeld() is called.
  kDropped,    // Never.
};

template <class K, class D, class O>
struct FakeClientOptions {
  // Turns a desired value into the value it produces in the world.
  // Default: O(desired); required when D does not convert to O.
  std::function<O(const K& key, const D& desired)> to_observed = nullptr;
  // Hears every change of the world: the new value, or nullopt when the key
  // was deleted. See the file comment for when and how it is called.
  // Default: none.
  std::function<void(const K& key, const std::optional<O>& value)> watcher =
      nullptr;
  // Default: kImmediate.
  FakeObservation observation = FakeObservation::kImmediate;
  // Latency waits use this clock (a SimulatedClock lets a test control
  // them).
  // Default: Clock::Real().
  Clock* clock = nullptr;
  // Seeds the random failures of SetFailureRate.
  // Default: 1.
  uint64_t seed = 1;
};

// One call, as recorded by the fake.
template <class K>
struct FakeCall {
  SyncOp op = SyncOp::kNone;
  K key;
  // What the call returned; kInternal for a call that threw.
  absl::Status result = absl::OkStatus();
  bool threw = false;
};

// Call accounting, for assertions.
struct FakeClientStats {
  int64_t calls = 0;  // Every call, by kind below.
  int64_t creates = 0;
  int64_t updates = 0;
  int64_t deletes = 0;
  int64_t failed = 0;  // Returned an error (injected or not; not throws).
  int64_t threw = 0;
  int max_concurrent = 0;          // Calls running at once, at most.
  int max_concurrent_per_key = 0;  // Calls for one key at once, at most.
};

template <class K, class D, class O = D>
class FakeClient final : public SyncerClient<K, D, O> {
 public:
  using Options = FakeClientOptions<K, D, O>;
  using World = absl::flat_hash_map<K, O>;

  explicit FakeClient(Options options = {});

  // SyncerClient.
  absl::Status Create(const Context& ctx, const K& key,
                      const D& desired) override;
  absl::Status Update(const Context& ctx, const K& key, const D& desired,
                      const O& observed) override;
  absl::Status Delete(const Context& ctx, const K& key,
                      const O& observed) override;

  // The world. Set and Erase change it from outside the syncer (another
  // actor); the watcher hears of it as of any change.
  World world() const;
  std::optional<O> Get(const K& key) const;
  void Set(K key, O value);
  void Erase(const K& key);

  // --- Fault injection ------------------------------------------------------
  // The next `n` calls fail with `status` and change nothing. Replaces an
  // earlier FailNext. Use WithRetryAfter(status, d) for a retry-after hint.
  void FailNext(int n, absl::Status status = absl::UnavailableError(
                           "fake client: injected failure"));
  // Same, but the calls change the world first (and report the change), then
  // return `status`: a request that timed out after the backend did it.
  void FailNextAfterApplying(int n,
                             absl::Status status = absl::UnavailableError(
                                 "fake client: injected failure"));
  // The next `n` calls for `key` fail with `status`; checked before
  // FailNext. Replaces an earlier FailNextFor of the same key.
  void FailNextFor(const K& key, int n,
                   absl::Status status =
                       absl::UnavailableError("fake client: injected failure"));
  // Shorthand for FailNext(n, WithRetryAfter(kUnavailable, delay)).
  void RetryAfterNext(int n, absl::Duration delay);
  // Each call fails with probability `fraction` (seeded; see options).
  // 0 turns it off.
  void SetFailureRate(double fraction,
                      absl::Status status = absl::UnavailableError(
                          "fake client: injected random failure"));
  // The next `n` calls throw std::runtime_error and change nothing.
  void ThrowNext(int n);
  // Every call waits `latency` on the clock (cancellable by its context)
  // before it does anything else. Zero turns it off.
  void SetLatency(absl::Duration latency);
  // Closes the gate: calls from now on wait in it until ReleaseCalls() or
  // until their context ends (they then return ctx.Err()).
  void HoldCalls();
  // Opens the gate: waiting calls go on.
  void ReleaseCalls();
  // Blocks (real time, up to `timeout`) until at least `n` calls wait in the
  // gate. Returns false on timeout.
  bool AwaitHeldCalls(int n, absl::Duration timeout = absl::Seconds(10));
  // Calls waiting in the gate now.
  int held_calls() const;

  // --- Observation ----------------------------------------------------------
  void SetObservation(FakeObservation mode);
  // Reports the changes kept under kHeld to the watcher, in order; returns
  // how many.
  int DeliverHeld();
  int held_observations() const;

  // --- Accounting -----------------------------------------------------------
  FakeClientStats stats() const;
  // Calls for `key`, of kind `op` (kNone: of any kind).
  int64_t CallsFor(const K& key, SyncOp op = SyncOp::kNone) const;
  // Calls running now.
  int in_flight() const;
  // Every call so far, in the order they returned.
  std::vector<FakeCall<K>> calls() const;

 private:
  struct Failure {
    int remaining = 0;
    absl::Status status;
  };
  struct WorldChange {
    K key;
    std::optional<O> value;
  };
  // Counts a call as running from construction to destruction (throws
  // included).
  class Running {
   public:
    Running(FakeClient* fake, SyncOp op, const K& key);
    ~Running();
    Running(const Running&) = delete;
    Running& operator=(const Running&) = delete;

   private:
    FakeClient* const fake_;
    const K& key_;
  };

  absl::Status Call(const Context& ctx, SyncOp op, const K& key,
                    std::optional<O> value);
  // Waits in the gate while it is closed. Returns ctx.Err() if the context
  // ended first.
  absl::Status PassGate(const Context& ctx);
  absl::Status Wait(const Context& ctx, absl::Duration latency);
  // Applies one change to the world; returns the status the backend would.
  absl::Status Apply(SyncOp op, const K& key, std::optional<O> value)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Report(WorldChange change) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the watcher with every queued change, in order.
  void Notify() ABSL_LOCKS_EXCLUDED(mu_, notify_mu_);
  absl::Status Record(SyncOp op, const K& key, absl::Status result,
                      bool threw = false) ABSL_LOCKS_EXCLUDED(mu_);
  O ToObserved(const K& key, const D& desired) const {
    if constexpr (std::is_convertible_v<const D&, O>) {
      if (to_observed_ == nullptr) return O(desired);
    }
    return to_observed_(key, desired);
  }
  // A copy of `s` that shares nothing with it. Copies of one absl::Status
  // share a reference-counted body whose release happens inside the
  // (uninstrumented) abseil library, so ThreadSanitizer would see bodies
  // shared across threads freed without synchronization; a clone per call
  // keeps every returned status owned by one call.
  static absl::Status Clone(const absl::Status& s) {
    if (s.ok()) return s;
    absl::Status copy(s.code(), s.message());
    s.ForEachPayload([&copy](absl::string_view url, const absl::Cord& value) {
      copy.SetPayload(url, value);
    });
    return copy;
  }
  static bool Take(Failure& f, absl::Status* status) {
    if (f.remaining <= 0) return false;
    --f.remaining;
    *status = Clone(f.status);
    return true;
  }

  const std::function<O(const K&, const D&)> to_observed_;
  const std::function<void(const K&, const std::optional<O>&)> watcher_;
  Clock* const clock_;

  mutable Mutex mu_;
  CondVar cv_;  // Signalled when the gate opens or a call enters it.
  World world_ ABSL_GUARDED_BY(mu_);
  FakeObservation observation_ ABSL_GUARDED_BY(mu_);
  // Changes to report, in world order; Notify() drains it.
  std::deque<WorldChange> to_notify_ ABSL_GUARDED_BY(mu_);
  std::deque<WorldChange> held_ ABSL_GUARDED_BY(mu_);
  Failure fail_next_ ABSL_GUARDED_BY(mu_);
  Failure fail_after_apply_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<K, Failure> fail_for_ ABSL_GUARDED_BY(mu_);
  double failure_rate_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status random_failure_ ABSL_GUARDED_BY(mu_);
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  int throw_next_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Duration latency_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  bool gate_closed_ ABSL_GUARDED_BY(mu_) = false;
  int in_gate_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<K, int> running_per_key_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<K, std::array<int64_t, 4>> calls_per_key_
      ABSL_GUARDED_BY(mu_);
  FakeClientStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<FakeCall<K>> log_ ABSL_GUARDED_BY(mu_);
  // Serializes watcher calls so they keep the world's order. Taken before
  // mu_, never while holding it.
  Mutex notify_mu_ ABSL_ACQUIRED_BEFORE(mu_);
};

// ---------------------------------------------------------------------------

template <class K, class D, class O>
FakeClient<K, D, O>::FakeClient(Options options)
    : to_observed_(std::move(options.to_observed)),
      watcher_(std::move(options.watcher)),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      observation_(options.observation),
      rng_(options.seed) {
  if constexpr (!std::is_convertible_v<const D&, O>) {
    SETPOINT_CHECK_MSG(to_observed_ != nullptr,
                       "fake client: to_observed is required when the "
                       "desired type does not convert to the observed type");
  }
}

template <class K, class D, class O>
FakeClient<K, D, O>::Running::Running(FakeClient* fake, SyncOp op, const K& key)
    : fake_(fake), key_(key) {
  MutexLock l(&fake_->mu_);
  FakeClientStats& s = fake_->stats_;
  ++s.calls;
  if (op == SyncOp::kCreate) ++s.creates;
  if (op == SyncOp::kUpdate) ++s.updates;
  if (op == SyncOp::kDelete) ++s.deletes;
  auto& per_key = fake_->calls_per_key_[key];
  ++per_key[0];
  ++per_key[static_cast<size_t>(op)];
  s.max_concurrent = std::max(s.max_concurrent, ++fake_->running_);
  s.max_concurrent_per_key =
      std::max(s.max_concurrent_per_key, ++fake_->running_per_key_[key]);
}

template <class K, class D, class O>
FakeClient<K, D, O>::Running::~Running() {
  MutexLock l(&fake_->mu_);
  --fake_->running_;
  auto it = fake_->running_per_key_.find(key_);
  if (--it->second == 0) fake_->running_per_key_.erase(it);
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::Create(const Context& ctx, const K& key,
                                         const D& desired) {
  Running running(this, SyncOp::kCreate, key);
  std::optional<O> value = ToObserved(key, desired);
  return Call(ctx, SyncOp::kCreate, key, std::move(value));
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::Update(const Context& ctx, const K& key,
                                         const D& desired, const O&) {
  Running running(this, SyncOp::kUpdate, key);
  std::optional<O> value = ToObserved(key, desired);
  return Call(ctx, SyncOp::kUpdate, key, std::move(value));
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::Delete(const Context& ctx, const K& key,
                                         const O&) {
  Running running(this, SyncOp::kDelete, key);
  return Call(ctx, SyncOp::kDelete, key, std::nullopt);
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::Call(const Context& ctx, SyncOp op,
                                       const K& key, std::optional<O> value) {
  if (absl::Status s = PassGate(ctx); !s.ok()) return Record(op, key, s);
  absl::Duration latency;
  {
    MutexLock l(&mu_);
    latency = latency_;
  }
  if (absl::Status s = Wait(ctx, latency); !s.ok()) return Record(op, key, s);
  absl::Status injected;
  bool fail = false, after_apply = false, throws = false;
  absl::Status result;
  {
    MutexLock l(&mu_);
    if (throw_next_ > 0) {
      --throw_next_;
      throws = true;
    } else if (auto it = fail_for_.find(key);
               it != fail_for_.end() && Take(it->second, &injected)) {
      fail = true;
    } else if (Take(fail_next_, &injected)) {
      fail = true;
    } else if (Take(fail_after_apply_, &injected)) {
      fail = after_apply = true;
    } else if (failure_rate_ > 0 && std::uniform_real_distribution<double>(
                                        0, 1)(rng_) < failure_rate_) {
      fail = true;
      injected = Clone(random_failure_);
    }
    if (!throws && (!fail || after_apply)) {
      result = Apply(op, key, std::move(value));
    }
  }
  if (throws) {
    (void)Record(op, key, absl::InternalError("fake client: injected throw"),
                 true);
    throw std::runtime_error("fake client: injected throw");
  }
  Notify();
  if (fail) return Record(op, key, injected);
  return Record(op, key, result);
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::PassGate(const Context& ctx) {
  MutexLock l(&mu_);
  if (!gate_closed_) return ctx.Err();
  ++in_gate_;
  cv_.SignalAll();
  auto open = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !gate_closed_; };
  if (ctx.deadline() == absl::InfiniteFuture()) {
    cv_.Wait(&mu_, ctx.stop_token(), open);
  } else {
    ctx.clock()->AwaitWithDeadline(&mu_, &cv_, ctx.deadline(), ctx.stop_token(),
                                   open);
  }
  --in_gate_;
  return ctx.Err();
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::Wait(const Context& ctx,
                                       absl::Duration latency) {
  if (latency <= absl::ZeroDuration()) return ctx.Err();
  absl::Time until = clock_->Now() + latency;
  // The context's deadline is on its own clock; it can cut the wait short
  // only when that is the fake's clock.
  if (ctx.clock() == clock_) until = std::min(until, ctx.deadline());
  clock_->SleepUntil(until, ctx.stop_token());
  return ctx.Err();
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::Apply(SyncOp op, const K& key,
                                        std::optional<O> value) {
  switch (op) {
    case SyncOp::kCreate: {
      auto [it, inserted] = world_.try_emplace(key, *value);
      if (!inserted) {
        return absl::AlreadyExistsError("fake client: create: key exists");
      }
      Report(WorldChange{key, std::move(value)});
      return absl::OkStatus();
    }
    case SyncOp::kUpdate: {
      auto it = world_.find(key);
      if (it == world_.end()) {
        return absl::NotFoundError("fake client: update: no such key");
      }
      it->second = *value;
      Report(WorldChange{key, std::move(value)});
      return absl::OkStatus();
    }
    case SyncOp::kDelete:
      if (world_.erase(key) == 0) {
        return absl::NotFoundError("fake client: delete: no such key");
      }
      Report(WorldChange{key, std::nullopt});
      return absl::OkStatus();
    case SyncOp::kNone:
      break;
  }
  return absl::InternalError("fake client: no operation");
}

template <class K, class D, class O>
void FakeClient<K, D, O>::Report(WorldChange change) {
  if (watcher_ == nullptr) return;
  switch (observation_) {
    case FakeObservation::kImmediate:
      to_notify_.push_back(std::move(change));
      break;
    case FakeObservation::kHeld:
      held_.push_back(std::move(change));
      break;
    case FakeObservation::kDropped:
      break;
  }
}

template <class K, class D, class O>
void FakeClient<K, D, O>::Notify() {
  if (watcher_ == nullptr) return;
  // Whoever holds notify_mu_ delivers everything queued, in order, before
  // releasing it; a call that finds the queue empty once it gets the lock
  // knows its own change was delivered.
  MutexLock n(&notify_mu_);
  while (true) {
    std::deque<WorldChange> batch;
    {
      MutexLock l(&mu_);
      batch.swap(to_notify_);
    }
    if (batch.empty()) return;
    for (const WorldChange& c : batch) watcher_(c.key, c.value);
  }
}

template <class K, class D, class O>
absl::Status FakeClient<K, D, O>::Record(SyncOp op, const K& key,
                                         absl::Status result, bool threw) {
  MutexLock l(&mu_);
  if (threw) {
    ++stats_.threw;
  } else if (!result.ok()) {
    ++stats_.failed;
  }
  log_.push_back(FakeCall<K>{op, key, Clone(result), threw});
  return result;
}

template <class K, class D, class O>
typename FakeClient<K, D, O>::World FakeClient<K, D, O>::world() const {
  MutexLock l(&mu_);
  return world_;
}

template <class K, class D, class O>
std::optional<O> FakeClient<K, D, O>::Get(const K& key) const {
  MutexLock l(&mu_);
  auto it = world_.find(key);
  if (it == world_.end()) return std::nullopt;
  return it->second;
}

template <class K, class D, class O>
void FakeClient<K, D, O>::Set(K key, O value) {
  {
    MutexLock l(&mu_);
    world_.insert_or_assign(key, value);
    Report(WorldChange{std::move(key), std::move(value)});
  }
  Notify();
}

template <class K, class D, class O>
void FakeClient<K, D, O>::Erase(const K& key) {
  {
    MutexLock l(&mu_);
    if (world_.erase(key) == 0) return;
    Report(WorldChange{key, std::nullopt});
  }
  Notify();
}

template <class K, class D, class O>
void FakeClient<K, D, O>::FailNext(int n, absl::Status status) {
  MutexLock l(&mu_);
  fail_next_ = Failure{n, std::move(status)};
}

template <class K, class D, class O>
void FakeClient<K, D, O>::FailNextAfterApplying(int n, absl::Status status) {
  MutexLock l(&mu_);
  fail_after_apply_ = Failure{n, std::move(status)};
}

template <class K, class D, class O>
void FakeClient<K, D, O>::FailNextFor(const K& key, int n,
                                      absl::Status status) {
  MutexLock l(&mu_);
  fail_for_.insert_or_assign(key, Failure{n, std::move(status)});
}

template <class K, class D, class O>
void FakeClient<K, D, O>::RetryAfterNext(int n, absl::Duration delay) {
  FailNext(n, WithRetryAfter(absl::UnavailableError(
                                 "fake client: injected failure, retry later"),
                             delay));
}

template <class K, class D, class O>
void FakeClient<K, D, O>::SetFailureRate(double fraction, absl::Status status) {
  MutexLock l(&mu_);
  failure_rate_ = fraction;
  random_failure_ = std::move(status);
}

template <class K, class D, class O>
void FakeClient<K, D, O>::ThrowNext(int n) {
  MutexLock l(&mu_);
  throw_next_ = n;
}

template <class K, class D, class O>
void FakeClient<K, D, O>::SetLatency(absl::Duration latency) {
  MutexLock l(&mu_);
  latency_ = latency;
}

template <class K, class D, class O>
void FakeClient<K, D, O>::HoldCalls() {
  MutexLock l(&mu_);
  gate_closed_ = true;
}

template <class K, class D, class O>
void FakeClient<K, D, O>::ReleaseCalls() {
  MutexLock l(&mu_);
  gate_closed_ = false;
  cv_.SignalAll();
}

template <class K, class D, class O>
bool FakeClient<K, D, O>::AwaitHeldCalls(int n, absl::Duration timeout) {
  MutexLock l(&mu_);
  auto until =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  return cv_.WaitUntil(
      &mu_, {}, until,
      [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return in_gate_ >= n; });
}

template <class K, class D, class O>
int FakeClient<K, D, O>::held_calls() const {
  MutexLock l(&mu_);
  return in_gate_;
}

template <class K, class D, class O>
void FakeClient<K, D, O>::SetObservation(FakeObservation mode) {
  MutexLock l(&mu_);
  observation_ = mode;
}

template <class K, class D, class O>
int FakeClient<K, D, O>::DeliverHeld() {
  int n;
  {
    MutexLock l(&mu_);
    n = static_cast<int>(held_.size());
    for (WorldChange& c : held_) to_notify_.push_back(std::move(c));
    held_.clear();
  }
  Notify();
  return n;
}

template <class K, class D, class O>
int FakeClient<K, D, O>::held_observations() const {
  MutexLock l(&mu_);
  return static_cast<int>(held_.size());
}

template <class K, class D, class O>
FakeClientStats FakeClient<K, D, O>::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

template <class K, class D, class O>
int64_t FakeClient<K, D, O>::CallsFor(const K& key, SyncOp op) const {
  MutexLock l(&mu_);
  auto it = calls_per_key_.find(key);
  if (it == calls_per_key_.end()) return 0;
  return it->second[static_cast<size_t>(op)];
}

template <class K, class D, class O>
int FakeClient<K, D, O>::in_flight() const {
  MutexLock l(&mu_);
  return running_;
}

template <class K, class D, class O>
std::vector<FakeCall<K>> FakeClient<K, D, O>::calls() const {
  MutexLock l(&mu_);
  return log_;
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_FAKE_CLIENT_H_
