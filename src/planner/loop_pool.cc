#include "setpoint/planner/loop_pool.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/planner/reconcile_loop.h"
#include "spdlog/spdlog.h"

// Design. The loops keep their own schedule (ReconcileLoop::NextWakeTime);
// the pool only asks it. A thread looking for work scans the attached
// loops that no thread runs, takes the first one due (and moves it to the
// back of the list, so due loops take turns), or else waits on the clock
// until the earliest one is due or a loop notifies. Lock order: the pool's
// mutex, then a loop's; a loop never calls into the pool holding its own.
// Only loops change what is due: an execution ending (its thread looks
// again), Trigger and Resume (Notify). Pause only makes a loop due later,
// so it needs no notice: a thread waking early finds nothing and waits
// again.

namespace setpoint {

LoopPool::LoopPool(LoopPoolOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()) {
  if (logger_ == nullptr)
    logger_ = std::make_shared<spdlog::logger>("setpoint");
}

LoopPool::~LoopPool() { Stop(); }

absl::Status LoopPool::Start() {
  if (options_.max_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start loop pool ", options_.name,
                     ": max_threads must be >= 1, got ", options_.max_threads));
  }
  if (options_.idle_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start loop pool ", options_.name, ": idle_timeout must be > 0, got ",
        absl::FormatDuration(options_.idle_timeout)));
  }
  if (options_.clock == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("start loop pool ", options_.name, ": clock is null"));
  }
  MutexLock l(&mu_);
  if (started_ || stopping_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "start loop pool ", options_.name, ": already started or stopped"));
  }
  started_ = true;
  StartThreadLocked();
  return absl::OkStatus();
}

void LoopPool::Stop() {
  std::vector<std::jthread> threads;
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    if (!entries_.empty()) {
      SPDLOG_LOGGER_WARN(logger_,
                         "loop pool stopped with loops attached pool={} "
                         "loops={} (stop the loops first)",
                         options_.name, entries_.size());
    }
    for (Entry& e : entries_) e.stop.request_stop();
    cv_.SignalAll();
    for (auto& [id, t] : threads_) threads.push_back(std::move(t));
    threads_.clear();
    for (auto& t : retired_) threads.push_back(std::move(t));
    retired_.clear();
  }
  for (auto& t : threads) {
    t.request_stop();
    if (t.joinable()) t.join();
  }
}

LoopPoolStats LoopPool::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

absl::Status LoopPool::Attach(ReconcileLoop* loop) {
  MutexLock l(&mu_);
  if (!started_ || stopping_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "loop pool ", options_.name, started_ ? ": stopped" : ": not started"));
  }
  entries_.emplace_back();
  entries_.back().loop = loop;
  ++stats_.loops;
  notified_ = true;
  cv_.SignalAll();
  return absl::OkStatus();
}

void LoopPool::Detach(ReconcileLoop* loop) {
  MutexLock l(&mu_);
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [loop](const Entry& e) { return e.loop == loop; });
  if (it == entries_.end()) return;
  it->stop.request_stop();
  cv_.Wait(&mu_, {},
           [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !it->busy; });
  entries_.erase(it);
  --stats_.loops;
}

void LoopPool::Notify() {
  MutexLock l(&mu_);
  if (waiting_ == 0) return;  // A thread looks again when its run ends.
  notified_ = true;
  cv_.SignalAll();
}

void LoopPool::StartThreadLocked() {
  for (auto& t : retired_) {
    if (t.joinable()) t.join();  // It left; it no longer needs mu_.
  }
  retired_.clear();
  const uint64_t id = next_thread_++;
  threads_.emplace_back(id, std::jthread([this, id](std::stop_token stop) {
                          pthread_setname_np(pthread_self(), "sp-loop");
                          Work(stop);
                          MutexLock l(&mu_);
                          for (auto it = threads_.begin(); it != threads_.end();
                               ++it) {
                            if (it->first != id) continue;
                            retired_.push_back(std::move(it->second));
                            threads_.erase(it);
                            break;
                          }
                        }));
  ++stats_.threads;
  ++stats_.threads_started;
}

void LoopPool::Work(std::stop_token stop) {
  MutexLock l(&mu_);
  absl::Time idle_since = clock_->Now();
  bool idle = false;  // The last wait found nothing for idle_timeout.
  while (!stopping_ && !stop.stop_requested()) {
    notified_ = false;
    const absl::Time now = clock_->Now();
    absl::Time earliest = absl::InfiniteFuture();
    auto due = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      // A loop being detached runs no more (its execution, cut short, is
      // due again at once).
      if (it->busy || it->stop.stop_requested()) continue;
      const absl::Time t = it->loop->NextWakeTime();
      if (t <= now) {
        due = it;
        break;
      }
      earliest = std::min(earliest, t);
    }
    if (due != entries_.end()) {
      due->busy = true;
      ++stats_.busy;
      ++stats_.runs;
      // Due loops take turns.
      entries_.splice(entries_.end(), entries_, due);
      // Someone keeps watching the other loops while this one runs.
      if (waiting_ == 0 && stats_.threads < options_.max_threads) {
        StartThreadLocked();
      }
      ReconcileLoop* loop = due->loop;
      const Context ctx(due->stop.get_token(), clock_);
      mu_.Unlock();
      loop->RunOnPool(ctx);
      mu_.Lock();
      due->busy = false;
      --stats_.busy;
      cv_.SignalAll();  // Detach may wait for it.
      idle_since = clock_->Now();
      idle = false;
      continue;
    }
    // Nothing due after an idle wait: leave, unless the last one.
    if (idle && stats_.threads > 1) break;
    const bool may_leave = stats_.threads > 1;
    absl::Time deadline = earliest;
    if (may_leave) {
      deadline = std::min(deadline, idle_since + options_.idle_timeout);
    }
    ++waiting_;
    clock_->AwaitWithDeadline(&mu_, &cv_, deadline, stop, [this] {
      mu_.AssertHeld();
      return notified_ || stopping_;
    });
    --waiting_;
    idle = !notified_ && clock_->Now() >= idle_since + options_.idle_timeout;
  }
  --stats_.threads;
}

}  // namespace setpoint
