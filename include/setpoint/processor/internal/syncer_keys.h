// The Syncer's member definitions, part one: the keys on the runner
// (inputs, scope, working keys out, status). Included by
// setpoint/processor/syncer.h only: read that header for the API. The rules
// are in sync_rules.h; part two (syncer_calls.h) hands operations over and
// applies their results.
#ifndef SETPOINT_PROCESSOR_INTERNAL_SYNCER_KEYS_H_
#define SETPOINT_PROCESSOR_INTERNAL_SYNCER_KEYS_H_

#include <algorithm>
#include <concepts>
#include <string>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/base/logging.h"
#include "setpoint/base/status.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace internal {

// Formats a key for logs when it is formattable, else "<key>".
template <class K>
std::string KeyForLog(const K& key) {
  if constexpr (fmt::is_formattable<K>::value) {
    return fmt::format("{}", key);
  } else {
    return "<key>";
  }
}

// Validates the options every syncer shares (compiled once).
absl::Status ValidateSyncerLimits(
    const std::string& name, bool batch, int max_in_flight, int updater_threads,
    int max_batch, int max_batches_in_flight, double rate_limit, int rate_burst,
    absl::Duration batch_delay, absl::Duration execution_delay,
    absl::Duration expectation_timeout, absl::Duration operation_timeout,
    int pause_after, const BackoffOptions& backoff,
    const BackoffOptions& pause_probe);

}  // namespace internal

// ---- Inputs -----------------------------------------------------------------

template <class K, class D, class O>
void Syncer<K, D, O>::ObserveFrom(Store<K, O>* store) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  store->BindRunner(runner_);
  store->Subscribe(
      [this, alive = std::weak_ptr<int>(alive_)](const Change<K, O>& c) {
        if (alive.expired()) return;  // The store outlived the syncer.
        switch (c.kind) {
          case ChangeKind::kSet:
            Observe(c.key, *c.new_value, !options_.trust_store_filters);
            break;
          case ChangeKind::kDelete:
            DeleteObserved(c.key);
            break;
          case ChangeKind::kForget:
            ForgetObserved(c.key);
            break;
        }
      });
  DependOn(store);
}

template <class K, class D, class O>
void Syncer<K, D, O>::DesireFrom(Store<K, D>* store) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  store->BindRunner(runner_);
  store->Subscribe(
      [this, alive = std::weak_ptr<int>(alive_)](const Change<K, D>& c) {
        if (alive.expired()) return;
        if (c.kind == ChangeKind::kSet) {
          Desire(c.key, *c.new_value, !options_.trust_store_filters);
        } else {
          // A delete, or the key left the store's filter (Rescope forgot
          // it here already): no longer desired.
          DeleteDesired(c.key);
        }
      });
  // What the store holds already is desired too: it may be in sync now.
  for (const auto& [key, value] : store->items()) SetDesired(key, value);
  DependOn(store);
  SetSelfSynced(true);
}

template <class K, class D, class O>
bool Syncer<K, D, O>::DesiredEqual(const D& a, const D& b) const {
  if (options_.desired_equal) return options_.desired_equal(a, b);
  if constexpr (std::equality_comparable<D>) {
    return a == b;
  } else {
    return false;
  }
}

template <class K, class D, class O>
SyncOp Syncer<K, D, O>::Compute(const Slot& s) const {
  bool differ = false;
  if (s.desired.has_value() && s.observed.has_value()) {
    if (options_.needs_update) {
      differ = options_.needs_update(*s.desired, *s.observed);
    } else if constexpr (std::equality_comparable_with<D, O>) {
      differ = !(*s.desired == *s.observed);
    }
  }
  return internal::ComputeOp(s.desired.has_value(), s.observed.has_value(),
                             differ);
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetSwitch(bool* field, bool on) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  if (*field == on) return;
  *field = on;
  if (on) table_.ForEach([&](uint32_t id, Slot&) { MarkDirty(id); });
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetDesired(K key, D desired) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  Desire(std::move(key), std::move(desired), /*check=*/true);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Desire(K key, D desired, bool check) {
  if (check && !Selected(key)) {
    counters_.Add(internal::SyncerCounters::kIgnored);
    return;
  }
  const uint32_t id = table_.FindOrInsert(std::move(key)).first;
  Slot& s = table_[id];
  if (s.desired.has_value()) {
    if (DesiredEqual(*s.desired, desired)) return;
  } else {
    ++with_desired_;
  }
  s.desired = std::move(desired);
  ++s.state.desired_version;
  // A queued key is worked out again when Dispatch reaches it, and one in
  // flight when its result comes back: no need to mark it.
  if (!s.state.queued && s.state.in_flight == SyncOp::kNone) MarkDirty(id);
}

template <class K, class D, class O>
void Syncer<K, D, O>::DeleteDesired(const K& key) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  const uint32_t id = table_.Find(key);
  if (id == internal::kNoSlot || !table_[id].desired.has_value()) return;
  --with_desired_;
  table_[id].desired.reset();
  ++table_[id].state.desired_version;
  MarkDirty(id);
}

