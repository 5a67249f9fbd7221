// Benchmarks for the Processor's Syncer: how fast it takes in desired-state
// updates, how long a full diff of 100,000 keys takes, how many operations
// per second go from the runner through the updaters and back, and how many
// bytes it keeps per tracked key.
//
//   # Build in Release (commands in bench/README.md), then:
//   build/bench/bench/syncer_bench --benchmark_repetitions=3
//
// The names are stable so figures can be compared over time (bench/README.md
// keeps the last figures and the targets). Every benchmark times by hand
// (UseManualTime) the part named in its comment, builds a fresh Runner and
// Syncer per iteration outside that part, and checks its own result: a wrong
// one reports an error ("ERROR OCCURRED") instead of a figure.
//
// Keys are std::string like "rs-000123", as resource ids are; they fit in
// std::string's inline buffer, as most ids do, so no key copy allocates.
// Values are ints: the figures are the Syncer's own cost, not the user's.
// Loggers are testing::NullLogger() (level info, no sinks), so the info
// lines are formatted but written nowhere.
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "ingest_batches.h"
#include "process_threads.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/processor/updater_pool.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"

// ---- Counting allocator -----------------------------------------------------
//
// The global operator new/delete of this binary count live heap bytes while
// counting is switched on (BM_SyncerMemory only; the other benchmarks pay one
// relaxed load per allocation). Bytes are malloc_usable_size(), what the
// allocator really hands out (the request rounded up to its size class),
// without glibc's 8-byte chunk header. Aligned new/delete are not replaced:
// libstdc++ serves them with aligned_alloc/free, uncounted on both sides.
namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_live_bytes{0};
std::atomic<int64_t> g_live_allocs{0};

void* CountedAlloc(std::size_t n) {
  void* p = std::malloc(n == 0 ? 1 : n);
  if (p != nullptr && g_counting.load(std::memory_order_relaxed)) {
    g_live_bytes.fetch_add(static_cast<int64_t>(malloc_usable_size(p)),
                           std::memory_order_relaxed);
    g_live_allocs.fetch_add(1, std::memory_order_relaxed);
  }
  return p;
}

