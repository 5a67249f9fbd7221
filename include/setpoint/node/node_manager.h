// NodeManager: runs a pod's nodes and keeps each one on its own share of the
// ring, with at most one owner per shard across all pods.
//
//   InMemoryNodeRegistry registry;
//   NodeManager manager({
//       .registry = &registry,
//       .kinds = {{.kind = "vm", .count = 2,
//                  .factory = [](const NodeInfo& info) {
//                    return std::make_unique<VmNode>(info);
//                  }}},
//   });
//   SETPOINT_RETURN_IF_ERROR(manager.Start());
//   ...                       // SIGTERM
//   manager.Stop();           // hands every shard over at once, then stops
//
// The protocol (docs/registry.md): every poll_interval, or at once when the
// registry announces a change, the manager renews its nodes' leases and reads
// who is alive. Each node's target range is its even share of the ring among
// the sorted live ids. A node first shrinks (UpdateShardRange with the
// smaller range returns) and only then is the release published; it grows
// only when the registry grants shards nobody else holds, with a new fencing
// token, and only then hears about them. A node whose renewals fail stops
// working (empty range) by `last renewal sent + lease - fence_margin` on the
// monotonic clock, before the registry can let anyone else in: the relay
// timer fences it at that deadline on its own, whatever the protocol thread
// or other nodes' calls are blocked on, and every registry call is bounded
// by the time left.
// A node whose record in the registry is not exactly what it holds (range
// and token) stops at once. When the registry's state is new (a Redis
// restart, empty or from an older snapshot), every node stops and no grant
// is made for one lease.
//
// A drained pod (NodeRegistry::SetDrained, `setpointctl drain`) counts for
// no share: every manager computes targets without its nodes, so they shrink
// to the empty range by the same path, keep renewing and stay idle.
//
// A node whose Run fails is given the empty range, deregistered (so others
// take its shards), and restarted after a backoff. A node whose
// UpdateShardRange returns an error keeps its shards recorded (nobody else
// gets them) and is asked again after poll_interval / 4.
//
// Thread safety: Start and Stop belong to the owner thread (Stop may be
// called from a signal-watching thread); Nodes() and stats() from any
// thread. Threads: "sp-registry" (the protocol), per node "sp-node" (Run),
// "sp-relay-timer" (every node's fence deadline) and "sp-relay" workers
// (UpdateShardRange, in order per node): up to 4, plus one for each call
// that stayed blocked (20 ms) while the others were busy.
#ifndef SETPOINT_NODE_NODE_MANAGER_H_
#define SETPOINT_NODE_NODE_MANAGER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "setpoint/node/node.h"
#include "setpoint/node/node_registry.h"
#include "setpoint/node/shard.h"
#include "spdlog/logger.h"

