// NodeRegistry: the shared record of which nodes are alive and which shard
// range each one has activated. The NodeManager of every pod drives the
// handoff protocol over it (docs/registry.md); implementations only keep the
// record and make each operation atomic:
//   - InMemoryNodeRegistry: one process, no Redis; the embedded default.
//   - RedisNodeRegistry: many processes sharing one Redis.
//
//   InMemoryNodeRegistry registry;
//   auto view = registry.Poll(ctx, {.kinds = {{"vm", {"pod-a/vm/0"}}},
//                                   .lease = absl::Seconds(3)});
//   auto token = registry.Grant(ctx, "vm", "pod-a/vm/0", {0, 4096},
//                               view->epoch);
//
// Lease expiry is decided by the registry's own clock (the Redis server's
// for Redis), never by the caller's, so pods with skewed clocks agree.
//
// Operators drain a pod with SetDrained: every NodeManager then shares the
// ring only among the nodes of pods that are not drained (ShareMembers), so
// the drained pod's nodes hand their shards over by the usual graceful path
// and stay idle, still renewing their leases. Describe reads everything the
// registry records, for operator tools (setpointctl); it changes nothing.
//
// Thread safety: implementations are thread-safe. The request, result and
// description structs are plain values; PodOfNodeId, ShareMembers and
// ValidatePodId are pure functions, safe from any thread.
#ifndef SETPOINT_NODE_NODE_REGISTRY_H_
#define SETPOINT_NODE_NODE_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/node/shard.h"

