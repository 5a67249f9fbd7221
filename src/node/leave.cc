// How a pod leaves the ring on a graceful Stop: its nodes stop working,
// then either leave (Deregister: the fleet re-splits the ring at once) or,
// with static membership, give their shards up and stay members for a
// successor with the same pod id. Protocol thread, at the end of Loop.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "node/node_slot.h"
#include "setpoint/base/format.h"
#include "setpoint/node/node_manager.h"
#include "spdlog/spdlog.h"

namespace setpoint {

void NodeManager::GracefulLeave() {
  std::map<std::string, std::vector<std::string>> leave;
  {
    MutexLock l(&mu_);
    for (auto& slot : slots_) {
      bool working =
          !slot->active.range.Empty() ||
          (!slot->queue.empty() && !slot->queue.back().range.Empty());
      if (working) Deliver(*slot, Assignment{});
    }
    absl::Time deadline = clock_->Now() + options_.operation_timeout;
    clock_->AwaitWithDeadline(&mu_, &cv_, deadline, {},
                              [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                for (const auto& slot : slots_) {
                                  if (!slot->queue.empty()) return false;
                                }
                                return true;
                              });
    for (auto& slot : slots_) {
      if (!slot->registered) continue;
      if (!slot->queue.empty() || !slot->active.range.Empty()) {
        // Still inside UpdateShardRange, or it refused the empty range:
        // leaving now could let another node start while this one works.
        // Its lease will expire instead.
        SPDLOG_LOGGER_WARN(logger_,
                           "node did not return from UpdateShardRange in "
                           "time, leaving by lease expiry node={}",
                           slot->info.id);
        continue;
      }
      leave[slot->info.kind].push_back(slot->info.id);
      slot->registered = false;
    }
  }
  bool ever_registered;
  {
    MutexLock l(&mu_);
    ever_registered = renewed_at_ != absl::InfinitePast();
  }
  if (options_.static_membership && !leave.empty()) {
    KeepPlaces(leave, ever_registered);
    return;
  }
  for (const auto& [kind, ids] : leave) {
    absl::Status s = options_.registry->Deregister(
        Context::Background(clock_).WithTimeout(options_.operation_timeout),
        kind, ids);
    if (!s.ok() && !ever_registered) {
      // No poll ever succeeded: there is nothing to leave (a reply lost on
      // the way would have left a record that expires on its own).
      SPDLOG_LOGGER_DEBUG(logger_,
                          "deregister skipped, the pod never registered "
                          "pod={} kind={}: {}",
                          pod_id_, kind, s);
    } else if (!s.ok()) {
      SPDLOG_LOGGER_WARN(logger_,
                         "deregister failed, leaving by lease expiry pod={} "
                         "kind={}: {}",
                         pod_id_, kind, s);
    } else {
      MutexLock l(&mu_);
      stats_.releases += static_cast<int64_t>(ids.size());
    }
  }
}

void NodeManager::KeepPlaces(
    const std::map<std::string, std::vector<std::string>>& leave,
    bool ever_registered) {
  // Static membership: give every shard up (the nodes are empty), stay
  // members. A successor with this pod id renews them within the lease and
  // takes the shards back; nobody else's share moves meanwhile.
  HandoffRequest request;
  for (const auto& [kind, ids] : leave) {
    for (const std::string& id : ids) {
      request.releases.push_back({kind, id, Assignment{}});
    }
  }
  absl::StatusOr<HandoffResult> result = options_.registry->Handoff(
      Context::Background(clock_).WithTimeout(options_.operation_timeout),
      request);
  int64_t released = 0;
  absl::Status failed = result.status();
  if (result.ok()) {
    for (const absl::Status& s : result->releases) {
      if (s.ok()) {
        ++released;
      } else if (failed.ok()) {
        failed = s;
      }
    }
  }
  MutexLock l(&mu_);
  stats_.releases += released;
  if (!failed.ok()) {
    // The records stay until the lease ends; a successor's first poll
    // shows them and its nodes release them before they grow. (A pod
    // that never registered has nothing recorded.)
    if (ever_registered) {
      SPDLOG_LOGGER_WARN(logger_,
                         "release failed, the shards stay recorded until "
                         "the lease ends pod={}: {}",
                         pod_id_, failed);
    }
    return;
  }
  SPDLOG_LOGGER_INFO(logger_,
                     "left the ring keeping places for a successor pod={} "
                     "nodes={} lease={}",
                     pod_id_, request.releases.size(), options_.lease);
}

void NodeManager::DropPredecessorsExtraPlaces() {
  // Members named after this pod that are not our nodes: a predecessor with
  // the same pod id kept them (static membership) and this pod has fewer
  // nodes of the kind. Nobody will renew them: leave for them now rather
  // than hold their shares back until their lease ends.
  const std::string pod = pod_id_ + "/";
  for (auto& [kind, view] : last_view_->kinds) {
    std::vector<std::string> extra;
    for (const std::string& id : view.members) {
      if (id.rfind(pod, 0) != 0) continue;
      bool ours = false;
      for (const auto& slot : slots_) ours = ours || slot->info.id == id;
      if (!ours) extra.push_back(id);
    }
    if (extra.empty()) continue;
    absl::Status s = options_.registry->Deregister(CallContext(), kind, extra);
    CountError("deregister", s);
    if (!s.ok()) {
      SPDLOG_LOGGER_WARN(logger_,
                         "deregister of the predecessor's extra nodes failed, "
                         "they leave by lease expiry pod={} kind={} nodes={}: "
                         "{}",
                         pod_id_, kind, extra.size(), s);
      continue;
    }
    SPDLOG_LOGGER_INFO(logger_,
                       "nodes kept by a predecessor with this pod id left "
                       "pod={} kind={} nodes={}",
                       pod_id_, kind, extra.size());
    std::erase_if(view.members, [&extra](const std::string& id) {
      return std::find(extra.begin(), extra.end(), id) != extra.end();
    });
    for (const std::string& id : extra) view.held.erase(id);
    MutexLock l(&mu_);
    poll_needed_ = true;
  }
}

}  // namespace setpoint
