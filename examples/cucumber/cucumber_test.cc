// Tests of the cucumber example: the request parser, the simulated cloud and
// the plan converging from every start state under injected failures. Time
// is a SimulatedClock with auto_advance, so latency, DNS propagation and
// retry backoff cost no real time; every random choice is seeded.

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <stop_token>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "cucumber/cloud.h"
#include "cucumber/console.h"
#include "cucumber/cucumber_plan.h"
#include "cucumber/request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/base/context.h"
#include "setpoint/planner/reconcile_loop.h"
#include "setpoint/planner/scheduler.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"
#include "setpoint/testing/status_matchers.h"
#include "spdlog/spdlog.h"

namespace cucumber {
namespace {

using setpoint::Context;
using setpoint::ExecutionReport;
using setpoint::testing::IsOk;
using setpoint::testing::SimulatedClock;
using setpoint::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

const ClusterRequest kDemo{
    .name = "demo", .nodes_num = 3, .dns_name = "demo.example.com"};

// ---- Request ----------------------------------------------------------------

TEST(RequestTest, ParsesAValidRequest) {
  SETPOINT_ASSERT_OK_AND_ASSIGN(
      ClusterRequest r,
      ParseClusterRequest(
          "name: demo\nnodes_num: 3\ndns_name: demo.example.com\n"));
  EXPECT_EQ(r, kDemo);
}

TEST(RequestTest, NormalizesTheDnsName) {
  SETPOINT_ASSERT_OK_AND_ASSIGN(
      ClusterRequest r,
      ParseClusterRequest(
          "name: web-1\nnodes_num: 0\ndns_name: Web.Example.COM.\n"));
  EXPECT_EQ(r.dns_name, "web.example.com");
  EXPECT_EQ(r.nodes_num, 0);
}

struct BadRequest {
  std::string yaml;
  std::string message;  // Expected in the error.
};

class BadRequestTest : public ::testing::TestWithParam<BadRequest> {};

TEST_P(BadRequestTest, IsRefusedNamingTheField) {
  absl::StatusOr<ClusterRequest> r =
      ParseClusterRequest(GetParam().yaml, "test.yaml");
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr(GetParam().message)));
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kInvalidArgument,
                          HasSubstr("parse request test.yaml: ")));
}

constexpr char kTail[] = "dns_name: demo.example.com\n";

INSTANTIATE_TEST_SUITE_P(
    Cases, BadRequestTest,
    ::testing::Values(
        BadRequest{std::string("nodes_num: 3\n") + kTail, "name is missing"},
        BadRequest{"name: demo\ndns_name: a.example.com\n",
                   "nodes_num is missing"},
        BadRequest{"name: demo\nnodes_num: 3\n", "dns_name is missing"},
        BadRequest{std::string("name: demo\nnodes_num: three\n") + kTail,
                   "line 2: nodes_num must be an integer, got \"three\""},
        BadRequest{std::string("name: demo\nnodes_num: 2.5\n") + kTail,
                   "nodes_num must be an integer"},
        BadRequest{std::string("name: demo\nnodes_num: \"3\"\n") + kTail,
                   "nodes_num must be an integer, got the quoted string"},
        BadRequest{std::string("name: demo\nnodes_num: [3]\n") + kTail,
                   "nodes_num must be an integer, got a list"},
        BadRequest{std::string("name: demo\nnodes_num: -1\n") + kTail,
                   "nodes_num must be between 0 and 1000, got -1"},
        BadRequest{std::string("name: demo\nnodes_num: 1001\n") + kTail,
                   "nodes_num must be between 0 and 1000, got 1001"},
        BadRequest{
            std::string("name: demo\nnodes_num: 99999999999999999999\n") +
                kTail,
            "nodes_num must be between 0 and 1000"},
        BadRequest{std::string("name: Demo\nnodes_num: 3\n") + kTail,
                   "name \"Demo\" is invalid"},
        BadRequest{std::string("name: demo-\nnodes_num: 3\n") + kTail,
                   "ends with '-'"},
        BadRequest{std::string("name: {a: 1}\nnodes_num: 3\n") + kTail,
                   "name must be a string, got a mapping"},
        BadRequest{std::string("name:\nnodes_num: 3\n") + kTail,
                   "name has no value"},
        BadRequest{"name: demo\nnodes_num: 3\ndns_name: demo..example.com\n",
                   "dns_name \"demo..example.com\" is not a valid DNS name: "
                   "label 2 is empty"},
        BadRequest{"name: demo\nnodes_num: 3\ndns_name: localhost\n",
                   "dns_name \"localhost\" is not a valid DNS name: it needs "
                   "at least two labels"},
        BadRequest{"name: demo\nnodes_num: 3\ndns_name: -a.example.com\n",
                   "starts or ends with '-'"},
        BadRequest{"name: demo\nnodes_num: 3\ndns_name: a_b.example.com\n",
                   "label \"a_b\" contains \"_\""},
        BadRequest{"name: demo\nnodes_num: 3\ndns_name: 10.0.0.1\n",
                   "the last label is all digits"},
        BadRequest{"name: demo\nnodes_num: 3\ndns_name: " +
                       std::string(64, 'a') + ".example.com\n",
                   "label 1 is 64 characters"},
        BadRequest{std::string("name: demo\nnodes: 3\n") + kTail,
                   "line 2: unknown key \"nodes\""},
        BadRequest{
            std::string("name: demo\nname: other\nnodes_num: 3\n") + kTail,
            "line 2: duplicate key \"name\""},
        BadRequest{"name: [demo\nnodes_num: 3\n", "malformed YAML at line"},
        BadRequest{"- name: demo\n", "want a mapping"},
        BadRequest{"", "the document is empty"},
        BadRequest{"name: a\n---\nname: b\n", "want one YAML document, got 2"},
        BadRequest{"just text", "got a scalar"},
        BadRequest{std::string(5000, '['), "malformed YAML"}));