namespace setpoint {

// Where a registry's cached view of a kind stands (ReadCachedView): which
// whole read it grew from, and the seq of the last change applied to it.
// The zero mark stands nowhere.
struct CachedViewMark {
  uint64_t incarnation = 0;
  uint64_t seq = 0;
  friend bool operator==(const CachedViewMark&,
                         const CachedViewMark&) = default;
};

// One pod's heartbeat: the nodes it runs, per kind, and their lease.
struct PollRequest {
  // Kind -> ids of this pod's live nodes of that kind. Each is registered
  // if new, and its lease renewed.
  std::map<std::string, std::vector<std::string>> kinds = {};
  // How long the leases last from the registry's "now".
  absl::Duration lease = absl::Seconds(3);
  // Kind -> shards in its ring, recorded for operator tools (Describe).
  // Optional: a kind missing here is recorded as before.
  std::map<std::string, uint32_t> ring_sizes = {};
  // The highest PollResult::version this pod has seen (0: none). A registry
  // whose state is older than that went back in time (a restore from an
  // older snapshot, a failover that lost writes): it starts a new epoch.
  uint64_t min_version = 0;
  // Kind -> the highest token this pod holds or has seen in the kind (0 or
  // missing: none). The registry's next grants in the kind are larger,
  // whatever it lost (a failover to a replica that lacks the last grants,
  // a restart from an older snapshot) and whatever its clock says.
  std::map<std::string, uint64_t> min_tokens = {};
  // Return in KindView::held only the records of the nodes named in
  // `kinds` (what a NodeManager reads: it checks its own records, and the
  // registry checks everyone else's at each grant). Less to send and read
  // in a large fleet; operator tools leave it false.
  bool own_held_only = false;
  // The caller keeps its own copy of each kind's view and brings it up to
  // date with ReadCachedView. A kind the registry answers from its cache
  // then comes back without members and with only the records of the ids
  // in `kinds` (read from the store by this poll, never from the cache),
  // and is named in PollResult::from_cache: nothing of the fleet is copied
  // into the answer. Registries without a cache ignore it.
  bool cached_view_ok = false;
};

// What every live node of one kind has, as the registry saw it.
struct KindView {
  // Live node ids, sorted as byte strings.
  std::vector<std::string> members;
  // Node id -> the range it activated and the token it got. Only live
  // members appear (only the caller's own with PollRequest::own_held_only);
  // a member that holds nothing is absent, and so is one whose record does
  // not parse (its owner must treat that as "not mine").
  std::map<std::string, Assignment> held;
};

// What ReadCachedView's reader is given.
struct CachedViewRead {
  const KindView& view;
  // Where `view` stands.
  CachedViewMark at;
  // The ids whose membership or record may differ between the view at the
  // caller's `since` and `view` (each once or more), or null when the
  // registry cannot tell (another incarnation, too far back, no tracking):
  // then anything may differ.
  const std::vector<std::string>* changed = nullptr;
};

struct PollResult {
  std::map<std::string, KindView> kinds;
  // Identifies the registry's state: a different (or new) epoch means it
  // forgot or lost some of it (a Redis restart, empty or from a snapshot, a
  // failover, a state older than min_version); every node must stop at
  // once and start over.
  std::string epoch;
  // Grows with every write to the registry's state; pass the highest one
  // seen as PollRequest::min_version.
  uint64_t version = 0;
  // Grants are refused until this time has passed on the registry's clock
  // (one lease after the epoch began), so anyone who believed in an older
  // state has stopped. Informational.
  absl::Time grants_from = absl::InfinitePast();
  // The registry's clock when it served the poll (with grants_from, tells
  // how long grants stay refused).
  absl::Time server_time = absl::InfinitePast();
  // Pods an operator drained (SetDrained): their nodes get no share of the
  // ring (ShareMembers) until undrained.
  std::set<std::string> drained;
  // Kinds answered from the registry's cache (PollRequest::cached_view_ok):
  // their KindView holds only the caller's own records; every member and
  // every other record is ReadCachedView's.
  std::set<std::string> from_cache;
};

// Several releases and grants of one pod's nodes, sent together (Handoff):
// one round trip instead of one per node.
struct HandoffRequest {
  struct ReleaseOp {
    std::string kind;
    std::string node_id;
    Assignment keep;
  };
  struct GrantOp {
    std::string kind;
    std::string node_id;
    ShardSet target;
  };
  // Applied first, in order, each exactly as Release would.
  std::vector<ReleaseOp> releases = {};
  // Then, in order, each exactly as Grant would, seeing the releases above
  // and the grants before it. A grant to a node whose release in this
  // request failed is refused (kAborted).
  std::vector<GrantOp> grants = {};
  // The PollResult::epoch the grants were decided on.
  std::string epoch = {};
};

// One status per operation of a HandoffRequest, in its order.
struct HandoffResult {
  std::vector<absl::Status> releases;
  std::vector<absl::StatusOr<uint64_t>> grants;
};

// What a change announcement says (AddNoticeListener).
struct ChangeNotice {
  // Members came or went, a pod was drained, the state is new, or the
  // registry cannot tell what changed: look again (poll).
  bool membership = true;
  // When not `membership`: only releases happened, and these shards (per
  // kind) became free. A pod that waits to grow into none of them has
  // nothing new to try.
  std::map<std::string, ShardSet> freed;
  // The registry's cached view (CachedView) took in this change and every
  // one before it: a pod may act on that view instead of polling. Set by
  // RedisNodeRegistry when the announcement carries its change-log entries
  // and they follow the view; `membership` and `freed` still say what
  // happened, for a pod that polls anyway.
  bool view_current = false;
  // With `view_current`: per kind, the records of live members that these
  // changes resized, in log order. Grants and releases move no member, but
  // who holds more than the even share decides who gets the odd shards
  // (SharePlaces), so a pod follows the records that cross it.
  struct Resized {
    std::string id;
    uint64_t seq = 0;     // The change's place in the kind's log.
    uint64_t before = 0;  // Shards recorded before (0: none) and after.
    uint64_t after = 0;
  };
  std::map<std::string, std::vector<Resized>> resized;
};

// One node as the registry records it (Describe).
struct MemberDescription {
  std::string id;
  // When its lease ends on the registry's clock. At or before
  // RegistryDescription::server_time: expired (the next poll of its kind
  // drops it with what it holds).
  absl::Time lease_expiry = absl::InfinitePast();
  // What it holds; empty when nothing is recorded or the record does not
  // parse (then a warning names it).
  std::optional<Assignment> held;
};

// One kind as the registry records it (Describe).
struct KindDescription {
  // Shards in the kind's ring, as the pods' last polls recorded it; 0 when
  // unknown (a warning says why).
  uint32_t ring_size = 0;
  // Every recorded member, live or expired, sorted by id.
  std::vector<MemberDescription> members;
  // The last token granted in the kind (0: none).
  uint64_t last_token = 0;
};

// Everything the registry records, for operators (Describe).
struct RegistryDescription {
  // As in PollResult; the epoch is empty when the registry has no state yet
  // (no pod polled).
  std::string epoch;
  uint64_t version = 0;
  absl::Time server_time = absl::InfinitePast();
  absl::Time grants_from = absl::InfinitePast();
  // Drained pod -> when it was drained (registry clock; InfinitePast when
  // the recorded time does not parse: the pod still counts as drained).
  std::map<std::string, absl::Time> drained;
  std::map<std::string, KindDescription> kinds;
  // What the registry holds that its users would ignore or repair (values
  // that do not parse, members that get no share, a state the next poll
  // replaces with a new epoch), one line each, naming the key.
  std::vector<std::string> warnings;
};

// The pod part of a node id "<pod>/<kind>/<index>" (the whole id when it has
// no '/').
std::string_view PodOfNodeId(std::string_view node_id);

// The members that share the ring: `members` (sorted) without the nodes of
// `drained` pods. Every NodeManager computes targets over these, so the
// nodes of a drained pod get the empty range; when every pod is drained
// nobody gets anything.
std::vector<std::string> ShareMembers(const std::vector<std::string>& members,
                                      const std::set<std::string>& drained);

// The targets of `ids` in one kind, as every NodeManager computes them:
// AssignShards over ShareMembers(view.members, drained) and what the view
// says each holds (KindView::held must hold every live member's record: a
// poll without PollRequest::own_held_only). An id that does not share gets
// the empty set. With `places`: where `ids` stand, in their order
// (SharePlaces; UINT64_MAX for one that does not share).
absl::flat_hash_map<std::string, ShardSet> KindTargets(
    const KindView& view, const std::set<std::string>& drained,
    uint32_t ring_size, const std::vector<std::string>& ids,
    SharePlaces* places = nullptr);

// Checks an id given to SetDrained: non-empty, printable ASCII without
// spaces or '/'. kInvalidArgument naming it otherwise.
absl::Status ValidatePodId(std::string_view pod_id);

class NodeRegistry {
 public:
  virtual ~NodeRegistry() = default;

