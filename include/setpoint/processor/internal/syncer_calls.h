// The Syncer's member definitions, part two: starting and stopping,
// handing operations over to the dispatcher, calling the client and
// applying the results. Included by setpoint/processor/syncer.h only.
#ifndef SETPOINT_PROCESSOR_INTERNAL_SYNCER_CALLS_H_
#define SETPOINT_PROCESSOR_INTERNAL_SYNCER_CALLS_H_

#include <algorithm>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/base/logging.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/internal/syncer_keys.h"
#include "spdlog/spdlog.h"

namespace setpoint {

// ---- Construction, Start, Stop ----------------------------------------------

template <class K, class D, class O>
Syncer<K, D, O>::Syncer(Runner* runner, Client* client, Options options)
    : Syncer(runner, client, nullptr, std::move(options)) {}

template <class K, class D, class O>
Syncer<K, D, O>::Syncer(Runner* runner, BatchClient* client, Options options)
    : Syncer(runner, nullptr, client, std::move(options)) {}

template <class K, class D, class O>
Syncer<K, D, O>::Syncer(Runner* runner, Client* client, BatchClient* batch,
                        Options options)
    : Synchronizable(options.name),
      runner_(runner),
      client_(client),
      batch_client_(batch),
      options_(WithDefaults(std::move(options), batch != nullptr)),
      clock_(options_.clock != nullptr ? options_.clock : runner->clock()),
      logger_(options_.logger != nullptr ? options_.logger
                                         : spdlog::default_logger()),
      rules_{
          .execution_delay = absl::ToInt64Nanoseconds(options_.execution_delay),
          .create = options_.enable_create,
          .update = options_.enable_update,
          .delete_ = options_.enable_delete},
      pause_rules_{.after = options_.pause_after,
                   .codes = options_.pause_codes,
                   .probe = options_.pause_probe},
      counters_(options_.metrics, WithLabels(options_.metric_labels,
                                             {{"syncer", options_.name}})),
      dispatcher_(this,
                  {.name = options_.name,
                   .max_batch = batch != nullptr ? options_.max_batch : 0,
                   .max_batches = options_.max_batches_in_flight,
                   .hand_back = std::clamp(options_.max_in_flight / 4, 1, 64),
                   .operation_timeout = options_.operation_timeout,
                   .clock = clock_,
                   .logger = logger_}),
      bucket_(options_.rate_limit, options_.rate_burst),
      rng_(options_.seed != 0 ? options_.seed : std::random_device{}()) {}

template <class K, class D, class O>
typename Syncer<K, D, O>::Options Syncer<K, D, O>::WithDefaults(Options o,
                                                                bool batch) {
  if (o.max_in_flight == 0) {
    o.max_in_flight = batch ? std::max(1, o.max_batch) *
                                  (std::max(1, o.max_batches_in_flight) + 1)
                            : 64;
  }
  return o;
}

template <class K, class D, class O>
absl::Status Syncer<K, D, O>::Validate() const {
  const Options& o = options_;
  if (o.needs_update == nullptr) {
    if constexpr (!std::equality_comparable_with<D, O>) {
      return absl::InvalidArgumentError(absl::StrCat(
          "start syncer ", name(),
          ": needs_update is required when desired and observed types "
          "cannot be compared with =="));
    }
  }
  if (client_ == nullptr && batch_client_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("start syncer ", name(), ": client is null"));
  }
  return internal::ValidateSyncerLimits(
      name(), batch_client_ != nullptr, o.max_in_flight, o.updater_threads,
      o.max_batch, o.max_batches_in_flight, o.rate_limit, o.rate_burst,
      o.batch_delay, o.execution_delay, o.expectation_timeout,
      o.operation_timeout, o.pause_after, o.backoff, o.pause_probe);
}

template <class K, class D, class O>
Syncer<K, D, O>::~Syncer() {
  Stop();
  timer_.Cancel();
  alive_.reset();
}

