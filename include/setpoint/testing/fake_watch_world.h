// FakeWatchWorld: an in-memory world with a list-and-watch API (watch.h),
// for testing watch sources and the user's own watch code. Every change is
// a new revision; a list returns the items and the revision as its token;
// a watch from a token streams the changes after it. Faults are injected by
// hand: compaction (old tokens expire), disconnects, expiries under open
// streams, bookmarks, clean closes, silent streams, failed calls.
//
//   setpoint::testing::FakeWatchWorld<std::string, int> world;
//   world.Set("a", 1);
//   WatchSource<std::string, int> source(
//       &runner, &store,
//       [&](const Context& ctx) { return world.List(ctx); },
//       [&](const Context& ctx, const std::string& token) {
//         return world.Watch(ctx, token);
//       },
//       {.clock = &clock, .manual = true});
//   world.Compact();       // tokens before now expire: a watch re-lists
//   world.Disconnect();    // open streams break: the source resumes
//
// A stream's Next waits for changes on ctx's clock until ctx's deadline
// (with a deadline of now, as in manual mode, it returns at once).
//
// Thread safety: thread-safe.
#ifndef SETPOINT_TESTING_FAKE_WATCH_WORLD_H_
#define SETPOINT_TESTING_FAKE_WATCH_WORLD_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/watch.h"

namespace setpoint::testing {

// Counters, for tests.
struct FakeWatchWorldStats {
  int64_t lists = 0;    // List calls (also those failed on purpose).
  int64_t watches = 0;  // Watch calls (also those failed or expired).
  int64_t nexts = 0;    // Next calls.
  int64_t open_streams = 0;
  // The token each Watch call was made from, in order.
  std::vector<std::string> watched_from;
};

template <class K, class V>
class FakeWatchWorld {
 public:
  FakeWatchWorld() = default;
  FakeWatchWorld(const FakeWatchWorld&) = delete;
  FakeWatchWorld& operator=(const FakeWatchWorld&) = delete;
  // Streams must be gone first (sources stopped).
  ~FakeWatchWorld() = default;

  // Changes: each is one revision and one event for open streams.
  void Set(K key, V value);
  void Delete(const K& key);
  // Many sets as one revision each, with one wake-up.
  void SetMany(std::vector<std::pair<K, V>> items);
  // A revision with no event for these streams (another kind's change, in
  // a server with one revision counter): only a bookmark tells a quiet
  // stream the position moved.
  void BumpRevision();
  // The current revision (0 before any change).
  int64_t revision() const;
  absl::flat_hash_map<K, V> items() const;

  // Forgets the events up to `revision` (default: all): a watch from an
  // older token, and an open stream not past it, get kOutOfRange.
  void Compact(std::optional<int64_t> revision = std::nullopt);
  // Open streams break: their next Next returns kUnavailable.
  void Disconnect();
  // Open streams answer their next Next with kOutOfRange (as a server
  // that compacted underneath them).
  void ExpireStreams();
  // Open streams get a bookmark at the current revision (an empty batch
  // with its token) when they have no events to send.
  void Bookmark();
  // Open streams end cleanly: their next Next returns a `closed` batch.
  void CloseStreams();
  // While silent, streams deliver nothing, not even bookmarks (a dead
  // connection nobody noticed): the source's idle timeout must.
  void SetSilent(bool silent);
  // The next `times` List (or Watch) calls fail with `error`.
  void FailLists(absl::Status error, int times = 1);
  void FailWatches(absl::Status error, int times = 1);

  // The API the source is given.
  absl::StatusOr<WatchList<K, V>> List(const Context& ctx);
  absl::StatusOr<std::unique_ptr<WatchStream<K, V>>> Watch(
      const Context& ctx, const std::string& token);

  FakeWatchWorldStats stats() const;