namespace setpoint {

struct ViewSync;  // Internal (src/node/view_sync.h).

struct NodeKindOptions {
  // Names the kind; nodes of a kind split one ring. Non-empty, no '/'.
  std::string kind = "";
  // Nodes of this kind in this pod (> 0).
  // Default: 1.
  int count = 1;
  // Shards in the ring (> 0); every pod must use the same number.
  // Default: 4096.
  uint32_t ring_size = kDefaultRingSize;
  // Creates node `info.index` of this kind. Required.
  std::function<std::unique_ptr<Node>(const NodeInfo& info)> factory = nullptr;
};

struct NodeManagerOptions {
  // Names this process in node ids ("<pod>/<kind>/<index>"). No '/'.
  // Default: "<hostname>-<pid>".
  std::string pod_id = "";
  std::vector<NodeKindOptions> kinds = {};
  // Where nodes register. Required; must outlive the manager.
  NodeRegistry* registry = nullptr;
  // Renew and re-read this often (also the safety net under notifications).
  // Default: 500 ms.
  absl::Duration poll_interval = absl::Milliseconds(500);
  // How long a renewal keeps a node alive for the others (> poll_interval).
  // Default: 3 s.
  absl::Duration lease = absl::Seconds(3);
  // A node stops working this long before its lease could expire for the
  // others: covers clock rate drift and the time UpdateShardRange takes.
  // Zero picks max(20% of lease, poll_interval); must be < lease.
  // Default: 0.
  absl::Duration fence_margin = absl::ZeroDuration();
  // Waits between restarts of a node whose Run failed.
  // Default: 100 ms doubling to 5 minutes, jitter 0.2.
  BackoffOptions restart_backoff = {};
  // The registry calls and the graceful stop give up after this long
  // (registry calls also at the fence deadline, if that comes first).
  // Default: 2 s.
  absl::Duration operation_timeout = absl::Seconds(2);
  // Polls made because the registry announced a change (not because the
  // interval passed) are rate-limited: bursts of this many, then one per
  // poll_interval / 10. A flood of announcements is then a bounded number
  // of polls. > 0.
  // Default: 4.
  int nudge_burst = 4;
  // Static membership, for pods whose id stays the same across restarts
  // (a StatefulSet's pod name, not the default id). A graceful Stop then
  // gives up every shard but keeps the pod's nodes members until their
  // lease ends: a pod started with the same pod id before then renews them
  // and takes the freed shards back, and the rest of the fleet moves
  // nothing (a rolling restart moves only the restarting pod's shards).
  // Without such a successor the shards stay unowned until the lease ends
  // and the others take them: drain a pod (NodeRegistry::SetDrained)
  // before removing it for good. Needs an explicit pod_id, never used by
  // two live processes at once.
  // Default: false (a graceful Stop leaves the ring at once).
  bool static_membership = false;
  // Called on the protocol thread after each renewal that succeeded, with
  // the time (on `clock`) until which this pod's nodes may work without
  // another one: last renewal sent + lease - fence_margin. For metrics, and
  // for code that must check its right to act before a write. Not called
  // while a pod that missed its deadline is still stopping its nodes: it
  // reports again once they are empty and it is back in the ring.
  // Default: none.
  std::function<void(absl::Time valid_until)> on_lease_renewed = nullptr;
  // Where the manager publishes setpoint_node_* and setpoint_registry_*
  // (docs/operations.md), labelled pod=<pod_id>; also given to every node
  // (NodeInfo::metrics). Must outlive the manager.
  // Default: none.
  MetricsRegistry* metrics = nullptr;
  // The pod's updater pool, handed to every node (NodeInfo::updaters) so
  // that every node's syncers share its threads, each within its own
  // max_in_flight. The pod owns it (PodMain makes one of the pod config's
  // updater_threads): start it before Start() and stop it after Stop().
  // Null: no shared pool (each syncer owns threads, as a syncer alone does).
  // Default: none.
  UpdaterPool* updaters = nullptr;
  // The pod's loop pool, handed to every node (NodeInfo::loops) so that
  // every node's reconcile loops share its threads. The pod owns it
  // (PodMain makes one of the pod config's loop_threads): start it before
  // Start() and stop it after Stop().
  // Default: none (each loop has its own thread).
  LoopPool* loops = nullptr;
  // The pod's runner pool, handed to every node (NodeInfo::runners) so that
  // every node's runner runs on its threads. The pod owns it (PodMain makes
  // one of the pod config's runner_threads): start it before Start() and
  // stop it after Stop().
  // Default: none (each runner has its own thread).
  RunnerPool* runners = nullptr;
  // Measures leases and intervals. Must not step (tests use a simulated
  // clock).
  // Default: Clock::Monotonic().
  Clock* clock = nullptr;
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// Returns kInvalidArgument naming the field for unusable options: no
// registry, no factory, or what ValidateNodeManagerSettings refuses.
absl::Status ValidateNodeManagerOptions(const NodeManagerOptions& options);

// The checks of the settings alone, without the parts code supplies
// (registry, factories): no kinds, an empty or duplicate kind, a '/' in a
// name, count or ring size <= 0, lease < 2 * poll_interval, a fence margin
// that leaves no more than poll_interval of the lease, timeouts <= 0, a bad
// backoff. The one place these rules are written: PodConfig's parser uses
// it too.
absl::Status ValidateNodeManagerSettings(const NodeManagerOptions& options);

// The fence margin in force: options.fence_margin, or when it is zero
// max(20% of lease, poll_interval). The one place the node layer writes the
// rule.
absl::Duration EffectiveFenceMargin(const NodeManagerOptions& options);

// The default pod id: "<hostname>-<pid>".
std::string DefaultPodId();

// One node as the manager sees it.
struct NodeState {
  std::string id;
  std::string kind;
  Assignment active;  // What the node was last told (and returned from).
  bool registered = false;
  bool running = false;  // Run is executing (not failed, not stopped).
  int restarts = 0;
  // Its pod is drained (NodeRegistry::SetDrained, as of the last poll): it
  // gets no share of the ring until undrained.
  bool drained = false;
};

// Counters for operators and tests.
struct NodeManagerStats {
  int64_t polls = 0;
  int64_t poll_failures = 0;
  int64_t grants = 0;
  int64_t grant_conflicts = 0;  // Grants refused: shards still held.
  // Grants not asked for because the pod's view showed another member
  // still holding some of the shards: they wait for the release that frees
  // them (announced) or the next poll, instead of costing the registry a
  // check it would refuse.
  int64_t grants_waited = 0;
  int64_t releases = 0;
  int64_t fences = 0;  // Nodes stopped: renewals failed, record differed.
  int64_t epoch_changes = 0;  // Times the registry's state was new.
  int64_t restarts = 0;
  int64_t updates_delivered = 0;  // UpdateShardRange calls returned OK.
  int64_t update_failures = 0;    // ...that returned an error (retried).
  int64_t nudges = 0;             // Change announcements received.
  int64_t nudges_deferred = 0;    // ...that had to wait for the rate limit.
  // Announcements that releases freed shards a refused grant waits for:
  // the grant is asked for again without a poll, within the nudge rate
  // limit (announcements of releases that free nothing we wait for are
  // ignored).
  int64_t grant_retries = 0;
  // Announcements the registry's cached view took in (a change-log entry
  // each, ChangeNotice::view_current): the pod re-computed its targets on
  // that view instead of polling, within the nudge rate limit.
  int64_t views_from_notices = 0;
  // Not a counter: the last poll found this pod drained, so its nodes give
  // up their shards and stay idle until undrained.
  bool drained = false;
};

class NodeManager {
 public:
  explicit NodeManager(NodeManagerOptions options);
  // Calls Stop().
  ~NodeManager();
  NodeManager(const NodeManager&) = delete;
  NodeManager& operator=(const NodeManager&) = delete;

