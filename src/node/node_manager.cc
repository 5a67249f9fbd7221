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
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/json.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/updater_pool.h"
#include "spdlog/spdlog.h"

namespace setpoint {

// One node and what the manager knows about it. The fields below `node` are
// guarded by NodeManager::mu_ (a nested struct cannot name it for the
// analysis).
struct NodeManager::Slot {
  NodeInfo info;
  std::unique_ptr<Node> node;
  // Last assignment UpdateShardRange returned from.
  Assignment active;
  // Assignments waiting for the relay; the front one may be running.
  std::deque<Assignment> queue;
  // Included in polls (false while a failed node waits to restart).
  bool registered = true;
  // Run failed: being fenced and deregistered before the restart.
  bool failed = false;
  // Fenced and deregistered; the run thread may restart Run.
  bool restart_ok = false;
  // Fenced (renewals failed, the lease lapsed, the record differed or the
  // state is new): the empty range was queued, and the node waits for a
  // renewal in time before it may be granted anything again.
  bool lease_fenced = false;
  // The relay is inside UpdateShardRange with queue.front(), since
  // call_started.
  bool in_call = false;
  absl::Time call_started = absl::InfinitePast();
  // The node refused its last update: the relay waits until then.
  absl::Time retry_at = absl::InfinitePast();
  // The node refused its last update and has not returned OK since: what
  // it works on is somewhere between `active` and what it was asked for.
  bool unconfirmed = false;
  bool running = false;
  int restarts = 0;
  std::jthread run;
};

namespace {

// Relay workers started at once when updates wait; past that, one more
// only when every worker has been inside UpdateShardRange this long.
constexpr int kRelays = 4;
constexpr absl::Duration kRelayStuck = absl::Milliseconds(20);
// ...and those beyond kRelays leave after idling this long.
constexpr absl::Duration kRelayIdle = absl::Seconds(1);

absl::Status Invalid(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "node manager options: ", absl::string_view(field.data(), field.size()),
      " ", absl::string_view(what.data(), what.size())));
}

}  // namespace

absl::Duration EffectiveFenceMargin(const NodeManagerOptions& o) {
  return o.fence_margin > absl::ZeroDuration()
             ? o.fence_margin
             : std::max(o.lease / 5, o.poll_interval);
}

std::string DefaultPodId() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof(host), "pod");
  }
  std::string id = absl::StrCat(host, "-", getpid());
  std::replace(id.begin(), id.end(), '/', '_');
  return id;
}

