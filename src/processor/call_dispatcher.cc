#include "setpoint/processor/internal/call_dispatcher.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "processor/cpu_relax.h"

// Design.
//
// One mutex guards the queue, the seats, the fence, the call values and
// the finished calls. A serving thread takes the next call (per-key mode)
// or up to max_batch calls (batch mode) onto its seat under the mutex,
// runs them without it, and in the same critical section that takes the
// next ones moves the finished ones to the results: one lock per call, or
// per batch. Fence reaches the running calls through the seats, under the
// same mutex, so a call is either still queued (it never starts) or on a
// seat (its context is cancelled and AwaitNoneOutside waits for it):
// nothing runs outside the dispatcher's view.
//
// Results go back to the runner in batches: a drain is requested when a
// thread runs out of calls, when hand_back results wait (a quarter of the
// syncer's max_in_flight: the runner refills while calls run), after a
// batch call, or after a slow call
// (its result should not wait for the next ones). Help: a thread that
// takes a call while more wait asks the pool for another thread, unless
// the client's calls are fast (a moving average under 20 us): then one
// thread runs them back to back and the others stay asleep.

namespace setpoint::internal {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int64_t kSlowCallNs = 50'000;
constexpr int64_t kFastClientNs = 20'000;
constexpr auto kTurn = std::chrono::milliseconds(1);
constexpr auto kLinger = std::chrono::microseconds(50);

int64_t Nanos(SteadyClock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace

DispatchedCall* CallDispatcher::Queue::PopFront() {
  DispatchedCall* call = items[head++];
  if (head == items.size()) {
    items.clear();  // Keeps the capacity.
    head = 0;
  } else if (head >= 64 && head * 2 >= items.size()) {
    items.erase(items.begin(), items.begin() + static_cast<ptrdiff_t>(head));
    head = 0;
  }
  return call;
}

CallDispatcher::CallDispatcher(Host* host, CallDispatcherOptions options)
    : host_(host),
      options_(std::move(options)),
      batch_(options_.max_batch > 0) {}

CallDispatcher::~CallDispatcher() = default;

absl::Status CallDispatcher::Start(UpdaterPool* pool) {
  {
    MutexLock l(&mu_);
    if (started_ || stopping_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "start syncer ", options_.name, ": already started or stopped"));
    }
    started_ = true;
  }
  if (pool == nullptr) return absl::OkStatus();
  // Attached before Submit can see the pool: the pool ignores a Notify for
  // a queue not attached, and calls submitted in between would wait for a
  // notification that never comes.
  pool->Attach(this);
  bool queued;
  bool stopped;
  {
    MutexLock l(&mu_);
    stopped = stopping_;
    if (!stopped) pool_ = pool;
    queued = !queue_.empty();
  }
  if (stopped) {
    pool->Detach(this);  // Stop() ran in between and found no pool.
  } else if (queued) {
    pool->Notify(this);  // The runner handed calls over before the pool.
  }
  return absl::OkStatus();
}

std::vector<DispatchedCall*> CallDispatcher::Stop() {
  std::vector<DispatchedCall*> not_started;
  UpdaterPool* pool;
  {
    MutexLock l(&mu_);
    if (stopping_) return not_started;
    stopping_ = true;
    while (!queue_.empty()) not_started.push_back(queue_.PopFront());
    queued_.store(0, std::memory_order_relaxed);
    for (auto& seat : seats_) {
      if (!seat->calls.empty()) seat->stop.request_stop();
    }
    pool = pool_;
  }
  // Waits for this dispatcher's calls only (a shared pool runs others').
  if (pool != nullptr) pool->Detach(this);
  for (DispatchedCall* call : not_started) {
    call->started = false;
    call->status = absl::CancelledError("syncer stopped");
  }
  return not_started;
}

bool CallDispatcher::Submit(std::span<DispatchedCall* const> calls) {
  UpdaterPool* pool;
  {
    MutexLock l(&mu_);
    if (stopping_) return false;
    for (DispatchedCall* call : calls) {
      call->started = false;
      call->requeue = false;
      call->threw = false;
      call->fenced = false;
      queue_.items.push_back(call);
    }
    queued_.store(static_cast<int64_t>(queue_.size()),
                  std::memory_order_relaxed);
    pool = pool_;
  }
  // One notification for all of them: the thread that takes them asks for
  // help when it finds more than it runs.
  if (pool != nullptr) pool->Notify(this);
  return true;
}

void CallDispatcher::TakeResults(std::vector<DispatchedCall*>* out) {
  MutexLock l(&mu_);
  out->insert(out->end(), results_.begin(), results_.end());
  results_.clear();
  drain_requested_ = false;
}

