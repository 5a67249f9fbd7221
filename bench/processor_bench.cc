// Benchmarks for the Processor's Runner: events per second from one and two
// producer threads through a started runner (also with busy threads taking
// the cores), and timers scheduled and fired (or cancelled).
//
//   build/release/bench/processor_bench --benchmark_repetitions=5
//
// Items processed are events executed (timers fired for BM_RunnerTimers).
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "benchmark/benchmark.h"
#include "setpoint/processor/runner.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "spdlog/logger.h"

namespace setpoint {
namespace {

// N producer threads each post kPerProducer events that bump a counter on
// the runner; an iteration ends when the runner has run them all.
// With metrics the runner publishes its series (and times 1 event in 64).
void RunPosts(benchmark::State& state, int producers, bool with_metrics) {
  constexpr int64_t kPerProducer = 1'000'000;
  MetricsRegistry metrics;
  Runner runner({.name = "bench",
                 .metrics = with_metrics ? &metrics : nullptr,
                 .logger = ::setpoint::testing::NullLogger()});
  if (!runner.Start().ok()) {
    state.SkipWithError("runner did not start");
    return;
  }
  int64_t executed = 0;
  for (auto _ : state) {
    std::atomic<int64_t> counter{0};
    const int64_t total = kPerProducer * producers;
    {
      std::vector<std::jthread> threads;
      for (int p = 0; p < producers; ++p) {
        threads.emplace_back([&] {
          for (int64_t i = 0; i < kPerProducer; ++i) {
            // Runner-only increment: the counter is read after the join.
            (void)runner.Post([&counter] {
              counter.store(counter.load(std::memory_order_relaxed) + 1,
                            std::memory_order_release);
            });
          }
        });
      }
    }
    while (counter.load(std::memory_order_acquire) < total) {
      std::this_thread::yield();
    }
    executed += total;
  }
  state.SetItemsProcessed(executed);
}

void BM_RunnerPost(benchmark::State& state) {
  RunPosts(state, static_cast<int>(state.range(0)), state.range(1) != 0);
}
BENCHMARK(BM_RunnerPost)
    ->ArgNames({"producers", "metrics"})
    ->Args({1, 0})
    ->Args({1, 1})
    ->Args({2, 0})
    ->Args({2, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// BM_RunnerPost on a machine with more runnable threads than cores: `busy`
// threads spin for the whole run (as other processes would; start them
// outside instead to load every process of the machine, see README.md).
// Shows whether the runner's waiting takes the producers' cores.
void BM_RunnerPostOversubscribed(benchmark::State& state) {
  std::atomic<bool> done{false};
  std::vector<std::jthread> busy;
  for (int64_t i = 0; i < state.range(1); ++i) {
    busy.emplace_back([&done] {
      uint64_t n = 0;
      while (!done.load(std::memory_order_relaxed))
        benchmark::DoNotOptimize(++n);
    });
  }
  RunPosts(state, static_cast<int>(state.range(0)), false);
  done = true;
}
BENCHMARK(BM_RunnerPostOversubscribed)
    ->ArgNames({"producers", "busy"})
    ->Args({2, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

constexpr int64_t kTimers = 1'000'000;

// Schedules 1M timers at spread-out times on `clock`, moves the clock past
// all of them and runs them (manual mode, one thread). Returns how many ran.
int64_t FireTimers(testing::SimulatedClock& clock, Runner& runner) {
  int64_t count = 0;
  for (int64_t i = 0; i < kTimers; ++i) {
    (void)runner.PostAfter(absl::Microseconds((i * 7919) % 1'000'000),
                           [&count] { ++count; });
  }
  clock.AdvanceTime(absl::Seconds(1));
  runner.RunUntilIdle();
  return count;
}

// 1M timers with a new runner per iteration (the first touch of its memory
// included).
void BM_RunnerTimers(benchmark::State& state) {
  int64_t fired = 0;
  for (auto _ : state) {
    testing::SimulatedClock clock;
    Runner runner({.name = "bench",
                   .clock = &clock,
                   .logger = ::setpoint::testing::NullLogger()});
    if (FireTimers(clock, runner) != kTimers) {
      state.SkipWithError("not every timer fired");
      break;
    }
    fired += kTimers;
  }
  state.SetItemsProcessed(fired);
}
BENCHMARK(BM_RunnerTimers)->Unit(benchmark::kMillisecond);

// The same on one runner for all iterations, as in a controller, where the
// runner lives as long as the process. Slower than a fresh runner: timer
// slots are reused in firing order, scattered over the table.
void BM_RunnerTimersLongLived(benchmark::State& state) {
  testing::SimulatedClock clock;
  Runner runner({.name = "bench",
                 .clock = &clock,
                 .logger = ::setpoint::testing::NullLogger()});
  int64_t fired = 0;
  for (auto _ : state) {
    if (FireTimers(clock, runner) != kTimers) {
      state.SkipWithError("not every timer fired");
      break;
    }
    fired += kTimers;
  }
  state.SetItemsProcessed(fired);
}
BENCHMARK(BM_RunnerTimersLongLived)->Unit(benchmark::kMillisecond);

// Schedules 1M timers and cancels them all through their handles (manual
// mode): timeouts that are cancelled because the awaited thing came first.
// Items are timers scheduled and cancelled.
void BM_RunnerTimersCancelled(benchmark::State& state) {
  int64_t cancelled = 0;
  for (auto _ : state) {
    testing::SimulatedClock clock;
    Runner runner({.name = "bench",
                   .clock = &clock,
                   .logger = ::setpoint::testing::NullLogger()});
    std::vector<TimerHandle> handles;
    handles.reserve(kTimers);
    for (int64_t i = 0; i < kTimers; ++i) {
      handles.push_back(
          *runner.PostAfter(absl::Microseconds((i * 7919) % 1'000'000), [] {}));
    }
    for (TimerHandle& h : handles) cancelled += h.Cancel() ? 1 : 0;
    clock.AdvanceTime(absl::Seconds(1));
    if (runner.RunUntilIdle() != 0) {
      state.SkipWithError("a cancelled timer fired");
      break;
    }
  }
  state.SetItemsProcessed(cancelled);
}
BENCHMARK(BM_RunnerTimersCancelled)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace setpoint

BENCHMARK_MAIN();
