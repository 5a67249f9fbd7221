// WatchSource: a store fed by a list and then a stream of changes, the way
// Kubernetes informers and etcd watches work. The source lists once, keeps
// the list's resume token, and follows the stream from it; it keeps the
// token of every event and bookmark, resumes from it after a disconnect,
// and lists again when the stream says the token expired (the keys that
// are gone are deleted: exact tombstones).
//
//   WatchSource<std::string, Vm> source(
//       &runner, &vms,
//       [&](const Context& ctx) { return cloud.ListVms(ctx); },  // WatchList
//       [&](const Context& ctx, const std::string& token) {
//         return cloud.WatchVms(ctx, token);            // a WatchStream
//       },
//       {.name = "vms"});
//   SETPOINT_RETURN_IF_ERROR(source.Start());
//
// watch.h defines the list, event, batch and stream types. What the source
// does with each outcome:
//   - list OK: the store becomes the list (in sync); the stream opens
//     from its token.
//   - events: the store follows them; their token is kept.
//   - a batch with no events and a token (a bookmark): the token moves.
//   - a batch marked `closed` (server-side timeout): reopen from the token
//     at once.
//   - kOutOfRange from open or Next (expired): list again, then watch from
//     the new token.
//   - any other error, or no event nor bookmark for `idle_timeout` (a dead
//     stream): a failure; reopen from the token after the backoff.
//   - a failed list or open: a failure; try again after the backoff.
// Failures back off (800 ms doubling to 30 s, jittered); the backoff
// starts over once no failure happened for `backoff_reset_after` (2 min).
// After `lose_sync_after` failures in a row the store loses sync (it keeps
// its values; the syncer pauses) and the source lists again, which makes
// it in sync again. A success (a good list, an event, a bookmark) ends the
// run of failures.
//
// Rescope(filter) on the runner: the store forgets the keys outside the
// filter, loses sync, and the source lists again within it (the stream is
// closed and opened from the new list's token). A SharedSource instead
// filters its whole cache locally (shared_source.h).
//
// Threads: the user's open and Next run on the source's executor (see
// SourceExecutorOptions): an open stream holds one of its threads while it
// waits in Next. That is the price of a blocking stream; a client that
// pushes from its own thread can block Next on a queue it fills. A shared
// watch (one per kind per pod) holds one thread for all its nodes.
//
// Manual mode (`manual`): nothing runs until RunUntilIdle(), which lists,
// opens, and calls Next with a deadline of now (a stream returns what it
// has without waiting), on the caller's thread; NextWakeTime() is the next
// backoff end or idle deadline. ControllerHarness drives it so, and the
// testing kit's FakeWatchWorld answers so.
//
// Thread safety: as PollingSource (source.h). The stream is used by one
// thread at a time.
#ifndef SETPOINT_PROCESSOR_WATCH_SOURCE_H_
#define SETPOINT_PROCESSOR_WATCH_SOURCE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/backoff.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/metrics.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/watch.h"
#include "spdlog/logger.h"
#include "spdlog/spdlog.h"

