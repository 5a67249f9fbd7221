// Benchmarks for the sources: how long a watched change takes to reach the
// store, how many lists a shared source makes for the nodes of a pod, what
// a re-list after an expiry costs on top of the list, and how many threads
// sources hold.
//
//   # Build in Release (commands in bench/README.md), then:
//   build/release/bench/source_bench --benchmark_repetitions=3
//   build/release/bench/source_bench --quick   # a few seconds (the tests)
//
// The names are stable so figures can be compared over time. Every
// benchmark checks its own result: a wrong one reports an error ("ERROR
// OCCURRED") instead of a figure. Worlds are the testing kit's
// FakeWatchWorld (a watch) or a map behind a mutex (a poll); keys are
// std::string like "rs-000123", values ints; loggers are NullLogger().
//
// BM_WatchEventToStore: one change at a time, closed loop: the world's
//   Set, the source's stream thread, the cache, the runner, the store's
//   listener. Counters: p50_us, p99_us, max_us. Target: p99 <= 1 ms.
// BM_SharedPollFanout/nodes:10/shared:1: a NodeManager pod of 10 nodes of
//   one kind whose build declares SharedPoll over 10,000 keys (interval
//   100 ms); counts the list calls over 20 intervals once every node is in
//   sync: lists_per_interval. Target: 1 (shared:0, a Poll per node: 10).
// BM_RelistAfterExpiry/items:100000: a WatchSource holding 100,000 keys;
//   1,000 deleted, 1,000 changed and 1,000 added, then the world compacts
//   and the stream expires. Manual time: from the re-list's return to the
//   store having applied the diff (the list itself, a copy of the world,
//   is list_ms). Checks the tombstones are exactly the 1,000 deleted keys.
//   Target: <= 50 ms plus the list.
// BM_SourceThreads/kind:{poll,watch,shared}: the threads 100 sources (or
//   one shared source over 100 stores) hold once settled, on one
//   SourceExecutor: threads_held.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "process_threads.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/controller/controller.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/shared_source.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/source_executor.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/watch_source.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/fake_watch_world.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"

