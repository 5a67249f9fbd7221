#include "registry/redis/poll_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace setpoint::redis {

std::optional<uint64_t> PollCache::Since(const std::string& kind) {
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) return std::nullopt;
  if (++it->second.polls >= full_every_) return std::nullopt;
  return it->second.seq;
}

void PollCache::Clear() {
  kinds_.clear();
  epoch_.clear();
}

KindView PollCache::ViewOf(const Kind& k) { return k.view; }

void PollCache::ApplyOne(Kind& k, const std::string& name,
                         const LoggedChange& c) {
  if (k.touched.size() >= kMaxTouched) {
    const size_t drop = k.touched.size() / 2;
    k.touched_from = k.touched[drop - 1].first;
    k.touched.erase(k.touched.begin(),
                    k.touched.begin() + static_cast<ptrdiff_t>(drop));
  }
  k.touched.emplace_back(c.seq, c.id);
  switch (c.op) {
    case '+':
      if (UsableMemberId(c.id, name)) {
        auto pos = std::lower_bound(k.view.members.begin(),
                                    k.view.members.end(), c.id);
        if (pos == k.view.members.end() || *pos != c.id) {
          k.view.members.insert(pos, c.id);
          // A record written before its node joined is now in view.
          if (auto o = k.orphans.find(c.id); o != k.orphans.end()) {
            k.view.held[c.id] = std::move(o->second);
            k.orphans.erase(o);
          }
        }
      }
      break;
    case '-': {
      auto pos =
          std::lower_bound(k.view.members.begin(), k.view.members.end(), c.id);
      if (pos != k.view.members.end() && *pos == c.id)
        k.view.members.erase(pos);
      k.view.held.erase(c.id);
      k.orphans.erase(c.id);
      break;
    }
    case 'h': {
      k.view.held.erase(c.id);
      k.orphans.erase(c.id);
      absl::StatusOr<Assignment> a = ParseHeld(c.value);
      if (!a.ok()) break;  // Left out, as a full read leaves it out.
      const bool member = std::binary_search(k.view.members.begin(),
                                             k.view.members.end(), c.id);
      (member ? k.view.held : k.orphans)[c.id] = *std::move(a);
      break;
    }
    default:  // 'd' (ParseLoggedChange allows no other op).
      k.view.held.erase(c.id);
      k.orphans.erase(c.id);
      break;
  }
}

PollCache::Applied PollCache::Apply(
    const std::string& kind, const std::vector<LoggedChange>& changes,
    std::vector<ChangeNotice::Resized>* resized) {
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) return Applied::kNotCached;
  Kind& k = it->second;
  // Check first, then apply: a gap leaves the view as the last poll left it.
  uint64_t at = k.seq;
  for (const LoggedChange& c : changes) {
    if (c.seq <= at) continue;
    if (c.seq != at + 1) return Applied::kGap;
    at = c.seq;
  }
  changes_applied_ += static_cast<int64_t>(at - k.seq);
  for (const LoggedChange& c : changes) {
    if (c.seq <= k.seq) continue;
    auto size_of = [&k](const std::string& id) -> uint64_t {
      auto rec = k.view.held.find(id);
      return rec == k.view.held.end() ? 0 : rec->second.range.size();
    };
    const uint64_t before = resized != nullptr ? size_of(c.id) : 0;
    ApplyOne(k, kind, c);
    k.seq = c.seq;
    if (resized != nullptr) {
      const uint64_t after = size_of(c.id);
      if (before != after) {
        resized->push_back(
            {.id = c.id, .seq = c.seq, .before = before, .after = after});
      }
    }
  }
  return Applied::kApplied;
}

std::optional<KindView> PollCache::View(const std::string& kind) const {
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) return std::nullopt;
  return ViewOf(it->second);
}

bool PollCache::Read(
    const std::string& kind, const CachedViewMark& since,
    absl::FunctionRef<void(const CachedViewRead&)> read) const {
  auto it = kinds_.find(kind);
  if (it == kinds_.end()) return false;
  const Kind& k = it->second;
  const CachedViewMark at{.incarnation = k.incarnation, .seq = k.seq};
  if (since.incarnation != k.incarnation || since.seq < k.touched_from ||
      since.seq > k.seq) {
    read(CachedViewRead{.view = k.view, .at = at, .changed = nullptr});
    return true;
  }
  std::vector<std::string> changed;
  auto from = std::upper_bound(
      k.touched.begin(), k.touched.end(), since.seq,
      [](uint64_t seq, const std::pair<uint64_t, std::string>& t) {
        return seq < t.first;
      });
  for (; from != k.touched.end(); ++from) changed.push_back(from->second);
  read(CachedViewRead{.view = k.view, .at = at, .changed = &changed});
  return true;
}

