// The relays: the timer that fences nodes at their deadline and starts
// workers, and the workers that deliver each node's updates in order.
#include <pthread.h>

#include <algorithm>
#include <chrono>

#include "node/node_slot.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/node/node_manager.h"
#include "spdlog/spdlog.h"

namespace setpoint {

namespace {

// Relay workers started at once when updates wait; past that, one more
// only when every worker has been inside UpdateShardRange this long.
constexpr int kRelays = 4;
constexpr absl::Duration kRelayStuck = absl::Milliseconds(20);
// ...and those beyond kRelays leave after idling this long.
constexpr absl::Duration kRelayIdle = absl::Seconds(1);

}  // namespace

bool NodeManager::FenceDue(const Slot& slot, absl::Time now) const {
  return Working(slot) && renewed_at_ != absl::InfinitePast() &&
         now >= FenceDeadline();
}

bool NodeManager::Ready(const Slot& slot, absl::Time now) const {
  return !slot.queue.empty() && !slot.in_call &&
         (now >= slot.retry_at || FenceDue(slot, now));
}

int NodeManager::ReadyCount(absl::Time now) const {
  int n = 0;
  for (const auto& slot : slots_) n += Ready(*slot, now) ? 1 : 0;
  return n;
}

void NodeManager::RelayTimer(std::stop_token stop) {
  MutexLock l(&mu_);
  while (!stop.stop_requested()) {
    // Fence every node whose deadline passed, whatever the protocol thread
    // and the other nodes' calls are blocked on.
    absl::Time now = clock_->Now();
    for (auto& slot : slots_) {
      if (FenceDue(*slot, now)) Fence(*slot, "lease not renewed in time");
    }
    // Workers for the nodes that have an update waiting (idle ones first:
    // a pause that ended wakes nobody else): up to kRelays at once, and
    // one more whenever every worker has been inside its call for
    // kRelayStuck, so that a node whose UpdateShardRange blocks never
    // delays another's update or fence for longer than that.
    if (ReadyCount(now) > 0) cv_.SignalAll();
    for (int missing = RelaysToStart(now); missing > 0; --missing) {
      ++idle_relays_;  // It counts as idle until it takes a node.
      const int64_t id = next_relay_++;
      relays_.emplace(id, std::jthread([this, id](std::stop_token st) {
                        pthread_setname_np(pthread_self(), "sp-relay");
                        RelayWorker(id, st);
                      }));
    }
    if (!retired_relays_.empty()) {
      // Workers that left after idling: join them without the lock.
      std::vector<std::jthread> done;
      for (int64_t id : retired_relays_) {
        auto it = relays_.find(id);
        if (it == relays_.end()) continue;
        done.push_back(std::move(it->second));
        relays_.erase(it);
      }
      retired_relays_.clear();
      mu_.Unlock();
      for (auto& t : done) t.join();
      mu_.Lock();
      continue;
    }
    // Wake at the next fence deadline or end of a refusal's pause, or
    // sooner when one comes nearer (a grant makes a node work) or a node
    // has an update and no idle worker.
    absl::Time next = NextRelayDeadline(now);
    if (ReadyCount(now) > idle_relays_) {
      // Look again when every running call counts as stuck.
      absl::Time all_stuck = absl::InfinitePast();
      for (const auto& slot : slots_) {
        if (slot->in_call) {
          all_stuck = std::max(all_stuck, slot->call_started + kRelayStuck);
        }
      }
      if (all_stuck > now) next = std::min(next, all_stuck);
    }
    clock_->AwaitWithDeadline(
        &mu_, &cv_, next, stop,
        [this, next]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          const absl::Time t = clock_->Now();
          return RelaysToStart(t) > 0 || NextRelayDeadline(t) < next;
        });
  }
}

int NodeManager::RelaysToStart(absl::Time now) const {
  const int missing = ReadyCount(now) - idle_relays_;
  if (missing <= 0) return 0;
  const int workers = static_cast<int>(relays_.size() - retired_relays_.size());
  if (workers < kRelays) return std::min(missing, kRelays - workers);
  // All busy: one more once every running call has lasted kRelayStuck.
  for (const auto& slot : slots_) {
    if (slot->in_call && now - slot->call_started < kRelayStuck) return 0;
  }
  return 1;
}

