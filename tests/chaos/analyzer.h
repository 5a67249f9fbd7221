// Analyzer: what the chaos pods' own logs say about ownership, and the
// checks the chaos test makes on them. Pure functions over parsed logs, so
// they can be tested on synthetic logs (analyzer_test.cc).
//
//   PodRecord rec{.log = *ReadPodLog(path), .death = killed_at};
//   std::vector<Interval> ivs = Intervals(rec, Cut::kValidity);
//   OwnerCheck check = CheckOneOwner(all_intervals, ring);
//   check.overlaps.empty()  // at most one owner per shard at every instant
//   CallCheck calls = CheckClientCalls({&rec, ...}, ring);
//   calls.violations.empty()  // every client call inside its node's
//                             // ownership, no two nodes' calls overlap
//
// The log format is chaos_pod.cc's (times in CLOCK_MONOTONIC ns):
//   S <ns> <pod> <pid> <nodes> <ring> <lease_ms> <poll_ms> <offset_ns>
//   B <node> <begin> <end> <token> <ns>   E <node> <ns>
//   F <node> <ns> <code>
//   C <node> <shard> <token> <start_ns> <end_ns> <code>
//   R <ns> <valid_until_ns>   T <ns> <signal>   X <ns>
//
// Ownership (as in tests/integration/failover_test.cc): a node owns shard
// s from the B line of the call that gives it s (s in the call's range, not
// in the range the node holds) until the E line of the call that takes s
// away; a call without its E line (the pod died inside it) keeps
// everything it held. A refused call (F instead of E) takes nothing away;
// the shards it adds are owned from its B (the controller may already have
// re-scoped to them, and the manager keeps a refused grow as given). Every
// interval is cut at the pod's death (the time the driver sent SIGKILL, or
// reaped the process). On top of that:
//   Cut::kValidity  also ends an interval where the pod's validity lapsed:
//                   the validity at instant t is the largest valid_until of
//                   the R lines logged at or before t; an interval starting
//                   at t0 lasts while R lines keep extending it without a
//                   gap, and ends for good at the first lapse (a later
//                   renewal does not bring it back).
//   Cut::kCalls     the UpdateShardRange calls alone, except around a
//                   SIGSTOP that outlived the pod's validity: there a node's
//                   ownership is dropped from the SIGSTOP until the E line
//                   of its first call to the empty range ending after the
//                   SIGCONT (its self-fence), or its death. A frozen process
//                   cannot stop on time; that is the pause problem fencing
//                   tokens handle, not a protocol failure.
//   Cut::kRaw       only the death cut (takeover and convergence timing).
//
// Client calls (CheckClientCalls): each C line must lie inside a raw
// ownership interval of its node on its shard (start at or after the B
// that gave it, end at or before the E that took it away: that E returns
// only after the calls ended), carry a token its node was given with that
// shard before the call started, and overlap no call of another node on
// the same shard, except inside the span Cut::kCalls drops for a SIGSTOP
// that outlived the validity, with the frozen call's token the lower one
// (the world's fencing refuses it then): those are counted as excused.
//
// Thread safety: pure functions and value types.
#ifndef SETPOINT_TESTS_CHAOS_ANALYZER_H_
#define SETPOINT_TESTS_CHAOS_ANALYZER_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "setpoint/node/shard.h"

