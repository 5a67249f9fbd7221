// ops_listener_bench: a pod's ops listener (setpoint::OpsServer) under the
// load of misbehaving clients, against the targets of docs/operations.md:
//
//   BM_HealthzUnderLoad   300 idle, 50 slowloris (a header byte a second)
//                         and 4 keep-alive /metrics scrapers (every 100 ms)
//                         held for 3 s, then while they go on 50 fresh
//                         /healthz probes, one every 30 ms, each on a new
//                         connection with kubelet's 1 s timeout. Counters:
//                         p50/p99/max in ms, failed probes, scrapes and
//                         failed scrapes. Target: p99 <= 100 ms, no probe
//                         fails. slowloris:600 floods past every server's
//                         connection limit.
//   BM_MetricsIdle        /metrics with 1,000 series, a fresh connection
//                         each, nothing else connected.
//                         Target: p99 <= 20 ms.
//
// Each runs on three servers (server:N): 0 OpsServer as built; 1 cpp-httplib
// with its knobs turned for this load (64 threads, backlog 512, 1 s read
// timeout, 2 s keep-alive); 2 libmicrohttpd's epoll loop with its own knobs
// (connection limit 512, 2 s timeout, backlog 512), when it was found at
// build time. Server and clients share the machine's cores.
//
//   build/release/bench/ops_listener_bench --benchmark_filter=server:0
#define CPPHTTPLIB_LISTEN_BACKLOG 512
#include <sys/socket.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "http_load.h"
#include "httplib.h"
#include "setpoint/base/metrics.h"
#include "setpoint/pod/ops_server.h"
#include "setpoint/prometheus/prometheus_metrics.h"
#include "setpoint/testing/await.h"
#include "spdlog/sinks/null_sink.h"
#include "spdlog/spdlog.h"

#ifdef SETPOINT_BENCH_MHD
#include <microhttpd.h>
#endif

namespace setpoint {
namespace {

namespace load = http_load;

// 1,000 series: 250 counters, 250 gauges and 50 histograms of 8 buckets
// (each 10 series with _sum and _count).
void Fill(MetricsRegistry& metrics) {
  for (int i = 0; i < 250; ++i) {
    const MetricLabels labels = {{"kind", "records"},
                                 {"node", absl::StrCat("pod-a/records/", i)}};
    metrics.GetCounter("bench_events_total", "Events.", labels).Increment(i);
    metrics.GetGauge("bench_queue_depth", "Depth.", labels).Set(i);
  }
  for (int i = 0; i < 50; ++i) {
    metrics
        .GetHistogram("bench_seconds", "Durations.",
                      {{"node", absl::StrCat("pod-a/records/", i)}},
                      {0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10})
        .Observe(0.05 * i);
  }
}

// A listener serving /metrics and /healthz on a free loopback port.
class Server {
 public:
  virtual ~Server() = default;
  virtual int port() const = 0;
};

class Ops final : public Server {
 public:
  explicit Ops(MetricsRegistry* metrics) {
    auto s = OpsServer::Start({
        .address = "127.0.0.1:0",
        .metrics = metrics,
        .logger = std::make_shared<spdlog::logger>(
            "bench", std::make_shared<spdlog::sinks::null_sink_mt>()),
    });
    if (s.ok()) server_ = *std::move(s);
  }
  int port() const override { return server_ ? server_->port() : -1; }

 private:
  std::unique_ptr<OpsServer> server_;
};

class HttplibTuned final : public Server {
 public:
  explicit HttplibTuned(MetricsRegistry* metrics) {
    srv_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    srv_.set_read_timeout(1, 0);
    srv_.set_write_timeout(1, 0);
    srv_.set_keep_alive_timeout(2);
    srv_.set_keep_alive_max_count(100);
    srv_.set_payload_max_length(16 << 10);
    srv_.Get(
        "/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
          res.set_content(PrometheusText(*metrics), kPrometheusTextContentType);
        });
    srv_.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    port_ = srv_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { srv_.listen_after_bind(); });
    (void)testing::AwaitCondition([&] { return srv_.is_running(); });
  }
  ~HttplibTuned() override {
    srv_.stop();
    thread_.join();
  }
  int port() const override { return port_; }

 private:
  httplib::Server srv_;
  std::thread thread_;
  int port_ = -1;
};

