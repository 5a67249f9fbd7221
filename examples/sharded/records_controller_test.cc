// The sharded example's controller, tested on one thread with a simulated
// clock: no sleep, no wait on real time.
#include "records_controller.h"

#include <memory>

#include "gtest/gtest.h"
#include "records_api.h"
#include "setpoint/controller/pod_sources.h"
#include "setpoint/testing/controller_harness.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"

namespace sharded {
namespace {

using setpoint::testing::ControllerHarness;
using setpoint::testing::SimulatedClock;

TEST(RecordsController, ConvergesOnItsShardsOnly) {
  SimulatedClock clock({.auto_advance = true});  // API latency: instant.
  FakeRecordsApi api;
  Catalog catalog;
  for (int i = 0; i < 100; ++i) {
    catalog.Set("host-" + std::to_string(i), Record{"10.0.0.1"});
  }
  RecordClient client(&api);
  ControllerHarness node(RecordsKind(&api, &catalog, &client).build,
                         {.clock = &clock,
                          .node = {.id = "pod/records/0", .kind = "records"},
                          .logger = setpoint::testing::NullLogger()});
  SETPOINT_ASSERT_OK(node.Start());
  node.Advance(absl::Seconds(10));
  EXPECT_TRUE(api.records().empty());  // No assignment: nothing written.

  SETPOINT_ASSERT_OK(node.Assign({0, 2048}, /*token=*/1));  // Half the ring.
  node.Advance(absl::Seconds(10));
  for (const auto& [name, record] : catalog.Get()) {
    bool ours = setpoint::ShardOf(name) < 2048;
    EXPECT_EQ(api.records().contains(name), ours) << name;
  }
  EXPECT_EQ(api.stats().unowned_refused, 0);
}

// Two nodes of one pod share the API's list: one list per interval for
// both, each node syncing only its half.
TEST(RecordsController, APodsNodesShareOneListOfTheZone) {
  SimulatedClock clock({.auto_advance = true});
  FakeRecordsApi api;
  Catalog catalog;
  for (int i = 0; i < 100; ++i) {
    catalog.Set("host-" + std::to_string(i), Record{"10.0.0.1"});
  }
  RecordClient client(&api);
  auto pod = std::make_shared<setpoint::PodSources>();
  auto quiet = setpoint::testing::NullLogger();
  ControllerHarness a(RecordsKind(&api, &catalog, &client).build,
                      {.clock = &clock,
                       .node = {.id = "pod/records/0", .kind = "records"},
                       .pod_sources = pod,
                       .logger = quiet});
  ControllerHarness b(RecordsKind(&api, &catalog, &client).build,
                      {.clock = &clock,
                       .node = {.id = "pod/records/1", .kind = "records"},
                       .pod_sources = pod,
                       .logger = quiet});
  SETPOINT_ASSERT_OK(a.Start());
  SETPOINT_ASSERT_OK(b.Start());
  SETPOINT_ASSERT_OK(a.Assign({0, 2048}, /*token=*/1));
  SETPOINT_ASSERT_OK(b.Assign({2048, 4096}, /*token=*/1));
  const int64_t lists = api.stats().lists;
  for (int i = 0; i < 20; ++i) {  // 10 s: 20 intervals.
    a.Advance(absl::Milliseconds(250));
    b.Advance(absl::Milliseconds(250));
  }
  EXPECT_EQ(api.records(), catalog.Get());
  EXPECT_LE(api.stats().lists - lists, 21);  // Not 40: one per interval.
  EXPECT_EQ(api.stats().unowned_refused, 0);
}

TEST(RecordsController, TheLeaderPublishesTheSerialAndHandsItOver) {
  SimulatedClock clock({.auto_advance = true});
  FakeRecordsApi api;
  Catalog catalog;
  for (int i = 0; i < 20; ++i) {
    catalog.Set("host-" + std::to_string(i), Record{"10.0.0.2"});
  }
  RecordClient client(&api);
  auto quiet = setpoint::testing::NullLogger();
  ControllerHarness records(RecordsKind(&api, &catalog, &client).build,
                            {.clock = &clock,
                             .node = {.id = "a/records/0", .kind = "records"},
                             .logger = quiet});
  setpoint::NodeInfo zone{.id = "a/zone/0", .kind = "zone", .ring_size = 1};
  ControllerHarness leader(ZoneKind(&api).build,
                           {.clock = &clock, .node = zone, .logger = quiet});
  zone.id = "b/zone/0";
  ControllerHarness next(ZoneKind(&api).build,
                         {.clock = &clock, .node = zone, .logger = quiet});
  for (ControllerHarness* h : {&records, &leader, &next})
    SETPOINT_ASSERT_OK(h->Start());
  SETPOINT_ASSERT_OK(records.Assign({0, setpoint::kDefaultRingSize}, 1));
  SETPOINT_ASSERT_OK(leader.Assign({0, 1}, /*token=*/1));
  for (int i = 0; i < 10; ++i) {
    records.Advance(absl::Milliseconds(500));
    leader.Advance(absl::Milliseconds(500));
    next.Advance(absl::Milliseconds(500));
  }
  EXPECT_EQ(api.serial(), 20);
  // Leadership moves: the old leader stops before the new one starts.
  SETPOINT_ASSERT_OK(leader.Assign({}, 1));
  SETPOINT_ASSERT_OK(next.Assign({0, 1}, /*token=*/2));
  catalog.Set("host-new", Record{"10.0.0.3"});
  for (int i = 0; i < 10; ++i) {
    records.Advance(absl::Milliseconds(500));
    leader.Advance(absl::Milliseconds(500));
    next.Advance(absl::Milliseconds(500));
  }
  EXPECT_EQ(api.serial(), 21);
  EXPECT_EQ(api.stats().stale_refused, 0);
  EXPECT_EQ(api.stats().unowned_refused, 0);
}

}  // namespace
}  // namespace sharded