namespace setpoint::chaos {

inline constexpr int64_t kNever = INT64_MAX;

// The shards a call names: one run or a few.
using Range = ShardSet;

// [from, to) on CLOCK_MONOTONIC ns.
using Span = std::pair<int64_t, int64_t>;

struct Renewal {
  int64_t at = 0;     // When the R line was logged.
  int64_t until = 0;  // valid_until.
};

// One UpdateShardRange call.
struct Call {
  Range to = {};
  uint64_t token = 0;
  int64_t begin = 0;     // B line.
  int64_t end = kNever;  // E or F line; kNever: none (died inside, or
                         // running).
  bool refused = false;  // F line: returned an error, released nothing.
  int code = 0;          // F line's status code.
};

// One call of a syncer's client (C line), logged as it returned.
struct ClientCall {
  std::string node = "";  // "-": the call had no assignment.
  uint32_t shard = 0;
  uint64_t token = 0;
  int64_t start = 0;  // Entered the client.
  int64_t end = 0;    // About to return.
  int code = 0;       // absl::StatusCode of the result.
};

struct PodLog {
  std::string pod = "";
  int64_t started = kNever;  // S line.
  int nodes = 0;
  uint32_t ring = 0;
  int64_t lease_ms = 0;
  int64_t poll_ms = 0;
  int64_t clock_offset_ns = 0;         // Manager clock minus CLOCK_MONOTONIC.
  int64_t stop_requested = kNever;     // T line.
  int64_t exited = kNever;             // X line.
  std::vector<Renewal> renewals = {};  // Sorted by `at`.
  std::map<std::string, std::vector<Call>> calls = {};  // Per node, in order.
  std::vector<ClientCall> client_calls = {};            // In the order logged.
  int64_t last_line = 0;  // Latest time in any line.
  int bad_lines = 0;      // Did not parse.
  int unmatched = 0;      // E/F without a B, or a B before the last E/F.
};

// Parses complete lines only (a line still being written is ignored).
PodLog ParsePodLog(std::string_view text);
// kNotFound if the file cannot be read.
absl::StatusOr<PodLog> ReadPodLog(const std::string& path);
// Names one process of a pod apart from the others that ran under the same
// pod id (static membership restarts a pod under its own id): the pod
// becomes `label` and each node "<pod_id>/..." becomes "<label>/...", in the
// calls and the client calls. Two processes with one
// pod id then count as two owners to every check.
void NameIncarnation(PodLog* log, const std::string& pod_id,
                     const std::string& label);

// One pod process: its log and what the driver did to it.
struct PodRecord {
  PodLog log;
  int64_t death = kNever;  // SIGKILL sent / process reaped; kNever: alive.
  std::vector<Span> stops = {};  // [SIGSTOP sent, SIGCONT sent); kNever: never.
};

// The spans during which the pod may act according to its R lines: each
// starts at an R line logged while not valid (with valid_until after it)
// and lasts while later R lines, logged before it runs out, extend it.
std::vector<Span> ValiditySpans(const std::vector<Renewal>& renewals);
// The end of the validity span holding `t`, or `t` itself if none does
// (validity already lapsed at t).
int64_t ValidUntil(const std::vector<Span>& spans, int64_t t);

enum class Cut { kRaw, kValidity, kCalls };

struct Interval {
  std::string pod = "";
  std::string node = "";
  uint32_t shard = 0;
  uint64_t token = 0;
  int64_t start = 0;
  int64_t end = kNever;
  // When the granting call returned (E or F); kNever: it did not.
  int64_t granted = kNever;
};

// The pod's ownership intervals (non-empty ones only), by shard then start.
std::vector<Interval> Intervals(const PodRecord& rec, Cut cut);

struct Overlap {
  uint32_t shard = 0;
  Interval first = {};  // Started first.
  Interval second = {};
  int64_t from = 0;  // Both own the shard in [from, to).
  int64_t to = 0;
};

struct OwnerCheck {
  std::vector<Overlap> overlaps = {};  // Every pair of intervals that overlap.
  int64_t shard_ns = 0;  // Sum over shards of the time with >= 2 owners.
  int64_t wall_ns = 0;   // Time during which some shard had >= 2 owners.
  std::vector<Span> windows = {};  // Those times, merged.
};

// At most one owner per shard at every instant, over `intervals` of all
// pods (shards >= ring are ignored).
OwnerCheck CheckOneOwner(const std::vector<Interval>& intervals, uint32_t ring);

// A call that took a new token (a grant from the registry).
struct Grant {
  std::string pod = "";
  std::string node = "";
  Range range = {};
  uint64_t token = 0;
  int64_t at = 0;          // B line.
  bool effective = false;  // Logged before the pod's death, while valid.
};

std::vector<Grant> Grants(const PodRecord& rec);

struct TokenViolation {
  uint32_t shard = 0;
  Grant earlier = {};  // Logged first, token >= later's.
  Grant later = {};
};

// Tokens strictly grow per shard, in the order the grants were logged.
// With effective_only, grants logged without validity (never in force) are
// left out.
std::vector<TokenViolation> CheckTokens(const std::vector<Grant>& grants,
                                        uint32_t ring, bool effective_only);

// The spans during which a SIGSTOP excuses `node`'s ownership (Cut::kCalls):
// for each stop that outlived the pod's validity, from the SIGSTOP until the
// E of the node's first call to the empty range ending after the SIGCONT
// (its self-fence), or the pod's next validity span, whichever is first.
std::vector<Span> FrozenSpans(const PodRecord& rec, const std::string& node);

// A client call that broke the one-owner promise.
struct CallViolation {
  enum class Kind {
    kNoAssignment,      // Ran without an assignment (node "-").
    kOutsideOwnership,  // Not inside an ownership interval of its node.
    kForeignToken,      // A token its node was not given with that shard.
    kOverlap,           // Overlaps another node's call on the shard.
  };
  Kind kind = Kind::kOutsideOwnership;
  std::string pod = "";
  ClientCall call = {};
  // kOutsideOwnership: the node's interval on the shard nearest the call,
  // if any (start == end == 0 when none).
  Interval owned = {};
  // kOverlap: the other call, and when both ran.
  std::string other_pod = "";
  ClientCall other = {};
  int64_t from = 0;
  int64_t to = 0;
};

// Two calls on a shard by different nodes that overlapped only while one
// of them was frozen (FrozenSpans) with the lower token.
struct ExcusedOverlap {
  std::string frozen_pod = "";
  ClientCall frozen = {};
  std::string other_pod = "";
  ClientCall other = {};
  int64_t from = 0;
  int64_t to = 0;
};

struct CallCheck {
  int64_t calls = 0;  // C lines checked.
  std::vector<CallViolation> violations = {};
  std::vector<ExcusedOverlap> excused = {};
  // Of the calls, how many started before the call granting their shard
  // returned (allowed: the controller re-scopes inside UpdateShardRange).
  int64_t started_inside_grant = 0;
  // Calls by result code (0 OK, 1 CANCELLED, ...).
  std::map<int, int64_t> by_code = {};
};

// Every client call of `pods` (shards >= ring are violations of ownership).
CallCheck CheckClientCalls(const std::vector<const PodRecord*>& pods,
                           uint32_t ring);

// How long after `from` another pod started on each shard `pod` gave up.
struct Takeover {
  uint32_t shard = 0;
  int64_t from = 0;     // When the pod stopped owning it.
  int64_t at = kNever;  // When another pod's node started; kNever: never.
  std::string successor = "";
  int64_t gap() const {
    return at == kNever ? kNever : std::max<int64_t>(0, at - from);
  }
};

// For a pod killed at `death`: the shards it held then (raw intervals
// ending at its death).
std::vector<Takeover> KillTakeovers(const std::vector<Interval>& raw,
                                    const std::string& pod, int64_t death);
// For a pod asked to stop at `term`: the shards whose intervals ended by
// its calls at or after `term` (its graceful leave), measured from each
// interval's end.
std::vector<Takeover> GracefulTakeovers(const std::vector<Interval>& raw,
                                        const std::string& pod, int64_t term);

// Spans (up to `horizon`) during which the fleet is converged: every shard
// has exactly one raw owner and every node of every live pod (S line to
// death) owns at least one shard.
std::vector<Span> ConvergedSpans(const std::vector<const PodRecord*>& pods,
                                 const std::vector<Interval>& raw,
                                 uint32_t ring);
// Time from `t` until the fleet is converged and stays so for at least
// `stable_ns` or until `horizon` (the end of the record): 0 if that holds
// from `t`; kNever if it never does.
int64_t TimeToConverge(const std::vector<Span>& converged, int64_t t,
                       int64_t stable_ns, int64_t horizon = kNever);

// Whether at instant `t` every shard has exactly one owner among the live
// `pods`, every node of each has a range, and each pod's validity covers
// `t` (when check_validity). Otherwise says why in `why`.
bool OwnedOnceAt(const std::vector<const PodRecord*>& pods, uint32_t ring,
                 int64_t t, bool check_validity, std::string* why);

// A node that held a range while its pod's validity had lapsed: either
// until it gave the range up (a late fence) or until a renewal made the pod
// valid again without the node stopping (a gap).
struct ValidityLapse {
  std::string pod = "";
  std::string node = "";
  int64_t lapsed = 0;        // Validity ran out.
  int64_t resumed = kNever;  // Valid again (a gap); kNever: a fence.
  int64_t fenced = kNever;   // E of the call to the empty range (fences).
  bool sigstop = false;      // A SIGSTOP overlapped the node's holding.
  bool fence() const { return resumed == kNever; }
  // How long the node held without validity.
  int64_t duration() const { return (fence() ? fenced : resumed) - lapsed; }
};

// Holding spans that end by the node's own call to the empty range (not by
// death) and had a lapse inside them.
std::vector<ValidityLapse> ValidityLapses(const PodRecord& rec);

// What the driver did.
struct FaultRecord {
  std::string kind = "";
  std::string target = "";  // Pod id, or "redis".
  int64_t start = 0;
  int64_t end = 0;  // Healed (== start for instant faults).
  std::string detail = "";
};

// Double ownership grouped in time, with the faults that may explain it.
struct Incident {
  int64_t from = 0;
  int64_t to = 0;
  int64_t shard_ns = 0;
  std::vector<uint32_t> shards = {};
  std::vector<Overlap> samples = {};    // A few of its overlaps.
  std::vector<size_t> faults = {};      // Indices into the fault list.
  bool faults_are_last_before = false;  // None active: the last one before.
};

// Overlap windows closer than `merge_gap_ns` form one incident; a fault is
// named when the incident starts between its start and end + `tail_ns`.
std::vector<Incident> Incidents(const OwnerCheck& check,
                                const std::vector<FaultRecord>& faults,
                                int64_t tail_ns, int64_t merge_gap_ns);

// The q-quantile (0..1) of `v` (nearest rank); 0 for an empty vector.
int64_t Quantile(std::vector<int64_t> v, double q);

}  // namespace setpoint::chaos

#endif  // SETPOINT_TESTS_CHAOS_ANALYZER_H_
