// powerdns: keeps a PowerDNS zone in line with a YAML catalog, sharded
// across pods (setpoint::PodMain; Redis through --registry.*).
//
//   powerdns --api=http://127.0.0.1:8081 --api_key_file=key
//            --zone=example.org. --catalog=catalog.yaml --pod_id=a
//            --registry.type=redis --registry.address=127.0.0.1:6379
//
// --help lists every flag; exit codes 0 done, 1 failed, 2 bad configuration.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "setpoint/pod/pod_main.h"
#include "zone_controller.h"

namespace powerdns {
namespace {

absl::Status SetApi(const std::string& v, ZoneApiOptions* o) {
  absl::string_view rest = v;
  int port = 0;
  size_t colon = rest.rfind(':');
  if (!absl::ConsumePrefix(&rest, "http://") || colon == std::string::npos ||
      !absl::SimpleAtoi(v.substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError("expected http://<host>:<port>");
  }
  o->host = std::string(rest.substr(0, rest.rfind(':')));
  o->port = port;
  return absl::OkStatus();
}

absl::Status SetKeyFile(const std::string& path, ZoneApiOptions* o) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  o->api_key = std::string(absl::StripAsciiWhitespace(text.str()));
  if (!in || o->api_key.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read an API key from ", path));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  Settings s;
  ZoneApi api(&s.api);
  ZoneClient client(&api);
  setpoint::PodMainOptions options{
      .program = "powerdns",
      .description =
          "Keeps the rrsets of a PowerDNS zone in line with a "
          "YAML catalog; the nodes of kind rrsets split them.",
      .kinds = {RrsetsKind(&s, &api, &client).ToNodeKind()},
      .flags = {
          {.name = "api",
           .help = "http://<host>:<port> of the PowerDNS API (required)",
           .set = [&](const std::string& v) { return SetApi(v, &s.api); }},
          {.name = "api_key_file",
           .help = "a file holding the API key (required)",
           .set = [&](const std::string& v) { return SetKeyFile(v, &s.api); }},
          {.name = "zone",
           .help = "the zone, with its trailing dot (required)",
           .set =
               [&](const std::string& v) {
                 s.api.zone = v;
                 return absl::EndsWith(v, ".") && v.size() > 1
                            ? absl::OkStatus()
                            : absl::InvalidArgumentError("end it with a dot");
               }},
          {.name = "catalog",
           .help = "the YAML catalog, read again every second (required)",
           .set =
               [&](const std::string& v) {
                 s.catalog = v;
                 return ReadCatalog(v, "check.").status();
               }},
          {.name = "list_interval",
           .help = "how often the zone is listed (default 500ms)",
           .set =
               [&](const std::string& v) {
                 return absl::ParseDuration(v, &s.list_interval) &&
                                s.list_interval > absl::ZeroDuration()
                            ? absl::OkStatus()
                            : absl::InvalidArgumentError("not a duration");
               }},
      }};
  // The same parse PodMain makes, to ask for the flags it cannot know are
  // required.
  setpoint::PodArgsResult parsed = setpoint::ParsePodArgs(argc, argv, options);
  if (parsed.args.has_value() && (s.api.port == 0 || s.api.api_key.empty() ||
                                  s.api.zone.empty() || s.catalog.empty())) {
    std::fprintf(stderr,
                 "powerdns: --api, --api_key_file, --zone and --catalog are "
                 "required (--help)\n");
    return setpoint::kPodExitBadConfig;
  }
  return setpoint::PodMain(argc, argv, std::move(options));
}

}  // namespace
}  // namespace powerdns

int main(int argc, char** argv) { return powerdns::Main(argc, argv); }
