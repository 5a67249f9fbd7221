// registry_bench: measures the shard handoff over a real redis-server that
// it starts itself (unix socket in a temporary directory, no persistence).
//
//   build/release/bench/registry_bench            # full run, about a minute
//   build/release/bench/registry_bench --quick    # a few seconds (CI smoke)
//   build/release/bench/registry_bench --only=cold,fleet   # some parts:
//       pair (join, leave, crash), cold (cold starts), fleet (steady cost,
//       rolling restart, mass failure)
//   build/release/bench/registry_bench --only=fleet --steps=10
//       # the rolling restart of the first 10 pods only
//   build/release/bench/registry_bench --only=fleet --fleet=10
//       # the fleet parts with 10 pods of 10 nodes instead of 100
//
// It prints one line per measurement:
//   graceful leave   time from Stop() of one pod until the other pod's nodes
//                    own every shard again (p50/p99/max over the runs)
//   graceful join    time from Start() of a second pod until the ring is
//                    split between both pods' nodes
//   crash failover   a pod's registry calls stop (as if the process died);
//                    time until the other pod owns everything (defaults:
//                    lease 3 s, poll 500 ms)
//   cold start       10, 50 and 100 pods of 10 nodes on a fresh namespace:
//                    time until every shard is owned, polls per pod,
//                    round trips
//   steady cost      Redis commands per pod and per node per second, and
//                    Redis CPU, with 100 pods of 10 nodes (1,000 nodes)
//   rolling restart  each of the 100 pods in turn stops gracefully and a
//                    new one starts under a new pod id: per step, the time
//                    until the ring is owned again and the longest time a
//                    shard had no owner, also split by the half of the step
//                    that let it go (the old pod's leave, or the new pod's
//                    join after its start), and the shards moved
//   same-id restart  the same again, each pod replaced by one with its own
//                    pod id, with static membership (the stopping pod keeps
//                    its places for the successor)
//   mass failure     20 of the 100 pods die at once: time until every shard
//                    is owned again
// Exit code 1 if a run does not converge.
#include <stdlib.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "registry/redis/redis_client.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/registry/redis_node_registry.h"
#include "setpoint/testing/faulty_node_registry.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/redis_server.h"