  // Renews (or registers) the leases of the request's nodes, drops members
  // of those kinds whose lease expired together with their held ranges, and
  // returns the live view of each kind. One round trip.
  // Errors: kUnavailable / kDeadlineExceeded when the registry cannot be
  // reached (retry at the next poll; self-fence if it lasts), kDataLoss when
  // its state holds something it cannot read (a key of another type, a
  // token counter that is not a token: self-fence until an operator repairs
  // it; the message names the key and the value), kInvalidArgument for a
  // bad request.
  virtual absl::StatusOr<PollResult> Poll(const Context& ctx,
                                          const PollRequest& request) = 0;

  // Records that `node_id` now works only on `keep.range`, which must lie
  // within what it holds under the same token `keep.token` (an empty range
  // releases everything, whatever is recorded). Call only after the node
  // has stopped working outside `keep.range`.
  // Errors: kFailedPrecondition if the record is missing, has another
  // token, or does not cover `keep.range` (nothing changes): the node's
  // belief is wrong, so it must stop working at once; unreachable as for
  // Poll.
  virtual absl::Status Release(const Context& ctx, const std::string& kind,
                               const std::string& node_id, Assignment keep) = 0;

  // Grants `target` to `node_id` if it is a live member and no other live
  // member holds any shard of it; returns the new fencing token (larger than
  // every token granted before in this kind).
  // `epoch` is the PollResult::epoch the caller's decision came from; a
  // grant is refused if the registry's epoch is another one by now.
  // Errors: kAborted when some shard is still held by another node, grants
  // are refused for now (epoch grace), or the epoch changed: poll and try
  // again later; kFailedPrecondition when `node_id` is not a live member
  // (its lease expired: self-fence and poll again); kDataLoss when the
  // registry's token counter holds something that is not a token (an
  // operator must repair it); unreachable as for Poll.
  virtual absl::StatusOr<uint64_t> Grant(const Context& ctx,
                                         const std::string& kind,
                                         const std::string& node_id,
                                         ShardSet target,
                                         const std::string& epoch) = 0;