 private:
  struct Event {
    int64_t revision;
    K key;
    std::optional<V> value;
  };
  // One open stream's state, kept in the world under its lock.
  struct Cursor {
    int64_t position = 0;  // The last revision delivered.
    bool broken = false;
    bool expired = false;
    bool closed = false;
    bool bookmark = false;
  };
  class Stream;

  void Append(K key, std::optional<V> value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<WatchBatch<K, V>> Next(Cursor* cursor, const Context& ctx);
  void Forget(Cursor* cursor);

  mutable Mutex mu_;
  CondVar cv_;  // A change, a fault, or a stream went away.
  absl::flat_hash_map<K, V> items_ ABSL_GUARDED_BY(mu_);
  std::vector<Event> log_ ABSL_GUARDED_BY(mu_);  // Revisions > compacted_.
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t compacted_ ABSL_GUARDED_BY(mu_) = 0;
  bool silent_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status list_error_ ABSL_GUARDED_BY(mu_);
  int list_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status watch_error_ ABSL_GUARDED_BY(mu_);
  int watch_failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<Cursor>> cursors_ ABSL_GUARDED_BY(mu_);
  FakeWatchWorldStats stats_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------

template <class K, class V>
class FakeWatchWorld<K, V>::Stream final : public WatchStream<K, V> {
 public:
  Stream(FakeWatchWorld* world, std::shared_ptr<Cursor> cursor)
      : world_(world), cursor_(std::move(cursor)) {}
  ~Stream() override { world_->Forget(cursor_.get()); }
  absl::StatusOr<WatchBatch<K, V>> Next(const Context& ctx) override {
    return world_->Next(cursor_.get(), ctx);
  }

 private:
  FakeWatchWorld* const world_;
  const std::shared_ptr<Cursor> cursor_;
};

template <class K, class V>
void FakeWatchWorld<K, V>::Append(K key, std::optional<V> value) {
  ++revision_;
  if (value.has_value()) {
    items_[key] = *value;
  } else {
    items_.erase(key);
  }
  log_.push_back(Event{revision_, std::move(key), std::move(value)});
}

template <class K, class V>
void FakeWatchWorld<K, V>::Set(K key, V value) {
  MutexLock l(&mu_);
  Append(std::move(key), std::move(value));
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::Delete(const K& key) {
  MutexLock l(&mu_);
  Append(key, std::nullopt);
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::SetMany(std::vector<std::pair<K, V>> items) {
  MutexLock l(&mu_);
  for (auto& [k, v] : items) Append(std::move(k), std::move(v));
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::BumpRevision() {
  MutexLock l(&mu_);
  ++revision_;
}

template <class K, class V>
int64_t FakeWatchWorld<K, V>::revision() const {
  MutexLock l(&mu_);
  return revision_;
}

template <class K, class V>
absl::flat_hash_map<K, V> FakeWatchWorld<K, V>::items() const {
  MutexLock l(&mu_);
  return items_;
}

template <class K, class V>
void FakeWatchWorld<K, V>::Compact(std::optional<int64_t> revision) {
  MutexLock l(&mu_);
  const int64_t to = std::min(revision.value_or(revision_), revision_);
  if (to <= compacted_) return;
  compacted_ = to;
  std::erase_if(log_, [to](const Event& e) { return e.revision <= to; });
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::Disconnect() {
  MutexLock l(&mu_);
  for (auto& c : cursors_) c->broken = true;
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::ExpireStreams() {
  MutexLock l(&mu_);
  for (auto& c : cursors_) c->expired = true;
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::Bookmark() {
  MutexLock l(&mu_);
  for (auto& c : cursors_) c->bookmark = true;
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::CloseStreams() {
  MutexLock l(&mu_);
  for (auto& c : cursors_) c->closed = true;
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::SetSilent(bool silent) {
  MutexLock l(&mu_);
  silent_ = silent;
  cv_.SignalAll();
}

template <class K, class V>
void FakeWatchWorld<K, V>::FailLists(absl::Status error, int times) {
  MutexLock l(&mu_);
  list_error_ = std::move(error);
  list_failures_ = times;
}

template <class K, class V>
void FakeWatchWorld<K, V>::FailWatches(absl::Status error, int times) {
  MutexLock l(&mu_);
  watch_error_ = std::move(error);
  watch_failures_ = times;
}

template <class K, class V>
absl::StatusOr<WatchList<K, V>> FakeWatchWorld<K, V>::List(const Context&) {
  MutexLock l(&mu_);
  ++stats_.lists;
  if (list_failures_ > 0) {
    --list_failures_;
    return list_error_;
  }
  return WatchList<K, V>{.items = items_, .token = absl::StrCat(revision_)};
}

template <class K, class V>
absl::StatusOr<std::unique_ptr<WatchStream<K, V>>> FakeWatchWorld<K, V>::Watch(
    const Context&, const std::string& token) {
  MutexLock l(&mu_);
  ++stats_.watches;
  stats_.watched_from.push_back(token);
  if (watch_failures_ > 0) {
    --watch_failures_;
    return watch_error_;
  }
  int64_t from = 0;
  if (!absl::SimpleAtoi(token, &from) || from < 0 || from > revision_) {
    return absl::InvalidArgumentError(
        absl::StrCat("watch: bad token \"", token, "\""));
  }
  if (from < compacted_) {
    return WatchExpiredError(
        absl::StrCat("watch from ", from, ": compacted at ", compacted_));
  }
  auto cursor = std::make_shared<Cursor>();
  cursor->position = from;
  cursors_.push_back(cursor);
  ++stats_.open_streams;
  return std::unique_ptr<WatchStream<K, V>>(
      std::make_unique<Stream>(this, std::move(cursor)));
}

template <class K, class V>
void FakeWatchWorld<K, V>::Forget(Cursor* cursor) {
  MutexLock l(&mu_);
  std::erase_if(cursors_, [cursor](const std::shared_ptr<Cursor>& c) {
    return c.get() == cursor;
  });
  --stats_.open_streams;
  cv_.SignalAll();
}

template <class K, class V>
absl::StatusOr<WatchBatch<K, V>> FakeWatchWorld<K, V>::Next(
    Cursor* c, const Context& ctx) {
  MutexLock l(&mu_);
  ++stats_.nexts;
  auto ready = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (c->broken || c->expired || c->closed) return true;
    if (silent_) return false;
    return c->bookmark || c->position < compacted_ ||
           (!log_.empty() && log_.back().revision > c->position);
  };
  ctx.clock()->AwaitWithDeadline(&mu_, &cv_, ctx.deadline(), ctx.stop_token(),
                                 ready);
  if (c->broken) {
    return absl::UnavailableError("watch: connection reset");
  }
  if (c->expired || c->position < compacted_) {
    return WatchExpiredError(
        absl::StrCat("watch at ", c->position, ": compacted at ", compacted_));
  }
  if (c->closed) {
    c->closed = false;
    return WatchBatch<K, V>{.token = absl::StrCat(c->position), .closed = true};
  }
  if (silent_) return WatchBatch<K, V>{};
  WatchBatch<K, V> batch;
  for (const Event& e : log_) {
    if (e.revision <= c->position) continue;
    batch.events.push_back({e.key, e.value});
    c->position = e.revision;
  }
  const bool bookmark = batch.events.empty() && c->bookmark;
  if (bookmark) c->position = revision_;
  c->bookmark = false;
  if (!batch.events.empty() || bookmark) {
    batch.token = absl::StrCat(c->position);
  }
  if (ctx.Cancelled()) return absl::CancelledError("watch: cancelled");
  return batch;
}

template <class K, class V>
FakeWatchWorldStats FakeWatchWorld<K, V>::stats() const {
  MutexLock l(&mu_);
  return stats_;
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_FAKE_WATCH_WORLD_H_