template <class K, class D, class O>
absl::Status Syncer<K, D, O>::Start() {
  SETPOINT_RETURN_IF_ERROR(Validate());
  const Options& o = options_;
  UpdaterPool* pool = nullptr;
  int threads = 0;
  if (o.manual_updates) {
    // Calls run in RunUntilIdle.
  } else if (o.pool != nullptr) {
    pool = o.pool;
    threads = o.pool->threads();
  } else if (own_pool_ == nullptr) {
    threads = o.updater_threads > 0      ? o.updater_threads
              : batch_client_ != nullptr ? o.max_batches_in_flight
                                         : std::min(o.max_in_flight, 8);
    auto own = std::make_unique<UpdaterPool>(UpdaterPoolOptions{
        .name = o.name, .threads = threads, .logger = logger_});
    if (absl::Status s = own->Start(); !s.ok()) {
      return Annotate(s, absl::StrCat("start syncer ", name()));
    }
    own_pool_ = std::move(own);
    pool = own_pool_.get();
  } else {
    pool = own_pool_.get();
  }
  SETPOINT_RETURN_IF_ERROR(dispatcher_.Start(pool));
  SPDLOG_LOGGER_INFO(logger_,
                     "syncer started syncer={} updaters={} shared_pool={} "
                     "max_in_flight={} batch={}",
                     name(), threads, o.pool != nullptr, o.max_in_flight,
                     batch_client_ != nullptr ? o.max_batch : 0);
  return absl::OkStatus();
}

template <class K, class D, class O>
void Syncer<K, D, O>::Stop() {
  if (stop_called_) return;
  stop_called_ = true;
  std::vector<internal::DispatchedCall*> undone = dispatcher_.Stop();
  if (own_pool_ != nullptr) own_pool_->Stop();  // Joins.
  if (!undone.empty()) {
    counters_.Add(internal::SyncerCounters::kNotStartedAtStop,
                  static_cast<int64_t>(undone.size()));
    SPDLOG_LOGGER_WARN(logger_,
                       "syncer stopped with operations not started "
                       "syncer={} count={}",
                       name(), undone.size());
  }
  // Report what is left to the runner, where the state lives.
  absl::Status posted = runner_->Post(
      [this, alive = std::weak_ptr<int>(alive_),
       undone = std::move(undone)]() mutable {
        if (alive.expired() || stopped_on_runner_) return;
        // No more wake-ups: the runner would report the timer as dropped.
        stopped_on_runner_ = true;
        timer_.Cancel();
        timer_at_ = internal::kFuture;
        const int64_t now = internal::ToNanos(clock_->Now());
        for (internal::DispatchedCall* c : undone) {
          ApplyResult(static_cast<Work&>(*c), now);
        }
        SyncerStatus<K> s = StatusSnapshot(0);
        SPDLOG_LOGGER_INFO(logger_,
                           "syncer stopped syncer={} keys={} pending={} "
                           "backing_off={} terminal={}",
                           name(), s.keys, s.pending, s.backing_off,
                           s.terminal);
      },
      "syncer stop");
  if (!posted.ok()) {
    SPDLOG_LOGGER_WARN(logger_,
                       "syncer stopped after its runner; pending intents "
                       "not counted syncer={}",
                       name());
  }
}

// ---- Handing over -----------------------------------------------------------

template <class K, class D, class O>
typename Syncer<K, D, O>::Work* Syncer<K, D, O>::NewWork() {
  if (free_works_.empty()) {
    works_.push_back(std::make_unique<Work>());
    return works_.back().get();
  }
  Work* w = free_works_.back();
  free_works_.pop_back();
  return w;
}

