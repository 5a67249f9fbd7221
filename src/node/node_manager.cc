#include "setpoint/node/node_manager.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "node/lease_protocol.h"
#include "node/node_slot.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/json.h"
#include "setpoint/base/status.h"
#include "spdlog/spdlog.h"

namespace setpoint {

NodeManager::NodeManager(NodeManagerOptions options)
    : options_(std::move(options)),
      pod_id_(options_.pod_id.empty() ? DefaultPodId() : options_.pod_id),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Monotonic()),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()) {
  fence_margin_ = EffectiveFenceMargin(options_);
}

NodeManager::~NodeManager() { Stop(); }

absl::Status NodeManager::Start() {
  if (absl::Status s = ValidateNodeManagerOptions(options_); !s.ok()) return s;
  {
    MutexLock l(&mu_);
    if (started_ || stopped_) {
      return absl::FailedPreconditionError(
          "start node manager: already started or stopped");
    }
    started_ = true;
  }
  // Create every node before starting any, so a failing factory starts
  // nothing.
  std::vector<std::unique_ptr<Slot>> slots;
  for (const NodeKindOptions& kind : options_.kinds) {
    for (int i = 0; i < kind.count; ++i) {
      auto slot = std::make_unique<Slot>();
      slot->info = NodeInfo{absl::StrCat(pod_id_, "/", kind.kind, "/", i),
                            kind.kind,
                            i,
                            kind.ring_size,
                            options_.metrics,
                            options_.updaters,
                            options_.loops,
                            options_.runners};
      try {
        slot->node = kind.factory(slot->info);
      } catch (const std::exception& e) {
        return absl::InternalError(
            absl::StrCat("start node manager: factory for ", slot->info.id,
                         " threw: ", e.what()));
      }
      if (slot->node == nullptr) {
        return absl::InternalError(
            absl::StrCat("start node manager: factory for ", slot->info.id,
                         " returned null"));
      }
      slots.push_back(std::move(slot));
    }
  }
  {
    // Under the lock: the pod's probes may already ask (PodMain starts its
    // listener first).
    MutexLock l(&mu_);
    slots_ = std::move(slots);
  }
  InitMetrics();
  listener_ = options_.registry->AddNoticeListener(
      [this](const ChangeNotice& notice) { Wake(notice); });
  for (auto& slot : slots_) {
    Slot* s = slot.get();
    absl::Status failed;
    {
      absl::StatusOr<bool> threadless =
          CallUserCode("threadless", [s] { return s->node->Threadless(); });
      MutexLock l(&mu_);
      s->threadless = threadless.ok() && *threadless;
    }
    if (s->threadless) {
      // Launched here, one after another: a node that needs no thread gets
      // none, and a thread only to restart it after a failure.
      failed = LaunchNode(*s);
      if (failed.ok()) continue;
    }
    s->run = std::jthread([this, s, failed](std::stop_token stop) {
      pthread_setname_np(pthread_self(), "sp-node");
      RunLoop(*s, stop, failed);
    });
  }
  relay_timer_ = std::jthread([this](std::stop_token stop) {
    pthread_setname_np(pthread_self(), "sp-relay-timer");
    RelayTimer(stop);
  });
  loop_ = std::jthread([this](std::stop_token stop) {
    pthread_setname_np(pthread_self(), "sp-registry");
    loop_id_.store(std::this_thread::get_id());
    Loop(stop);
  });
  SPDLOG_LOGGER_INFO(logger_, "node manager started pod={} nodes={}", pod_id_,
                     slots_.size());
  return absl::OkStatus();
}

