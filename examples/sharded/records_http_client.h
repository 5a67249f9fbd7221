// HttpRecordsApi: the RecordsApi of a records API service (records_api_server,
// records_api_service.h) over HTTP, so the controller of every pod writes
// to one API. Every write sends the assignment it was started under
// (setpoint::AssignmentOf(ctx)); a write the service refuses for its token
// comes back as setpoint::StaleOwnerError, so the library counts it.
//
//   auto api = HttpRecordsApi::Create({.url = "http://127.0.0.1:8080",
//                                      .think = absl::Milliseconds(600)});
//   RecordClient client(api->get());
//
// A write reads the record first and returns at once when it already is as
// wanted; otherwise it "thinks" for `think` (work a real client does
// between reading and writing: validation, rendering, a slow library)
// without watching its context, then sends the write. The context is
// checked before the read; during the requests its cancellation aborts
// them and its deadline bounds them. So a pod frozen during the think
// sends its write when it thaws, with the token of the assignment it was
// started under: the service refuses it when the shard's next owner has
// written since.
//
// Thread safety: thread-safe; every request has its own connection.
#ifndef SETPOINT_EXAMPLES_SHARDED_RECORDS_HTTP_CLIENT_H_
#define SETPOINT_EXAMPLES_SHARDED_RECORDS_HTTP_CLIENT_H_

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

struct HttpRecordsApiOptions {
  // "http://<host>:<port>"; required.
  std::string url = "";
  // Between a write's read and its send; not cut short by cancellation.
  absl::Duration think = absl::ZeroDuration();
  // Per request, when the context has no earlier deadline.
  absl::Duration timeout = absl::Seconds(5);
};

class HttpRecordsApi final : public RecordsApi {
 public:
  static absl::StatusOr<std::unique_ptr<HttpRecordsApi>> Create(
      HttpRecordsApiOptions options) {
    constexpr std::string_view kScheme = "http://";
    std::string_view url = options.url;
    if (url.substr(0, kScheme.size()) != kScheme) {
      return absl::InvalidArgumentError("expected http://<host>:<port>");
    }
    url.remove_prefix(kScheme.size());
    size_t colon = url.rfind(':');
    int port = 0;
    if (colon == std::string_view::npos || colon == 0 ||
        !absl::SimpleAtoi(
            absl::string_view(url.data() + colon + 1, url.size() - colon - 1),
            &port) ||
        port <= 0 || port > 65535 ||
        url.substr(0, colon).find('/') != url.npos) {
      return absl::InvalidArgumentError("expected http://<host>:<port>");
    }
    if (options.think < absl::ZeroDuration() ||
        options.timeout <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError("think >= 0 and timeout > 0");
    }
    return std::unique_ptr<HttpRecordsApi>(new HttpRecordsApi(
        std::move(options), std::string(url.substr(0, colon)), port));
  }

  absl::StatusOr<Records> List(const setpoint::Context& ctx) override {
    SETPOINT_ASSIGN_OR_RETURN(Answer a, Send(ctx, "GET", "/v1/records"));
    SETPOINT_RETURN_IF_ERROR(StatusOf(a, "list"));
    absl::StatusOr<JsonValue> body = ParseJson(a.body);
    const JsonValue* records =
        body.ok() && body->is_object() ? body->Find("records") : nullptr;
    if (records == nullptr || !records->is_object()) {
      return absl::DataLossError("list: the answer has no records object");
    }
    Records out;
    for (const auto& [name, r] : records->fields()) {
      out[name] = Record{r.StringOr("address")};
    }
    return out;
  }
  absl::Status Put(const setpoint::Context& ctx, const std::string& name,
                   const Record& record) override {
    return Write(ctx, name, &record);
  }
  absl::Status Delete(const setpoint::Context& ctx,
                      const std::string& name) override {
    return Write(ctx, name, nullptr);
  }
  absl::Status PublishSerial(const setpoint::Context& ctx,
                             int64_t serial) override {
    SETPOINT_ASSIGN_OR_RETURN(Answer a,
                              Send(ctx, "PUT", "/v1/serial",
                                   absl::StrCat("{\"serial\":", serial, "}"),
                                   AssignmentHeaders(ctx)));
    return StatusOf(a, "serial");
  }
  int64_t serial() const override {
    absl::StatusOr<Answer> a = Send(setpoint::Context(), "GET", "/v1/serial");
    if (!a.ok() || a->status != 200) return -1;
    absl::StatusOr<JsonValue> body = ParseJson(a->body);
    return body.ok() ? body->IntOr("serial", -1) : -1;
  }

 private:
  struct Answer {
    int status = 0;
    std::string body;
    std::string retry_after_ms;
  };

  HttpRecordsApi(HttpRecordsApiOptions options, std::string host, int port)
      : options_(std::move(options)), host_(std::move(host)), port_(port) {}

