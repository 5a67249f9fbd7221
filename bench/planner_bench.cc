// Benchmarks for the Planner's Scheduler: how many procedures per second it
// runs in a flat list, a deep chain and a wide tree, and how long one pass of
// a small reconcile plan takes once the world has drifted a little.
//
//   # Build in Release (commands in bench/README.md), then:
//   build/bench/bench/planner_bench --benchmark_repetitions=5
//
// The names of the benchmarks are stable so results can be compared over
// time (bench/README.md keeps the last figures and the targets). Every
// benchmark sets items processed to the procedures executed (made and
// destroyed, for the BM_ProcedureAllocation ones), except the reconcile ones,
// where an item is one pass (or one Create call).
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
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "setpoint/base/context.h"
#include "setpoint/planner/execution_report.h"
#include "setpoint/planner/plan.h"
#include "setpoint/planner/procedure.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/testing/null_logger.h"
#include "spdlog/logger.h"

namespace setpoint {
namespace {

// The default options but for the logger: at level info with no sinks, so the
// Scheduler's info line per execution is still built and formatted, but goes
// nowhere.
Scheduler MakeScheduler() {
  SchedulerOptions options;
  options.logger = ::setpoint::testing::NullLogger();
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

// `n` Noops made and destroyed outside any execution, so from the heap (one
// new and one delete each, plus the list). Inside an execution they come from
// its arena instead: BM_ProcedureAllocationInExecution.
void BM_ProcedureAllocation(benchmark::State& state) {
  const int64_t n = state.range(0);
  for (auto _ : state) {
    Procedures todo;
    todo.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) todo.push_back(std::make_unique<Noop>());
    benchmark::DoNotOptimize(todo.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ProcedureAllocation)->Arg(100'000)->Unit(benchmark::kMillisecond);

// The floor under BM_SchedulerFlat: the same `n` Noops made and destroyed by
// a Create, so from the execution's arena, in an Execute that then converges
// with no step run. Compare with BM_SchedulerFlat to see the Scheduler's own
// share.
class MakeAndDropPlan final : public Plan {
 public:
  explicit MakeAndDropPlan(int64_t n) : n_(n) {}
  std::string Name() const override { return "make and drop"; }
  absl::StatusOr<Procedures> Create(const Context&) override {
    Procedures todo;
    todo.reserve(static_cast<size_t>(n_));
    for (int64_t i = 0; i < n_; ++i) todo.push_back(std::make_unique<Noop>());
    benchmark::DoNotOptimize(todo.data());
    return Procedures{};
  }

 private:
  const int64_t n_;
};

void BM_ProcedureAllocationInExecution(benchmark::State& state) {
  const int64_t n = state.range(0);
  const Scheduler scheduler = MakeScheduler();
  const Context ctx = Context::Background();
  for (auto _ : state) {
    MakeAndDropPlan plan(n);
    ExecutionReport report = scheduler.Execute(ctx, plan);
    if (!CheckReport(state, report, 0)) break;
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_ProcedureAllocationInExecution)
    ->Arg(100'000)
    ->Unit(benchmark::kMillisecond);

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
//
// One pass of a controller that keeps kResources in-memory resources as they
// should be, after the world drifted a little (kDriftPerPass of them are gone),
// with the plan's state kept in one of two stores:
//
// - Joined (BM_ReconcileSteadyState, BM_ReconcileCreateScanJoined): desired
//   and observed state side by side in one entry per resource name, drift
//   detected by comparing generation numbers, the way Kubernetes compares
//   metadata.generation with status.observedGeneration, and the way
//   setpoint's coming Syncer is to hold desired and observed state in maps
//   keyed by resource id.
// - Two maps (BM_ReconcileSteadyStateTwoMaps, BM_ReconcileCreateScanTwoMaps):
//   the desired state in a std::map, the observed state in a separate hash
//   map, specs compared by value. The naive store, kept so its cost stays
//   visible.

constexpr int kResources = 1'000;
constexpr int kDriftPerPass = 10;

// What a resource should look like (desired) or does look like (observed).
struct ResourceSpec {
  std::string image;
  int32_t replicas = 0;

  friend bool operator==(const ResourceSpec&, const ResourceSpec&) = default;
};

std::string ResourceName(int i) { return absl::StrFormat("resource-%04d", i); }

// The image is longer than std::string's inline buffer, as real ones are, so
// copying a spec allocates.
ResourceSpec ResourceSpecFor(int i) {
  return ResourceSpec{.image = "registry.local/app:1.4.2",
                      .replicas = 1 + i % 5};
}

// A plan whose Create calls Diff(). When `create_time` is not null, the time
// spent in Create is added to it (two steady_clock reads per call).
class TimedPlan : public Plan {
 public:
  explicit TimedPlan(std::chrono::nanoseconds* create_time)
      : create_time_(create_time) {}
  std::string Name() const final { return "reconcile"; }
  absl::StatusOr<Procedures> Create(const Context&) final {
    if (create_time_ == nullptr) return Diff();
    auto start = std::chrono::steady_clock::now();
    Procedures todo = Diff();
    *create_time_ += std::chrono::steady_clock::now() - start;
    return todo;
  }

 protected:
  virtual Procedures Diff() const = 0;

 private:
  std::chrono::nanoseconds* const create_time_;
};

// ---- The joined store

// One resource as the controller knows it.
struct Resource {
  // What it was last seen as (or last written as, by a procedure), with the
  // generation of the desired state that this reflects
  // (status.observedGeneration).
  struct Observed {
    ResourceSpec spec;
    int64_t generation = 0;
  };

  std::string name;
  // What it should look like, and the generation of that intent, bumped
  // whenever `desired` changes (metadata.generation).
  ResourceSpec desired;
  int64_t generation = 1;
  // Empty while the resource does not exist.
  std::optional<Observed> observed;
};

// Desired and observed state side by side, one entry per resource: the
// entries in a vector, in the order they were added, and a hash index from
// name to position. Why not the simpler layouts:
// - an absl::flat_hash_map<std::string, Resource>: the scan, which every pass
//   pays for every resource, walks 2,047 slots for these 1,000 entries and
//   tests control bytes at each step; with Debian's abseil 20220623 that took
//   about 3.3 us, against about 1 us for the vector;
// - a vector sorted by name: as fast to scan, but every lookup by name (each
//   watch event, each procedure writing back) is a binary search costing
//   about 100 ns here, against about 10 ns for the hash index.
// This store gives both: a contiguous scan, lookups, additions and (by
// moving the last entry into the hole) removals in O(1), and a plan order
// that does not depend on hashing (abseil seeds its hash per process).
class JoinedStore {
 public:
  JoinedStore() {
    for (int i = 0; i < kResources; ++i) {
      Resource resource;
      resource.name = ResourceName(i);
      resource.desired = ResourceSpecFor(i);
      resource.observed = Resource::Observed{.spec = resource.desired,
                                             .generation = resource.generation};
      Add(std::move(resource));
    }
  }

  const std::vector<Resource>& resources() const { return resources_; }

  // The resource called `name`, or null.
  Resource* Find(const std::string& name) {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &resources_[it->second];
  }

  // `n` distinct resources picked by `rng` lose their observed state: they
  // were deleted behind the controller's back (the world drifts).
  void Drift(std::mt19937_64& rng, int n) {
    std::uniform_int_distribution<size_t> pick(0, resources_.size() - 1);
    drifted_.clear();
    while (static_cast<int>(drifted_.size()) < n) {
      const size_t i = pick(rng);
      if (!resources_[i].observed.has_value()) continue;
      resources_[i].observed.reset();
      drifted_.push_back(i);
    }
  }

  // Whether the resources lost by the last Drift are back as desired.
  bool Converged() const {
    return std::all_of(drifted_.begin(), drifted_.end(), [this](size_t i) {
      const Resource& resource = resources_[i];
      return resource.observed.has_value() &&
             resource.observed->generation == resource.generation &&
             resource.observed->spec == resource.desired;
    });
  }

 private:
  void Add(Resource resource) {
    index_.emplace(resource.name, resources_.size());
    resources_.push_back(std::move(resource));
  }

  std::vector<Resource> resources_;
  absl::flat_hash_map<std::string, size_t> index_;
  // For Drift and Converged only; the plan never reads it.
  std::vector<size_t> drifted_;
};

// Creates or updates one resource as Create saw it desired, then records
// what it wrote as the observed state, with the generation it reflects. If
// the intent changes before Do runs, the observed generation stays behind and
// the next Create updates the resource again.
class ApplyResource final : public Procedure {
 public:
  ApplyResource(JoinedStore* store, const char* verb, const Resource& resource)
      : Procedure(absl::StrCat(verb, " ", resource.name)),
        store_(store),
        name_(resource.name),
        spec_(resource.desired),
        generation_(resource.generation) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    // By name, not by a pointer kept from Create: the store may have changed.
    Resource* resource = store_->Find(name_);
    if (resource == nullptr) {
      return absl::NotFoundError(absl::StrCat(name_, " is no longer desired"));
    }
    resource->observed =
        Resource::Observed{.spec = spec_, .generation = generation_};
    return Procedures{};
  }

 private:
  JoinedStore* const store_;
  const std::string name_;
  const ResourceSpec spec_;
  const int64_t generation_;
};

// One walk over the store: creates the resources not observed, updates those
// whose observed generation is behind. (Deleting extras is left out: none
// appear here.)
class JoinedReconcilePlan final : public TimedPlan {
 public:
  explicit JoinedReconcilePlan(JoinedStore* store,
                               std::chrono::nanoseconds* create_time = nullptr)
      : TimedPlan(create_time), store_(store) {}

 private:
  Procedures Diff() const override {
    Procedures todo;
    for (const Resource& resource : store_->resources()) {
      if (!resource.observed.has_value()) {
        todo.push_back(
            std::make_unique<ApplyResource>(store_, "create", resource));
      } else if (resource.observed->generation < resource.generation) {
        todo.push_back(
            std::make_unique<ApplyResource>(store_, "update", resource));
      }
    }
    return todo;
  }

  JoinedStore* const store_;
};

// ---- The two maps

// The desired state sorted by name (so plans come out in a stable order) and
// a cache of the observed state in a hash map keyed by name.
struct TwoMapStore {
  std::map<std::string, ResourceSpec> desired;
  absl::flat_hash_map<std::string, ResourceSpec> observed;
  // For Drift only; the plan never reads it.
  std::vector<std::string> names;

  TwoMapStore() {
    for (int i = 0; i < kResources; ++i) {
      std::string name = ResourceName(i);
      desired.emplace(name, ResourceSpecFor(i));
      observed.emplace(name, ResourceSpecFor(i));
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

  bool Converged() const {
    return static_cast<int>(observed.size()) == kResources;
  }
};

// Puts one resource back the way it should be.
class TwoMapCreateResource final : public Procedure {
 public:
  TwoMapCreateResource(TwoMapStore* store, const std::string& name,
                       const ResourceSpec& spec)
      : Procedure(absl::StrCat("create ", name)),
        store_(store),
        name_(name),
        spec_(spec) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    store_->observed.insert_or_assign(name_, spec_);
    return Procedures{};
  }

 private:
  TwoMapStore* const store_;
  const std::string name_;
  const ResourceSpec spec_;
};

// Brings an observed resource back to its desired spec.
class TwoMapUpdateResource final : public Procedure {
 public:
  TwoMapUpdateResource(TwoMapStore* store, const std::string& name,
                       const ResourceSpec& spec)
      : Procedure(absl::StrCat("update ", name)),
        store_(store),
        name_(name),
        spec_(spec) {}
  absl::StatusOr<Procedures> Do(const Context&) override {
    store_->observed[name_] = spec_;
    return Procedures{};
  }

 private:
  TwoMapStore* const store_;
  const std::string name_;
  const ResourceSpec spec_;
};

// Looks up every desired resource in the observed map: creates the missing,
// updates those whose spec differs. (Deleting extras is left out: none
// appear here.)
class TwoMapReconcilePlan final : public TimedPlan {
 public:
  explicit TwoMapReconcilePlan(TwoMapStore* store,
                               std::chrono::nanoseconds* create_time = nullptr)
      : TimedPlan(create_time), store_(store) {}

 private:
  Procedures Diff() const override {
    Procedures todo;
    for (const auto& [name, spec] : store_->desired) {
      auto it = store_->observed.find(name);
      if (it == store_->observed.end()) {
        todo.push_back(
            std::make_unique<TwoMapCreateResource>(store_, name, spec));
      } else if (it->second != spec) {
        todo.push_back(
            std::make_unique<TwoMapUpdateResource>(store_, name, spec));
      }
    }
    return todo;
  }

  TwoMapStore* const store_;
};

// ---- The benchmarks

// One pass: the world lost kDriftPerPass resources (not timed); a fresh
// Execute runs Create (10 missing), the 10 procedures, Create again
// (converged). Timed by hand around Execute and the report's destruction.
// Counters split the pass: create_us is the time inside the two Create calls,
// other_us the rest (the Scheduler's own work, the 10 Do calls, the report).
template <typename Store, typename ReconcilePlan>
void SteadyState(benchmark::State& state) {
  Store store;
  std::chrono::nanoseconds create_time{0};
  ReconcilePlan plan(&store, &create_time);
  const Scheduler scheduler = MakeScheduler();
  const Context ctx = Context::Background();
  std::mt19937_64 rng(42);
  std::chrono::nanoseconds pass_time{0};
  for (auto _ : state) {
    store.Drift(rng, kDriftPerPass);
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
    if (!store.Converged()) {
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

// The plan's own share of a pass: one Create scan with kDriftPerPass missing
// (arg 1) or with none missing (arg 0), without the Scheduler. Items are scans.
template <typename Store, typename ReconcilePlan>
void CreateScan(benchmark::State& state) {
  Store store;
  std::mt19937_64 rng(42);
  const int missing = state.range(0) != 0 ? kDriftPerPass : 0;
  store.Drift(rng, missing);
  ReconcilePlan plan(&store);
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

void BM_ReconcileSteadyState(benchmark::State& state) {
  SteadyState<JoinedStore, JoinedReconcilePlan>(state);
}
BENCHMARK(BM_ReconcileSteadyState)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_ReconcileSteadyStateTwoMaps(benchmark::State& state) {
  SteadyState<TwoMapStore, TwoMapReconcilePlan>(state);
}
BENCHMARK(BM_ReconcileSteadyStateTwoMaps)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

void BM_ReconcileCreateScanJoined(benchmark::State& state) {
  CreateScan<JoinedStore, JoinedReconcilePlan>(state);
}
BENCHMARK(BM_ReconcileCreateScanJoined)
    ->ArgName("missing")
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMicrosecond);

void BM_ReconcileCreateScanTwoMaps(benchmark::State& state) {
  CreateScan<TwoMapStore, TwoMapReconcilePlan>(state);
}
BENCHMARK(BM_ReconcileCreateScanTwoMaps)
    ->ArgName("missing")
    ->Arg(1)
    ->Arg(0)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace setpoint

BENCHMARK_MAIN();
