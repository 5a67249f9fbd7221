// Benchmarks for the Planner's Scheduler: how many procedures per second it
// runs in a flat list, a deep chain and a wide tree, and how long one pass of
// a small reconcile plan takes once the world has drifted a little.
//
//   # Build in Release (commands in bench/README.md), then:
//   build/bench/bench/planner_bench --benchmark_repetitions=5
//
// The names of the benchmarks are stable so results can be compared over
// time (bench/README.md keeps the last figures and the targets). Every
// benchmark sets items processed to the procedures executed, except the
// reconcile ones, where an item is one pass (or one Create call).
//
// What users pay is what is measured: the default SchedulerOptions (so the
// first 10,000 steps are recorded and timed on the real clock), the one info
// line per execution formatted by a logger at level info that has no sinks
// (so nothing is written), and the ExecutionReport destroyed in the loop.
// Each benchmark runs on one thread.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "setpoint/base/context.h"
#include "setpoint/planner/execution_report.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/procedure.h"
#include "setpoint/planner/scheduler.h"
#include "spdlog/logger.h"

namespace setpoint {
namespace {

// A logger at spdlog's default level (info) with no sinks: the Scheduler's
// info line per execution is still built and formatted, but goes nowhere.
std::shared_ptr<spdlog::logger> SilentLogger() {
  static auto* const logger = new std::shared_ptr<spdlog::logger>(
      std::make_shared<spdlog::logger>("bench"));
  return *logger;
}

// The default options but for the logger.
Scheduler MakeScheduler() {
  SchedulerOptions options;
  options.logger = SilentLogger();
  return Scheduler(std::move(options));
}

// Marks the benchmark failed unless `report` converged after `steps` steps.
bool CheckReport(benchmark::State& state, const ExecutionReport& report,
                 int64_t steps) {
  if (report.status.ok() && report.steps_run == steps) return true;
  state.SkipWithError(absl::StrCat("unexpected report: ", report.Summary(),
                                   " want steps=", steps)
                          .c_str());
  return false;
}

// ---- Flat, chain and tree ---------------------------------------------------

// A procedure that does nothing and returns nothing.
class Noop final : public Procedure {
 public:
  Noop() : Procedure("noop") {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    return Procedures{};
  }
};

// Create returns `n` Noops once, then nothing. Building the list is part of
// what is measured: it is what a plan does.
class FlatPlan final : public Plan {
 public:
  explicit FlatPlan(int64_t n) : n_(n) {}
  std::string Name() const override { return "flat"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    Procedures todo;
    if (created_) return todo;
    created_ = true;
    todo.reserve(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) todo.push_back(std::make_unique<Noop>());
    return todo;
  }

 private:
  const int64_t n_;
  bool created_ = false;
};

void BM_SchedulerFlat(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Scheduler scheduler = MakeScheduler();
  const Context ctx = Context::Background();
  int64_t steps = 0;
  for (auto _ : state) {
    FlatPlan plan(n);
    ExecutionReport report = scheduler.Execute(ctx, plan);
    if (!CheckReport(state, report, n)) break;
    steps += report.steps_run;
  }
  state.SetItemsProcessed(steps);
}
BENCHMARK(BM_SchedulerFlat)->Arg(100'000)->Unit(benchmark::kMillisecond);

// A link of a chain: its Do returns the next link until `remaining` is 1.
class ChainLink final : public Procedure {
 public:
  explicit ChainLink(int64_t remaining)
      : Procedure("link"), remaining_(remaining) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    if (remaining_ <= 1) return Procedures{};
    return ProcedureList(std::make_unique<ChainLink>(remaining_ - 1));
  }

 private:
  const int64_t remaining_;
};

// Create returns the first link of a chain of `length` once, then nothing.
class ChainPlan final : public Plan {
 public:
  explicit ChainPlan(int64_t length) : length_(length) {}
  std::string Name() const override { return "chain"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    if (created_) return Procedures{};
    created_ = true;
    return ProcedureList(std::make_unique<ChainLink>(length_));
  }