TEST(RequestTest, ReportsTheLineOfABadField) {
  EXPECT_THAT(
      ParseClusterRequest("# comment\nname: demo\n\nnodes_num: lots\n"
                          "dns_name: demo.example.com\n",
                          "cluster.yaml"),
      StatusIs(absl::StatusCode::kInvalidArgument,
               "parse request cluster.yaml: line 4: nodes_num must be an "
               "integer, got \"lots\""));
}

TEST(RequestTest, ValidatesRequestsFromFlags) {
  SETPOINT_EXPECT_OK(ValidateClusterRequest(kDemo));
  ClusterRequest r = kDemo;
  r.nodes_num = 5000;
  EXPECT_THAT(ValidateClusterRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "invalid request: nodes_num must be between 0 and "
                       "1000, got 5000"));
  r = kDemo;
  r.dns_name = "no spaces.example.com";
  EXPECT_THAT(NormalizeClusterRequest(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("dns_name \"no spaces.example.com\"")));
}

TEST(RequestTest, LoadsFiles) {
  std::string dir = ::testing::TempDir();
  std::string path = dir + "/cucumber_request_test.yaml";
  {
    std::ofstream f(path);
    f << "name: demo\nnodes_num: 3\ndns_name: demo.example.com\n";
  }
  SETPOINT_ASSERT_OK_AND_ASSIGN(ClusterRequest r, LoadClusterRequest(path));
  EXPECT_EQ(r, kDemo);
  std::remove(path.c_str());

  EXPECT_THAT(LoadClusterRequest(dir + "/does-not-exist.yaml"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no such file")));
  EXPECT_THAT(LoadClusterRequest(dir),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not a regular file")));
}

TEST(RequestTest, TheShippedExampleParses) {
  SETPOINT_ASSERT_OK_AND_ASSIGN(
      ClusterRequest r,
      LoadClusterRequest(std::string(CUCUMBER_SOURCE_DIR) + "/cluster.yaml"));
  EXPECT_EQ(r, kDemo);
}

// ---- Simulated cloud --------------------------------------------------------

class CloudTest : public ::testing::Test {
 protected:
  SimulatedClock clock_{{.auto_advance = true}};
  Context ctx_ = Context(std::stop_token(), &clock_);
};

TEST_F(CloudTest, DnsWritesBecomeVisibleAfterPropagation) {
  SimulatedCloud cloud({.clock = &clock_,
                        .latency = absl::Milliseconds(10),
                        .dns_propagation = absl::Seconds(1),
                        .logger = ::setpoint::testing::NullLogger()});
  SETPOINT_ASSERT_OK_AND_ASSIGN(
      DnsChange change,
      cloud.UpsertRecord(ctx_, "a.example.com", {"10.0.0.1"}));
  EXPECT_EQ(change.status, ChangeStatus::kPending);
  // Reads still show the old value (none) while the change propagates.
  EXPECT_THAT(cloud.GetRecord(ctx_, "a.example.com"),
              StatusIs(absl::StatusCode::kNotFound));
  SETPOINT_ASSERT_OK_AND_ASSIGN(DnsChange pending,
                                cloud.GetChange(ctx_, change.id));
  EXPECT_EQ(pending.status, ChangeStatus::kPending);

  clock_.AdvanceTime(absl::Seconds(1));
  SETPOINT_ASSERT_OK_AND_ASSIGN(DnsRecord record,
                                cloud.GetRecord(ctx_, "a.example.com"));
  EXPECT_THAT(record.addresses, ElementsAre("10.0.0.1"));
  SETPOINT_ASSERT_OK_AND_ASSIGN(DnsChange done,
                                cloud.GetChange(ctx_, change.id));
  EXPECT_EQ(done.status, ChangeStatus::kInSync);

  EXPECT_THAT(cloud.UpsertRecord(ctx_, "a.example.com", {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(cloud.UpsertRecord(ctx_, "a.example.com", {"10.0.0.300"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("not an IPv4 address")));
  EXPECT_THAT(cloud.GetChange(ctx_, "C9999"),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CloudTest, InjectsSeededErrorsAndCountsCalls) {
  auto run = [&](uint64_t seed) {
    SimulatedCloud cloud({.clock = &clock_,
                          .error_rate = 0.5,
                          .seed = seed,
                          .logger = ::setpoint::testing::NullLogger()});
    std::vector<bool> failed;
    for (int i = 0; i < 40; ++i) {
      absl::StatusOr<std::vector<Instance>> r =
          cloud.DescribeInstances(ctx_, kClusterTag, "demo");
      if (!r.ok()) {
        EXPECT_THAT(r, StatusIs(absl::StatusCode::kUnavailable,
                                "describe instances cucumber/cluster=demo: "
                                "503 service unavailable (injected)"));
      }
      failed.push_back(!r.ok());
    }
    CloudStats stats = cloud.stats();
    EXPECT_EQ(stats.describe_instances, 40);
    EXPECT_EQ(stats.calls(), 40);
    EXPECT_GT(stats.injected_errors, 5);
    EXPECT_LT(stats.injected_errors, 35);
    return failed;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST_F(CloudTest, FaultHooksActAtOnce) {
  SimulatedCloud cloud(
      {.clock = &clock_, .logger = ::setpoint::testing::NullLogger()});
  Instance a = cloud.InjectInstance({{kClusterTag, "demo"}});
  EXPECT_EQ(a.id, "i-0001");
  EXPECT_EQ(a.private_ip, "10.0.0.10");
  SETPOINT_EXPECT_OK(cloud.InjectLoseInstance(a.id));
  EXPECT_THAT(cloud.InjectLoseInstance(a.id),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(cloud.InjectLoseInstance("i-0042"),
              StatusIs(absl::StatusCode::kNotFound));
  SETPOINT_ASSERT_OK_AND_ASSIGN(
      auto all, cloud.DescribeInstances(ctx_, kClusterTag, "demo"));
  ASSERT_THAT(all, SizeIs(1));
  EXPECT_EQ(all[0].state, InstanceState::kTerminated);

  cloud.InjectSetRecord("a.example.com", {"10.1.1.1"});
  EXPECT_THAT(cloud.Inspect().records.at("a.example.com"),
              ElementsAre("10.1.1.1"));
  SETPOINT_EXPECT_OK(cloud.InjectDeleteRecord("a.example.com"));
  EXPECT_THAT(cloud.Inspect().records, IsEmpty());
  EXPECT_EQ(cloud.stats().calls(), 1);  // Only the describe above.

  cloud.SetErrorRate(1.0);
  EXPECT_THAT(cloud.RunInstance(ctx_, {}),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ(cloud.Inspect().instances.size(), 1u);
}

TEST(CloudOptionsTest, ValidationNamesTheField) {
  SETPOINT_EXPECT_OK(ValidateCloudOptions({}));
  EXPECT_THAT(
      ValidateCloudOptions({.error_rate = 1.5}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("error_rate")));
  EXPECT_THAT(
      ValidateCloudOptions({.latency = absl::Milliseconds(-1)}),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("latency")));
  EXPECT_THAT(ValidateCloudOptions({.clock = nullptr}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("clock")));
}

// ---- Plan -------------------------------------------------------------------

// Forwards to a SimulatedCloud and lets a test act in the middle of an
// execution (lose an instance, cancel, start an outage).
class HookedCloud final : public Cloud {
 public:
  explicit HookedCloud(SimulatedCloud* cloud) : cloud_(cloud) {}

  std::function<void(const Instance&)> after_run;
  std::function<void()> before_get_change;

  absl::StatusOr<std::vector<Instance>> DescribeInstances(
      const Context& ctx, const std::string& key,
      const std::string& value) override {
    return cloud_->DescribeInstances(ctx, key, value);
  }
  absl::StatusOr<Instance> RunInstance(const Context& ctx,
                                       const Tags& tags) override {
    absl::StatusOr<Instance> vm = cloud_->RunInstance(ctx, tags);
    if (vm.ok() && after_run) after_run(*vm);
    return vm;
  }
  absl::Status TerminateInstance(const Context& ctx,
                                 const std::string& id) override {
    return cloud_->TerminateInstance(ctx, id);
  }
  absl::StatusOr<DnsRecord> GetRecord(const Context& ctx,
                                      const std::string& name) override {
    return cloud_->GetRecord(ctx, name);
  }
  absl::StatusOr<DnsChange> UpsertRecord(
      const Context& ctx, const std::string& name,
      const std::set<std::string>& addresses) override {
    return cloud_->UpsertRecord(ctx, name, addresses);
  }
  absl::StatusOr<DnsChange> DeleteRecord(const Context& ctx,
                                         const std::string& name) override {
    return cloud_->DeleteRecord(ctx, name);
  }
  absl::StatusOr<DnsChange> GetChange(const Context& ctx,
                                      const std::string& id) override {
    if (before_get_change) before_get_change();
    return cloud_->GetChange(ctx, id);
  }

 private:
  SimulatedCloud* const cloud_;
};

class PlanTest : public ::testing::Test {
 protected:
  // A seeded cloud on the simulated clock.
  void MakeCloud(double error_rate, uint64_t seed) {
    cloud_ = std::make_unique<SimulatedCloud>(
        CloudOptions{.clock = &clock_,
                     .latency = absl::Milliseconds(10),
                     .dns_propagation = absl::Milliseconds(300),
                     .error_rate = error_rate,
                     .seed = seed,
                     .logger = ::setpoint::testing::NullLogger()});
  }

  // Retries generous enough that 30% errors never exhaust them. The jitter
  // is seeded (here and in MakeScheduler), so the call sequence, and so the
  // injected errors, are the same on every run.
  static CucumberPlanOptions PlanOptions(int max_attempts = 40) {
    CucumberPlanOptions o;
    o.step_retry.max_attempts = max_attempts;
    o.observe_retry = o.step_retry;
    o.seed = 1;
    o.logger = ::setpoint::testing::NullLogger();
    return o;
  }

  static setpoint::Scheduler MakeScheduler() {
    return setpoint::Scheduler({.max_rounds = 20,
                                .seed = 1,
                                .logger = ::setpoint::testing::NullLogger()});
  }

  std::vector<Instance> Running(const std::string& cluster = "demo") {
    return RunningInstances(cloud_->Inspect(), cluster);
  }

  std::set<std::string> Addresses(const std::vector<Instance>& instances) {
    std::set<std::string> out;
    for (const Instance& vm : instances) out.insert(vm.private_ip);
    return out;
  }

  // Asserts the world matches `request` exactly.
  void ExpectConverged(const ClusterRequest& request) {
    CloudSnapshot snapshot = cloud_->Inspect();
    SETPOINT_EXPECT_OK(CheckConverged(snapshot, request));
    std::vector<Instance> running = RunningInstances(snapshot, request.name);
    EXPECT_THAT(running, SizeIs(request.nodes_num));
    auto record = snapshot.records.find(request.dns_name);
    if (request.nodes_num == 0) {
      EXPECT_EQ(record, snapshot.records.end());
    } else {
      ASSERT_NE(record, snapshot.records.end());
      EXPECT_EQ(record->second, Addresses(running));
    }
  }

  Tags ClusterTags(const std::string& name = "demo") {
    return {{kClusterTag, name}};
  }

  SimulatedClock clock_{{.auto_advance = true}};
  Context ctx_ = Context(std::stop_token(), &clock_);
  std::unique_ptr<SimulatedCloud> cloud_;
};

enum class StartState {
  kEmpty,
  kPartial,
  kTooMany,
  kWrongDns,
  kDnsMissing,
  kInstanceLost,
};

std::string StartStateName(StartState s) {
  switch (s) {
    case StartState::kEmpty:
      return "Empty";
    case StartState::kPartial:
      return "Partial";
    case StartState::kTooMany:
      return "TooMany";
    case StartState::kWrongDns:
      return "WrongDns";
    case StartState::kDnsMissing:
      return "DnsMissing";
    case StartState::kInstanceLost:
      return "InstanceLost";
  }
  return "Unknown";
}

class ConvergenceTest
    : public PlanTest,
      public ::testing::WithParamInterface<std::tuple<StartState, uint64_t>> {};

TEST_P(ConvergenceTest, ConvergesUnderInjectedFailures) {
  const auto [state, seed] = GetParam();
  MakeCloud(/*error_rate=*/0.0, seed);
  const std::string dns = kDemo.dns_name;
  // Another cluster shares the cloud; it must be left alone.
  Instance other = cloud_->InjectInstance(ClusterTags("other"));
  cloud_->InjectSetRecord("other.example.com", {other.private_ip});

  auto add = [&](int n) {
    std::vector<Instance> added;
    for (int i = 0; i < n; ++i)
      added.push_back(cloud_->InjectInstance(ClusterTags()));
    return added;
  };
  switch (state) {
    case StartState::kEmpty:
      break;
    case StartState::kPartial:
      cloud_->InjectSetRecord(dns, Addresses(add(1)));
      break;
    case StartState::kTooMany:
      cloud_->InjectSetRecord(dns, Addresses(add(6)));
      break;
    case StartState::kWrongDns: {
      std::vector<Instance> vms = add(3);
      cloud_->InjectSetRecord(dns, {vms[0].private_ip, "10.9.9.9"});
      break;
    }
    case StartState::kDnsMissing:
      add(3);
      break;
    case StartState::kInstanceLost: {
      std::vector<Instance> vms = add(3);
      cloud_->InjectSetRecord(dns, Addresses(vms));
      SETPOINT_ASSERT_OK(cloud_->InjectLoseInstance(vms[1].id));
      break;
    }
  }
  cloud_->SetErrorRate(0.3);

  CucumberPlan plan(cloud_.get(), kDemo, PlanOptions());
  ExecutionReport report = MakeScheduler().Execute(ctx_, plan);

  SETPOINT_EXPECT_OK(report.status) << report.Summary();
  EXPECT_LE(report.rounds, 4) << report.Summary();
  ExpectConverged(kDemo);
  EXPECT_GT(cloud_->stats().injected_errors, 0);
  // The other cluster is untouched.
  EXPECT_THAT(Running("other"), SizeIs(1));
  EXPECT_THAT(cloud_->Inspect().records.at("other.example.com"),
              ElementsAre(other.private_ip));
  // Converged means Create() now returns nothing.
  cloud_->SetErrorRate(0.0);
  SETPOINT_ASSERT_OK_AND_ASSIGN(auto preview,
                                MakeScheduler().Preview(ctx_, plan));
  EXPECT_THAT(preview, IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(
    EveryStartState, ConvergenceTest,
    ::testing::Combine(
        ::testing::Values(StartState::kEmpty, StartState::kPartial,
                          StartState::kTooMany, StartState::kWrongDns,
                          StartState::kDnsMissing, StartState::kInstanceLost),
        ::testing::Values<uint64_t>(1, 2, 3, 4, 5)),
    [](const auto& test_info) {
      return StartStateName(std::get<0>(test_info.param)) + "_Seed" +
             std::to_string(std::get<1>(test_info.param));
    });

TEST_F(PlanTest, RepairsAnInstanceLostMidExecution) {
  MakeCloud(0.3, 11);
  HookedCloud hooked(cloud_.get());
  int runs = 0;
  std::string lost;
  hooked.after_run = [&](const Instance&) {
    if (++runs == 2) {  // The first instance dies while the third starts.
      lost = Running().front().id;
      SETPOINT_ASSERT_OK(cloud_->InjectLoseInstance(lost));
    }
  };
  CucumberPlan plan(&hooked, kDemo, PlanOptions());
  ExecutionReport report = MakeScheduler().Execute(ctx_, plan);
  SETPOINT_EXPECT_OK(report.status) << report.Summary();
  EXPECT_GE(report.rounds, 2);  // The next round noticed the loss.
  ExpectConverged(kDemo);
  for (const Instance& vm : Running()) EXPECT_NE(vm.id, lost);
}

TEST_F(PlanTest, ScalesUpAndDownKeepingTheOldestInstances) {
  MakeCloud(0.2, 3);
  ClusterRequest request = kDemo;
  CucumberPlan plan(cloud_.get(), request, PlanOptions());
  setpoint::Scheduler scheduler = MakeScheduler();

  for (int n : {3, 5, 2, 0, 1}) {
    request.nodes_num = n;
    plan.SetRequest(request);
    ExecutionReport report = scheduler.Execute(ctx_, plan);
    SETPOINT_EXPECT_OK(report.status)
        << "nodes_num=" << n << " " << report.Summary();
    ExpectConverged(request);
    if (n == 2) {
      // Newest first: the two oldest survive.
      std::vector<Instance> running = Running();
      ASSERT_THAT(running, SizeIs(2));
      EXPECT_EQ(running[0].id, "i-0001");
      EXPECT_EQ(running[1].id, "i-0002");
      // The record dropped the leaving instances before they were
      // terminated.
      int64_t dns = -1, first_terminate = -1;
      for (const setpoint::StepRecord& step : report.steps) {
        if (step.name == "update dns record" && dns < 0) dns = step.id;
        if (step.name.starts_with("terminate instance") &&
            first_terminate < 0) {
          first_terminate = step.id;
        }
      }
      EXPECT_GE(dns, 0);
      EXPECT_GT(first_terminate, dns);
    }
  }
}

TEST_F(PlanTest, PreviewListsTheStepsWithoutChangingTheCloud) {
  MakeCloud(0.3, 5);
  std::vector<Instance> vms;
  for (int i = 0; i < 5; ++i)
    vms.push_back(cloud_->InjectInstance(ClusterTags()));
  cloud_->InjectSetRecord(kDemo.dns_name, Addresses(vms));
  CucumberPlan plan(cloud_.get(), kDemo, PlanOptions());
  setpoint::Scheduler scheduler = MakeScheduler();

  SETPOINT_ASSERT_OK_AND_ASSIGN(std::vector<setpoint::PreviewItem> items,
                                scheduler.Preview(ctx_, plan));
  ASSERT_THAT(items, SizeIs(2));
  EXPECT_EQ(items[0].name, "update dns record");
  EXPECT_THAT(items[0].description,
              HasSubstr("first drop the 2 leaving instances"));
  EXPECT_EQ(items[1].name, "reconcile nodes");
  EXPECT_EQ(items[1].description,
            "cluster demo has 5 running instances, wants 3: terminate "
            "i-0005, i-0004 (newest first)");
  EXPECT_EQ(cloud_->stats().writes(), 0);
  EXPECT_THAT(Running(), SizeIs(5));

  // Scaling up: nodes first, then the record.
  plan.SetRequest(
      {.name = "demo", .nodes_num = 7, .dns_name = "demo.example.com"});
  SETPOINT_ASSERT_OK_AND_ASSIGN(items, scheduler.Preview(ctx_, plan));
  ASSERT_THAT(items, SizeIs(2));
  EXPECT_EQ(items[0].name, "reconcile nodes");
  EXPECT_EQ(items[0].description,
            "cluster demo has 5 running instances, wants 7: run 2");
  EXPECT_EQ(items[1].name, "update dns record");
  EXPECT_EQ(cloud_->stats().writes(), 0);
  EXPECT_THAT(Running(), SizeIs(5));
}

TEST_F(PlanTest, DoesNotRewriteARecordThatIsStillPropagating) {
  cloud_ = std::make_unique<SimulatedCloud>(
      CloudOptions{.clock = &clock_,
                   .dns_propagation = absl::Minutes(1),
                   .logger = ::setpoint::testing::NullLogger()});
  HookedCloud hooked(cloud_.get());
  std::stop_source stop;
  hooked.before_get_change = [&] { stop.request_stop(); };
  CucumberPlan plan(&hooked, kDemo, PlanOptions());
  setpoint::Scheduler scheduler = MakeScheduler();

  // The first execution submits the change and is cancelled while waiting.
  ExecutionReport first =
      scheduler.Execute(Context(stop.get_token(), &clock_), plan);
  EXPECT_THAT(first.status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(cloud_->stats().upsert_record, 1);

  // The next one sees its own change PENDING and waits instead of writing.
  hooked.before_get_change = nullptr;
  SETPOINT_ASSERT_OK_AND_ASSIGN(auto preview, scheduler.Preview(ctx_, plan));
  ASSERT_THAT(preview, SizeIs(1));
  EXPECT_EQ(preview[0].name, "wait for dns change C0001");
  ExecutionReport second = scheduler.Execute(ctx_, plan);
  SETPOINT_EXPECT_OK(second.status) << second.Summary();
  EXPECT_EQ(cloud_->stats().upsert_record, 1);
  EXPECT_EQ(second.rounds, 1);
  ExpectConverged(kDemo);
}

TEST_F(PlanTest, AChangeThatNeverSyncsFailsTheWaitClearly) {
  cloud_ = std::make_unique<SimulatedCloud>(
      CloudOptions{.clock = &clock_,
                   .dns_propagation = absl::Hours(1),
                   .logger = ::setpoint::testing::NullLogger()});
  CucumberPlanOptions options = PlanOptions();
  options.dns_change_timeout = absl::Minutes(2);
  CucumberPlan plan(cloud_.get(), kDemo, options);
  ExecutionReport report = MakeScheduler().Execute(ctx_, plan);
  EXPECT_THAT(report.status,
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("wait for dns change C0001 "
                                 "record=demo.example.com: still PENDING "
                                 "after 2m")));
  EXPECT_EQ(cloud_->stats().upsert_record, 1);  // Not retried.
}

TEST_F(PlanTest, CancellationStopsTheExecution) {
  MakeCloud(0.3, 2);
  HookedCloud hooked(cloud_.get());
  std::stop_source stop;
  hooked.after_run = [&](const Instance&) {
    if (Running().size() == 2) stop.request_stop();
  };
  CucumberPlan plan(&hooked, kDemo, PlanOptions());
  ExecutionReport report =
      MakeScheduler().Execute(Context(stop.get_token(), &clock_), plan);
  EXPECT_THAT(report.status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(report.stopped_before, "run instance (have 2, want 3)");
  EXPECT_GE(report.steps_not_run, 2);  // The last run, the dns update.
  EXPECT_THAT(Running(), SizeIs(2));   // Nothing ran after the cancel.
  EXPECT_THAT(cloud_->Inspect().records, IsEmpty());
}

TEST_F(PlanTest, CancellationInterruptsABlockedCall) {
  // No auto-advance: the execution blocks in its first call's latency.
  SimulatedClock clock;
  SimulatedCloud cloud({.clock = &clock,
                        .latency = absl::Seconds(5),
                        .logger = ::setpoint::testing::NullLogger()});
  CucumberPlan plan(&cloud, kDemo, PlanOptions());
  std::stop_source stop;
  ExecutionReport report;
  std::thread runner([&] {
    report = MakeScheduler().Execute(Context(stop.get_token(), &clock), plan);
  });
  ASSERT_TRUE(clock.AwaitWaiters(1));
  stop.request_stop();
  runner.join();
  EXPECT_THAT(report.status, StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(cloud.stats().writes(), 0);
}

TEST_F(PlanTest, APersistentOutageEndsWithAClearError) {
  MakeCloud(1.0, 1);
  CucumberPlan plan(cloud_.get(), kDemo, PlanOptions(/*max_attempts=*/5));
  ExecutionReport report = MakeScheduler().Execute(ctx_, plan);
  EXPECT_THAT(report.status,
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("create round=1: gave up after 5 attempts: "
                                 "describe instances cucumber/cluster=demo: "
                                 "503 service unavailable (injected)")));
  EXPECT_EQ(cloud_->stats().calls(), 5);
}

TEST_F(PlanTest, AnOutageMidwayFailsTheStepThenTheNextExecutionRecovers) {
  MakeCloud(0.0, 1);
  HookedCloud hooked(cloud_.get());
  hooked.after_run = [&](const Instance&) { cloud_->SetErrorRate(1.0); };
  CucumberPlan plan(&hooked, kDemo, PlanOptions(/*max_attempts=*/4));
  setpoint::Scheduler scheduler = MakeScheduler();

  ExecutionReport failed = scheduler.Execute(ctx_, plan);
  EXPECT_THAT(failed.status,
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("step=\"run instance (have 1, want 3)\" "
                                 "attempts=4")));
  EXPECT_EQ(failed.steps_failed, 1);
  EXPECT_THAT(Running(), SizeIs(1));

  hooked.after_run = nullptr;
  cloud_->SetErrorRate(0.0);
  ExecutionReport recovered = scheduler.Execute(ctx_, plan);
  SETPOINT_EXPECT_OK(recovered.status) << recovered.Summary();
  ExpectConverged(kDemo);
}

TEST_F(PlanTest, AReconcileLoopRepairsDrift) {
  MakeCloud(0.2, 9);
  CucumberPlan plan(cloud_.get(), kDemo, PlanOptions());
  std::stop_source stop;
  int reports = 0;
  setpoint::ReconcileLoop loop(
      plan, {.interval = absl::Seconds(30),
             .on_report =
                 [&](const ExecutionReport& report) {
                   SETPOINT_EXPECT_OK(report.status) << report.Summary();
                   ExpectConverged(kDemo);
                   if (++reports == 1) {
                     // Drift between two executions.
                     SETPOINT_EXPECT_OK(
                         cloud_->InjectLoseInstance(Running().front().id));
                     cloud_->InjectSetRecord(kDemo.dns_name, {"10.9.9.9"});
                   } else {
                     stop.request_stop();
                   }
                 },
             .scheduler = {.max_rounds = 20,
                           .seed = 1,
                           .logger = ::setpoint::testing::NullLogger()},
             .clock = &clock_,
             .logger = ::setpoint::testing::NullLogger(),
             .seed = 1});
  EXPECT_THAT(loop.Run(Context(stop.get_token(), &clock_)),
              StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(reports, 2);
  EXPECT_EQ(loop.stats().failures, 0);
}

// ---- Console ----------------------------------------------------------------

TEST_F(PlanTest, ConsoleShowsTheStepTreeAndAVerdict) {
  MakeCloud(0.0, 1);
  CucumberPlan plan(cloud_.get(), kDemo, PlanOptions());
  ExecutionReport report = MakeScheduler().Execute(ctx_, plan);
  SETPOINT_ASSERT_OK(report.status);
  std::string steps = FormatSteps(report);
  EXPECT_THAT(steps, HasSubstr("\n  1      reconcile nodes "));
  EXPECT_THAT(steps, HasSubstr("\n  1        run instance (have 0, want 3) "));
  EXPECT_THAT(steps, HasSubstr("\n  1        wait for dns change C0001 "));
  EXPECT_THAT(FormatObservedState(cloud_->Inspect(), kDemo),
              HasSubstr("verdict    converged: 3/3 instances running"));
  SETPOINT_ASSERT_OK(cloud_->InjectDeleteRecord(kDemo.dns_name));
  EXPECT_THAT(FormatObservedState(cloud_->Inspect(), kDemo),
              HasSubstr("NOT converged: dns demo.example.com: has missing"));
}

}  // namespace
}  // namespace cucumber
