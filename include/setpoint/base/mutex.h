// Mutex, MutexLock, CondVar and ThreadChecker: small wrappers over the
// standard primitives, annotated for Clang's -Wthread-safety analysis.
//
// setpoint does not use absl::Mutex: Debian's prebuilt abseil is not built
// with ThreadSanitizer and yields false reports. These wrappers follow
// LevelDB's port/port_stdcxx.h.
//
//   class Counter {
//    public:
//     void Add() { MutexLock l(&mu_); ++n_; cv_.SignalAll(); }
//    private:
//     Mutex mu_;
//     CondVar cv_;
//     int n_ ABSL_GUARDED_BY(mu_) = 0;
//   };
//
// Thread safety: Mutex and CondVar are thread-safe; ThreadChecker is a
// capability that asserts one thread at a time (see below).
#ifndef SETPOINT_BASE_MUTEX_H_
#define SETPOINT_BASE_MUTEX_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "setpoint/base/check.h"

namespace setpoint {

// A non-recursive mutex. Satisfies BasicLockable so CondVar can wait on it.
class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }
  bool TryLock() ABSL_EXCLUSIVE_TRYLOCK_FUNCTION(true) {
    return mu_.try_lock();
  }
  // Documents (for the analysis) that the caller holds the lock.
  void AssertHeld() ABSL_ASSERT_EXCLUSIVE_LOCK() {}

  // BasicLockable, for std::condition_variable_any. Prefer Lock/Unlock.
  void lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex for the lifetime of the scope.
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) {
    mu_->Lock();
  }
  ~MutexLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex* const mu_;
};

// A condition variable used with Mutex. Waits can be cut short by a
// std::stop_token. Spurious wake-ups happen: always wait in a loop or use the
// predicate forms.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  // Blocks until signalled, or spuriously (at the latest after kRecheck).
  // `mu` must be held.
  void Wait(Mutex* mu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    cv_.wait_for(*mu, kRecheck);
  }

  // Blocks until `pred()` holds or `stop` is requested. Returns pred().
  //
  // Both waits look at `pred()` again at least every kRecheck even without
  // a signal: glibc's condition variable can lose a wake-up (sourceware
  // bug 25847, in Debian 12's glibc; seen here as a relay that slept
  // through three broadcasts), and a lost one must cost a short delay,
  // not a thread asleep for good.
  //
  // The bodies are not analysed: `pred` is the caller's lambda, annotated
  // with the caller's own mutex, which the analysis cannot tie to `mu`.
  // Callers are still checked for holding `mu`.
  template <typename Pred>
  bool Wait(Mutex* mu, std::stop_token stop, Pred pred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // A stop wakes the wait; one that comes between the check and the
    // wait is seen within kRecheck.
    std::stop_callback wake(stop, [this] { cv_.notify_all(); });
    while (!pred()) {
      if (stop.stop_requested()) return false;
      cv_.wait_for(*mu, kRecheck);
    }
    return true;
  }

  // Blocks until `pred()` holds, `stop` is requested, or the steady-clock
  // `deadline` passes. Returns pred().
  template <typename Pred>
  bool WaitUntil(Mutex* mu, std::stop_token stop,
                 std::chrono::steady_clock::time_point deadline, Pred pred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::stop_callback wake(stop, [this] { cv_.notify_all(); });
    while (!pred()) {
      const auto now = std::chrono::steady_clock::now();
      if (stop.stop_requested() || now >= deadline) return false;
      cv_.wait_until(*mu, std::min(deadline, now + kRecheck));
    }
    return true;
  }

  // How often a wait looks again without a signal (see Wait).
  static constexpr std::chrono::milliseconds kRecheck{1000};

  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable_any cv_;
};

// A capability that asserts that a group of members is only touched by one
// thread at a time (for example the Runner's thread), in the manner of
// Chromium's SequenceChecker. The first thread that calls Check() binds it;
// Detach() unbinds it (for example when ownership moves to another thread).
// In builds with NDEBUG the check is free and always passes; the annotations
// still let Clang's analysis verify every access goes through it.
//
//   ThreadChecker runner_checker_;
//   int state_ ABSL_GUARDED_BY(runner_checker_);
//   void OnEvent() { SETPOINT_DCHECK_THREAD(runner_checker_); ++state_; }
class ABSL_LOCKABLE ThreadChecker {
 public:
  ThreadChecker() = default;
  ThreadChecker(const ThreadChecker&) = delete;
  ThreadChecker& operator=(const ThreadChecker&) = delete;

  // Returns true when called on the bound thread (binding it if unbound).
  bool CalledOnValidThread() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
#ifdef NDEBUG
    return true;
#else
    std::thread::id self = std::this_thread::get_id();
    std::thread::id expected{};
    if (owner_.compare_exchange_strong(expected, self)) return true;
    return expected == self;
#endif
  }
  void Detach() { owner_.store(std::thread::id{}); }

 private:
  mutable std::atomic<std::thread::id> owner_{};
};

}  // namespace setpoint

// Asserts (in debug builds) that the caller runs on the checker's thread.
#define SETPOINT_DCHECK_THREAD(checker) \
  SETPOINT_CHECK_MSG((checker).CalledOnValidThread(), "wrong thread")

#endif  // SETPOINT_BASE_MUTEX_H_