absl::Time NodeManager::NextRelayDeadline(absl::Time now) const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& slot : slots_) {
    // Once the empty range is queued the fence is done: its deadline no
    // longer wakes anyone (a node still inside a late call would).
    if (NeedsFence(*slot) && renewed_at_ != absl::InfinitePast()) {
      next = std::min(next, FenceDeadline());
    }
    if (!slot->queue.empty() && !slot->in_call && slot->retry_at > now) {
      next = std::min(next, slot->retry_at);
    }
  }
  return next;
}

void NodeManager::RelayWorker(int64_t id, std::stop_token stop) {
  const Context ctx(nodes_stop_.get_token(), clock_);
  while (true) {
    Assignment next;
    Context call_ctx = ctx;
    Slot* picked = nullptr;
    {
      MutexLock l(&mu_);
      absl::Time idle_until = clock_->Now() + kRelayIdle;
      // Take the first node with an update waiting (idle until then).
      while (true) {
        if (stop.stop_requested()) {
          --idle_relays_;
          return;
        }
        absl::Time now = clock_->Now();
        for (auto& slot : slots_) {
          if (Ready(*slot, now)) {
            picked = slot.get();
            break;
          }
        }
        if (picked != nullptr) break;
        // Past kRelays, a worker that idled for kRelayIdle leaves.
        if (now >= idle_until) {
          if (relays_.size() - retired_relays_.size() >
              static_cast<size_t>(kRelays)) {
            --idle_relays_;
            retired_relays_.push_back(id);
            cv_.SignalAll();  // The timer joins it.
            return;
          }
          idle_until = now + kRelayIdle;
        }
        clock_->AwaitWithDeadline(&mu_, &cv_, idle_until, stop,
                                  [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                    return ReadyCount(clock_->Now()) > 0;
                                  });
      }
      --idle_relays_;
      Slot& slot = *picked;
      // A fence that came due supersedes what was queued.
      if (FenceDue(slot, clock_->Now())) {
        Fence(slot, "lease not renewed in time");
      }
      next = slot.queue.front();
      slot.in_call = true;
      slot.call_started = clock_->Now();
      // The node's right to work ends with the lease unless renewed: its
      // update may not take longer than that.
      call_ctx = renewed_at_ != absl::InfinitePast()
                     ? ctx.WithDeadline(renewed_at_ + options_.lease)
                     : ctx;
    }
    Slot& slot = *picked;
    const auto call_start = std::chrono::steady_clock::now();
    absl::Status status = CallUserCode("UpdateShardRange", [&] {
      return slot.node->UpdateShardRange(call_ctx, next);
    });
    const bool threw = ThrewException(status);
    if (threw) {
      SPDLOG_LOGGER_ERROR(logger_, "node's update threw node={} range={}: {}",
                          slot.info.id, next.range, status);
    } else if (handoff_duration_ != nullptr) {
      handoff_duration_->Observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                        call_start)
              .count());
    }
    MutexLock l(&mu_);
    ++idle_relays_;
    slot.in_call = false;
    slot.queue.pop_front();
    if (!threw && !status.ok()) {
      // Work outside `next` may still run: the node keeps what it had
      // (or, for a grow, what it was given), so its record stays, nobody
      // else is granted those shards, and the change is asked for again.
      if (next.range.Covers(slot.active.range)) slot.active = next;
      slot.unconfirmed = true;  // Step asks again until one returns OK.
      ++stats_.update_failures;
      slot.retry_at = clock_->Now() + options_.poll_interval / 4;
      SPDLOG_LOGGER_WARN(logger_,
                         "node refused its new range, keeping its shards "
                         "node={} range={} still_working_on={}: {}",
                         slot.info.id, next.range, slot.active.range, status);
      wake_ = true;
      cv_.SignalAll();
      continue;
    }
    slot.active = next;
    slot.unconfirmed = false;
    ++stats_.updates_delivered;
    SPDLOG_LOGGER_DEBUG(logger_,
                        "shard range delivered node={} range={} token={}",
                        slot.info.id, next.range, next.token);
    if (threw && !next.range.Empty()) {
      // The node may not have taken the change in: treat it as failed, so
      // it is emptied, deregistered and restarted.
      slot.failed = true;
    }
    wake_ = true;
    cv_.SignalAll();
  }
}

}  // namespace setpoint