template <class K, class D, class O>
bool Syncer<K, D, O>::HandOver(int64_t now,
                               std::vector<internal::DispatchedCall*>& batch) {
  const uint32_t id = ready_.front();
  Slot& s = table_[id];
  internal::KeyState& st = s.state;
  const SyncOp op = Compute(s);
  if (!internal::StillReady(st, op, now, rules_)) {
    // The key changed since it was queued; work it out again.
    ready_.pop_front();
    st.queued = false;
    Evaluate(id, now);
    return true;
  }
  if (options_.rate_limit > 0 && !bucket_.Take(internal::FromNanos(now))) {
    ArmTimer(internal::ToNanos(bucket_.NextToken(internal::FromNanos(now))));
    return false;
  }
  ready_.pop_front();
  st.queued = false;
  st.in_flight = op;
  st.pending_since = internal::kFuture;
  ++in_flight_;
  Work* w = NewWork();
  w->slot = id;
  w->key = &s.key;  // Stable: a slot in flight is never erased.
  w->op = op;
  w->desired = s.desired;
  w->observed = s.observed;
  w->probe = pause_.paused();
  w->epoch = st.epoch;
  w->desired_version = st.desired_version;
  w->observed_seq = st.observed_seq;
  batch.push_back(w);
  return true;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Dispatch(int64_t now) {
  if (!InSync() || ready_.empty() || stopped_on_runner_) return;
  std::vector<internal::DispatchedCall*>& batch = handing_;
  if (pause_.paused()) {
    // The world is down: one probe at a time, once nothing else runs.
    if (in_flight_ > 0) return;  // Their results decide first.
    if (!pause_.ProbeDue(now)) {
      ArmTimer(pause_.next_probe());
      return;
    }
    while (!ready_.empty() && batch.empty()) {
      if (!HandOver(now, batch)) break;
    }
    if (!batch.empty()) {
      pause_.ProbeStarted();
      counters_.Add(internal::SyncerCounters::kProbes);
    }
  } else {
    if (batch_client_ != nullptr && in_flight_ == 0 &&
        ready_.size() < static_cast<size_t>(options_.max_batch)) {
      // No batch runs: the first operation waits a little for company.
      const int64_t start = internal::AddNanos(
          ready_since_, absl::ToInt64Nanoseconds(options_.batch_delay));
      if (start > now) {
        ArmTimer(start);
        return;
      }
    }
    while (!ready_.empty() && in_flight_ < options_.max_in_flight) {
      if (!HandOver(now, batch)) break;
    }
  }
  if (ready_.empty()) ready_since_ = internal::kFuture;
  if (batch.empty()) return;
  if (!dispatcher_.Submit(batch)) {
    // Stopped: nothing will run these; they stay pending.
    for (internal::DispatchedCall* c : batch) {
      c->started = false;
      c->status = absl::CancelledError("syncer stopped");
      ApplyResult(static_cast<Work&>(*c), now);
    }
  }
  batch.clear();
}

// ---- Calls and results ------------------------------------------------------

template <class K, class D, class O>
void Syncer<K, D, O>::Execute(
    const Context& ctx, std::span<internal::DispatchedCall* const> calls) {
  if (batch_client_ == nullptr) {
    for (internal::DispatchedCall* c : calls) {
      Work& w = static_cast<Work&>(*c);
      w.status = CallUserCode(SyncOpName(w.op), [&]() -> absl::Status {
        switch (w.op) {
          case SyncOp::kCreate:
            return client_->Create(ctx, *w.key, *w.desired);
          case SyncOp::kUpdate:
            return client_->Update(ctx, *w.key, *w.desired, *w.observed);
          case SyncOp::kDelete:
            return client_->Delete(ctx, *w.key, *w.observed);
          case SyncOp::kNone:
            break;
        }
        return absl::OkStatus();
      });
      w.threw = ThrewException(w.status);
    }
    return;
  }
  std::vector<SyncOperation<K, D, O>> ops;
  ops.reserve(calls.size());
  for (internal::DispatchedCall* c : calls) {
    Work& w = static_cast<Work&>(*c);
    ops.push_back(SyncOperation<K, D, O>{
        .op = w.op,
        .key = w.key,
        .desired = w.desired.has_value() ? &*w.desired : nullptr,
        .observed = w.observed.has_value() ? &*w.observed : nullptr,
        .status = absl::OkStatus()});
  }
  const absl::Status all = CallUserCode("batch apply", [&] {
    return batch_client_->Apply(ctx, std::span<SyncOperation<K, D, O>>(ops));
  });
  const bool threw = ThrewException(all);
  for (size_t i = 0; i < calls.size(); ++i) {
    calls[i]->status = all.ok() ? std::move(ops[i].status) : all;
    calls[i]->threw = threw;
  }
  counters_.ObserveBatch(static_cast<int64_t>(calls.size()));
}

template <class K, class D, class O>
void Syncer<K, D, O>::ResultsReady() {
  absl::Status posted = runner_->Post(
      [this, alive = std::weak_ptr<int>(alive_)] {
        if (!alive.expired()) DrainResults();
      },
      "syncer results");
  if (!posted.ok()) {
    SPDLOG_LOGGER_DEBUG(logger_,
                        "syncer results not delivered, runner stopped "
                        "syncer={}: {}",
                        name(), posted);
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::DrainResults() {
  dispatcher_.TakeResults(&draining_);
  const int64_t now = internal::ToNanos(clock_->Now());
  for (internal::DispatchedCall* c : draining_) {
    ApplyResult(static_cast<Work&>(*c), now);
  }
  draining_.clear();
  Dispatch(now);
}

template <class K, class D, class O>
void Syncer<K, D, O>::ApplyResult(Work& w, int64_t now) {
  using internal::Outcome;
  using Counters = internal::SyncerCounters;
  const uint32_t id = w.slot;
  --in_flight_;
  bool requeue = w.requeue;
  if (w.probe && (!w.started || w.fenced)) pause_.ProbeAbandoned();
  if (w.started && !w.fenced && (!w.status.ok() || w.probe || pause_.busy())) {
    const bool unreachable =
        !w.status.ok() && !IsStaleOwner(w.status) &&
        internal::HasCode(pause_rules_.codes, w.status.code());
    if (unreachable && pause_.paused()) requeue = true;  // Not its failure.
    const auto change = pause_.OnResult(
        pause_rules_, !unreachable, unreachable ? absl::Hash<K>{}(*w.key) : 0,
        w.probe, now, std::uniform_real_distribution<double>(0, 1)(rng_),
        w.status);
    if (change == internal::WorldPause::Change::kPaused) {
      counters_.Add(Counters::kPauses);
      SPDLOG_LOGGER_WARN(logger_,
                         "syncer paused, the world is unreachable: one probe "
                         "call at a time until it answers syncer={} "
                         "failures_in_a_row={}: {}",
                         name(), options_.pause_after, w.status);
    } else if (change == internal::WorldPause::Change::kResumed) {
      SPDLOG_LOGGER_INFO(logger_,
                         "syncer resumed, the world answers again syncer={} "
                         "probes={}",
                         name(), pause_.probes());
      Resume(now);
    }
  }
  Slot& s = table_[id];
  internal::KeyState& st = s.state;
  const internal::CallReport report{.op = w.op,
                                    .status = &w.status,
                                    .started = w.started,
                                    .threw = w.threw,
                                    .requeue = requeue,
                                    .epoch = w.epoch,
                                    .values_version = w.values_version,
                                    .desired_version = w.desired_version,
                                    .observed_seq = w.observed_seq};
  const internal::ResultRules rules{
      .epoch = st.epoch,
      .selected = Selected(s.key),
      .values_version = call_values_version_,
      .stopped = stopped_on_runner_,
      .terminal_codes = &options_.terminal_codes,
      .backoff = &options_.backoff,
      .expectation_timeout =
          absl::ToInt64Nanoseconds(options_.expectation_timeout)};
  const double jitter =
      w.status.ok() ? 0 : std::uniform_real_distribution<double>(0, 1)(rng_);
  const internal::ResultEffect effect =
      internal::ApplyResult(st, report, rules, now, jitter);
  if (w.started) counters_.ObserveDuration(w.op, w.duration_ns);
  if (w.threw) counters_.Add(Counters::kThrew);
  if (effect.stale_refusal) counters_.Op(w.op, Counters::kStale);
  bool evaluate = true;
  switch (effect.outcome) {
    case Outcome::kDiscarded:
      counters_.Add(Counters::kDiscarded);
      SPDLOG_LOGGER_INFO(logger_,
                         "syncer result discarded, key left the range "
                         "syncer={} key={} op={}: {}",
                         name(), internal::KeyForLog(*w.key), SyncOpName(w.op),
                         w.status);
      if (rules.selected) {
        MarkDirty(id);
      } else {
        MaybeErase(id);
      }
      evaluate = false;
      break;
    case Outcome::kNotStarted:
      if (!stopped_on_runner_) {
        WakeAt(id, internal::AddNanos(
                       now, absl::ToInt64Nanoseconds(effect.retry_in)));
      }
      evaluate = false;
      break;
    case Outcome::kRequeued:
      counters_.Add(Counters::kRequeued);
      break;
    case Outcome::kStaleOld:
      break;
    case Outcome::kStale:
      if (!stale_logged_) {
        stale_logged_ = true;
        SPDLOG_LOGGER_WARN(logger_,
                           "syncer {} refused as a stale owner, not retried "
                           "under this assignment syncer={} key={}: {}",
                           SyncOpName(w.op), name(),
                           internal::KeyForLog(*w.key), w.status);
      }
      break;
    case Outcome::kSuccess:
      counters_.Op(w.op, Counters::kSuccess);
      Unexpect(id);
      SETPOINT_LOG_DEBUG(logger_, "syncer {} done syncer={} key={}",
                         SyncOpName(w.op), name(), internal::KeyForLog(*w.key));
      break;
    case Outcome::kTerminal:
      counters_.Op(w.op, Counters::kTerminal);
      WarnFailure(now, w,
                  "failed terminally, not retried until the key "
                  "changes",
                  absl::ZeroDuration());
      break;
    case Outcome::kRetry:
      counters_.Op(w.op, Counters::kError);
      WarnFailure(now, w, "failed, retrying", effect.retry_in);
      break;
  }
  w.desired.reset();
  w.observed.reset();
  w.status = absl::OkStatus();
  free_works_.push_back(&w);
  if (evaluate) Evaluate(id, now);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Resume(int64_t now) {
  // Keys backing off from the outage try again at once: the world is back.
  table_.ForEach([&](uint32_t id, Slot& s) {
    internal::KeyState& st = s.state;
    if (st.in_flight == SyncOp::kNone && st.not_before > now &&
        internal::HasCode(pause_rules_.codes, st.last_error.code())) {
      st.not_before = now;
      MarkDirty(id);
    }
  });
}

template <class K, class D, class O>
void Syncer<K, D, O>::WarnFailure(int64_t now, const Work& w, const char* what,
                                  absl::Duration retry_in) {
  const int failures = table_[w.slot].state.failures;
  const std::string key = internal::KeyForLog(*w.key);
  if (internal::AddNanos(last_warning_, absl::ToInt64Nanoseconds(
                                            options_.warning_interval)) > now) {
    ++warnings_suppressed_;
    SETPOINT_LOG_DEBUG(logger_,
                       "syncer {} {} syncer={} key={} failures={} "
                       "retry_in={}: {}",
                       SyncOpName(w.op), what, name(), key, failures, retry_in,
                       w.status);
    return;
  }
  last_warning_ = now;
  if (warnings_suppressed_ > 0) {
    SPDLOG_LOGGER_WARN(logger_,
                       "syncer failures since the last warning syncer={} "
                       "count={} (logged at debug level; /statusz lists the "
                       "failing keys)",
                       name(), warnings_suppressed_);
    warnings_suppressed_ = 0;
  }
  SPDLOG_LOGGER_WARN(logger_,
                     "syncer {} {} syncer={} key={} failures={} retry_in={}: "
                     "{}",
                     SyncOpName(w.op), what, name(), key, failures, retry_in,
                     w.status);
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_INTERNAL_SYNCER_CALLS_H_