void CallDispatcher::SetValues(const Context& values, uint32_t version) {
  MutexLock l(&mu_);
  values_ = Context().WithValuesOf(values);
  values_version_ = version;
}

int64_t CallDispatcher::Fence(Filter filter) {
  int64_t cancelled = 0;
  bool post = false;
  {
    MutexLock l(&mu_);
    fence_ = std::move(filter);
    if (!fence_) return 0;
    for (auto& seat : seats_) {
      for (DispatchedCall* call : seat->calls) {
        if (call->fenced || fence_(*call)) continue;
        call->fenced = true;
        ++cancelled;
        if (!seat->cancelled) {
          seat->cancelled = true;
          seat->stop.request_stop();
        }
      }
    }
    // Queued calls for keys that left never start: they are results now.
    size_t kept = queue_.head;
    for (size_t i = queue_.head; i < queue_.items.size(); ++i) {
      DispatchedCall* call = queue_.items[i];
      if (fence_(*call)) {
        queue_.items[kept++] = call;
      } else {
        RefuseLocked(call);
        ++cancelled;
      }
    }
    queue_.items.resize(kept);
    if (queue_.empty()) {
      queue_.items.clear();
      queue_.head = 0;
    }
    queued_.store(static_cast<int64_t>(queue_.size()),
                  std::memory_order_relaxed);
    post = WantDrainLocked(/*now=*/true);
  }
  if (post) host_->ResultsReady();
  return cancelled;
}

absl::Status CallDispatcher::AwaitNoneOutside(const Filter& filter,
                                              const Context& ctx) const {
  auto outside = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    int64_t n = 0;
    if (!filter) return n;
    for (const auto& seat : seats_) {
      for (const DispatchedCall* call : seat->calls) {
        if (!filter(*call)) ++n;
      }
    }
    return n;
  };
  MutexLock l(&mu_);
  ++awaiters_;
  const bool done = ctx.clock()->AwaitWithDeadline(
      &mu_, &call_done_, ctx.deadline(), ctx.stop_token(),
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return outside() == 0; });
  --awaiters_;
  if (done) return absl::OkStatus();
  std::string msg =
      absl::StrCat("syncer ", options_.name, ": ", outside(),
                   " call(s) for keys outside the range still running");
  return ctx.Cancelled() ? absl::CancelledError(msg)
                         : absl::DeadlineExceededError(msg);
}

int CallDispatcher::RunUntilIdle() {
  bool more = false;
  return ServeCalls(std::numeric_limits<int>::max(), /*turn=*/false, &more);
}

bool CallDispatcher::Serve() {
  bool more = false;
  // A turn: at most 256 operations and about a millisecond, then the pool
  // serves the other syncers with queued calls before this one again.
  ServeCalls(256, /*turn=*/true, &more);
  return more;
}

void CallDispatcher::RefuseLocked(DispatchedCall* call) {
  call->started = false;
  call->fenced = true;
  call->status = absl::CancelledError("key left the range");
  results_.push_back(call);
}

bool CallDispatcher::WantDrainLocked(bool now) {
  if (results_.empty() || drain_requested_) return false;
  if (!now && !batch_ &&
      results_.size() < static_cast<size_t>(options_.hand_back)) {
    return false;
  }
  drain_requested_ = true;
  return true;
}

CallDispatcher::Seat* CallDispatcher::AcquireSeatLocked() {
  if (free_seats_.empty()) {
    seats_.push_back(std::make_unique<Seat>());
    return seats_.back().get();
  }
  Seat* seat = free_seats_.back();
  free_seats_.pop_back();
  return seat;
}

bool CallDispatcher::TakeLocked(Seat* seat) {
  if (batch_ && batches_running_ >= options_.max_batches) return false;
  const size_t want = batch_ ? static_cast<size_t>(options_.max_batch) : 1;
  while (!queue_.empty() && seat->calls.size() < want) {
    DispatchedCall* call = queue_.PopFront();
    if (!Allowed(*call)) {
      RefuseLocked(call);  // Its key left before the call started.
      continue;
    }
    call->started = true;
    call->values_version = values_version_;
    seat->calls.push_back(call);
  }
  queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_relaxed);
  if (seat->calls.empty()) return false;
  if (batch_) ++batches_running_;
  // A source is reused until something cancels a call through it; Fence
  // and Stop reach it only under mu_, so the next call gets a fresh one.
  if (seat->stop.stop_requested()) {
    seat->stop = std::stop_source();
    seat->ctx_valid = false;
  }
  seat->cancelled = false;
  return true;
}