void NodeManager::Stop() {
  {
    MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!started_) return;
    stopping_ = true;
    cv_.SignalAll();
  }
  // The loop hands the shards over and deregisters before it returns.
  if (loop_.joinable()) loop_.join();
  collector_.Reset();
  options_.registry->RemoveChangeListener(listener_);
  nodes_stop_.request_stop();
  for (auto& slot : slots_) slot->run.request_stop();
  relay_timer_.request_stop();
  std::vector<std::jthread> relays;
  {
    MutexLock l(&mu_);
    cv_.SignalAll();
  }
  if (relay_timer_.joinable()) relay_timer_.join();
  {
    // The timer no longer adds workers.
    MutexLock l(&mu_);
    for (auto& [id, r] : relays_) {
      r.request_stop();
      relays.push_back(std::move(r));
    }
    relays_.clear();
    cv_.SignalAll();
  }
  for (auto& slot : slots_) {
    if (slot->run.joinable()) slot->run.join();
  }
  // No restart loop runs any more: halt the launched threadless nodes.
  for (auto& slot : slots_) HaltNode(*slot);
  for (auto& r : relays) {
    if (r.joinable()) r.join();
  }
  SPDLOG_LOGGER_INFO(logger_, "node manager stopped pod={}", pod_id_);
}

void NodeManager::Wake(const ChangeNotice& notice) {
  // A change announcement: poll soon, within the nudge rate limit. One
  // that arrives on the protocol thread itself comes from our own write
  // (a registry that notifies synchronously): we know about it already.
  if (std::this_thread::get_id() == loop_id_.load()) return;
  MutexLock l(&mu_);
  // While the registry refuses grants (a new epoch), no change can be acted
  // on: the poll at grants_at_ sees them all.
  if (clock_->Now() < grants_at_) return;
  if (notice.view_current && notice.membership) {
    // Members came or went, and the registry's cached view has it: look
    // at that view instead of polling (its records of our own nodes are
    // ours, from our polls and handoffs). Within the nudge rate limit,
    // like a poll.
    ++stats_.views_from_notices;
    view_changed_ = true;
    nudge_arrived_ = true;
    cv_.SignalAll();
    return;
  }
  if (!notice.membership) {
    // Only releases or grants: the targets stand, so no poll is needed. A
    // node that waits to grow into freed shards asks again at once (one
    // handoff); everyone else ignores it (a cached view that took it in
    // shows it at the next look).
    for (const auto& [kind, freed] : notice.freed) {
      ShardSet& recent = freed_since_view_[kind];
      recent = recent.Union(freed);
    }
    // Someone's record crossed the even share and moved one of ours: look
    // at the cached view (it has the change).
    bool moved = false;
    if (notice.view_current) {
      for (const auto& [kind, list] : notice.resized) {
        auto watch = share_watch_.find(kind);
        if (watch == share_watch_.end()) continue;
        std::vector<ChangeNotice::Resized>& kept = resizes_[kind];
        for (const ChangeNotice::Resized& r : list) {
          moved = FollowResize(watch->second, r) || moved;
          if (r.seq > watch->second.seq) kept.push_back(r);
        }
        // Bounded: past it, a lost resize costs one look at the next poll.
        if (kept.size() > 1024) {
          kept.erase(kept.begin(), kept.begin() + 512);
        }
      }
    }
    for (const auto& [kind, freed] : notice.freed) {
      auto it = wants_.find(kind);
      if (it == wants_.end() || !it->second.Intersects(freed)) continue;
      // Within the nudge rate limit, like a poll: a flood of such messages
      // is a bounded number of handoffs. On the cached view when it has
      // the release; otherwise a poll reads it (a grant waits while the
      // view shows its shards held, see Apply).
      ++stats_.grant_retries;
      if (notice.view_current) {
        grant_retry_ = true;
        view_changed_ = true;
      } else {
        nudged_ = true;
      }
      nudge_arrived_ = true;
      cv_.SignalAll();
      return;
    }
    if (moved) {
      ++stats_.views_from_notices;
      view_changed_ = true;
      nudge_arrived_ = true;
      cv_.SignalAll();
    }
    return;
  }
  ++stats_.nudges;
  nudged_ = true;
  refusal_polled_ = false;
  nudge_arrived_ = true;
  cv_.SignalAll();
}

