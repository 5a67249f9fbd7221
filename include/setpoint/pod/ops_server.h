// OpsServer: a pod's HTTP listener for operators and their tools:
//   GET /metrics  Prometheus text format (setpoint::PrometheusText).
//   GET /healthz  200 "ok", or 503 naming what is stuck (liveness).
//   GET /readyz   200 "ok", or 503 naming what is not ready (readiness).
//   GET /statusz  200 and a JSON object (the pod's status).
// PodMain runs one on PodConfig's http.address (docs/operations.md).
//
//   auto server = setpoint::OpsServer::Start({
//       .address = "127.0.0.1:0",   // port 0: a free one
//       .metrics = &metrics,
//       .liveness = [&] { return std::vector<std::string>{}; },
//   });
//   int port = (*server)->port();
//
// Other paths get 404, other methods 405, and requests over the size bound
// 413/414/400; a handler that throws is a 500. At most `threads` requests
// are served at once and `threads` more wait; the listener serves the next
// one itself, so further connections wait in the kernel's backlog.
//
// Thread safety: Start, Stop and the destructor belong to the owner; the
// callbacks run on the server's threads, several at once.
#ifndef SETPOINT_POD_OPS_SERVER_H_
#define SETPOINT_POD_OPS_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "setpoint/base/metrics.h"
#include "spdlog/logger.h"

namespace setpoint {

struct OpsServerOptions {
  // "host:port" (host: an IPv4 address, "localhost", or "[::1]"-style IPv6);
  // port 0 picks a free one.
  std::string address = "127.0.0.1:9464";
  // Served at /metrics. Default: none (/metrics is empty).
  const MetricsRegistry* metrics = nullptr;
  // Problems that make /healthz and /readyz fail; empty: healthy / ready.
  // Default: none (always ok).
  std::function<std::vector<std::string>()> liveness = nullptr;
  std::function<std::vector<std::string>()> readiness = nullptr;
  // The JSON object served at /statusz. Default: "{}".
  std::function<std::string()> status = nullptr;
  // Threads serving requests (>= 1).
  // Default: 4.
  int threads = 4;
  // A request's body beyond this is refused (413); the request line and
  // headers are bounded at 8 KiB each.
  // Default: 16 KiB.
  size_t max_request_bytes = 16 * 1024;
  // Read and write timeouts of a connection.
  // Default: 5 s.
  absl::Duration timeout = absl::Seconds(5);
  // Default: spdlog's default logger at Start.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

class OpsServer {
 public:
  // Binds and starts serving. kInvalidArgument for an address that does
  // not parse; kUnavailable when it cannot be bound (in use, not local).
  static absl::StatusOr<std::unique_ptr<OpsServer>> Start(
      OpsServerOptions options);
  // Calls Stop().
  ~OpsServer();
  OpsServer(const OpsServer&) = delete;
  OpsServer& operator=(const OpsServer&) = delete;

  // Stops accepting, waits for the requests being served. Idempotent.
  void Stop();
  // The bound port, and "host:port" with it.
  int port() const { return port_; }
  std::string address() const;

 private:
  struct Impl;
  explicit OpsServer(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// Splits "host:port" ("[v6]:port" too); the port is 0..65535.
// kInvalidArgument naming the address otherwise.
absl::Status ParseHostPort(const std::string& address, std::string* host,
                           int* port);

}  // namespace setpoint

#endif  // SETPOINT_POD_OPS_SERVER_H_
