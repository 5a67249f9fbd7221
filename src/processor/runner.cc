#include "setpoint/processor/runner.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <exception>
#include <new>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/strings/str_cat.h"
#include "processor/cpu_relax.h"
#include "processor/runner_state.h"
#include "setpoint/base/callback.h"
#include "setpoint/base/format.h"
#include "setpoint/base/mutex.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/runner_pool.h"
#include "spdlog/spdlog.h"

// The queue and the timer table are in runner_state.h (with their design).

namespace setpoint {

struct TimerHandle::Shared : runner_state::State {};

namespace {
using runner_state::Backoff;
using runner_state::CoarseNanos;
using runner_state::EventSlot;
using runner_state::Fired;
using runner_state::kBatch;
using runner_state::kCancelled;
using runner_state::kClosed;
using runner_state::kDescheduledNs;
using runner_state::kLap;
using runner_state::kLookahead;
using runner_state::kMinPauseRounds;
using runner_state::kPauseRounds;
using runner_state::kPending;
using runner_state::kSampleEvery;
using runner_state::kSamples;
using runner_state::kSlots;
using runner_state::kSpinRounds;
using runner_state::kTimerBatch;
using runner_state::kUnpublishedWaitDoublings;
using runner_state::kUnpublishedWaitNs;
using runner_state::Later;
using runner_state::Segment;
using runner_state::SteadyNanos;
using runner_state::TimerEntry;
using runner_state::TimerSlot;
using Event = Runner::Event;
using internal::CpuRelax;
}  // namespace

struct Runner::Tally {
  int64_t ran = 0;
  int64_t threw = 0;
  int64_t slow = 0;
  int64_t threshold = INT64_MAX;  // Nanoseconds; INT64_MAX: not timed.
  int64_t start = 0;
};

bool TimerHandle::Cancel() {
  std::shared_ptr<Shared> shared = shared_.lock();
  if (shared == nullptr) return false;
  Runner::Event cancelled;
  {
    MutexLock l(&shared->mu);
    if (slot_ >= shared->slot_count) return false;
    TimerSlot& ts = shared->Slot(slot_);
    if (ts.tag != ((id_ << 2) | kPending)) return false;
    cancelled = ts.TakeEvent();
    ts.tag = (id_ << 2) | kCancelled;
    --shared->live_timers;
    ++shared->dead_entries;
    ++shared->stats.timers_cancelled;
    shared->MaybeCompact();
  }
  // The closure (and what it captured) is destroyed here, without the lock.
  return true;
}

Runner::Runner(RunnerOptions options)
    : name_(std::move(options.name)),
      clock_(options.clock != nullptr ? options.clock : Clock::Real()),
      slow_threshold_(options.slow_event_threshold),
      logger_(options.logger != nullptr ? std::move(options.logger)
                                        : spdlog::default_logger()),
      shared_(std::make_shared<TimerHandle::Shared>()),
      pool_(options.pool) {
  if (logger_ == nullptr)
    logger_ = std::make_shared<spdlog::logger>("setpoint");
  Segment* first = new Segment;
  shared_->head_seg = first;
  shared_->tail_seg.store(first, std::memory_order_release);
  if (options.metrics != nullptr) {
    const MetricLabels labels =
        WithLabels(options.metric_labels, {{"runner", name_}});
    latency_ = &options.metrics->GetHistogram(
        "setpoint_runner_queue_latency_seconds",
        "Time from post to run of an event (one in 64 is timed).", labels,
        Histogram::FastDurationBuckets());
    duration_ = &options.metrics->GetHistogram(
        "setpoint_runner_event_duration_seconds",
        "How long an event ran (one in 64 is timed).", labels,
        Histogram::FastDurationBuckets());
    collector_ = options.metrics->AddCollector([this, labels](MetricWriter& w) {
      const RunnerStats st = stats();
      w.Counter("setpoint_runner_events_total", "Events and timers run.",
                labels, static_cast<double>(st.events_run));
      w.Counter("setpoint_runner_events_threw_total",
                "Events that threw (caught and logged).", labels,
                static_cast<double>(st.events_threw));
      w.Counter("setpoint_runner_slow_events_total",
                "Events that ran past slow_event_threshold.", labels,
                static_cast<double>(st.slow_events));
      TimerHandle::Shared& sh = *shared_;
      const uint64_t tail = sh.tail.load(std::memory_order_acquire) & ~kClosed;
      const uint64_t head = sh.head_published.load(std::memory_order_acquire);
      w.Gauge("setpoint_runner_queue_depth", "Events posted and not run yet.",
              labels, tail > head ? static_cast<double>(tail - head) : 0.0);
      int64_t timers;
      {
        MutexLock l(&sh.mu);
        timers = sh.live_timers;
      }
      w.Gauge("setpoint_runner_timers_pending", "Timers not fired yet.", labels,
              static_cast<double>(timers));
      w.Gauge("setpoint_runner_busy_seconds",
              "How long the runner has been busy without finishing a "
              "batch (0 while it waits for work).",
              labels, absl::ToDoubleSeconds(BusyFor()));
    });
  }
}

Runner::~Runner() {
  Stop();
  // Handles may keep the shared state alive; the queue is not needed.
  shared_->ReleaseMemory();
}

absl::Status Runner::Start() {
  {
    MutexLock l(&shared_->mu);
    if (shared_->stopping) {
      return absl::FailedPreconditionError(
          absl::StrCat("start runner name=", name_, ": already stopped"));
    }
  }
  if (thread_.joinable() || started_.load(std::memory_order_acquire)) {
    return absl::FailedPreconditionError(
        absl::StrCat("start runner name=", name_, ": already started"));
  }
  if (slow_threshold_ < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start runner ", name_, ": slow_event_threshold must be >= 0, got ",
        absl::FormatDuration(slow_threshold_)));
  }
  if (pool_ != nullptr) {
    if (pool_->clock() != clock_) {
      return absl::InvalidArgumentError(
          absl::StrCat("start runner ", name_,
                       ": clock is not the clock of pool ", pool_->name()));
    }
    if (!pool_->running()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "start runner ", name_, ": pool ", pool_->name(), " is not running"));
    }
    started_.store(true, std::memory_order_release);
    // A first turn runs what was posted before Start. Until it ends the
    // runner is not idle, so no producer queues it a second time.
    pool_->Schedule(this);
    return absl::OkStatus();
  }
  started_.store(true, std::memory_order_release);
  thread_ = std::jthread([this] {
    pthread_setname_np(pthread_self(), "sp-runner");
    Loop();
  });
  return absl::OkStatus();
}