template <class K, class D, class O>
void Syncer<K, D, O>::ReplaceDesired(absl::flat_hash_map<K, D> desired) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  // `in_snapshot` counts the keys that now have a desired value from the
  // snapshot; when that is every key with one, nothing was removed and the
  // scan of every entry is skipped.
  size_t in_snapshot = 0;
  for (auto& [key, value] : desired) {
    if (!Selected(key)) {
      counters_.Add(internal::SyncerCounters::kIgnored);
      continue;
    }
    const uint32_t id = table_.FindOrInsert(key).first;
    Slot& s = table_[id];
    ++in_snapshot;
    if (s.desired.has_value()) {
      if (DesiredEqual(*s.desired, value)) continue;
    } else {
      ++with_desired_;
    }
    s.desired = std::move(value);
    ++s.state.desired_version;
    MarkDirty(id);
  }
  if (in_snapshot != with_desired_) {
    table_.ForEach([&](uint32_t id, Slot& s) {
      if (s.desired.has_value() && !desired.contains(s.key)) {
        s.desired.reset();
        ++s.state.desired_version;
        --with_desired_;
        MarkDirty(id);
      }
    });
  }
  SetSelfSynced(true);
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetObserved(K key, O observed) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  Observe(std::move(key), std::move(observed), /*check=*/true);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Observe(K key, O observed, bool check) {
  if (check && !Selected(key)) {
    counters_.Add(internal::SyncerCounters::kIgnored);
    return;
  }
  const uint32_t id = table_.FindOrInsert(std::move(key)).first;
  Slot& s = table_[id];
  s.observed = std::move(observed);
  ++s.state.observed_seq;
  // As in Desire: queued and in-flight keys are worked out again anyway.
  if (!s.state.queued && s.state.in_flight == SyncOp::kNone) MarkDirty(id);
}

template <class K, class D, class O>
void Syncer<K, D, O>::DeleteObserved(const K& key) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  const uint32_t id = table_.Find(key);
  if (id == internal::kNoSlot || !table_[id].observed.has_value()) return;
  table_[id].observed.reset();
  ++table_[id].state.observed_seq;
  MarkDirty(id);
}

template <class K, class D, class O>
void Syncer<K, D, O>::ForgetObserved(const K& key) {
  // Not a delete in the world: forget what we saw, act on nothing.
  const uint32_t id = table_.Find(key);
  if (id == internal::kNoSlot || !table_[id].observed.has_value()) return;
  table_[id].observed.reset();
  ++table_[id].state.observed_seq;
  if (Selected(key)) {
    MarkDirty(id);
  } else {
    MaybeErase(id);
  }
}

// ---- Scope and call values --------------------------------------------------

namespace internal {
// The dispatcher's view of a key filter: a call's key.
template <class Work, class K>
CallDispatcher::Filter CallFilter(KeyFilter<K> filter) {
  if (!filter) return nullptr;
  return [filter = std::move(filter)](const DispatchedCall& c) {
    return filter(*static_cast<const Work&>(c).key);
  };
}
}  // namespace internal

