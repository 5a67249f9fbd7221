// The restart loop: runs a node, and after a failed Run waits until it
// holds nothing and left the ring, then backs off and starts it again.

#include "absl/strings/str_cat.h"
#include "node/node_slot.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/node/node_manager.h"
#include "spdlog/spdlog.h"

namespace setpoint {

void NodeManager::RunLoop(Slot& slot, std::stop_token stop) {
  const Context ctx(nodes_stop_.get_token(), clock_);
  Backoff backoff(options_.restart_backoff);
  while (true) {
    {
      MutexLock l(&mu_);
      slot.running = true;
    }
    absl::Status status =
        CallUserCode("run", [&] { return slot.node->Run(ctx); });
    {
      MutexLock l(&mu_);
      slot.running = false;
    }
    if (ctx.Cancelled() || stop.stop_requested()) return;
    if (status.ok()) {
      status = absl::InternalError("run returned before the node was stopped");
    }
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
