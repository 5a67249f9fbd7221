// The Redis registry's cached views of the kinds a pod polls. A poll that
// sends the seq its view is at gets back only the changes since (from the
// kind's change log, kept by the scripts) and the held records of the ids
// it renewed, instead of every member and record: a membership change then
// costs each pod a few entries, not the whole fleet. Every full_every-th
// poll of a kind still reads everything and, when nothing was logged in
// between, says so if the view it kept differs (a write that bypassed the
// log: an older version of setpoint, or a hand edit of the keys).
//
// The node's own records always come from Redis, not from the cache: what
// the lease protocol checks about itself is never older than the poll.
//
//   PollCache cache;
//   std::optional<uint64_t> since = cache.Since("web");  // into the request
//   ... poll ...
//   if (!cache.Merge(decoded, request, &warnings)) { /* poll again */ }
//
// Thread safety: not thread-safe; the registry calls it under one mutex.
#ifndef SETPOINT_SRC_REGISTRY_REDIS_POLL_CACHE_H_
#define SETPOINT_SRC_REGISTRY_REDIS_POLL_CACHE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "registry/redis/registry_codec.h"
#include "setpoint/node/node_registry.h"

namespace setpoint::redis {

class PollCache {
 public:
  explicit PollCache(int full_every = 16) : full_every_(full_every) {}

  // The epoch of the cached views ("" when there are none).
  const std::string& epoch() const { return epoch_; }
  // The seq to ask `kind`'s changes since, or nullopt to read everything
  // (no view cached, or this is the full_every-th poll since the last full
  // read). Counts the poll.
  std::optional<uint64_t> Since(const std::string& kind);

  // Completes decoded->result where the poll sent changes only (or, with
  // PollRequest::cached_view_ok, names those kinds in from_cache and leaves
  // them with the records the poll read of the caller's ids), and caches
  // the full views that may be cached. False when changes do not follow the
  // cached view (a gap in the seqs, another epoch) or disagree with the
  // records read with them: every cached view is dropped, and the caller
  // polls again (reading everything). Appends to `warnings` what a full
  // read found the cache had missed.
  bool Merge(DecodedPoll* decoded, const PollRequest& request,
             std::vector<std::string>* warnings);

  // Applies changes announced on the change channel to `kind`'s view.
  // Entries at or below the view's seq are known already (a poll read
  // them) and skipped. kGap when the first new one does not follow the
  // view (a message was lost or sent without its entries): the view stays
  // as it is, and the next poll catches up.
  // With `resized`, appends the members' records the changes resized
  // (ChangeNotice::resized).
  enum class Applied { kApplied, kNotCached, kGap };
  Applied Apply(const std::string& kind,
                const std::vector<LoggedChange>& changes,
                std::vector<ChangeNotice::Resized>* resized = nullptr);
  // The cached view of `kind`, or nullopt when none is cached.
  std::optional<KindView> View(const std::string& kind) const;
  // Calls `read` with the cached view of `kind`, where it stands, and the
  // ids changed since `since` when the view grew from the same full read
  // and still remembers them; returns false when none is cached.
  bool Read(const std::string& kind, const CachedViewMark& since,
            absl::FunctionRef<void(const CachedViewRead&)> read) const;
  // The seq `kind`'s view is at (0 when none is cached).
  uint64_t seq(const std::string& kind) const;
  // Drops every cached view.
  void Clear();

  // How many polls were answered with changes only, and how many changes
  // they carried (for tests and benchmarks).
  int64_t change_polls() const { return change_polls_; }
  int64_t changes_applied() const { return changes_applied_; }

 private:
  struct Kind {
    uint64_t seq = 0;
    // Members: sorted, usable ids only. Records that parse, of members
    // (the view's held), and of ids that are not members (orphans: out of
    // view until they join, as in a full read).
    KindView view;
    std::map<std::string, Assignment> orphans;
    // Which full read the view grew from (PollCache-wide count), and the
    // ids each change since touched, with its seq: complete after
    // touched_from (older ones are dropped past kMaxTouched).
    uint64_t incarnation = 0;
    uint64_t touched_from = 0;
    std::vector<std::pair<uint64_t, std::string>> touched;
    int polls = 0;  // Since the last full read.
  };
  static KindView ViewOf(const Kind& k);
  // One logged change, applied to `k` (of kind `name`).
  static void ApplyOne(Kind& k, const std::string& name, const LoggedChange& c);

  // Touched ids kept per kind; the older half goes when there are more.
  static constexpr size_t kMaxTouched = 4096;

  int full_every_;
  uint64_t incarnations_ = 0;
  std::string epoch_;
  std::map<std::string, Kind> kinds_;
  int64_t change_polls_ = 0;
  int64_t changes_applied_ = 0;
};

}  // namespace setpoint::redis

#endif  // SETPOINT_SRC_REGISTRY_REDIS_POLL_CACHE_H_
