// Benchmarks for the Controller: how long a handoff (UpdateShardRange) takes
// while calls for the keys that leave are in flight, and what composing the
// pieces through a Controller costs over wiring them by hand, on the Syncer's
// ingest benchmark.
//
//   # Build in Release (commands in bench/README.md), then:
//   build/release/bench/controller_bench --benchmark_repetitions=3
//   build/release/bench/controller_bench --quick  # a few seconds (the tests)
//
// The names are stable so figures can be compared over time (bench/README.md
// keeps the last figures and the targets). Every benchmark times by hand
// (UseManualTime) the part named in its comment and checks its own result: a
// wrong one reports an error ("ERROR OCCURRED") instead of a figure.
//
// Keys are std::string like "rs-000123" (as in syncer_bench.cc), values ints;
// the controllers run with real threads and the real clock. Loggers are
// testing::NullLogger() (level info, no sinks).
//
// BM_IngestWhatIf* are hand-wired variants that show what a change in the
// library would buy (bench/README.md); they are not what the library does.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "ingest_batches.h"
#include "process_threads.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/controller/controller.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/node/shard.h"
#include "setpoint/planner/loop_pool.h"
#include "setpoint/planner/plan.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/runner_pool.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/processor/updater_pool.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/null_logger.h"

namespace setpoint {
namespace {

using Clock = std::chrono::steady_clock;
using IntMap = absl::flat_hash_map<std::string, int>;
using IntStore = Store<std::string, int>;
using IntSource = PollingSource<std::string, int>;
using IntSyncer = Syncer<std::string, int, int>;
using IntClient = SyncerClient<std::string, int, int>;

constexpr int64_t kKeys = 10'000;
constexpr ShardRange kWholeRing{0, kDefaultRingSize};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}
double Micros(Clock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// "rs-000000" ... : built once, outside every timed region.
const std::vector<std::string>& Keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k;
    for (int64_t i = 0; i < kKeys; ++i)
      k.push_back(absl::StrFormat("rs-%06d", i));
    return k;
  }();
  return keys;
}

// A list function for a store nothing is listed into after the start: the
// benchmark (or the world) sets its keys on the runner instead.
absl::StatusOr<IntMap> ListNothing(const Context&) { return IntMap(); }

// No list but the first and the one after each filter change: no poll
// runs in the middle of a measurement.
PollingSourceOptions<int> QuietPoll(std::shared_ptr<spdlog::logger> logger) {
  return {.interval = absl::Hours(1), .logger = std::move(logger)};
}

// The value of the nearest-rank percentile `p` (0 < p <= 1) of `v`.
double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t rank =
      static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

// ---- Handoff ----------------------------------------------------------------

// A client whose every call runs until its context is cancelled (a call
// blocked on a slow API that honours cancellation), then returns its error.
// It knows which keys are in a call right now.
class HoldingClient final : public IntClient {
 public:
  absl::Status Create(const Context& ctx, const std::string& key,
                      const int&) override {
    return Hold(ctx, key);
  }
  absl::Status Update(const Context& ctx, const std::string& key, const int&,
                      const int&) override {
    return Hold(ctx, key);
  }
  absl::Status Delete(const Context& ctx, const std::string& key,
                      const int&) override {
    return Hold(ctx, key);
  }

  // Calls running now.
  int64_t held() const {
    MutexLock l(&mu_);
    return static_cast<int64_t>(running_.size());
  }
  // The keys of the calls running now.
  std::vector<std::string> HeldKeys() const {
    MutexLock l(&mu_);
    std::vector<std::string> keys;
    for (const auto& [key, n] : running_) keys.push_back(key);
    return keys;
  }
  // Calls running now for keys outside `range`.
  int64_t RunningOutside(ShardRange range) const {
    MutexLock l(&mu_);
    int64_t n = 0;
    for (const auto& [key, count] : running_) {
      if (!range.Contains(ShardOf(key))) n += count;
    }
    return n;
  }
  // Calls that returned (all of them saw their context cancelled).
  int64_t returned() const {
    MutexLock l(&mu_);
    return returned_;
  }

