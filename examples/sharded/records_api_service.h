// RecordsApiService: the example's fake DNS API (FakeRecordsApi) served
// over HTTP (records_wire.h has the protocol), so pods in separate
// processes write to one API that checks their fencing tokens. The
// records_api_server program runs one; records_http_test runs one in
// process on an ephemeral port.
//
//   RecordsApiService service({.api = {.unavailable_rate = 0}});
//   absl::Status s = service.Start();   // binds 127.0.0.1:<free port>
//   HttpRecordsApi client({.url = service.url()});
//   ...
//   service.Stop();
//
// Bounded: a fixed pool of `threads` serves the requests, bodies over
// `max_body_bytes` get 413, reads and writes time out after
// `io_timeout`, and every field is checked (bad ones get 400).
//
// Thread safety: Start and Stop from one thread; the handlers are
// thread-safe (FakeRecordsApi is).
#ifndef SETPOINT_EXAMPLES_SHARDED_RECORDS_API_SERVICE_H_
#define SETPOINT_EXAMPLES_SHARDED_RECORDS_API_SERVICE_H_

#include <httplib.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "json_reader.h"
#include "records_api.h"
#include "records_wire.h"
#include "setpoint/base/context.h"
#include "setpoint/base/json.h"
#include "setpoint/base/status.h"
#include "setpoint/controller/controller.h"

namespace sharded {

struct RecordsApiServiceOptions {
  std::string host = "127.0.0.1";
  // 0: a free port, chosen at Start.
  int port = 0;
  int threads = 16;
  size_t max_body_bytes = 64 * 1024;
  absl::Duration io_timeout = absl::Seconds(5);
  // The fake behind it; its write log feeds /v1/writes.
  RecordsApiOptions api = {.write_log_limit = 500000};
};

class RecordsApiService {
 public:
  // At most this many writes per /v1/writes answer.
  static constexpr int64_t kMaxWritesPerPage = 20000;

  explicit RecordsApiService(RecordsApiServiceOptions options = {})
      : options_(std::move(options)), api_(options_.api) {}
  ~RecordsApiService() { Stop(); }
  RecordsApiService(const RecordsApiService&) = delete;
  RecordsApiService& operator=(const RecordsApiService&) = delete;

