#include "setpoint/processor/source_executor.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "spdlog/spdlog.h"

// Design.
//
// Leader and followers. The executor keeps the attached tasks, each with
// the time it is due. At most one idle thread, the leader, waits on the
// clock until the earliest due time or a change (`version_`); the other
// idle threads, the followers, wait in real time for the leader's place.
// A thread that finds a task due takes it (running: no other thread runs
// it) and, when other tasks wait, hands the lead on first: it wakes the
// follower that went idle last, or starts a thread if none is idle. So a
// task never waits for a thread while one could wait for it, and an
// executor with one task has one thread. Waking the last idle follower
// first (a stack) leaves the others idle, so after a burst the extra
// threads wait out `idle_exit` and leave (but the last thread); the
// threads that left are joined by the next thread start or by Stop().
//
// A run is not interrupted by the executor except through the task's stop
// token (Detach, Stop). A Wake during a run makes the task due again once
// the run returns.

namespace setpoint {

SourceExecutor::SourceExecutor(SourceExecutorOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()) {}

SourceExecutor::~SourceExecutor() { Stop(); }

absl::Status SourceExecutor::Start() {
  if (options_.max_threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start source executor ", options_.name,
                     ": max_threads must be >= 1, got ", options_.max_threads));
  }
  if (options_.idle_exit <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("start source executor ", options_.name,
                     ": idle_exit must be > 0, got ",
                     absl::FormatDuration(options_.idle_exit)));
  }
  MutexLock l(&mu_);
  if (started_ || stopping_) {
    return absl::FailedPreconditionError(
        absl::StrCat("start source executor ", options_.name,
                     ": already started or stopped"));
  }
  started_ = true;
  StartThread();
  return absl::OkStatus();
}

void SourceExecutor::Stop() {
  std::map<int64_t, std::jthread> threads;
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    for (Task* t : tasks_) {
      if (t->running_) t->stop_.request_stop();
    }
    changed_.SignalAll();
    for (Follower* f : followers_) f->cv.Signal();
    threads = std::move(threads_);
  }
  for (auto& [id, t] : threads) t.request_stop();
  threads.clear();  // Joins.
  SPDLOG_LOGGER_DEBUG(logger_, "source executor stopped executor={}",
                      options_.name);
}

absl::Status SourceExecutor::Attach(Task* task, absl::Time due) {
  MutexLock l(&mu_);
  if (!started_ || stopping_) {
    return absl::FailedPreconditionError(
        absl::StrCat("attach to source executor ", options_.name, ": ",
                     started_ ? "stopped" : "not started"));
  }
  SETPOINT_CHECK_MSG(!task->attached_, "source task attached twice to {}",
                     options_.name);
  task->attached_ = true;
  task->detaching_ = false;
  task->due_ = due;
  task->wake_due_ = absl::InfiniteFuture();
  task->stop_ = std::stop_source();
  tasks_.push_back(task);
  ++version_;
  EnsureWaiter();
  return absl::OkStatus();
}

void SourceExecutor::Wake(Task* task, absl::Time due) {
  MutexLock l(&mu_);
  if (!task->attached_ || task->detaching_) return;
  if (task->running_) {
    task->wake_due_ = std::min(task->wake_due_, due);
    return;
  }
  if (due >= task->due_) return;
  task->due_ = due;
  ++version_;
  EnsureWaiter();
}

void SourceExecutor::Detach(Task* task) {
  MutexLock l(&mu_);
  if (!task->attached_) return;
  task->detaching_ = true;
  if (task->running_) task->stop_.request_stop();
  while (task->running_) returned_.Wait(&mu_);
  tasks_.erase(std::find(tasks_.begin(), tasks_.end(), task));
  task->attached_ = false;
  task->detaching_ = false;
  ++version_;
  changed_.SignalAll();
}

SourceExecutorStats SourceExecutor::stats() const {
  MutexLock l(&mu_);
  SourceExecutorStats s = stats_;
  s.threads = live_;
  return s;
}

SourceExecutor::Task* SourceExecutor::Earliest(absl::Time* due) const {
  Task* best = nullptr;
  *due = absl::InfiniteFuture();
  for (Task* t : tasks_) {
    if (t->running_ || t->detaching_) continue;
    if (best == nullptr || t->due_ < *due) {
      best = t;
      *due = t->due_;
    }
  }
  return best;
}