template <class K, class D, class O>
void Syncer<K, D, O>::Rescope(KeyFilter<K> filter) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  filter_ = std::move(filter);
  ++epoch_;
  // The queues hold slot ids; rebuild them from scratch.
  for (uint32_t id : dirty_) table_[id].state.dirty = false;
  for (uint32_t id : ready_) table_[id].state.queued = false;
  dirty_.clear();
  ready_.clear();
  ready_since_ = internal::kFuture;
  int64_t forgotten = 0, in_flight = 0;
  table_.ForEach([&](uint32_t id, Slot& s) {
    if (Selected(s.key)) return;
    ++forgotten;
    if (s.desired.has_value()) --with_desired_;
    internal::KeyState& st = s.state;
    if (st.in_flight == SyncOp::kNone) {
      Erase(id);
      return;
    }
    // Kept until its result arrives, so a returning key cannot get a
    // second operation in flight; the result will be discarded.
    ++in_flight;
    s.desired.reset();
    s.observed.reset();
    Unexpect(id);
    const SyncOp op = st.in_flight;
    st = internal::KeyState{};  // If the key comes back, it starts afresh.
    st.in_flight = op;
    st.epoch = epoch_;
  });
  table_.ForEach([&](uint32_t id, Slot&) { MarkDirty(id); });
  // Calls for keys that left stop: running ones see their context
  // cancelled, handed-over ones never start.
  const int64_t cancelled =
      dispatcher_.Fence(internal::CallFilter<Work>(filter_));
  counters_.Add(internal::SyncerCounters::kCancelled, cancelled);
  SPDLOG_LOGGER_INFO(logger_,
                     "syncer rescoped syncer={} forgotten={} "
                     "in_flight_forgotten={} calls_cancelled={} kept={}",
                     name(), forgotten, in_flight, cancelled,
                     static_cast<int64_t>(table_.size()) - in_flight);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Fence(KeyFilter<K> filter) {
  counters_.Add(
      internal::SyncerCounters::kCancelled,
      dispatcher_.Fence(internal::CallFilter<Work>(std::move(filter))));
}

template <class K, class D, class O>
void Syncer<K, D, O>::SetCallValues(const Context& values) {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  call_values_ = Context().WithValuesOf(values);
  ++call_values_version_;
  stale_logged_ = false;
  // Calls handed over but not started yet start under the new values.
  dispatcher_.SetValues(call_values_, call_values_version_);
  table_.ForEach([&](uint32_t id, Slot& s) {
    if (s.state.stale) {
      s.state.stale = false;
      MarkDirty(id);
    }
  });
}

template <class K, class D, class O>
absl::Status Syncer<K, D, O>::AwaitCallsWithin(const KeyFilter<K>& filter,
                                               const Context& ctx) const {
  return dispatcher_.AwaitNoneOutside(internal::CallFilter<Work>(filter), ctx);
}

template <class K, class D, class O>
int Syncer<K, D, O>::RunUntilIdle() {
  return dispatcher_.RunUntilIdle();
}

template <class K, class D, class O>
void Syncer<K, D, O>::OnSynced() {
  SPDLOG_LOGGER_INFO(logger_,
                     "syncer in sync, diffing all keys syncer={} keys={}",
                     name(), table_.size());
  table_.ForEach([&](uint32_t id, Slot&) { MarkDirty(id); });
}

template <class K, class D, class O>
void Syncer<K, D, O>::OnLostSync() {
  SPDLOG_LOGGER_INFO(logger_, "syncer lost sync, paused syncer={}", name());
}

// ---- Working keys out -------------------------------------------------------

template <class K, class D, class O>
void Syncer<K, D, O>::MarkDirty(uint32_t id) {
  internal::KeyState& st = table_[id].state;
  if (st.dirty) return;
  st.dirty = true;
  dirty_.push_back(id);
  SchedulePump();
}