void CountedFree(void* p) {
  if (p == nullptr) return;
  // Memory allocated before counting began and freed during it counts as a
  // negative: the live total is a net change over the counting window.
  if (g_counting.load(std::memory_order_relaxed)) {
    g_live_bytes.fetch_sub(static_cast<int64_t>(malloc_usable_size(p)),
                           std::memory_order_relaxed);
    g_live_allocs.fetch_sub(1, std::memory_order_relaxed);
  }
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) {
  if (void* p = CountedAlloc(n)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return CountedAlloc(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return CountedAlloc(n);
}
void operator delete(void* p) noexcept { CountedFree(p); }
void operator delete[](void* p) noexcept { CountedFree(p); }
void operator delete(void* p, std::size_t) noexcept { CountedFree(p); }
void operator delete[](void* p, std::size_t) noexcept { CountedFree(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept {
  CountedFree(p);
}
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  CountedFree(p);
}

namespace setpoint {
namespace {

using Clock = std::chrono::steady_clock;
using IntSyncer = Syncer<std::string, int, int>;
using IntClient = SyncerClient<std::string, int, int>;

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// "rs-000000" ... : built once, outside every timed region.
const std::vector<std::string>& Keys(int64_t n) {
  static std::vector<std::string> keys;
  for (int64_t i = static_cast<int64_t>(keys.size()); i < n; ++i) {
    keys.push_back(absl::StrFormat("rs-%06d", i));
  }
  return keys;
}

// Waits on the bench thread, polling the runner, until every key of
// `syncer` is converged and nothing is in flight or waiting; false after
// `timeout`.
bool AwaitConverged(Runner& runner, IntSyncer& syncer, int64_t keys,
                    absl::Duration timeout) {
  return testing::AwaitCondition(
      [&] {
        auto s = runner.PostAndWait(Context(),
                                    [&] { return syncer.StatusSnapshot(0); });
        return s.ok() && s->keys == keys && s->converged == keys;
      },
      timeout);
}

// ---- Ingest -----------------------------------------------------------------

// A world that takes 1 ms per call (it stands for the IO an updater thread
// waits on; sleeping costs no CPU, as IO does not) and reports each change
// back to the runner the way a watch would, so the Syncer sees its writes
// and can converge.
class SlowWorld final : public IntClient {
 public:
  explicit SlowWorld(Runner* runner) : runner_(runner) {}
  void set_syncer(IntSyncer* syncer) { syncer_ = syncer; }
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }

  absl::Status Create(const Context&, const std::string& key,
                      const int& desired) override {
    return Write(key, desired);
  }
  absl::Status Update(const Context&, const std::string& key,
                      const int& desired, const int&) override {
    return Write(key, desired);
  }
  absl::Status Delete(const Context&, const std::string& key,
                      const int&) override {
    calls_.fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)runner_->Post([this, key] { syncer_->DeleteObserved(key); });
    return absl::OkStatus();
  }

 private:
  absl::Status Write(const std::string& key, int value) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    (void)runner_->Post(
        [this, key, value] { syncer_->SetObserved(key, value); });
    return absl::OkStatus();
  }

  Runner* const runner_;
  IntSyncer* syncer_ = nullptr;
  std::atomic<int64_t> calls_{0};
};

// 1,000,000 SetDesired calls over 10,000 keys on a started runner, while the
// updaters call SlowWorld. Update j sets key j % 10,000 to j / 10,000 + 1, so
// every call changes the key's value (no call is an equal-value no-op) and
// every key ends at 100.
//
// Delivery: 1,000 runner events of 1,000 updates each, as a Transformer or a
// watch hands over changes in batches. Each batch posts the next one as it
// ends (the runner never waits for input), so the Syncer's own events (its
// pump, results coming back) run between batches, as they would in a
// controller: operations start with early values while updates still pour
// in, which is what tests coalescing. One event of 1,000,000, or all batches
// posted up front, would let the pump see only the final values (10,000
// creates, nothing to coalesce) and would hold the runner for tens of
// milliseconds.
//
// Timed (manual): the sum of the batch events' run times, measured on the
// runner, i.e. the SetDesired calls only. `ingest_span_ms` is the wall time
// from the first batch's start to the last one's end (it includes the
// Syncer's events that ran in between).
//
// Untimed: waiting until every key is converged, then checking the world
// (every key observed at 100) and counting client calls: at most two per
// key (a create with an early value, an update to the last), as bursts
// coalesce. The default max_in_flight (8): with 64 updater threads their
// wake-ups (64,000 a second) preempt the runner on a 2-core machine and the
// ingest rate falls by a quarter.
void BM_SyncerIngest(benchmark::State& state) {
  constexpr int64_t kKeys = 10'000;
  constexpr int64_t kUpdates = 1'000'000;
  constexpr int64_t kBatch = 1'000;
  const std::vector<std::string>& keys = Keys(kKeys);
  int64_t calls_total = 0;
  double span_total = 0;
  // metrics=1: the runner and the syncer publish their series.
  MetricsRegistry metrics;
  MetricsRegistry* m = state.range(0) != 0 ? &metrics : nullptr;
  for (auto _ : state) {
    Runner runner(
        {.name = "bench", .metrics = m, .logger = testing::NullLogger()});
    SlowWorld world(&runner);
    IntSyncer syncer(
        &runner, &world,
        {.name = "bench", .metrics = m, .logger = testing::NullLogger()});
    world.set_syncer(&syncer);
    syncer.MarkDesiredComplete();
    if (!syncer.Start().ok() || !runner.Start().ok()) {
      state.SkipWithError("runner or syncer did not start");
      break;
    }
    bench::IngestTiming timing;
    if (!bench::RunIngestBatches(
            runner, kUpdates, kBatch,
            [&](int64_t j) {
              syncer.SetDesired(keys[j % kKeys],
                                static_cast<int>(j / kKeys) + 1);
            },
            &timing)) {
      state.SkipWithError("ingest did not finish");
      break;
    }
    state.SetIterationTime(Seconds(timing.ingest));
    span_total += Seconds(timing.last - timing.first);
    if (!AwaitConverged(runner, syncer, kKeys, absl::Seconds(60))) {
      state.SkipWithError("the world did not converge");
      break;
    }
    auto wrong = runner.PostAndWait(Context(), [&] {
      int64_t n = 0;
      for (int64_t k = 0; k < kKeys; ++k) {
        const int* o = syncer.observed(keys[k]);
        if (o == nullptr || *o != kUpdates / kKeys) ++n;
      }
      return n;
    });
    if (!wrong.ok() || *wrong != 0) {
      state.SkipWithError("keys not at their last desired value");
      break;
    }
    const int64_t calls = world.calls();
    if (calls > 2 * kKeys) {
      state.SkipWithError(
          absl::StrCat("client calls=", calls, " > 2 x keys").c_str());
      break;
    }
    calls_total += calls;
    syncer.Stop();
    runner.Stop();
  }
  state.SetItemsProcessed(state.iterations() * kUpdates);
  state.counters["calls"] = benchmark::Counter(
      static_cast<double>(calls_total), benchmark::Counter::kAvgIterations);
  state.counters["ingest_span_ms"] =
      benchmark::Counter(span_total * 1e3, benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_SyncerIngest)
    ->ArgName("metrics")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Resync -----------------------------------------------------------------

// A client whose calls wait until the benchmark opens the gate, so no
// result comes back to the runner while the diff is timed; it counts calls.
class GatedClient final : public IntClient {
 public:
  ~GatedClient() override { Open(); }
  void Open() {
    open_.store(true);
    open_.notify_all();
  }
  int64_t calls() const { return calls_.load(std::memory_order_relaxed); }

  absl::Status Create(const Context&, const std::string&, const int&) override {
    return Call();
  }
  absl::Status Update(const Context&, const std::string&, const int&,
                      const int&) override {
    return Call();
  }
  absl::Status Delete(const Context&, const std::string&, const int&) override {
    return Call();
  }

 private:
  absl::Status Call() {
    open_.wait(false);
    calls_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  std::atomic<bool> open_{false};
  std::atomic<int64_t> calls_{0};
};

// A full diff of n keys: 100,000 observed (SetObserved, value 0) against a
// desired snapshot of the same keys where every 100th key (1%) is 1.
//
// Cold (BM_SyncerResync): the desired snapshot is the first; the syncer
// comes into sync with it, so every key is diffed against its observed
// value (the case after a start or a lost sync: "on sync every key is
// diffed again").
// Warm (BM_SyncerResyncWarm): the syncer already holds a desired snapshot
// equal to the observed state, in sync and converged; the new snapshot
// changes 1% of it, as a Transformer re-delivering a full snapshot does.
// Every key's desired value is compared, only the changed ones diffed.
//
// The runner is in manual mode: the bench thread is the runner thread, and
// the timed region is ReplaceDesired plus RunUntilIdle (the pump that
// evaluates the dirty keys and dispatches). max_in_flight 1,024, so the
// whole diff is dispatched by that one pump (with the default 8, the pump
// dispatches 8 and the rest follow their results). The client holds its
// calls until the timed region ends. Untimed: the dispatched count (keys in
// flight), then the gate opens and the 1,000 updates must reach the client
// and come back as succeeded.
void Resync(benchmark::State& state, bool warm) {
  const int64_t n = state.range(0);
  const int64_t want = n / 100;
  const std::vector<std::string>& keys = Keys(n);
  int64_t dispatched_total = 0;
  for (auto _ : state) {
    Runner runner({.name = "bench", .logger = testing::NullLogger()});
    GatedClient client;
    IntSyncer syncer(&runner, &client,
                     {.name = "bench",
                      .max_in_flight = 1024,
                      .updater_threads = 1,
                      .logger = testing::NullLogger()});
    if (!syncer.Start().ok()) {
      state.SkipWithError("syncer did not start");
      break;
    }
    for (int64_t i = 0; i < n; ++i) syncer.SetObserved(keys[i], 0);
    if (warm) {
      absl::flat_hash_map<std::string, int> same;
      same.reserve(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) same.emplace(keys[i], 0);
      syncer.ReplaceDesired(std::move(same));
      runner.RunUntilIdle();
    }
    absl::flat_hash_map<std::string, int> desired;
    desired.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) desired.emplace(keys[i], i % 100 == 0);

    Clock::time_point t0 = Clock::now();
    syncer.ReplaceDesired(std::move(desired));
    runner.RunUntilIdle();
    Clock::time_point t1 = Clock::now();
    state.SetIterationTime(Seconds(t1 - t0));

    const int64_t dispatched = syncer.StatusSnapshot(0).in_flight;
    client.Open();
    bool done = testing::AwaitCondition(
        [&] {
          runner.RunUntilIdle();  // Applies the results as they come.
          return syncer.stats().updates == want;
        },
        absl::Seconds(30));
    if (dispatched != want || !done || client.calls() != want) {
      state.SkipWithError(
          absl::StrCat("dispatched=", dispatched, " calls=", client.calls(),
                       " updates=", syncer.stats().updates, " want=", want)
              .c_str());
      break;
    }
    dispatched_total += dispatched;
    syncer.Stop();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["dispatched"] =
      benchmark::Counter(static_cast<double>(dispatched_total),
                         benchmark::Counter::kAvgIterations);
}

void BM_SyncerResync(benchmark::State& state) { Resync(state, false); }
BENCHMARK(BM_SyncerResync)
    ->Arg(100'000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_SyncerResyncWarm(benchmark::State& state) { Resync(state, true); }
BENCHMARK(BM_SyncerResyncWarm)
    ->Arg(100'000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Apply ------------------------------------------------------------------

// A client that does nothing and succeeds: what is left is the Syncer's own
// path. It does not report observed state back, so each key then waits for
// an observation (expectation_timeout, 30 s): that bookkeeping is part of
// every successful operation and is measured too.
// Lets the benchmark's thread sleep until a client has seen `target` calls
// (or operations), instead of polling while the runner and the updaters
// work: a polling thread takes one of the two cores from them.
class CallTarget {
 public:
  void Set(int64_t target) { target_.store(target); }
  void Count(int64_t n) {
    if (seen_.fetch_add(n, std::memory_order_relaxed) + n == target_.load()) {
      MutexLock l(&mu_);
      reached_ = true;
      cv_.SignalAll();
    }
  }
  int64_t seen() const { return seen_.load(std::memory_order_relaxed); }
  // False after `timeout`.
  bool Await(absl::Duration timeout) {
    MutexLock l(&mu_);
    return setpoint::Clock::Real()->AwaitWithDeadline(
        &mu_, &cv_, setpoint::Clock::Real()->Now() + timeout, std::stop_token(),
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return reached_; });
  }

 private:
  std::atomic<int64_t> target_{-1};
  std::atomic<int64_t> seen_{0};
  Mutex mu_;
  CondVar cv_;
  bool reached_ ABSL_GUARDED_BY(mu_) = false;
};

class NoopClient final : public IntClient {
 public:
  int64_t calls() const { return calls_.seen(); }
  CallTarget& target() { return calls_; }
  absl::Status Create(const Context&, const std::string&, const int&) override {
    calls_.Count(1);
    return absl::OkStatus();
  }
  absl::Status Update(const Context&, const std::string&, const int&,
                      const int&) override {
    calls_.Count(1);
    return absl::OkStatus();
  }
  absl::Status Delete(const Context&, const std::string&, const int&) override {
    calls_.Count(1);
    return absl::OkStatus();
  }

 private:
  CallTarget calls_;
};

// 200,000 creates end to end on a started runner: SetDesired on a fresh key
// (posted in events of 1,000), the pump, an updater calling the no-op
// client, the result back on the runner (stats().creates). Timed (wall,
// by hand) from the first post to the moment the bench thread sees the last
// create counted; it polls every ~50 us, well under 1% of an iteration.
//
// Arguments are SyncerOptions::max_in_flight and updater_threads (0: one
// thread per slot). 8/0 is the default (8 operations in flight, 8 threads);
// 256/1 and 256/2 are tuned for a fast client: enough in flight that
// results come back in batches, and few threads on this 2-core machine.
void BM_SyncerApply(benchmark::State& state) {
  constexpr int64_t kOps = 200'000;
  constexpr int64_t kBatch = 1'000;
  const std::vector<std::string>& keys = Keys(kOps);
  for (auto _ : state) {
    Runner runner({.name = "bench", .logger = testing::NullLogger()});
    NoopClient client;
    client.target().Set(kOps);
    IntSyncer syncer(&runner, &client,
                     {.name = "bench",
                      .max_in_flight = static_cast<int>(state.range(0)),
                      .updater_threads = static_cast<int>(state.range(1)),
                      .logger = testing::NullLogger()});
    syncer.MarkDesiredComplete();
    if (!syncer.Start().ok() || !runner.Start().ok()) {
      state.SkipWithError("runner or syncer did not start");
      break;
    }
    Clock::time_point t0 = Clock::now();
    for (int64_t b = 0; b < kOps / kBatch; ++b) {
      (void)runner.Post(
          [&, b] {
            for (int64_t j = b * kBatch; j < (b + 1) * kBatch; ++j) {
              syncer.SetDesired(keys[j], 1);
            }
          },
          "bench apply");
    }
    // Sleeps until the client saw every call, then waits for the last
    // results to be applied.
    (void)client.target().Await(absl::Seconds(30));
    Clock::time_point deadline = t0 + std::chrono::seconds(30);
    while (syncer.stats().creates < kOps && Clock::now() < deadline) {
      std::this_thread::yield();
    }
    Clock::time_point t1 = Clock::now();
    state.SetIterationTime(Seconds(t1 - t0));
    SyncerStats c = syncer.stats();
    if (c.creates != kOps || client.calls() != kOps || c.failures != 0) {
      state.SkipWithError(absl::StrCat("creates=", c.creates,
                                       " calls=", client.calls(),
                                       " failures=", c.failures, " want=", kOps)
                              .c_str());
      break;
    }
    syncer.Stop();
    runner.Stop();
  }
  state.SetItemsProcessed(state.iterations() * kOps);
}
BENCHMARK(BM_SyncerApply)
    ->ArgNames({"max_in_flight", "updaters"})
    ->Args({64, 0})
    ->Args({8, 0})
    ->Args({256, 1})
    ->Args({256, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Batch apply ----------------------------------------------------------
//
// As BM_SyncerApply with a BatchSyncerClient that does nothing: 200,000
// fresh keys, each one create, in batch calls of up to max_batch operations
// with max_batches_in_flight calls at once (the defaults: 100 and 1, on a
// private pool of one updater thread). Timed: from the first SetDesired to
// the last create counted. The no-op client makes the figure the Syncer's
// own cost per operation: one thread crossing per batch each way.

class NoopBatchClient final : public BatchSyncerClient<std::string, int, int> {
 public:
  int64_t operations() const { return ops_.seen(); }
  CallTarget& target() { return ops_; }
  absl::Status Apply(
      const Context&,
      std::span<SyncOperation<std::string, int, int>> ops) override {
    ops_.Count(static_cast<int64_t>(ops.size()));
    return absl::OkStatus();
  }

 private:
  CallTarget ops_;
};

void BM_SyncerBatchApply(benchmark::State& state) {
  constexpr int64_t kOps = 200'000;
  constexpr int64_t kBatch = 1'000;
  const std::vector<std::string>& keys = Keys(kOps);
  for (auto _ : state) {
    Runner runner({.name = "bench", .logger = testing::NullLogger()});
    NoopBatchClient client;
    client.target().Set(kOps);
    IntSyncer syncer(&runner, &client,
                     {.name = "bench",
                      .max_batch = static_cast<int>(state.range(0)),
                      .max_batches_in_flight = static_cast<int>(state.range(1)),
                      .logger = testing::NullLogger()});
    syncer.MarkDesiredComplete();
    if (!syncer.Start().ok() || !runner.Start().ok()) {
      state.SkipWithError("runner or syncer did not start");
      break;
    }
    Clock::time_point t0 = Clock::now();
    for (int64_t b = 0; b < kOps / kBatch; ++b) {
      (void)runner.Post(
          [&, b] {
            for (int64_t j = b * kBatch; j < (b + 1) * kBatch; ++j) {
              syncer.SetDesired(keys[j], 1);
            }
          },
          "bench apply");
    }
    // Sleeps until the client saw every call, then waits for the last
    // results to be applied.
    (void)client.target().Await(absl::Seconds(30));
    Clock::time_point deadline = t0 + std::chrono::seconds(30);
    while (syncer.stats().creates < kOps && Clock::now() < deadline) {
      std::this_thread::yield();
    }
    Clock::time_point t1 = Clock::now();
    state.SetIterationTime(Seconds(t1 - t0));
    SyncerStats c = syncer.stats();
    if (c.creates != kOps || client.operations() != kOps || c.failures != 0) {
      state.SkipWithError(absl::StrCat("creates=", c.creates,
                                       " ops=", client.operations(),
                                       " failures=", c.failures, " want=", kOps)
                              .c_str());
      break;
    }
    state.counters["batches"] = static_cast<double>(c.batches);
    syncer.Stop();
    runner.Stop();
  }
  state.SetItemsProcessed(state.iterations() * kOps);
}
BENCHMARK(BM_SyncerBatchApply)
    ->ArgNames({"max_batch", "in_flight"})
    ->Args({100, 1})
    ->Args({1000, 1})
    ->Args({100, 2})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- One-thread cost -------------------------------------------------------
//
// The Syncer's own CPU cost per operation, without thread crossings: a
// manual runner and manual updates on the benchmark's thread, 200,000 fresh
// keys, each one create through a no-op client (batch:0) or a no-op batch
// client (batch:1, max_batch 100). Timed: SetDesired of every key, then
// running events and calls until every create is counted. A ceiling for
// BM_SyncerApply and BM_SyncerBatchApply, where the runner's share of this
// cost runs beside the updater's.
void BM_SyncerApplyOneThread(benchmark::State& state) {
  constexpr int64_t kOps = 200'000;
  const std::vector<std::string>& keys = Keys(kOps);
  const bool batch = state.range(0) != 0;
  for (auto _ : state) {
    Runner runner({.name = "bench", .logger = testing::NullLogger()});
    NoopClient client;
    NoopBatchClient batch_client;
    IntSyncer::Options options{.name = "bench",
                               .batch_delay = absl::ZeroDuration(),
                               .manual_updates = true,
                               .logger = testing::NullLogger()};
    std::unique_ptr<IntSyncer> syncer =
        batch ? std::make_unique<IntSyncer>(&runner, &batch_client, options)
              : std::make_unique<IntSyncer>(
                    &runner, static_cast<IntClient*>(&client), options);
    syncer->MarkDesiredComplete();
    if (!syncer->Start().ok()) {
      state.SkipWithError("syncer did not start");
      break;
    }
    Clock::time_point t0 = Clock::now();
    for (int64_t j = 0; j < kOps; ++j) syncer->SetDesired(keys[j], 1);
    while (syncer->stats().creates < kOps) {
      const int64_t events = runner.RunUntilIdle();
      const int calls = syncer->RunUntilIdle();
      if (events == 0 && calls == 0) break;
    }
    state.SetIterationTime(Seconds(Clock::now() - t0));
    if (syncer->stats().creates != kOps) {
      state.SkipWithError("not every create was counted");
      break;
    }
    syncer->Stop();
    runner.RunUntilIdle();
  }
  state.SetItemsProcessed(state.iterations() * kOps);
}
BENCHMARK(BM_SyncerApplyOneThread)
    ->ArgName("batch")
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Threads per pod
// ----------------------------------------------------------

using ::setpoint::bench::ProcessThreads;

// What a node of a pod holds that has threads, as far as the Syncer goes:
// its Runner and one Syncer (default options: max_in_flight 64, a private
// pool of 8 updater threads) on a no-op client. A controller node adds its
// sources' threads, a reconcile loop's and the node's own (bench/README.md
// says how many).
struct PodNode {
  PodNode(int i, UpdaterPool* pool)
      : runner({.name = absl::StrCat("node-", i),
                .logger = testing::NullLogger()}),
        syncer(&runner, &client,
               {.name = absl::StrCat("node-", i),
                .pool = pool,
                .logger = testing::NullLogger()}) {
    syncer.MarkDesiredComplete();
  }
  ~PodNode() {
    syncer.Stop();
    runner.Stop();
  }
  Runner runner;
  NoopClient client;
  IntSyncer syncer;
};

// A pod of N nodes (argument 0), each a runner and a syncer, with a private
// updater pool per syncer (shared:0, the default) or one UpdaterPool of 8
// threads for the whole pod (shared:1). Timed (manual): starting every
// node. Untimed: each syncer creates 10 keys, which must all arrive (the
// pool serves every syncer), then the process's threads are counted.
// `threads` is the count of threads the pod added (the process's threads
// while it runs, less those before), `threads_per_node` that over N.
void BM_SyncerThreadsPerPod(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const bool shared = state.range(1) != 0;
  const std::vector<std::string>& keys = Keys(10);
  int64_t added = 0;
  for (auto _ : state) {
    const int64_t before = ProcessThreads();
    std::unique_ptr<UpdaterPool> pool;
    if (shared) {
      pool = std::make_unique<UpdaterPool>(UpdaterPoolOptions{
          .name = "pod", .threads = 8, .logger = testing::NullLogger()});
      if (!pool->Start().ok()) {
        state.SkipWithError("pool did not start");
        break;
      }
    }
    std::vector<std::unique_ptr<PodNode>> pod;
    Clock::time_point t0 = Clock::now();
    bool started = true;
    for (int i = 0; i < nodes; ++i) {
      pod.push_back(std::make_unique<PodNode>(i, pool.get()));
      started = started && pod.back()->syncer.Start().ok() &&
                pod.back()->runner.Start().ok();
    }
    state.SetIterationTime(Seconds(Clock::now() - t0));
    if (!started) {
      state.SkipWithError("a node did not start");
      break;
    }
    for (auto& node : pod) {
      (void)node->runner.Post([&keys, n = node.get()] {
        for (const std::string& key : keys) n->syncer.SetDesired(key, 1);
      });
    }
    bool done = testing::AwaitCondition(
        [&] {
          for (auto& node : pod) {
            if (node->syncer.stats().creates != 10) return false;
          }
          return true;
        },
        absl::Seconds(60));
    added = ProcessThreads() - before;
    if (!done) {
      state.SkipWithError("not every syncer's calls arrived");
      break;
    }
    pod.clear();
    if (pool != nullptr) pool->Stop();
  }
  state.counters["threads"] = static_cast<double>(added);
  state.counters["threads_per_node"] =
      static_cast<double>(added) / static_cast<double>(nodes);
}
BENCHMARK(BM_SyncerThreadsPerPod)
    ->ArgNames({"nodes", "shared"})
    ->Args({1, 0})
    ->Args({10, 0})
    ->Args({100, 0})
    ->Args({1, 1})
    ->Args({10, 1})
    ->Args({100, 1})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

// ---- Memory -----------------------------------------------------------------

// Heap bytes per tracked key: 100,000 keys, each with a desired and an
// observed int that agree (a converged controller at rest: no queue, no
// operation, no timer holds anything). Counting covers building the
// desired snapshot, SetObserved for every key, ReplaceDesired and the pump,
// so what was allocated and freed on the way nets out; what remains is the
// Syncer's map (nodes, slots, control bytes) and the key strings inside the
// nodes. `bytes_per_key` subtracts the values' own size (2 x sizeof(int));
// `allocs_per_key` is the live allocations per key. The timed region is
// that load, with counting on.
void BM_SyncerMemory(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<std::string>& keys = Keys(n);
  int64_t bytes = 0, allocs = 0;
  for (auto _ : state) {
    Runner runner({.name = "bench", .logger = testing::NullLogger()});
    NoopClient client;
    IntSyncer syncer(&runner, &client,
                     {.name = "bench", .logger = testing::NullLogger()});
    g_live_bytes.store(0);
    g_live_allocs.store(0);
    Clock::time_point t0 = Clock::now();
    g_counting.store(true);
    {
      absl::flat_hash_map<std::string, int> desired;
      desired.reserve(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) desired.emplace(keys[i], 7);
      for (int64_t i = 0; i < n; ++i) syncer.SetObserved(keys[i], 7);
      syncer.ReplaceDesired(std::move(desired));
      runner.RunUntilIdle();
    }
    g_counting.store(false);
    Clock::time_point t1 = Clock::now();
    state.SetIterationTime(Seconds(t1 - t0));
    bytes = g_live_bytes.load();
    allocs = g_live_allocs.load();
    SyncerStatus<std::string> s = syncer.StatusSnapshot(0);
    if (s.keys != n || s.converged != n || client.calls() != 0) {
      state.SkipWithError(
          absl::StrCat("keys=", s.keys, " converged=", s.converged, " want=", n)
              .c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["bytes_per_key"] =
      static_cast<double>(bytes - n * 2 * static_cast<int64_t>(sizeof(int))) /
      static_cast<double>(n);
  state.counters["allocs_per_key"] =
      static_cast<double>(allocs) / static_cast<double>(n);
}
BENCHMARK(BM_SyncerMemory)
    ->Arg(100'000)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace setpoint

BENCHMARK_MAIN();