  absl::Status Write(const setpoint::Context& ctx, const std::string& name,
                     const Record* want) {
    std::string path = "/v1/records/" + wire::EscapePath(name);
    SETPOINT_RETURN_IF_ERROR(ctx.Err());
    // Read: nothing to do when the record already is as wanted.
    SETPOINT_ASSIGN_OR_RETURN(Answer now, Send(ctx, "GET", path));
    if (now.status == 404 && want == nullptr) return absl::OkStatus();
    if (now.status == 200 && want != nullptr) {
      absl::StatusOr<JsonValue> body = ParseJson(now.body);
      if (body.ok() && body->StringOr("address") == want->address) {
        return absl::OkStatus();
      }
    } else if (now.status != 404) {
      SETPOINT_RETURN_IF_ERROR(StatusOf(now, name));
    }
    // Think, deliberately deaf to the context (see the header comment).
    if (options_.think > absl::ZeroDuration()) absl::SleepFor(options_.think);
    std::string body;
    if (want != nullptr) {
      body = "{\"address\":";
      setpoint::AppendJsonString(&body, want->address);
      body += "}";
    }
    SETPOINT_ASSIGN_OR_RETURN(
        Answer done, Send(ctx, want != nullptr ? "PUT" : "DELETE", path,
                          std::move(body), AssignmentHeaders(ctx),
                          /*check_first=*/false));
    return StatusOf(done, name);
  }

  static httplib::Headers AssignmentHeaders(const setpoint::Context& ctx) {
    const setpoint::Assignment* a = setpoint::AssignmentOf(ctx);
    if (a == nullptr) return {};  // The service refuses it: not the owner.
    return {{wire::kNodeHeader, a->node_id},
            {wire::kKindHeader, a->kind},
            {wire::kRangeHeader, wire::FormatRange(a->range)},
            {wire::kTokenHeader, absl::StrCat(a->token)},
            {wire::kRingHeader, absl::StrCat(a->ring_size)}};
  }

  // One request on a connection of its own. `check_first`: fail at once
  // when the context already ended. Either way its cancellation aborts the
  // request in flight and its deadline bounds it.
  absl::StatusOr<Answer> Send(const setpoint::Context& ctx, const char* method,
                              const std::string& path, std::string body = "",
                              httplib::Headers headers = {},
                              bool check_first = true) const {
    if (check_first) SETPOINT_RETURN_IF_ERROR(ctx.Err());
    absl::Duration budget = options_.timeout;
    bool ctx_bound = false;  // The context's deadline sets the budget.
    if (ctx.deadline() != absl::InfiniteFuture() &&
        ctx.deadline() - ctx.clock()->Now() < budget) {
      budget = ctx.deadline() - ctx.clock()->Now();
      ctx_bound = true;
    }
    if (budget <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat(method, " ", path, ": no time left"));
    }
    auto timeout =
        std::chrono::microseconds(absl::ToInt64Microseconds(budget) + 1);
    httplib::Client client(host_, port_);
    client.set_keep_alive(false);
    client.set_connection_timeout(timeout);
    client.set_read_timeout(timeout);
    client.set_write_timeout(timeout);
    std::stop_callback abort(ctx.stop_token(), [&client] { client.stop(); });
    std::string m = method;
    httplib::Result res =
        m == "GET"      ? client.Get(path, headers)
        : m == "DELETE" ? client.Delete(path, headers)
                        : client.Put(path, headers, body, "application/json");
    if (!res) {
      if (ctx.Cancelled()) return ctx.Err();
      std::string why = httplib::to_string(res.error());
      bool timed_out = res.error() == httplib::Error::Read ||
                       res.error() == httplib::Error::Write ||
                       res.error() == httplib::Error::ConnectionTimeout;
      if (timed_out && ctx_bound) {
        return absl::DeadlineExceededError(
            absl::StrCat(method, " ", path, ": ", why, " (deadline)"));
      }
      return absl::UnavailableError(absl::StrCat(method, " ", path, ": ", why));
    }
    return Answer{res->status, res->body,
                  res->get_header_value(wire::kRetryAfterMsHeader)};
  }

  // The status a service answer stands for.
  static absl::Status StatusOf(const Answer& a, std::string_view what) {
    if (a.status >= 200 && a.status < 300) return absl::OkStatus();
    absl::StatusOr<JsonValue> body = ParseJson(a.body);
    std::string message = absl::StrCat(
        std::string(what), ": HTTP ", a.status, " ",
        body.ok() && body->is_object() ? body->StringOr("message") : a.body);
    std::string code = body.ok() && body->is_object() ? body->StringOr("error")
                                                      : std::string();
    switch (a.status) {
      case 409:
        if (code == "stale_token") return setpoint::StaleOwnerError(message);
        return absl::AbortedError(message);
      case 403:
        return absl::PermissionDeniedError(message);
      case 404:
        return absl::NotFoundError(message);
      case 429: {
        int64_t ms = 1000;
        if (!absl::SimpleAtoi(a.retry_after_ms, &ms) || ms < 0) ms = 1000;
        return setpoint::WithRetryAfter(absl::ResourceExhaustedError(message),
                                        absl::Milliseconds(ms));
      }
      case 503:
        return absl::UnavailableError(message);
      case 504:
        return absl::DeadlineExceededError(message);
      default:
        if (a.status >= 400 && a.status < 500) {
          return absl::InvalidArgumentError(message);
        }
        return absl::UnavailableError(message);
    }
  }

  const HttpRecordsApiOptions options_;
  const std::string host_;
  const int port_;
};

}  // namespace sharded

#endif  // SETPOINT_EXAMPLES_SHARDED_RECORDS_HTTP_CLIENT_H_
