// HttpServer: the small HTTP/1.1 server under OpsServer, made so that idle,
// slow and keep-alive clients cannot starve a pod's probes.
//
//   HttpServer::Options o;
//   o.host = "127.0.0.1";
//   o.lane = [](const HttpHead& h) { return h.path == "/metrics" ? 1 : 0; };
//   o.handler = [](const HttpHead& h) { return HttpAnswer{200, ...}; };
//   auto server = HttpServer::Start(std::move(o));
//
// One event loop (epoll) does all the IO; handlers run on `lanes` worker
// threads, one queue each, so what `lane` sends to one never waits behind
// another's (probes are not queued behind /metrics). Per connection:
//   - the whole request head and body must arrive within request_timeout
//     of its first byte (of the accept for a first request): not reset by
//     each byte, so a slowloris client is closed (408) on time;
//   - between requests a keep-alive connection may idle for
//     keep_alive_timeout, and serves at most max_requests;
//   - pipelined requests are answered one by one, in order;
//   - a response must be written within write_timeout.
// At most max_connections are open: a new one closes the oldest idle one
// (no request in progress) first, then the oldest still receiving a head,
// and is refused with 503 only when every other is being served.
// Refusals of ParseHttpHead are answered at once, and the connection is
// closed after it (its unread input drained for a moment, so the client
// reads the answer rather than a reset).
//
// Thread safety: Start, Stop and the destructor belong to the owner;
// stats() from any thread; `lane` runs on the loop thread, `handler` on the
// lane's worker thread.
#ifndef SETPOINT_SRC_POD_HTTP_SERVER_H_
#define SETPOINT_SRC_POD_HTTP_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "http_request.h"
#include "spdlog/logger.h"

namespace setpoint {

struct HttpAnswer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // More headers ("Allow"), each name and value.
  std::vector<std::pair<std::string, std::string>> headers;
};

// A text/plain answer.
inline HttpAnswer TextAnswer(int status, std::string body) {
  HttpAnswer a;
  a.status = status;
  a.body = std::move(body);
  return a;
}

// Counts since Start, for the listener's series.
struct HttpServerStats {
  int64_t connections_open = 0;
  int64_t connections_accepted = 0;
  // Connections the server closed before they were done, by why.
  int64_t closed_for_limit = 0;        // The oldest idle, for a new one.
  int64_t closed_request_timeout = 0;  // The head/body took too long (408).
  int64_t closed_idle = 0;             // Keep-alive idle timeout.
  int64_t closed_write_timeout = 0;    // The client did not read.
  int64_t refused_full = 0;            // 503: every connection busy.
  int64_t requests = 0;                // Answered by a handler.
  int64_t refused_requests = 0;        // 4xx/5xx of ParseHttpHead.
};

class HttpServer {
 public:
  struct Options {
    // An IPv4 or IPv6 address, or "localhost"; port 0 picks a free one.
    std::string host = "127.0.0.1";
    int port = 0;
    // Which worker serves a request: 0..lanes-1. Called on the loop thread:
    // must be quick. Default: 0.
    std::function<int(const HttpHead&)> lane = nullptr;
    int lanes = 2;
    // Answers a request; a throw becomes a 500 (logged). Required.
    std::function<HttpAnswer(const HttpHead&)> handler = nullptr;
    HttpLimits limits = {};
    int max_connections = 256;
    int backlog = 512;
    int max_requests = 100;
    absl::Duration request_timeout = absl::Seconds(2);
    absl::Duration keep_alive_timeout = absl::Seconds(5);
    absl::Duration write_timeout = absl::Seconds(5);
    // Requests waiting in one lane beyond this are answered 503 at once.
    int max_queued = 64;
    std::shared_ptr<spdlog::logger> logger = nullptr;  // Required.
  };

  // kUnavailable when the address cannot be bound; kInvalidArgument for a
  // host that is not an address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Options options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Closes the listener and every connection, joins the threads (a handler
  // still running is waited for). Idempotent.
  void Stop();
  int port() const;
  HttpServerStats stats() const;

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace setpoint

#endif  // SETPOINT_SRC_POD_HTTP_SERVER_H_
