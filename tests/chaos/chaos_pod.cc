// chaos_pod: one "pod" of the chaos test. Runs a NodeManager with --nodes
// nodes of kind "work" on a ring of --ring shards against Redis; each node
// is a setpoint::Controller wired as a user would (threadless, its runner
// on the pod's runner pool, as PodMain wires it): a Poll of the desired
// values (kKeysPerShard keys on every shard of the ring, each changing
// every kChangePeriodMs), a Poll of a pod-local in-memory "world", and a
// Sync whose client writes the world after 0-20 ms (cut short by the
// call's cancellation). It appends every ownership event and every client
// call to --log, with times on CLOCK_MONOTONIC (the system-wide monotonic
// clock, so the driver can merge all pods' logs):
//   S <ns> <pod> <pid> <nodes> <ring> <lease_ms> <poll_ms> <clock_offset_ns>
//                                         started (before the manager starts)
//   B <node> <runs> <token> <ns>          UpdateShardRange called; runs:
//                                         "<b>-<e>[,<b>-<e>...]", "0-0"
//                                         for the empty range
//   E <node> <ns>                         ...and returned OK
//   F <node> <ns> <code>                  ...or refused: nothing was
//                                         released (the manager asks again)
//   C <node> <shard> <token> <start_ns> <end_ns> <code>
//                                         one client call, logged as it
//                                         returns (code: absl canonical, 0 OK)
//   R <ns> <valid_until_ns>               lease renewed: may work until then
//   T <ns> <signal>                       stop requested (SIGTERM/SIGINT)
//   X <ns>                                stopped gracefully, about to exit 0
// Each line is one write(), so whole lines survive SIGKILL (a call cut by
// SIGKILL logs nothing: its world dies with it).
//
// <clock_offset_ns> is ToUnixNanos(Clock::Monotonic()->Now()) minus
// CLOCK_MONOTONIC read just before it: the manager's clock is
// std::chrono::steady_clock shown as UnixEpoch() + time_since_epoch, which
// on Linux/libstdc++ is CLOCK_MONOTONIC itself, so valid_until converts
// with absl::ToUnixNanos and this offset is ~0 (the driver checks it).
//
//   chaos_pod --redis=127.0.0.1:6379 --pod=p0 --log=/tmp/p0.log --nodes=3
//             --ring=256 --lease_ms=1500 --poll_ms=250 --ns=chaos
//             [--command_timeout_ms=N] [--operation_timeout_ms=N]
//   chaos_pod --sentinels=127.0.0.1:26379,127.0.0.1:26380 --master=NAME
//             [--grant_wait_replicas=N] ... (the rest as above, no --redis)
//
// SIGTERM or SIGINT stop it gracefully (exit 0). Uses only the public API.
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/base/mutex.h"
#include "setpoint/controller/controller.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/node/shard.h"
#include "setpoint/planner/loop_pool.h"
#include "setpoint/processor/runner_pool.h"
#include "setpoint/registry/redis_node_registry.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace {

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Appends one line with a single write(): whole lines survive SIGKILL.
void Log(int fd, const std::string& line) {
  std::string out = line + "\n";
  ssize_t n = write(fd, out.data(), out.size());
  (void)n;
}

// Desired keys per shard: every shard has calls.
constexpr int kKeysPerShard = 4;
// Each key's desired value changes once per period (keys are staggered
// over it): ring * kKeysPerShard calls per period across the fleet.
constexpr int64_t kChangePeriodMs = 2000;
// Both stores are listed this often.
constexpr absl::Duration kListInterval = absl::Milliseconds(200);
// A client call takes up to this long (less when cancelled).
constexpr int64_t kMaxCallMs = 20;

using Values = absl::flat_hash_map<std::string, int64_t>;

// kKeysPerShard keys for every shard of a ring of `ring`, with each key's
// phase in the change period.
std::vector<std::pair<std::string, int64_t>> KeysCoveringRing(uint32_t ring) {
  std::vector<int> count(ring, 0);
  std::vector<std::pair<std::string, int64_t>> keys;
  uint32_t full = 0;
  for (uint64_t i = 0; full < ring; ++i) {
    std::string key = absl::StrCat("k", i);
    uint32_t shard = setpoint::ShardOf(key, ring);
    if (count[shard] == kKeysPerShard) continue;
    if (++count[shard] == kKeysPerShard) ++full;
    int64_t phase = static_cast<int64_t>(std::hash<std::string>{}(key) %
                                         (kChangePeriodMs * 1'000'000));
    keys.emplace_back(std::move(key), phase);
  }
  return keys;
}

