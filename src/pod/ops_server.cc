#include "setpoint/pod/ops_server.h"

#include <exception>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "http_server.h"
#include "setpoint/prometheus/prometheus_metrics.h"
#include "spdlog/spdlog.h"

namespace setpoint {
namespace {

constexpr int kProbeLane = 0;
constexpr int kPageLane = 1;

bool IsProbe(const std::string& path) {
  return path == "/healthz" || path == "/readyz";
}
bool IsKnown(const std::string& path) {
  return IsProbe(path) || path == "/metrics" || path == "/statusz";
}

HttpAnswer Text(int status, std::string body) {
  return TextAnswer(status, std::move(body));
}

HttpAnswer Probe(const std::function<std::vector<std::string>()>& check,
                 const char* what) {
  std::vector<std::string> problems;
  if (check) problems = check();
  if (problems.empty()) return Text(200, "ok\n");
  return Text(503,
              absl::StrCat(what, ": ", absl::StrJoin(problems, "\n"), "\n"));
}

HttpAnswer Serve(const OpsServerOptions& o, const HttpHead& head) {
  if (!IsKnown(head.path)) {
    return Text(404, "not found (try /metrics, /healthz, /readyz, /statusz)\n");
  }
  if (head.method != "GET" && head.method != "HEAD") {
    HttpAnswer a = Text(405, "method not allowed (GET or HEAD)\n");
    a.headers.emplace_back("Allow", "GET, HEAD");
    return a;
  }
  if (head.path == "/healthz") return Probe(o.liveness, "not healthy");
  if (head.path == "/readyz") return Probe(o.readiness, "not ready");
  if (head.path == "/metrics") {
    if (o.before_metrics) o.before_metrics();
    HttpAnswer a =
        Text(200, o.metrics != nullptr ? PrometheusText(*o.metrics) : "");
    a.content_type = kPrometheusTextContentType;
    return a;
  }
  std::string body = o.status ? o.status() : "{}";
  body.push_back('\n');
  HttpAnswer a = Text(200, std::move(body));
  a.content_type = "application/json";
  return a;
}

}  // namespace

absl::Status ParseHostPort(const std::string& address, std::string* host,
                           int* port) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(
        absl::StrCat("address \"", address, "\": ", why,
                     " (want host:port, for example 127.0.0.1:9464)"));
  };
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host:port");
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return bad("an IPv6 host needs brackets");
  }
  if (h.empty()) return bad("empty host");
  int p = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &p) || p < 0 || p > 65535)
    return bad("the port is not a number in 0..65535");
  *host = h;
  *port = p;
  return absl::OkStatus();
}

struct OpsServer::Impl {
  OpsServerOptions options;
  std::string host;
  std::unique_ptr<HttpServer> server;
};

OpsServer::OpsServer(std::unique_ptr<Impl> impl, int port)
    : impl_(std::move(impl)), port_(port) {}

OpsServer::~OpsServer() { Stop(); }

std::string OpsServer::address() const {
  return impl_->host.find(':') != std::string::npos
             ? absl::StrCat("[", impl_->host, "]:", port_)
             : absl::StrCat(impl_->host, ":", port_);
}

absl::StatusOr<std::unique_ptr<OpsServer>> OpsServer::Start(
    OpsServerOptions options) {
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("ops server: ", what));
  };
  if (options.max_connections < 1) return bad("max_connections must be >= 1");
  if (options.max_requests_per_connection < 1) {
    return bad("max_requests_per_connection must be >= 1");
  }
  if (options.max_head_bytes < 64) return bad("max_head_bytes must be >= 64");
  for (absl::Duration d : {options.request_timeout, options.keep_alive_timeout,
                           options.write_timeout}) {
    if (d <= absl::ZeroDuration()) return bad("timeouts must be > 0");
  }
  auto impl = std::make_unique<Impl>();
  int port = 0;
  if (absl::Status s = ParseHostPort(options.address, &impl->host, &port);
      !s.ok()) {
    return s;
  }
  if (options.logger == nullptr) options.logger = spdlog::default_logger();
  impl->options = std::move(options);
  const OpsServerOptions* o = &impl->options;
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Start({
      .host = impl->host,
      .port = port,
      .lane =
          [](const HttpHead& h) {
            return IsProbe(h.path) || !IsKnown(h.path) ? kProbeLane : kPageLane;
          },
      .lanes = 2,
      .handler = [o](const HttpHead& h) { return Serve(*o, h); },
      .limits = {.max_head_bytes = o->max_head_bytes,
                 .max_body_bytes = o->max_request_bytes},
      .max_connections = o->max_connections,
      .backlog = 512,
      .max_requests = o->max_requests_per_connection,
      .request_timeout = o->request_timeout,
      .keep_alive_timeout = o->keep_alive_timeout,
      .write_timeout = o->write_timeout,
      .max_queued = 64,
      .logger = o->logger,
  });
  if (!server.ok()) {
    if (absl::IsInvalidArgument(server.status())) return server.status();
    return absl::UnavailableError(
        absl::StrCat("ops server: cannot listen on ", o->address,
                     " (in use, or not an address of this machine): ",
                     server.status().message()));
  }
  impl->server = *std::move(server);
  const int bound = impl->server->port();
  auto ops = std::unique_ptr<OpsServer>(new OpsServer(std::move(impl), bound));
  SPDLOG_LOGGER_INFO(ops->impl_->options.logger,
                     "ops server listening address={}", ops->address());
  return ops;
}

void OpsServer::Stop() {
  if (impl_ == nullptr || impl_->server == nullptr) return;
  impl_->server->Stop();
}

OpsServerStats OpsServer::stats() const {
  const HttpServerStats s = impl_->server->stats();
  return {
      .connections_open = s.connections_open,
      .connections_accepted = s.connections_accepted,
      .closed_for_limit = s.closed_for_limit,
      .closed_request_timeout = s.closed_request_timeout,
      .closed_idle = s.closed_idle,
      .closed_write_timeout = s.closed_write_timeout,
      .refused_busy = s.refused_full,
      .requests = s.requests,
      .requests_refused = s.refused_requests,
  };
}

}  // namespace setpoint