uint64_t PollCache::seq(const std::string& kind) const {
  auto it = kinds_.find(kind);
  return it == kinds_.end() ? 0 : it->second.seq;
}

bool PollCache::Merge(DecodedPoll* decoded, const PollRequest& request,
                      std::vector<std::string>* warnings) {
  PollResult& result = decoded->result;
  if (result.epoch != epoch_) {
    kinds_.clear();
    epoch_ = result.epoch;
  }
  for (auto& [name, answer] : decoded->answers) {
    KindView& view = result.kinds[name];
    auto cached = kinds_.find(name);
    if (!answer.changes_only) {
      const bool comparable = cached != kinds_.end() &&
                              answer.seq.has_value() &&
                              cached->second.seq == *answer.seq;
      bool unchanged = false;
      if (comparable) {
        const Kind& mine = cached->second;
        unchanged =
            mine.view.members == view.members && mine.view.held == view.held;
        if (!unchanged) {
          warnings->push_back(absl::StrCat(
              "kind ", name,
              ": the members or records changed without an entry in the "
              "change log (a pod of an older setpoint, or a hand edit of the "
              "keys); pods see such changes only at every ",
              full_every_, "th poll"));
        }
      }
      if (!answer.seq.has_value()) {  // Not cacheable ('o' has no seq).
        if (cached != kinds_.end()) kinds_.erase(cached);
        continue;
      }
      Kind& k = kinds_[name];
      k.orphans.clear();
      k.polls = 0;
      // The same view at the same seq: readers' marks still hold.
      if (unchanged) continue;
      k.seq = *answer.seq;
      // A view read whole: readers compare all of it once more.
      k.incarnation = ++incarnations_;
      k.touched_from = k.seq;
      k.touched.clear();
      k.view.members = view.members;
      k.view.held = view.held;
      continue;
    }
    // Changes only: they must start right after the cached view.
    if (cached == kinds_.end() || !answer.seq.has_value() || answer.broken) {
      Clear();
      return false;
    }
    Kind& k = cached->second;
    uint64_t at = k.seq;
    for (const LoggedChange& c : answer.changes) {
      if (c.seq != at + 1) {
        Clear();
        return false;
      }
      at = c.seq;
      ApplyOne(k, name, c);
    }
    if (at != *answer.seq) {
      Clear();
      return false;
    }
    k.seq = at;
    // The records of the renewed ids came from Redis with the changes; the
    // view must agree with them, or something was written past the log.
    auto ids = request.kinds.find(name);
    if (ids != request.kinds.end()) {
      for (const std::string& id : ids->second) {
        if (!std::binary_search(k.view.members.begin(), k.view.members.end(),
                                id)) {
          continue;  // Not a usable member: no record in any view.
        }
        auto fresh = view.held.find(id);
        auto mine = k.view.held.find(id);
        const bool same =
            (fresh == view.held.end())
                ? mine == k.view.held.end()
                : (mine != k.view.held.end() && mine->second == fresh->second);
        if (!same) {
          warnings->push_back(absl::StrCat(
              "kind ", name, " node ", id,
              ": its record changed without an entry in the change log; "
              "reading everything again"));
          Clear();
          return false;
        }
      }
    }
    if (request.cached_view_ok) {
      // The caller reads the rest from the cache (ReadCachedView): the
      // answer keeps the records the poll read of its own ids only, those
      // of usable members, as a view would.
      for (auto it = view.held.begin(); it != view.held.end();) {
        if (std::binary_search(k.view.members.begin(), k.view.members.end(),
                               it->first)) {
          ++it;
        } else {
          it = view.held.erase(it);
        }
      }
      result.from_cache.insert(name);
    } else {
      view = ViewOf(k);
    }
    change_polls_ += 1;
    changes_applied_ += static_cast<int64_t>(answer.changes.size());
  }
  return true;
}

}  // namespace setpoint::redis