// What the pod's nodes write to: key -> value, in memory, shared by the
// pod's nodes (a shard that moves between pods starts empty there).
class World {
 public:
  void Put(const std::string& key, int64_t value) {
    setpoint::MutexLock l(&mu_);
    values_[key] = value;
  }
  void Erase(const std::string& key) {
    setpoint::MutexLock l(&mu_);
    values_.erase(key);
  }
  Values List() const {
    setpoint::MutexLock l(&mu_);
    return values_;
  }

 private:
  mutable setpoint::Mutex mu_;
  Values values_ ABSL_GUARDED_BY(mu_);
};

// The syncer's client: each call waits 0-kMaxCallMs on its context, then
// writes the world if not cancelled, and logs one C line.
class WorldClient
    : public setpoint::SyncerClient<std::string, int64_t, int64_t> {
 public:
  WorldClient(World* world, uint32_t ring, int fd)
      : world_(world), ring_(ring), fd_(fd) {}
  absl::Status Create(const setpoint::Context& ctx, const std::string& key,
                      const int64_t& want) override {
    return Call(ctx, key, &want);
  }
  absl::Status Update(const setpoint::Context& ctx, const std::string& key,
                      const int64_t& want, const int64_t&) override {
    return Call(ctx, key, &want);
  }
  absl::Status Delete(const setpoint::Context& ctx, const std::string& key,
                      const int64_t&) override {
    return Call(ctx, key, nullptr);
  }

 private:
  absl::Status Call(const setpoint::Context& ctx, const std::string& key,
                    const int64_t* want) {
    const int64_t start = MonotonicNanos();
    const setpoint::Assignment* a = setpoint::AssignmentOf(ctx);
    absl::Status s;
    if (a == nullptr) {
      s = absl::FailedPreconditionError("world call: no assignment");
    } else {
      const uint64_t h = std::hash<std::string>{}(key) ^
                         static_cast<uint64_t>(want == nullptr ? 0 : *want);
      s = ctx.Wait(absl::Microseconds(
          static_cast<int64_t>(h % (kMaxCallMs * 1000 + 1))));
    }
    if (s.ok()) {
      if (want != nullptr) {
        world_->Put(key, *want);
      } else {
        world_->Erase(key);
      }
    }
    Log(fd_, absl::StrCat("C ", a == nullptr ? "-" : a->node_id, " ",
                          setpoint::ShardOf(key, ring_), " ",
                          a == nullptr ? 0 : a->token, " ", start, " ",
                          MonotonicNanos(), " ", static_cast<int>(s.code())));
    return s;
  }

  World* const world_;
  const uint32_t ring_;
  const int fd_;
};

// The controller's pieces: desired values from the clock, observed values
// from the world, and a syncer between them.
absl::Status BuildWorldController(
    setpoint::ControllerBuilder& b, World* world, uint32_t ring, int fd,
    const std::vector<std::pair<std::string, int64_t>>* keys) {
  auto* seen = b.Poll<std::string, int64_t>(
      "world",
      [world](const setpoint::Context&) -> absl::StatusOr<Values> {
        return world->List();
      },
      {.interval = kListInterval});
  auto* want = b.Poll<std::string, int64_t>(
      "desired",
      [keys](const setpoint::Context&) -> absl::StatusOr<Values> {
        const int64_t now = MonotonicNanos();
        Values out;
        out.reserve(keys->size());
        for (const auto& [key, phase] : *keys) {
          out[key] = (now + phase) / (kChangePeriodMs * 1'000'000);
        }
        return out;
      },
      {.interval = kListInterval});
  auto* client = b.Own(std::make_unique<WorldClient>(world, ring, fd));
  b.Sync<std::string, int64_t, int64_t>(
      "world", client, seen, want,
      {.max_in_flight = 4, .expectation_timeout = absl::Seconds(2)});
  return absl::OkStatus();
}