 private:
  const int64_t length_;
  bool created_ = false;
};

void BM_SchedulerChain(benchmark::State& state) {
  const int64_t length = state.range(0);
  const Scheduler scheduler = MakeScheduler();
  const Context ctx = Context::Background();
  int64_t steps = 0;
  for (auto _ : state) {
    ChainPlan plan(length);
    ExecutionReport report = scheduler.Execute(ctx, plan);
    if (!CheckReport(state, report, length)) break;
    steps += report.steps_run;
  }
  state.SetItemsProcessed(steps);
}
BENCHMARK(BM_SchedulerChain)
    ->Arg(100'000)
    ->Arg(10'000'000)
    ->Unit(benchmark::kMillisecond);

constexpr int kTreeDepth = 4;
constexpr int kTreeFanout = 20;

// A node of a tree: its Do returns kTreeFanout children until kTreeDepth.
class TreeNode final : public Procedure {
 public:
  explicit TreeNode(int level) : Procedure("node"), level_(level) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    return Level(level_ + 1);
  }

  // kTreeFanout nodes at `level` (1-based), or none past kTreeDepth.
  static Procedures Level(int level) {
    Procedures nodes;
    if (level > kTreeDepth) return nodes;
    nodes.reserve(kTreeFanout);
    for (int i = 0; i < kTreeFanout; ++i) {
      nodes.push_back(std::make_unique<TreeNode>(level));
    }
    return nodes;
  }

 private:
  const int level_;
};

// Create returns the first level of the tree once, then nothing.
class TreePlan final : public Plan {
 public:
  std::string Name() const override { return "tree"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    if (created_) return Procedures{};
    created_ = true;
    return TreeNode::Level(1);
  }

 private:
  bool created_ = false;
};

// 20 + 400 + 8,000 + 160,000.
constexpr int64_t TreeSize() {
  int64_t total = 0;
  int64_t level = 1;
  for (int i = 0; i < kTreeDepth; ++i) total += (level *= kTreeFanout);
  return total;
}
static_assert(TreeSize() == 168'420);

void BM_SchedulerTree(benchmark::State& state) {
  const Scheduler scheduler = MakeScheduler();
  const Context ctx = Context::Background();
  int64_t steps = 0;
  for (auto _ : state) {
    TreePlan plan;
    ExecutionReport report = scheduler.Execute(ctx, plan);
    if (!CheckReport(state, report, TreeSize())) break;
    steps += report.steps_run;
  }
  state.SetItemsProcessed(steps);
}
BENCHMARK(BM_SchedulerTree)->Unit(benchmark::kMillisecond);

// ---- Reconcile steady state -------------------------------------------------

constexpr int kResources = 1'000;
constexpr int kDriftPerPass = 10;

// What a resource should look like (desired) or does look like (observed).
struct ResourceSpec {
  std::string image;
  int32_t replicas = 0;

  friend bool operator==(const ResourceSpec&, const ResourceSpec&) = default;
};

// The world as a controller keeps it: the desired state sorted by name (so
// plans come out in a stable order) and its cache of the observed state in a
// hash map keyed by name.
struct Fleet {
  std::map<std::string, ResourceSpec> desired;
  absl::flat_hash_map<std::string, ResourceSpec> observed;
  // For the drift only; the plan never reads it.
  std::vector<std::string> names;

  Fleet() {
    for (int i = 0; i < kResources; ++i) {
      std::string name = absl::StrFormat("resource-%04d", i);
      ResourceSpec spec{.image = "registry.local/app:1.4.2",
                        .replicas = 1 + i % 5};
      desired.emplace(name, spec);
      observed.emplace(name, spec);
      names.push_back(std::move(name));
    }
  }

  // Deletes `n` distinct observed resources picked by `rng` (the world drifts).
  void Drift(std::mt19937_64& rng, int n) {
    std::uniform_int_distribution<size_t> pick(0, names.size() - 1);
    for (int removed = 0; removed < n;) {
      removed += static_cast<int>(observed.erase(names[pick(rng)]));
    }
  }
};

// Puts one resource back the way it should be.
class CreateResource final : public Procedure {
 public:
  CreateResource(Fleet* fleet, const std::string& name,
                 const ResourceSpec& spec)
      : Procedure(absl::StrCat("create ", name)),
        fleet_(fleet),
        name_(name),
        spec_(spec) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    fleet_->observed.insert_or_assign(name_, spec_);
    return Procedures{};
  }

 private:
  Fleet* const fleet_;
  const std::string name_;
  const ResourceSpec spec_;
};

// Brings an observed resource back to its desired spec.
class UpdateResource final : public Procedure {
 public:
  UpdateResource(Fleet* fleet, const std::string& name,
                 const ResourceSpec& spec)
      : Procedure(absl::StrCat("update ", name)),
        fleet_(fleet),
        name_(name),
        spec_(spec) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    fleet_->observed[name_] = spec_;
    return Procedures{};
  }