namespace setpoint {
namespace {

using SteadyClock = std::chrono::steady_clock;
using IntMap = absl::flat_hash_map<std::string, int>;
using IntStore = Store<std::string, int>;
using World = testing::FakeWatchWorld<std::string, int>;

bool quick = false;  // --quick: small sizes, one iteration each.

std::string Key(int64_t i) { return absl::StrFormat("rs-%06d", i); }

IntMap Keys(int64_t n) {
  IntMap m;
  m.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) m[Key(i)] = 0;
  return m;
}

double Micros(SteadyClock::duration d) {
  return std::chrono::duration<double, std::micro>(d).count();
}

// --- BM_WatchEventToStore --------------------------------------------------

void BM_WatchEventToStore(benchmark::State& state) {
  const int events = quick ? 200 : 5000;
  Runner runner({.name = "bench", .logger = testing::NullLogger()});
  if (!runner.Start().ok()) return state.SkipWithError("runner start");
  IntStore store({.name = "seen", .logger = testing::NullLogger()});
  World world;
  world.SetMany({{Key(0), 0}});
  // The listener stamps the arrival of each value (runner thread).
  std::atomic<int64_t> seen_value{-1};
  std::atomic<int64_t> seen_at{0};
  (void)runner.PostAndWait(Context(), [&] {
    store.Subscribe([&](const Change<std::string, int>& c) {
      if (c.kind != ChangeKind::kSet) return;
      seen_at.store(SteadyClock::now().time_since_epoch().count(),
                    std::memory_order_relaxed);
      seen_value.store(*c.new_value, std::memory_order_release);
    });
  });
  WatchSourceOptions<int> options;
  options.name = "bench";
  options.logger = testing::NullLogger();
  WatchSource<std::string, int> source(
      &runner, &store, [&](const Context& ctx) { return world.List(ctx); },
      [&](const Context& ctx, const std::string& t) {
        return world.Watch(ctx, t);
      },
      options);
  if (!source.Start().ok()) return state.SkipWithError("source start");
  if (!testing::AwaitCondition([&] {
        return world.stats().open_streams == 1 && seen_value.load() == 0;
      })) {
    return state.SkipWithError("the source never opened its stream");
  }
  std::vector<double> latencies;
  int64_t value = 0;
  for (auto _ : state) {
    latencies.clear();
    const auto began = SteadyClock::now();
    for (int i = 0; i < events; ++i) {
      ++value;
      const auto sent = SteadyClock::now();
      world.Set(Key(0), static_cast<int>(value));
      while (seen_value.load(std::memory_order_acquire) != value) {
        if (SteadyClock::now() - sent > std::chrono::seconds(10)) {
          return state.SkipWithError("an event never reached the store");
        }
        std::this_thread::yield();
      }
      const SteadyClock::time_point at(
          SteadyClock::duration(seen_at.load(std::memory_order_relaxed)));
      latencies.push_back(Micros(at - sent));
    }
    state.SetIterationTime(
        std::chrono::duration<double>(SteadyClock::now() - began).count());
  }
  std::sort(latencies.begin(), latencies.end());
  auto at = [&](double q) {
    return latencies[std::min(latencies.size() - 1,
                              static_cast<size_t>(q * latencies.size()))];
  };
  state.counters["p50_us"] = at(0.50);
  state.counters["p99_us"] = at(0.99);
  state.counters["max_us"] = latencies.back();
  state.SetItemsProcessed(state.iterations() * events);
  if (source.status().lists != 1) {
    return state.SkipWithError("the source listed again");
  }
  source.Stop();
  runner.Stop();
}

// --- BM_SharedPollFanout ---------------------------------------------------

void BM_SharedPollFanout(benchmark::State& state) {
  const int nodes = static_cast<int>(state.range(0));
  const bool shared = state.range(1) != 0;
  const int64_t keys = quick ? 1000 : 10'000;
  const absl::Duration interval = absl::Milliseconds(100);
  const int intervals = quick ? 5 : 20;
  const IntMap world = Keys(keys);
  std::atomic<int64_t> lists{0};
  std::atomic<int> in_sync{0};
  ControllerKind kind{
      .kind = "bench",
      .count = nodes,
      .build =
          [&](ControllerBuilder& b) {
            auto list = [&](const Context&) -> absl::StatusOr<IntMap> {
              ++lists;
              return world;
            };
            PollingSourceOptions<int> o{.interval = interval};
            Store<std::string, int>* store =
                shared ? b.SharedPoll<std::string, int>("seen", list, o)
                       : b.Poll<std::string, int>("seen", list, o);
            store->AddSyncObserver([&](bool now) { in_sync += now ? 1 : -1; });
            return absl::OkStatus();
          },
      .options = {.logger = testing::NullLogger()}};
  for (auto _ : state) {
    InMemoryNodeRegistry registry;
    NodeManager pod({.pod_id = "bench",
                     .kinds = {kind.ToNodeKind()},
                     .registry = &registry,
                     .poll_interval = absl::Milliseconds(50),
                     .lease = absl::Seconds(1),
                     .logger = testing::NullLogger()});
    in_sync = 0;
    if (!pod.Start().ok()) return state.SkipWithError("pod start");
    // Every node owns its range and its store holds it.
    if (!testing::AwaitCondition(
            [&] {
              int working = 0;
              for (const NodeState& n : pod.Nodes()) {
                working += n.active.range.Empty() ? 0 : 1;
              }
              return working == nodes && in_sync.load() == nodes;
            },
            absl::Seconds(30))) {
      return state.SkipWithError("the nodes never got in sync");
    }
    absl::SleepFor(interval);  // Lists of the handoffs are over.
    const int64_t before = lists.load();
    const auto began = SteadyClock::now();
    absl::SleepFor(intervals * interval);
    const int64_t made = lists.load() - before;
    const double took =
        std::chrono::duration<double>(SteadyClock::now() - began).count();
    state.SetIterationTime(took);
    // The interval runs from the end of a list: allow for the list's time.
    state.counters["lists_per_interval"] =
        static_cast<double>(made) / intervals;
    state.counters["nodes_in_sync"] = in_sync.load();
    pod.Stop();
    if (shared && made > intervals + 1) {
      return state.SkipWithError(
          "a shared source listed more than once per "
          "interval");
    }
  }
}

// --- BM_RelistAfterExpiry ----------------------------------------------------

void BM_RelistAfterExpiry(benchmark::State& state) {
  const int64_t items = state.range(0);
  const int64_t churn = items / 100;
  for (auto _ : state) {
    state.PauseTiming();
    testing::SimulatedClock clock;
    Runner runner(
        {.name = "bench", .clock = &clock, .logger = testing::NullLogger()});
    IntStore store({.name = "seen", .logger = testing::NullLogger()});
    World world;
    {
      std::vector<std::pair<std::string, int>> all;
      all.reserve(static_cast<size_t>(items));
      for (int64_t i = 0; i < items; ++i) all.emplace_back(Key(i), 0);
      world.SetMany(std::move(all));
    }
    int64_t deletes = 0, sets = 0;
    bool wrong_delete = false;
    store.Subscribe([&](const Change<std::string, int>& c) {
      if (c.kind == ChangeKind::kDelete) {
        ++deletes;
        // The deleted keys are the first `churn` ones.
        if (c.key >= Key(churn)) wrong_delete = true;
      } else if (c.kind == ChangeKind::kSet) {
        ++sets;
      }
    });
    SteadyClock::time_point list_returned{};
    SteadyClock::duration list_took{};
    WatchSourceOptions<int> options;
    options.name = "bench";
    options.clock = &clock;
    options.logger = testing::NullLogger();
    options.manual = true;
    WatchSource<std::string, int> source(
        &runner, &store,
        [&](const Context& ctx) {
          const auto began = SteadyClock::now();
          auto listed = world.List(ctx);
          list_returned = SteadyClock::now();
          list_took = list_returned - began;
          return listed;
        },
        [&](const Context& ctx, const std::string& t) {
          return world.Watch(ctx, t);
        },
        options);
    if (!source.Start().ok()) return state.SkipWithError("source start");
    source.RunUntilIdle();
    runner.RunUntilIdle();
    if (store.size() != static_cast<size_t>(items)) {
      return state.SkipWithError("the first list did not land");
    }
    deletes = sets = 0;
    {
      std::vector<std::pair<std::string, int>> changed;
      for (int64_t i = churn; i < 2 * churn; ++i)
        changed.emplace_back(Key(i), 1);
      for (int64_t i = items; i < items + churn; ++i) {
        changed.emplace_back(Key(i), 0);
      }
      world.SetMany(std::move(changed));
      for (int64_t i = 0; i < churn; ++i) world.Delete(Key(i));
    }
    world.Compact();
    world.ExpireStreams();
    state.ResumeTiming();
    source.RunUntilIdle();  // The stream expires; the source lists again.
    runner.RunUntilIdle();  // The store applies the diff.
    const auto applied = SteadyClock::now();
    state.SetIterationTime(
        std::chrono::duration<double>(applied - list_returned).count());
    state.counters["list_ms"] =
        std::chrono::duration<double, std::milli>(list_took).count();
    state.counters["deletes"] = static_cast<double>(deletes);
    state.counters["sets"] = static_cast<double>(sets);
    if (deletes != churn || wrong_delete || sets != 2 * churn ||
        store.size() != static_cast<size_t>(items) ||
        source.status().relists != 1) {
      return state.SkipWithError("the re-list's tombstones are not exact");
    }
    state.PauseTiming();
    source.Stop();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * items);
}

// --- BM_SourceThreads
// ---------------------------------------------------------

enum class SourceKind { kPoll, kWatch, kShared };

void BM_SourceThreads(benchmark::State& state, SourceKind kind) {
  const int count = 100;
  for (auto _ : state) {
    const int64_t base = bench::ProcessThreads();
    SourceExecutor executor({.name = "bench", .logger = testing::NullLogger()});
    if (!executor.Start().ok()) return state.SkipWithError("executor");
    Runner runner({.name = "bench", .logger = testing::NullLogger()});
    if (!runner.Start().ok()) return state.SkipWithError("runner");
    World world;
    world.SetMany({{Key(0), 0}});
    std::vector<std::unique_ptr<IntStore>> stores;
    std::vector<std::unique_ptr<PollingSource<std::string, int>>> polls;
    std::vector<std::unique_ptr<WatchSource<std::string, int>>> watches;
    std::unique_ptr<SharedSource<std::string, int>> shared;
    std::vector<std::unique_ptr<SharedSource<std::string, int>::Subscription>>
        subs;
    auto list = [&](const Context& ctx) { return world.List(ctx); };
    auto watch = [&](const Context& ctx, const std::string& t) {
      return world.Watch(ctx, t);
    };
    WatchSourceOptions<int> wo;
    wo.executor = &executor;
    wo.logger = testing::NullLogger();
    if (kind == SourceKind::kShared) {
      wo.clock = Clock::Real();
      shared = SharedSource<std::string, int>::Watch(list, watch, wo);
    }
    for (int i = 0; i < count; ++i) {
      stores.push_back(std::make_unique<IntStore>(
          StoreOptions<int>{.logger = testing::NullLogger()}));
      IntStore* store = stores.back().get();
      if (kind == SourceKind::kPoll) {
        polls.push_back(std::make_unique<PollingSource<std::string, int>>(
            &runner, store,
            [&](const Context& ctx) -> absl::StatusOr<IntMap> {
              auto l = world.List(ctx);
              if (!l.ok()) return l.status();
              return l->items;
            },
            PollingSourceOptions<int>{.interval = absl::Milliseconds(100),
                                      .executor = &executor,
                                      .logger = testing::NullLogger()}));
        if (!polls.back()->Start().ok()) return state.SkipWithError("poll");
      } else if (kind == SourceKind::kWatch) {
        watches.push_back(std::make_unique<WatchSource<std::string, int>>(
            &runner, store, list, watch, wo));
        if (!watches.back()->Start().ok()) return state.SkipWithError("watch");
      } else {
        subs.push_back(shared->Subscribe(&runner, store));
      }
    }
    if (shared != nullptr && !shared->Start().ok()) {
      return state.SkipWithError("shared");
    }
    absl::SleepFor(absl::Seconds(quick ? 1 : 2));  // Settle: idle threads go.
    state.counters["threads_held"] =
        static_cast<double>(bench::ProcessThreads() - base);
    state.counters["executor_threads"] =
        static_cast<double>(executor.stats().threads);
    state.SetIterationTime(1);
    for (auto& p : polls) p->Stop();
    for (auto& w : watches) w->Stop();
    subs.clear();
    if (shared != nullptr) shared->Stop();
    executor.Stop();
    runner.Stop();
  }
}

void RegisterAll() {
  benchmark::RegisterBenchmark("BM_WatchEventToStore", BM_WatchEventToStore)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
  for (int shared : {1, 0}) {
    benchmark::RegisterBenchmark("BM_SharedPollFanout", BM_SharedPollFanout)
        ->ArgNames({"nodes", "shared"})
        ->Args({10, shared})
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond)
        ->Iterations(1);
  }
  benchmark::RegisterBenchmark("BM_RelistAfterExpiry", BM_RelistAfterExpiry)
      ->ArgName("items")
      ->Arg(quick ? 10'000 : 100'000)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(quick ? 1 : 5);
  for (auto [name, kind] :
       {std::pair{"BM_SourceThreads/kind:poll", SourceKind::kPoll},
        std::pair{"BM_SourceThreads/kind:watch", SourceKind::kWatch},
        std::pair{"BM_SourceThreads/kind:shared", SourceKind::kShared}}) {
    benchmark::RegisterBenchmark(
        name, [kind = kind](benchmark::State& s) { BM_SourceThreads(s, kind); })
        ->UseManualTime()
        ->Iterations(1);
  }
}

}  // namespace
}  // namespace setpoint

int main(int argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      setpoint::quick = true;
    } else {
      args.push_back(argv[i]);
    }
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  setpoint::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