bool NodeManager::TakeNudgeToken(absl::Time now) {
  const double burst = options_.nudge_burst;
  const absl::Duration refill = options_.poll_interval / 10;
  if (nudge_refilled_ == absl::InfinitePast()) {
    nudge_tokens_ = burst;
  } else if (now > nudge_refilled_) {
    nudge_tokens_ =
        std::min(burst, nudge_tokens_ +
                            absl::FDivDuration(now - nudge_refilled_, refill));
  }
  nudge_refilled_ = now;
  if (nudge_tokens_ >= 1) {
    nudge_tokens_ -= 1;
    return true;
  }
  return false;
}

absl::Time NodeManager::FenceDeadline() const {
  return renewed_at_ + options_.lease - fence_margin_;
}

bool NodeManager::Working(const Slot& slot) {
  return !slot.active.range.Empty() ||
         (!slot.queue.empty() && !slot.queue.back().range.Empty());
}

bool NodeManager::NeedsFence(const Slot& slot) {
  // Working, and the empty range is not already on its way.
  return !slot.queue.empty() ? !slot.queue.back().range.Empty()
                             : !slot.active.range.Empty();
}

Context NodeManager::CallContext() {
  Context ctx =
      Context::Background(clock_).WithTimeout(options_.operation_timeout);
  MutexLock l(&mu_);
  // Past the deadline the relays are fencing already: the bound no longer
  // protects anyone, and a renewal may still help the pod re-join.
  if (clock_->Now() >= FenceDeadline()) return ctx;
  for (const auto& slot : slots_) {
    if (Working(*slot)) return ctx.WithDeadline(FenceDeadline());
  }
  return ctx;
}

std::vector<NodeState> NodeManager::Nodes() const {
  MutexLock l(&mu_);
  std::vector<NodeState> out;
  for (const auto& slot : slots_) {
    out.push_back(NodeState{slot->info.id, slot->info.kind, slot->active,
                            slot->registered, slot->running, slot->restarts,
                            drained_});
  }
  return out;
}

bool NodeManager::Idle() const {
  MutexLock l(&mu_);
  if (!waiting_ || wake_ || nudge_arrived_ || clock_->Now() >= wait_until_) {
    return false;
  }
  const absl::Time now = clock_->Now();
  for (const auto& slot : slots_) {
    // A failed node allowed to restart, whose run thread has not yet begun
    // its backoff on the clock (or just ended it).
    if (slot->restart_ok && !slot->backing_off) return false;
    // A relay waiting out a refusal's pause waits for the clock too.
    if (!slot->queue.empty() && (slot->in_call || now >= slot->retry_at)) {
      return false;
    }
  }
  return true;
}

NodeManagerStats NodeManager::stats() const {
  MutexLock l(&mu_);
  NodeManagerStats stats = stats_;
  stats.drained = drained_;
  return stats;
}

void NodeManager::Loop(std::stop_token stop) {
  while (true) {
    {
      MutexLock l(&mu_);
      if (stopping_) break;
    }
    Tick();
    MutexLock l(&mu_);
    last_tick_ = clock_->Now();
    while (true) {
      absl::Time now = clock_->Now();
      // One token per look, whether it polls (a membership change) or only
      // asks again for grants (freed shards): a poll's tick retries them too.
      if (nudged_ || grant_retry_ || view_changed_) {
        if (TakeNudgeToken(now)) {
          if (nudged_) poll_needed_ = true;
          refresh_view_ = refresh_view_ || view_changed_;
          wake_ = wake_ || grant_retry_ || view_changed_;
          nudged_ = false;
          grant_retry_ = false;
          view_changed_ = false;
        } else if (nudge_arrived_) {
          ++stats_.nudges_deferred;
        }
      }
      nudge_arrived_ = false;
      if (now >= next_poll_ ||
          (grants_at_ != absl::InfinitePast() && now >= grants_at_)) {
        poll_needed_ = true;
      }
      bool working = false;
      for (const auto& slot : slots_) working = working || NeedsFence(*slot);
      // Woken only because a node returned from UpdateShardRange (wake_):
      // act on the view of the last poll (kept up to date with our own
      // releases and grants) instead of spending a round trip.
      if (poll_needed_ || wake_ || stopping_ || stop.stop_requested() ||
          (working && now >= FenceDeadline())) {
        break;
      }
      absl::Time next = next_poll_;
      if (grants_at_ != absl::InfinitePast()) next = std::min(next, grants_at_);
      // Wake in time to fence if renewals keep failing (the relays fence
      // on their own too).
      if (working) next = std::min(next, FenceDeadline());
      if (nudged_ || grant_retry_ || view_changed_) {
        next =
            std::min(next, nudge_refilled_ + (1 - nudge_tokens_) *
                                                 (options_.poll_interval / 10));
      }
      waiting_ = true;
      wait_until_ = next;
      clock_->AwaitWithDeadline(&mu_, &cv_, next, stop,
                                [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                                  return wake_ || stopping_ || nudge_arrived_;
                                });
      waiting_ = false;
    }
    wake_ = false;
  }
  GracefulLeave();
}