 private:
  absl::Status Hold(const Context& ctx, const std::string& key) {
    {
      MutexLock l(&mu_);
      ++running_[key];
    }
    (void)ctx.Wait(absl::InfiniteDuration());
    {
      MutexLock l(&mu_);
      if (--running_[key] == 0) running_.erase(key);
      ++returned_;
    }
    return ctx.Err();
  }

  mutable Mutex mu_;
  absl::flat_hash_map<std::string, int64_t> running_ ABSL_GUARDED_BY(mu_);
  int64_t returned_ ABSL_GUARDED_BY(mu_) = 0;
};

// Where a handoff moves the node from the whole ring.
enum class HandoffTo {
  // The empty range: every key is forgotten, the 8 held calls cancelled.
  kEmpty,
  // The longest run of shards with no held key in it: the 8 held calls
  // are cancelled, the keys outside the run forgotten. While the node owns
  // only the run, 8 calls start for keys in it; they go on when the ring
  // comes back, so the next run lies elsewhere (about half the keys are
  // forgotten each time, see the counters).
  kGap,
  // [0, 2048): about 5,000 keys forgotten. Held calls for keys in the kept
  // half are the node's and go on, so after the first handoffs all 8 held
  // keys are in it: this is the re-scope with (almost) nothing to cancel.
  kHalf,
};

// The longest range of the ring that holds none of `shards`.
ShardRange LongestGap(std::vector<uint32_t> shards) {
  std::sort(shards.begin(), shards.end());
  ShardRange best{};
  uint32_t begin = 0;
  for (uint32_t s : shards) {
    if (s > begin && s - begin > best.size()) best = {begin, s};
    begin = std::max(begin, s + 1);
  }
  if (kWholeRing.end > begin && kWholeRing.end - begin > best.size()) {
    best = {begin, kWholeRing.end};
  }
  return best;
}

