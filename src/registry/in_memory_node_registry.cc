#include "setpoint/registry/in_memory_node_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "setpoint/base/format.h"

namespace setpoint {

InMemoryNodeRegistry::InMemoryNodeRegistry(InMemoryNodeRegistryOptions options)
    : clock_(options.clock != nullptr ? options.clock : Clock::Monotonic()) {
  MutexLock l(&mu_);
  epoch_ = absl::StrCat("mem-", reinterpret_cast<uintptr_t>(this), "-0");
}

bool InMemoryNodeRegistry::Expire(Kind& kind, absl::Time now) {
  bool changed = false;
  for (auto it = kind.expiry.begin(); it != kind.expiry.end();) {
    if (it->second <= now) {
      kind.held.erase(it->first);
      it = kind.expiry.erase(it);
      changed = true;
    } else {
      ++it;
    }
  }
  return changed;
}

absl::StatusOr<PollResult> InMemoryNodeRegistry::Poll(
    const Context& ctx, const PollRequest& request) {
  if (absl::Status err = ctx.Err(); !err.ok()) return err;
  if (request.lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "poll: lease must be > 0, got ", absl::FormatDuration(request.lease)));
  }
  PollResult result;
  bool changed = false;
  {
    MutexLock l(&mu_);
    ++operations_;
    absl::Time now = clock_->Now();
    if (restarted_ || version_ < request.min_version) {
      // Restarted from a snapshot (which may be older than what pods saw),
      // or the state went back in time: as the Redis registry does.
      restarted_ = false;
      version_ = std::max(version_, request.min_version);
      NewEpochLocked(request.lease);
      changed = true;
    }
    for (const auto& [name, ids] : request.kinds) {
      Kind& kind = kinds_[name];
      if (auto t = request.min_tokens.find(name);
          t != request.min_tokens.end()) {
        kind.last_token = std::max(kind.last_token, t->second);
      }
      if (auto ring = request.ring_sizes.find(name);
          ring != request.ring_sizes.end()) {
        kind.ring_size = ring->second;
      }
      changed |= Expire(kind, now);
      for (const std::string& id : ids) {
        auto [it, inserted] =
            kind.expiry.insert_or_assign(id, now + request.lease);
        changed |= inserted;
      }
      KindView& view = result.kinds[name];
      for (const auto& [id, expiry] : kind.expiry) view.members.push_back(id);
      if (request.own_held_only) {
        for (const std::string& id : ids) {
          if (auto it = kind.held.find(id); it != kind.held.end()) {
            view.held.insert(*it);
          }
        }
      } else {
        view.held = kind.held;
      }
    }
    for (const auto& [pod, since] : drained_) result.drained.insert(pod);
    ++version_;
    result.epoch = epoch_;
    result.grants_from = grants_from_;
    result.server_time = now;
    result.version = version_;
  }
  if (changed) Changed();
  return result;
}

absl::Status InMemoryNodeRegistry::Release(const Context& ctx,
                                           const std::string& kind,
                                           const std::string& node_id,
                                           Assignment keep) {
  if (absl::Status err = ctx.Err(); !err.ok()) return err;
  const ShardSet range = keep.range;
  auto refuse = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("release node=", node_id, " range=", range.ToString(),
                     " token=", keep.token, ": ", why));
  };
  {
    MutexLock l(&mu_);
    ++operations_;
    Kind& k = kinds_[kind];
    auto it = k.held.find(node_id);
    if (range.Empty()) {
      if (it == k.held.end()) return absl::OkStatus();  // Nothing held: done.
      k.held.erase(it);
    } else {
      if (it == k.held.end()) {
        return refuse("the registry records nothing for the node");
      }
      if (it->second.token != keep.token) {
        return refuse(absl::StrCat("the record has token ", it->second.token));
      }
      if (!it->second.range.Covers(range)) {
        return refuse(absl::StrCat("not within the recorded range ",
                                   it->second.range.ToString()));
      }
      it->second.range = range;
    }
    ++version_;
  }
  Changed();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> InMemoryNodeRegistry::Grant(const Context& ctx,
                                                     const std::string& kind,
                                                     const std::string& node_id,
                                                     ShardSet target,
                                                     const std::string& epoch) {
  if (absl::Status err = ctx.Err(); !err.ok()) return err;
  if (target.Empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("grant node=", node_id, ": empty range"));
  }
  uint64_t token;
  {
    MutexLock l(&mu_);
    ++operations_;
    absl::Time now = clock_->Now();
    if (epoch != epoch_) {
      return absl::AbortedError(
          absl::StrCat("grant node=", node_id,
                       ": the registry state changed since the "
                       "poll (epoch ",
                       epoch_, ", the pod saw ", epoch, "); poll again"));
    }
    Kind& k = kinds_[kind];
    Expire(k, now);
    k.last_token = std::max(k.last_token, token_floor_);
    if (!k.expiry.contains(node_id)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "grant node=", node_id, ": not a live member (lease expired)"));
    }
    if (now < grants_from_) {
      return absl::AbortedError(absl::StrCat(
          "grant node=", node_id, ": refused until ",
          absl::FormatTime(grants_from_), " (the registry's state is new)"));
    }
    for (const auto& [other, assignment] : k.held) {
      if (other != node_id && assignment.range.Intersects(target)) {
        return absl::AbortedError(
            absl::StrCat("grant node=", node_id, " range=", target.ToString(),
                         ": shards still held by ", other, " ",
                         assignment.range.ToString()));
      }
    }
    token = ++k.last_token;
    k.held[node_id] = Assignment{target, token};
    ++version_;
  }
  // No announcement: nobody waits for a grant (as on Redis).
  return token;
}