bool SourceExecutor::OthersWaiting(const Task* except) const {
  for (const Task* t : tasks_) {
    if (t != except && !t->running_ && !t->detaching_) return true;
  }
  return false;
}

void SourceExecutor::EnsureWaiter() {
  if (leader_) {
    changed_.SignalAll();
  } else if (pending_ > 0) {
    // A thread on its way will look for due tasks first.
  } else if (!followers_.empty()) {
    Follower* f = followers_.back();
    followers_.pop_back();
    f->woken = true;
    ++pending_;
    f->cv.Signal();
  } else if (live_ < options_.max_threads) {
    StartThread();
  }
}

void SourceExecutor::StartThread() {
  std::vector<std::jthread> retired = TakeRetired();
  const int64_t id = next_id_++;
  ++live_;
  ++pending_;
  ++stats_.threads_started;
  threads_.emplace(id, std::jthread([this, id](std::stop_token stop) {
                     pthread_setname_np(pthread_self(), "sp-source");
                     Loop(id, stop);
                   }));
  // The threads that left end without the lock; joining them here waits
  // for nothing but their exit.
  mu_.Unlock();
  retired.clear();
  mu_.Lock();
}

std::vector<std::jthread> SourceExecutor::TakeRetired() {
  std::vector<std::jthread> out;
  for (int64_t id : retired_) {
    auto it = threads_.find(id);
    if (it == threads_.end()) continue;
    out.push_back(std::move(it->second));
    threads_.erase(it);
  }
  retired_.clear();
  return out;
}

void SourceExecutor::RunTask(Task* task) {
  task->running_ = true;
  task->due_ = absl::InfiniteFuture();
  task->wake_due_ = absl::InfiniteFuture();
  ++version_;
  if (OthersWaiting(task)) EnsureWaiter();
  std::stop_token stop = task->stop_.get_token();
  mu_.Unlock();
  absl::Time next;
  bool threw = false;
  absl::StatusOr<absl::Time> ran =
      CallUserCode("source task", [&] { return task->Run(stop); });
  if (ran.ok()) {
    next = *ran;
  } else {
    threw = true;
    next = clock_->Now() + absl::Seconds(1);
    SPDLOG_LOGGER_ERROR(logger_, "source task failed executor={}: {}",
                        options_.name, ran.status());
  }
  mu_.Lock();
  task->running_ = false;
  ++stats_.runs;
  if (threw) ++stats_.threw;
  if (task->detaching_) {
    returned_.SignalAll();
    return;
  }
  task->due_ = std::min(next, task->wake_due_);
  task->wake_due_ = absl::InfiniteFuture();
  ++version_;
  if (leader_) changed_.SignalAll();
}

void SourceExecutor::Loop(int64_t id, std::stop_token stop) {
  MutexLock l(&mu_);
  --pending_;
  while (!stopping_) {
    absl::Time due;
    Task* task = Earliest(&due);
    if (task != nullptr && due <= clock_->Now()) {
      RunTask(task);
      continue;
    }
    if (!leader_) {
      leader_ = true;
      const uint64_t seen = version_;
      clock_->AwaitWithDeadline(&mu_, &changed_, due, stop,
                                [this, seen]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  return version_ != seen || stopping_;
                                });
      leader_ = false;
      if (stop.stop_requested()) break;
      continue;
    }
    Follower me;
    followers_.push_back(&me);
    const auto until = std::chrono::steady_clock::now() +
                       absl::ToChronoNanoseconds(options_.idle_exit);
    const bool woke = me.cv.WaitUntil(
        &mu_, stop, until, [this, &me]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return me.woken || stopping_;
        });
    if (me.woken) {
      --pending_;
    } else {
      std::erase(followers_, &me);
    }
    if (!woke && !stopping_ && !stop.stop_requested() && live_ > 1) {
      --live_;
      ++stats_.threads_exited;
      retired_.push_back(id);
      return;
    }
    if (stop.stop_requested()) break;
  }
}

}  // namespace setpoint
