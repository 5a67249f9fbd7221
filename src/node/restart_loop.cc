// The restart loop: runs a node, and after a failed Run (or Launch) waits
// until it holds nothing and left the ring, then backs off and starts it
// again. A threadless node's loop ends once a Launch succeeded.

#include "absl/strings/str_cat.h"
#include "node/node_slot.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/node/node_manager.h"
#include "spdlog/spdlog.h"

namespace setpoint {

absl::Status NodeManager::LaunchNode(Slot& slot) {
  const Context ctx(nodes_stop_.get_token(), clock_);
  {
    MutexLock l(&mu_);
    slot.running = true;
  }
  absl::Status status =
      CallUserCode("launch", [&] { return slot.node->Launch(ctx); });
  if (!status.ok()) {
    MutexLock l(&mu_);
    slot.running = false;
  }
  return status;
}

void NodeManager::HaltNode(Slot& slot) {
  {
    MutexLock l(&mu_);
    if (!slot.threadless || !slot.running) return;
  }
  absl::Status s = CallUserCode("halt", [&] {
    slot.node->Halt();
    return absl::OkStatus();
  });
  if (!s.ok()) {
    SPDLOG_LOGGER_ERROR(logger_, "node halt failed node={}: {}", slot.info.id,
                        s);
  }
  MutexLock l(&mu_);
  slot.running = false;
}

void NodeManager::RunLoop(Slot& slot, std::stop_token stop,
                          absl::Status failed) {
  const Context ctx(nodes_stop_.get_token(), clock_);
  Backoff backoff(options_.restart_backoff);
  while (true) {
    absl::Status status = std::move(failed);
    failed = absl::OkStatus();
    if (status.ok() && slot.threadless) {
      if (ctx.Cancelled() || stop.stop_requested()) return;
      status = LaunchNode(slot);
      if (status.ok()) return;  // It works on without this thread.
    } else if (status.ok()) {
      {
        MutexLock l(&mu_);
        slot.running = true;
      }
      status = CallUserCode("run", [&] { return slot.node->Run(ctx); });
      {
        MutexLock l(&mu_);
        slot.running = false;
      }
      if (ctx.Cancelled() || stop.stop_requested()) return;
      if (status.ok()) {
        status =
            absl::InternalError("run returned before the node was stopped");
      }
    }
    if (ctx.Cancelled() || stop.stop_requested()) return;
    MutexLock l(&mu_);
    slot.failed = true;
    ++slot.restarts;
    ++stats_.restarts;
    absl::Duration wait = backoff.Next();
    SPDLOG_LOGGER_ERROR(logger_,
                        "node failed node={} restarts={} retry_in={}: {}",
                        slot.info.id, slot.restarts, wait, status);
    wake_ = true;
    cv_.SignalAll();
    // Wait until the node holds nothing and left the ring, then back off.
    cv_.Wait(&mu_, stop, [&slot]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return slot.restart_ok;
    });
    if (stop.stop_requested()) return;
    // The backoff is a wait on the clock that starts under mu_, so a test
    // that asks Idle() never sees the loop between "may restart" and
    // "asleep on the clock".
    slot.backing_off = true;
    clock_->AwaitWithDeadline(&mu_, &cv_, clock_->Now() + wait, stop,
                              [] { return false; });
    slot.backing_off = false;
    if (stop.stop_requested()) return;
    slot.failed = false;
    slot.restart_ok = false;
    slot.registered = true;
    poll_needed_ = true;
    wake_ = true;
    cv_.SignalAll();
  }
}

}  // namespace setpoint