  // Validates the options, creates the nodes and starts them and the
  // protocol. kInvalidArgument for bad options (nothing started);
  // kFailedPrecondition if started twice; kInternal if a factory failed.
  absl::Status Start();
  // Gracefully: every node gets the empty range and returns from it, the
  // nodes are deregistered (others take over at once, without waiting for
  // the leases), then each Run is cancelled and joined. Idempotent.
  void Stop();

  const std::string& pod_id() const { return pod_id_; }
  std::vector<NodeState> Nodes() const;
  // Any thread.
  NodeManagerStats stats() const;
  // For probes and status pages, from any thread (the nodes' Report is
  // called without the manager's lock):
  // What keeps the pod from being alive: the protocol thread has not come
  // round for `stuck_after` (plus a poll interval and an operation timeout),
  // and what the nodes report stuck. Empty: alive.
  std::vector<std::string> Liveness(absl::Duration stuck_after) const;
  // What keeps it from being ready: the registry unreachable, no valid
  // lease, and what the nodes report not ready. Empty: ready.
  std::vector<std::string> Readiness(absl::Duration stuck_after) const;
  // A JSON object: pod, epoch, lease, stats, and per node its kind, range,
  // token and own report.
  std::string StatusJson(absl::Duration stuck_after) const;

  // True when nothing is in progress: the protocol waits for its next poll
  // (which is still in the future on the clock), no wake-up is pending and
  // no node is being told about a new range. Lets tests that drive a
  // simulated clock know when to move it.
  bool Idle() const;

 private:
  struct Slot;
  struct KindState;

