// The node manager's view of the registry: bringing its copy of each
// kind's view up to the registry's cached one (after an announced change,
// or a poll answered from the cache), and what changed for Retarget; where
// our nodes stand in the order of the odd shards, followed through others'
// grants and releases; and whether the view shows a grant's shards held.
// Protocol thread, except FollowResize (under the lock, from Wake).
#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "node/lease_protocol.h"
#include "node/node_slot.h"
#include "node/view_sync.h"
#include "setpoint/node/node_manager.h"

namespace setpoint {

void NodeManager::RefreshFromCache() {
  if (!last_view_.has_value()) return;
  std::map<std::string, KindDelta> deltas;
  for (auto& entry : last_view_->kinds) {
    const std::string& kind = entry.first;
    KindView& view = entry.second;  // Not a binding: the reader uses it.
    // No cached view: ours stands as it is.
    ViewSync sync;
    SyncWithCache(kind, &view, &sync);
    deltas[kind] = KindDelta{
        .same = !sync.changed(),
        .why = lease_protocol::MoveReasonOf(false, sync.joined, sync.left),
        .max_token = sync.max_token};
  }
  Retarget(deltas, std::move(last_targets_));
}

bool NodeManager::SyncWithCache(const std::string& kind, KindView* view,
                                ViewSync* sync) {
  // Our own records as our polls and handoffs left them: the cache hears
  // of them only from announcements, which may lag our replies.
  std::vector<std::string> own;
  for (const auto& slot : slots_) {
    if (slot->info.kind == kind) own.push_back(slot->info.id);
  }
  std::sort(own.begin(), own.end());
  CachedViewMark& mark = view_marks_[kind];
  return options_.registry->ReadCachedView(
      kind, mark, [&](const CachedViewRead& cached) {
        *sync = SyncView(cached.view, own, view, cached.changed);
        mark = cached.at;
      });
}

bool NodeManager::FillFromCache(std::optional<PollResult>& previous,
                                const PollRequest& request, PollResult& result,
                                std::map<std::string, KindDelta>* deltas) {
  const bool same_state = previous.has_value() &&
                          previous->epoch == result.epoch &&
                          previous->drained == result.drained;
  for (const std::string& kind : result.from_cache) {
    KindView& fresh = result.kinds[kind];  // Our own records, from Redis.
    // Start from our view before (moved: it is replaced anyway) and write
    // what the cache has that it lacks.
    KindView view;
    bool had = false;
    if (previous.has_value()) {
      if (auto it = previous->kinds.find(kind); it != previous->kinds.end()) {
        view = std::move(it->second);
        previous->kinds.erase(it);
        had = true;
      }
    }
    // Our view before stood where its mark says; nowhere when we start
    // from nothing.
    if (!had) view_marks_.erase(kind);
    ViewSync sync;
    if (!SyncWithCache(kind, &view, &sync)) return false;
    // The records of the nodes this poll renewed exactly as it read them
    // (those of our other nodes stay as our handoffs left them).
    bool own_changed = false;
    uint64_t max_token = sync.max_token;
    static const std::vector<std::string> kNone;
    auto polled = request.kinds.find(kind);
    for (const std::string& id :
         polled != request.kinds.end() ? polled->second : kNone) {
      auto got = fresh.held.find(id);
      auto mine = view.held.find(id);
      if (got != fresh.held.end()) {
        max_token = std::max(max_token, got->second.token);
      }
      if (got == fresh.held.end()) {
        if (mine != view.held.end()) {
          view.held.erase(mine);
          own_changed = true;
        }
      } else if (mine == view.held.end()) {
        view.held.emplace(id, got->second);
        own_changed = true;
      } else if (!(mine->second == got->second)) {
        mine->second = got->second;
        own_changed = true;
      }
    }
    fresh = std::move(view);
    KindDelta& d = (*deltas)[kind];
    d.max_token = max_token;
    d.same = had && same_state && !sync.changed() && !own_changed;
    if (d.same) continue;
    if (!previous.has_value()) {
      d.why = "start";
    } else if (previous->epoch != result.epoch) {
      d.why = "epoch";
    } else {
      d.why = lease_protocol::MoveReasonOf(previous->drained != result.drained,
                                           sync.joined || !had, sync.left);
    }
  }
  return true;
}

void NodeManager::DeltasSince(const std::optional<PollResult>& previous,
                              std::map<std::string, KindDelta>* deltas) const {
  for (const auto& [kind, view] : last_view_->kinds) {
    if (deltas->contains(kind)) continue;  // Known already.
    KindDelta& d = (*deltas)[kind];
    auto was = previous.has_value() ? previous->kinds.find(kind)
                                    : decltype(previous->kinds.end()){};
    d.same = previous.has_value() && was != previous->kinds.end() &&
             previous->drained == last_view_->drained &&
             was->second.members == view.members &&
             was->second.held == view.held;
    if (d.same) continue;
    std::optional<lease_protocol::ViewState> before;
    if (previous.has_value()) {
      before = lease_protocol::ViewState{
          .epoch = &previous->epoch,
          .drained = &previous->drained,
          .kind = was != previous->kinds.end() ? &was->second : nullptr};
    }
    d.why = lease_protocol::MoveReason(before, {.epoch = &last_view_->epoch,
                                                .drained = &last_view_->drained,
                                                .kind = &view});
  }
}

uint32_t NodeManager::RingSize(const std::string& kind) const {
  for (const auto& k : options_.kinds) {
    if (k.kind == kind) return k.ring_size;
  }
  return kDefaultRingSize;
}

void NodeManager::WatchShares(const std::string& kind,
                              const std::vector<std::string>& own,
                              const SharePlaces& places) {
  auto mark = view_marks_.find(kind);
  MutexLock l(&mu_);
  ShareWatch& w = share_watch_[kind];
  w.valid = true;
  w.q = places.q;
  w.odd = places.odd;
  // Without a mark (a poll read everything) every announced change counts,
  // some maybe twice: at worst one look too many, or one missed until the
  // next poll.
  w.seq = mark != view_marks_.end() ? mark->second.seq : 0;
  w.drained = last_view_->drained;
  w.own.clear();
  for (size_t i = 0; i < own.size() && i < places.place.size(); ++i) {
    w.own.push_back({own[i], places.place[i], places.over[i]});
  }
  // Resizes announced while the view was read or the rule ran: follow
  // those the view does not have yet, forget the rest.
  std::vector<ChangeNotice::Resized>& kept = resizes_[kind];
  std::erase_if(
      kept, [&w](const ChangeNotice::Resized& r) { return r.seq <= w.seq; });
  bool moved = false;
  for (const ChangeNotice::Resized& r : kept) {
    moved = FollowResize(w, r) || moved;
  }
  if (moved) {
    view_changed_ = true;
    nudge_arrived_ = true;
    cv_.SignalAll();
  }
}

bool NodeManager::FollowResize(ShareWatch& w, const ChangeNotice::Resized& r) {
  if (r.seq <= w.seq) return false;  // In the view the places came from.
  const bool was_over = r.before > w.q;
  const bool is_over = r.after > w.q;
  if (was_over == is_over) return false;
  if (!w.valid) return true;
  if (w.drained.contains(std::string(PodOfNodeId(r.id)))) return false;
  bool moved = false;
  for (ShareWatch::Own& o : w.own) {
    if (o.id == r.id) return true;  // Someone else wrote our record.
    if (o.place == std::numeric_limits<uint64_t>::max()) continue;
    const bool gets_odd = o.place < w.odd;
    o.place = lease_protocol::PlaceAfterCrossing(o.place, o.over, o.id, r.id,
                                                 is_over);
    if ((o.place < w.odd) != gets_odd) moved = true;
  }
  return moved;
}

bool NodeManager::HeldByOthers(
    const Move& m, const std::vector<HandoffRequest::ReleaseOp>& releases) {
  const ShardSet& want = *m.grant;
  const ShardRange hull = want.Hull();
  for (const auto& [id, a] : m.view->held) {
    if (id == m.slot->info.id) continue;
    const ShardRange other = a.range.Hull();
    if (other.end <= hull.begin || hull.end <= other.begin) continue;
    // A node of this pod that gives shards up in the same handoff: the
    // registry runs its release first.
    const ShardSet* range = &a.range;
    for (const auto& r : releases) {
      if (r.node_id == id && r.kind == m.slot->info.kind) range = &r.keep.range;
    }
    if (range->Intersects(want)) return true;
  }
  return false;
}

}  // namespace setpoint