  // Runs the request's releases, then its grants, each with the result
  // Release or Grant would give, and announces once. The default calls
  // Release and Grant one at a time; RedisNodeRegistry does them all in one
  // round trip and one script. An error for the whole call (unreachable,
  // kDataLoss) means some of the operations may have happened: poll before
  // trusting what the registry records.
  virtual absl::StatusOr<HandoffResult> Handoff(const Context& ctx,
                                                const HandoffRequest& request);

  // Removes the nodes and what they hold (graceful leave).
  virtual absl::Status Deregister(const Context& ctx, const std::string& kind,
                                  const std::vector<std::string>& node_ids) = 0;

  // Marks `pod_id` drained (true) or not (false) for every kind; announces
  // the change when there is one (setting what is already set is OK and
  // changes nothing). A pod need not be a member: the flag waits for it.
  // Errors: kInvalidArgument for a bad pod id (ValidatePodId); kDataLoss
  // when the registry's drain record is of another type; unreachable as
  // for Poll.
  virtual absl::Status SetDrained(const Context& ctx, const std::string& pod_id,
                                  bool drained) = 0;

  // Everything the registry records right now, read at once, without
  // changing anything (no renewal, no expiry, no new epoch).
  // Errors: kDataLoss when a key holds another type; unreachable as for
  // Poll.
  virtual absl::StatusOr<RegistryDescription> Describe(const Context& ctx) = 0;

  // `listener` runs (on a registry thread, or on the caller of a changing
  // operation) after any change by anyone, so pollers can look at once
  // instead of at the next interval. Polling stays the safety net: a missed
  // notification only delays. Returns an id for RemoveChangeListener.
  virtual int64_t AddChangeListener(std::function<void()> listener) = 0;
  // The same, with what changed when the registry can tell (RedisNodeRegistry
  // says which shards releases freed). The default passes a notice with
  // `membership` set on every change. Remove it with RemoveChangeListener.
  virtual int64_t AddNoticeListener(
      std::function<void(const ChangeNotice&)> listener);
  // The members and records of `kind` as the registry's cache has them
  // after the last poll and the announcements since (see
  // ChangeNotice::view_current); nullopt when it keeps none (the default).
  // Never a round trip. The records of the caller's own nodes are only as
  // fresh as the announcements: the lease protocol takes its own from its
  // polls and handoffs.
  virtual std::optional<KindView> CachedView(const std::string& kind);
  // Calls `read` with the view CachedView would copy and returns true, or
  // returns false without calling it when none is cached. `read` runs
  // under the registry's lock: it must be quick and must not call the
  // registry. It is also told where the view stands (CachedViewMark) and,
  // when the registry can tell, which ids changed since `since`, where the
  // caller's copy stood: a pod that keeps its own copy brings it up to
  // date this way, paying for what changed instead of copying or comparing
  // the fleet. The default calls CachedView and cannot tell.
  virtual bool ReadCachedView(
      const std::string& kind, const CachedViewMark& since,
      absl::FunctionRef<void(const CachedViewRead&)> read);
  // After this returns, the listener is not running and will not run.
  virtual void RemoveChangeListener(int64_t id) = 0;
};

}  // namespace setpoint

#endif  // SETPOINT_NODE_NODE_REGISTRY_H_
