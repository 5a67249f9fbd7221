// The runner's state (runner.cc): the multi-producer event queue and the
// timer table that producers, the runner's thread and timer handles share.
// Private to src/processor.
#ifndef SETPOINT_SRC_PROCESSOR_RUNNER_STATE_H_
#define SETPOINT_SRC_PROCESSOR_RUNNER_STATE_H_

#include <time.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <memory>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/time/time.h"
#include "processor/cpu_relax.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"

// Design.
//
// Events go through an unbounded multi-producer, single-consumer queue of
// fixed-size segments. The queue has one global position counter, `tail`: a
// producer claims the position `tail` holds with a compare-and-swap, writes
// the closure into that slot of the segment `tail_seg` points to, and
// publishes it by storing position + 1 in the slot's `ready` (release). The
// last position of a segment is a marker: the producer that claims the
// segment's last slot links a new segment (allocated before claiming, so the
// others wait for it only a few instructions), points `tail_seg` at it and
// moves `tail` past the marker. A claim only succeeds while `tail` still
// holds the position the producer read before loading `tail_seg`, so the
// segment it writes to is the one holding that position, and that segment
// cannot be recycled before the producer publishes its slot. Positions only
// grow, so none is seen twice (no ABA), and a pooled segment's old `ready`
// values never match a new position. The consumer (the runner's thread, or
// the owner in manual mode) reads slots in order without writing to them,
// moves each closure out before running it, and pools a segment once it has
// read all of its slots. One thread's posts keep their order, and a post
// that happens after another is claimed after it.
//
// Stop() sets the top bit of `tail` (kClosed): claims fail from then on, and
// the events to run (or drop) are exactly the positions below it.
//
// Sleeping: the runner sets `sleeping` and then reads `tail`; a producer
// claims with a sequentially consistent RMW on `tail` and, after publishing,
// reads `sleeping`. In the single total order of these operations either the
// runner sees the claim (and does not sleep) or the producer sees the flag
// (and wakes the runner under the mutex). Producers pay for a wake-up only
// when the runner sleeps. Before sleeping the runner spins a little, backing
// off, and while a producer is ahead it reads a few cache lines behind it,
// so the two cores do not trade the lines being written.
//
// Pausing pays only while the producers have cores of their own. How many
// rounds of a spin pause adapts: a spin that found work while pausing earns
// the next one as many rounds and one more, a spin that found nothing costs
// the next one two, and a round of pauses that took far longer than it
// should (the runner lost its core: more threads want to run than there are
// cores, and pausing only delays them) drops it to the minimum and turns the
// rest of the spin into yields, which give the core away.
// A head slot that is claimed but not yet published (its producer may have
// lost its core between the two) is waited for asleep, not by spinning: the
// producer wakes the runner after publishing, and a short timeout covers a
// producer that read `sleeping` just before it was set. A producer that
// finds the next segment not yet linked spins briefly, yields, and then
// sleeps until the producer that links it is done (which signals only when
// someone waits: one load per segment otherwise).
//
// Timers live in a table of slots (closure, origin, posting number and
// state) under the mutex; a binary min-heap of small entries (time, posting
// number, slot) orders them, ties by posting order. Cancel() destroys the
// closure and marks the slot; its heap entry is dropped when it comes up (or
// when such entries outnumber live ones). When many timers are due at once
// they are taken out of the heap in one pass and radix-sorted rather than
// popped one by one. Due timers are taken and run in batches, so Cancel()
// and PostAt() never wait long for the mutex.

