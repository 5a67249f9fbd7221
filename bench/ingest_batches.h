// RunIngestBatches: the ingest loop shared by syncer_bench and
// controller_bench. It posts `updates / batch` runner events one after the
// other (each posts the next when it ends, so whatever the syncer posted
// meanwhile, its pump and results, runs in between) and times the batches.
//
// Thread safety: call from the benchmark's thread with a started runner.
#ifndef SETPOINT_BENCH_INGEST_BATCHES_H_
#define SETPOINT_BENCH_INGEST_BATCHES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/time/time.h"
#include "setpoint/processor/runner.h"
#include "setpoint/testing/await.h"

namespace setpoint::bench {

struct IngestTiming {
  std::chrono::steady_clock::duration ingest{};           // Sum of the batches.
  std::chrono::steady_clock::time_point first{}, last{};  // Span.
  std::vector<std::chrono::steady_clock::duration> batches;  // Each one.
};

// Calls `set(j)` for j in [0, updates) on the runner, `batch` per event.
// Returns false if the batches did not all run within 30 s.
template <class Set>
bool RunIngestBatches(Runner& runner, int64_t updates, int64_t batch, Set set,
                      IngestTiming* out) {
  using Clock = std::chrono::steady_clock;
  const int64_t count = updates / batch;
  *out = IngestTiming{};
  out->batches.reserve(static_cast<size_t>(count));
  // `out` is written on the runner only; read after the last batch
  // published it (release/acquire on `done`).
  std::atomic<int64_t> done{0};
  std::function<void(int64_t)> post = [&](int64_t b) {
    (void)runner.Post(
        [&, b] {
          Clock::time_point t0 = Clock::now();
          if (b == 0) out->first = t0;
          for (int64_t j = b * batch; j < (b + 1) * batch; ++j) set(j);
          Clock::time_point t1 = Clock::now();
          out->ingest += t1 - t0;
          out->last = t1;
          out->batches.push_back(t1 - t0);
          if (b + 1 < count) post(b + 1);
          done.fetch_add(1, std::memory_order_release);
        },
        "bench ingest");
  };
  post(0);
  return testing::AwaitCondition(
      [&] { return done.load(std::memory_order_acquire) == count; },
      absl::Seconds(30));
}

}  // namespace setpoint::bench

#endif  // SETPOINT_BENCH_INGEST_BATCHES_H_