namespace setpoint {

// The backoff a watch waits after a failure when its options do not say:
// client-go's, 800 ms doubling to 30 s, each delay shortened by up to 20 %.
inline BackoffOptions DefaultWatchBackoff() {
  return {.initial = absl::Milliseconds(800),
          .max = absl::Seconds(30),
          .multiplier = 2.0,
          .jitter = 0.2};
}

template <class V>
struct WatchSourceOptions {
  // Names the source in logs, /statusz and metrics.
  // Default: "watch".
  std::string name = "watch";
  // Each list call, and each call that opens a stream, gets a context with
  // this deadline. Zero: none.
  // Default: 30 s.
  absl::Duration list_timeout = absl::Seconds(30);
  // A stream that delivers no event and no bookmark for this long is taken
  // for dead (kube-rs's default). > 0.
  // Default: 290 s.
  absl::Duration idle_timeout = absl::Seconds(290);
  // The store loses sync after this many failures in a row (>= 1).
  // Default: 3.
  int lose_sync_after = 3;
  // Waits after a failure.
  // Default: DefaultWatchBackoff(): 800 ms doubling to 30 s, jitter 0.2.
  BackoffOptions backoff = DefaultWatchBackoff();
  // The backoff starts over once no failure happened for this long. > 0.
  // Default: 2 minutes.
  absl::Duration backoff_reset_after = absl::Minutes(2);
  // Same-value test for the diff; keep it equal to the store's.
  // Default: operator==.
  std::function<bool(const V&, const V&)> equal = nullptr;
  // Default: the runner's clock (Runner::clock()).
  Clock* clock = nullptr;
  // The threads open and Next run on (its clock must be the source's).
  // Must outlive the source's Stop().
  // Default: null (a private executor of one thread).
  SourceExecutor* executor = nullptr;
  // Where setpoint_source_* are published, labelled with metric_labels and
  // source=<name>.
  // Default: none.
  MetricsRegistry* metrics = nullptr;
  MetricLabels metric_labels = {};
  // Default: spdlog's default logger at construction.
  std::shared_ptr<spdlog::logger> logger = nullptr;
  // No threads: the owner drives it with RunUntilIdle().
  // Default: false.
  bool manual = false;
};

// The user's list: every item and the token to watch from.
template <class K, class V>
using WatchListFn =
    absl::AnyInvocable<absl::StatusOr<WatchList<K, V>>(const Context&)>;
// The user's watch: a stream of the changes after `token`. `ctx` is for
// this call (list_timeout); each Next gets a context of its own.
template <class K, class V>
using WatchFn =
    absl::AnyInvocable<absl::StatusOr<std::unique_ptr<WatchStream<K, V>>>(
        const Context&, const std::string&)>;

namespace source_internal {

// The list-and-watch loop: one list, one open, or one Next per step.
template <class K, class V>
class WatchDriver final : public CachedDriver<K, V> {
 public:
  using StepResult = typename SourceDriver::StepResult;

  WatchDriver(WatchListFn<K, V> list, WatchFn<K, V> watch,
              WatchSourceOptions<V> options, bool filtered, bool shared);
  ~WatchDriver() override { this->Stop(); }

  void RequestRelist(SourceRelist why) override;
  const WatchSourceOptions<V>& options() const { return options_; }

 protected:
  absl::Status Validate() const override;
  StepResult Step(const Context& ctx) override;
  bool HasInput() const override { return phase_ == Phase::kStream; }
  void RequestList() override { RequestRelist(SourceRelist::kFresh); }

 private:
  enum class Phase { kList, kOpen, kStream };
  // A threaded stream whose Next returns early with nothing is asked
  // again after this pause, not at once (no busy loop).
  static constexpr absl::Duration kEmptyPause = absl::Milliseconds(10);

  StepResult List(const Context& ctx);
  StepResult Open(const Context& ctx);
  StepResult Next(const Context& ctx);
  // Counts a failure already recorded in the health: returns the backoff;
  // after lose_sync_after in a row, the cache loses sync and the next
  // step lists.
  absl::Duration Fail();
  void CloseStream();
  bool RelistPending() {
    MutexLock l(&mu_);
    return relist_.has_value();
  }

  WatchListFn<K, V> list_;
  WatchFn<K, V> watch_;
  const WatchSourceOptions<V> options_;

  Mutex mu_;
  std::optional<SourceRelist> relist_ ABSL_GUARDED_BY(mu_);
  // The open stream's scope, for RequestRelist to cut a Next short.
  CancelScope* stream_scope_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Touched only inside Step (one at a time, on whichever thread drives
  // the source), and by HasInput on the manual driver's thread.
  Phase phase_ = Phase::kList;
  std::string token_;
  std::unique_ptr<CancelScope> scope_;
  std::unique_ptr<WatchStream<K, V>> stream_;
  absl::Time last_activity_ = absl::InfinitePast();
  // A relist asked for, counted in the health when its list lands.
  std::optional<SourceRelist> pending_relist_;
  int attempts_ = 0;  // Backoff attempts since the last reset.
  absl::Time last_failure_ = absl::InfinitePast();
  std::mt19937_64 jitter_;
};

}  // namespace source_internal

// A store fed by a list and a watch stream (see the file comment).
template <class K, class V>
class WatchSource : public Source<K, V> {
 public:
  using Map = absl::flat_hash_map<K, V>;

