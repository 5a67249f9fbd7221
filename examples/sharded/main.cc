// sharded: several pods share the work of one controller through a
// NodeRegistry. Each pod runs a NodeManager with nodes of kind "jobs"; the
// ring of shards is split between all live nodes of all pods, and a node
// works only on the jobs whose key falls in its shard range.
//
//   sharded --kinds.jobs.count=2                      # one pod, no Redis
//   sharded --pod_id=a --registry.type=redis --registry.address=127.0.0.1:6379
//   sharded --config=pod.yaml --duration=30s
//
// Every node reports its range, its fencing token and how many of the 1,000
// jobs it owns. Kill a pod (Ctrl-C hands its shards over at once; kill -9
// makes the others wait for its lease) and watch the others take over.
// Flags are the PodConfig keys (--lease=3s, --poll_interval=500ms, ...) plus
// --config=<yaml>, --duration=<d> (0: until Ctrl-C) and --jobs=<n>.
// Exit codes: 0 done, 2 bad configuration.

#include <signal.h>

#include <cstdio>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/context.h"
#include "setpoint/base/format.h"
#include "setpoint/base/status.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/node/shard.h"
#include "setpoint/pod/pod_config.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "setpoint/registry/redis_node_registry.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace sharded {
namespace {

using Jobs = absl::flat_hash_map<std::string, int>;

// The "world": a fixed catalogue of jobs every pod can list.
Jobs Catalogue(int n) {
  Jobs jobs;
  for (int i = 0; i < n; ++i) jobs[absl::StrCat("job-", i)] = i;
  return jobs;
}

// One node: a Runner with a Store of the jobs in its range, fed by a
// PollingSource. UpdateShardRange re-scopes the source (the store forgets
// jobs that left the range) and returns once that is done on the runner.
class JobsNode : public setpoint::Node {
 public:
  JobsNode(const setpoint::NodeInfo& info, int jobs,
           std::shared_ptr<spdlog::logger> logger)
      : info_(info),
        logger_(std::move(logger)),
        runner_({.name = info.id, .logger = logger_}),
        store_({.name = "jobs", .logger = logger_}),
        source_(&runner_, &store_,
                [jobs](const setpoint::Context&) -> absl::StatusOr<Jobs> {
                  return Catalogue(jobs);
                },
                {.name = info.id,
                 .interval = absl::Seconds(1),
                 .logger = logger_}) {
    // Nothing is ours until the manager says so.
    source_.SetFilter([](const std::string&) { return false; });
    store_.AddSyncObserver([this](bool in_sync) {
      if (!in_sync) return;
      logger_->info("node={} range={} token={} jobs={}", info_.id, range_,
                    token_, store_.size());
    });
  }

  absl::Status Run(const setpoint::Context& ctx) override {
    SETPOINT_RETURN_IF_ERROR(runner_.Start());
    SETPOINT_RETURN_IF_ERROR(source_.Start());
    (void)ctx.Wait(absl::InfiniteDuration());  // Until the pod stops.
    source_.Stop();
    runner_.Stop();
    return absl::OkStatus();
  }

  void UpdateShardRange(const setpoint::Context&,
                        const setpoint::ShardAssignment& a) override {
    std::promise<void> done;
    uint32_t ring = info_.ring_size;
    absl::Status posted = runner_.Post(
        [&, ring] {
          range_ = a.range;
          token_ = a.token;
          source_.SetFilter([range = a.range, ring](const std::string& key) {
            return range.Contains(setpoint::ShardOf(key, ring));
          });
          done.set_value();
        },
        "update shard range");
    // Returning means: no work outside the new range any more.
    if (posted.ok()) done.get_future().wait();
  }

 private:
  const setpoint::NodeInfo info_;
  std::shared_ptr<spdlog::logger> logger_;
  setpoint::Runner runner_;
  setpoint::Store<std::string, int> store_;
  setpoint::PollingSource<std::string, int> source_;
  setpoint::ShardRange range_;  // Runner only.
  uint64_t token_ = 0;          // Runner only.
};

int Main(int argc, char** argv) {
  auto logger = spdlog::stdout_color_mt("sharded");
  logger->set_pattern("%H:%M:%S.%e %^%l%$ %v");
  std::string config_path;
  absl::Duration duration = absl::ZeroDuration();
  int jobs = 1000;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (absl::StartsWith(arg, "--config=")) {
      config_path = arg.substr(9);
    } else if (absl::StartsWith(arg, "--duration=")) {
      if (!absl::ParseDuration(arg.substr(11), &duration)) {
        std::fprintf(stderr, "bad --duration: %s\n", arg.c_str());
        return 2;
      }
    } else if (absl::StartsWith(arg, "--jobs=")) {
      if (!absl::SimpleAtoi(arg.substr(7), &jobs) || jobs < 0) {
        std::fprintf(stderr, "bad --jobs: %s\n", arg.c_str());
        return 2;
      }
    } else {
      overrides.push_back(arg);
    }
  }
  if (config_path.empty())
    overrides.insert(overrides.begin(), "--kinds.jobs.count=2");
  absl::StatusOr<setpoint::PodConfig> config =
      setpoint::LoadPodConfig(config_path, overrides);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(config.status().message()).c_str());
    return 2;
  }
  logger->info("config {}", config->ToString());

  // The registry: in memory (this process only) or Redis (many pods).
  std::unique_ptr<setpoint::NodeRegistry> registry;
  if (config->registry_type == "redis") {
    config->redis.logger = logger;
    auto redis = setpoint::RedisNodeRegistry::Create(config->redis);
    if (!redis.ok()) {
      std::fprintf(stderr, "%s\n", redis.status().ToString().c_str());
      return 2;
    }
    registry = std::move(*redis);
  } else {
    registry = std::make_unique<setpoint::InMemoryNodeRegistry>();
  }

  setpoint::NodeManagerOptions options = config->manager;
  options.registry = registry.get();
  options.logger = logger;
  for (auto& kind : options.kinds) {
    kind.factory = [jobs, logger](const setpoint::NodeInfo& info) {
      return std::make_unique<JobsNode>(info, jobs, logger);
    };
  }

  // Ctrl-C / SIGTERM: a graceful stop, taken by sigwait on this thread.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  setpoint::NodeManager manager(std::move(options));
  if (absl::Status s = manager.Start(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  if (duration > absl::ZeroDuration()) {
    timespec timeout = absl::ToTimespec(duration);
    sigtimedwait(&signals, nullptr, &timeout);
  } else {
    int sig = 0;
    sigwait(&signals, &sig);
  }
  logger->info("stopping: handing the shards over");
  manager.Stop();
  return 0;
}

}  // namespace
}  // namespace sharded

int main(int argc, char** argv) { return sharded::Main(argc, argv); }