void NodeManager::Tick() {
  // A process that was frozen (SIGSTOP, a long GC-like pause, a slow VM)
  // must stop before it spends a round trip on polling.
  SelfFence();
  PollRequest request{.lease = options_.lease,
                      .min_version = max_version_,
                      .min_tokens = max_tokens_,
                      .own_held_only = false,
                      .cached_view_ok = true};
  bool poll, refresh;
  {
    MutexLock l(&mu_);
    for (const auto& slot : slots_) {
      if (slot->registered) {
        request.kinds[slot->info.kind].push_back(slot->info.id);
        request.ring_sizes[slot->info.kind] = slot->info.ring_size;
      }
    }
    poll = poll_needed_ || !last_view_.has_value();
    poll_needed_ = false;
    // A poll reads the changes too.
    refresh = refresh_view_ && !poll;
    refresh_view_ = false;
    // The view read now holds every release announced so far.
    if (poll || refresh) freed_since_view_.clear();
    // Every tick tries the grants that wait, so it answers a retry too.
    grant_retry_ = false;
    if (poll) {
      // This poll answers every announcement so far.
      nudged_ = false;
      next_poll_ = clock_->Now() + options_.poll_interval;
      if (clock_->Now() >= grants_at_) grants_at_ = absl::InfinitePast();
    }
  }
  if (refresh) {
    RefreshFromCache();
    SelfFence();
    return;
  }
  if (!poll) {
    std::vector<Move> moves;
    for (auto& [kind, view] : last_view_->kinds) {
      for (auto& slot : slots_) {
        if (slot->info.kind != kind) continue;
        {
          MutexLock l(&mu_);
          if (!slot->registered) continue;
        }
        if (auto m = Step(*slot, view, last_targets_[kind][slot->info.id])) {
          moves.push_back(*m);
        }
      }
    }
    Apply(moves);
    SelfFence();
    return;
  }
  Context ctx = CallContext();
  absl::Time sent = clock_->Now();
  absl::StatusOr<PollResult> result;
  if (!request.kinds.empty()) {
    const auto start = std::chrono::steady_clock::now();
    result = options_.registry->Poll(ctx, request);
    if (poll_duration_ != nullptr) {
      poll_duration_->Observe(std::chrono::duration<double>(
                                  std::chrono::steady_clock::now() - start)
                                  .count());
    }
    CountError("poll", result.status());
  } else {
    result = PollResult{};
  }
  std::optional<absl::Time> report;
  {
    MutexLock l(&mu_);
    ++stats_.polls;
    if (!result.ok()) {
      int64_t failures = ++stats_.poll_failures;
      ++failure_streak_;
      last_poll_error_ = result.status().ToString();
      absl::Time now = clock_->Now();
      if (failure_streak_ == 1 ||
          now - last_failure_log_ >= absl::Seconds(10)) {
        last_failure_log_ = now;
        SPDLOG_LOGGER_WARN(logger_,
                           "registry poll failed pod={} failures={} "
                           "in_a_row={}: {}",
                           pod_id_, failures, failure_streak_, result.status());
      }
    } else if (!request.kinds.empty()) {
      failure_streak_ = 0;
      // Sent after the deadline: the pod was without a lease for a while
      // (frozen, cut off), and others may have taken its shards.
      bool missed =
          renewed_at_ != absl::InfinitePast() && sent >= FenceDeadline();
      renewed_at_ = sent;
      if (missed) {
        FenceAll("the lease lapsed before this renewal (frozen or cut off)");
      }
      if (result->epoch != epoch_) {
        if (!epoch_.empty()) {
          ++stats_.epoch_changes;
          FenceAll("the registry's state is new (it forgot or went back)");
        }
        epoch_ = result->epoch;
      }
      max_version_ = std::max(max_version_, result->version);
      // Drained: the targets below leave this pod's nodes out, so they
      // shrink to the empty range by the usual path.
      const bool drained = result->drained.contains(pod_id_);
      if (drained != drained_) {
        if (drained) {
          SPDLOG_LOGGER_INFO(logger_,
                             "pod drained, its nodes hand their shards over "
                             "pod={}",
                             pod_id_);
        } else {
          SPDLOG_LOGGER_INFO(logger_,
                             "pod undrained, its nodes take a share again "
                             "pod={}",
                             pod_id_);
        }
        drained_ = drained;
      }
      // Grants refused for a while (a new epoch): poll again the moment
      // they are allowed (measured from when the answer came, so never
      // early), and ignore nudges until then.
      grants_at_ = absl::InfinitePast();
      if (result->grants_from > result->server_time &&
          result->server_time != absl::InfinitePast()) {
        grants_at_ =
            clock_->Now() + (result->grants_from - result->server_time);
      }
      bool fencing = false;
      for (auto& slot : slots_) {
        if (slot->lease_fenced && !Working(*slot) && slot->queue.empty()) {
          slot->lease_fenced = false;  // Stopped in time; may re-join.
        } else if (slot->lease_fenced && slot->queue.empty()) {
          // The node refused the empty range: ask again (the relay waits
          // out its pause first).
          slot->queue.push_back(Assignment{});
          cv_.SignalAll();
        }
        fencing = fencing || slot->lease_fenced;
      }
      if (!fencing) report = sent + options_.lease - fence_margin_;
    }
  }
  if (report.has_value() && options_.on_lease_renewed) {
    options_.on_lease_renewed(*report);
  }
  if (result.ok()) {
    std::optional<PollResult> previous = std::move(last_view_);
    std::map<std::string, KindDelta> deltas;
    // Views read whole by this poll stand nowhere in the cache's history.
    for (const auto& [kind, view] : result->kinds) {
      if (!result->from_cache.contains(kind)) view_marks_.erase(kind);
    }
    if (!FillFromCache(previous, request, *result, &deltas)) {
      // The cache went away under us (someone else's poll dropped it):
      // act on nothing until a poll reads everything.
      view_marks_.clear();
      {
        MutexLock l(&mu_);
        poll_needed_ = true;
      }
      SelfFence();
      return;
    }
    last_view_ = std::move(*result);
    if (!predecessor_checked_) {
      predecessor_checked_ = true;
      DropPredecessorsExtraPlaces();
    }
    DeltasSince(previous, &deltas);
    Retarget(deltas, std::move(last_targets_));
  } else {
    last_view_.reset();  // Act only on a fresh view once polls work again.
    view_marks_.clear();
  }
  SelfFence();
}