  WatchSource(Runner* runner, Store<K, V>* store, WatchListFn<K, V> list,
              WatchFn<K, V> watch, WatchSourceOptions<V> options = {});
  // Calls Stop().
  ~WatchSource() override { Stop(); }

  // Starts (the first list at once); in manual mode starts nothing.
  // kFailedPrecondition if already started or the executor is not
  // running; kInvalidArgument naming the field for bad options
  // (list_timeout < 0, idle_timeout <= 0, lose_sync_after < 1,
  // backoff_reset_after <= 0, bad backoff).
  absl::Status Start() { return driver_.Start(); }
  // Closes the stream (cancels its context) and waits for the call in
  // progress. Idempotent.
  void Stop() { driver_.Stop(); }
  // Lists again now, and watches from the new token (any thread).
  void Relist() { driver_.RequestRelist(SourceRelist::kFresh); }
  // Manual mode: see SourceDriver::RunUntilIdle.
  bool RunUntilIdle() { return driver_.RunUntilIdle(); }
  absl::Time NextWakeTime() const { return driver_.NextWakeTime(); }
  // Returns once a list that began after the call landed (a re-list:
  // costly for a large world). See SourceDriver::AwaitFresh.
  absl::Status AwaitFresh(const Context& ctx) {
    return driver_.AwaitFresh(ctx);
  }
  // What the source holds, within the filter. Any thread.
  Map Snapshot() const { return driver_.cache().Snapshot(); }

  // Any thread.
  SourceStatus status() const { return driver_.health().status(); }
  const SourceHealth& health() const { return driver_.health(); }
  int64_t updates_refused() const override {
    return driver_.cache().updates_refused();
  }

 protected:
  void OnFilterChanged() override {
    auto [filter, generation] = this->CurrentFilter();
    if (driver_.cache().Rescope(sub_, std::move(filter), generation)) {
      driver_.RequestRelist(SourceRelist::kRange);
    }
  }

 private:
  static WatchSourceOptions<V> Defaults(Runner* runner,
                                        WatchSourceOptions<V> o) {
    if (o.clock == nullptr) o.clock = runner->clock();
    return o;
  }