#ifdef SETPOINT_BENCH_MHD
class Mhd final : public Server {
 public:
  explicit Mhd(MetricsRegistry* metrics) : metrics_(metrics) {
    daemon_ = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, nullptr, nullptr,
        &Mhd::Answer, this, MHD_OPTION_CONNECTION_LIMIT, 512u,
        MHD_OPTION_CONNECTION_TIMEOUT, 2u, MHD_OPTION_LISTEN_BACKLOG_SIZE, 512u,
        MHD_OPTION_END);
    if (daemon_ != nullptr) {
      const union MHD_DaemonInfo* info =
          MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
      port_ = info != nullptr ? info->port : -1;
    }
  }
  ~Mhd() override {
    if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
  }
  int port() const override { return port_; }

 private:
  static MHD_Result Answer(void* self, MHD_Connection* c, const char* url,
                           const char*, const char*, const char*, size_t*,
                           void**) {
    std::string body = std::string(url) == "/metrics"
                           ? PrometheusText(*static_cast<Mhd*>(self)->metrics_)
                           : "ok\n";
    MHD_Response* r = MHD_create_response_from_buffer(body.size(), body.data(),
                                                      MHD_RESPMEM_MUST_COPY);
    MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
  }
  MetricsRegistry* metrics_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = -1;
};
#endif

std::unique_ptr<Server> MakeServer(int which, MetricsRegistry* metrics) {
  switch (which) {
    case 0:
      return std::make_unique<Ops>(metrics);
    case 1:
      return std::make_unique<HttplibTuned>(metrics);
#ifdef SETPOINT_BENCH_MHD
    case 2:
      return std::make_unique<Mhd>(metrics);
#endif
    default:
      return nullptr;
  }
}

void Report(benchmark::State& state, const std::vector<double>& ms,
            int failures) {
  state.counters["p50_ms"] = load::Percentile(ms, 0.5);
  state.counters["p99_ms"] = load::Percentile(ms, 0.99);
  state.counters["max_ms"] = load::Percentile(ms, 1.0);
  state.counters["failed"] = failures;
}

// Server range(0) over `metrics` filled with 1,000 series, or nullptr (the
// run is marked skipped).
std::unique_ptr<Server> Serve(benchmark::State& state,
                              MetricsRegistry* metrics) {
  Fill(*metrics);
  std::unique_ptr<Server> server = MakeServer(state.range(0), metrics);
  if (server == nullptr || server->port() <= 0) {
    state.SkipWithError("server not built or not started");
    return nullptr;
  }
  return server;
}

void BM_HealthzUnderLoad(benchmark::State& state) {
  MetricsRegistry metrics;
  std::unique_ptr<Server> server = Serve(state, &metrics);
  if (server == nullptr) return;
  const int slowloris = static_cast<int>(state.range(1));
  load::Load clients(server->port(),
                     {.idle = 300, .slowloris = slowloris, .scrapers = 4});
  clients.Start();
  // The load in place, and held past the servers' request timeouts, before
  // probing.
  (void)testing::AwaitCondition(
      [&] { return clients.open() >= 300 + slowloris; }, absl::Seconds(5));
  absl::SleepFor(absl::Seconds(3));
  std::vector<double> ms;
  int failures = 0;
  for (auto _ : state) {
    const absl::Time next = absl::Now() + absl::Milliseconds(30);
    load::Answer a =
        load::Fetch(server->port(), load::Get("/healthz"), absl::Seconds(1));
    if (a.status != 200) ++failures;
    ms.push_back(absl::ToDoubleMilliseconds(a.took));
    state.SetIterationTime(absl::ToDoubleSeconds(a.took));
    absl::SleepFor(next - absl::Now());  // One probe every 30 ms.
  }
  clients.Stop();
  Report(state, ms, failures);
  state.counters["scrapes"] = static_cast<double>(clients.scrapes());
  state.counters["scrape_failed"] =
      static_cast<double>(clients.scrape_failures());
  state.counters["scrape_p99_ms"] =
      1000 * load::Percentile(clients.scrape_seconds(), 0.99);
}
// slowloris:50 is the load; slowloris:600 is more slow clients than
// any of the servers' connection limits.
BENCHMARK(BM_HealthzUnderLoad)
    ->ArgNames({"server", "slowloris"})
    ->ArgsProduct({{0, 1, 2}, {50, 600}})
    ->Iterations(50)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

void BM_MetricsIdle(benchmark::State& state) {
  MetricsRegistry metrics;
  std::unique_ptr<Server> server = Serve(state, &metrics);
  if (server == nullptr) return;
  std::vector<double> ms;
  int failures = 0;
  size_t bytes = 0;
  for (auto _ : state) {
    load::Answer a =
        load::Fetch(server->port(), load::Get("/metrics"), absl::Seconds(5));
    if (a.status != 200) ++failures;
    bytes = a.body.size();
    ms.push_back(absl::ToDoubleMilliseconds(a.took));
    state.SetIterationTime(absl::ToDoubleSeconds(a.took));
  }
  Report(state, ms, failures);
  state.counters["body_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_MetricsIdle)
    ->ArgName("server")
    ->DenseRange(0, 2)
    ->Iterations(300)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace setpoint

BENCHMARK_MAIN();
