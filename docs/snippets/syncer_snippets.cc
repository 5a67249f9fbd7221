// The C++ snippets of docs/syncer.md, compiled (and the test run) by
// doc_snippets_test, which also checks that the doc shows them as they are
// here. Between "clang-format off" and "on" the text is the doc's, layout
// included; edit both together. The types come from the examples/replicas
// controller.

#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "replicas/runtime.h"
#include "setpoint/base/context.h"
#include "setpoint/base/status.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/source.h"
#include "setpoint/processor/store.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/fake_client.h"
#include "setpoint/testing/null_logger.h"
#include "spdlog/logger.h"

namespace syncer_snippets {

using replicas::Container;
using replicas::FakeRuntime;

struct ContainerSpec {
  std::string image;
  bool operator==(const ContainerSpec&) const = default;
};

bool ImageDiffers(const ContainerSpec& want, const Container& seen) {
  return want.image != seen.image;
}

// The client of examples/replicas/main.cc, shortened.
class RuntimeClient
    : public setpoint::SyncerClient<std::string, ContainerSpec, Container> {
 public:
  RuntimeClient(FakeRuntime* runtime, std::shared_ptr<spdlog::logger> logger)
      : runtime_(runtime), logger_(std::move(logger)) {}
  absl::Status Create(const setpoint::Context& ctx, const std::string& name,
                      const ContainerSpec& want) override {
    return runtime_->Create(ctx, name, want.image);
  }
  absl::Status Update(const setpoint::Context& ctx, const std::string& name,
                      const ContainerSpec& want, const Container&) override {
    return runtime_->Update(ctx, name, want.image);
  }
  absl::Status Delete(const setpoint::Context& ctx, const std::string& name,
                      const Container&) override {
    return runtime_->Delete(ctx, name);
  }

 private:
  FakeRuntime* const runtime_;
  const std::shared_ptr<spdlog::logger> logger_;
};

// ## The model
absl::Status SyncerSnippet(setpoint::Runner& runner, FakeRuntime& runtime,
                           setpoint::Store<std::string, Container>& containers,
                           std::shared_ptr<spdlog::logger> logger) {
  // clang-format off
RuntimeClient client(&runtime, logger);
setpoint::Syncer<std::string, ContainerSpec, Container> syncer(
    &runner, &client,
    {.name = "containers",
     .needs_update = [](const ContainerSpec& want, const Container& seen) {
       return want.image != seen.image;
     },
     .max_in_flight = 4});
syncer.ObserveFrom(&containers);  // observed state and its sync
SETPOINT_RETURN_IF_ERROR(syncer.Start());  // updater threads "sp-updater"
  // clang-format on
  syncer.Stop();
  return absl::OkStatus();
}

// The client as the doc declares it.
namespace declared {
// clang-format off
class RuntimeClient
    : public setpoint::SyncerClient<std::string, ContainerSpec, Container> {
 public:
  absl::Status Create(const setpoint::Context& ctx, const std::string& name,
                      const ContainerSpec& want) override;
  absl::Status Update(const setpoint::Context& ctx, const std::string& name,
                      const ContainerSpec& want, const Container& seen) override;
  absl::Status Delete(const setpoint::Context& ctx, const std::string& name,
                      const Container& seen) override;
};
// clang-format on
}  // namespace declared

// ## Status and counters
bool StatusSnippet(
    setpoint::Runner& runner,
    setpoint::Syncer<std::string, ContainerSpec, Container>& syncer) {
  // clang-format off
auto status = runner.PostAndWait(
    setpoint::Context(), [&] { return syncer.StatusSnapshot(); });
bool done = status.ok() && status->in_sync &&
            status->converged == status->keys;
  // clang-format on
  return done;
}

// ## Testing your syncer
// clang-format off
using setpoint::testing::AwaitCondition;
using setpoint::testing::FakeClient;
using setpoint::testing::NullLogger;

TEST(ContainerSyncerTest, RetriesAndConverges) {
  setpoint::Runner runner({.logger = NullLogger()});
  setpoint::Store<std::string, Container> observed({.logger = NullLogger()});
  setpoint::PushSource<std::string, Container> watch(&runner, &observed);
  FakeClient<std::string, ContainerSpec, Container> fake({
      .to_observed = [](const std::string&, const ContainerSpec& want) {
        return Container{.image = want.image};
      },
      .watcher = [&](const std::string& key,
                     const std::optional<Container>& c) {
        c.has_value() ? watch.Set(key, *c) : watch.Delete(key);
      },
  });
  setpoint::Syncer<std::string, ContainerSpec, Container> syncer(
      &runner, &fake,
      {.needs_update = ImageDiffers,
       .backoff = {.initial = absl::Milliseconds(1)},  // fast retries
       .logger = NullLogger()});
  syncer.ObserveFrom(&observed);
  syncer.MarkDesiredComplete();  // no transformer in this test
  watch.Replace({});             // the world starts empty, and complete
  ASSERT_TRUE(syncer.Start().ok());
  ASSERT_TRUE(runner.Start().ok());

  fake.FailNextFor("web-0", 2);  // two kUnavailable, then success
  ASSERT_TRUE(runner.PostAndWait(setpoint::Context(), [&] {
    syncer.SetDesired("web-0", {.image = "nginx:1.25"});
  }).ok());
  ASSERT_TRUE(AwaitCondition([&] {
    auto s = runner.PostAndWait(setpoint::Context(),
                                [&] { return syncer.StatusSnapshot(); });
    return s.ok() && s->keys == 1 && s->converged == 1;
  }));
  EXPECT_EQ(fake.CallsFor("web-0", setpoint::SyncOp::kCreate), 3);
  EXPECT_EQ(fake.stats().max_concurrent_per_key, 1);
  EXPECT_EQ(syncer.stats().failures, 2);
  syncer.Stop();
  runner.Stop();
}
// clang-format on

// ---- Batch clients
// -----------------------------------------------------------

struct Record {
  std::string type;
  std::string content;
  bool operator==(const Record&) const = default;
};

// A zone's API that takes many changes per request (in memory here).
class ZoneApi {
 public:
  struct Change {
    std::string name;
    bool remove = false;
    Record record;
  };
  absl::Status Patch(const setpoint::Context&,
                     const std::vector<Change>& changes) {
    ++requests;
    for (const Change& c : changes) {
      if (c.remove) {
        zone.erase(c.name);
      } else {
        zone[c.name] = c.record;
      }
    }
    return absl::OkStatus();
  }
  std::map<std::string, Record> zone;
  int requests = 0;
};

// clang-format off
// Applies many records' changes in one request of the zone's API.
class ZoneClient
    : public setpoint::BatchSyncerClient<std::string, Record, Record> {
 public:
  explicit ZoneClient(ZoneApi* api) : api_(api) {}
  absl::Status Apply(
      const setpoint::Context& ctx,
      std::span<setpoint::SyncOperation<std::string, Record, Record>> ops)
      override {
    std::vector<ZoneApi::Change> changes;
    for (const auto& op : ops) {
      changes.push_back({.name = *op.key,
                         .remove = op.op == setpoint::SyncOp::kDelete,
                         .record = op.desired != nullptr ? *op.desired
                                                         : Record{}});
    }
    // One request. An error fails every operation of the batch with it;
    // set op.status instead where the API reports a change of its own.
    return api_->Patch(ctx, changes);
  }

 private:
  ZoneApi* const api_;
};
// clang-format on

TEST(ZoneClientTest, OneRequestForManyRecords) {
  setpoint::Runner runner({.logger = setpoint::testing::NullLogger()});
  ZoneApi api;
  ZoneClient client(&api);
  setpoint::Syncer<std::string, Record, Record> syncer(
      &runner, &client,
      {.batch_delay = absl::ZeroDuration(),
       .manual_updates = true,
       .logger = setpoint::testing::NullLogger()});
  syncer.MarkDesiredComplete();
  ASSERT_TRUE(syncer.Start().ok());
  for (int i = 0; i < 50; ++i) {
    syncer.SetDesired("www" + std::to_string(i), {"A", "192.0.2.1"});
  }
  runner.RunUntilIdle();
  syncer.RunUntilIdle();
  runner.RunUntilIdle();
  EXPECT_EQ(api.zone.size(), 50u);
  EXPECT_EQ(api.requests, 1);
  syncer.Stop();
  runner.RunUntilIdle();
}

}  // namespace syncer_snippets