void NodeManager::Retarget(
    const std::map<std::string, KindDelta>& deltas,
    std::map<std::string, std::map<std::string, ShardSet>> previous_targets) {
  last_targets_.clear();
  for (const auto& [kind, view] : last_view_->kinds) {
    uint64_t& seen = max_tokens_[kind];
    auto delta = deltas.find(kind);
    if (delta != deltas.end() && delta->second.max_token.has_value()) {
      seen = std::max(seen, *delta->second.max_token);
      continue;
    }
    for (const auto& [id, a] : view.held) seen = std::max(seen, a.token);
  }
  std::vector<Move> moves;
  for (auto& [kind, view] : last_view_->kinds) {
    const uint32_t ring = RingSize(kind);
    // Each node's target as AssignShards gives it over the ids that
    // share the ring and what every live member holds: every pod that
    // saw the same state computes the same targets.
    // Nothing changed since the view before (the steady state): the same
    // targets, without computing them for the whole fleet again.
    auto delta = deltas.find(kind);
    auto was_targets = previous_targets.find(kind);
    const bool same = delta != deltas.end() && delta->second.same &&
                      was_targets != previous_targets.end();
    // Only others' releases and grants changed: the handoff under way goes
    // on for the reason it began.
    if (!same && delta != deltas.end() && delta->second.why != "none") {
      move_reasons_[kind] = delta->second.why;
    }
    std::vector<std::string> own;
    for (const auto& slot : slots_) {
      if (slot->info.kind == kind) own.push_back(slot->info.id);
    }
    absl::flat_hash_map<std::string, ShardSet> targets;
    SharePlaces places;
    if (!same) {
      targets = KindTargets(view, last_view_->drained, ring, own, &places);
      WatchShares(kind, own, places);
    }
    for (auto& slot : slots_) {
      if (slot->info.kind != kind) continue;
      {
        MutexLock l(&mu_);
        if (!slot->registered) continue;
      }
      ShardSet target;
      if (same) {
        if (auto it = was_targets->second.find(slot->info.id);
            it != was_targets->second.end()) {
          target = it->second;
        } else {
          targets = KindTargets(view, last_view_->drained, ring, own, &places);
          WatchShares(kind, own, places);
        }
      }
      if (!same || !targets.empty()) {
        if (auto it = targets.find(slot->info.id); it != targets.end()) {
          target = it->second;
        }
      }
      last_targets_[kind][slot->info.id] = target;
      if (auto m = Step(*slot, view, target)) moves.push_back(*m);
    }
  }
  Apply(moves);
}