namespace setpoint::runner_state {

using Event = Runner::Event;

// Positions per segment: kSlots slots and the marker.
constexpr uint64_t kLap = 512;
constexpr uint64_t kSlots = kLap - 1;
constexpr uint64_t kClosed = uint64_t{1} << 63;
// With metrics, one event in kSampleEvery is timed from post to run and
// while it runs; kSamples post times are kept, by position.
constexpr uint64_t kSampleEvery = 64;
constexpr uint64_t kSamples = 64;

inline int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// Segments kept for reuse, per runner.
constexpr size_t kPooledSegments = 4;
// How far ahead of the head the idle runner looks first (slots).
constexpr uint64_t kLookahead = 32;
// The idle runner's spin: kSpinRounds rounds, first up to kPauseRounds of
// pauses (8 << n / 2 in the nth), then yields. How many rounds pause adapts
// to how recent spins went, down to kMinPauseRounds.
constexpr int kSpinRounds = 24;
constexpr int kPauseRounds = 12;
constexpr int kMinPauseRounds = 2;
// A round of pauses (at most 256) that took longer than this in real time
// lost the core to another thread.
constexpr int64_t kDescheduledNs = 100'000;
// Waiting asleep for a claimed head slot to be published: first timeout,
// doubled up to the last.
constexpr int64_t kUnpublishedWaitNs = 50'000;
constexpr int kUnpublishedWaitDoublings = 5;
// Events run between looks at the timers.
constexpr int64_t kBatch = 1024;

struct EventSlot {
  alignas(Event) unsigned char storage[sizeof(Event)];
  const char* origin;
  // Position + 1 once the event at that position is published. Anything
  // else (0, or a position of an earlier use of a pooled segment) means not
  // yet, so the consumer never writes to a segment's slots.
  std::atomic<uint64_t> ready{0};

  Event* event() { return std::launder(reinterpret_cast<Event*>(storage)); }
};

struct Segment {
  EventSlot slots[kSlots];
  std::atomic<Segment*> next{nullptr};
};

// A timer slot's state, in the low bits of its tag.
constexpr uint64_t kFree = 0;
constexpr uint64_t kPending = 1;
constexpr uint64_t kCancelled = 2;
constexpr uint64_t kStateMask = 3;

// Chunks of slots are allocated uninitialized; slots past the table's count
// are never read.
struct TimerSlot {
  // The closure lives here while the slot is pending, and only then.
  alignas(Event) unsigned char storage[sizeof(Event)];
  const char* origin;
  // (posting number << 2) | state while it holds a timer (handles check it);
  // (next free slot << 2) | kFree when free.
  uint64_t tag;

  Event* event() { return std::launder(reinterpret_cast<Event*>(storage)); }
  // Moves the closure out and ends the pending state's object.
  Event TakeEvent() {
    Event e(std::move(*event()));
    event()->~Event();
    return e;
  }
};

struct TimerEntry {
  absl::Time when;
  uint64_t seq;  // Ties broken by posting order.
  // A slot index; 64 bits so that the entry is 32 bytes without padding,
  // which the heap moves as two whole 16-byte words.
  uint64_t slot;
};

// Heap order for std::push_heap and friends: the earliest on top.
struct Later {
  bool operator()(const TimerEntry& a, const TimerEntry& b) const {
    return a.when != b.when ? a.when > b.when : a.seq > b.seq;
  }
};

// A due timer keyed for the radix sort.
struct DueKey {
  uint64_t key;
  uint32_t slot;
  uint32_t seq;  // Posting number relative to the smallest sorted.
};

// Sorts `v` stably by the low `bits` bits of the keys, up to 11 bits a pass.
inline void RadixSort(std::vector<DueKey>& v, std::vector<DueKey>& tmp,
                      int bits) {
  constexpr int kMaxDigit = 11;
  const int passes = (bits + kMaxDigit - 1) / kMaxDigit;
  if (passes == 0) return;
  const int digit = (bits + passes - 1) / passes;
  const size_t buckets = size_t{1} << digit;
  std::vector<size_t> counts(static_cast<size_t>(passes) * buckets);
  for (const DueKey& k : v) {
    for (int p = 0; p < passes; ++p) {
      ++counts[static_cast<size_t>(p) * buckets +
               ((k.key >> (p * digit)) & (buckets - 1))];
    }
  }
  tmp.resize(v.size());
  for (int p = 0; p < passes; ++p) {
    size_t* count = &counts[static_cast<size_t>(p) * buckets];
    if (*std::max_element(count, count + buckets) == v.size()) continue;
    size_t sum = 0;
    for (size_t b = 0; b < buckets; ++b) {
      const size_t c = count[b];
      count[b] = sum;
      sum += c;
    }
    for (const DueKey& k : v) {
      tmp[count[(k.key >> (p * digit)) & (buckets - 1)]++] = k;
    }
    v.swap(tmp);
  }
}

struct Fired {
  Fired(Event e, const char* o) : event(std::move(e)), origin(o) {}
  Event event;
  const char* origin;
};

// Timers taken (and run) per look at the timers.
constexpr size_t kTimerBatch = 256;

constexpr uint32_t kChunkBits = 10;
constexpr uint32_t kChunk = uint32_t{1} << kChunkBits;
constexpr uint32_t kNoSlot = UINT32_MAX;

// A monotonic reading of a few nanoseconds' cost (coarse: the kernel tick),
// enough to find events that run for a hundred milliseconds.
inline int64_t CoarseNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

using internal::CpuRelax;

// Waiting for a producer to publish a slot it claimed (manual-mode Stop):
// spin briefly, then give the core away (it may have been preempted).
inline void Backoff(int& round) {
  if (round < 16) {
    for (int i = 0; i < (1 << (round / 4)); ++i) CpuRelax();
  } else {
    std::this_thread::yield();
  }
  ++round;
}

// The state producers and the runner share (TimerHandle::Shared is this).
// Handles keep it alive through a weak_ptr, so cancelling after the Runner is
// gone is safe.
struct State {
  ~State() { ReleaseMemory(); }

