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
// HTTP/1.0 and 1.1, keep-alive and pipelining (answered in order). Made so
// that idle, slow and keep-alive clients cannot starve the probes: one
// event loop does the IO and enforces, per connection, a deadline for the
// whole request (request_timeout from its first byte, not reset by each
// byte), a keep-alive idle timeout and a request cap; at most
// max_connections are open, a new one closing the oldest idle one first;
// the listen backlog is 512; /healthz and /readyz are answered by a thread
// of their own, never queued behind /metrics or /statusz (the other one).
// Other paths get 404, other methods 405 (GET and HEAD are served); a
// request is refused at once, before any body is read, with 400 when it
// cannot be HTTP, 413 for a Content-Length over max_request_bytes (every
// method), 414/431 for a request line / head over 8 KiB, 417 for an Expect
// header (no 100 Continue), 501 for a Transfer-Encoding, 505 for another
// HTTP version; 408 when it does not arrive in time. A handler that throws
// is a 500 (logged). docs/operations.md gives the figures under load.
//
// Thread safety: Start, Stop and the destructor belong to the owner;
// stats() from any thread; the callbacks run on the server's two threads:
// liveness and readiness on one, metrics and status on the other.
#ifndef SETPOINT_POD_OPS_SERVER_H_
#define SETPOINT_POD_OPS_SERVER_H_

#include <cstdint>
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
  // Called on the scraping thread before each /metrics is rendered, to set
  // the gauges of what is read rather than kept (a pod's readiness).
  // Default: none.
  std::function<void()> before_metrics = nullptr;
  // The JSON object served at /statusz. Default: "{}".
  std::function<std::string()> status = nullptr;
  // A request's body beyond this is refused (413), for every method.
  // Default: 16 KiB.
  size_t max_request_bytes = 16 * 1024;
  // The request line and headers together; beyond: 414 or 431.
  // Default: 8 KiB.
  size_t max_head_bytes = 8 * 1024;
  // Open connections (>= 1); one more closes the oldest idle one, else the
  // oldest still sending its head, else is answered 503.
  // Default: 256.
  int max_connections = 256;
  // A request (head and body) must arrive within this of its first byte;
  // a new connection must send its first request within this too. 408
  // and closed otherwise.
  // Default: 2 s.
  absl::Duration request_timeout = absl::Seconds(2);
  // A keep-alive connection may wait this long for its next request.
  // Default: 5 s.
  absl::Duration keep_alive_timeout = absl::Seconds(5);
  // Requests on one connection; the last answer says "Connection: close".
  // Default: 100.
  int max_requests_per_connection = 100;
  // An answer must be written (read by the client) within this.
  // Default: 5 s.
  absl::Duration write_timeout = absl::Seconds(5);
  // Default: spdlog's default logger at Start.
  std::shared_ptr<spdlog::logger> logger = nullptr;
};

// What the listener did since Start, for its series
// (setpoint_ops_http_*, docs/operations.md).
struct OpsServerStats {
  int64_t connections_open = 0;
  int64_t connections_accepted = 0;
  // Closed by the server before the client was done, by why: for a newer
  // connection at max_connections; the request took longer than
  // request_timeout (or a new connection sent nothing); the keep-alive idle
  // timeout; the client did not read the answer within write_timeout.
  int64_t closed_for_limit = 0;
  int64_t closed_request_timeout = 0;
  int64_t closed_idle = 0;
  int64_t closed_write_timeout = 0;
  // New connections answered 503: every open one was being served.
  int64_t refused_busy = 0;
  // Requests answered by the paths' handlers, and refused before them
  // (400, 413, 414, 417, 431, 501, 505).
  int64_t requests = 0;
  int64_t requests_refused = 0;
};

class OpsServer {
 public:
  // Binds and starts serving. kInvalidArgument for an address that does
  // not parse or options out of range; kUnavailable when it cannot be
  // bound (in use, not local).
  static absl::StatusOr<std::unique_ptr<OpsServer>> Start(
      OpsServerOptions options);
  // Calls Stop().
  ~OpsServer();
  OpsServer(const OpsServer&) = delete;
  OpsServer& operator=(const OpsServer&) = delete;

  // Stops accepting, closes every connection, waits for the callbacks
  // running. Idempotent.
  void Stop();
  // Connections and requests since Start (see OpsServerStats).
  OpsServerStats stats() const;
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
