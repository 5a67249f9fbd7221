// A benchmark shaped like a real API that takes batches and allows one
// writer at a time (a DNS server's record API on a single-writer database):
// 2,000 keys across 12 nodes (3 pods of 4), converged from an empty world
// once with a per-key SyncerClient and once with a BatchSyncerClient.
//
//   build/release/bench/single_writer_bench
//
// The fake API (SingleWriterApi): every request costs 2 ms plus 20 us per
// change and is served one at a time; a request that arrives while another
// runs fails at once with a 500 (kInternal) half of the time, else waits
// its turn. Each pod shares one UpdaterPool of 8 threads among its 4 nodes'
// syncers (the pod's default); the syncers use their defaults otherwise
// (per-key: max_in_flight 64; batch: max_batch 100, one batch in flight).
//
// Timed (manual): from the first SetDesired to the moment the API's world
// holds every desired value. Counters: `calls_per_key` (every request the
// API got, failed ones included, over 2,000) and `refused` (requests that
// got a 500). Targets (bench/README.md): batched at least 10x faster than
// per-key, and at most 0.3 calls per key.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "setpoint/base/mutex.h"
#include "setpoint/node/shard.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/processor/updater_pool.h"
#include "setpoint/testing/null_logger.h"

namespace setpoint {
namespace {

using SteadyClock = std::chrono::steady_clock;

constexpr int kKeys = 2000;
constexpr int kPods = 3;
constexpr int kNodesPerPod = 4;
constexpr int kNodes = kPods * kNodesPerPod;

struct Change {
  const std::string* key;
  std::optional<int> value;  // nullopt: delete.
};

class SingleWriterApi {
 public:
  // Hears every change that was applied.
  using Watcher = std::function<void(const std::string&, std::optional<int>)>;
  explicit SingleWriterApi(Watcher watcher) : watcher_(std::move(watcher)) {}

  absl::Status Request(std::span<const Change> changes) {
    requests_.fetch_add(1, std::memory_order_relaxed);
    {
      MutexLock l(&mu_);
      if (busy_) {
        std::bernoulli_distribution refuse(0.5);
        if (refuse(rng_)) {
          refused_.fetch_add(1, std::memory_order_relaxed);
          return absl::InternalError(
              "500 internal server error: database "
              "is locked");
        }
        cv_.Wait(&mu_, std::stop_token(),
                 [this]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; });
      }
      busy_ = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2) +
                                std::chrono::microseconds(20) *
                                    static_cast<int64_t>(changes.size()));
    {
      MutexLock l(&mu_);
      for (const Change& c : changes) {
        if (c.value.has_value()) {
          world_[*c.key] = *c.value;
        } else {
          world_.erase(*c.key);
        }
      }
      busy_ = false;
      cv_.Signal();
    }
    for (const Change& c : changes) watcher_(*c.key, c.value);
    return absl::OkStatus();
  }

  bool Holds(const absl::flat_hash_map<std::string, int>& want) const {
    MutexLock l(&mu_);
    return world_ == want;
  }
  int64_t requests() const { return requests_.load(); }
  int64_t refused() const { return refused_.load(); }

 private:
  const Watcher watcher_;
  mutable Mutex mu_;
  CondVar cv_;
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_){7};
  absl::flat_hash_map<std::string, int> world_ ABSL_GUARDED_BY(mu_);
  std::atomic<int64_t> requests_{0};
  std::atomic<int64_t> refused_{0};
};

using IntSyncer = Syncer<std::string, int, int>;

class PerKeyClient final : public SyncerClient<std::string, int, int> {
 public:
  explicit PerKeyClient(SingleWriterApi* api) : api_(api) {}
  absl::Status Create(const Context&, const std::string& key,
                      const int& v) override {
    const Change c{&key, v};
    return api_->Request({&c, 1});
  }
  absl::Status Update(const Context&, const std::string& key, const int& v,
                      const int&) override {
    const Change c{&key, v};
    return api_->Request({&c, 1});
  }
  absl::Status Delete(const Context&, const std::string& key,
                      const int&) override {
    const Change c{&key, std::nullopt};
    return api_->Request({&c, 1});
  }

 private:
  SingleWriterApi* const api_;
};