  // Producers' line.
  alignas(64) std::atomic<uint64_t> tail{0};
  std::atomic<Segment*> tail_seg{nullptr};
  std::atomic<bool> sleeping{false};  // The runner sleeps (or is about to).
  // Producers asleep in AwaitLink (rare: the linking producer lost its core).
  std::atomic<int> link_waiters{0};

  // The consumer's line: the runner's thread, or the owner in manual mode
  // (Start() and join() hand it over).
  alignas(64) uint64_t head = 0;
  Segment* head_seg = nullptr;
  std::atomic<int64_t> events_run{0};
  std::atomic<int64_t> events_threw{0};
  std::atomic<int64_t> slow_events{0};
  std::atomic<bool> has_timers{false};  // Hint: timers are pending.
  // Published at the end of each batch: the head, and when (CoarseNanos).
  std::atomic<uint64_t> head_published{0};
  std::atomic<int64_t> progress_ns{0};
  std::vector<Fired> fired_cache;  // Capacity kept between batches.
  // How many rounds the idle runner's spin may pause (SpinForWork), and how
  // many times in a row it waited for a claimed slot to be published.
  int pause_rounds = kPauseRounds;
  int unpublished_waits = 0;

  // Post times of one event in kSampleEvery (metrics only), by position.
  struct Sample {
    std::atomic<uint64_t> pos{~uint64_t{0}};
    std::atomic<int64_t> ns{0};
  };
  alignas(64) Sample samples[kSamples];

  alignas(64) Mutex pool_mu;
  std::vector<Segment*> pool ABSL_GUARDED_BY(pool_mu);

  // Producers waiting for the next segment's link sleep here.
  Mutex link_mu;
  CondVar link_cv;

  Mutex mu;
  CondVar cv;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool waiting ABSL_GUARDED_BY(mu) = false;  // The runner sleeps on cv.
  bool wake ABSL_GUARDED_BY(mu) = false;  // Work, a new earliest timer, stop.
  // On a pool: the wake asked of the pool for the earliest timer (it is
  // asked again only for an earlier one, or once that one passed), and
  // whether the last turn of a stopping runner ended.
  absl::Time wake_asked ABSL_GUARDED_BY(mu) = absl::InfinitePast();
  bool finished ABSL_GUARDED_BY(mu) = false;
  std::vector<TimerEntry> heap ABSL_GUARDED_BY(mu);
  // Due timers taken from the heap in bulk, in firing order; those from
  // due_pos on are still to fire.
  std::vector<TimerEntry> due ABSL_GUARDED_BY(mu);
  size_t due_pos ABSL_GUARDED_BY(mu) = 0;
  size_t pops_in_burst ABSL_GUARDED_BY(mu) = 0;  // Due entries popped.
  std::vector<DueKey> keys ABSL_GUARDED_BY(mu);  // SortDue's scratch.
  std::vector<DueKey> scratch ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<TimerSlot[]>> chunks ABSL_GUARDED_BY(mu);
  uint32_t slot_count ABSL_GUARDED_BY(mu) = 0;
  uint32_t free_slot ABSL_GUARDED_BY(mu) = kNoSlot;
  int64_t live_timers ABSL_GUARDED_BY(mu) = 0;   // Pending slots.
  int64_t dead_entries ABSL_GUARDED_BY(mu) = 0;  // Of cancelled timers.
  uint64_t next_seq ABSL_GUARDED_BY(mu) = 1;
  RunnerStats stats ABSL_GUARDED_BY(mu);  // The timer counts, events_dropped.

