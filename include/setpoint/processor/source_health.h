// SourceHealth: what a source tells operators — its counters, its last
// success and last error, whether its view is complete — as a status
// snapshot, a /statusz entry, a readiness message that says what is wrong
// now, and the setpoint_source_* series (docs/operations.md).
//
//   SourceHealth health({.name = "zone", .type = "poll", .clock = clock,
//                        .metrics = &metrics,
//                        .labels = {{"kind", "records"}, {"source", "zone"}}});
//   health.ListFailed(absl::UnavailableError("api down"), took);
//   std::string why = health.NotReady();
//   // "source zone has not listed yet: last list failed 3s ago:
//   //  UNAVAILABLE: api down (1 failure in a row)"
//
// Every source (PollingSource, WatchSource, SharedSource) keeps one and
// records into it from whichever thread drives it; a Controller publishes
// it per node.
//
// Thread safety: thread-safe.
#ifndef SETPOINT_PROCESSOR_SOURCE_HEALTH_H_
#define SETPOINT_PROCESSOR_SOURCE_HEALTH_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"

namespace setpoint {

struct SourceHealthOptions {
  // The source's name, as messages and /statusz show it.
  std::string name = "source";
  // "poll" or "watch".
  std::string type = "poll";
  // One source feeds the stores of several nodes (SharedSource).
  bool shared = false;
  // Times of successes and failures.
  // Default: Clock::Real().
  Clock* clock = nullptr;
  // Where setpoint_source_* are published, labelled with `labels` (name
  // the source there: source=<name>). Null: nothing is published.
  MetricsRegistry* metrics = nullptr;
  MetricLabels labels = {};
};

// What a source last did. A value.
struct SourceStatus {
  std::string name;
  std::string type;  // "poll" or "watch".
  bool shared = false;
  // The source's view is complete: listed, and not lost since.
  bool in_sync = false;
  int64_t items = 0;  // Keys in the source's cache.
  int64_t lists = 0;  // List calls that returned (good or failed).
  int64_t list_failures = 0;
  // Lists made again because a watch expired, the range changed, or a
  // reader asked for fresh state (SourceRelist).
  int64_t relists = 0;
  int64_t watch_opens = 0;   // Streams opened.
  int64_t watch_events = 0;  // Sets and deletes received.
  int64_t bookmarks = 0;
  int64_t watch_failures = 0;  // Opens and streams that failed, idle timeouts.
  int64_t expiries = 0;        // Watches that answered "expired".
  // Failures (lists, watches) since the last success.
  int64_t consecutive_failures = 0;
  // The last good list, or watch event or bookmark; InfinitePast: none.
  absl::Time last_success = absl::InfinitePast();
  // The last failure and what it was; InfinitePast: none.
  absl::Time last_failure = absl::InfinitePast();
  absl::Status last_error = absl::OkStatus();
  std::string last_failure_op;  // "list" or "watch".
  // When the source started; InfinitePast: not yet.
  absl::Time started = absl::InfinitePast();
  // The watch's resume token (empty for a poll, or before the first list).
  std::string token;
};

// Why a relist happened (setpoint_source_relists_total{reason}): a watch
// expired, a filtered source's range changed, a reader asked for fresh
// state (AwaitFresh), or failures made the view lose sync.
enum class SourceRelist { kExpired, kRange, kFresh, kLostSync };
// Why a watch stream was opened again
// (setpoint_source_watch_reconnects_total{reason}).
enum class WatchReconnect { kError, kIdle, kClosed };

class SourceHealth {
 public:
  explicit SourceHealth(SourceHealthOptions options);
  SourceHealth(const SourceHealth&) = delete;
  SourceHealth& operator=(const SourceHealth&) = delete;
  ~SourceHealth();

  // Recorded by the source as it works.
  void Started();
  void ListSucceeded(absl::Duration took, int64_t items);
  void ListFailed(const absl::Status& error, absl::Duration took);
  void Relisted(SourceRelist why);
  void WatchOpened();
  // Events received in one batch (bookmark: the batch only moved the token).
  void WatchActivity(int64_t sets, int64_t deletes, bool bookmark);
  // A stream broke (kError) or stayed idle (kIdle): a failure.
  void WatchFailed(const absl::Status& error, WatchReconnect why);
  // A stream ended cleanly (kClosed): not a failure.
  void WatchClosed();
  void WatchExpired();
  void SetToken(std::string token);
  // The cache's state after a change.
  void SetView(bool in_sync, int64_t items);

  SourceStatus status() const;
  // Why the source keeps its stores from being ready, now (empty: it does
  // not): it never listed, or its view is not complete, with the last
  // failure and its age. See the file comment for an example.
  std::string NotReady() const;
  // Appends a JSON object with status() to `out` (the /statusz entry);
  // `more`, if not empty, is appended inside it (",\"keys\":12").
  void AppendJson(std::string* out, std::string_view more = {}) const;

 private:
  void CountError(const char* op, const absl::Status& error);

  const SourceHealthOptions options_;
  Clock* const clock_;
  mutable Mutex mu_;
  SourceStatus status_ ABSL_GUARDED_BY(mu_);
  // For the scrape-time age (the collector reads no lock of ours: the
  // registry's lock is held meanwhile).
  std::atomic<int64_t> last_success_ns_{0};
  std::atomic<int64_t> started_ns_{0};
  // Cells (null without metrics).
  Counter* lists_ok_ = nullptr;
  Counter* lists_failed_ = nullptr;
  Histogram* list_duration_ = nullptr;
  Counter* relists_[4] = {};
  Counter* events_set_ = nullptr;
  Counter* events_delete_ = nullptr;
  Counter* bookmarks_ = nullptr;
  Counter* reconnects_[3] = {};
  Gauge* items_ = nullptr;
  Gauge* in_sync_ = nullptr;
  MetricsCollectorHandle collector_;
};

// The readiness message for `status` at `now` (what SourceHealth::NotReady
// says). Empty when in sync.
std::string SourceNotReadyMessage(const SourceStatus& status, absl::Time now);

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_SOURCE_HEALTH_H_
