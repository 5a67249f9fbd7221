// sharded: a controller whose nodes split the records of a DNS zone
// between them, plus a leader-only plan, built with setpoint::Controller.
//
//   sharded --demo                  # three pods in one process, a handoff
//   sharded                         # one pod, in-memory registry
//   sharded --pod_id=a --registry.type=redis --registry.address=127.0.0.1:6379
//   sharded ... --api=http://127.0.0.1:8080   # one records API service
//
// The controller itself is records_controller.h; the fake DNS API (which
// checks fencing tokens) is records_api.h, its HTTP client
// records_http_client.h. Without --demo this is a pod
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
#include "records_http_client.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/pod/pod_main.h"
#include "setpoint/registry/in_memory_node_registry.h"
#include "spdlog/spdlog.h"

namespace sharded {
namespace {

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
  FakeRecordsApi api;
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
        "injected 503/429 %lld, zone lists %lld)\n",
        what, ok ? "converged" : "NOT converged",
        absl::FormatDuration(
            absl::Trunc(absl::Now() - start, absl::Milliseconds(1)))
            .c_str(),
        api.records().size(), static_cast<long long>(api.serial()),
        static_cast<long long>(s.writes),
        static_cast<long long>(s.injected_errors),
        static_cast<long long>(s.lists));
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

// The API the pod's controller talks to: the in-process fake, or the
// records API service once --api names it (flags are read inside PodMain,
// after the kinds were made).
class ChosenApi final : public RecordsApi {
 public:
  absl::StatusOr<Records> List(const Context& ctx) override {
    return api()->List(ctx);
  }
  absl::Status Put(const Context& ctx, const std::string& name,
                   const Record& record) override {
    return api()->Put(ctx, name, record);
  }
  absl::Status Delete(const Context& ctx, const std::string& name) override {
    return api()->Delete(ctx, name);
  }
  absl::Status PublishSerial(const Context& ctx, int64_t serial) override {
    return api()->PublishSerial(ctx, serial);
  }
  int64_t serial() const override { return api()->serial(); }

  // Before the manager starts: makes the HTTP client for `http` (none
  // while its url is empty).
  absl::Status Configure() {
    if (http.url.empty()) return absl::OkStatus();
    SETPOINT_ASSIGN_OR_RETURN(remote_, HttpRecordsApi::Create(http));
    return absl::OkStatus();
  }
  HttpRecordsApiOptions http;

 private:
  RecordsApi* api() const {
    if (remote_ != nullptr) return remote_.get();
    return &fake_;
  }
  std::unique_ptr<HttpRecordsApi> remote_;
  mutable FakeRecordsApi fake_;
};

absl::Status ParseDurationFlag(std::string_view v, absl::Duration* out) {
  if (!absl::ParseDuration(absl::string_view(v.data(), v.size()), out) ||
      *out < absl::ZeroDuration() || *out == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("not a duration (600ms, 2s)");
  }
  return absl::OkStatus();
}

// A pod of the controller: PodMain reads flags and YAML, makes the
// registry, handles signals and exit codes. By default each pod has its
// own fake API, so with several pods each converges the records of its own
// shards; with --api=http://host:port they all write to one records API
// service (records_api_server).
int Pod(int argc, char** argv) {
  ChosenApi api;
  Catalog catalog;
  RecordClient client(&api);
  int records = 1000;
  Churn churn;
  auto count = [](std::string_view v, int* out) {
    if (!absl::SimpleAtoi(absl::string_view(v.data(), v.size()), out) ||
        *out < 0) {
      return absl::InvalidArgumentError("not a count");
    }
    return absl::OkStatus();
  };
  std::vector<setpoint::PodFlag> flags = {
      {.name = "records",
       .help = "records in the catalog (default 1000)",
       .set = [&](std::string_view v) { return count(v, &records); }},
      {.name = "api",
       .help = "http://<host>:<port> of a records API service "
               "(records_api_server); default: an in-process fake",
       .set =
           [&](std::string_view v) {
             api.http.url = std::string(v);
             if (api.http.url.empty()) {
               return absl::InvalidArgumentError("expected http://host:port");
             }
             return api.Configure();
           }},
      {.name = "api_think",
       .help = "with --api: pause between a write's read and its send "
               "(default 0)",
       .set =
           [&](std::string_view v) {
             SETPOINT_RETURN_IF_ERROR(ParseDurationFlag(v, &api.http.think));
             return api.Configure();
           }},
      {.name = "churn",
       .help = "every record gets a new address this often (default 0: "
               "never)",
       .set =
           [&](std::string_view v) {
             return ParseDurationFlag(v, &churn.period);
           }},
      {.name = "churn_until",
       .help = "the addresses stop changing at this time, in milliseconds "
               "since the Unix epoch (default: never)",
       .set =
           [&](std::string_view v) {
             int64_t ms = 0;
             if (!absl::SimpleAtoi(absl::string_view(v.data(), v.size()),
                                   &ms) ||
                 ms < 0) {
               return absl::InvalidArgumentError("not a time in ms");
             }
             churn.until = absl::FromUnixMillis(ms);
             return absl::OkStatus();
           }},
  };
  return setpoint::PodMain(
      argc, argv,
      {.program = "sharded",
       .description = "Keeps the records of a zone on a fake DNS API (or a "
                      "records API service with --api); the nodes of kind "
                      "records split them, one zone node leads. --demo runs "
                      "three pods in one process.",
       .kinds = {RecordsKind(&api, &catalog, &client).ToNodeKind(),
                 ZoneKind(&api).ToNodeKind()},
       .flags = std::move(flags),
       .on_started = [&](setpoint::NodeManager&) {
         Fill(catalog, 0, records, "10.0");
         catalog.SetChurn(churn);
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