namespace setpoint {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kRing = 4096;

// Counts the shards owned by the nodes that report to it, and wakes waiters
// on every change.
class Coverage {
 public:
  void Set(const std::string& node, const ShardSet& r) {
    std::lock_guard l(mu_);
    ShardSet old = ranges_[node];
    auto now = Clock::now();
    const ShardSet lost = old.Minus(r), won = r.Minus(old);
    for (const ShardRange& run : lost.runs()) {
      for (uint32_t s = run.begin; s < run.end; ++s) {
        if (--owners_[s] == 0) unowned_since_[s] = now;
      }
    }
    for (const ShardRange& run : won.runs()) {
      for (uint32_t s = run.begin; s < run.end; ++s) {
        if (owners_[s]++ == 0 && unowned_since_[s] != Clock::time_point()) {
          max_gap_ = std::max(max_gap_, now - unowned_since_[s]);
          // Which half of a rolling step let it go: before the new pod
          // started (the old one's leave) or after (the new one's join).
          Clock::duration& half =
              unowned_since_[s] < join_mark_ ? leave_gap_ : join_gap_;
          half = std::max(half, now - unowned_since_[s]);
        }
        ++moved_;
      }
    }
    ranges_[node] = r;
    cv_.notify_all();
  }
  // Shards given to a node that did not have them, since the last call.
  int64_t TakeMoved() {
    std::lock_guard l(mu_);
    int64_t n = moved_;
    moved_ = 0;
    return n;
  }
  // The longest time a shard went without an owner since the last call
  // (shards that were never owned do not count).
  Clock::duration TakeMaxGap() {
    std::lock_guard l(mu_);
    Clock::duration gap = max_gap_;
    max_gap_ = Clock::duration::zero();
    return gap;
  }
  // From now on shards that lose their owner count as the join's.
  void MarkJoin() {
    std::lock_guard l(mu_);
    join_mark_ = Clock::now();
  }
  // The longest gaps of shards let go before and after MarkJoin, since the
  // last call; starts a new step (everything counts as the leave's again).
  std::pair<Clock::duration, Clock::duration> TakeHalves() {
    std::lock_guard l(mu_);
    auto out = std::make_pair(leave_gap_, join_gap_);
    leave_gap_ = join_gap_ = Clock::duration::zero();
    join_mark_ = Clock::time_point::max();
    return out;
  }
  // What keeps the nodes of `prefixes` from covering the ring, for the
  // message when a run does not converge.
  std::string Why(const std::vector<std::string>& prefixes) {
    std::lock_guard l(mu_);
    uint32_t total = 0;
    std::string empty;
    int active = 0;
    for (const auto& [id, r] : ranges_) {
      bool mine = false;
      for (const auto& p : prefixes) mine = mine || id.rfind(p, 0) == 0;
      if (!mine) continue;
      if (r.Empty()) {
        absl::StrAppend(&empty, " ", id);
        continue;
      }
      total += r.size();
      ++active;
    }
    return absl::StrCat("shards owned ", total, " of ", kRing, "; nodes with ",
                        "shards ", active, "; without:", empty);
  }
  // Forgets every node (between scenarios on fresh namespaces).
  void Reset() {
    std::lock_guard l(mu_);
    ranges_.clear();
    for (auto& o : owners_) o = 0;
    for (auto& t : unowned_since_) t = Clock::time_point();
    max_gap_ = Clock::duration::zero();
    join_mark_ = Clock::time_point::max();
    leave_gap_ = join_gap_ = Clock::duration::zero();
  }
  // Waits until the nodes whose id starts with one of `prefixes` own the
  // whole ring, each node a non-empty range. Returns false after `timeout`.
  bool AwaitCovered(const std::vector<std::string>& prefixes, int nodes,
                    std::chrono::milliseconds timeout) {
    std::unique_lock l(mu_);
    return cv_.wait_for(l, timeout, [&] {
      uint32_t total = 0;
      int active = 0;
      for (const auto& [id, r] : ranges_) {
        bool mine = false;
        for (const auto& p : prefixes) mine = mine || id.rfind(p, 0) == 0;
        if (!mine || r.Empty()) continue;
        total += r.size();
        ++active;
      }
      return total == kRing && active == nodes;
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, ShardSet> ranges_;
  int owners_[kRing] = {};
  Clock::time_point unowned_since_[kRing] = {};
  Clock::duration max_gap_ = Clock::duration::zero();
  Clock::time_point join_mark_ = Clock::time_point::max();
  Clock::duration leave_gap_ = Clock::duration::zero();
  Clock::duration join_gap_ = Clock::duration::zero();
  int64_t moved_ = 0;
};

class BenchNode : public Node {
 public:
  BenchNode(std::string id, Coverage* coverage)
      : id_(std::move(id)), coverage_(coverage) {}
  absl::Status Run(const Context& ctx) override {
    (void)ctx.Wait(absl::InfiniteDuration());
    return absl::OkStatus();
  }
  absl::Status UpdateShardRange(const Context&, const Assignment& a) override {
    coverage_->Set(id_, a.range);
    return absl::OkStatus();
  }

 private:
  std::string id_;
  Coverage* coverage_;
};

struct Pod {
  std::unique_ptr<NodeRegistry> registry;
  std::unique_ptr<testing::FaultyNodeRegistry> faulty;
  std::unique_ptr<NodeManager> manager;
};

std::unique_ptr<Pod> MakePod(const std::string& address, const std::string& id,
                             int nodes, Coverage* coverage,
                             absl::Duration lease, absl::Duration poll,
                             const std::string& ns = "bench",
                             bool static_membership = false) {
  auto pod = std::make_unique<Pod>();
  auto registry = RedisNodeRegistry::Create(
      {.address = address, .ns = ns, .logger = testing::NullLogger()});
  if (!registry.ok()) return nullptr;
  pod->registry = std::move(*registry);
  pod->faulty =
      std::make_unique<testing::FaultyNodeRegistry>(pod->registry.get());
  pod->manager = std::make_unique<NodeManager>(NodeManagerOptions{
      .pod_id = id,
      .kinds = {{.kind = "work",
                 .count = nodes,
                 .ring_size = kRing,
                 .factory =
                     [coverage](const NodeInfo& info) {
                       return std::make_unique<BenchNode>(info.id, coverage);
                     }}},
      .registry = pod->faulty.get(),
      .poll_interval = poll,
      .lease = lease,
      .static_membership = static_membership,
      .logger = testing::NullLogger(),
  });
  if (!pod->manager->Start().ok()) return nullptr;
  return pod;
}

double Ms(Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

void Report(const char* what, std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    return ms[std::min(ms.size() - 1, static_cast<size_t>(q * ms.size()))];
  };
  std::printf("%-16s runs=%-3zu p50=%8.2f ms  p99=%8.2f ms  max=%8.2f ms\n",
              what, ms.size(), at(0.5), at(0.99), ms.back());
}

// Redis's own counters: total commands processed and CPU seconds used.
struct RedisStats {
  int64_t commands = 0;     // Including those run inside scripts.
  int64_t round_trips = 0;  // Commands sent by clients (scripts count once).
  double cpu = 0;
};
RedisStats ReadStats(const std::string& address) {
  auto endpoint = redis::ParseRedisAddress(address);
  redis::RedisClient client(*endpoint, {}, testing::NullLogger());
  RedisStats s;
  auto reply = client.Command({"INFO", "all"});
  if (!reply.ok()) return s;
  for (absl::string_view line : absl::StrSplit(reply->str, "\r\n")) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(line, absl::MaxSplits(':', 1));
    double cpu = 0;
    if (absl::StartsWith(kv.first, "cmdstat_")) {
      // cmdstat_evalsha:calls=12,usec=...; count what clients sent.
      std::string name(kv.first.substr(8));
      int64_t calls = 0;
      absl::string_view rest = kv.second;
      if (absl::ConsumePrefix(&rest, "calls=") &&
          absl::SimpleAtoi(rest.substr(0, rest.find(',')), &calls) &&
          // INFO is left out: the scripts run it inside (for the server's
          // run id), and the bench's own INFO is not the pods' cost.
          (name == "evalsha" || name == "eval" ||
           absl::StartsWith(name, "script") || name == "subscribe")) {
        s.round_trips += calls;
      }
    } else if (kv.first == "total_commands_processed") {
      (void)absl::SimpleAtoi(kv.second, &s.commands);
    } else if ((kv.first == "used_cpu_sys" || kv.first == "used_cpu_user") &&
               absl::SimpleAtod(kv.second, &cpu)) {
      s.cpu += cpu;
    }
  }
  return s;
}

// The fleet's NodeManager counters, summed.
struct FleetStats {
  int64_t polls = 0, conflicts = 0, retries = 0, nudges = 0, deferred = 0;
  int64_t waited = 0;
  void Add(const NodeManagerStats& s, int sign = 1) {
    waited += sign * s.grants_waited;
    deferred += sign * s.nudges_deferred;
    polls += sign * s.polls;
    conflicts += sign * s.grant_conflicts;
    retries += sign * s.grant_retries;
    nudges += sign * s.nudges;
  }
};
FleetStats SumStats(const std::vector<std::unique_ptr<Pod>>& fleet) {
  FleetStats out;
  for (const auto& p : fleet) out.Add(p->manager->stats());
  return out;
}

int64_t Polls(const std::vector<std::unique_ptr<Pod>>& fleet) {
  int64_t n = 0;
  for (const auto& p : fleet) n += p->manager->stats().polls;
  return n;
}

std::vector<std::string> Prefixes(
    const std::vector<std::unique_ptr<Pod>>& fleet) {
  std::vector<std::string> out;
  for (const auto& p : fleet) out.push_back(p->manager->pod_id() + "/");
  return out;
}

// CPU seconds this process (every pod of the bench) has used so far.
double ProcessCpu() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0;
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

double LoadAverage() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

// Cold start of `pods` pods of 10 nodes on a namespace nobody used yet:
// grants open one lease after the first poll. Prints the time until every
// shard is owned as AssignShards says, from the start and from the end of
// the namespace's first lease, and the polls and round trips it took.
bool ColdStart(const std::string& address, int pods, Coverage* coverage,
               absl::Duration lease, absl::Duration poll) {
  const int per_pod = 10;
  const std::string ns = absl::StrCat("cold", pods);
  coverage->Reset();
  RedisStats before = ReadStats(address);
  std::vector<std::unique_ptr<Pod>> fleet;
  auto start = Clock::now();
  for (int i = 0; i < pods; ++i) {
    fleet.push_back(MakePod(address, absl::StrCat("p", i), per_pod, coverage,
                            lease, poll, ns));
    if (fleet.back() == nullptr) return false;
  }
  auto started = Clock::now();
  if (!coverage->AwaitCovered(Prefixes(fleet), pods * per_pod,
                              std::chrono::milliseconds(120'000))) {
    std::fprintf(stderr, "cold start of %d pods did not converge\n", pods);
    return false;
  }
  auto done = Clock::now();
  RedisStats after = ReadStats(address);
  double from_lease = Ms(done - start) - absl::ToDoubleMilliseconds(lease);
  std::printf(
      "cold start       pods=%-3d nodes=%-4d owned after %7.0f ms (%6.0f ms "
      "after the first lease; starting the pods took %.0f ms) polls/pod=%.1f "
      "round trips=%lld load=%.1f\n",
      pods, pods * per_pod, Ms(done - start), from_lease, Ms(started - start),
      static_cast<double>(Polls(fleet)) / pods,
      static_cast<long long>(after.round_trips - before.round_trips),
      LoadAverage());
  for (auto& p : fleet) p->manager->Stop();
  return true;
}

// Restarts the first `roll` pods of `fleet` one at a time: each stops
// gracefully and a new one takes its place, under a new pod id ("r<i>",
// then "s<i>"...) or, with `same_id`, under the same one (the stopping pod
// keeps its places: static membership). Prints the step figures; false
// when a step does not converge. Every replacement has static membership
// on, so that a later same-id restart finds it.
bool RollingRestart(const std::string& address,
                    std::vector<std::unique_ptr<Pod>>* fleet_ptr,
                    Coverage* coverage_ptr, int roll, int per_pod,
                    absl::Duration lease, absl::Duration poll, bool same_id) {
  std::vector<std::unique_ptr<Pod>>& fleet = *fleet_ptr;
  Coverage& coverage = *coverage_ptr;
  const int pods = static_cast<int>(fleet.size());
  const char* label = same_id ? "same-id restart" : "rolling restart";
  std::vector<double> gaps, steps, stops, starts, leave_gaps, join_gaps;
  int64_t moved = 0;
  RedisStats roll_before = ReadStats(address);
  FleetStats fleet_before = SumStats(fleet);
  const double cpu_before = ProcessCpu();
  coverage.TakeMoved();
  auto roll_start = Clock::now();
  for (int i = 0; i < roll; ++i) {
    auto step_start = Clock::now();
    coverage.TakeMaxGap();
    coverage.TakeHalves();
    const std::string id =
        same_id ? fleet[i]->manager->pod_id() : absl::StrCat("r", i);
    fleet[i]->manager->Stop();
    auto stopped = Clock::now();
    coverage.MarkJoin();
    // The stopped pod's counters leave the sum with it.
    fleet_before.Add(fleet[i]->manager->stats(), -1);
    fleet[i] = MakePod(address, id, per_pod, &coverage, lease, poll, "bench",
                       /*static_membership=*/true);
    auto started = Clock::now();
    if (fleet[i] == nullptr ||
        !coverage.AwaitCovered(Prefixes(fleet), pods * per_pod,
                               std::chrono::milliseconds(20'000))) {
      std::fprintf(stderr, "%s step %d did not converge: %s\n", label, i,
                   coverage.Why(Prefixes(fleet)).c_str());
      return false;
    }
    steps.push_back(Ms(Clock::now() - step_start));
    stops.push_back(Ms(stopped - step_start));
    starts.push_back(Ms(started - stopped));
    gaps.push_back(Ms(coverage.TakeMaxGap()));
    auto [leave_gap, join_gap] = coverage.TakeHalves();
    leave_gaps.push_back(Ms(leave_gap));
    join_gaps.push_back(Ms(join_gap));
  }
  moved = coverage.TakeMoved();
  RedisStats roll_after = ReadStats(address);
  FleetStats fleet_after = SumStats(fleet);
  const double roll_seconds =
      std::chrono::duration<double>(Clock::now() - roll_start).count();
  // Where the machine's time went: the pods (this process) and Redis, as
  // cores busy on average over the restart.
  std::printf("%s  cpu: pods=%.2f cores redis=%.2f cores (of %u)\n", label,
              (ProcessCpu() - cpu_before) / roll_seconds,
              (roll_after.cpu - roll_before.cpu) / roll_seconds,
              std::thread::hardware_concurrency());
  std::printf(
      "%s  pods=%d took %.0f ms load=%.1f; per step: shards moved=%.1f "
      "round trips=%.0f polls=%.0f grant refusals=%.0f grants waited=%.0f "
      "grant retries=%.0f "
      "announcements heard=%.0f deferred by the rate limit=%.1f\n",
      label, roll, Ms(Clock::now() - roll_start), LoadAverage(),
      static_cast<double>(moved) / roll,
      static_cast<double>(roll_after.round_trips - roll_before.round_trips) /
          roll,
      static_cast<double>(fleet_after.polls - fleet_before.polls) / roll,
      static_cast<double>(fleet_after.conflicts - fleet_before.conflicts) /
          roll,
      static_cast<double>(fleet_after.waited - fleet_before.waited) / roll,
      static_cast<double>(fleet_after.retries - fleet_before.retries) / roll,
      static_cast<double>(fleet_after.nudges - fleet_before.nudges) / roll,
      static_cast<double>(fleet_after.deferred - fleet_before.deferred) / roll);
  Report("  step", steps);
  Report("  unowned", gaps);
  Report("   by the leave", leave_gaps);
  Report("   by the join", join_gaps);
  Report("  pod stop", stops);
  Report("  pod start", starts);
  return true;
}

int Main(bool quick, const std::string& only, int steps_limit, int fleet_pods) {
  auto want = [&](const char* part) {
    return only.empty() || absl::StrContains(only, part);
  };
  testing::RedisServer server;
  if (absl::Status s = server.Start(); !s.ok()) {
    std::fprintf(stderr, "registry_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  const std::string address = server.address();
  const auto timeout = std::chrono::milliseconds(20'000);
  const absl::Duration lease = absl::Seconds(3);
  const absl::Duration poll = absl::Milliseconds(500);
  Coverage coverage;

  // A warm namespace: the first pod waits out the new epoch once.
  if (want("pair")) {
    auto a = MakePod(address, "a", 2, &coverage, lease, poll);
    if (a == nullptr || !coverage.AwaitCovered({"a/"}, 2, timeout)) {
      std::fprintf(stderr, "first pod did not converge\n");
      return 1;
    }

    const int runs = quick ? 5 : 100;
    std::vector<double> join, leave;
    for (int i = 0; i < runs; ++i) {
      std::string id = absl::StrCat("b", i);
      auto start = Clock::now();
      auto b = MakePod(address, id, 2, &coverage, lease, poll);
      if (b == nullptr ||
          !coverage.AwaitCovered({"a/", id + "/"}, 4, timeout)) {
        std::fprintf(stderr, "join %d did not converge\n", i);
        return 1;
      }
      join.push_back(Ms(Clock::now() - start));
      start = Clock::now();
      b->manager->Stop();
      if (!coverage.AwaitCovered({"a/"}, 2, timeout)) {
        std::fprintf(stderr, "leave %d did not converge\n", i);
        return 1;
      }
      leave.push_back(Ms(Clock::now() - start));
    }
    Report("graceful join", join);
    Report("graceful leave", leave);

    std::vector<double> crash;
    for (int i = 0; i < (quick ? 1 : 5); ++i) {
      std::string id = absl::StrCat("c", i);
      auto c = MakePod(address, id, 2, &coverage, lease, poll);
      if (c == nullptr ||
          !coverage.AwaitCovered({"a/", id + "/"}, 4, timeout)) {
        std::fprintf(stderr, "crash setup %d did not converge\n", i);
        return 1;
      }
      auto start = Clock::now();
      c->faulty->SetDown(true);  // From now on it is dead to the registry.
      if (!coverage.AwaitCovered({"a/"}, 2, timeout)) {
        std::fprintf(stderr, "crash %d did not converge\n", i);
        return 1;
      }
      crash.push_back(Ms(Clock::now() - start));
    }
    Report("crash failover", crash);
    a->manager->Stop();
  }

  for (int pods :
       quick ? std::vector<int>{10} : std::vector<int>{10, 50, 100}) {
    if (!want("cold")) break;
    if (!ColdStart(address, pods, &coverage, lease, poll)) return 1;
  }
  coverage.Reset();
  if (!want("fleet")) return 0;

  // Steady state: 100 pods x 10 nodes on one redis-server.
  const int pods = fleet_pods > 0 ? fleet_pods : (quick ? 10 : 100);
  const int per_pod = 10;
  std::vector<std::unique_ptr<Pod>> fleet;
  std::vector<std::string> prefixes;
  auto start = Clock::now();
  for (int i = 0; i < pods; ++i) {
    std::string id = absl::StrCat("p", i);
    fleet.push_back(MakePod(address, id, per_pod, &coverage, lease, poll));
    prefixes.push_back(id + "/");
    if (fleet.back() == nullptr) return 1;
  }
  if (!coverage.AwaitCovered(prefixes, pods * per_pod,
                             std::chrono::milliseconds(120'000))) {
    std::fprintf(stderr, "fleet did not converge\n");
    return 1;
  }
  std::printf("fleet converged  pods=%d nodes=%d in %.0f ms\n", pods,
              pods * per_pod, Ms(Clock::now() - start));
  const double window = quick ? 2.0 : 10.0;
  RedisStats before = ReadStats(address);
  int64_t polls_before = Polls(fleet);
  auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(window));
  RedisStats after = ReadStats(address);
  int64_t polls_after = Polls(fleet);
  double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  double rts = (after.round_trips - before.round_trips) / seconds;
  double cps = (after.commands - before.commands - 1) / seconds;
  std::printf(
      "steady cost      pods=%d nodes=%d round trips/s=%.1f per pod=%.2f "
      "per node=%.3f polls/s per pod=%.2f (commands incl. inside scripts: "
      "%.0f/s) redis cpu=%.1f%%\n",
      pods, pods * per_pod, rts, rts / pods, rts / (pods * per_pod),
      (polls_after - polls_before) / seconds / pods, cps,
      100.0 * (after.cpu - before.cpu) / seconds);

  // Rolling restarts: one pod at a time stops gracefully and a new one
  // takes its place, first under a new pod id (a Deployment: the fleet
  // re-splits twice per step), then under the same one with static
  // membership (a StatefulSet: only the restarting pod's shards move).
  const int roll =
      steps_limit > 0 ? std::min(steps_limit, pods) : (quick ? 3 : pods);
  if (!RollingRestart(address, &fleet, &coverage, roll, per_pod, lease, poll,
                      false) ||
      !RollingRestart(address, &fleet, &coverage, roll, per_pod, lease, poll,
                      true)) {
    return 1;
  }

  // A fifth of the pods die at once (their registry calls stop).
  const int dead = pods / 5;
  auto kill_start = Clock::now();
  for (int i = 0; i < dead; ++i) fleet[i]->faulty->SetDown(true);
  std::vector<std::unique_ptr<Pod>> alive;
  for (int i = dead; i < pods; ++i) alive.push_back(std::move(fleet[i]));
  if (!coverage.AwaitCovered(Prefixes(alive), (pods - dead) * per_pod,
                             std::chrono::milliseconds(60'000))) {
    std::fprintf(stderr, "after killing %d pods the ring was not owned\n",
                 dead);
    return 1;
  }
  std::printf(
      "mass failure     %d of %d pods died at once; every shard owned again "
      "after %.0f ms (lease %.0f ms + poll %.0f ms) load=%.1f\n",
      dead, pods, Ms(Clock::now() - kill_start),
      absl::ToDoubleMilliseconds(lease), absl::ToDoubleMilliseconds(poll),
      LoadAverage());
  for (int i = 0; i < dead; ++i) fleet[i]->manager->Stop();
  for (auto& p : alive) p->manager->Stop();
  return 0;
}

}  // namespace
}  // namespace setpoint

int main(int argc, char** argv) {
  bool quick = false;
  std::string only;
  int steps = 0;
  int fleet = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strncmp(argv[i], "--only=", 7) == 0) {
      only = argv[i] + 7;
    } else if (std::strncmp(argv[i], "--steps=", 8) == 0 &&
               absl::SimpleAtoi(argv[i] + 8, &steps) && steps > 0) {
    } else if (std::strncmp(argv[i], "--fleet=", 8) == 0 &&
               absl::SimpleAtoi(argv[i] + 8, &fleet) && fleet >= 5) {
    } else {
      std::fprintf(stderr,
                   "usage: registry_bench [--quick] [--only=pair,cold,fleet] "
                   "[--steps=N] [--fleet=PODS]\n");
      return 2;
    }
  }
  return setpoint::Main(quick, only, steps, fleet);
}