// A Controller with its UpdateShardRange calls logged: B before, E after
// an OK return, F after a refusal.
class LoggedController : public setpoint::Node {
 public:
  LoggedController(std::unique_ptr<setpoint::Node> inner, std::string id,
                   int fd)
      : inner_(std::move(inner)), id_(std::move(id)), fd_(fd) {}
  absl::Status Run(const setpoint::Context& ctx) override {
    return inner_->Run(ctx);
  }
  bool Threadless() const override { return inner_->Threadless(); }
  absl::Status Launch(const setpoint::Context& ctx) override {
    return inner_->Launch(ctx);
  }
  void Halt() override { inner_->Halt(); }
  absl::Status UpdateShardRange(const setpoint::Context& ctx,
                                const setpoint::Assignment& a) override {
    std::string runs;
    for (const setpoint::ShardRange& r : a.range.runs()) {
      absl::StrAppend(&runs, runs.empty() ? "" : ",", r.begin, "-", r.end);
    }
    if (runs.empty()) runs = "0-0";
    Log(fd_, absl::StrCat("B ", id_, " ", runs, " ", a.token, " ",
                          MonotonicNanos()));
    absl::Status s = inner_->UpdateShardRange(ctx, a);
    if (s.ok()) {
      Log(fd_, absl::StrCat("E ", id_, " ", MonotonicNanos()));
    } else {
      Log(fd_, absl::StrCat("F ", id_, " ", MonotonicNanos(), " ",
                            static_cast<int>(s.code())));
    }
    return s;
  }

 private:
  const std::unique_ptr<setpoint::Node> inner_;
  const std::string id_;
  const int fd_;
};

