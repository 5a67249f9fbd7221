#include "setpoint/node/node_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace setpoint {

std::string_view PodOfNodeId(std::string_view node_id) {
  return node_id.substr(0, node_id.find('/'));
}

std::vector<std::string> ShareMembers(const std::vector<std::string>& members,
                                      const std::set<std::string>& drained) {
  if (drained.empty()) return members;
  std::vector<std::string> out;
  for (const std::string& id : members) {
    if (!drained.contains(std::string(PodOfNodeId(id)))) out.push_back(id);
  }
  return out;
}

absl::flat_hash_map<std::string, ShardSet> KindTargets(
    const KindView& view, const std::set<std::string>& drained,
    uint32_t ring_size, const std::vector<std::string>& ids,
    SharePlaces* places) {
  // The sharing members in id order with what each holds, read from the
  // view's sorted members and records side by side.
  std::vector<const std::string*> share;
  std::vector<const ShardSet*> holds;
  share.reserve(view.members.size());
  holds.reserve(view.members.size());
  auto rec = view.held.begin();
  const bool sorted = std::is_sorted(view.members.begin(), view.members.end());
  std::vector<std::string> members_sorted;
  const std::vector<std::string>* members = &view.members;
  if (!sorted) {
    members_sorted = view.members;
    std::sort(members_sorted.begin(), members_sorted.end());
    members = &members_sorted;
  }
  for (size_t i = 0; i < members->size(); ++i) {
    const std::string& id = (*members)[i];
    if (i > 0 && id == (*members)[i - 1]) continue;
    if (!drained.empty() && drained.contains(std::string(PodOfNodeId(id)))) {
      continue;
    }
    while (rec != view.held.end() && rec->first < id) ++rec;
    share.push_back(&id);
    holds.push_back(rec != view.held.end() && rec->first == id
                        ? &rec->second.range
                        : nullptr);
  }
  // Only the asked ids' shares are built: the rest of the fleet is counted.
  std::vector<size_t> wanted;
  wanted.reserve(ids.size());
  for (const std::string& id : ids) {
    auto it = std::lower_bound(
        share.begin(), share.end(), id,
        [](const std::string* a, const std::string& b) { return *a < b; });
    wanted.push_back(it != share.end() && **it == id
                         ? static_cast<size_t>(it - share.begin())
                         : share.size());  // Not sharing: nothing.
  }
  std::vector<ShardSet> shares =
      AssignSortedShards(holds, ring_size, wanted, places);
  absl::flat_hash_map<std::string, ShardSet> out;
  for (size_t i = 0; i < ids.size(); ++i) out[ids[i]] = std::move(shares[i]);
  return out;
}

absl::Status ValidatePodId(std::string_view pod_id) {
  if (pod_id.empty()) {
    return absl::InvalidArgumentError("pod id must not be empty");
  }
  for (size_t i = 0; i < pod_id.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(pod_id[i]);
    if (c <= 0x20 || c >= 0x7f || c == '/') {
      return absl::InvalidArgumentError(absl::StrFormat(
          "pod id must be printable ASCII without spaces or '/', got \\x%02x "
          "at byte %d",
          c, i));
    }
  }
  return absl::OkStatus();
}

int64_t NodeRegistry::AddNoticeListener(
    std::function<void(const ChangeNotice&)> listener) {
  return AddChangeListener(
      [listener = std::move(listener)] { listener(ChangeNotice{}); });
}

std::optional<KindView> NodeRegistry::CachedView(const std::string&) {
  return std::nullopt;
}

bool NodeRegistry::ReadCachedView(
    const std::string& kind, const CachedViewMark&,
    absl::FunctionRef<void(const CachedViewRead&)> read) {
  std::optional<KindView> view = CachedView(kind);
  if (!view.has_value()) return false;
  read(CachedViewRead{.view = *view, .at = {}, .changed = nullptr});
  return true;
}

absl::StatusOr<HandoffResult> NodeRegistry::Handoff(
    const Context& ctx, const HandoffRequest& request) {
  HandoffResult out;
  std::set<std::string> failed;
  for (const HandoffRequest::ReleaseOp& r : request.releases) {
    out.releases.push_back(Release(ctx, r.kind, r.node_id, r.keep));
    if (!out.releases.back().ok()) failed.insert(r.node_id);
  }
  for (const HandoffRequest::GrantOp& g : request.grants) {
    if (failed.contains(g.node_id)) {
      out.grants.push_back(absl::AbortedError(
          absl::StrCat("grant node=", g.node_id,
                       ": its release in the same handoff failed")));
      continue;
    }
    out.grants.push_back(
        Grant(ctx, g.kind, g.node_id, g.target, request.epoch));
  }
  return out;
}

}  // namespace setpoint