void NodeManager::SelfFence() {
  // Stop before the lease can expire for the others. The relays do the
  // same on their own timers; whoever looks first fences.
  MutexLock l(&mu_);
  if (renewed_at_ == absl::InfinitePast() || clock_->Now() < FenceDeadline()) {
    return;
  }
  for (auto& slot : slots_) Fence(*slot, "lease not renewed in time");
}

void NodeManager::Fence(Slot& slot, const char* why) {
  if (!NeedsFence(slot)) return;
  // The empty range supersedes whatever the relay has not started.
  if (slot.in_call) {
    slot.queue.erase(slot.queue.begin() + 1, slot.queue.end());
  } else {
    slot.queue.clear();
  }
  slot.queue.push_back(Assignment{});
  if (!slot.lease_fenced) {  // Not again for a node that refused it.
    ++stats_.fences;
    SPDLOG_LOGGER_WARN(logger_,
                       "node stops working node={} range={} token={}: {}",
                       slot.info.id, slot.active.range, slot.active.token, why);
  }
  slot.lease_fenced = true;
  cv_.SignalAll();
}

std::optional<NodeManager::Move> NodeManager::Step(Slot& slot, KindView& view,
                                                   ShardSet target) {
  const std::string& id = slot.info.id;
  auto held_it = view.held.find(id);
  std::optional<Assignment> held;
  if (held_it != view.held.end()) held = held_it->second;
  using lease_protocol::Decision;
  Decision d;
  {
    MutexLock l(&mu_);
    d = lease_protocol::Decide(
        lease_protocol::NodeFacts{
            .active = slot.active,
            .relay_busy = !slot.queue.empty() || stopping_,
            .lease_fenced = slot.lease_fenced,
            .failed = slot.failed,
            .unconfirmed = slot.unconfirmed,
        },
        held, target);
    switch (d.kind) {
      case Decision::Kind::kNothing:
      case Decision::Kind::kRegistry:
        break;
      case Decision::Kind::kStop:
        SPDLOG_LOGGER_WARN(logger_,
                           "registry record differs from what the node holds "
                           "node={} holds={} token={} recorded={} "
                           "recorded_token={}",
                           id, slot.active.range, slot.active.token,
                           held ? held->range.ToString() : "nothing",
                           held ? held->token : 0);
        Fence(slot, "the registry's record differs from what the node holds");
        break;
      case Decision::Kind::kAskAgain:
        Deliver(slot, d.update);
        break;
      case Decision::Kind::kShrink:
        SPDLOG_LOGGER_INFO(logger_,
                           "shard range shrinking node={} from={} to={} "
                           "reason={}",
                           id, slot.active.range, d.update.range,
                           Reason(slot.info.kind));
        Deliver(slot, d.update);
        break;
    }
  }
  if (d.kind != Decision::Kind::kRegistry) return std::nullopt;
  return Move{.slot = &slot,
              .view = &view,
              .release = d.release,
              .grant = d.grant,
              .deregister = d.deregister};
}