// A real-threaded Controller (its own Run thread, runner, source threads and
// 8 updater threads) with a Poll observed store that lists nothing, a Poll
// desired store that lists 10,000 keys spread over the ring, and one Sync
// with max_in_flight 8 through HoldingClient: with the whole ring assigned,
// exactly 8 calls are in flight, for 8 keys, all waiting for cancellation.
//
// Timed (manual): one UpdateShardRange from the whole ring to the target
// (HandoffTo), from the call to its return: the plans' pause (there are
// none), the re-scope event on the runner (both stores and the syncer
// forget the keys that left; the syncer cancels their calls), then the
// wait until none of those calls runs. It fails the benchmark if it
// returns an error or if a held call for a key outside the target still
// runs when it returned.
//
// Untimed: the whole ring is given back (the stores list again, the
// syncer diffs every key and dispatches) and the benchmark waits until 8
// calls are held again, the syncer is in sync with 8 in flight and the
// stores hold every key, so each handoff starts from the same quiet state.
//
// Counters (over the iterations): p50_us, p99_us, max_us of the handoff;
// rescope_p50_us, from the call until the re-scope event ended (measured in
// an OnAssignment hook, the last thing that event runs), and await_p50_us,
// from there to the return; forgotten, the desired store's keys forgotten
// per handoff; cancelled, the held calls per handoff that were cancelled
// and returned.
void BM_ControllerHandoff(benchmark::State& state, HandoffTo to, bool pooled) {
  constexpr int kInFlight = 8;
  // pooled: the runner on a pod's runner pool of 4 (the default), as in a
  // pod, instead of a thread of its own.
  RunnerPool runners(
      {.name = "bench/runners", .threads = 4, .logger = testing::NullLogger()});
  if (pooled && !runners.Start().ok()) {
    state.SkipWithError("runner pool did not start");
    return;
  }
  const std::vector<std::string>& keys = Keys();
  IntMap catalog;
  for (const std::string& key : keys) catalog.emplace(key, 1);

  HoldingClient client;
  std::atomic<Runner*> runner{nullptr};
  std::atomic<IntStore*> desired{nullptr};
  std::atomic<IntSyncer*> syncer{nullptr};
  std::atomic<int64_t> rescoped_ns{0};
  auto build = [&](ControllerBuilder& b) {
    IntStore* observed_store = b.Poll<std::string, int>("observed", ListNothing,
                                                        QuietPoll(b.logger()));
    IntStore* desired_store = b.Poll<std::string, int>(
        "desired",
        [&catalog](const Context&) -> absl::StatusOr<IntMap> {
          return catalog;
        },
        QuietPoll(b.logger()));
    IntSyncer* s = b.Sync<std::string, int, int>("held", &client,
                                                 observed_store, desired_store,
                                                 {.max_in_flight = kInFlight});
    b.OnAssignment([&rescoped_ns](const Assignment&) {
      rescoped_ns.store(Clock::now().time_since_epoch().count());
    });
    desired.store(desired_store);
    syncer.store(s);
    runner.store(b.runner());
    return absl::OkStatus();
  };
  Controller controller({.id = "bench/handoff/0", .kind = "handoff"}, build,
                        {.runners = pooled ? &runners : nullptr,
                         .logger = testing::NullLogger()});
  absl::Status run_status;
  std::jthread run([&](std::stop_token stop) {
    run_status = controller.Run(Context(stop));
  });
  uint64_t token = 0;
  auto assign = [&](ShardRange range) {
    return controller.UpdateShardRange(Context(), {range, ++token});
  };
  // 8 calls held, the syncer in sync with them in flight, every key in it
  // and in the desired store.
  auto await_held = [&] {
    return testing::AwaitCondition(
        [&] {
          if (client.held() != kInFlight) return false;
          absl::StatusOr<bool> quiet =
              runner.load()->PostAndWait(Context(), [&] {
                SyncerStatus<std::string> s = syncer.load()->StatusSnapshot(0);
                return s.in_sync && s.in_flight == kInFlight &&
                       s.keys == kKeys &&
                       desired.load()->size() == static_cast<size_t>(kKeys);
              });
          return quiet.ok() && *quiet;
        },
        absl::Seconds(30));
  };
  auto forgets = [&]() -> int64_t {
    absl::StatusOr<int64_t> n = runner.load()->PostAndWait(
        Context(), [&] { return desired.load()->stats().forgets; });
    return n.ok() ? *n : -1;
  };

  if (!testing::AwaitCondition([&] { return runner.load() != nullptr; }) ||
      !assign(kWholeRing).ok() || !await_held()) {
    state.SkipWithError("controller did not reach 8 held calls");
    return;
  }
  std::vector<double> total_us, rescope_us, await_us;
  int64_t forgotten = 0, cancelled = 0;
  for (auto _ : state) {
    ShardRange target{};
    if (to == HandoffTo::kHalf) {
      target = {0, kDefaultRingSize / 2};
    } else if (to == HandoffTo::kGap) {
      std::vector<uint32_t> shards;
      for (const std::string& key : client.HeldKeys()) {
        shards.push_back(ShardOf(key));
      }
      target = LongestGap(std::move(shards));
    }
    const int64_t forgets_before = forgets();
    const int64_t returned_before = client.returned();

    const Clock::time_point t0 = Clock::now();
    absl::Status handoff = assign(target);
    const Clock::time_point t1 = Clock::now();
    const int64_t still_running = client.RunningOutside(target);

    if (!handoff.ok()) {
      state.SkipWithError(
          absl::StrCat("handoff failed: ", handoff.ToString()).c_str());
      break;
    }
    if (still_running != 0) {
      state.SkipWithError(absl::StrCat(still_running, " held call(s) outside ",
                                       target.ToString(),
                                       " still running after the handoff")
                              .c_str());
      break;
    }
    state.SetIterationTime(Seconds(t1 - t0));
    const Clock::time_point rescoped{Clock::duration(rescoped_ns.load())};
    total_us.push_back(Micros(t1 - t0));
    rescope_us.push_back(Micros(rescoped - t0));
    await_us.push_back(Micros(t1 - rescoped));
    forgotten += forgets() - forgets_before;
    cancelled += client.returned() - returned_before;

    if (!assign(kWholeRing).ok() || !await_held()) {
      state.SkipWithError("8 calls were not held again after the handoff");
      break;
    }
  }
  run.request_stop();
  run.join();
  if (!run_status.ok()) {
    state.SkipWithError(
        absl::StrCat("controller run: ", run_status.ToString()).c_str());
  }
  if (total_us.empty()) return;
  const double n = static_cast<double>(total_us.size());
  state.counters["p50_us"] = Percentile(total_us, 0.50);
  state.counters["p99_us"] = Percentile(total_us, 0.99);
  state.counters["max_us"] = Percentile(total_us, 1.0);
  state.counters["rescope_p50_us"] = Percentile(rescope_us, 0.50);
  state.counters["await_p50_us"] = Percentile(await_us, 0.50);
  state.counters["forgotten"] = static_cast<double>(forgotten) / n;
  state.counters["cancelled"] = static_cast<double>(cancelled) / n;
}

