#include "setpoint/processor/source_health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "setpoint/base/format.h"
#include "setpoint/base/json.h"
#include "setpoint/base/status.h"

namespace setpoint {
namespace {

constexpr const char* kRelistReasons[] = {"expired", "range", "fresh",
                                          "lost_sync"};
constexpr const char* kReconnectReasons[] = {"error", "idle_timeout", "closed"};

int64_t UnixNanos(absl::Time t) { return absl::ToUnixNanos(t); }

// "3.2s", "250ms": short enough for a probe's line.
std::string Age(absl::Duration d) { return HumanDuration(d); }

void AppendTime(std::string* out, absl::Time t) {
  if (t == absl::InfinitePast()) {
    out->append("null");
    return;
  }
  AppendJsonString(
      out, absl::FormatTime(absl::RFC3339_full, t, absl::UTCTimeZone()));
}

void AppendAge(std::string* out, absl::Time t, absl::Time now) {
  if (t == absl::InfinitePast()) {
    out->append("null");
    return;
  }
  absl::StrAppendFormat(out, "%.3f", absl::ToDoubleSeconds(now - t));
}

}  // namespace

SourceHealth::SourceHealth(SourceHealthOptions options)
    : options_(std::move(options)),
      clock_(options_.clock != nullptr ? options_.clock : Clock::Real()) {
  status_.name = options_.name;
  status_.type = options_.type;
  status_.shared = options_.shared;
  MetricsRegistry* m = options_.metrics;
  if (m == nullptr) return;
  const MetricLabels& l = options_.labels;
  lists_ok_ = &m->GetCounter("setpoint_source_lists_total",
                             "List calls that returned, by result.",
                             WithLabels(l, {{"result", "success"}}));
  lists_failed_ = &m->GetCounter("setpoint_source_lists_total",
                                 "List calls that returned, by result.",
                                 WithLabels(l, {{"result", "error"}}));
  list_duration_ = &m->GetHistogram("setpoint_source_list_duration_seconds",
                                    "How long list calls took.", l,
                                    Histogram::DurationBuckets());
  for (int i = 0; i < 4; ++i) {
    relists_[i] = &m->GetCounter(
        "setpoint_source_relists_total",
        "Lists made again: a watch expired, the range changed, a reader "
        "asked for fresh state, or failures lost sync.",
        WithLabels(l, {{"reason", kRelistReasons[i]}}));
  }
  for (int i = 0; i < 3; ++i) {
    reconnects_[i] = &m->GetCounter(
        "setpoint_source_watch_reconnects_total",
        "Watch streams opened again from the resume token, by reason.",
        WithLabels(l, {{"reason", kReconnectReasons[i]}}));
  }
  events_set_ = &m->GetCounter("setpoint_source_watch_events_total",
                               "Watch events received, by type.",
                               WithLabels(l, {{"type", "set"}}));
  events_delete_ = &m->GetCounter("setpoint_source_watch_events_total",
                                  "Watch events received, by type.",
                                  WithLabels(l, {{"type", "delete"}}));
  bookmarks_ = &m->GetCounter("setpoint_source_watch_events_total",
                              "Watch events received, by type.",
                              WithLabels(l, {{"type", "bookmark"}}));
  items_ =
      &m->GetGauge("setpoint_source_items", "Keys in the source's cache.", l);
  in_sync_ = &m->GetGauge("setpoint_source_in_sync",
                          "1 when the source's view is complete.", l);
  collector_ = m->AddCollector([this, l](MetricWriter& w) {
    const int64_t last = last_success_ns_.load(std::memory_order_acquire);
    const int64_t started = started_ns_.load(std::memory_order_acquire);
    const int64_t since = last != 0 ? last : started;
    if (since == 0) return;
    const double age =
        static_cast<double>(UnixNanos(clock_->Now()) - since) * 1e-9;
    w.Gauge("setpoint_source_last_success_age_seconds",
            "Time since the last good list or watch event (since the start "
            "before the first).",
            l, age < 0 ? 0 : age);
  });
}

SourceHealth::~SourceHealth() { collector_.Reset(); }

void SourceHealth::Started() {
  const absl::Time now = clock_->Now();
  {
    MutexLock l(&mu_);
    if (status_.started == absl::InfinitePast()) status_.started = now;
  }
  int64_t expected = 0;
  started_ns_.compare_exchange_strong(expected, UnixNanos(now));
}

void SourceHealth::ListSucceeded(absl::Duration took, int64_t items) {
  const absl::Time now = clock_->Now();
  {
    MutexLock l(&mu_);
    ++status_.lists;
    status_.consecutive_failures = 0;
    status_.last_success = now;
    status_.items = items;
  }
  last_success_ns_.store(UnixNanos(now), std::memory_order_release);
  if (lists_ok_ != nullptr) {
    lists_ok_->Increment();
    list_duration_->ObserveDuration(took);
  }
}

void SourceHealth::ListFailed(const absl::Status& error, absl::Duration took) {
  const absl::Time now = clock_->Now();
  {
    MutexLock l(&mu_);
    ++status_.lists;
    ++status_.list_failures;
    ++status_.consecutive_failures;
    status_.last_failure = now;
    status_.last_error = UnsharedCopy(error);
    status_.last_failure_op = "list";
  }
  if (lists_failed_ != nullptr) {
    lists_failed_->Increment();
    list_duration_->ObserveDuration(took);
  }
  CountError("list", error);
}

void SourceHealth::Relisted(SourceRelist why) {
  {
    MutexLock l(&mu_);
    ++status_.relists;
  }
  Counter* c = relists_[static_cast<int>(why)];
  if (c != nullptr) c->Increment();
}

void SourceHealth::WatchOpened() {
  MutexLock l(&mu_);
  ++status_.watch_opens;
}

void SourceHealth::WatchActivity(int64_t sets, int64_t deletes, bool bookmark) {
  const absl::Time now = clock_->Now();
  {
    MutexLock l(&mu_);
    status_.watch_events += sets + deletes;
    if (bookmark) ++status_.bookmarks;
    status_.consecutive_failures = 0;
    status_.last_success = now;
  }
  last_success_ns_.store(UnixNanos(now), std::memory_order_release);
  if (events_set_ != nullptr) {
    if (sets > 0) events_set_->Increment(static_cast<double>(sets));
    if (deletes > 0) events_delete_->Increment(static_cast<double>(deletes));
    if (bookmark) bookmarks_->Increment();
  }
}

void SourceHealth::WatchFailed(const absl::Status& error, WatchReconnect why) {
  const absl::Time now = clock_->Now();
  {
    MutexLock l(&mu_);
    ++status_.watch_failures;
    ++status_.consecutive_failures;
    status_.last_failure = now;
    status_.last_error = UnsharedCopy(error);
    status_.last_failure_op = "watch";
  }
  Counter* c = reconnects_[static_cast<int>(why)];
  if (c != nullptr) c->Increment();
  CountError("watch", error);
}

void SourceHealth::WatchClosed() {
  Counter* c = reconnects_[static_cast<int>(WatchReconnect::kClosed)];
  if (c != nullptr) c->Increment();
}

void SourceHealth::WatchExpired() {
  MutexLock l(&mu_);
  ++status_.expiries;
}

void SourceHealth::SetToken(std::string token) {
  MutexLock l(&mu_);
  status_.token = std::move(token);
}

void SourceHealth::SetView(bool in_sync, int64_t items) {
  {
    MutexLock l(&mu_);
    status_.in_sync = in_sync;
    status_.items = items;
  }
  if (items_ != nullptr) {
    items_->Set(static_cast<double>(items));
    in_sync_->Set(in_sync ? 1 : 0);
  }
}

void SourceHealth::CountError(const char* op, const absl::Status& error) {
  if (options_.metrics == nullptr) return;
  options_.metrics
      ->GetCounter(
          "setpoint_source_errors_total",
          "Failed lists and watches, by operation and status code.",
          WithLabels(
              options_.labels,
              {{"op", op}, {"code", absl::StatusCodeToString(error.code())}}))
      .Increment();
}

SourceStatus SourceHealth::status() const {
  MutexLock l(&mu_);
  SourceStatus copy = status_;
  // The caller's thread gets an error of its own (see UnsharedCopy).
  copy.last_error = UnsharedCopy(status_.last_error);
  return copy;
}

std::string SourceHealth::NotReady() const {
  return SourceNotReadyMessage(status(), clock_->Now());
}

std::string SourceNotReadyMessage(const SourceStatus& s, absl::Time now) {
  if (s.in_sync) return "";
  std::string out = absl::StrCat("source ", s.name);
  const bool listed = s.last_success != absl::InfinitePast();
  const bool failing =
      s.consecutive_failures > 0 && s.last_failure != absl::InfinitePast();
  out.append(listed ? ": not in sync" : " has not listed yet");
  if (failing) {
    absl::StrAppend(
        &out, ": last ", s.last_failure_op, " failed ",
        Age(now - s.last_failure), " ago: ", s.last_error.ToString(), " (",
        s.consecutive_failures,
        s.consecutive_failures == 1 ? " failure" : " failures", " in a row");
    if (listed) {
      absl::StrAppend(&out, "; last success ", Age(now - s.last_success),
                      " ago");
    }
    out.append(")");
  } else if (listed) {
    absl::StrAppend(&out, ": listing again (last success ",
                    Age(now - s.last_success), " ago)");
  } else if (s.started != absl::InfinitePast()) {
    absl::StrAppend(&out, " (started ", Age(now - s.started), " ago)");
  }
  return out;
}

void SourceHealth::AppendJson(std::string* out, std::string_view more) const {
  const absl::Time now = clock_->Now();
  const SourceStatus s = status();
  out->append("{\"source\":");
  AppendJsonString(out, s.name);
  out->append(",\"type\":");
  AppendJsonString(out, s.type);
  absl::StrAppend(out, ",\"shared\":", s.shared ? "true" : "false",
                  ",\"in_sync\":", s.in_sync ? "true" : "false",
                  ",\"items\":", s.items, ",\"lists\":", s.lists,
                  ",\"list_failures\":", s.list_failures,
                  ",\"relists\":", s.relists,
                  ",\"consecutive_failures\":", s.consecutive_failures);
  if (s.type == "watch") {
    absl::StrAppend(out, ",\"watch_opens\":", s.watch_opens,
                    ",\"watch_events\":", s.watch_events,
                    ",\"bookmarks\":", s.bookmarks,
                    ",\"watch_failures\":", s.watch_failures,
                    ",\"expiries\":", s.expiries, ",\"token\":");
    AppendJsonString(out, s.token);
  }
  out->append(",\"last_success\":");
  AppendTime(out, s.last_success);
  out->append(",\"last_success_age_seconds\":");
  AppendAge(out, s.last_success, now);
  out->append(",\"last_error\":");
  if (s.last_failure == absl::InfinitePast()) {
    out->append("null");
  } else {
    AppendJsonString(out, s.last_error.ToString());
  }
  out->append(",\"last_error_age_seconds\":");
  AppendAge(out, s.last_failure, now);
  out->append(more);
  out->push_back('}');
}

}  // namespace setpoint
