// The C++ snippets of docs/controller.md that are not quoted from the
// sharded example, compiled by doc_snippets_test, which also checks that
// the doc shows them as they are here. Between "clang-format off" and "on"
// the text is the doc's, layout included; edit both together. The types
// come from the sharded example; the watchable API is the testing kit's
// FakeWatchWorld, the way a test of a watch would use it.

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/base/status.h"
#include "setpoint/controller/controller.h"
#include "setpoint/controller/pod_sources.h"
#include "setpoint/planner/plan.h"
#include "setpoint/processor/watch.h"
#include "setpoint/testing/controller_harness.h"
#include "setpoint/testing/fake_watch_world.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "sharded/records_api.h"
#include "sharded/records_controller.h"

namespace controller_snippets {

using setpoint::Context;
using sharded::Record;
using sharded::RecordClient;
using sharded::Records;

// A watchable DNS API, as the doc imagines it: changes after a revision.
struct Change {
  std::string name;
  std::optional<Record> record;  // nullopt: deleted.
};
struct ChangePage {
  bool gone = false;  // The revision is older than the server keeps.
  std::vector<Change> changes;
  std::string revision;
};
class WatchableApi {
 public:
  virtual ~WatchableApi() = default;
  virtual absl::StatusOr<setpoint::WatchList<std::string, Record>> ListAll(
      const Context& ctx) = 0;
  // Waits (until ctx's deadline) for changes after `revision`.
  virtual absl::StatusOr<ChangePage> Changes(const Context& ctx,
                                             const std::string& revision) = 0;
};

// ## Watching instead of polling
// clang-format off
class ZoneStream : public setpoint::WatchStream<std::string, Record> {
 public:
  ZoneStream(WatchableApi* api, std::string revision)
      : api_(api), revision_(std::move(revision)) {}
  absl::StatusOr<setpoint::WatchBatch<std::string, Record>> Next(
      const Context& ctx) override {
    SETPOINT_ASSIGN_OR_RETURN(ChangePage page, api_->Changes(ctx, revision_));
    if (page.gone) return setpoint::WatchExpiredError("zone at " + revision_);
    setpoint::WatchBatch<std::string, Record> batch{.token = page.revision};
    for (Change& c : page.changes) {
      batch.events.push_back({c.name, std::move(c.record)});
    }
    revision_ = page.revision;
    return batch;
  }

 private:
  WatchableApi* api_;
  std::string revision_;
};
// clang-format on

setpoint::Store<std::string, Record>* WatchSnippet(
    setpoint::ControllerBuilder& b, WatchableApi* api) {
  // clang-format off
auto* seen = b.Watch<std::string, Record>(
    "seen", [api](const Context& ctx) { return api->ListAll(ctx); },
    [api](const Context&, const std::string& revision)
        -> absl::StatusOr<std::unique_ptr<setpoint::WatchStream<std::string, Record>>> {
      return std::make_unique<ZoneStream>(api, revision);
    },
    {.idle_timeout = absl::Seconds(60)});
  // clang-format on
  return seen;
}

// ## Sharing a source between a pod's nodes
setpoint::Store<std::string, Record>* SharedWatchSnippet(
    setpoint::ControllerBuilder& b, WatchableApi* api) {
  // clang-format off
auto* seen = b.SharedWatch<std::string, Record>(
    "seen", [api](const Context& ctx) { return api->ListAll(ctx); },
    [api](const Context&, const std::string& revision)
        -> absl::StatusOr<std::unique_ptr<setpoint::WatchStream<std::string, Record>>> {
      return std::make_unique<ZoneStream>(api, revision);
    });
  // clang-format on
  return seen;
}

// ## Plans that read their own writes
void ReaderSnippet(setpoint::ControllerBuilder& b, sharded::RecordsApi* api) {
  // clang-format off
auto* zone = b.SharedPoll<std::string, Record>(
    "zone", [api](const Context& ctx) { return api->List(ctx); },
    {.interval = absl::Seconds(5)});
setpoint::SourceReader<std::string, Record> reader = b.Reader(zone);
b.Reconcile(setpoint::MakePlan(
    "zone serial",
    [api, reader](const Context& ctx) -> absl::StatusOr<setpoint::Procedures> {
      // A list that began after now: it shows the last round's writes.
      SETPOINT_RETURN_IF_ERROR(reader.AwaitFresh(ctx));
      SETPOINT_ASSIGN_OR_RETURN(Records now, reader.Snapshot());
      auto n = static_cast<int64_t>(now.size());
      if (api->serial() == n) return setpoint::Procedures{};
      return setpoint::ProcedureList(setpoint::MakeProcedure(
          "publish serial",
          [api, n](const Context& step) -> absl::StatusOr<setpoint::Procedures> {
            SETPOINT_RETURN_IF_ERROR(api->PublishSerial(step, n));
            return setpoint::Procedures{};
          }));
    }));
  // clang-format on
}

// ## Testing it: watches and nodes of one pod
void TestingSnippet(setpoint::ControllerBuildFn build,
                    setpoint::testing::SimulatedClock& clock) {
  // clang-format off
setpoint::testing::FakeWatchWorld<std::string, Record> world;
world.Set("www", Record{"10.0.0.1"});
// ... build watches it: world.List(ctx) and world.Watch(ctx, token).
auto pod = std::make_shared<setpoint::PodSources>();  // two nodes, one pod
setpoint::testing::ControllerHarness a(
    build, {.clock = &clock, .node = {.id = "pod/records/0", .kind = "records"},
            .pod_sources = pod});
setpoint::testing::ControllerHarness b(
    build, {.clock = &clock, .node = {.id = "pod/records/1", .kind = "records"},
            .pod_sources = pod});
world.Disconnect();     // open streams break: the source resumes from its token
world.Compact();        // older tokens expire: the source lists again
world.ExpireStreams();  // ...also under an open stream
world.Bookmark();       // a quiet stream's token moves on
                     // clang-format on
}

}  // namespace controller_snippets