// ---- Ingest: hand-wired and composed ---------------------------------------

// SlowWorld of syncer_bench.cc: 1 ms per call (a sleep: IO on the updater
// threads), each write reported back the way a watch would, here to the
// observed store (Store::Set on the runner) instead of to the syncer, since
// a controller's syncer takes its observed state from a store.
class SlowWorld final : public IntClient {
 public:
  void Attach(Runner* runner, IntStore* observed) {
    runner_.store(runner, std::memory_order_release);
    observed_.store(observed, std::memory_order_release);
  }
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
    IntStore* store = observed_.load(std::memory_order_acquire);
    (void)runner_.load(std::memory_order_acquire)
        ->Post([store, key] { store->Delete(key); }, "world watch");
    return absl::OkStatus();
  }

 private:
  absl::Status Write(const std::string& key, int value) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    IntStore* store = observed_.load(std::memory_order_acquire);
    (void)runner_.load(std::memory_order_acquire)
        ->Post([store, key, value] { store->Set(key, value); }, "world watch");
    return absl::OkStatus();
  }

  std::atomic<Runner*> runner_{nullptr};
  std::atomic<IntStore*> observed_{nullptr};
  std::atomic<int64_t> calls_{0};
};

// The filter the controller installs for `range` (its FilterFor): a key is
// selected when its shard is in the range.
KeyFilter<std::string> RangeFilter(ShardRange range) {
  return [range](const std::string& key) {
    return range.Contains(ShardOf(key, kDefaultRingSize));
  };
}

// ShardOf for a ring whose size is a power of two, inline: the same FNV-1a
// 64 and the same shard (x % 2^k == x & (2^k - 1)), without the call and
// the 64-bit division. Not in the library; for the what-if benchmarks.
uint32_t ShardOfPow2(std::string_view key, uint32_t ring_size) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) {
    hash ^= c;
    hash *= 0x100000001b3ULL;
  }
  return static_cast<uint32_t>(hash & (ring_size - 1));
}
KeyFilter<std::string> FastRangeFilter(ShardRange range) {
  return [range](const std::string& key) {
    return range.Contains(ShardOfPow2(key, kDefaultRingSize));
  };
}

// What the hand-wired pieces are scoped with.
enum class Scope {
  // No filter, no call values: what a user wiring one node by hand writes.
  kNone,
  // What the controller's re-scope does for the whole ring: the range
  // filter (RangeFilter, the controller's) on both sources, so both
  // stores, and on the syncer; an Assignment as the calls' values.
  kController,
  // What-ifs, not what the library does: as kController, but ...
  kStoresOnly,      // ... the syncer unfiltered (it trusts its stores' filter).
  kFast,            // ... FastRangeFilter everywhere.
  kFastStoresOnly,  // ... both.
};

