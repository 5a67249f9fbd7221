#include "setpoint/processor/updater_pool.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "processor/cpu_relax.h"
#include "spdlog/spdlog.h"

// Design.
//
// The pool keeps a ring of the queues (syncers) that have calls, each at
// most once. A thread takes the queue at the front and calls its Serve(),
// which runs calls for one turn; a queue that still has calls goes to the
// back, behind the others. A syncer that finds more calls queued than the
// one it takes notifies the pool again while it serves, so other threads
// can work on the same queue at once (a client that blocks on IO gets one
// thread per call); a fast client's calls are run back to back by the
// thread already there, without waking anyone.
//
// Wake-ups: before sleeping, one thread at a time spins briefly watching
// `has_work_`; Notify wakes a sleeper only when no thread spins. The
// spinner re-checks the ring under the mutex before it sleeps, so a queue
// added while it gave up is not missed. A thread that takes a queue and
// leaves others in the ring wakes a sleeper for them, so a queue never
// waits for a thread while one sleeps.

namespace setpoint {
namespace {

using internal::CpuRelax;

}  // namespace

UpdaterPool::UpdaterPool(UpdaterPoolOptions options)
    : options_(std::move(options)),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()) {}

UpdaterPool::~UpdaterPool() { Stop(); }

absl::Status UpdaterPool::Start() {
  if (options_.threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("start updater pool ", options_.name,
                     ": threads must be >= 1, got ", options_.threads));
  }
  {
    MutexLock l(&mu_);
    if (started_ || stopping_) {
      return absl::FailedPreconditionError(
          absl::StrCat("start updater pool ", options_.name,
                       ": already started or stopped"));
    }
    started_ = true;
  }
  for (int i = 0; i < options_.threads; ++i) {
    threads_.emplace_back([this](std::stop_token stop) {
      pthread_setname_np(pthread_self(), "sp-updater");
      Loop(stop);
    });
  }
  SPDLOG_LOGGER_DEBUG(logger_, "updater pool started pool={} threads={}",
                      options_.name, options_.threads);
  return absl::OkStatus();
}

void UpdaterPool::Stop() {
  {
    MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    cv_.SignalAll();
  }
  for (auto& t : threads_) t.request_stop();
  threads_.clear();  // Joins.
}

void UpdaterPool::Attach(Queue* queue) {
  MutexLock l(&mu_);
  queue->attached_ = true;
}

void UpdaterPool::Notify(Queue* queue) {
  MutexLock l(&mu_);
  if (!queue->attached_ || queue->in_ring_) return;
  queue->in_ring_ = true;
  ring_.push_back(queue);
  has_work_.store(true, std::memory_order_release);
  if (sleeping_ > 0 && !spinning_.load(std::memory_order_acquire)) {
    cv_.Signal();
  }
}

void UpdaterPool::Detach(Queue* queue) {
  MutexLock l(&mu_);
  queue->attached_ = false;
  if (queue->in_ring_) {
    ring_.erase(std::find(ring_.begin(), ring_.end(), queue));
    queue->in_ring_ = false;
    has_work_.store(!ring_.empty(), std::memory_order_release);
  }
  while (queue->serving_ > 0) detached_.Wait(&mu_);
}

bool UpdaterPool::SpinForWork() {
  bool expected = false;
  if (!spinning_.compare_exchange_strong(expected, true,
                                         std::memory_order_acq_rel)) {
    return false;  // Another thread spins already.
  }
  bool found = false;
  for (int round = 0; round < 20 && !found; ++round) {
    if (round < 12) {
      for (int i = 0; i < (8 << (round / 2)); ++i) CpuRelax();
    } else {
      std::this_thread::yield();
    }
    found = has_work_.load(std::memory_order_acquire);
  }
  spinning_.store(false, std::memory_order_release);
  return found;
}

void UpdaterPool::Loop(std::stop_token stop) {
  bool spun = false;
  while (true) {
    Queue* queue = nullptr;
    {
      MutexLock l(&mu_);
      while (ring_.empty() && !stopping_ && !stop.stop_requested()) {
        if (!spun) break;  // Spin once (outside the mutex) before sleeping.
        ++sleeping_;
        cv_.Wait(&mu_, stop, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !ring_.empty() || stopping_;
        });
        --sleeping_;
      }
      if (stopping_ || stop.stop_requested()) return;
      if (!ring_.empty()) {
        queue = ring_.front();
        ring_.pop_front();
        queue->in_ring_ = false;
        ++queue->serving_;
        has_work_.store(!ring_.empty(), std::memory_order_release);
        // Other queues wait: a thread is woken for them in turn (a spinner
        // that took this one does not cover them).
        if (!ring_.empty() && sleeping_ > 0 &&
            !spinning_.load(std::memory_order_acquire)) {
          cv_.Signal();
        }
      }
    }
    if (queue == nullptr) {
      // Nothing queued: spin a little, then (next round) sleep.
      spun = !SpinForWork();
      continue;
    }
    spun = false;
    const bool more = queue->Serve();
    MutexLock l(&mu_);
    --queue->serving_;
    if (more && queue->attached_) {
      // Behind the others, also when a helper request put it in the ring
      // during its turn: one turn at a time.
      if (queue->in_ring_) {
        ring_.erase(std::find(ring_.begin(), ring_.end(), queue));
      }
      queue->in_ring_ = true;
      ring_.push_back(queue);
      has_work_.store(true, std::memory_order_release);
    }
    if (queue->serving_ == 0 && !queue->attached_) detached_.SignalAll();
  }
}

}  // namespace setpoint