class BatchClient final : public BatchSyncerClient<std::string, int, int> {
 public:
  explicit BatchClient(SingleWriterApi* api) : api_(api) {}
  absl::Status Apply(
      const Context&,
      std::span<SyncOperation<std::string, int, int>> ops) override {
    std::vector<Change> changes;
    changes.reserve(ops.size());
    for (const auto& op : ops) {
      changes.push_back(Change{op.key, op.op == SyncOp::kDelete
                                           ? std::nullopt
                                           : std::optional<int>(*op.desired)});
    }
    return api_->Request(changes);  // One PATCH; a 500 fails all of it.
  }

 private:
  SingleWriterApi* const api_;
};

struct Node {
  Node(int i, UpdaterPool* pool, IntSyncer::Client* client,
       IntSyncer::BatchClient* batch)
      : runner({.name = absl::StrFormat("node-%d", i),
                .logger = testing::NullLogger()}) {
    IntSyncer::Options o{.name = absl::StrFormat("node-%d", i),
                         .pool = pool,
                         .logger = testing::NullLogger()};
    syncer = batch != nullptr
                 ? std::make_unique<IntSyncer>(&runner, batch, std::move(o))
                 : std::make_unique<IntSyncer>(&runner, client, std::move(o));
    syncer->MarkDesiredComplete();
  }
  Runner runner;
  std::unique_ptr<IntSyncer> syncer;
};

void Converge(benchmark::State& state, bool batched) {
  std::vector<std::string> keys;
  absl::flat_hash_map<std::string, int> want;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(absl::StrFormat("rec-%04d.example.org.", i));
    want[keys.back()] = i;
  }
  double calls = 0, refused = 0;
  for (auto _ : state) {
    std::vector<std::unique_ptr<Node>> nodes;
    auto node_of = [](const std::string& key) {
      return static_cast<int>(ShardOf(key) % kNodes);
    };
    SingleWriterApi api([&](const std::string& key, std::optional<int> v) {
      Node* n = nodes[node_of(key)].get();
      (void)n->runner.Post([n, key, v] {
        if (v.has_value()) {
          n->syncer->SetObserved(key, *v);
        } else {
          n->syncer->DeleteObserved(key);
        }
      });
    });
    PerKeyClient per_key(&api);
    BatchClient batch(&api);
    std::vector<std::unique_ptr<UpdaterPool>> pools;
    for (int p = 0; p < kPods; ++p) {
      pools.push_back(std::make_unique<UpdaterPool>(UpdaterPoolOptions{
          .name = "pod", .threads = 8, .logger = testing::NullLogger()}));
      (void)pools.back()->Start();
    }
    for (int i = 0; i < kNodes; ++i) {
      nodes.push_back(std::make_unique<Node>(i, pools[i / kNodesPerPod].get(),
                                             &per_key,
                                             batched ? &batch : nullptr));
      (void)nodes.back()->syncer->Start();
      (void)nodes.back()->runner.Start();
    }
    const SteadyClock::time_point t0 = SteadyClock::now();
    for (int i = 0; i < kNodes; ++i) {
      Node* n = nodes[i].get();
      (void)n->runner.Post([&, n, i] {
        for (int k = 0; k < kKeys; ++k) {
          if (node_of(keys[k]) == i) n->syncer->SetDesired(keys[k], k);
        }
      });
    }
    const SteadyClock::time_point deadline = t0 + std::chrono::minutes(5);
    while (!api.Holds(want) && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const double took =
        std::chrono::duration<double>(SteadyClock::now() - t0).count();
    if (!api.Holds(want)) {
      state.SkipWithError("the world did not converge in 5 minutes");
      break;
    }
    state.SetIterationTime(took);
    calls += static_cast<double>(api.requests());
    refused += static_cast<double>(api.refused());
    for (auto& n : nodes) n->syncer->Stop();
    for (auto& n : nodes) n->runner.Stop();
    for (auto& p : pools) p->Stop();
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["calls_per_key"] = calls / n / kKeys;
  state.counters["refused"] = refused / n;
}

void BM_SingleWriterPerKey(benchmark::State& state) { Converge(state, false); }
void BM_SingleWriterBatched(benchmark::State& state) { Converge(state, true); }
BENCHMARK(BM_SingleWriterPerKey)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SingleWriterBatched)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace setpoint

BENCHMARK_MAIN();
