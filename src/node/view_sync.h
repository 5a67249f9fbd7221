// Keeping a pod's copy of a kind's view equal to the registry's cached one
// by writing only what differs, and looking only at the ids that changed
// when the registry can name them. A pod re-reads the cached view after
// every announced join or leave and every poll; copying the whole of it
// (every member and record of the fleet, then freeing the old copy), or
// even comparing all of it, cost each pod more than the rule it feeds, and
// every pod of the fleet pays it on every change.
// Pure: no locks, no registry. Internal to src/node;
// tests/node/view_sync_test.cc covers it.
//
//   ViewSync s = SyncView(cached, own_ids, &my_view, read.changed);
//   if (s.changed()) { ...targets moved, s.joined / s.left say why... }
//
// Thread safety: a function of its arguments; the caller owns `to`.
#ifndef SETPOINT_SRC_NODE_VIEW_SYNC_H_
#define SETPOINT_SRC_NODE_VIEW_SYNC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "setpoint/node/node_registry.h"

namespace setpoint {

// What SyncView found different.
struct ViewSync {
  bool joined = false;        // Some member of `from` was not in `to`.
  bool left = false;          // Some member of `to` is not in `from`.
  bool held_changed = false;  // Some record of another id differed.
  uint64_t max_token = 0;     // The largest token of the records written.
  bool changed() const { return joined || left || held_changed; }
};

// Makes `to` equal to `from`, except the records of the ids in `own`
// (sorted), which stay as they are in `to`: the caller keeps those from
// its own polls and handoffs. Entries that are already equal are left
// alone. With `changed` (CachedViewRead::changed: `to` was equal to `from`
// but for these ids, any order, repeats allowed) only those ids are
// looked at, in time O(changed × log n); without it the whole of both
// views is compared.
ViewSync SyncView(const KindView& from, const std::vector<std::string>& own,
                  KindView* to,
                  const std::vector<std::string>* changed = nullptr);

}  // namespace setpoint

#endif  // SETPOINT_SRC_NODE_VIEW_SYNC_H_
