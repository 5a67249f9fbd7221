#include "setpoint/processor/runner_pool.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "setpoint/processor/runner.h"
#include "spdlog/spdlog.h"

// Design. A runner is in one of three places: idle (its `sleeping` flag
// set; it holds no thread), queued in ready_, or running a turn on one pool
// thread. Idle pool threads wait each on its own condition variable, in a
// stack: a queued turn wakes one, the last to go idle (warm caches); an
// earlier timer wakes them all to look again. Whoever clears the flag (a
// producer whose post found it set, the pool when the runner's wake is due,
// Stop) queues it, so a runner is never queued or run twice at once (runner.cc,
// RunTurn). A turn that ends with work left queues the runner again, behind the
// others. Lock order: a runner's mutex, then the pool's; the pool calls into a
// runner only through its atomic flag while holding its own mutex, and runs
// turns without it.

namespace setpoint {
namespace {

struct LaterWake {
  template <class W>
  bool operator()(const W& a, const W& b) const {
    return a.when > b.when;
  }
};

}  // namespace

RunnerPool::RunnerPool(RunnerPoolOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()) {
  if (logger_ == nullptr)
    logger_ = std::make_shared<spdlog::logger>("setpoint");
}

RunnerPool::~RunnerPool() { Stop(); }

absl::Status RunnerPool::Start() {
  if (options_.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start runner pool ", options_.name,
                     ": threads must be >= 1, got ", options_.threads));
  }
  if (options_.clock == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("start runner pool ", options_.name, ": clock is null"));
  }
  {
    MutexLock l(&mu_);
    if (started_ || stopping_) {
      return absl::FailedPreconditionError(absl::StrCat(
          "start runner pool ", options_.name, ": already started or stopped"));
    }
    started_ = true;
    stats_.threads = options_.threads;
  }
  for (int i = 0; i < options_.threads; ++i) {
    workers_.push_back(std::make_unique<Worker>());
  }
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back(
        [this, self = workers_[i].get()](std::stop_token stop) {
          pthread_setname_np(pthread_self(), "sp-runners");
          Work(stop, self);
        });
  }
  return absl::OkStatus();
}

void RunnerPool::Stop() {
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    if (!pending_.empty() || !ready_.empty()) {
      SPDLOG_LOGGER_WARN(logger_,
                         "runner pool stopped with runners on it pool={} "
                         "(stop the runners first)",
                         options_.name);
    }
    WakeAll();
  }
  for (auto& t : threads_) {
    t.request_stop();
    if (t.joinable()) t.join();
  }
  threads_.clear();
  MutexLock l(&mu_);
  stats_.threads = 0;
}

RunnerPoolStats RunnerPool::stats() const {
  MutexLock l(&mu_);
  RunnerPoolStats out = stats_;
  out.idle = static_cast<int>(idle_.size());
  return out;
}

bool RunnerPool::running() const {
  MutexLock l(&mu_);
  return started_ && !stopping_;
}

void RunnerPool::Schedule(Runner* runner) {
  MutexLock l(&mu_);
  ready_.push_back(runner);
  // One runner needs one thread: waking every idle one would have them
  // all contend for the lock (and the cores) to find one turn. A thread
  // that takes a turn wakes the next if more are queued.
  WakeOne();
}

void RunnerPool::WakeAll() {
  for (Worker* w : idle_) {
    w->woken = true;
    w->cv.Signal();
  }
  idle_.clear();
}

void RunnerPool::WakeOne() {
  if (idle_.empty()) return;
  Worker* w = idle_.back();
  idle_.pop_back();
  w->woken = true;
  w->cv.Signal();
}

void RunnerPool::WakeAt(Runner* runner, absl::Time when) {
  MutexLock l(&mu_);
  auto [it, added] = pending_.try_emplace(runner, when);
  if (!added) {
    if (it->second <= when) return;  // An earlier wake is pending.
    it->second = when;
  }
  const bool earliest = wakes_.empty() || when < wakes_.front().when;
  wakes_.push_back(Wake{when, runner});
  std::push_heap(wakes_.begin(), wakes_.end(), LaterWake());
  // Every idle thread waits until the earliest wake it saw: each looks
  // again (so whichever stays idle, or is busy, serves this one on time).
  if (earliest) WakeAll();
}

void RunnerPool::Forget(Runner* runner) {
  MutexLock l(&mu_);
  if (pending_.erase(runner) > 0) {
    std::erase_if(wakes_,
                  [runner](const Wake& w) { return w.runner == runner; });
    std::make_heap(wakes_.begin(), wakes_.end(), LaterWake());
  }
  std::erase(ready_, runner);
}

void RunnerPool::Work(std::stop_token stop, Worker* self) {
  MutexLock l(&mu_);
  while (!stopping_ && !stop.stop_requested()) {
    // Due wakes: idle runners whose flag the pool clears are queued.
    const absl::Time now = clock_->Now();
    while (!wakes_.empty() && wakes_.front().when <= now) {
      const Wake w = wakes_.front();
      std::pop_heap(wakes_.begin(), wakes_.end(), LaterWake());
      wakes_.pop_back();
      auto it = pending_.find(w.runner);
      if (it == pending_.end() || it->second != w.when) continue;  // Stale.
      pending_.erase(it);
      if (w.runner->ClaimIdle()) {
        ready_.push_back(w.runner);
        ++stats_.timer_wakes;
      }
    }
    if (!ready_.empty()) {
      Runner* runner = ready_.front();
      ready_.pop_front();
      ++stats_.turns;
      if (!ready_.empty()) WakeOne();  // More for the others.
      mu_.Unlock();
      const bool more = runner->RunTurn();
      mu_.Lock();
      if (more) ready_.push_back(runner);
      continue;
    }
    const absl::Time deadline =
        wakes_.empty() ? absl::InfiniteFuture() : wakes_.front().when;
    self->woken = false;
    idle_.push_back(self);
    clock_->AwaitWithDeadline(&mu_, &self->cv, deadline, stop, [this, self] {
      mu_.AssertHeld();
      return self->woken || stopping_;
    });
    // Timed out or stopped: no longer idle. (A waker took it off already.)
    if (!self->woken) std::erase(idle_, self);
  }
}

}  // namespace setpoint