void Runner::Stop() {
  TimerHandle::Shared& s = *shared_;
  {
    MutexLock l(&s.mu);
    if (!s.stopping) {
      s.stopping = true;
      s.tail.fetch_or(kClosed, std::memory_order_seq_cst);
      s.wake = true;
      s.cv.SignalAll();
    }
  }
  if (thread_.joinable()) {
    thread_.join();  // The loop drains the queue, then drops the timers.
    return;
  }
  if (pool_ != nullptr && started_.load(std::memory_order_acquire)) {
    StopOnPool();
    return;
  }
  // Manual mode: nothing runs after Stop(); say what is dropped.
  const int64_t dropped = DropQueuedEvents();
  std::vector<Event> timers;
  int64_t dropped_timers = 0;
  {
    MutexLock l(&s.mu);
    s.stats.events_dropped += dropped;
    dropped_timers = s.DropTimers(timers);
  }
  timers.clear();  // Closures destroyed without the lock.
  if (dropped > 0 || dropped_timers > 0) {
    SPDLOG_LOGGER_WARN(logger_,
                       "runner stopped with work left runner={} "
                       "events_dropped={} timers_dropped={}",
                       name_, dropped, dropped_timers);
  }
}

int64_t Runner::DropQueuedEvents() {
  TimerHandle::Shared& s = *shared_;
  if (s.head_seg == nullptr) return 0;
  int64_t dropped = 0;
  int round = 0;
  // `tail` is closed: claims below it are published soon, none come after.
  while (!s.QueueEmpty()) {
    EventSlot* slot = s.HeadSlot();
    if (slot == nullptr) {
      Backoff(round);
      continue;
    }
    Event event(std::move(*slot->event()));
    slot->event()->~Event();
    s.AdvanceHead();
    ++dropped;
  }
  return dropped;
}

