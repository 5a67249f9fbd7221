// The example's controller: every rrset of the catalog exists in the
// PowerDNS zone as written, and no other managed rrset does. Nodes of kind
// "rrsets" split the keys; the zone's list and the catalog are read once
// per pod (shared sources) and each node sees its range of them.
#ifndef SETPOINT_EXAMPLES_POWERDNS_ZONE_CONTROLLER_H_
#define SETPOINT_EXAMPLES_POWERDNS_ZONE_CONTROLLER_H_

#include <string>

#include "catalog.h"
#include "setpoint/controller/controller.h"
#include "zone_api.h"

namespace powerdns {

struct Settings {
  ZoneApiOptions api;
  std::string catalog;  // The YAML file.
  absl::Duration list_interval = absl::Milliseconds(500);
};

// No leader job keeps the zone's serial: PowerDNS checks no fencing token,
// so a leader frozen after its lease could still write an older serial.
// The zone is made with soa_edit_api, and PowerDNS raises the serial on
// every PATCH itself.
inline setpoint::ControllerKind RrsetsKind(const Settings* s, ZoneApi* api,
                                           ZoneClient* client) {
  return {.kind = "rrsets",
          .count = 2,
          .build = [=](setpoint::ControllerBuilder& b) {
            auto* seen = b.SharedPoll<std::string, Rrset>(
                "zone", [api](const Context& ctx) { return api->List(ctx); },
                {.interval = s->list_interval});
            auto* want = b.SharedPoll<std::string, Rrset>(
                "catalog",
                [s](const Context&) {
                  return ReadCatalog(s->catalog, s->api.zone);
                },
                {.interval = absl::Seconds(1)});
            b.Sync(
                "rrsets", client, seen, want,
                setpoint::SyncerOptions<Rrset, Rrset>{
                    .name = "rrsets", .operation_timeout = absl::Seconds(5)});
            return absl::OkStatus();
          }};
}

}  // namespace powerdns

#endif  // SETPOINT_EXAMPLES_POWERDNS_ZONE_CONTROLLER_H_