template <class K, class D, class O>
void Syncer<K, D, O>::SchedulePump() {
  if (pump_posted_) return;
  absl::Status posted = runner_->Post(
      [this, alive = std::weak_ptr<int>(alive_)] {
        if (!alive.expired()) Pump();
      },
      "syncer pump");
  if (posted.ok()) pump_posted_ = true;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Pump() {
  pump_posted_ = false;
  const int64_t now = internal::ToNanos(clock_->Now());
  // Evaluate may erase entries; take the list first (both buffers keep
  // their capacity from one pump to the next).
  pumping_.swap(dirty_);
  for (uint32_t id : pumping_) {
    table_[id].state.dirty = false;
    Evaluate(id, now);
  }
  pumping_.clear();
  Dispatch(now);
}

template <class K, class D, class O>
void Syncer<K, D, O>::Evaluate(uint32_t id, int64_t now) {
  Slot& s = table_[id];
  internal::KeyState& st = s.state;
  if (st.in_flight != SyncOp::kNone) return;  // Its result evaluates again.
  if (internal::AwaitingObservation(st, s.observed.has_value(), now)) {
    Expect(id);
    return;
  }
  const internal::Decision d = internal::Evaluate(
      st, Compute(s), s.observed.has_value(), now, InSync(), rules_);
  if (d.next != internal::Next::kExpect) Unexpect(id);
  switch (d.next) {
    case internal::Next::kConverged:
      if (!s.desired.has_value() && !s.observed.has_value() && !st.queued &&
          !st.dirty) {
        Erase(id);
      }
      return;
    case internal::Next::kIdle:
      return;
    case internal::Next::kExpect:
      Expect(id);
      return;
    case internal::Next::kWait:
      WakeAt(id, d.until);
      return;
    case internal::Next::kReady:
      if (!st.queued) {
        st.queued = true;
        if (ready_.empty()) ready_since_ = now;
        ready_.push_back(id);
      }
      return;
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::WakeAt(uint32_t id, int64_t when) {
  internal::KeyState& st = table_[id].state;
  if (st.wake_at <= when) return;  // An earlier wake re-evaluates anyway.
  st.wake_at = when;
  wakes_.push(Wake{when, id});
  ArmTimer(when);
}

template <class K, class D, class O>
void Syncer<K, D, O>::ArmTimer(int64_t when) {
  if (when >= timer_at_ || stopped_on_runner_) return;
  timer_.Cancel();
  auto timer = runner_->PostAt(
      internal::FromNanos(when),
      [this, alive = std::weak_ptr<int>(alive_)] {
        if (!alive.expired()) OnTimer();
      },
      "syncer timer");
  if (!timer.ok()) return;  // The runner stopped.
  timer_ = *timer;
  timer_at_ = when;
}

template <class K, class D, class O>
void Syncer<K, D, O>::OnTimer() {
  timer_at_ = internal::kFuture;
  const int64_t now = internal::ToNanos(clock_->Now());
  while (!wakes_.empty() && wakes_.top().when <= now) {
    const Wake w = wakes_.top();
    wakes_.pop();
    if (!table_.Live(w.slot) || table_[w.slot].state.wake_at != w.when) {
      continue;
    }
    table_[w.slot].state.wake_at = internal::kFuture;
    Evaluate(w.slot, now);
  }
  while (expect_head_ != internal::kNoSlot &&
         table_[expect_head_].state.expect_until <= now) {
    const uint32_t id = expect_head_;
    Unexpect(id);
    Evaluate(id, now);
  }
  Dispatch(now);
  if (!wakes_.empty()) ArmTimer(wakes_.top().when);
  if (expect_head_ != internal::kNoSlot) {
    ArmTimer(table_[expect_head_].state.expect_until);
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::Expect(uint32_t id) {
  internal::KeyState& e = table_[id].state;
  if (e.expect_linked) return;
  e.expect_linked = true;
  // From the tail: expect_until only grows unless the clock steps back.
  uint32_t after = expect_tail_;
  while (after != internal::kNoSlot &&
         table_[after].state.expect_until > e.expect_until) {
    after = table_[after].state.expect_prev;
  }
  e.expect_prev = after;
  e.expect_next = after != internal::kNoSlot ? table_[after].state.expect_next
                                             : expect_head_;
  if (e.expect_next != internal::kNoSlot) {
    table_[e.expect_next].state.expect_prev = id;
  } else {
    expect_tail_ = id;
  }
  if (after != internal::kNoSlot) {
    table_[after].state.expect_next = id;
  } else {
    expect_head_ = id;
    ArmTimer(e.expect_until);
  }
}

template <class K, class D, class O>
void Syncer<K, D, O>::Unexpect(uint32_t id) {
  internal::KeyState& e = table_[id].state;
  if (!e.expect_linked) return;
  e.expect_linked = false;
  if (e.expect_prev != internal::kNoSlot) {
    table_[e.expect_prev].state.expect_next = e.expect_next;
  } else {
    expect_head_ = e.expect_next;
  }
  if (e.expect_next != internal::kNoSlot) {
    table_[e.expect_next].state.expect_prev = e.expect_prev;
  } else {
    expect_tail_ = e.expect_prev;
  }
  e.expect_prev = e.expect_next = internal::kNoSlot;
}

template <class K, class D, class O>
void Syncer<K, D, O>::Erase(uint32_t id) {
  Unexpect(id);
  table_.Erase(id);
}

template <class K, class D, class O>
void Syncer<K, D, O>::MaybeErase(uint32_t id) {
  const Slot& s = table_[id];
  if (!s.desired.has_value() && !s.observed.has_value() &&
      s.state.in_flight == SyncOp::kNone && !s.state.dirty && !s.state.queued) {
    Erase(id);
  }
}

// ---- Status -----------------------------------------------------------------

template <class K, class D, class O>
SyncerStatus<K> Syncer<K, D, O>::StatusSnapshot(size_t max_failures) const {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  SyncerStatus<K> out;
  out.in_sync = InSync();
  out.paused = pause_.paused();
  if (out.paused) {
    out.paused_since = internal::FromNanos(pause_.paused_since());
    out.pause_error = pause_.last_error();
  }
  const int64_t now = internal::ToNanos(clock_->Now());
  table_.ForEach([&](uint32_t, const Slot& s) {
    const internal::KeyState& e = s.state;
    if (!s.desired.has_value() && !s.observed.has_value()) {
      if (e.in_flight != SyncOp::kNone) ++out.in_flight;
      return;  // Forgotten, waiting for its result.
    }
    ++out.keys;
    if (e.unconverged_since < now) {
      out.longest_pending = std::max(
          out.longest_pending, absl::Nanoseconds(now - e.unconverged_since));
    }
    if (e.in_flight != SyncOp::kNone) {
      ++out.in_flight;
    } else if (e.expect_op != SyncOp::kNone && now < e.expect_until) {
      ++out.awaiting_observation;
    } else if (e.terminal) {
      ++out.terminal;
    } else if (Compute(s) == SyncOp::kNone) {
      ++out.converged;
    } else if (e.stale) {
      ++out.stale;
    } else if (e.failures > 0) {
      ++out.backing_off;
    } else {
      ++out.pending;
    }
    if (e.failures > 0 && !e.last_error.ok() &&
        out.failures.size() < max_failures && e.in_flight == SyncOp::kNone) {
      out.failures.push_back(SyncerKeyFailure<K>{
          s.key, e.last_error, static_cast<int>(e.failures), e.terminal,
          e.terminal || e.stale ? absl::InfiniteFuture()
                                : internal::FromNanos(e.not_before)});
    }
  });
  return out;
}

template <class K, class D, class O>
const D* Syncer<K, D, O>::desired(const K& key) const {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  const uint32_t id = table_.Find(key);
  return id == internal::kNoSlot || !table_[id].desired.has_value()
             ? nullptr
             : &*table_[id].desired;
}

template <class K, class D, class O>
const O* Syncer<K, D, O>::observed(const K& key) const {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  const uint32_t id = table_.Find(key);
  return id == internal::kNoSlot || !table_[id].observed.has_value()
             ? nullptr
             : &*table_[id].observed;
}

template <class K, class D, class O>
void Syncer<K, D, O>::PublishStatusMetrics() {
  SETPOINT_DCHECK_ON_RUNNER(runner_);
  if (!counters_.has_metrics()) return;
  const SyncerStatus<K> s = StatusSnapshot(0);
  const int64_t by_state[static_cast<int>(internal::KeyStateName::kCount)] = {
      s.converged,   s.pending,  s.in_flight, s.awaiting_observation,
      s.backing_off, s.terminal, s.stale};
  counters_.PublishStatus(by_state, s.in_sync, s.paused,
                          absl::ToDoubleSeconds(s.longest_pending));
}

}  // namespace setpoint

#endif  // SETPOINT_PROCESSOR_INTERNAL_SYNCER_KEYS_H_