absl::Status InMemoryNodeRegistry::Deregister(
    const Context& ctx, const std::string& kind,
    const std::vector<std::string>& node_ids) {
  if (absl::Status err = ctx.Err(); !err.ok()) return err;
  {
    MutexLock l(&mu_);
    ++operations_;
    Kind& k = kinds_[kind];
    for (const std::string& id : node_ids) {
      k.expiry.erase(id);
      k.held.erase(id);
    }
    ++version_;
  }
  Changed();
  return absl::OkStatus();
}

absl::Status InMemoryNodeRegistry::SetDrained(const Context& ctx,
                                              const std::string& pod_id,
                                              bool drained) {
  if (absl::Status err = ctx.Err(); !err.ok()) return err;
  if (absl::Status s = ValidatePodId(pod_id); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("set drained: ", s.message()));
  }
  {
    MutexLock l(&mu_);
    ++operations_;
    bool changed = drained ? drained_.try_emplace(pod_id, clock_->Now()).second
                           : drained_.erase(pod_id) > 0;
    if (!changed) return absl::OkStatus();
    ++version_;
  }
  Changed();
  return absl::OkStatus();
}

absl::StatusOr<RegistryDescription> InMemoryNodeRegistry::Describe(
    const Context& ctx) {
  if (absl::Status err = ctx.Err(); !err.ok()) return err;
  MutexLock l(&mu_);
  ++operations_;
  RegistryDescription d;
  d.epoch = epoch_;
  d.version = version_;
  d.server_time = clock_->Now();
  d.grants_from = grants_from_;
  d.drained = drained_;
  for (const auto& [name, kind] : kinds_) {
    KindDescription& k = d.kinds[name];
    k.ring_size = kind.ring_size;
    k.last_token = std::max(kind.last_token, token_floor_);
    for (const auto& [id, expiry] : kind.expiry) {
      MemberDescription m{.id = id, .lease_expiry = expiry, .held = {}};
      if (auto it = kind.held.find(id); it != kind.held.end()) {
        m.held = it->second;
      }
      k.members.push_back(std::move(m));
    }
  }
  return d;
}

int64_t InMemoryNodeRegistry::AddChangeListener(
    std::function<void()> listener) {
  MutexLock l(&listeners_mu_);
  int64_t id = next_listener_++;
  listeners_.emplace(id, std::move(listener));
  return id;
}

void InMemoryNodeRegistry::RemoveChangeListener(int64_t id) {
  MutexLock l(&listeners_mu_);
  listeners_.erase(id);
}

void InMemoryNodeRegistry::NewEpochLocked(absl::Duration grace) {
  ++epochs_;
  epoch_ =
      absl::StrCat("mem-", reinterpret_cast<uintptr_t>(this), "-", epochs_);
  grants_from_ = clock_->Now() + grace;
}

void InMemoryNodeRegistry::ForgetEverything(absl::Duration grace) {
  {
    MutexLock l(&mu_);
    // Tokens keep growing across the loss, as they must for fencing.
    for (const auto& [name, kind] : kinds_) {
      token_floor_ = std::max(token_floor_, kind.last_token);
    }
    kinds_.clear();
    drained_.clear();
    version_ = 0;
    NewEpochLocked(grace);
  }
  Changed();
}

InMemoryNodeRegistry::Snapshot InMemoryNodeRegistry::TakeSnapshot() const {
  MutexLock l(&mu_);
  return Snapshot{kinds_, drained_, epoch_, grants_from_, version_};
}

void InMemoryNodeRegistry::Restore(const Snapshot& snapshot) {
  {
    MutexLock l(&mu_);
    for (const auto& [name, kind] : kinds_) {
      token_floor_ = std::max(token_floor_, kind.last_token);
    }
    kinds_ = snapshot.kinds;
    drained_ = snapshot.drained;
    epoch_ = snapshot.epoch;
    grants_from_ = snapshot.grants_from;
    version_ = snapshot.version;
    restarted_ = true;
  }
  Changed();
}

void InMemoryNodeRegistry::FailOverTo(const Snapshot& snapshot) {
  Restore(snapshot);
  MutexLock l(&mu_);
  token_floor_ = 0;
  for (const auto& [name, kind] : snapshot.kinds) {
    token_floor_ = std::max(token_floor_, kind.last_token);
  }
}

void InMemoryNodeRegistry::OverwriteHeld(const std::string& kind,
                                         const std::string& node_id,
                                         Assignment record) {
  {
    MutexLock l(&mu_);
    kinds_[kind].held[node_id] = record;
    ++version_;
  }
  Changed();
}

int64_t InMemoryNodeRegistry::operations() const {
  MutexLock l(&mu_);
  return operations_;
}

void InMemoryNodeRegistry::Changed() {
  MutexLock l(&listeners_mu_);
  for (auto& [id, listener] : listeners_) listener();
}

}  // namespace setpoint
