#include "setpoint/registry/in_memory_node_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "setpoint/base/format.h"

namespace setpoint {

InMemoryNodeRegistry::InMemoryNodeRegistry(InMemoryNodeRegistryOptions options)
    : clock_(options.clock != nullptr ? options.clock : Clock::Real()) {
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
    for (const auto& [name, ids] : request.kinds) {
      Kind& kind = kinds_[name];
      changed |= Expire(kind, now);
      for (const std::string& id : ids) {
        auto [it, inserted] =
            kind.expiry.insert_or_assign(id, now + request.lease);
        changed |= inserted;
      }
      KindView& view = result.kinds[name];
      for (const auto& [id, expiry] : kind.expiry) view.members.push_back(id);
      view.held = kind.held;
    }
    result.epoch = epoch_;
    result.grants_from = grants_from_;
  }
  if (changed) Changed();
  return result;
}

absl::Status InMemoryNodeRegistry::Release(const Context& ctx,
                                           const std::string& kind,
                                           const std::string& node_id,
                                           ShardRange range) {
  if (absl::Status err = ctx.Err(); !err.ok()) return err;
  {
    MutexLock l(&mu_);
    ++operations_;
    Kind& k = kinds_[kind];
    auto it = k.held.find(node_id);
    if (it == k.held.end()) {
      if (range.Empty()) return absl::OkStatus();  // Nothing held: done.
      return absl::FailedPreconditionError(
          absl::StrCat("release node=", node_id, " range=", range.ToString(),
                       ": the node holds nothing"));
    }
    if (!it->second.range.Covers(range)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "release node=", node_id, " range=", range.ToString(),
          ": not within the held range ", it->second.range.ToString()));
    }
    if (range.Empty()) {
      k.held.erase(it);
    } else {
      it->second.range = range;
    }
  }
  Changed();
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> InMemoryNodeRegistry::Grant(const Context& ctx,
                                                     const std::string& kind,
                                                     const std::string& node_id,
                                                     ShardRange target) {
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
    k.held[node_id] = ShardAssignment{target, token};
  }
  Changed();
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
  }
  Changed();
  return absl::OkStatus();
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

void InMemoryNodeRegistry::ForgetEverything(absl::Duration grace) {
  {
    MutexLock l(&mu_);
    // Tokens keep growing across the loss, as they must for fencing.
    for (const auto& [name, kind] : kinds_) {
      token_floor_ = std::max(token_floor_, kind.last_token);
    }
    kinds_.clear();
    ++epochs_;
    epoch_ =
        absl::StrCat("mem-", reinterpret_cast<uintptr_t>(this), "-", epochs_);
    grants_from_ = clock_->Now() + grace;
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