  source_internal::WatchDriver<K, V> driver_;
  const int64_t sub_;
};

// ---------------------------------------------------------------------------

namespace source_internal {

template <class K, class V>
WatchDriver<K, V>::WatchDriver(WatchListFn<K, V> list, WatchFn<K, V> watch,
                               WatchSourceOptions<V> options, bool filtered,
                               bool shared)
    : CachedDriver<K, V>(SourceDriverOptions{.name = options.name,
                                             .clock = options.clock,
                                             .executor = options.executor,
                                             .manual = options.manual,
                                             .logger = options.logger},
                         SourceCacheOptions<V>{.name = options.name,
                                               .filtered = filtered,
                                               .equal = options.equal,
                                               .logger = options.logger},
                         SourceHealthOptions{
                             .name = options.name,
                             .type = "watch",
                             .shared = shared,
                             .clock = options.clock,
                             .metrics = options.metrics,
                             .labels = WithLabels(options.metric_labels,
                                                  {{"source", options.name}})}),
      list_(std::move(list)),
      watch_(std::move(watch)),
      options_(std::move(options)),
      jitter_(std::random_device{}()) {}

template <class K, class V>
absl::Status WatchDriver<K, V>::Validate() const {
  const auto invalid = [this](const char* field, absl::Duration got) {
    return absl::InvalidArgumentError(
        absl::StrCat("start watch source ", options_.name, ": ", field,
                     " must be > 0, got ", absl::FormatDuration(got)));
  };
  if (options_.idle_timeout <= absl::ZeroDuration()) {
    return invalid("idle_timeout", options_.idle_timeout);
  }
  if (options_.backoff_reset_after <= absl::ZeroDuration()) {
    return invalid("backoff_reset_after", options_.backoff_reset_after);
  }
  return ValidateCommon("watch source", options_.name, options_.list_timeout,
                        options_.lose_sync_after, options_.backoff);
}

template <class K, class V>
void WatchDriver<K, V>::RequestRelist(SourceRelist why) {
  {
    MutexLock l(&mu_);
    relist_ = why;
    if (stream_scope_ != nullptr) stream_scope_->Cancel();
  }
  this->Trigger();
}

template <class K, class V>
void WatchDriver<K, V>::CloseStream() {
  {
    MutexLock l(&mu_);
    stream_scope_ = nullptr;
  }
  if (scope_ != nullptr) scope_->Cancel();
  stream_.reset();
  scope_.reset();
}

template <class K, class V>
absl::Duration WatchDriver<K, V>::Fail() {
  const absl::Time now = this->clock()->Now();
  if (last_failure_ != absl::InfinitePast() &&
      now - last_failure_ >= options_.backoff_reset_after) {
    attempts_ = 0;
  }
  last_failure_ = now;
  const absl::Duration delay =
      BackoffDelay(options_.backoff, attempts_,
                   std::uniform_real_distribution<double>(0, 1)(jitter_));
  if (attempts_ < (1 << 20)) ++attempts_;
  const int64_t failures = this->health_.status().consecutive_failures;
  if (failures >= options_.lose_sync_after) {
    if (this->cache_.LoseSync()) {
      SPDLOG_LOGGER_WARN(this->logger(),
                         "source lost sync source={} failures={}",
                         options_.name, failures);
    }
    if (phase_ != Phase::kList) {
      // A view that went stale is made whole by a list, not a resume.
      CloseStream();
      phase_ = Phase::kList;
      pending_relist_ = SourceRelist::kLostSync;
    }
  }
  this->PublishView();
  return delay;
}

template <class K, class V>
typename WatchDriver<K, V>::StepResult WatchDriver<K, V>::Step(
    const Context& ctx) {
  this->health_.Started();
  std::optional<SourceRelist> relist;
  {
    MutexLock l(&mu_);
    relist = std::exchange(relist_, std::nullopt);
  }
  if (relist.has_value()) {
    CloseStream();
    phase_ = Phase::kList;
    pending_relist_ = relist;
  }
  switch (phase_) {
    case Phase::kList:
      return List(ctx);
    case Phase::kOpen:
      return Open(ctx);
    case Phase::kStream:
      return Next(ctx);
  }
  return {absl::InfiniteFuture(), false};
}

template <class K, class V>
typename WatchDriver<K, V>::StepResult WatchDriver<K, V>::List(
    const Context& ctx) {
  Clock* clock = this->clock();
  const uint64_t epoch = this->cache_.epoch();
  const int64_t seq = this->ListBegins();
  const Context list_ctx = options_.list_timeout > absl::ZeroDuration()
                               ? ctx.WithTimeout(options_.list_timeout)
                               : ctx;
  const absl::Time began = clock->Now();
  absl::StatusOr<WatchList<K, V>> listed =
      CallCatching<WatchList<K, V>>("list", list_, list_ctx);
  if (ctx.Cancelled()) {
    this->ListEnded(seq, absl::CancelledError("source stopped"), false);
    return {absl::InfiniteFuture(), false};
  }
  const absl::Time ended = clock->Now();
  if (!listed.ok()) {
    this->health_.ListFailed(listed.status(), ended - began);
    const absl::Duration wait = Fail();
    SPDLOG_LOGGER_WARN(
        this->logger(), "list failed source={} failures={} retry_in={}: {}",
        options_.name, this->health_.status().consecutive_failures, wait,
        listed.status());
    this->ListEnded(seq, listed.status(), false);
    return {ended + wait, true};
  }
  const bool was_in_sync = this->cache_.InSync();
  std::string token = std::move(listed->token);
  std::optional<int64_t> changes =
      this->cache_.Replace(std::move(listed->items), epoch);
  this->health_.ListSucceeded(ended - began,
                              static_cast<int64_t>(this->cache_.size()));
  if (!changes.has_value()) {
    // Listed under a filter that changed meanwhile: list again now.
    this->ListEnded(seq, absl::OkStatus(), false);
    return {ended, true};
  }
  if (pending_relist_.has_value()) {
    this->health_.Relisted(*pending_relist_);
    pending_relist_.reset();
  }
  token_ = std::move(token);
  this->health_.SetToken(token_);
  phase_ = Phase::kOpen;
  SPDLOG_LOGGER_DEBUG(this->logger(),
                      "source listed source={} keys={} "
                      "changes={} token={}",
                      options_.name, this->cache_.size(), *changes, token_);
  if (!was_in_sync) {
    SPDLOG_LOGGER_INFO(this->logger(), "source in sync source={} keys={}",
                       options_.name, this->cache_.size());
  }
  this->ListEnded(seq, absl::OkStatus(), true);
  this->PublishView();
  return {ended, true};
}

template <class K, class V>
typename WatchDriver<K, V>::StepResult WatchDriver<K, V>::Open(
    const Context& ctx) {
  Clock* clock = this->clock();
  auto scope = std::make_unique<CancelScope>(ctx);
  {
    MutexLock l(&mu_);
    stream_scope_ = scope.get();
    if (relist_.has_value()) scope->Cancel();  // Asked for before we got here.
  }
  const Context open_ctx =
      options_.list_timeout > absl::ZeroDuration()
          ? scope->context().WithTimeout(options_.list_timeout)
          : scope->context();
  absl::StatusOr<std::unique_ptr<WatchStream<K, V>>> opened =
      CallCatching<std::unique_ptr<WatchStream<K, V>>>("watch", watch_,
                                                       open_ctx, token_);
  const absl::Time now = clock->Now();
  if (ctx.Cancelled() || RelistPending()) {
    {
      MutexLock l(&mu_);
      stream_scope_ = nullptr;
    }
    if (ctx.Cancelled()) return {absl::InfiniteFuture(), false};
    return {now, true};  // The next step lists.
  }
  absl::Status status = opened.status();
  if (status.ok() && *opened == nullptr) {
    status = absl::InternalError("watch returned no stream");
  }
  if (!status.ok()) {
    {
      MutexLock l(&mu_);
      stream_scope_ = nullptr;
    }
    if (IsWatchExpired(status)) {
      this->health_.WatchExpired();
      SPDLOG_LOGGER_INFO(this->logger(),
                         "watch expired, listing again source={} token={}: {}",
                         options_.name, token_, status);
      phase_ = Phase::kList;
      pending_relist_ = SourceRelist::kExpired;
      return {now, true};
    }
    this->health_.WatchFailed(status, WatchReconnect::kError);
    const absl::Duration wait = Fail();
    SPDLOG_LOGGER_WARN(
        this->logger(), "watch failed source={} failures={} retry_in={}: {}",
        options_.name, this->health_.status().consecutive_failures, wait,
        status);
    return {now + wait, true};
  }
  stream_ = *std::move(opened);
  scope_ = std::move(scope);
  phase_ = Phase::kStream;
  last_activity_ = now;
  this->health_.WatchOpened();
  SPDLOG_LOGGER_DEBUG(this->logger(), "watch opened source={} token={}",
                      options_.name, token_);
  return {now, true};
}

template <class K, class V>
typename WatchDriver<K, V>::StepResult WatchDriver<K, V>::Next(
    const Context& ctx) {
  Clock* clock = this->clock();
  const absl::Time idle_at = last_activity_ + options_.idle_timeout;
  const Context next_ctx =
      scope_->context().WithDeadline(this->manual() ? clock->Now() : idle_at);
  auto next = [this](const Context& c) { return stream_->Next(c); };
  absl::StatusOr<WatchBatch<K, V>> got =
      CallCatching<WatchBatch<K, V>>("watch next", next, next_ctx);
  if (ctx.Cancelled()) {
    CloseStream();
    return {absl::InfiniteFuture(), false};
  }
  const absl::Time now = clock->Now();
  if (RelistPending()) return {now, true};  // The next step lists.
  if (!got.ok() && got.status().code() != absl::StatusCode::kDeadlineExceeded) {
    const absl::Status& status = got.status();
    CloseStream();
    if (IsWatchExpired(status)) {
      this->health_.WatchExpired();
      SPDLOG_LOGGER_INFO(this->logger(),
                         "watch expired, listing again source={} token={}: {}",
                         options_.name, token_, status);
      phase_ = Phase::kList;
      pending_relist_ = SourceRelist::kExpired;
      return {now, true};
    }
    phase_ = Phase::kOpen;
    this->health_.WatchFailed(status, WatchReconnect::kError);
    const absl::Duration wait = Fail();
    SPDLOG_LOGGER_WARN(
        this->logger(),
        "watch stream broke, resuming source={} token={} failures={} "
        "retry_in={}: {}",
        options_.name, token_, this->health_.status().consecutive_failures,
        wait, status);
    return {now + wait, true};
  }
  WatchBatch<K, V> batch = got.ok() ? *std::move(got) : WatchBatch<K, V>{};
  int64_t sets = 0;
  for (const WatchEvent<K, V>& e : batch.events) {
    if (e.value.has_value()) ++sets;
  }
  const auto deletes = static_cast<int64_t>(batch.events.size()) - sets;
  const bool moved = !batch.token.empty();
  const bool bookmark = batch.events.empty() && moved;
  const bool activity = !batch.events.empty() || moved;
  if (!batch.events.empty()) this->cache_.Apply(std::move(batch.events));
  if (moved) {
    token_ = std::move(batch.token);
    this->health_.SetToken(token_);
  }
  if (activity) {
    last_activity_ = now;
    this->health_.WatchActivity(sets, deletes, bookmark);
    this->PublishView();
  }
  if (batch.closed) {
    CloseStream();
    phase_ = Phase::kOpen;
    this->health_.WatchClosed();
    SPDLOG_LOGGER_DEBUG(this->logger(),
                        "watch closed by the server, resuming source={} "
                        "token={}",
                        options_.name, token_);
    return {now, true};
  }
  if (!activity && now >= idle_at) {
    CloseStream();
    phase_ = Phase::kOpen;
    const absl::Status idle = absl::DeadlineExceededError(absl::StrCat(
        "watch idle for ", absl::FormatDuration(options_.idle_timeout),
        " (no event, no bookmark)"));
    this->health_.WatchFailed(idle, WatchReconnect::kIdle);
    const absl::Duration wait = Fail();
    SPDLOG_LOGGER_WARN(this->logger(),
                       "watch idle, resuming source={} token={} retry_in={}",
                       options_.name, token_, wait);
    return {now + wait, true};
  }
  if (activity) return {now, true};
  if (this->manual()) return {idle_at, false};
  return {std::min(idle_at, now + kEmptyPause), false};
}

}  // namespace source_internal

template <class K, class V>
WatchSource<K, V>::WatchSource(Runner* runner, Store<K, V>* store,
                               WatchListFn<K, V> list, WatchFn<K, V> watch,
                               WatchSourceOptions<V> options)
    : Source<K, V>(runner, store, options.logger),
      driver_(std::move(list), std::move(watch),
              Defaults(runner, std::move(options)), /*filtered=*/true,
              /*shared=*/false),
      sub_(driver_.cache().Subscribe(runner, store)) {}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_WATCH_SOURCE_H_