absl::Status Runner::Post(Event event, const char* origin) {
  TimerHandle::Shared& s = *shared_;
  if (ABSL_PREDICT_FALSE(origin == nullptr)) origin = "event";
  uint64_t t = s.tail.load(std::memory_order_acquire);
  Segment* seg = s.tail_seg.load(std::memory_order_acquire);
  Segment* fresh = nullptr;
  uint64_t offset;
  int round = 0;
  while (true) {
    if (ABSL_PREDICT_FALSE((t & kClosed) != 0)) {
      if (fresh != nullptr) s.PoolSegment(fresh);
      return absl::FailedPreconditionError(absl::StrCat(
          "post to runner ", name_, " origin=", origin, ": runner stopped"));
    }
    offset = t & (kLap - 1);
    if (ABSL_PREDICT_FALSE(offset == kSlots)) {
      // Another producer is linking the next segment.
      s.AwaitLink(t, round);
      t = s.tail.load(std::memory_order_acquire);
      seg = s.tail_seg.load(std::memory_order_acquire);
      continue;
    }
    if (ABSL_PREDICT_FALSE(offset + 1 == kSlots) && fresh == nullptr) {
      fresh = s.NewSegment();  // Before claiming: others wait less.
    }
    if (ABSL_PREDICT_TRUE(s.tail.compare_exchange_weak(
            t, t + 1, std::memory_order_seq_cst, std::memory_order_acquire))) {
      break;
    }
    seg = s.tail_seg.load(std::memory_order_acquire);
  }
  if (ABSL_PREDICT_FALSE(offset + 1 == kSlots)) {
    s.tail_seg.store(fresh, std::memory_order_release);
    s.tail.fetch_add(1, std::memory_order_seq_cst);  // Past the marker.
    s.LinkDone();
    seg->next.store(fresh, std::memory_order_release);
  } else if (ABSL_PREDICT_FALSE(fresh != nullptr)) {
    s.PoolSegment(fresh);
  }
  EventSlot& slot = seg->slots[offset];
  if (ABSL_PREDICT_FALSE(latency_ != nullptr && t % kSampleEvery == 0)) {
    auto& sample = s.samples[(t / kSampleEvery) % kSamples];
    sample.ns.store(SteadyNanos(), std::memory_order_relaxed);
    sample.pos.store(t, std::memory_order_relaxed);  // Published with ready.
  }
  ::new (static_cast<void*>(slot.storage)) Event(std::move(event));
  slot.origin = origin;
  slot.ready.store(t + 1, std::memory_order_release);
  if (ABSL_PREDICT_FALSE(s.sleeping.load(std::memory_order_seq_cst)) &&
      s.sleeping.exchange(false, std::memory_order_seq_cst)) {
    if (pool_ != nullptr) {
      pool_->Schedule(this);  // It was idle: this post gives it a turn.
    } else {
      MutexLock l(&s.mu);
      s.wake = true;
      s.cv.Signal();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TimerHandle> Runner::PostAfter(absl::Duration delay, Event event,
                                              const char* origin) {
  return PostAt(clock_->Now() + delay, std::move(event), origin);
}

absl::StatusOr<TimerHandle> Runner::PostAt(absl::Time when, Event event,
                                           const char* origin) {
  TimerHandle::Shared& s = *shared_;
  uint64_t seq;
  uint32_t slot;
  {
    MutexLock l(&s.mu);
    if (ABSL_PREDICT_FALSE(s.stopping)) {
      return absl::FailedPreconditionError(
          absl::StrCat("post timer to runner ", name_, " origin=", origin,
                       ": runner stopped"));
    }
    seq = s.next_seq++;
    slot = s.AllocSlot();
    TimerSlot& ts = s.Slot(slot);
    ::new (static_cast<void*>(ts.storage)) Event(std::move(event));
    ts.origin = origin;
    ts.tag = (seq << 2) | kPending;
    ++s.live_timers;
    const bool earliest = when < s.NextTimer();
    s.heap.push_back(TimerEntry{when, seq, slot});
    std::push_heap(s.heap.begin(), s.heap.end(), Later());
    if (s.heap.size() == 1) s.has_timers.store(true, std::memory_order_relaxed);
    if (earliest && s.waiting) {
      if (pool_ != nullptr) {
        // Idle on its pool: the pool wakes it (runner's lock, then pool's).
        s.wake_asked = when;
        pool_->WakeAt(this, when);
      } else {
        s.wake = true;
        s.cv.Signal();
      }
    }
  }
  return TimerHandle(shared_, seq, slot);
}

void Runner::RunEvent(Event& event, const char* origin, Tally& tally) {
  absl::Status s = CallUserCode("event", [&] { std::move(event)(); });
  if (ABSL_PREDICT_FALSE(!s.ok())) {
    ++tally.threw;
    SPDLOG_LOGGER_ERROR(logger_, "event failed runner={} origin={}: {}", name_,
                        origin, s);
  }
  ++tally.ran;
  if (tally.threshold != INT64_MAX) {
    int64_t end = CoarseNanos();
    if (ABSL_PREDICT_FALSE(end - tally.start > tally.threshold)) {
      ++tally.slow;
      SPDLOG_LOGGER_WARN(logger_,
                         "slow event on runner, events behind it wait (keep IO "
                         "off the runner) runner={} origin={} took={}",
                         name_, origin, absl::Nanoseconds(end - tally.start));
    }
    tally.start = end;
  }
}

void Runner::RunSampled(Event& event, const char* origin, Tally& tally,
                        uint64_t pos) {
  TimerHandle::Shared& s = *shared_;
  auto& sample = s.samples[(pos / kSampleEvery) % kSamples];
  const int64_t start = SteadyNanos();
  // A sample overwritten by a producer one lap of kSamples ahead is skipped.
  if (sample.pos.load(std::memory_order_relaxed) == pos) {
    latency_->Observe(
        static_cast<double>(start - sample.ns.load(std::memory_order_relaxed)) *
        1e-9);
  }
  RunEvent(event, origin, tally);
  duration_->Observe(static_cast<double>(SteadyNanos() - start) * 1e-9);
}

absl::Duration Runner::BusyFor() const {
  TimerHandle::Shared& s = *shared_;
  // current_ is set while the started runner's loop runs (atomics only: a
  // scrape may ask while another thread stops the runner).
  if (!started_.load(std::memory_order_acquire) ||
      current_.load() == std::thread::id{} ||
      s.sleeping.load(std::memory_order_acquire)) {
    return absl::ZeroDuration();
  }
  const int64_t since = s.progress_ns.load(std::memory_order_acquire);
  if (since == 0) return absl::ZeroDuration();
  const int64_t now = CoarseNanos();
  return now > since ? absl::Nanoseconds(now - since) : absl::ZeroDuration();
}

void Runner::Publish(const Tally& tally) {
  // Single writer (the consumer): plain load and store, no RMW.
  TimerHandle::Shared& s = *shared_;
  s.head_published.store(s.head, std::memory_order_release);
  s.progress_ns.store(CoarseNanos(), std::memory_order_release);
  auto add = [](std::atomic<int64_t>& counter, int64_t n) {
    if (n != 0) {
      counter.store(counter.load(std::memory_order_relaxed) + n,
                    std::memory_order_release);
    }
  };
  add(s.events_run, tally.ran);
  add(s.events_threw, tally.threw);
  add(s.slow_events, tally.slow);
}

int64_t Runner::RunDueTimers() {
  TimerHandle::Shared& s = *shared_;
  // A local vector: an event may call RunUntilIdle (manual mode) again.
  std::vector<Fired> fired = std::move(s.fired_cache);
  fired.clear();
  {
    MutexLock l(&s.mu);
    if (!s.heap.empty() || s.due_pos < s.due.size()) {
      s.TakeDueTimers(clock_->Now(), fired, kTimerBatch);
    }
  }
  if (fired.empty()) {
    s.fired_cache = std::move(fired);
    return 0;
  }
  Tally tally;
  if (slow_threshold_ > absl::ZeroDuration()) {
    tally.threshold = absl::ToInt64Nanoseconds(slow_threshold_);
    tally.start = CoarseNanos();
  }
  for (Fired& f : fired) RunEvent(f.event, f.origin, tally);
  Publish(tally);
  fired.clear();  // The closures are destroyed here.
  s.fired_cache = std::move(fired);
  return tally.ran;
}

int64_t Runner::RunEvents(int64_t max, uint64_t lag) {
  TimerHandle::Shared& s = *shared_;
  Tally tally;
  if (slow_threshold_ > absl::ZeroDuration()) {
    tally.threshold = absl::ToInt64Nanoseconds(slow_threshold_);
    tally.start = CoarseNanos();
  }
  uint64_t clear_below = 0;  // Positions below it are `lag` behind a producer.
  while (tally.ran < max) {
    if (lag != 0 && s.head >= clear_below) {
      uint64_t pos;
      if (!s.PublishedAhead(lag, &pos)) break;
      clear_below = pos + 1;
    }
    EventSlot* slot = s.HeadSlot();
    if (slot == nullptr) break;
    // Moved out first: the event may post, stop (manual mode) or run
    // RunUntilIdle, all of which may move the head.
    Event event(std::move(*slot->event()));
    slot->event()->~Event();
    const char* origin = slot->origin;
    const uint64_t pos = s.head;
    s.AdvanceHead();
    if (ABSL_PREDICT_FALSE(latency_ != nullptr && pos % kSampleEvery == 0)) {
      RunSampled(event, origin, tally, pos);
    } else {
      RunEvent(event, origin, tally);
    }
  }
  Publish(tally);
  return tally.ran;
}

bool Runner::SpinForWork(uint64_t* lag) {
  TimerHandle::Shared& s = *shared_;
  // Backing off: a producer that is posting keeps the runner awake without
  // paying for wake-ups. At first the runner looks a few cache lines ahead
  // of the head: when a producer got that far it reads, staying that far
  // behind (`*lag`), so it does not pull the lines the producer is writing.
  // Later it takes whatever is there. Rounds of pauses first (as many as
  // recent spins earned), then yields, which give the core to whoever wants
  // it. The first rounds are too short to be worth timing.
  const int pause_rounds = s.pause_rounds;
  int64_t last = 0;
  for (int round = 0, pauses = 0; round < kSpinRounds; ++round) {
    const bool pausing = pauses < pause_rounds;
    if (pausing) {
      for (int i = 0; i < (8 << (pauses / 2)); ++i) CpuRelax();
      ++pauses;
    } else {
      std::this_thread::yield();
    }
    uint64_t pos;
    const bool ahead = round < 8;
    if (ahead ? s.PublishedAhead(kLookahead, &pos) : s.HeadSlot() != nullptr) {
      *lag = ahead ? kLookahead : 0;
      // Found while pausing: the pauses paid; allow one more next time.
      if (pausing) {
        s.pause_rounds =
            std::min(kPauseRounds, std::max(pause_rounds, pauses + 1));
      }
      return true;
    }
    if (!pausing || round < 2) continue;
    const int64_t now = SteadyNanos();
    if (last != 0 && now - last > kDescheduledNs) {
      // Lost the core while pausing: more threads want to run than there
      // are cores, and pausing only delays them. Yield from here on.
      s.pause_rounds = kMinPauseRounds;
      pauses = pause_rounds;
    }
    last = now;
  }
  // Nothing came: pause less next time.
  s.pause_rounds = std::max(kMinPauseRounds, pause_rounds - 2);
  return false;
}

bool Runner::AwaitWork(uint64_t* lag) {
  TimerHandle::Shared& s = *shared_;
  if (SpinForWork(lag)) {
    s.unpublished_waits = 0;
    return true;
  }
  *lag = 0;
  s.mu.Lock();
  // Due timers first: one posted just before Stop() runs (has_timers may
  // have been read before it was posted).
  if (s.stopping && s.QueueEmpty() && s.NextTimer() > clock_->Now()) {
    std::vector<Event> timers;
    const int64_t dropped = s.DropTimers(timers);
    s.mu.Unlock();
    timers.clear();
    if (dropped > 0) {
      SPDLOG_LOGGER_WARN(logger_,
                         "runner stopped with timers pending runner={} "
                         "timers_dropped={}",
                         name_, dropped);
    }
    return false;
  }
  const absl::Time next = s.NextTimer();
  s.wake = false;
  s.waiting = true;
  s.sleeping.store(true, std::memory_order_seq_cst);
  if (s.QueueEmpty()) {
    s.unpublished_waits = 0;
    clock_->AwaitWithDeadline(&s.mu, &s.cv, next, {}, [&s] {
      s.mu.AssertHeld();
      return s.wake || s.stopping;
    });
  } else if (s.HeadSlot() == nullptr) {
    // Claimed but not published: its producer lost its core in between, or
    // is about to publish. Its post wakes the runner if it sees `sleeping`;
    // the timeout covers one that read it just before. The timers wait (a
    // little) too.
    const int64_t wait_ns = kUnpublishedWaitNs
                            << std::min(s.unpublished_waits++,
                                        kUnpublishedWaitDoublings);
    s.cv.WaitUntil(
        &s.mu, {},
        std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns),
        [&s] {
          s.mu.AssertHeld();
          return s.wake || s.stopping || s.HeadSlot() != nullptr;
        });
  }
  s.progress_ns.store(CoarseNanos(), std::memory_order_release);
  s.sleeping.store(false, std::memory_order_relaxed);
  s.waiting = false;
  s.mu.Unlock();
  return true;
}

void Runner::Loop() {
  current_.store(std::this_thread::get_id());
  TimerHandle::Shared& s = *shared_;
  uint64_t lag = 0;
  while (true) {
    int64_t ran = 0;
    if (s.has_timers.load(std::memory_order_relaxed)) ran += RunDueTimers();
    ran += RunEvents(kBatch, lag);
    if (ran == 0 && !AwaitWork(&lag)) break;
  }
  current_.store(std::thread::id{});
}

bool Runner::ClaimIdle() {
  TimerHandle::Shared& s = *shared_;
  return s.sleeping.load(std::memory_order_seq_cst) &&
         s.sleeping.exchange(false, std::memory_order_seq_cst);
}

bool Runner::RunTurn() {
  // Kept alive to the end of the turn: once the last one signals `finished`,
  // Stop() returns and the Runner may be destroyed while this unlocks.
  const std::shared_ptr<TimerHandle::Shared> keep = shared_;
  TimerHandle::Shared& s = *keep;
  {
    MutexLock l(&s.mu);
    s.waiting = false;
  }
  s.progress_ns.store(CoarseNanos(), std::memory_order_release);
  current_.store(std::this_thread::get_id());
  int64_t ran = 0;
  uint64_t lag = 0;
  while (ran < kBatch) {
    int64_t n = 0;
    if (s.has_timers.load(std::memory_order_relaxed)) n += RunDueTimers();
    n += RunEvents(kBatch - ran, lag);
    ran += n;
    // Out of work: spin a little first, as a runner's own thread does (how
    // long adapts to what recent spins found), since handing the runner
    // back to the pool and being woken again costs a futex each way.
    if (n == 0 && !SpinForWork(&lag)) break;
  }
  current_.store(std::thread::id{});
  if (ran >= kBatch) return true;  // Its turn is up: behind the others.
  std::vector<Event> timers;
  int64_t dropped = 0;
  bool finished = false;
  absl::Time ask = absl::InfiniteFuture();
  // The head as this turn leaves it. Once `sleeping` is set a producer (or
  // the pool's timer) may hand the runner to another worker, which moves
  // the head: this thread must not read it again.
  uint64_t head = 0;
  // The wake the pool holds for this runner's next timer (if it has one).
  absl::Time asked = absl::InfiniteFuture();
  {
    MutexLock l(&s.mu);
    const absl::Time now = clock_->Now();
    const absl::Time next = s.NextTimer();
    if (s.stopping && s.QueueEmpty() && next > now) {
      // Stopped and drained: what is not due is dropped, as on a thread.
      dropped = s.DropTimers(timers);
      finished = true;
    } else if (next <= now || !s.QueueEmpty()) {
      return true;  // A timer came due, or events are queued (or claimed).
    } else {
      s.waiting = true;
      head = s.head;
      s.sleeping.store(true, std::memory_order_seq_cst);
      if (next != absl::InfiniteFuture() &&
          (next < s.wake_asked || s.wake_asked <= now)) {
        s.wake_asked = next;
        ask = next;
      }
      if (next != absl::InfiniteFuture()) asked = s.wake_asked;
    }
  }
  if (finished) {
    timers.clear();
    if (dropped > 0) {
      SPDLOG_LOGGER_WARN(logger_,
                         "runner stopped with timers pending runner={} "
                         "timers_dropped={}",
                         name_, dropped);
    }
    // The last touch of the Runner: Stop() returns once it sees this.
    MutexLock l(&s.mu);
    s.finished = true;
    s.cv.SignalAll();
    return false;
  }
  if (ask != absl::InfiniteFuture()) pool_->WakeAt(this, ask);
  // A post or Stop() that came between the last look and the flag found it
  // clear and queued nothing: take the turn back. (Sequentially consistent
  // with the producers' claim and Stop's close: see runner_state.h.)
  if (s.tail.load(std::memory_order_seq_cst) != head &&
      s.sleeping.exchange(false, std::memory_order_seq_cst)) {
    return true;
  }
  // The pool drops a due wake it cannot claim (the runner was in a turn).
  // If it did so after this turn looked at the clock and before the flag
  // was set, that turn kept the wake as pending and asked for none: nobody
  // would run the timer. A wake due by now may be gone: take the turn back
  // (the next one runs the timer or asks again). A wake asked just now,
  // after the flag, is claimed when due: no second look then.
  if (ask == absl::InfiniteFuture() && asked != absl::InfiniteFuture() &&
      clock_->Now() >= asked &&
      s.sleeping.exchange(false, std::memory_order_seq_cst)) {
    return true;
  }
  return false;
}

void Runner::StopOnPool() {
  TimerHandle::Shared& s = *shared_;
  // Stop() closed the queue. An idle runner gets a last turn; a queued or
  // running one ends its turns with it.
  if (ClaimIdle()) pool_->Schedule(this);
  {
    MutexLock l(&s.mu);
    s.cv.Wait(&s.mu, {},
              [&s]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return s.finished; });
  }
  pool_->Forget(this);
}

absl::Time Runner::NextWakeTime() const {
  TimerHandle::Shared& s = *shared_;
  MutexLock l(&s.mu);
  absl::Time next =
      s.heap.empty() ? absl::InfiniteFuture() : s.heap.front().when;
  if (s.due_pos < s.due.size()) next = std::min(next, s.due[s.due_pos].when);
  return next;
}

int64_t Runner::RunUntilIdle() {
  if (thread_.joinable()) return 0;
  if (pool_ != nullptr && started_.load(std::memory_order_acquire)) return 0;
  const std::thread::id previous =
      current_.exchange(std::this_thread::get_id());
  int64_t total = 0;
  while (shared_->head_seg != nullptr) {
    int64_t ran = RunDueTimers();
    ran += RunEvents(kBatch, 0);
    if (ran == 0) break;
    total += ran;
  }
  current_.store(previous);
  return total;
}

bool Runner::IsCurrent() const {
  return current_.load() == std::this_thread::get_id();
}

bool Runner::OnRunner() const {
  const std::thread::id current = current_.load();
  return current == std::thread::id{} || current == std::this_thread::get_id();
}

namespace runner_internal {

absl::Status CallCatching(const std::string& runner, const char* origin,
                          absl::FunctionRef<void()> call) {
  return Annotate(
      CallUserCode("fn", call),
      absl::StrCat("post and wait on runner ", runner, " origin=", origin));
}

}  // namespace runner_internal

RunnerStats Runner::stats() const {
  TimerHandle::Shared& s = *shared_;
  MutexLock l(&s.mu);
  RunnerStats stats = s.stats;
  stats.events_run = s.events_run.load(std::memory_order_acquire);
  stats.events_threw = s.events_threw.load(std::memory_order_acquire);
  stats.slow_events = s.slow_events.load(std::memory_order_acquire);
  return stats;
}

}  // namespace setpoint
