// The PowerDNS side of the example: a zone's rrsets read and written
// through the Authoritative server's HTTP API (GET a zone, PATCH many
// rrsets at once), and the Syncer's batch client on top of it. The client
// only translates: the Syncer batches, retries, backs off and pauses.
#ifndef SETPOINT_EXAMPLES_POWERDNS_ZONE_API_H_
#define SETPOINT_EXAMPLES_POWERDNS_ZONE_API_H_

#include <httplib.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "setpoint/base/context.h"
#include "setpoint/processor/syncer.h"

namespace powerdns {

using setpoint::Context;

// One rrset's data; its key is "<name> <type>" ("www.example.org. A").
struct Rrset {
  uint32_t ttl = 300;
  std::vector<std::string> contents;  // Sorted.
  bool operator==(const Rrset&) const = default;
};
using Rrsets = absl::flat_hash_map<std::string, Rrset>;

// The types the controller owns; the zone's SOA and NS stay PowerDNS's.
inline bool Managed(const std::string& type) {
  return type == "A" || type == "AAAA" || type == "CNAME" || type == "TXT" ||
         type == "MX" || type == "SRV";
}

struct ZoneApiOptions {
  std::string host = "127.0.0.1";
  int port = 8081;
  std::string api_key;
  std::string zone;  // With the trailing dot.
};

// Thread safety: any thread (a connection per call); `o` is read at each
// call and must not change while calls run.
class ZoneApi {
 public:
  explicit ZoneApi(const ZoneApiOptions* o) : o_(o) {}

  // Every managed rrset of the zone.
  absl::StatusOr<Rrsets> List(const Context& ctx) {
    httplib::Result r = Client(ctx).Get(Path(), Headers());
    if (absl::Status s = Check(r, 200); !s.ok()) return s;
    nlohmann::json zone = nlohmann::json::parse(r->body, nullptr, false);
    if (!zone.is_object() || !zone["rrsets"].is_array()) {
      return absl::InternalError("PowerDNS: the zone is not JSON with rrsets");
    }
    Rrsets out;
    // A field of the wrong type throws, which the source reports as a
    // failed list (nothing is deleted on it).
    for (const auto& set : zone["rrsets"]) {
      std::string type = set.is_object() ? set.value("type", "") : "";
      if (!Managed(type) || !set.contains("records")) continue;
      Rrset& one = out[absl::StrCat(set.value("name", ""), " ", type)];
      one.ttl = set.value("ttl", 0u);
      for (const auto& rec : set.at("records")) {
        one.contents.push_back(rec.value("content", ""));
      }
      std::sort(one.contents.begin(), one.contents.end());
    }
    return out;
  }

  // One PATCH: REPLACE or DELETE for each rrset, all or none.
  absl::Status Patch(const Context& ctx, const nlohmann::json& rrsets) {
    if (ctx.Done()) return ctx.Err();  // Cancelled: the key left.
    std::string body = nlohmann::json{{"rrsets", rrsets}}.dump();
    httplib::Result r =
        Client(ctx).Patch(Path(), Headers(), body, "application/json");
    return Check(r, 204);
  }

 private:
  std::string Path() const {
    return absl::StrCat("/api/v1/servers/localhost/zones/", o_->zone);
  }
  httplib::Headers Headers() const { return {{"X-API-Key", o_->api_key}}; }
  // A connection per call, its timeouts the context's deadline (the
  // syncer's operation_timeout), at most 10 s.
  httplib::Client Client(const Context& ctx) const {
    httplib::Client c(o_->host, o_->port);
    absl::Duration left =
        std::min(ctx.deadline() - absl::Now(), absl::Seconds(10));
    auto ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(left));
    c.set_connection_timeout(
        std::chrono::milliseconds(std::min<int64_t>(ms, 1000)));
    c.set_read_timeout(std::chrono::milliseconds(ms));
    c.set_write_timeout(std::chrono::milliseconds(ms));
    return c;
  }
  // Not reachable and 5xx are kUnavailable (the Syncer pauses on them);
  // 4xx names PowerDNS's own error.
  static absl::Status Check(const httplib::Result& r, int want) {
    if (!r) {
      auto e = r.error();
      if (e == httplib::Error::Read || e == httplib::Error::Write) {
        return absl::DeadlineExceededError(
            absl::StrCat("PowerDNS: ", httplib::to_string(e)));
      }
      return absl::UnavailableError(
          absl::StrCat("PowerDNS: ", httplib::to_string(e)));
    }
    if (r->status == want) return absl::OkStatus();
    nlohmann::json j = nlohmann::json::parse(r->body, nullptr, false);
    std::string why = j.is_object() ? j.value("error", r->body) : r->body;
    std::string text = absl::StrCat("PowerDNS: HTTP ", r->status, ": ", why);
    if (r->status >= 500) return absl::UnavailableError(text);
    if (r->status == 404) return absl::NotFoundError(text);
    return absl::InvalidArgumentError(text);
  }

  const ZoneApiOptions* o_;
};

// The Syncer's batch client: a batch of operations is one PATCH. When
// PowerDNS refuses a PATCH (422) for one rrset it names, that operation
// gets the error and the others kAborted, so they go again without it.
class ZoneClient final
    : public setpoint::BatchSyncerClient<std::string, Rrset, Rrset> {
 public:
  explicit ZoneClient(ZoneApi* api) : api_(api) {}
  using Op = setpoint::SyncOperation<std::string, Rrset, Rrset>;

  absl::Status Apply(const Context& ctx, std::span<Op> ops) override {
    nlohmann::json rrsets = nlohmann::json::array();
    for (const Op& op : ops) {
      std::pair<std::string, std::string> nt =
          absl::StrSplit(*op.key, absl::MaxSplits(' ', 1));
      nlohmann::json set = {{"name", nt.first}, {"type", nt.second}};
      if (op.op == setpoint::SyncOp::kDelete) {
        set["changetype"] = "DELETE";
      } else {
        set["changetype"] = "REPLACE";
        set["ttl"] = op.desired->ttl;
        set["records"] = nlohmann::json::array();
        for (const std::string& c : op.desired->contents) {
          set["records"].push_back({{"content", c}, {"disabled", false}});
        }
      }
      rrsets.push_back(std::move(set));
    }
    absl::Status s = api_->Patch(ctx, rrsets);
    if (!absl::IsInvalidArgument(s) || ops.size() == 1) return s;
    Op* named = nullptr;  // The longest name the error holds.
    size_t longest = 0;
    for (Op& op : ops) {
      std::string name = op.key->substr(0, op.key->find(' '));
      if (name.size() > longest &&
          s.message().find(name) != std::string_view::npos) {
        named = &op;
        longest = name.size();
      }
    }
    if (named == nullptr) return s;
    for (Op& op : ops) {
      op.status =
          &op == named
              ? s
              : absl::AbortedError("another rrset of the batch was refused");
    }
    return absl::OkStatus();
  }

 private:
  ZoneApi* api_;
};

}  // namespace powerdns

#endif  // SETPOINT_EXAMPLES_POWERDNS_ZONE_API_H_