  // Binds and starts serving on a thread of its own.
  absl::Status Start() {
    Routes();
    if (options_.port == 0) {
      port_ = server_.bind_to_any_port(options_.host);
      if (port_ <= 0) {
        return absl::UnavailableError(
            absl::StrCat("cannot bind ", options_.host));
      }
    } else {
      if (!server_.bind_to_port(options_.host, options_.port)) {
        return absl::UnavailableError(
            absl::StrCat("cannot bind ", options_.host, ":", options_.port));
      }
      port_ = options_.port;
    }
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // Stop() only stops a server that runs its accept loop: wait for it.
    absl::Time until = absl::Now() + absl::Seconds(10);
    while (!server_.is_running()) {
      if (absl::Now() > until) {
        return absl::DeadlineExceededError("the server did not start");
      }
      absl::SleepFor(absl::Milliseconds(1));
    }
    return absl::OkStatus();
  }
  void Stop() {
    if (!thread_.joinable()) return;
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::string url() const {
    return absl::StrCat("http://", options_.host, ":", port_);
  }
  FakeRecordsApi& api() { return api_; }
  int64_t bad_requests() const { return bad_requests_.load(); }

 private:
  using Request = httplib::Request;
  using Response = httplib::Response;

  void Routes() {
    int threads = options_.threads;
    server_.new_task_queue = [threads] {
      return new httplib::ThreadPool(static_cast<size_t>(threads));
    };
    server_.set_payload_max_length(options_.max_body_bytes);
    auto io = std::chrono::milliseconds(
        absl::ToInt64Milliseconds(options_.io_timeout));
    server_.set_read_timeout(io);
    server_.set_write_timeout(io);
    server_.set_keep_alive_max_count(16);
    server_.set_keep_alive_timeout(2);
    server_.set_error_handler([this](const Request&, Response& res) {
      if (res.body.empty()) {
        if (res.status >= 400 && res.status < 500) ++bad_requests_;
        res.set_content(wire::ErrorBody(res.status == 404   ? "not_found"
                                        : res.status == 413 ? "too_large"
                                                            : "bad_request",
                                        absl::StrCat("HTTP ", res.status)),
                        "application/json");
      }
    });
    server_.Get("/healthz", [](const Request&, Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    server_.Get("/v1/records", [this](const Request&, Response& res) {
      absl::StatusOr<Records> all = api_.List(Deadline());
      if (!all.ok()) return Answer(all.status(), res);
      std::string out = "{\"records\":{";
      bool first = true;
      for (const auto& [name, record] : *all) {
        if (!first) out += ",";
        first = false;
        setpoint::AppendJsonString(&out, name);
        out += ":{\"address\":";
        setpoint::AppendJsonString(&out, record.address);
        out += "}";
      }
      absl::StrAppend(&out, "},\"serial\":", api_.serial(), "}");
      res.set_content(out, "application/json");
    });
    server_.Get(R"(/v1/records/([^/]+))", [this](const Request& req,
                                                 Response& res) {
      std::string name = req.matches[1];
      if (!wire::ValidName(name)) return Bad(res, "bad record name");
      std::optional<Record> r = api_.Find(name);
      if (!r.has_value()) {
        res.status = 404;
        res.set_content(wire::ErrorBody("not_found", name), "application/json");
        return;
      }
      std::string out = "{\"name\":";
      setpoint::AppendJsonString(&out, name);
      out += ",\"address\":";
      setpoint::AppendJsonString(&out, r->address);
      out += "}";
      res.set_content(out, "application/json");
    });
    server_.Put(R"(/v1/records/([^/]+))", [this](const Request& req,
                                                 Response& res) {
      std::string name = req.matches[1];
      if (!wire::ValidName(name)) return Bad(res, "bad record name");
      absl::StatusOr<JsonValue> body = ParseJson(req.body);
      if (!body.ok() || !body->is_object()) {
        return Bad(res, "body: expected a JSON object");
      }
      const JsonValue* address = body->Find("address");
      if (address == nullptr || !address->is_string() ||
          address->str().empty() || address->str().size() > 255) {
        return Bad(res, "body: \"address\" must be a string of 1..255 bytes");
      }
      setpoint::Context ctx;
      if (!WithAssignment(req, res, &ctx)) return;
      Answer(api_.Put(ctx, name, Record{address->str()}), res);
    });
    server_.Delete(R"(/v1/records/([^/]+))",
                   [this](const Request& req, Response& res) {
                     std::string name = req.matches[1];
                     if (!wire::ValidName(name))
                       return Bad(res, "bad record name");
                     setpoint::Context ctx;
                     if (!WithAssignment(req, res, &ctx)) return;
                     Answer(api_.Delete(ctx, name), res);
                   });
    server_.Get("/v1/serial", [this](const Request&, Response& res) {
      res.set_content(absl::StrCat("{\"serial\":", api_.serial(), "}"),
                      "application/json");
    });
    server_.Put("/v1/serial", [this](const Request& req, Response& res) {
      absl::StatusOr<JsonValue> body = ParseJson(req.body);
      const JsonValue* serial =
          body.ok() && body->is_object() ? body->Find("serial") : nullptr;
      std::optional<int64_t> n =
          serial != nullptr ? serial->AsInt64() : std::nullopt;
      if (!n.has_value() || *n < 0) {
        return Bad(res, "body: expected {\"serial\": <count>}");
      }
      setpoint::Context ctx;
      if (!WithAssignment(req, res, &ctx)) return;
      Answer(api_.PublishSerial(ctx, *n), res);
    });
    server_.Get("/v1/stats", [this](const Request&, Response& res) {
      res.set_content(StatsJson(), "application/json");
    });
    server_.Get("/v1/writes", [this](const Request& req, Response& res) {
      int64_t from = 0;
      if (req.has_param("from") &&
          (!absl::SimpleAtoi(req.get_param_value("from"), &from) || from < 0)) {
        return Bad(res, "from: expected a count");
      }
      int64_t next = 0;
      std::vector<AcceptedWrite> log = api_.write_log(from, &next);
      if (static_cast<int64_t>(log.size()) > kMaxWritesPerPage) {
        next -= static_cast<int64_t>(log.size()) - kMaxWritesPerPage;
        log.resize(kMaxWritesPerPage);
      }
      // [time in µs since the epoch, node, kind, shard, token, the claimed
      // runs as [[begin, end], ...]]
      std::string out = absl::StrCat("{\"next\":", next, ",\"writes\":[");
      for (size_t i = 0; i < log.size(); ++i) {
        const AcceptedWrite& w = log[i];
        absl::StrAppend(&out, i == 0 ? "[" : ",[", absl::ToUnixMicros(w.time),
                        ",");
        setpoint::AppendJsonString(&out, w.node_id);
        out += ",";
        setpoint::AppendJsonString(&out, w.kind);
        absl::StrAppend(&out, ",", w.shard, ",", w.token, ",",
                        w.range.RunsJson(), "]");
      }
      out += "]}";
      res.set_content(out, "application/json");
    });
  }

  setpoint::Context Deadline() const {
    return setpoint::Context().WithTimeout(options_.io_timeout);
  }

  void Bad(Response& res, std::string_view message) {
    ++bad_requests_;
    res.status = 400;
    res.set_content(wire::ErrorBody("bad_request", message),
                    "application/json");
  }

  // Reads the write's assignment from its headers into `ctx` (none without
  // X-Setpoint-Node: the API refuses the write as not the owner's). False
  // when a header is malformed (answered 400).
  bool WithAssignment(const Request& req, Response& res,
                      setpoint::Context* ctx) {
    *ctx = Deadline();
    if (!req.has_header(wire::kNodeHeader)) return true;
    auto a = std::make_shared<setpoint::Assignment>();
    a->node_id = req.get_header_value(wire::kNodeHeader);
    a->kind = req.get_header_value(wire::kKindHeader);
    if (!wire::ValidId(a->node_id) || !wire::ValidId(a->kind)) {
      Bad(res, "X-Setpoint-Node and X-Setpoint-Kind: 1..256 printable bytes");
      return false;
    }
    if (!wire::ParseRange(req.get_header_value(wire::kRangeHeader),
                          &a->range)) {
      Bad(res, "X-Setpoint-Range: expected <begin>-<end>");
      return false;
    }
    if (!absl::SimpleAtoi(req.get_header_value(wire::kTokenHeader),
                          &a->token)) {
      Bad(res, "X-Setpoint-Token: expected an unsigned 64-bit integer");
      return false;
    }
    if (!absl::SimpleAtoi(req.get_header_value(wire::kRingHeader),
                          &a->ring_size) ||
        a->ring_size == 0 || a->ring_size > FakeRecordsApi::kMaxRingSize ||
        a->range.Hull().end > a->ring_size) {
      Bad(res,
          absl::StrCat("X-Setpoint-Ring: 1..", FakeRecordsApi::kMaxRingSize,
                       ", at least the range's end"));
      return false;
    }
    *ctx = ctx->WithValue(std::shared_ptr<const setpoint::Assignment>(a));
    return true;
  }

  void Answer(const absl::Status& s, Response& res) {
    if (s.ok()) {
      res.set_content("{\"ok\":true}", "application/json");
      return;
    }
    const char* code = "internal";
    res.status = 500;
    if (setpoint::IsStaleOwner(s)) {
      res.status = 409;
      code = "stale_token";
    } else if (absl::IsPermissionDenied(s)) {
      res.status = 403;
      code = "not_owner";
    } else if (absl::IsInvalidArgument(s)) {
      ++bad_requests_;
      res.status = 400;
      code = "bad_request";
    } else if (absl::IsResourceExhausted(s)) {
      res.status = 429;
      code = "throttled";
      absl::Duration after =
          setpoint::RetryAfterHint(s).value_or(absl::Seconds(1));
      res.set_header(wire::kRetryAfterMsHeader,
                     absl::StrCat(absl::ToInt64Milliseconds(after)));
      res.set_header("Retry-After", absl::StrCat(absl::ToInt64Seconds(
                                        absl::Ceil(after, absl::Seconds(1)))));
    } else if (absl::IsUnavailable(s)) {
      res.status = 503;
      code = "unavailable";
    } else if (absl::IsDeadlineExceeded(s) || absl::IsCancelled(s)) {
      res.status = 504;
      code = "timeout";
    }
    absl::string_view message = s.message();
    res.set_content(
        wire::ErrorBody(code, std::string_view(message.data(), message.size())),
        "application/json");
  }

  std::string StatsJson() const {
    RecordsApiStats s = api_.stats();
    auto writers = api_.writers();
    std::map<std::string, WriterStats> sorted(writers.begin(), writers.end());
    std::map<std::string, int64_t> stale_by_pod;
    std::map<std::string, int64_t> writes_by_pod;
    std::string out = absl::StrCat(
        "{\"writes\":", s.writes, ",\"stale_refused\":", s.stale_refused,
        ",\"unowned_refused\":", s.unowned_refused,
        ",\"injected_errors\":", s.injected_errors,
        ",\"serial_writes\":", s.serial_writes,
        ",\"max_concurrent_per_key\":", s.max_concurrent_per_key,
        ",\"bad_requests\":", bad_requests_.load(),
        ",\"records\":", api_.records().size(), ",\"serial\":", api_.serial(),
        ",\"writers\":{");
    bool first = true;
    for (const auto& [node, w] : sorted) {
      std::string pod = node.substr(0, node.find('/'));
      stale_by_pod[pod] += w.stale_refused;
      writes_by_pod[pod] += w.writes;
      if (!first) out += ",";
      first = false;
      setpoint::AppendJsonString(&out, node);
      absl::StrAppend(&out, ":{\"writes\":", w.writes,
                      ",\"stale_refused\":", w.stale_refused,
                      ",\"unowned_refused\":", w.unowned_refused,
                      ",\"range\":", w.range.RunsJson(), ",\"token\":", w.token,
                      ",\"last_write_us\":",
                      w.last_write == absl::InfinitePast()
                          ? int64_t{0}
                          : absl::ToUnixMicros(w.last_write),
                      "}");
    }
    out += "},\"stale_refused_by_pod\":";
    AppendCounts(&out, stale_by_pod);
    out += ",\"writes_by_pod\":";
    AppendCounts(&out, writes_by_pod);
    out += "}";
    return out;
  }
  static void AppendCounts(std::string* out,
                           const std::map<std::string, int64_t>& counts) {
    *out += "{";
    bool first = true;
    for (const auto& [key, n] : counts) {
      if (!first) *out += ",";
      first = false;
      setpoint::AppendJsonString(out, key);
      absl::StrAppend(out, ":", n);
    }
    *out += "}";
  }

  const RecordsApiServiceOptions options_;
  FakeRecordsApi api_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int64_t> bad_requests_{0};
};

}  // namespace sharded

#endif  // SETPOINT_EXAMPLES_SHARDED_RECORDS_API_SERVICE_H_