// The controller's pieces wired by hand, in the order and with the options
// the Controller gives them: a runner, an observed store and a desired
// store each fed by a PollingSource that lists nothing (an hour apart), and
// a syncer observing one and desiring from the other; scoped by `scope`.
class HandWired {
 public:
  HandWired(SlowWorld* world, Scope scope)
      : runner_({.name = "bench", .logger = testing::NullLogger()}),
        observed_({.name = "observed", .logger = testing::NullLogger()}),
        observed_source_(&runner_, &observed_, ListNothing,
                         QuietPoll(testing::NullLogger())),
        desired_({.name = "desired", .logger = testing::NullLogger()}),
        desired_source_(&runner_, &desired_, ListNothing,
                        QuietPoll(testing::NullLogger())),
        syncer_(&runner_, world,
                {.name = "bench",
                 .max_in_flight = 8,
                 .logger = testing::NullLogger()}) {
    syncer_.ObserveFrom(&observed_);
    syncer_.DesireFrom(&desired_);
    if (scope != Scope::kNone) {
      const bool fast =
          scope == Scope::kFast || scope == Scope::kFastStoresOnly;
      auto filter = [fast] {
        return fast ? FastRangeFilter(kWholeRing) : RangeFilter(kWholeRing);
      };
      observed_source_.Rescope(filter());
      desired_source_.Rescope(filter());
      if (scope == Scope::kController || scope == Scope::kFast) {
        syncer_.Rescope(filter());
      }
      syncer_.SetCallValues(
          Context().WithValue(std::make_shared<const Assignment>(Assignment{
              .range = kWholeRing,
              .token = 1,
              .node_id = "bench/ingest/0",
              .kind = "ingest",
          })));
    }
    world->Attach(&runner_, &observed_);
  }

  absl::Status Start() {
    if (absl::Status s = runner_.Start(); !s.ok()) return s;
    if (absl::Status s = observed_source_.Start(); !s.ok()) return s;
    if (absl::Status s = desired_source_.Start(); !s.ok()) return s;
    return syncer_.Start();
  }
  absl::Status Stop() {
    syncer_.Stop();
    desired_source_.Stop();
    observed_source_.Stop();
    runner_.Stop();
    return absl::OkStatus();
  }
  Runner* runner() { return &runner_; }
  IntStore* desired() { return &desired_; }
  IntSyncer* syncer() { return &syncer_; }

 private:
  Runner runner_;
  IntStore observed_;
  IntSource observed_source_;
  IntStore desired_;
  IntSource desired_source_;
  IntSyncer syncer_;
};

// The same pieces declared in a Controller's build function, run on its own
// Run thread and assigned the whole ring.
class Composed {
 public:
  explicit Composed(SlowWorld* world)
      : world_(world),
        controller_({.id = "bench/ingest/0", .kind = "ingest"},
                    [this](ControllerBuilder& b) {
                      IntStore* observed = b.Poll<std::string, int>(
                          "observed", ListNothing, QuietPoll(b.logger()));
                      IntStore* desired = b.Poll<std::string, int>(
                          "desired", ListNothing, QuietPoll(b.logger()));
                      IntSyncer* syncer = b.Sync<std::string, int, int>(
                          "bench", world_, observed, desired,
                          {.max_in_flight = 8});
                      world_->Attach(b.runner(), observed);
                      desired_ = desired;
                      syncer_ = syncer;
                      runner_.store(b.runner(), std::memory_order_release);
                      return absl::OkStatus();
                    },
                    {.logger = testing::NullLogger()}) {}

  absl::Status Start() {
    run_ = std::jthread([this](std::stop_token stop) {
      run_status_ = controller_.Run(Context(stop));
    });
    if (!testing::AwaitCondition([this] { return runner() != nullptr; })) {
      return absl::DeadlineExceededError("controller did not build");
    }
    return controller_.UpdateShardRange(Context(), {kWholeRing, 1});
  }
  absl::Status Stop() {
    run_.request_stop();
    run_.join();
    return run_status_;
  }
  Runner* runner() { return runner_.load(std::memory_order_acquire); }
  // Set on the Run thread before runner() is.
  IntStore* desired() { return desired_; }
  IntSyncer* syncer() { return syncer_; }

 private:
  SlowWorld* const world_;
  Controller controller_;
  std::atomic<Runner*> runner_{nullptr};
  IntStore* desired_ = nullptr;
  IntSyncer* syncer_ = nullptr;
  std::jthread run_;
  absl::Status run_status_;
};

// True once every key of `syncer` is converged; false after `timeout`.
bool AwaitConverged(Runner& runner, IntSyncer& syncer, absl::Duration timeout) {
  return testing::AwaitCondition(
      [&] {
        auto s = runner.PostAndWait(Context(),
                                    [&] { return syncer.StatusSnapshot(0); });
        return s.ok() && s->keys == kKeys && s->converged == kKeys;
      },
      timeout);
}

