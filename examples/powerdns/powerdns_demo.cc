// The PowerDNS demo (scripts/powerdns-demo): its own redis-server,
// pdns_server and three pods of the example on loopback. It prints how
// 2,000 records converge from an empty zone and what that cost in HTTP
// calls, changes 500, kills a pod, stops PowerDNS for 5 s, and ends with the
// exact comparison of the zone with the catalog as its verdict (exit 0 when
// they are equal). Every process it started ends with it.
#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "powerdns_fleet.h"

namespace powerdns {
namespace {

std::string Ms(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(1)));
}

int Demo() {
  PowerDnsFleet fleet(POWERDNS_POD);
  if (absl::Status s = fleet.Start(); !s.ok()) {
    std::fprintf(stderr, "powerdns-demo: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("redis-server, pdns_server (zone %s) started on loopback\n",
              PowerDnsFleet::kZone);
  fleet.WriteCatalog(2000, "10.0");
  for (const char* id : {"a", "b", "c"}) fleet.StartPod(id);
  bool ok = WaitFor([&] { return fleet.AllReady(); }, absl::Seconds(30));
  absl::Time ready = absl::Now();
  ok = ok && WaitFor([&] { return fleet.Converged(); }, absl::Seconds(60));
  double patches = fleet.Sum("setpoint_syncer_batches_total");
  double lists = fleet.Sum("setpoint_source_lists_total");
  std::printf(
      "3 pods: 2000 records from an empty zone %s in %s after the pods were "
      "ready; %.0f PATCH calls (%.3f per record), %.0f lists of the zone and "
      "the catalog (one per pod per interval)\n",
      ok ? "converged" : "did NOT converge", Ms(absl::Now() - ready).c_str(),
      patches, patches / 2000, lists);

  fleet.WriteCatalog(2000, "10.0", 500, "10.9");
  absl::Time t = absl::Now();
  ok = WaitFor([&] { return fleet.Converged(); }, absl::Seconds(30)) && ok;
  std::printf("500 addresses changed: converged in %s\n",
              Ms(absl::Now() - t).c_str());

  std::printf("SIGKILL pod c, 300 records added, PowerDNS down for 5 s...\n");
  fleet.KillPod("c");
  fleet.WriteCatalog(2300, "10.0", 500, "10.9");
  fleet.pdns().Stop();
  double before = fleet.Sum("setpoint_syncer_batches_total");
  absl::SleepFor(absl::Seconds(5));  // The outage the demo shows.
  double during = fleet.Sum("setpoint_syncer_batches_total") - before;
  ok = fleet.pdns().Start().ok() && ok;
  t = absl::Now();
  ok = WaitFor([&] { return fleet.Converged(); }, absl::Seconds(60)) && ok;
  std::printf(
      "while PowerDNS was down the 2 pods left sent %.0f batch calls (writes "
      "wait while the zone's list fails, and pause when they fail); back: "
      "converged in %s\n",
      during, Ms(absl::Now() - t).c_str());

  auto zone = fleet.Zone();
  auto want = fleet.Catalog();
  bool exact = zone.ok() && want.ok() && *zone == *want;
  ok = fleet.StopPods() && ok && exact;
  std::printf("zone %s the catalog (%zu rrsets)\n",
              exact ? "equals" : "DIFFERS FROM", zone.ok() ? zone->size() : 0);
  std::printf("%s\n", ok ? "powerdns-demo: OK" : "powerdns-demo: FAILED");
  if (!ok) std::fprintf(stderr, "%s", fleet.Logs().c_str());
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace powerdns

int main() { return powerdns::Demo(); }