  void Loop(std::stop_token stop);
  void Tick();
  // What changed in one kind's view since the one before: `same` when
  // nothing the rule reads did (members, records, drained pods), so the
  // targets before stand; `why` names it for the log lines
  // (lease_protocol::MoveReason; "none": only others' releases and grants).
  struct KindDelta {
    bool same = false;
    std::string why = "none";
    // The largest token among the records that came into the view, when
    // only some did (a sync); none: look at every record.
    std::optional<uint64_t> max_token;
  };
  // Brings `view` (ours, of `kind`) up to the registry's cached view from
  // where view_marks_ says it stood (SyncView, our own records left as
  // they are), moves the mark and says what changed in `sync`; false when
  // the registry has no cached view (nothing changes).
  bool SyncWithCache(const std::string& kind, KindView* view, ViewSync* sync);
  // For the kinds `result` says were answered from the registry's cache
  // (PollResult::from_cache): the view before (taken out of `previous`)
  // brought up to the cached one (SyncView) with the records of the nodes
  // `request` renewed as the poll read them, put into `result`, with what
  // changed in `deltas`.
  // False when the registry no longer has one of those views.
  bool FillFromCache(std::optional<PollResult>& previous,
                     const PollRequest& request, PollResult& result,
                     std::map<std::string, KindDelta>* deltas);
  // KindDelta per kind of last_view_ that `deltas` lacks, against the
  // view before it.
  void DeltasSince(const std::optional<PollResult>& previous,
                   std::map<std::string, KindDelta>* deltas) const;
  // After last_view_ changed (a poll, or announced changes the registry's
  // cache took in): each node's target on it, and the moves towards them.
  // `previous_targets` are the targets of the view before.
  void Retarget(
      const std::map<std::string, KindDelta>& deltas,
      std::map<std::string, std::map<std::string, ShardSet>> previous_targets);
  // Brings last_view_ up to the registry's cached views of its kinds,
  // writing only what differs (SyncView), the records of our own nodes
  // kept as our polls and handoffs left them; Retarget.
  void RefreshFromCache();
  // Gives every working node the empty range once the last renewal that
  // succeeded is too old.
  void SelfFence();
  // The time by which working nodes must have stopped unless a renewal
  // succeeds first.
  absl::Time FenceDeadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A context for one registry call: operation_timeout, and no later than
  // the fence deadline while any node works.
  Context CallContext();
  // True when the slot works on shards or is about to.
  static bool Working(const Slot& slot);
  // True when the slot works and the empty range is not queued yet.
  static bool NeedsFence(const Slot& slot);
  // Replaces what the relay has not started with the empty range (once).
  void Fence(Slot& slot, const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What one node needs from the registry next (Step), sent for all the
  // pod's nodes in one Handoff (Apply).
  struct Move {
    Slot* slot = nullptr;
    KindView* view = nullptr;
    std::optional<Assignment> release;  // What the node keeps.
    std::optional<ShardSet> grant;      // After the release, if any.
    bool deregister = false;            // A failed node leaves.
  };
  // One node's next move: queues its shrinks itself, returns what needs
  // the registry.
  std::optional<Move> Step(Slot& slot, KindView& view, ShardSet target);
  // Sends the moves' releases and grants in one Handoff (deregistrations
  // one by one) and acts on the results; `view`s are updated with our own
  // writes.
  void Apply(std::vector<Move>& moves);
  // Per kind, as of the last targets computed: where our nodes stand in the
  // order that hands out the odd shards (SharePlaces), followed through
  // others' announced grants and releases, so that a share that moves with
  // no join or leave (changes that overlap: a leave's grants still under
  // way when a join comes) is seen at once, not at the next poll; and
  // without computing the rule again on every such announcement, which
  // every pod of the fleet hears.
  struct ShareWatch {
    // False once our own records changed since (our places moved): then
    // any crossing sends us to look again.
    bool valid = false;
    uint64_t q = 0;
    uint64_t odd = 0;
    uint64_t seq = 0;  // The cached view's log seq the places are from.
    std::set<std::string> drained;
    struct Own {
      std::string id;
      uint64_t place = 0;  // UINT64_MAX: does not share.
      bool over = false;
    };
    std::vector<Own> own;
  };
  // The ring size of `kind` (kDefaultRingSize for one not configured).
  uint32_t RingSize(const std::string& kind) const;
  // Protocol thread: records where our nodes of `kind` stand, after
  // computing their targets.
  void WatchShares(const std::string& kind, const std::vector<std::string>& own,
                   const SharePlaces& places);
  // Follows one announced change of another node's record: true when one
  // of our shares moved (or may have).
  static bool FollowResize(ShareWatch& w, const ChangeNotice::Resized& r);
  // Protocol thread: the view shows a member other than the move's node
  // holding some shard of its grant (after the releases of this handoff).
  static bool HeldByOthers(
      const Move& m, const std::vector<HandoffRequest::ReleaseOp>& releases);
  // Protocol thread: why the kind's targets last moved ("none" before any).
  const std::string& Reason(const std::string& kind) const;
  void Deliver(Slot& slot, Assignment assignment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FenceAll(const char* why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes one nudge token if there is one (refilling first).
  bool TakeNudgeToken(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The relays: one timer thread fences nodes at their deadline and starts
  // workers for nodes with an update waiting: up to 4 at once, then one
  // more whenever every worker has been inside its call for 20 ms; those
  // beyond 4 leave after idling 1 s. Workers run UpdateShardRange, one call
  // per node at a time, in order. So a settled pod has 4 relay workers, not
  // one per node.
  void RelayTimer(std::stop_token stop);
  void RelayWorker(int64_t id, std::stop_token stop);
  // The node works and its fence deadline passed.
  bool FenceDue(const Slot& slot, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node has an update to deliver now and no call running.
  bool Ready(const Slot& slot, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int ReadyCount(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // How many relay workers the timer should start now.
  int RelaysToStart(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The earliest fence deadline of a working node or end of a refusal's
  // pause.
  absl::Time NextRelayDeadline(absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The restart loop (restart_loop.cc): runs the node, or for a threadless
  // one launches it and ends; after a failure (`failed`, when the loop starts
  // with one) waits until the node holds nothing, backs off and starts it
  // again.
  void RunLoop(Slot& slot, std::stop_token stop, absl::Status failed);
  // Calls a threadless node's Launch; its failure, or OK.
  absl::Status LaunchNode(Slot& slot);
  // Calls a launched threadless node's Halt (nothing for another node).
  void HaltNode(Slot& slot);
  // A graceful Stop's leave (leave.cc): empties the nodes, then
  // deregisters them, or with static_membership releases their shards and
  // keeps them members (KeepPlaces).
  void GracefulLeave();
  void KeepPlaces(const std::map<std::string, std::vector<std::string>>& leave,
                  bool ever_registered);
  // After the first poll: deregisters members named after this pod that
  // are not its nodes (a predecessor's, kept by static membership, when
  // this pod has fewer nodes of the kind). Protocol thread.
  void DropPredecessorsExtraPlaces();
  void Wake(const ChangeNotice& notice);
  // Metrics (no-op without options_.metrics): cells made at Start, counts
  // of registry errors (call without mu_: the registry's lock comes first).
  void InitMetrics();
  void CountError(const char* op, const absl::Status& s);
  void CollectMetrics(MetricWriter& w) const;
  // The slots, read under the lock (their nodes do not change after Start).
  std::vector<const Slot*> ReportedSlots() const;
  Histogram* poll_duration_ = nullptr;
  Histogram* handoff_duration_ = nullptr;
  MetricsCollectorHandle collector_;

  NodeManagerOptions options_;
  const std::string pod_id_;
  Clock* const clock_;
  std::shared_ptr<spdlog::logger> logger_;
  absl::Duration fence_margin_;

  mutable Mutex mu_;
  CondVar cv_;
  std::vector<std::unique_ptr<Slot>> slots_;  // Fixed after Start().
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  // The next tick must poll (interval passed, or the registry changed);
  // otherwise it acts on last_view_.
  bool poll_needed_ ABSL_GUARDED_BY(mu_) = true;
  // A change announcement waits for a nudge token.
  bool nudged_ ABSL_GUARDED_BY(mu_) = false;
  bool nudge_arrived_ ABSL_GUARDED_BY(mu_) = false;  // Since the last look.
  // A release freed shards a refused grant waits for: ask again (without a
  // poll) once a nudge token allows.
  bool grant_retry_ ABSL_GUARDED_BY(mu_) = false;
  // The registry's cached view took in announced changes: look at it
  // (without a poll) once a nudge token allows (view_changed_), and the
  // next tick does (refresh_view_).
  bool view_changed_ ABSL_GUARDED_BY(mu_) = false;
  bool refresh_view_ ABSL_GUARDED_BY(mu_) = false;
  // A refused grant already asked for an early poll (once per streak of
  // refusals: reset by a grant or an announced change).
  bool refusal_polled_ ABSL_GUARDED_BY(mu_) = false;
  double nudge_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time nudge_refilled_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // When the interval asks for the next poll.
  absl::Time next_poll_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // While the registry refuses grants (a new epoch): when they open, on our
  // clock. InfinitePast when they are open.
  absl::Time grants_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Kind -> targets of the grants sent in the last handoff and not
  // granted: a notice that frees any of their shards makes us ask again.
  std::map<std::string, ShardSet> wants_ ABSL_GUARDED_BY(mu_);
  // Per kind, the shards that announcements said were freed since the
  // protocol thread last read its view (a poll or the cached view): a
  // grant held back on that view waits for nothing if they are in it.
  std::map<std::string, ShardSet> freed_since_view_ ABSL_GUARDED_BY(mu_);
  // Per kind: see ShareWatch.
  std::map<std::string, ShareWatch> share_watch_ ABSL_GUARDED_BY(mu_);
  // Per kind, the resizes announced and not yet in a view places were
  // computed from: WatchShares follows those past its view's seq (they may
  // come while it computes).
  std::map<std::string, std::vector<ChangeNotice::Resized>> resizes_
      ABSL_GUARDED_BY(mu_);
  // Protocol thread only: the highest registry version seen, the last
  // poll's view and targets.
  uint64_t max_version_ = 0;
  // Kind -> the highest token seen in a poll or granted to our nodes
  // (PollRequest::min_tokens).
  std::map<std::string, uint64_t> max_tokens_;
  std::optional<PollResult> last_view_;
  // The first poll's view was checked for a predecessor's extra nodes.
  bool predecessor_checked_ = false;
  // Kind -> where last_view_'s view of it stood in the registry's cache
  // when it was last brought up to it (ReadCachedView), so the next time
  // only the ids changed since are looked at. None for a view a poll read
  // whole.
  std::map<std::string, CachedViewMark> view_marks_;
  std::map<std::string, std::map<std::string, ShardSet>> last_targets_;
  // Kind -> why its targets last moved (join, leave, drain, epoch, start;
  // lease_protocol::MoveReason), for the handoff's log lines.
  std::map<std::string, std::string> move_reasons_;
  // The loop is blocked until wait_until_ (for Idle()).
  bool waiting_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time wait_until_ ABSL_GUARDED_BY(mu_);
  std::string epoch_ ABSL_GUARDED_BY(mu_);
  // When the last renewal that succeeded was sent (manager's clock).
  absl::Time renewed_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  NodeManagerStats stats_ ABSL_GUARDED_BY(mu_);
  // The last poll found this pod drained.
  bool drained_ ABSL_GUARDED_BY(mu_) = false;
  // Poll failures in a row, and when one was last logged (rate limit).
  int64_t failure_streak_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_poll_error_ ABSL_GUARDED_BY(mu_);
  // When the protocol thread last came round (for Liveness).
  absl::Time last_tick_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Time last_failure_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t listener_ = 0;  // Our change listener in the registry.
  std::atomic<std::thread::id> loop_id_{};  // The protocol thread.
  std::stop_source nodes_stop_;
  // Relay workers not inside UpdateShardRange (counting those starting).
  int idle_relays_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::jthread> relays_ ABSL_GUARDED_BY(mu_);
  int64_t next_relay_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers that left after idling, for the timer to join.
  std::vector<int64_t> retired_relays_ ABSL_GUARDED_BY(mu_);
  std::jthread relay_timer_;
  std::jthread loop_;
};

}  // namespace setpoint

#endif  // SETPOINT_NODE_NODE_MANAGER_H_
