// sharded: a controller whose nodes split the records of a DNS zone
// between them, plus a leader-only plan, built with setpoint::Controller.
//
//   sharded --demo                  # three pods in one process, a handoff
//   sharded                         # one pod, in-memory registry
//   sharded --pod_id=a --registry.type=redis --registry.address=127.0.0.1:6379
//
// The controller itself is records_controller.h; the fake DNS API (which
// checks fencing tokens) is records_api.h. Without --demo this is a pod
// run by setpoint::PodMain: --help lists the flags; exit codes 0 done,
// 1 failed, 2 bad configuration.

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "records_api.h"
#include "records_controller.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/pod/pod_main.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "spdlog/spdlog.h"

namespace sharded {
namespace {

void Fill(Catalog& catalog, int from, int to, const char* prefix) {
  for (int i = from; i < to; ++i) {
    catalog.Set(absl::StrFormat("host-%04d.example.com", i),
                Record{absl::StrFormat("%s.%d.%d", prefix, i / 250, i % 250)});
  }
}

// Polls `done` every 20 ms for up to `limit`; returns whether it held.
bool WaitFor(const std::function<bool()>& done, absl::Duration limit) {
  absl::Time until = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

struct Fleet {
  std::vector<std::unique_ptr<setpoint::NodeManager>> pods;

  // Every live records node works on shards and one zone node leads.
  bool Shaped() const {
    int leaders = 0;
    uint32_t covered = 0;
    for (const auto& pod : pods) {
      if (pod == nullptr) continue;
      for (const setpoint::NodeState& n : pod->Nodes()) {
        if (n.kind == "zone") leaders += n.active.range.Empty() ? 0 : 1;
        if (n.kind == "records") covered += n.active.range.size();
      }
    }
    return leaders == 1 && covered == setpoint::kDefaultRingSize;
  }
  void Print() const {
    for (const auto& pod : pods) {
      if (pod == nullptr) continue;
      for (const setpoint::NodeState& n : pod->Nodes()) {
        std::printf(
            "    %-18s %-13s token %llu%s\n", n.id.c_str(),
            n.active.range.ToString().c_str(),
            static_cast<unsigned long long>(n.active.token),
            n.kind == "zone" && !n.active.range.Empty() ? "  (leader)" : "");
      }
    }
  }
};

int Demo(int records) {
  spdlog::set_level(spdlog::level::err);  // Retries of injected errors.
  RecordsApi api;
  Catalog catalog;
  RecordClient client(&api);
  Fill(catalog, 0, records, "10.0");
  setpoint::InMemoryNodeRegistry registry;
  std::vector<setpoint::NodeKindOptions> kinds = {
      RecordsKind(&api, &catalog, &client).ToNodeKind(),
      ZoneKind(&api).ToNodeKind()};
  Fleet fleet;
  for (const char* id : {"pod-a", "pod-b", "pod-c"}) {
    fleet.pods.push_back(std::make_unique<setpoint::NodeManager>(
        setpoint::NodeManagerOptions{.pod_id = id,
                                     .kinds = kinds,
                                     .registry = &registry,
                                     .poll_interval = absl::Milliseconds(100),
                                     .lease = absl::Seconds(1)}));
    if (absl::Status s = fleet.pods.back()->Start(); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  auto converged = [&] {
    return api.records() == catalog.Get() &&
           api.serial() == static_cast<int64_t>(catalog.Get().size());
  };
  auto step = [&](const char* what) {
    absl::Time start = absl::Now();
    bool ok = WaitFor([&] { return fleet.Shaped() && converged(); },
                      absl::Seconds(60));
    RecordsApiStats s = api.stats();
    std::printf(
        "%s: %s in %s (records %zu, serial %lld, writes %lld, "
        "injected 503/429 %lld)\n",
        what, ok ? "converged" : "NOT converged",
        absl::FormatDuration(
            absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))
            .c_str(),
        api.records().size(), static_cast<long long>(api.serial()),
        static_cast<long long>(s.writes),
        static_cast<long long>(s.injected_errors));
    return ok;
  };

  std::printf("3 pods x (2 records nodes + 1 zone node) share the ring:\n");
  bool ok = step("initial sync");
  fleet.Print();

  Fill(catalog, records, records + 50, "10.1");  // 50 new records
  Fill(catalog, 0, 20, "10.2");                  // 20 new addresses
  for (int i = 20; i < 30; ++i) {
    catalog.Remove(absl::StrFormat("host-%04d.example.com", i));
  }
  ok = step("catalog changed (+50, ~20, -10)") && ok;

  // Stop the pod that leads: its shards and the leadership move at once.
  size_t leader = 0;
  for (size_t i = 0; i < fleet.pods.size(); ++i) {
    for (const setpoint::NodeState& n : fleet.pods[i]->Nodes()) {
      if (n.kind == "zone" && !n.active.range.Empty()) leader = i;
    }
  }
  std::printf("stopping %s (the leader): it hands its shards over\n",
              fleet.pods[leader]->pod_id().c_str());
  fleet.pods[leader]->Stop();
  int64_t refused = fleet.pods[leader]->stats().update_failures;
  fleet.pods[leader].reset();
  Fill(catalog, records + 50, records + 80, "10.3");
  ok = step("after the handoff (+30)") && ok;
  fleet.Print();

  for (auto& pod : fleet.pods) {
    if (pod == nullptr) continue;
    pod->Stop();
    refused += pod->stats().update_failures;
  }
  RecordsApiStats s = api.stats();
  std::printf(
      "writes refused: stale token %lld, not the owner %lld; "
      "most calls at once for one record: %lld\n",
      static_cast<long long>(s.stale_refused),
      static_cast<long long>(s.unowned_refused),
      static_cast<long long>(s.max_concurrent_per_key));
  std::printf("handoffs a node could not finish in time: %lld\n",
              static_cast<long long>(refused));
  ok = ok && s.unowned_refused == 0 && s.max_concurrent_per_key <= 1;
  std::printf("%s\n", ok ? "demo: OK" : "demo: FAILED");
  return ok ? 0 : 1;
}

// A pod of the controller: PodMain reads flags and YAML, makes the
// registry, handles signals and exit codes. Each pod has its own fake API,
// so with several pods each converges the records of its own shards.
int Pod(int argc, char** argv) {
  RecordsApi api;
  Catalog catalog;
  RecordClient client(&api);
  int records = 1000;
  return setpoint::PodMain(
      argc, argv,
      {.program = "sharded",
       .description = "Keeps the records of a zone on a fake DNS API; the "
                      "nodes of kind records split them, one zone node "
                      "leads. --demo runs three pods in one process.",
       .kinds = {RecordsKind(&api, &catalog, &client).ToNodeKind(),
                 ZoneKind(&api).ToNodeKind()},
       .flags = {{.name = "records",
                  .help = "records in the catalog (default 1000)",
                  .set =
                      [&](std::string_view v) {
                        if (!absl::SimpleAtoi(
                                absl::string_view(v.data(), v.size()),
                                &records) ||
                            records < 0) {
                          return absl::InvalidArgumentError("not a count");
                        }
                        return absl::OkStatus();
                      }}},
       .on_started = [&](setpoint::NodeManager&) {
         Fill(catalog, 0, records, "10.0");
       }});
}

}  // namespace
}  // namespace sharded

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) != "--demo") continue;
    int records = 1000;
    for (int j = 1; j < argc; ++j) {
      std::string arg = argv[j];
      if (arg.rfind("--records=", 0) == 0 &&
          !absl::SimpleAtoi(arg.substr(10), &records)) {
        std::fprintf(stderr, "bad --records: %s\n", arg.c_str());
        return 2;
      }
    }
    return sharded::Demo(records);
  }
  return sharded::Pod(argc, argv);
}