void CallDispatcher::FinishLocked(Seat* seat) {
  if (seat->cancelled) {
    // Cancelled for a key that left: the others' failures are not theirs.
    for (DispatchedCall* call : seat->calls) {
      if (!call->fenced && !call->status.ok()) call->requeue = true;
    }
  }
  results_.insert(results_.end(), seat->calls.begin(), seat->calls.end());
  seat->calls.clear();
  if (batch_) --batches_running_;
  if (awaiters_ > 0) call_done_.SignalAll();
}

Context CallDispatcher::SeatContextLocked(Seat* seat) {
  if (!seat->ctx_valid || seat->ctx_version != values_version_) {
    seat->ctx =
        Context(seat->stop.get_token(), options_.clock).WithValuesOf(values_);
    seat->ctx_version = values_version_;
    seat->ctx_valid = true;
  }
  return seat->ctx;
}

bool CallDispatcher::AwaitMoreCalls(const UpdaterPool* pool) const {
  const SteadyClock::time_point until = SteadyClock::now() + kLinger;
  for (int i = 0;; ++i) {
    if (queued_.load(std::memory_order_relaxed) > 0) return true;
    if (pool->has_work()) return false;  // Other syncers' calls wait.
    if ((i & 63) == 63 && SteadyClock::now() >= until) return false;
    CpuRelax();
  }
}

int CallDispatcher::ServeCalls(int max_ops, bool turn, bool* more) {
  // One clock read per call: `last` is when the previous call returned.
  const SteadyClock::time_point turn_start = SteadyClock::now();
  SteadyClock::time_point last = turn_start;
  Seat* seat = nullptr;
  bool slow = false;
  bool asked_for_help = false;
  int ran = 0;
  *more = false;
  while (true) {
    bool taken = false;
    bool post = false;
    bool linger = false;
    UpdaterPool* pool = nullptr;
    UpdaterPool* help = nullptr;
    Context ctx;
    {
      MutexLock l(&mu_);
      if (seat == nullptr) {
        seat = AcquireSeatLocked();
      } else {
        FinishLocked(seat);
      }
      const bool turn_over =
          ran >= max_ops || (turn && ran > 0 && last - turn_start >= kTurn);
      if (!stopping_ && !turn_over) taken = TakeLocked(seat);
      *more = !queue_.empty() && !stopping_ &&
              (!batch_ || batches_running_ < options_.max_batches);
      post = WantDrainLocked(/*now=*/!taken || slow);
      // Out of calls right after handing results back, for a fast client:
      // the runner answers them with new calls within microseconds, so
      // this thread waits for those a moment instead of going to sleep
      // (a wake-up costs more than the calls).
      linger =
          !taken && turn && pool_ != nullptr && !batch_ && !stopping_ &&
          drain_requested_ &&
          average_call_ns_.load(std::memory_order_relaxed) < kFastClientNs &&
          free_seats_.size() + 1 == seats_.size();  // The only one.
      pool = pool_;
      if (!taken) {
        free_seats_.push_back(seat);
      } else {
        ctx = SeatContextLocked(seat);
        const bool fast_client =
            average_call_ns_.load(std::memory_order_relaxed) < kFastClientNs;
        if (*more && !asked_for_help && (batch_ || !fast_client)) {
          // More calls wait than this thread takes: another thread may
          // start on them (a client blocking on IO gets one thread per
          // call; a fast one's calls all run here).
          asked_for_help = true;
          help = pool_;
        }
      }
    }
    if (post) host_->ResultsReady();
    if (help != nullptr) help->Notify(this);
    if (!taken) {
      seat = nullptr;  // Back with the free ones.
      if (!linger || !AwaitMoreCalls(pool)) return ran;
      continue;
    }
    if (options_.operation_timeout > absl::ZeroDuration()) {
      ctx = ctx.WithTimeout(options_.operation_timeout);
    }
    host_->Execute(ctx, seat->calls);
    ran += static_cast<int>(seat->calls.size());
    const SteadyClock::time_point now = SteadyClock::now();
    const int64_t took = Nanos(now - last);
    for (DispatchedCall* call : seat->calls) call->duration_ns = took;
    if (!batch_) {
      const int64_t avg = average_call_ns_.load(std::memory_order_relaxed);
      average_call_ns_.store(avg + (took - avg) / 4, std::memory_order_relaxed);
    }
    slow = took >= kSlowCallNs;
    last = now;
  }
}

}  // namespace setpoint::internal