// BM_SyncerIngest (syncer_bench.cc) through a desired store: 1,000,000
// desired_store.Set over 10,000 keys on the runner, in 1,000 runner events
// of 1,000 that each post the next; the store tells the syncer (its
// listener, SetDesired); the world takes 1 ms per call and reports each
// write to the observed store. Update j sets key j % 10,000 to
// j / 10,000 + 1. The pieces (`P`: HandWired or Composed) are built fresh
// per iteration and in sync (both sources listed) before the first batch.
//
// Timed (manual): the sum of the batch events' run times, measured on the
// runner (the Set calls and what they do in the store and the syncer), as
// in BM_SyncerIngest. `ingest_span_ms` is first batch start to last batch
// end. `batch_p50_us` is the median run time of one batch event over all
// iterations: a preempted batch (other processes on a shared machine)
// moves the total but hardly the median, so the ratio of two medians is
// the steadier comparison. Untimed: waiting until every key is converged, then
// checking every key is observed at 100 and the client calls are at most 2 x
// keys.
template <class P, class... Args>
void Ingest(benchmark::State& state, Args... args) {
  constexpr int64_t kUpdates = 1'000'000;
  constexpr int64_t kBatch = 1'000;
  const std::vector<std::string>& keys = Keys();
  int64_t calls_total = 0;
  double span_total = 0;
  std::vector<double> batch_us;
  for (auto _ : state) {
    SlowWorld world;
    P pieces(&world, args...);
    if (absl::Status s = pieces.Start(); !s.ok()) {
      state.SkipWithError(absl::StrCat("start: ", s.ToString()).c_str());
      break;
    }
    Runner& runner = *pieces.runner();
    IntStore& desired = *pieces.desired();
    IntSyncer& syncer = *pieces.syncer();
    if (!testing::AwaitCondition([&] {
          auto s = runner.PostAndWait(Context(),
                                      [&] { return syncer.StatusSnapshot(0); });
          return s.ok() && s->in_sync;
        })) {
      state.SkipWithError("the stores did not come into sync");
      break;
    }
    bench::IngestTiming timing;
    if (!bench::RunIngestBatches(
            runner, kUpdates, kBatch,
            [&](int64_t j) {
              desired.Set(keys[j % kKeys], static_cast<int>(j / kKeys) + 1);
            },
            &timing)) {
      state.SkipWithError("ingest did not finish");
      break;
    }
    state.SetIterationTime(Seconds(timing.ingest));
    span_total += Seconds(timing.last - timing.first);
    for (Clock::duration d : timing.batches) batch_us.push_back(Micros(d));
    if (!AwaitConverged(runner, syncer, absl::Seconds(60))) {
      state.SkipWithError("the world did not converge");
      break;
    }
    auto wrong = runner.PostAndWait(Context(), [&] {
      int64_t n = 0;
      for (const std::string& key : keys) {
        const int* o = syncer.observed(key);
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
    if (absl::Status s = pieces.Stop(); !s.ok()) {
      state.SkipWithError(absl::StrCat("stop: ", s.ToString()).c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * kUpdates);
  state.counters["calls"] = benchmark::Counter(
      static_cast<double>(calls_total), benchmark::Counter::kAvgIterations);
  state.counters["ingest_span_ms"] =
      benchmark::Counter(span_total * 1e3, benchmark::Counter::kAvgIterations);
  state.counters["batch_p50_us"] = Percentile(std::move(batch_us), 0.50);
}

void BM_IngestHandWired(benchmark::State& state) {
  Ingest<HandWired>(state, Scope::kNone);
}
void BM_IngestHandWiredScoped(benchmark::State& state) {
  Ingest<HandWired>(state, Scope::kController);
}
void BM_IngestComposed(benchmark::State& state) { Ingest<Composed>(state); }
void BM_IngestWhatIfSyncerTrustsStores(benchmark::State& state) {
  Ingest<HandWired>(state, Scope::kStoresOnly);
}
// True when ShardOfPow2 gives every key the library's shard.
bool FastShardAgrees(benchmark::State& state) {
  for (const std::string& key : Keys()) {
    if (ShardOfPow2(key, kDefaultRingSize) != ShardOf(key, kDefaultRingSize)) {
      state.SkipWithError(
          absl::StrCat("ShardOfPow2 differs for ", key).c_str());
      return false;
    }
  }
  return true;
}
void BM_IngestWhatIfFastFilter(benchmark::State& state) {
  if (FastShardAgrees(state)) Ingest<HandWired>(state, Scope::kFast);
}
void BM_IngestWhatIfBoth(benchmark::State& state) {
  if (FastShardAgrees(state)) Ingest<HandWired>(state, Scope::kFastStoresOnly);
}

// `quick`: a handful of iterations each, for the test suite.
void RegisterAll(bool quick) {
  for (auto [name, to] :
       {std::pair{"BM_ControllerHandoff/empty", HandoffTo::kEmpty},
        std::pair{"BM_ControllerHandoff/gap", HandoffTo::kGap},
        std::pair{"BM_ControllerHandoff/half", HandoffTo::kHalf},
        std::pair{"BM_ControllerHandoff/empty/pooled", HandoffTo::kEmpty},
        std::pair{"BM_ControllerHandoff/gap/pooled", HandoffTo::kGap},
        std::pair{"BM_ControllerHandoff/half/pooled", HandoffTo::kHalf}}) {
    const bool pooled = std::string_view(name).ends_with("/pooled");
    benchmark::RegisterBenchmark(name,
                                 [to = to, pooled](benchmark::State& state) {
                                   BM_ControllerHandoff(state, to, pooled);
                                 })
        ->Iterations(quick ? 10 : 200)
        ->UseManualTime()
        ->Unit(benchmark::kMicrosecond);
  }
  for (auto [name, fn] :
       {std::pair{"BM_IngestHandWired", &BM_IngestHandWired},
        std::pair{"BM_IngestHandWiredScoped", &BM_IngestHandWiredScoped},
        std::pair{"BM_IngestComposed", &BM_IngestComposed},
        std::pair{"BM_IngestWhatIfSyncerTrustsStores",
                  &BM_IngestWhatIfSyncerTrustsStores},
        std::pair{"BM_IngestWhatIfFastFilter", &BM_IngestWhatIfFastFilter},
        std::pair{"BM_IngestWhatIfBoth", &BM_IngestWhatIfBoth}}) {
    auto* b = benchmark::RegisterBenchmark(name, fn)->UseManualTime()->Unit(
        benchmark::kMillisecond);
    if (quick) b->Iterations(1);
  }
}

}  // namespace
}  // namespace setpoint

// ---- Threads per pod, whole controller nodes
// -------------------------------------------

namespace {

using ::setpoint::bench::ProcessThreads;

class NoopRecordClient : public setpoint::SyncerClient<std::string, int, int> {
 public:
  absl::Status Create(const setpoint::Context&, const std::string&,
                      const int&) override {
    return absl::OkStatus();
  }
  absl::Status Update(const setpoint::Context&, const std::string&, const int&,
                      const int&) override {
    return absl::OkStatus();
  }
  absl::Status Delete(const setpoint::Context&, const std::string&,
                      const int&) override {
    return absl::OkStatus();
  }
};

// A pod (a NodeManager on an in-memory registry) of N controller nodes,
// each with two Poll sources, a Sync with default options and a Reconcile
// plan: the shape the issue counted 12 threads per node for. Timed: the
// pod's start until every node owns its share and runs. Counter: the
// threads the pod added. updaters:0 gives each syncer its own pool (the
// previous behaviour), updaters:16 is the default pod-wide pool.
void BM_ControllerThreadsPerPod(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const int updaters = static_cast<int>(state.range(1));
  NoopRecordClient client;
  int64_t added = 0, at_ready = 0;
  for (auto _ : state) {
    setpoint::InMemoryNodeRegistry registry;
    setpoint::ControllerKind kind{
        .kind = "records",
        .count = nodes,
        .build =
            [&](setpoint::ControllerBuilder& b) {
              using Map = absl::flat_hash_map<std::string, int>;
              auto* seen = b.Poll<std::string, int>(
                  "seen", [](const setpoint::Context&) { return Map{}; });
              auto* want = b.Poll<std::string, int>(
                  "want", [](const setpoint::Context&) { return Map{}; });
              b.Sync<std::string, int, int>("records", &client, seen, want);
              b.Reconcile(setpoint::MakePlan(
                  "noop",
                  [](const setpoint::Context&)
                      -> absl::StatusOr<setpoint::Procedures> {
                    return setpoint::Procedures{};
                  }));
              return absl::OkStatus();
            },
        .options = {.logger = setpoint::testing::NullLogger()}};
    const int64_t before = ProcessThreads();
    // The pod's updater pool, as PodMain makes it (counted with the pod).
    std::unique_ptr<setpoint::UpdaterPool> pool;
    if (updaters > 0) {
      pool =
          std::make_unique<setpoint::UpdaterPool>(setpoint::UpdaterPoolOptions{
              .name = "pod/updaters", .threads = updaters});
      if (!pool->Start().ok()) {
        state.SkipWithError("updater pool did not start");
        return;
      }
    }
    // ...and its loop pool (the pod config's loop_threads, default 16).
    setpoint::LoopPool loops({.name = "pod/loops",
                              .max_threads = 16,
                              .logger = setpoint::testing::NullLogger()});
    if (!loops.Start().ok()) {
      state.SkipWithError("loop pool did not start");
      return;
    }
    // ...and its runner pool (runner_threads, default 4).
    setpoint::RunnerPool runners({.name = "pod/runners",
                                  .threads = 4,
                                  .logger = setpoint::testing::NullLogger()});
    if (!runners.Start().ok()) {
      state.SkipWithError("runner pool did not start");
      return;
    }
    setpoint::NodeManager pod({.pod_id = "pod",
                               .kinds = {kind.ToNodeKind()},
                               .registry = &registry,
                               .poll_interval = absl::Milliseconds(50),
                               .lease = absl::Seconds(1),
                               .updaters = pool.get(),
                               .loops = &loops,
                               .runners = &runners,
                               .logger = setpoint::testing::NullLogger()});
    if (!pod.Start().ok()) {
      state.SkipWithError("pod did not start");
      return;
    }
    const bool owned = setpoint::testing::AwaitCondition(
        [&] {
          uint32_t covered = 0;
          for (const setpoint::NodeState& n : pod.Nodes()) {
            covered += n.active.range.size();
          }
          return covered == setpoint::kDefaultRingSize &&
                 pod.Readiness(absl::Seconds(30)).empty();
        },
        absl::Seconds(60));
    state.PauseTiming();
    at_ready = ProcessThreads() - before;
    // Settled: relay workers started for the first grants' burst leave
    // after idling (1 s); wait until the count stops falling for 1.5 s.
    int64_t last = at_ready;
    auto still = std::chrono::steady_clock::now();
    const auto give_up = still + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < give_up &&
           std::chrono::steady_clock::now() - still <
               std::chrono::milliseconds(1500)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t now = ProcessThreads() - before;
      if (now < last) still = std::chrono::steady_clock::now();
      last = now;
    }
    added = last;
    pod.Stop();
    if (pool != nullptr) pool->Stop();
    loops.Stop();
    runners.Stop();
    state.ResumeTiming();
    if (!owned) {
      state.SkipWithError("the pod did not own its ring and get ready");
      return;
    }
  }
  state.counters["threads_at_ready"] = static_cast<double>(at_ready);
  state.counters["threads"] = static_cast<double>(added);
  state.counters["threads_per_node"] = static_cast<double>(added) / nodes;
}
BENCHMARK(BM_ControllerThreadsPerPod)
    ->ArgNames({"nodes", "updaters"})
    ->Args({1, 0})
    ->Args({1, 16})
    ->Args({10, 0})
    ->Args({10, 16})
    ->Args({100, 0})
    ->Args({100, 16})
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

// Google Benchmark's flags, plus --quick: 10 handoffs and one ingest
// iteration per benchmark (a few seconds).
int main(int argc, char** argv) {
  bool quick = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--quick") {
      quick = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  setpoint::RegisterAll(quick);
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