int Usage(const char* why) {
  std::fprintf(stderr,
               "chaos_pod: %s\nusage: chaos_pod --redis=ADDR --pod=ID "
               "--log=FILE --nodes=N --ring=R --lease_ms=MS --poll_ms=MS "
               "--ns=NAME [--command_timeout_ms=MS] "
               "[--operation_timeout_ms=MS] [--static_membership=1]\n"
               "   or: chaos_pod --sentinels=ADDR,ADDR --master=NAME "
               "[--grant_wait_replicas=N] (and the rest, no --redis)\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      return Usage(("bad argument: " + arg).c_str());
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  if (flags.count("sentinels") != 0) {
    if (flags.count("master") == 0) return Usage("--sentinels needs --master");
    flags["redis"] = "";
  }
  for (const char* required :
       {"redis", "pod", "log", "nodes", "ring", "lease_ms", "poll_ms", "ns"}) {
    if (flags.count(required) == 0) {
      return Usage(absl::StrCat("missing --", required).c_str());
    }
  }
  int nodes = 0, lease_ms = 0, poll_ms = 0, command_timeout_ms = 0,
      operation_timeout_ms = 0, grant_wait_replicas = 0;
  uint32_t ring = 0;
  if (!absl::SimpleAtoi(flags["nodes"], &nodes) || nodes <= 0 ||
      !absl::SimpleAtoi(flags["ring"], &ring) || ring == 0 ||
      !absl::SimpleAtoi(flags["lease_ms"], &lease_ms) ||
      !absl::SimpleAtoi(flags["poll_ms"], &poll_ms) ||
      (flags.count("command_timeout_ms") != 0 &&
       !absl::SimpleAtoi(flags["command_timeout_ms"], &command_timeout_ms)) ||
      (flags.count("operation_timeout_ms") != 0 &&
       !absl::SimpleAtoi(flags["operation_timeout_ms"],
                         &operation_timeout_ms)) ||
      (flags.count("grant_wait_replicas") != 0 &&
       !absl::SimpleAtoi(flags["grant_wait_replicas"], &grant_wait_replicas))) {
    return Usage("a number does not parse");
  }
  const std::string pod = flags["pod"];
  int fd = open(flags["log"].c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) {
    std::perror("open log");
    return 2;
  }
  // Signals are taken by sigwait below, on this thread only (threads
  // started later inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto logger = spdlog::stderr_logger_mt("pod-" + pod);
  logger->set_level(spdlog::level::warn);
  setpoint::RedisNodeRegistryOptions registry_options{
      .address = flags["redis"], .ns = flags["ns"], .logger = logger};
  if (command_timeout_ms > 0) {
    registry_options.command_timeout = absl::Milliseconds(command_timeout_ms);
  }
  if (flags.count("sentinels") != 0) {
    registry_options.sentinels = absl::StrSplit(flags["sentinels"], ',');
    registry_options.master_name = flags["master"];
    registry_options.grant_wait_replicas = grant_wait_replicas;
  }
  auto registry = setpoint::RedisNodeRegistry::Create(registry_options);
  if (!registry.ok()) {
    std::fprintf(stderr, "%s\n", registry.status().ToString().c_str());
    return 2;
  }
  World world;
  const std::vector<std::pair<std::string, int64_t>> keys =
      KeysCoveringRing(ring);
  setpoint::ControllerKind work{
      .kind = "work",
      .count = nodes,
      .ring_size = ring,
      .build =
          [&world, ring, fd, &keys](setpoint::ControllerBuilder& b) {
            return BuildWorldController(b, &world, ring, fd, &keys);
          },
      .options = {.clock = setpoint::Clock::Monotonic(), .logger = logger},
  };
  setpoint::NodeKindOptions kind = work.ToNodeKind();
  kind.factory = [make = std::move(kind.factory),
                  fd](const setpoint::NodeInfo& info) {
    return std::make_unique<LoggedController>(make(info), info.id, fd);
  };
  // The pod's pools, as PodMain makes them (on the controllers' clock).
  setpoint::RunnerPool runners({.name = absl::StrCat(pod, "/runners"),
                                .threads = 4,
                                .clock = setpoint::Clock::Monotonic(),
                                .logger = logger});
  setpoint::LoopPool loops({.name = absl::StrCat(pod, "/loops"),
                            .clock = setpoint::Clock::Monotonic(),
                            .logger = logger});
  for (const absl::Status& s : {runners.Start(), loops.Start()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "chaos_pod: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  setpoint::NodeManagerOptions options{
      .pod_id = pod,
      .kinds = {std::move(kind)},
      .registry = registry->get(),
      .poll_interval = absl::Milliseconds(poll_ms),
      .lease = absl::Milliseconds(lease_ms),
      // valid_until is on the manager's clock, Clock::Monotonic():
      // steady_clock as UnixEpoch() + time_since_epoch, i.e. CLOCK_MONOTONIC
      // nanoseconds once converted with ToUnixNanos (offset in the S line).
      .on_lease_renewed =
          [fd](absl::Time valid_until) {
            Log(fd, absl::StrCat("R ", MonotonicNanos(), " ",
                                 absl::ToUnixNanos(valid_until)));
          },
      .loops = &loops,
      .runners = &runners,
      .clock = setpoint::Clock::Monotonic(),
      .logger = logger,
  };
  if (operation_timeout_ms > 0) {
    options.operation_timeout = absl::Milliseconds(operation_timeout_ms);
  }
  options.static_membership = flags["static_membership"] == "1";
  setpoint::NodeManager manager(std::move(options));

  // The offset is within (after - before) / 2 of the midpoint of two reads
  // around the manager's clock; the narrowest of a few tries (a loaded
  // machine may preempt the process between two reads).
  int64_t before = 0, offset = 0, width = INT64_MAX;
  for (int i = 0; i < 8 && width > 100'000; ++i) {
    const int64_t b = MonotonicNanos();
    const int64_t m = absl::ToUnixNanos(setpoint::Clock::Monotonic()->Now());
    const int64_t a = MonotonicNanos();
    if (a - b < width) {
      width = a - b;
      before = b;
      offset = m - (b + (a - b) / 2);
    }
  }
  Log(fd, absl::StrCat("S ", before, " ", pod, " ", getpid(), " ", nodes, " ",
                       ring, " ", lease_ms, " ", poll_ms, " ", offset));
  if (absl::Status s = manager.Start(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  Log(fd, absl::StrCat("T ", MonotonicNanos(), " ", sig));
  manager.Stop();
  Log(fd, absl::StrCat("X ", MonotonicNanos()));
  close(fd);
  return 0;
}