void NodeManager::Apply(std::vector<Move>& moves) {
  HandoffRequest request;
  std::vector<Move*> batched;
  for (Move& m : moves) {
    const std::string& id = m.slot->info.id;
    const std::string& kind = m.slot->info.kind;
    if (m.deregister) {
      absl::Status s = options_.registry->Deregister(CallContext(), kind, {id});
      CountError("deregister", s);
      MutexLock l(&mu_);
      if (s.ok()) {
        m.view->held.erase(id);
        poll_needed_ = true;
        m.slot->registered = false;
        m.slot->restart_ok = true;
        cv_.SignalAll();
      } else {
        SPDLOG_LOGGER_WARN(logger_, "deregister failed node={}: {}", id, s);
      }
      continue;
    }
    if (m.release.has_value()) {
      request.releases.push_back({kind, id, *m.release});
    }
    batched.push_back(&m);
  }
  // A grant into shards that the view shows another member still holding
  // would be refused: the registry checks every record for it, the most
  // costly thing a handoff does. It waits instead, for the release that
  // frees them (announced, and then asked for again at once) or for the
  // next poll. The registry still decides; the view only saves asking when
  // the answer is known.
  std::map<std::string, ShardSet> waiting;
  int64_t waited = 0;
  for (Move* m : batched) {
    if (!m->grant.has_value()) continue;
    if (HeldByOthers(*m, request.releases)) {
      ShardSet& w = waiting[m->slot->info.kind];
      w = w.Union(*m->grant);
      m->grant.reset();
      ++waited;
      continue;
    }
    request.grants.push_back({m->slot->info.kind, m->slot->info.id, *m->grant});
  }
  std::erase_if(batched, [](const Move* m) {
    return !m->grant.has_value() && !m->release.has_value();
  });
  {
    // From now on a release that frees any of these shards makes us ask
    // again, even one announced before our reply comes back.
    MutexLock l(&mu_);
    stats_.grants_waited += waited;
    // A release announced after the view was read frees what the view
    // shows held: look again at once rather than wait for the next one.
    for (const auto& [kind, shards] : waiting) {
      auto it = freed_since_view_.find(kind);
      if (it != freed_since_view_.end() && it->second.Intersects(shards)) {
        grant_retry_ = true;
        view_changed_ = true;
        nudge_arrived_ = true;
      }
    }
    wants_ = std::move(waiting);
    for (const auto& g : request.grants) {
      wants_[g.kind] = wants_[g.kind].Union(g.target);
    }
  }
  if (batched.empty()) return;
  request.epoch = last_view_->epoch;
  absl::StatusOr<HandoffResult> result =
      options_.registry->Handoff(CallContext(), request);
  CountError("handoff", result.status());
  if (!result.ok()) {
    // Some of it may have happened (a lost reply): the next poll shows
    // what the registry records, and a node whose record differs stops.
    MutexLock l(&mu_);
    poll_needed_ = true;
    SPDLOG_LOGGER_WARN(
        logger_, "handoff failed pod={} releases={} grants={}: {}", pod_id_,
        request.releases.size(), request.grants.size(), result.status());
    return;
  }
  size_t next_release = 0, next_grant = 0;
  std::set<std::string> moved_kinds;
  for (Move* m : batched) {
    Slot& slot = *m->slot;
    KindView& view = *m->view;
    const std::string& id = slot.info.id;
    if (m->release.has_value()) {
      const Assignment& active = *m->release;
      const absl::Status& s = result->releases[next_release++];
      CountError("release", s);
      MutexLock l(&mu_);
      if (s.ok()) {
        // Keep the cached view true to what we just wrote.
        if (active.range.Empty()) {
          view.held.erase(id);
        } else {
          view.held[id] = active;
        }
        ++stats_.releases;
        share_watch_[slot.info.kind].valid = false;
        moved_kinds.insert(slot.info.kind);
        SPDLOG_LOGGER_INFO(logger_,
                           "shard range released node={} kept={} reason={}", id,
                           active.range, Reason(slot.info.kind));
      } else if (absl::IsFailedPrecondition(s)) {
        // The record is not what the node holds: stop now, release it all
        // at the next step.
        Fence(slot, "release refused: the record differs");
        view.held.erase(id);
        SPDLOG_LOGGER_WARN(logger_, "release refused node={} range={}: {}", id,
                           active.range, s);
      } else {
        SPDLOG_LOGGER_WARN(logger_, "release failed node={} range={}: {}", id,
                           active.range, s);
      }
    }
    if (m->grant.has_value()) {
      const ShardSet target = *m->grant;
      const absl::StatusOr<uint64_t>& token = result->grants[next_grant++];
      if (!absl::IsAborted(token.status())) CountError("grant", token.status());
      MutexLock l(&mu_);
      if (token.ok()) {
        ShardSet& wants = wants_[slot.info.kind];
        wants = wants.Minus(target);
        max_tokens_[slot.info.kind] =
            std::max(max_tokens_[slot.info.kind], *token);
        view.held[id] = Assignment{target, *token};
        ++stats_.grants;
        share_watch_[slot.info.kind].valid = false;
        moved_kinds.insert(slot.info.kind);
        refusal_polled_ = false;
        SPDLOG_LOGGER_INFO(logger_,
                           "shard range granted node={} range={} token={} "
                           "reason={}",
                           id, target, *token, Reason(slot.info.kind));
        Deliver(slot, Assignment{target, *token});
      } else if (absl::IsAborted(token.status())) {
        ++stats_.grant_conflicts;
        // Grants are open as far as we know, so our view of who holds what
        // may be behind (targets follow what everyone holds): look again
        // soon, within the nudge rate limit, unless a release frees the
        // shards first.
        // Once per streak of refusals: a grant that keeps waiting (for a
        // node that does not let go) costs no more polls than the interval.
        if (clock_->Now() >= grants_at_ && !refusal_polled_) {
          refusal_polled_ = true;
          nudged_ = true;
        }
        SPDLOG_LOGGER_DEBUG(logger_, "grant refused for now node={}: {}", id,
                            token.status());
      } else {
        // The grant may have happened all the same (a lost reply): the
        // next poll shows a record that differs, and the node stops.
        poll_needed_ = true;
        SPDLOG_LOGGER_WARN(logger_, "grant failed node={} range={}: {}", id,
                           target, token.status());
      }
    }
  }
  // Our own records moved: so did our places (others hear of it, we do
  // not). Where our nodes stand now, on the view with our writes in it.
  for (const std::string& kind : moved_kinds) {
    auto view = last_view_->kinds.find(kind);
    if (view == last_view_->kinds.end()) continue;
    std::vector<std::string> own;
    for (const auto& slot : slots_) {
      if (slot->info.kind == kind) own.push_back(slot->info.id);
    }
    SharePlaces places;
    (void)KindTargets(view->second, last_view_->drained, RingSize(kind), own,
                      &places);
    WatchShares(kind, own, places);
  }
}

const std::string& NodeManager::Reason(const std::string& kind) const {
  static const std::string kNone = "none";
  auto it = move_reasons_.find(kind);
  return it != move_reasons_.end() ? it->second : kNone;
}

void NodeManager::Deliver(Slot& slot, Assignment assignment) {
  slot.queue.push_back(assignment);
  cv_.SignalAll();
}

void NodeManager::FenceAll(const char* why) {
  for (auto& slot : slots_) Fence(*slot, why);
}

}  // namespace setpoint