  // --- Event queue ---

  Segment* NewSegment() {
    {
      MutexLock l(&pool_mu);
      if (!pool.empty()) {
        Segment* s = pool.back();
        pool.pop_back();
        return s;
      }
    }
    return new Segment;  // Slots uninitialized but for `ready`.
  }

  // `s` has no published slot left unread and no producer writing to it.
  void PoolSegment(Segment* s) {
    s->next.store(nullptr, std::memory_order_relaxed);
    {
      MutexLock l(&pool_mu);
      if (pool.size() < kPooledSegments) {
        pool.push_back(s);
        return;
      }
    }
    delete s;
  }

  // Producer: `tail` held `marker` (a segment's last position): another
  // producer is linking the next segment. Spins a little, then yields, then
  // sleeps until `tail` moves. `round` counts the calls for one post.
  void AwaitLink(uint64_t marker, int& round) {
    if (round < 16) {
      for (int i = 0; i < (1 << (round / 4)); ++i) CpuRelax();
    } else if (round < 20) {
      std::this_thread::yield();
    } else {
      // Sequentially consistent with LinkDone: either the linker sees the
      // count, or this sees the new tail.
      MutexLock l(&link_mu);
      link_waiters.fetch_add(1, std::memory_order_seq_cst);
      while (tail.load(std::memory_order_seq_cst) == marker) {
        link_cv.Wait(&link_mu);
      }
      link_waiters.fetch_sub(1, std::memory_order_relaxed);
    }
    ++round;
  }

  // Producer: moved `tail` past the marker; wakes producers waiting for it.
  void LinkDone() {
    if (ABSL_PREDICT_FALSE(link_waiters.load(std::memory_order_seq_cst) != 0)) {
      MutexLock l(&link_mu);
      link_cv.SignalAll();
    }
  }

  // Consumer: true when no position was claimed past the head (claimed but
  // unpublished slots count as work). Sequentially consistent: see above.
  bool QueueEmpty() const {
    return (tail.load(std::memory_order_seq_cst) & ~kClosed) == head;
  }

  // Consumer: whether the slot `ahead` places past the head (or the last of
  // the head's segment) is published; `*pos` is its position.
  bool PublishedAhead(uint64_t ahead, uint64_t* pos) const {
    const uint64_t offset = head & (kLap - 1);
    const uint64_t at = std::min(offset + ahead, kSlots - 1);
    *pos = head - offset + at;
    return head_seg->slots[at].ready.load(std::memory_order_acquire) ==
           *pos + 1;
  }

  // Consumer: the head slot if it is published, else null.
  EventSlot* HeadSlot() {
    EventSlot& slot = head_seg->slots[head & (kLap - 1)];
    return slot.ready.load(std::memory_order_acquire) == head + 1 ? &slot
                                                                  : nullptr;
  }

  // Consumer: moves past the head slot (its event already moved out).
  void AdvanceHead() {
    ++head;
    if (ABSL_PREDICT_FALSE((head & (kLap - 1)) == kSlots)) {
      // The producer of the last slot linked the next segment before it
      // published the slot.
      Segment* next = head_seg->next.load(std::memory_order_acquire);
      PoolSegment(head_seg);
      head_seg = next;
      ++head;  // Past the marker.
    }
  }

  void ReleaseMemory() {
    for (Segment* s = head_seg; s != nullptr;) {
      Segment* next = s->next.load(std::memory_order_relaxed);
      delete s;
      s = next;
    }
    head_seg = nullptr;
    tail_seg.store(nullptr, std::memory_order_relaxed);
    MutexLock l(&pool_mu);
    for (Segment* s : pool) delete s;
    pool.clear();
  }

  // --- Timers ---

  TimerSlot& Slot(uint32_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return chunks[i >> kChunkBits][i & (kChunk - 1)];
  }

  uint32_t AllocSlot() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (free_slot != kNoSlot) {
      uint32_t i = free_slot;
      free_slot = static_cast<uint32_t>(Slot(i).tag >> 2);
      return i;
    }
    if (slot_count == chunks.size() * kChunk) {
      chunks.push_back(std::make_unique_for_overwrite<TimerSlot[]>(kChunk));
    }
    return slot_count++;
  }

