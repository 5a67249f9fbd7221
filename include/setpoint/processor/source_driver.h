// SourceDriver: the machinery every source shares — when its next step is
// due, who runs it (a SourceExecutor's thread, or the owner in manual
// mode), Trigger(), waiting for a fresh list (AwaitFresh), and the
// lifecycle. A source (the poll loop of PollingSource, the list-and-watch
// loop of WatchSource) implements Step(): one list, one stream opening, or
// one batch of events; the driver runs steps when they are due.
//
//   class MyDriver : public SourceDriver {
//     StepResult Step(const Context& ctx) override {
//       ...  // one call, its result posted to a SourceCache
//       return {.next = clock()->Now() + interval, .progressed = true};
//     }
//   };
//
// Threads: none of its own. With SourceDriverOptions::executor the steps
// run on that shared executor's threads (a pod's sources share one);
// without one the driver owns a private executor of one thread. With
// `manual` nothing runs until the owner calls RunUntilIdle().
//
// Thread safety: Start, Stop and RunUntilIdle belong to the owner thread;
// Trigger, NextWakeTime and AwaitFresh are thread-safe (AwaitFresh in
// manual mode: the owner thread). Step runs on one thread at a time.
#ifndef SETPOINT_PROCESSOR_SOURCE_DRIVER_H_
#define SETPOINT_PROCESSOR_SOURCE_DRIVER_H_

#include <cstdint>
#include <memory>
#include <stop_token>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/source_executor.h"
#include "spdlog/logger.h"

namespace setpoint {

struct SourceDriverOptions {
  // Names the source in logs and errors.
  std::string name = "source";
  // Required: the clock steps are due on (the executor's, if shared).
  Clock* clock = nullptr;
  // Where steps run. Null: a private executor of one thread.
  SourceExecutor* executor = nullptr;
  // No threads: RunUntilIdle() runs the steps due, on the caller's thread.
  bool manual = false;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

class SourceDriver : private SourceExecutor::Task {
 public:
  explicit SourceDriver(SourceDriverOptions options);
  // Subclasses call Stop() in their own destructor (Step is theirs).
  ~SourceDriver() override;
  SourceDriver(const SourceDriver&) = delete;
  SourceDriver& operator=(const SourceDriver&) = delete;

  // Validates (kInvalidArgument naming the field) and starts: the first
  // step is due at once. kFailedPrecondition if started before, or if the
  // shared executor is not running. Nothing runs after an error.
  absl::Status Start();
  // Cancels a step in progress (its context) and waits for it; no step
  // runs afterwards. Idempotent.
  void Stop();
  // The next step is due at once (any thread).
  void Trigger();

  // Manual mode, owner thread, between Start and Stop: runs the steps due
  // now on the clock (and, when a stream is open, looks at it once), until
  // one makes no progress or the next is in the future. Returns whether a
  // step made progress (a call returned). False outside manual mode.
  bool RunUntilIdle();
  // When the next step is due: absl::InfinitePast() when due now (first
  // step, Trigger, a re-list), else the time the last step asked for.
  absl::Time NextWakeTime() const;

  // Returns once a list that began after this call has landed: OK, or the
  // error that list failed with (annotated with the source's name). In
  // manual mode the list runs here, on the caller's thread. Otherwise the
  // source lists at once and this waits: ctx.Err() if ctx ends first;
  // kFailedPrecondition once stopped. What "a list" is, is the source's
  // business: a poll lists, a watch lists again and resumes from the new
  // token (RequestList).
  absl::Status AwaitFresh(const Context& ctx);

  const std::string& name() const { return name_; }
  Clock* clock() const { return clock_; }
  bool manual() const { return manual_; }

 protected:
  struct StepResult {
    absl::Time next;  // When the next step is due.
    bool progressed;  // A call returned (manual mode stops at false).
  };
  // Returns the options' errors (kInvalidArgument, naming the field).
  virtual absl::Status Validate() const = 0;
  // One step, on whichever thread drives the source. `ctx` is cancelled
  // by Stop(); a step cut short by it returns anything (it is not used).
  virtual StepResult Step(const Context& ctx) = 0;
  // Manual mode: true when RunUntilIdle should step even if not due (an
  // open stream may hold events).
  virtual bool HasInput() const { return false; }
  // AwaitFresh wants a list that begins after now: make the next step one
  // (a watch interrupts its stream). Then Trigger() follows. Any thread.
  virtual void RequestList() {}

  // For Step: number a list as it begins, and report how it ended
  // (`landed`: false when its result was dropped, a filter changed).
  int64_t ListBegins();
  void ListEnded(int64_t seq, const absl::Status& status, bool landed);

  const std::shared_ptr<spdlog::logger>& logger() const { return logger_; }

 private:
  absl::Time Run(std::stop_token stop) override;
  StepResult RunStep(const Context& ctx);

  const std::string name_;
  Clock* const clock_;
  SourceExecutor* executor_;
  const bool manual_;
  const std::shared_ptr<spdlog::logger> logger_;
  std::unique_ptr<SourceExecutor> own_executor_;

  mutable Mutex mu_;
  CondVar cv_;  // A list ended, or stopped.
  bool triggered_ ABSL_GUARDED_BY(mu_) = false;
  // When the next step is due, unless triggered; InfinitePast before the
  // first.
  absl::Time next_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t lists_begun_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t landed_seq_ ABSL_GUARDED_BY(mu_) = 0;  // Highest landed list.
  int64_t failed_seq_ ABSL_GUARDED_BY(mu_) = 0;  // Highest failed list.
  absl::Status failed_status_ ABSL_GUARDED_BY(mu_);
  // Between Start and Stop (for AwaitFresh), and the executor Trigger
  // wakes (null when not attached).
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  SourceExecutor* wake_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Owner thread only.
  bool started_ = false;
  bool stopped_ = false;
  bool attached_ = false;
};

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SOURCE_DRIVER_H_