absl::Status ValidateNodeManagerOptions(const NodeManagerOptions& o) {
  if (o.registry == nullptr) return Invalid("registry", "is required");
  if (o.updater_threads < 0) {
    return Invalid("updater_threads",
                   absl::StrCat("must be >= 0, got ", o.updater_threads));
  }
  if (o.pod_id.find('/') != std::string::npos) {
    return Invalid(
        "pod_id", absl::StrCat("must not contain '/', got \"", o.pod_id, "\""));
  }
  if (o.kinds.empty()) return Invalid("kinds", "must name at least one kind");
  std::set<std::string> seen;
  for (size_t i = 0; i < o.kinds.size(); ++i) {
    const NodeKindOptions& k = o.kinds[i];
    std::string field = absl::StrCat("kinds[", i, "]");
    if (k.kind.empty()) return Invalid(field + ".kind", "must not be empty");
    if (k.kind.find('/') != std::string::npos) {
      return Invalid(
          field + ".kind",
          absl::StrCat("must not contain '/', got \"", k.kind, "\""));
    }
    if (!seen.insert(k.kind).second) {
      return Invalid(field + ".kind",
                     absl::StrCat("\"", k.kind,
                                  "\" appears twice: node ids would repeat"));
    }
    if (k.count <= 0) {
      return Invalid(field + ".count",
                     absl::StrCat("must be > 0, got ", k.count));
    }
    if (k.ring_size == 0) return Invalid(field + ".ring_size", "must be > 0");
    if (k.factory == nullptr) return Invalid(field + ".factory", "is required");
  }
  if (o.poll_interval <= absl::ZeroDuration()) {
    return Invalid("poll_interval", "must be > 0");
  }
  if (o.lease <= o.poll_interval) {
    return Invalid("lease",
                   absl::StrCat("(", absl::FormatDuration(o.lease),
                                ") must be > poll_interval (",
                                absl::FormatDuration(o.poll_interval), ")"));
  }
  if (o.fence_margin < absl::ZeroDuration() || o.fence_margin >= o.lease) {
    return Invalid("fence_margin", "must be >= 0 and < lease");
  }
  // The nodes must be able to work between two renewals: a margin that
  // leaves less than one poll interval fences on every cycle.
  const absl::Duration margin = EffectiveFenceMargin(o);
  if (o.lease - margin <= o.poll_interval) {
    return Invalid(
        "fence_margin",
        absl::StrCat("(", absl::FormatDuration(margin),
                     o.fence_margin > absl::ZeroDuration()
                         ? ""
                         : ", the default max(20% of lease, poll_interval)",
                     ") must leave more than poll_interval (",
                     absl::FormatDuration(o.poll_interval), ") of the lease (",
                     absl::FormatDuration(o.lease),
                     "); raise lease or lower the margin"));
  }
  if (o.operation_timeout <= absl::ZeroDuration()) {
    return Invalid("operation_timeout", "must be > 0");
  }
  if (o.nudge_burst <= 0) {
    return Invalid("nudge_burst",
                   absl::StrCat("must be > 0, got ", o.nudge_burst));
  }
  if (absl::Status s = ValidateBackoffOptions(o.restart_backoff); !s.ok()) {
    return Invalid("restart_backoff", std::string(s.message()));
  }
  return absl::OkStatus();
}

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
  if (fence_margin_ >= options_.lease) {
    return Invalid("fence_margin",
                   "(poll_interval, the default margin) must be < lease");
  }
  {
    MutexLock l(&mu_);
    if (started_ || stopped_) {
      return absl::FailedPreconditionError(
          "start node manager: already started or stopped");
    }
    started_ = true;
  }
  if (options_.updater_threads > 0) {
    updaters_ = std::make_unique<UpdaterPool>(
        UpdaterPoolOptions{.name = pod_id_ + "/updaters",
                           .threads = options_.updater_threads,
                           .logger = logger_});
    if (absl::Status s = updaters_->Start(); !s.ok()) {
      return Annotate(s, "start node manager");
    }
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
                            updaters_.get()};
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
    s->run = std::jthread([this, s](std::stop_token stop) {
      pthread_setname_np(pthread_self(), "sp-node");
      RunLoop(*s, stop);
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
  for (auto& r : relays) {
    if (r.joinable()) r.join();
  }
  // Every node's Run has returned, and with it its syncers stopped.
  if (updaters_ != nullptr) updaters_->Stop();
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
  if (!notice.membership) {
    // Only releases: the targets stand, so no poll is needed. A node that
    // waits to grow into freed shards asks again at once (one handoff, on
    // the view of the last poll); everyone else ignores it.
    for (const auto& [kind, freed] : notice.freed) {
      auto it = wants_.find(kind);
      if (it == wants_.end() || !it->second.Intersects(freed)) continue;
      // Within the nudge rate limit, like a poll: a flood of such messages
      // is a bounded number of handoffs.
      ++stats_.grant_retries;
      grant_retry_ = true;
      nudge_arrived_ = true;
      cv_.SignalAll();
      return;
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
      if (nudged_ || grant_retry_) {
        if (TakeNudgeToken(now)) {
          if (nudged_) poll_needed_ = true;
          wake_ = wake_ || grant_retry_;
          nudged_ = false;
          grant_retry_ = false;
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
      if (nudged_ || grant_retry_) {
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
                      .own_held_only = false};
  bool poll;
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
    // Every tick tries the grants that wait, so it answers a retry too.
    grant_retry_ = false;
    if (poll) {
      // This poll answers every announcement so far.
      nudged_ = false;
      next_poll_ = clock_->Now() + options_.poll_interval;
      if (clock_->Now() >= grants_at_) grants_at_ = absl::InfinitePast();
    }
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
    std::map<std::string, std::map<std::string, ShardSet>> previous_targets =
        std::move(last_targets_);
    last_view_ = std::move(*result);
    last_targets_.clear();
    for (const auto& [kind, view] : last_view_->kinds) {
      uint64_t& seen = max_tokens_[kind];
      for (const auto& [id, a] : view.held) seen = std::max(seen, a.token);
    }
    std::vector<Move> moves;
    for (auto& [kind, view] : last_view_->kinds) {
      uint32_t ring = kDefaultRingSize;
      for (const auto& k : options_.kinds) {
        if (k.kind == kind) ring = k.ring_size;
      }
      // Each node's target as AssignShards gives it over the ids that
      // share the ring and what every live member holds: every pod that
      // saw the same state computes the same targets.
      // Nothing changed since the last poll (the steady state): the same
      // targets, without computing them for the whole fleet again.
      auto was = previous.has_value() ? previous->kinds.find(kind)
                                      : decltype(previous->kinds.end()){};
      auto was_targets = previous_targets.find(kind);
      const bool same = previous.has_value() && was != previous->kinds.end() &&
                        was_targets != previous_targets.end() &&
                        previous->drained == last_view_->drained &&
                        was->second.members == view.members &&
                        was->second.held == view.held;
      std::vector<std::string> own;
      for (const auto& slot : slots_) {
        if (slot->info.kind == kind) own.push_back(slot->info.id);
      }
      absl::flat_hash_map<std::string, ShardSet> targets;
      if (!same) targets = KindTargets(view, last_view_->drained, ring, own);
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
            targets = KindTargets(view, last_view_->drained, ring, own);
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
  } else {
    last_view_.reset();  // Act only on a fresh view once polls work again.
  }
  SelfFence();
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

  Assignment active;
  bool failed;
  {
    MutexLock l(&mu_);
    if (!slot.queue.empty() || stopping_)
      return std::nullopt;                       // Wait for the relay.
    if (slot.lease_fenced) return std::nullopt;  // Until a renewal in time.
    active = slot.active;
    failed = slot.failed;
    if (failed) target = ShardSet{};
    // The registry must record exactly what the node works on: its token,
    // and a range that covers it (larger only between a shrink and its
    // release). Anything else (the record expired, someone rewrote it, a
    // grant whose reply was lost) means others may be granted these
    // shards: stop at once.
    if (!active.range.Empty() &&
        (!held.has_value() || held->token != active.token ||
         !held->range.Covers(active.range))) {
      SPDLOG_LOGGER_WARN(logger_,
                         "registry record differs from what the node holds "
                         "node={} holds={} token={} recorded={} "
                         "recorded_token={}",
                         id, active.range, active.token,
                         held ? held->range.ToString() : "nothing",
                         held ? held->token : 0);
      Fence(slot, "the registry's record differs from what the node holds");
      return std::nullopt;
    }
    // 0. A refused change is asked for again, towards the target, until
    //    the node confirms one (even if the target moved back meanwhile).
    if (slot.unconfirmed) {
      Deliver(slot, Assignment{active.range.Intersect(target), active.token});
      return std::nullopt;
    }
    // 1. Shrink first: the node stops outside the target before anything
    //    is published.
    if (!target.Covers(active.range)) {
      Assignment smaller{active.range.Intersect(target), active.token};
      SPDLOG_LOGGER_INFO(logger_, "shard range shrinking node={} from={} to={}",
                         id, active.range, smaller.range);
      Deliver(slot, smaller);
      return std::nullopt;
    }
  }
  Move move;
  move.slot = &slot;
  move.view = &view;
  // 2. Publish the release once the node works on less than it holds, and
  //    grow in the same round trip if it now works inside its target.
  if (held.has_value() && held->range != active.range) {
    move.release = active;
    if (!failed && !target.Empty() && active.range != target) {
      move.grant = target;
    }
    return move;
  }
  // A failed node leaves the ring so the others take its shards.
  if (failed) {
    move.deregister = true;
    return move;
  }
  // 3. Grow only into shards nobody else holds.
  if (!target.Empty() && active.range != target) {
    move.grant = target;
    return move;
  }
  return std::nullopt;
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
    if (m.grant.has_value()) request.grants.push_back({kind, id, *m.grant});
    batched.push_back(&m);
  }
  {
    // From now on a release that frees any of these shards makes us ask
    // again, even one announced before our reply comes back.
    MutexLock l(&mu_);
    wants_.clear();
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
        SPDLOG_LOGGER_INFO(logger_, "shard range released node={} kept={}", id,
                           active.range);
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
        refusal_polled_ = false;
        SPDLOG_LOGGER_INFO(logger_,
                           "shard range granted node={} range={} token={}", id,
                           target, *token);
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
}

void NodeManager::Deliver(Slot& slot, Assignment assignment) {
  slot.queue.push_back(assignment);
  cv_.SignalAll();
}

void NodeManager::FenceAll(const char* why) {
  for (auto& slot : slots_) Fence(*slot, why);
}

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
    bool threw = false;
    absl::Status status;
    const auto call_start = std::chrono::steady_clock::now();
    try {
      status = slot.node->UpdateShardRange(call_ctx, next);
      if (handoff_duration_ != nullptr) {
        handoff_duration_->Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                          call_start)
                .count());
      }
    } catch (const std::exception& e) {
      threw = true;
      SPDLOG_LOGGER_ERROR(logger_,
                          "UpdateShardRange threw node={} range={}: {}",
                          slot.info.id, next.range, e.what());
    } catch (...) {
      threw = true;
      SPDLOG_LOGGER_ERROR(logger_,
                          "UpdateShardRange threw a non-exception node={} "
                          "range={}",
                          slot.info.id, next.range);
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

void NodeManager::RunLoop(Slot& slot, std::stop_token stop) {
  const Context ctx(nodes_stop_.get_token(), clock_);
  Backoff backoff(options_.restart_backoff);
  while (true) {
    {
      MutexLock l(&mu_);
      slot.running = true;
    }
    absl::Status status;
    try {
      status = slot.node->Run(ctx);
    } catch (const std::exception& e) {
      status = absl::InternalError(absl::StrCat("run threw: ", e.what()));
    } catch (...) {
      status = absl::InternalError("run threw a non-exception");
    }
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
    mu_.Unlock();
    bool waited = clock_->SleepFor(wait, stop);
    mu_.Lock();
    if (!waited) return;
    slot.failed = false;
    slot.restart_ok = false;
    slot.registered = true;
    poll_needed_ = true;
    wake_ = true;
    cv_.SignalAll();
  }
}

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
  for (const auto& [kind, ids] : leave) {
    absl::Status s = options_.registry->Deregister(
        Context::Background(clock_).WithTimeout(options_.operation_timeout),
        kind, ids);
    if (!s.ok()) {
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

}  // namespace setpoint

namespace setpoint {

namespace {

const char* CodeLabel(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
      return "unavailable";
    case absl::StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case absl::StatusCode::kDataLoss:
      return "data_loss";
    case absl::StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case absl::StatusCode::kAborted:
      return "aborted";
    case absl::StatusCode::kCancelled:
      return "cancelled";
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    default:
      return "other";
  }
}

}  // namespace

void NodeManager::InitMetrics() {
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) return;
  const MetricLabels pod = {{"pod", pod_id_}};
  poll_duration_ =
      &m->GetHistogram("setpoint_registry_poll_duration_seconds",
                       "How long registry polls (lease renewals) took.", pod,
                       Histogram::DurationBuckets());
  handoff_duration_ = &m->GetHistogram(
      "setpoint_node_handoff_duration_seconds",
      "How long nodes took to take a new range (UpdateShardRange).", pod,
      Histogram::DurationBuckets());
  collector_ = m->AddCollector([this](MetricWriter& w) { CollectMetrics(w); });
}

void NodeManager::CountError(const char* op, const absl::Status& s) {
  if (s.ok() || options_.metrics == nullptr) return;
  options_.metrics
      ->GetCounter(
          "setpoint_registry_errors_total",
          "Registry calls that failed, by operation and code.",
          {{"pod", pod_id_}, {"op", op}, {"code", CodeLabel(s.code())}})
      .Increment();
}

void NodeManager::CollectMetrics(MetricWriter& w) const {
  const MetricLabels pod = {{"pod", pod_id_}};
  MutexLock l(&mu_);
  const NodeManagerStats& st = stats_;
  const std::pair<const char*, std::pair<const char*, int64_t>> counters[] = {
      {"setpoint_registry_polls_total",
       {"Registry polls (lease renewals) sent.", st.polls}},
      {"setpoint_registry_poll_failures_total",
       {"Registry polls that failed.", st.poll_failures}},
      {"setpoint_node_grants_total",
       {"Shard ranges granted to this pod's nodes.", st.grants}},
      {"setpoint_node_grant_conflicts_total",
       {"Grants refused for now (shards still held, epoch grace).",
        st.grant_conflicts}},
      {"setpoint_node_releases_total",
       {"Shard releases published.", st.releases}},
      {"setpoint_node_self_fences_total",
       {"Nodes stopped at once: renewals failed, the lease lapsed, the "
        "record differed or the registry's state was new.",
        st.fences}},
      {"setpoint_registry_epoch_changes_total",
       {"Times the registry's state was new (restart, restore, failover).",
        st.epoch_changes}},
      {"setpoint_node_restarts_total",
       {"Node restarts after a failed Run.", st.restarts}},
      {"setpoint_node_update_failures_total",
       {"UpdateShardRange calls that reported work still running.",
        st.update_failures}},
  };
  for (const auto& [name, help_value] : counters) {
    w.Counter(name, help_value.first, pod,
              static_cast<double>(help_value.second));
  }
  const absl::Time now = clock_->Now();
  const double lease_left =
      renewed_at_ == absl::InfinitePast()
          ? 0.0
          : std::max(0.0, absl::ToDoubleSeconds(FenceDeadline() - now));
  w.Gauge("setpoint_node_drained",
          "1 while the pod is drained (setpointctl drain): its nodes get no "
          "share of the ring.",
          pod, drained_ ? 1 : 0);
  w.Gauge("setpoint_node_lease_remaining_seconds",
          "Time this pod's nodes may still work without another renewal.", pod,
          lease_left);
  for (const auto& slot : slots_) {
    const MetricLabels node = {
        {"pod", pod_id_}, {"kind", slot->info.kind}, {"node", slot->info.id}};
    w.Gauge("setpoint_node_shards_owned",
            "Shards the node works on (its active range).", node,
            static_cast<double>(slot->active.range.size()));
    w.Gauge("setpoint_node_fencing_token",
            "The fencing token of the node's active range (0: none).", node,
            static_cast<double>(slot->active.token));
    w.Gauge("setpoint_node_running", "1 while the node's Run executes.", node,
            slot->running ? 1 : 0);
  }
}

std::vector<const NodeManager::Slot*> NodeManager::ReportedSlots() const {
  MutexLock l(&mu_);
  std::vector<const Slot*> out;
  for (const auto& slot : slots_) out.push_back(slot.get());
  return out;
}

std::vector<std::string> NodeManager::Liveness(
    absl::Duration stuck_after) const {
  std::vector<std::string> problems;
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    const absl::Duration bound =
        stuck_after + options_.poll_interval + options_.operation_timeout;
    if (started_ && !stopped_ && last_tick_ != absl::InfinitePast() &&
        now - last_tick_ > bound) {
      problems.push_back(
          absl::StrCat("node manager pod=", pod_id_,
                       ": the protocol thread has not come round for ",
                       absl::FormatDuration(now - last_tick_)));
    }
  }
  for (const Slot* slot : ReportedSlots()) {
    NodeReport r;
    slot->node->Report(stuck_after, r);
    for (auto& p : r.stuck) {
      problems.push_back(absl::StrCat(slot->info.id, ": ", p));
    }
  }
  return problems;
}

std::vector<std::string> NodeManager::Readiness(
    absl::Duration stuck_after) const {
  std::vector<std::string> problems;
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    if (!started_ || stopped_) {
      problems.push_back("node manager not running");
    } else if (failure_streak_ > 0) {
      problems.push_back(
          absl::StrCat("registry unreachable: ", failure_streak_,
                       " polls failed in a row, last: ", last_poll_error_));
    }
    if (renewed_at_ == absl::InfinitePast()) {
      problems.push_back("no lease yet: the registry has not answered");
    } else if (now >= FenceDeadline()) {
      problems.push_back(absl::StrCat(
          "lease lapsed ", absl::FormatDuration(now - FenceDeadline()),
          " ago: nodes are fenced"));
    }
  }
  for (const Slot* slot : ReportedSlots()) {
    NodeReport r;
    slot->node->Report(stuck_after, r);
    for (auto& p : r.not_ready) {
      problems.push_back(absl::StrCat(slot->info.id, ": ", p));
    }
  }
  return problems;
}

std::string NodeManager::StatusJson(absl::Duration stuck_after) const {
  struct Row {
    NodeInfo info;
    Assignment active;
    bool registered, running;
    int restarts;
    const Node* node;
  };
  std::vector<Row> rows;
  std::string out = "{\"pod\":";
  AppendJsonString(&out, pod_id_);
  {
    MutexLock l(&mu_);
    const absl::Time now = clock_->Now();
    out += ",\"epoch\":";
    AppendJsonString(&out, epoch_);
    absl::StrAppendFormat(
        &out, ",\"lease_valid_for_seconds\":%.3f",
        renewed_at_ == absl::InfinitePast()
            ? 0.0
            : std::max(0.0, absl::ToDoubleSeconds(FenceDeadline() - now)));
    absl::StrAppend(&out, ",\"drained\":", drained_ ? "true" : "false");
    absl::StrAppend(&out, ",\"registry_reachable\":",
                    failure_streak_ == 0 && renewed_at_ != absl::InfinitePast()
                        ? "true"
                        : "false");
    const NodeManagerStats& st = stats_;
    absl::StrAppend(
        &out, ",\"stats\":{\"polls\":", st.polls,
        ",\"poll_failures\":", st.poll_failures, ",\"grants\":", st.grants,
        ",\"releases\":", st.releases, ",\"self_fences\":", st.fences,
        ",\"epoch_changes\":", st.epoch_changes, ",\"restarts\":", st.restarts,
        ",\"update_failures\":", st.update_failures, "}");
    for (const auto& slot : slots_) {
      rows.push_back(Row{slot->info, slot->active, slot->registered,
                         slot->running, slot->restarts, slot->node.get()});
    }
  }
  out += ",\"nodes\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    if (i > 0) out += ",";
    out += "{\"id\":";
    AppendJsonString(&out, r.info.id);
    out += ",\"kind\":";
    AppendJsonString(&out, r.info.kind);
    absl::StrAppend(
        &out, ",\"range\":[", r.active.range.Hull().begin, ",",
        r.active.range.Hull().end, "],\"shards\":", r.active.range.RunsJson(),
        ",\"ring_size\":", r.info.ring_size, ",\"token\":", r.active.token,
        ",\"registered\":", r.registered ? "true" : "false",
        ",\"running\":", r.running ? "true" : "false",
        ",\"restarts\":", r.restarts);
    NodeReport report;
    r.node->Report(stuck_after, report);
    if (!report.status_json.empty()) {
      absl::StrAppend(&out, ",\"status\":", report.status_json);
    }
    out += "}";
  }
  out += "]}";
  return out;
}

}  // namespace setpoint
