#include "setpoint/pod/ops_server.h"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "prometheus/exposer.h"
#include "setpoint/prometheus/prometheus_metrics.h"
#include "setpoint/testing/status_matchers.h"

namespace setpoint {
namespace {

using ::setpoint::testing::StatusIs;
using ::testing::HasSubstr;

class OpsServerTest : public ::testing::Test {
 protected:
  void Start() {
    auto server = OpsServer::Start({
        .address = "127.0.0.1:0",
        .metrics = &metrics_,
        .liveness = [this] { return stuck_; },
        .readiness = [this] { return not_ready_; },
        .status = [this]() -> std::string {
          if (throw_) throw std::runtime_error("status broke");
          return R"({"pod":"p"})";
        },
        .max_request_bytes = 1024,
    });
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<httplib::Client>("127.0.0.1", server_->port());
    client_->set_read_timeout(10, 0);
  }

  MetricsRegistry metrics_;
  std::vector<std::string> stuck_, not_ready_;
  bool throw_ = false;
  std::unique_ptr<OpsServer> server_;
  std::unique_ptr<httplib::Client> client_;
};

TEST_F(OpsServerTest, ServesMetricsInPrometheusTextFormat) {
  metrics_.GetCounter("demo_events_total", "Events.", {{"node", "a/b/0"}})
      .Increment(3);
  metrics_.GetHistogram("demo_seconds", "Durations.", {}, {0.1, 1})
      .Observe(0.5);
  Start();
  auto res = client_->Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->get_header_value("Content-Type"),
              HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(res->body, HasSubstr("# TYPE demo_events_total counter"));
  EXPECT_THAT(res->body, HasSubstr("demo_events_total{node=\"a/b/0\"} 3"));
  EXPECT_THAT(res->body, HasSubstr("demo_seconds_bucket{le=\"0.1\"} 0"));
  EXPECT_THAT(res->body, HasSubstr("demo_seconds_bucket{le=\"1\"} 1"));
  EXPECT_THAT(res->body, HasSubstr("demo_seconds_bucket{le=\"+Inf\"} 1"));
  EXPECT_THAT(res->body, HasSubstr("demo_seconds_count 1"));
}

TEST_F(OpsServerTest, ProbesSayOkOrNameTheProblem) {
  Start();
  auto ok = client_->Get("/healthz");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->body, "ok\n");
  stuck_ = {"pod-a/vm/0: runner has not run its status event for 40s"};
  not_ready_ = {"registry unreachable", "syncer vms not in sync"};
  auto sick = client_->Get("/healthz");
  ASSERT_TRUE(sick);
  EXPECT_EQ(sick->status, 503);
  EXPECT_THAT(sick->body, HasSubstr("pod-a/vm/0: runner has not run"));
  auto unready = client_->Get("/readyz");
  ASSERT_TRUE(unready);
  EXPECT_EQ(unready->status, 503);
  EXPECT_THAT(unready->body, HasSubstr("registry unreachable\nsyncer vms"));
  auto status = client_->Get("/statusz");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
  EXPECT_EQ(status->body, "{\"pod\":\"p\"}\n");
  EXPECT_EQ(status->get_header_value("Content-Type"), "application/json");
}

TEST_F(OpsServerTest, BadRequestsGet4xxAndAThrowingHandlerA500) {
  Start();
  auto missing = client_->Get("/nope");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
  auto post = client_->Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(post);
  EXPECT_EQ(post->status, 405);
  auto big = client_->Post("/statusz", std::string(4096, 'x'), "text/plain");
  ASSERT_TRUE(big);
  EXPECT_EQ(big->status, 413);
  auto long_uri = client_->Get("/" + std::string(10000, 'a'));
  ASSERT_TRUE(long_uri);
  EXPECT_EQ(long_uri->status, 414);
  throw_ = true;
  auto broken = client_->Get("/statusz");
  ASSERT_TRUE(broken);
  EXPECT_EQ(broken->status, 500);
  // Still serving.
  auto after = client_->Get("/healthz");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 200);
}

TEST_F(OpsServerTest, ManyClientsAtOnceAreAllServed) {
  Start();
  // One request first, on this thread: the HTTP client library sets up
  // its shared parsing state on first use, in code ThreadSanitizer does not
  // see, and 16 threads doing that at once read as a race in it.
  {
    httplib::Client warm("127.0.0.1", server_->port());
    auto res = warm.Get("/healthz");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
  }
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", server_->port());
      c.set_read_timeout(10, 0);
      for (int j = 0; j < 5; ++j) {
        auto res = c.Get("/healthz");
        if (res && res->status == 200) ++ok;
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 80);
}

TEST(OpsServerStartTest, RefusesBadAddressesAndPortsInUse) {
  EXPECT_THAT(OpsServer::Start({.address = "nonsense"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("address \"nonsense\"")));
  EXPECT_THAT(OpsServer::Start({.address = "127.0.0.1:99999"}).status(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  auto first = OpsServer::Start({.address = "127.0.0.1:0"});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_THAT(
      OpsServer::Start({.address = (*first)->address()}).status(),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot listen")));
}

TEST(PrometheusCollectableTest, MergesEqualSeriesAndServesOnThePullExposer) {
  MetricsRegistry m;
  m.GetCounter("merged_total", "Merged.", {{"a", "1"}}).Increment(2);
  auto handle = m.AddCollector([](MetricWriter& w) {
    w.Counter("merged_total", "Merged.", {{"a", "1"}}, 3);
    w.Gauge("merged_total", "Wrong type, dropped.", {{"a", "2"}}, 9);
  });
  EXPECT_THAT(PrometheusText(m), HasSubstr("merged_total{a=\"1\"} 5\n"));
  EXPECT_THAT(PrometheusText(m), ::testing::Not(HasSubstr("a=\"2\"")));

  // prometheus-cpp's own pull Exposer serves the collectable.
  prometheus::Exposer exposer("127.0.0.1:0");
  auto collectable = std::make_shared<PrometheusCollectable>(&m);
  exposer.RegisterCollectable(collectable);
  ASSERT_FALSE(exposer.GetListeningPorts().empty());
  httplib::Client c("127.0.0.1", exposer.GetListeningPorts().front());
  auto res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_THAT(res->body, HasSubstr("merged_total{a=\"1\"} 5"));
  exposer.RemoveCollectable(collectable);
}

}  // namespace
}  // namespace setpoint
