#include "node/lease_protocol.h"

#include <algorithm>
#include <iterator>
#include <vector>

namespace setpoint::lease_protocol {

Decision Decide(const NodeFacts& node, const std::optional<Assignment>& held,
                ShardSet target) {
  Decision d;
  if (node.relay_busy || node.lease_fenced) return d;
  const Assignment& active = node.active;
  if (node.failed) target = ShardSet{};
  // The registry must record exactly what the node works on: its token,
  // and a range that covers it (larger only between a shrink and its
  // release). Anything else (the record expired, someone rewrote it, a
  // grant whose reply was lost) means others may be granted these shards.
  if (!active.range.Empty() &&
      (!held.has_value() || held->token != active.token ||
       !held->range.Covers(active.range))) {
    d.kind = Decision::Kind::kStop;
    return d;
  }
  // A refused change is asked for again, towards the target, until the
  // node confirms one (even if the target moved back meanwhile).
  if (node.unconfirmed) {
    d.kind = Decision::Kind::kAskAgain;
    d.update = Assignment{active.range.Intersect(target), active.token};
    return d;
  }
  if (!target.Covers(active.range)) {
    d.kind = Decision::Kind::kShrink;
    d.update = Assignment{active.range.Intersect(target), active.token};
    return d;
  }
  const bool grow = !target.Empty() && active.range != target;
  if (held.has_value() && held->range != active.range) {
    d.kind = Decision::Kind::kRegistry;
    d.release = active;
    if (!node.failed && grow) d.grant = target;
    return d;
  }
  if (node.failed) {
    d.kind = Decision::Kind::kRegistry;
    d.deregister = true;
    return d;
  }
  if (grow) {
    d.kind = Decision::Kind::kRegistry;
    d.grant = target;
  }
  return d;
}

uint64_t PlaceAfterCrossing(uint64_t place, bool over, const std::string& id,
                            const std::string& other, bool up) {
  // Over q: only those over q and before it count. Not over q: all those
  // over q count, and those not over q before it; `other` crossing before
  // it moves between the two and changes nothing.
  const bool shifts = over ? other < id : other > id;
  if (!shifts) return place;
  if (up) return place + 1;
  return place > 0 ? place - 1 : 0;
}

std::string MoveReason(const std::optional<ViewState>& before,
                       const ViewState& now) {
  if (!before.has_value()) return "start";
  if (*before->epoch != *now.epoch) return "epoch";
  static const std::vector<std::string> kNone;
  const auto& was = before->kind != nullptr ? before->kind->members : kNone;
  const auto& is = now.kind != nullptr ? now.kind->members : kNone;
  // Members are sorted as byte strings.
  std::vector<std::string> came, went;
  std::set_difference(is.begin(), is.end(), was.begin(), was.end(),
                      std::back_inserter(came));
  std::set_difference(was.begin(), was.end(), is.begin(), is.end(),
                      std::back_inserter(went));
  return MoveReasonOf(*before->drained != *now.drained, !came.empty(),
                      !went.empty());
}

std::string MoveReasonOf(bool drained_changed, bool joined, bool left) {
  std::vector<std::string> why;
  if (drained_changed) why.push_back("drain");
  if (joined) why.push_back("join");
  if (left) why.push_back("leave");
  if (why.empty()) return "none";
  std::string out = why[0];
  for (size_t i = 1; i < why.size(); ++i) out += "+" + why[i];
  return out;
}

}  // namespace setpoint::lease_protocol
