#include "setpoint/processor/runner.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <exception>
#include <queue>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

struct Queued {
  Runner::Event event;
  const char* origin;
};

struct TimerKey {
  absl::Time when;
  uint64_t id;  // Ties broken by posting order.
  bool operator>(const TimerKey& o) const {
    return when != o.when ? when > o.when : id > o.id;
  }
};

// A monotonic reading of a few nanoseconds' cost (coarse: the kernel tick),
// enough to find events that run for a hundred milliseconds.
int64_t CoarseNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace

// The state producers and the runner share. Handles keep it alive through a
// weak_ptr, so cancelling after the Runner is gone is safe.
struct TimerHandle::Shared {
  Mutex mu;
  CondVar cv;
  std::vector<Queued> queue ABSL_GUARDED_BY(mu);
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool waiting ABSL_GUARDED_BY(mu) = false;  // The runner sleeps on cv.
  bool wake ABSL_GUARDED_BY(mu) = false;     // A new earliest timer or stop.
  std::priority_queue<TimerKey, std::vector<TimerKey>, std::greater<>> heap
      ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<uint64_t, Queued> timers ABSL_GUARDED_BY(mu);
  uint64_t next_timer_id ABSL_GUARDED_BY(mu) = 1;
  RunnerStats stats ABSL_GUARDED_BY(mu);
};

bool TimerHandle::Cancel() {
  std::shared_ptr<Shared> shared = shared_.lock();
  if (shared == nullptr) return false;
  Queued cancelled;
  {
    MutexLock l(&shared->mu);
    auto it = shared->timers.find(id_);
    if (it == shared->timers.end()) return false;
    cancelled = std::move(it->second);
    shared->timers.erase(it);
    ++shared->stats.timers_cancelled;
  }
  // The closure (and what it captured) is destroyed here, without the lock.
  return true;
}

Runner::Runner(RunnerOptions options)
    : name_(std::move(options.name)),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      slow_threshold_(options.slow_event_threshold),
      logger_(options.logger != nullptr ? std::move(options.logger)
                                        : spdlog::default_logger()),
      shared_(std::make_shared<TimerHandle::Shared>()) {
  if (logger_ == nullptr)
    logger_ = std::make_shared<spdlog::logger>("setpoint");
}

Runner::~Runner() { Stop(); }

absl::Status Runner::Start() {
  {
    MutexLock l(&shared_->mu);
    if (shared_->stopping) {
      return absl::FailedPreconditionError("start runner " + name_ +
                                           ": already stopped");
    }
  }
  if (thread_.joinable()) {
    return absl::FailedPreconditionError("start runner " + name_ +
                                         ": already started");
  }
  thread_ = std::jthread([this] {
    pthread_setname_np(pthread_self(), "sp-runner");
    Loop();
  });
  return absl::OkStatus();
}

void Runner::Stop() {
  std::vector<Queued> dropped;
  int64_t dropped_timers = 0;
  {
    MutexLock l(&shared_->mu);
    if (!shared_->stopping) {
      shared_->stopping = true;
      shared_->wake = true;
      shared_->cv.SignalAll();
    }
  }
  if (thread_.joinable()) {
    thread_.join();  // The loop drains the queue, then drops the timers.
    return;
  }
  // Manual mode: nothing runs after Stop(); say what is dropped.
  {
    MutexLock l(&shared_->mu);
    dropped.swap(shared_->queue);
    dropped_timers = static_cast<int64_t>(shared_->timers.size());
    shared_->timers.clear();
    shared_->heap = {};
    shared_->stats.events_dropped += static_cast<int64_t>(dropped.size());
    shared_->stats.timers_dropped += dropped_timers;
  }
  if (!dropped.empty() || dropped_timers > 0) {
    SPDLOG_LOGGER_WARN(logger_,
                       "runner stopped with work left runner={} "
                       "events_dropped={} timers_dropped={}",
                       name_, dropped.size(), dropped_timers);
  }
}

absl::Status Runner::Post(Event event, const char* origin) {
  MutexLock l(&shared_->mu);
  if (ABSL_PREDICT_FALSE(shared_->stopping)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "post to runner ", name_, " origin=", origin, ": runner stopped"));
  }
  shared_->queue.push_back(Queued{std::move(event), origin});
  if (shared_->waiting) shared_->cv.Signal();
  return absl::OkStatus();
}

absl::StatusOr<TimerHandle> Runner::PostAfter(absl::Duration delay, Event event,
                                              const char* origin) {
  return PostAt(clock_->Now() + delay, std::move(event), origin);
}

