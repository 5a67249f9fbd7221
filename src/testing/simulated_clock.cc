#include "setpoint/testing/simulated_clock.h"

#include <algorithm>
#include <chrono>

namespace setpoint::testing {

// One blocked call. The advancing thread holds `m` while it signals the
// waiter's condition variable, and the waiter clears `active` under `m`
// (without its own mutex held) before returning, so the advancer never
// touches a mutex or condition variable that is gone.
struct SimulatedClock::Waiter {
  Mutex m;
  Mutex* mu;
  CondVar* cv;
  absl::Time deadline;
  bool active ABSL_GUARDED_BY(m) = true;
};

SimulatedClock::SimulatedClock(SimulatedClockOptions options)
    : auto_advance_(options.auto_advance), now_(options.start) {}

SimulatedClock::~SimulatedClock() = default;

absl::Time SimulatedClock::Now() {
  MutexLock l(&mu_);
  return now_;
}

void SimulatedClock::Register(const std::shared_ptr<Waiter>& w) {
  MutexLock l(&mu_);
  waiters_.push_back(w);
  waiters_changed_.SignalAll();
}

void SimulatedClock::Unregister(const std::shared_ptr<Waiter>& w) {
  {
    MutexLock wl(&w->m);
    w->active = false;
  }
  MutexLock l(&mu_);
  waiters_.erase(std::find(waiters_.begin(), waiters_.end(), w));
  waiters_changed_.SignalAll();
}

bool SimulatedClock::AwaitWithDeadline(Mutex* mu, CondVar* cv,
                                       absl::Time deadline,
                                       std::stop_token stop,
                                       absl::FunctionRef<bool()> pred) {
  if (pred()) return true;
  if (stop.stop_requested() || Now() >= deadline) return false;
  auto waiter = std::make_shared<Waiter>();
  waiter->mu = mu;
  waiter->cv = cv;
  waiter->deadline = deadline;
  Register(waiter);
  while (true) {
    if (pred() || stop.stop_requested() || Now() >= deadline) break;
    if (auto_advance_ && deadline != absl::InfiniteFuture()) {
      mu->Unlock();
      AdvanceTo(deadline);
      mu->Lock();
      continue;
    }
    cv->Wait(mu, stop, [&] { return pred() || Now() >= deadline; });
  }
  mu->Unlock();
  Unregister(waiter);
  mu->Lock();
  return pred();
}

void SimulatedClock::AdvanceTime(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return;
  AdvanceTo(Now() + d);
}

void SimulatedClock::AdvanceTo(absl::Time t) {
  std::vector<std::shared_ptr<Waiter>> due;
  {
    MutexLock l(&mu_);
    if (t <= now_) return;
    now_ = t;
    for (const auto& w : waiters_) {
      if (w->deadline <= now_) due.push_back(w);
    }
  }
  for (const auto& w : due) {
    MutexLock wl(&w->m);
    if (!w->active) continue;
    // Taking the waiter's mutex orders this signal after its last check of
    // the time, so the wake-up cannot be lost.
    w->mu->Lock();
    w->cv->SignalAll();
    w->mu->Unlock();
  }
}

int SimulatedClock::num_waiters() {
  MutexLock l(&mu_);
  return static_cast<int>(waiters_.size());
}

bool SimulatedClock::AwaitWaiters(int n, absl::Duration real_timeout) {
  MutexLock l(&mu_);
  auto until = std::chrono::steady_clock::now() +
               absl::ToChronoNanoseconds(real_timeout);
  return waiters_changed_.WaitUntil(&mu_, {}, until, [&] {
    mu_.AssertHeld();
    return static_cast<int>(waiters_.size()) >= n;
  });
}

absl::Time SimulatedClock::NextDeadline() {
  MutexLock l(&mu_);
  absl::Time next = absl::InfiniteFuture();
  for (const auto& w : waiters_) next = std::min(next, w->deadline);
  return next;
}

}  // namespace setpoint::testing