  void FreeSlot(uint32_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Slot(i).tag = (uint64_t{free_slot} << 2) | kFree;
    free_slot = i;
  }

  bool Pending(const TimerEntry& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return (Slot(static_cast<uint32_t>(e.slot)).tag & kStateMask) == kPending;
  }

  // The entry for slot `i` left the heap (or the due list): fires the timer
  // or forgets it.
  void TakeSlot(uint32_t i, std::vector<Fired>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    TimerSlot& ts = Slot(i);
    if ((ts.tag & kStateMask) == kPending) {
      out.emplace_back(ts.TakeEvent(), ts.origin);
      --live_timers;
      ++stats.timers_fired;
    } else {
      --dead_entries;
    }
    FreeSlot(i);
  }

  // Moves up to `max` timers due at `now` to `out`, by time, ties by posting
  // order.
  void TakeDueTimers(absl::Time now, std::vector<Fired>& out, size_t max)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    while (out.size() < max) {
      const bool heap_due = !heap.empty() && heap.front().when <= now;
      const bool listed = due_pos < due.size();
      if (!heap_due) {
        pops_in_burst = 0;
        if (!listed) break;
      } else if (!listed && pops_in_burst >= 64 &&
                 pops_in_burst * 256 >= heap.size()) {
        // Many are due at once: one pass over the heap and a sort cost less
        // than popping them one by one. (The pass costs at most 256 times
        // the pops made before it.)
        auto mid =
            std::partition(heap.begin(), heap.end(),
                           [now](const TimerEntry& e) { return e.when > now; });
        due.assign(mid, heap.end());
        due_pos = 0;
        SortDue();
        heap.erase(mid, heap.end());
        std::make_heap(heap.begin(), heap.end(), Later());
        pops_in_burst = 0;
        continue;
      }
      if (heap_due && (!listed || Later()(due[due_pos], heap.front()))) {
        const auto slot = static_cast<uint32_t>(heap.front().slot);
        std::pop_heap(heap.begin(), heap.end(), Later());
        heap.pop_back();
        ++pops_in_burst;
        TakeSlot(slot, out);
      } else {
        if (due_pos + 16 < due.size()) {
          const TimerSlot* ahead =
              &Slot(static_cast<uint32_t>(due[due_pos + 16].slot));
          __builtin_prefetch(ahead, 1);
          __builtin_prefetch(reinterpret_cast<const char*>(ahead + 1) - 1, 1);
        }
        TakeSlot(static_cast<uint32_t>(due[due_pos++].slot), out);
      }
    }
    if (due_pos == due.size() && !due.empty()) ClearDue();
    UpdateHasTimers();
  }

  // Sorts `due` by time, ties by posting order. When every time is a whole
  // number of nanoseconds and the posting numbers span less than 2^32, a
  // radix sort on the time (stable: equal times then sorted by posting
  // number) does it without the comparison sort's branch misses.
  void SortDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto earlier = [](const TimerEntry& a, const TimerEntry& b) {
      return Later()(b, a);
    };
    if (due.size() < 1024) {
      std::sort(due.begin(), due.end(), earlier);
      return;
    }
    uint64_t min_ns = UINT64_MAX, max_ns = 0;  // Biased: ordered unsigned.
    uint64_t min_seq = UINT64_MAX, max_seq = 0;
    bool exact = true;
    // Whether the times differ by whole microseconds or milliseconds only
    // (common): fewer bits to sort on.
    const uint64_t first_ns =
        static_cast<uint64_t>(absl::ToUnixNanos(due[0].when));
    bool whole_us = true, whole_ms = true;
    keys.resize(due.size());
    for (size_t i = 0; i < due.size(); ++i) {
      const TimerEntry& e = due[i];
      const int64_t signed_ns = absl::ToUnixNanos(e.when);
      exact &= absl::FromUnixNanos(signed_ns) == e.when;
      const uint64_t ns = static_cast<uint64_t>(signed_ns);
      whole_us &= (ns - first_ns) % 1000 == 0;
      whole_ms &= (ns - first_ns) % 1'000'000 == 0;
      const uint64_t biased = ns ^ (uint64_t{1} << 63);
      min_ns = std::min(min_ns, biased);
      max_ns = std::max(max_ns, biased);
      min_seq = std::min(min_seq, e.seq);
      max_seq = std::max(max_seq, e.seq);
      keys[i] = DueKey{biased, static_cast<uint32_t>(e.slot), 0};
    }
    const uint64_t unit = whole_ms ? 1'000'000 : whole_us ? 1000 : 1;
    const int time_bits = std::bit_width((max_ns - min_ns) / unit);
    if (!exact || max_seq - min_seq > UINT32_MAX) {
      std::sort(due.begin(), due.end(), earlier);
      return;
    }
    for (size_t i = 0; i < due.size(); ++i) {
      keys[i].key = (keys[i].key - min_ns) / unit;
      keys[i].seq = static_cast<uint32_t>(due[i].seq - min_seq);
    }
    // By time (stable), then runs of equal times by posting number.
    RadixSort(keys, scratch, time_bits);
    for (auto run = keys.begin(); run != keys.end();) {
      auto end = run + 1;
      while (end != keys.end() && end->key == run->key) ++end;
      if (end - run > 1) {
        std::sort(run, end, [](const DueKey& a, const DueKey& b) {
          return a.seq < b.seq;
        });
      }
      run = end;
    }
    for (size_t i = 0; i < due.size(); ++i) {
      const DueKey& k = keys[i];
      const uint64_t ns = (min_ns + k.key * unit) ^ (uint64_t{1} << 63);
      due[i] = TimerEntry{absl::FromUnixNanos(static_cast<int64_t>(ns)),
                          min_seq + k.seq, k.slot};
    }
    keys.clear();
    keys.shrink_to_fit();
    scratch.clear();
    scratch.shrink_to_fit();
  }

  void ClearDue() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    due.clear();
    due_pos = 0;
    if (due.capacity() > 4096) due.shrink_to_fit();
  }

  void UpdateHasTimers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    has_timers.store(!heap.empty() || due_pos < due.size(),
                     std::memory_order_relaxed);
  }

  // The earliest time a timer may be due.
  absl::Time NextTimer() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    absl::Time next = heap.empty() ? absl::InfiniteFuture() : heap.front().when;
    if (due_pos < due.size()) next = std::min(next, due[due_pos].when);
    return next;
  }

  // Drops the entries of cancelled timers once they are most of them.
  void MaybeCompact() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const size_t entries = heap.size() + (due.size() - due_pos);
    if (dead_entries < 1024 ||
        static_cast<size_t>(dead_entries) * 2 < entries) {
      return;
    }
    auto pending = [this](const TimerEntry& e) {
      mu.AssertHeld();
      return Pending(e);
    };
    auto dead = std::partition(heap.begin(), heap.end(), pending);
    for (auto it = dead; it != heap.end(); ++it)
      FreeSlot(static_cast<uint32_t>(it->slot));
    heap.erase(dead, heap.end());
    std::make_heap(heap.begin(), heap.end(), Later());
    due.erase(due.begin(), due.begin() + static_cast<ptrdiff_t>(due_pos));
    due_pos = 0;
    dead = std::stable_partition(due.begin(), due.end(), pending);
    for (auto it = dead; it != due.end(); ++it)
      FreeSlot(static_cast<uint32_t>(it->slot));
    due.erase(dead, due.end());
    dead_entries = 0;
    UpdateHasTimers();
  }

  // Stop: moves out every pending timer (the caller destroys them without
  // the lock) and counts them as dropped; returns how many.
  int64_t DropTimers(std::vector<Event>& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int64_t dropped = live_timers;
    for (uint32_t i = 0; i < slot_count && live_timers > 0; ++i) {
      TimerSlot& ts = Slot(i);
      if ((ts.tag & kStateMask) == kPending) {
        out.push_back(ts.TakeEvent());
        --live_timers;
      }
    }
    heap.clear();
    heap.shrink_to_fit();
    ClearDue();
    // Handles cancelling later find no slot.
    chunks.clear();
    slot_count = 0;
    free_slot = kNoSlot;
    live_timers = 0;
    dead_entries = 0;
    UpdateHasTimers();
    stats.timers_dropped += dropped;
    return dropped;
  }
};

}  // namespace setpoint::runner_state

#endif  // SETPOINT_SRC_PROCESSOR_RUNNER_STATE_H_