 private:
  Fleet* const fleet_;
  const std::string name_;
  const ResourceSpec spec_;
};

// Compares every desired resource with the observed one: creates the missing,
// updates the different. (Deleting extras is left out: none appear here.)
class ReconcilePlan final : public Plan {
 public:
  // When `create_time` is not null, the time spent in Create is added to it
  // (two steady_clock reads per call).
  explicit ReconcilePlan(Fleet* fleet,
                         std::chrono::nanoseconds* create_time = nullptr)
      : fleet_(fleet), create_time_(create_time) {}
  std::string Name() const override { return "reconcile"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    if (create_time_ == nullptr) return Diff();
    auto start = std::chrono::steady_clock::now();
    Procedures todo = Diff();
    *create_time_ += std::chrono::steady_clock::now() - start;
    return todo;
  }

 private:
  Procedures Diff() const {
    Procedures todo;
    for (const auto& [name, spec] : fleet_->desired) {
      auto it = fleet_->observed.find(name);
      if (it == fleet_->observed.end()) {
        todo.push_back(std::make_unique<CreateResource>(fleet_, name, spec));
      } else if (it->second != spec) {
        todo.push_back(std::make_unique<UpdateResource>(fleet_, name, spec));
      }
    }
    return todo;
  }

  Fleet* const fleet_;
  std::chrono::nanoseconds* const create_time_;
};

// One pass: the world lost kDriftPerPass resources (not timed); Execute runs
// Create (10 missing), the 10 procedures, Create again (converged). Timed by
// hand around Execute and the report's destruction. Counters split the pass:
// create_us is the time inside the two Create calls, other_us the rest (the
// Scheduler's own work, the 10 Do calls, the report).
void BM_ReconcileSteadyState(benchmark::State& state) {
  Fleet fleet;
  std::chrono::nanoseconds create_time{0};
  ReconcilePlan plan(&fleet, &create_time);
  const Scheduler scheduler = MakeScheduler();
  const Context ctx = Context::Background();
  std::mt19937_64 rng(42);
  std::chrono::nanoseconds pass_time{0};
  for (auto _ : state) {
    fleet.Drift(rng, kDriftPerPass);
    auto start = std::chrono::steady_clock::now();
    bool ok;
    {
      ExecutionReport report = scheduler.Execute(ctx, plan);
      ok = CheckReport(state, report, kDriftPerPass);
    }
    auto end = std::chrono::steady_clock::now();
    pass_time += end - start;
    state.SetIterationTime(std::chrono::duration<double>(end - start).count());
    if (!ok) break;
    if (fleet.observed.size() != kResources) {
      state.SkipWithError("pass did not restore every resource");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  auto micros = [](std::chrono::nanoseconds d) {
    return std::chrono::duration<double, std::micro>(d).count();
  };
  state.counters["create_us"] = benchmark::Counter(
      micros(create_time), benchmark::Counter::kAvgIterations);
  state.counters["other_us"] = benchmark::Counter(
      micros(pass_time - create_time), benchmark::Counter::kAvgIterations);
}
BENCHMARK(BM_ReconcileSteadyState)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// The plan's own share of a pass: one Create scan with kDriftPerPass missing
// (arg 1) or with none missing (arg 0), without the Scheduler. Items are scans.
void BM_ReconcileCreateScan(benchmark::State& state) {
  Fleet fleet;
  std::mt19937_64 rng(42);
  const int missing = state.range(0) != 0 ? kDriftPerPass : 0;
  fleet.Drift(rng, missing);
  ReconcilePlan plan(&fleet);
  const Context ctx = Context::Background();
  for (auto _ : state) {
    absl::StatusOr<Procedures> todo = plan.Create(ctx);
    if (!todo.ok() || static_cast<int>(todo->size()) != missing) {
      state.SkipWithError("unexpected plan");
      break;
    }
    benchmark::DoNotOptimize(todo);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_ReconcileCreateScan)
    ->ArgName("missing")
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace setpoint

BENCHMARK_MAIN();