absl::StatusOr<TimerHandle> Runner::PostAt(absl::Time when, Event event,
                                           const char* origin) {
  MutexLock l(&shared_->mu);
  if (shared_->stopping) {
    return absl::FailedPreconditionError(absl::StrCat("post timer to runner ",
                                                      name_, " origin=", origin,
                                                      ": runner stopped"));
  }
  uint64_t id = shared_->next_timer_id++;
  bool earliest = shared_->heap.empty() || when < shared_->heap.top().when;
  shared_->heap.push(TimerKey{when, id});
  shared_->timers.emplace(id, Queued{std::move(event), origin});
  if (earliest && shared_->waiting) {
    shared_->wake = true;
    shared_->cv.Signal();
  }
  return TimerHandle(shared_, id);
}

absl::Time Runner::MoveDueTimers(absl::Time now) {
  TimerHandle::Shared& s = *shared_;
  s.mu.AssertHeld();
  while (!s.heap.empty()) {
    const TimerKey& top = s.heap.top();
    auto it = s.timers.find(top.id);
    if (it == s.timers.end()) {  // Cancelled.
      s.heap.pop();
      continue;
    }
    if (top.when > now) return top.when;
    s.queue.push_back(std::move(it->second));
    s.timers.erase(it);
    ++s.stats.timers_fired;
    s.heap.pop();
  }
  return absl::InfiniteFuture();
}

int64_t Runner::RunBatch() {
  std::vector<Queued> batch;
  {
    MutexLock l(&shared_->mu);
    if (!shared_->timers.empty()) MoveDueTimers(clock_->Now());
    batch.swap(shared_->queue);
  }
  int64_t threw = 0, slow = 0;
  const int64_t threshold = slow_threshold_ > absl::ZeroDuration()
                                ? absl::ToInt64Nanoseconds(slow_threshold_)
                                : INT64_MAX;
  int64_t start = threshold != INT64_MAX ? CoarseNanos() : 0;
  for (Queued& q : batch) {
    try {
      std::move(q.event)();
    } catch (const std::exception& e) {
      ++threw;
      SPDLOG_LOGGER_ERROR(logger_, "event threw runner={} origin={} err=\"{}\"",
                          name_, q.origin, e.what());
    } catch (...) {
      ++threw;
      SPDLOG_LOGGER_ERROR(
          logger_,
          "event threw runner={} origin={} err=\"a non-standard "
          "exception\"",
          name_, q.origin);
    }
    if (threshold != INT64_MAX) {
      int64_t end = CoarseNanos();
      if (ABSL_PREDICT_FALSE(end - start > threshold)) {
        ++slow;
        SPDLOG_LOGGER_WARN(logger_,
                           "slow event on runner (IO on the runner?) runner={} "
                           "origin={} took={}",
                           name_, q.origin, absl::Nanoseconds(end - start));
      }
      start = end;
    }
  }
  // Closures are destroyed here, before the lock is taken again.
  const int64_t ran = static_cast<int64_t>(batch.size());
  batch.clear();
  if (ran > 0) {
    MutexLock l(&shared_->mu);
    shared_->stats.events_run += ran;
    shared_->stats.events_threw += threw;
    shared_->stats.slow_events += slow;
  }
  return ran;
}

void Runner::Loop() {
  current_.store(std::this_thread::get_id());
  TimerHandle::Shared& s = *shared_;
  while (true) {
    {
      MutexLock l(&s.mu);
      while (true) {
        absl::Time next = s.timers.empty() ? absl::InfiniteFuture()
                                           : MoveDueTimers(clock_->Now());
        if (!s.queue.empty()) break;
        if (s.stopping) {
          int64_t dropped = static_cast<int64_t>(s.timers.size());
          s.stats.timers_dropped += dropped;
          s.timers.clear();
          s.heap = {};
          if (dropped > 0) {
            SPDLOG_LOGGER_WARN(logger_,
                               "runner stopped with timers pending runner={} "
                               "timers_dropped={}",
                               name_, dropped);
          }
          current_.store(std::thread::id{});
          return;
        }
        s.waiting = true;
        s.wake = false;
        clock_->AwaitWithDeadline(&s.mu, &s.cv, next, {}, [&s] {
          s.mu.AssertHeld();
          return !s.queue.empty() || s.wake;
        });
        s.waiting = false;
      }
    }
    RunBatch();
  }
}

int64_t Runner::RunUntilIdle() {
  if (thread_.joinable()) return 0;
  current_.store(std::this_thread::get_id());
  int64_t total = 0;
  while (true) {
    int64_t ran = RunBatch();
    if (ran == 0) break;
    total += ran;
  }
  current_.store(std::thread::id{});
  return total;
}

bool Runner::IsCurrent() const {
  return current_.load() == std::this_thread::get_id();
}

RunnerStats Runner::stats() const {
  MutexLock l(&shared_->mu);
  return shared_->stats;
}

}  // namespace setpoint
