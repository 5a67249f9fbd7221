// PowerDnsFleet: the example's whole world on loopback, for its tests and
// its demo: a real redis-server, a real pdns_server with one zone, a
// catalog file, and pod processes of the example; plus the reads that
// check it (the zone through the API, the pods' /metrics).
//
// Thread safety: one owner thread.
#ifndef SETPOINT_EXAMPLES_POWERDNS_POWERDNS_FLEET_H_
#define SETPOINT_EXAMPLES_POWERDNS_POWERDNS_FLEET_H_

#include <httplib.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catalog.h"
#include "setpoint/base/status.h"
#include "setpoint/testing/child_process.h"
#include "setpoint/testing/pdns_server.h"
#include "setpoint/testing/redis_server.h"
#include "zone_api.h"

namespace powerdns {

// Polls `done` every 50 ms until it holds or `limit` passes.
inline bool WaitFor(const std::function<bool()>& done, absl::Duration limit) {
  absl::Time until = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

class PowerDnsFleet {
 public:
  static constexpr char kZone[] = "example.org.";

  explicit PowerDnsFleet(std::string pod_program)
      : program_(std::move(pod_program)) {
    char tmpl[] = "/tmp/setpoint-powerdns-XXXXXX";
    if (mkdtemp(tmpl) != nullptr) dir_ = tmpl;
  }
  ~PowerDnsFleet() {
    pods_.clear();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // Redis and PowerDNS (kNotFound when a program is missing), the zone.
  absl::Status Start() {
    if (dir_.empty()) return absl::InternalError("no temporary directory");
    SETPOINT_RETURN_IF_ERROR(redis_.Start());
    SETPOINT_RETURN_IF_ERROR(pdns_.Start());
    SETPOINT_RETURN_IF_ERROR(pdns_.CreateZone(kZone));
    std::ofstream(dir_ + "/key") << pdns_.api_key() << "\n";
    api_.port = pdns_.api_port();
    api_.api_key = pdns_.api_key();
    api_.zone = kZone;
    return absl::OkStatus();
  }

  // The catalog: `count` A rrsets host-NNNN at <prefix>.N.M, the first
  // `changed` at <changed_prefix>.N.M. Replaced whole (a rename), so a pod
  // never reads half of it.
  void WriteCatalog(int count, const std::string& prefix, int changed = 0,
                    const std::string& changed_prefix = "") {
    std::string tmp = dir_ + "/catalog.yaml.tmp";
    {
      std::ofstream out(tmp);
      out << "ttl: 300\nrecords:\n";
      for (int i = 0; i < count; ++i) {
        const std::string& p = i < changed ? changed_prefix : prefix;
        out << absl::StrFormat("  host-%04d: %s.%d.%d\n", i, p, i / 250,
                               i % 250);
      }
    }
    std::filesystem::rename(tmp, dir_ + "/catalog.yaml");
  }
  absl::StatusOr<Rrsets> Catalog() const {
    return ReadCatalog(dir_ + "/catalog.yaml", kZone);
  }
  absl::StatusOr<Rrsets> Zone() const {
    ZoneApi api(&api_);
    return api.List(setpoint::Context().WithTimeout(absl::Seconds(10)));
  }
  // The zone's managed rrsets equal the catalog's, exactly.
  bool Converged() const {
    auto zone = Zone();
    auto want = Catalog();
    return zone.ok() && want.ok() && *zone == *want;
  }

  // A pod process of the example, its listener on a free port.
  bool StartPod(const std::string& id) {
    Pod& pod = pods_[id];
    pod.http_port = setpoint::testing::FreeLoopbackPort();
    pod.process = std::make_unique<setpoint::testing::ChildProcess>(
        std::vector<std::string>{
            program_, "--pod_id=" + id, "--registry.type=redis",
            "--registry.address=" + redis_.address(),
            "--registry.namespace=powerdns", "--api=" + pdns_.api_url(),
            "--api_key_file=" + dir_ + "/key", absl::StrCat("--zone=", kZone),
            "--catalog=" + dir_ + "/catalog.yaml",
            absl::StrCat("--http.address=127.0.0.1:", pod.http_port),
            "--lease=2s", "--poll_interval=250ms", "--log_level=warn"});
    return pod.process->started();
  }
  // SIGKILL, and wait for it.
  void KillPod(const std::string& id) {
    auto it = pods_.find(id);
    if (it == pods_.end()) return;
    it->second.process->Signal(SIGKILL);
    it->second.process->AwaitExit();
    pods_.erase(it);
  }
  // SIGTERM every pod; true when all stopped with exit code 0.
  bool StopPods() {
    bool ok = true;
    for (auto& [id, pod] : pods_) pod.process->Signal(SIGTERM);
    for (auto& [id, pod] : pods_) ok = pod.process->AwaitExit() == 0 && ok;
    pods_.clear();
    return ok;
  }

  // The sum of a series (every label set) over the pods that answer.
  double Sum(const std::string& series) const {
    double sum = 0;
    for (const auto& [id, pod] : pods_) {
      double v = Scrape(pod.http_port, series);
      if (v > 0) sum += v;
    }
    return sum;
  }
  bool AllReady() const {
    for (const auto& [id, pod] : pods_) {
      if (Scrape(pod.http_port, "setpoint_pod_ready") != 1) return false;
    }
    return !pods_.empty();
  }
  // The pods that ended by themselves (a crash, a sanitizer's report):
  // their ids.
  std::vector<std::string> Ended() const {
    std::vector<std::string> ended;
    for (const auto& [id, pod] : pods_) {
      if (pod.process->Ended()) ended.push_back(id);
    }
    return ended;
  }
  // What the pods wrote on stderr so far, and the end of PowerDNS's log.
  std::string Logs() {
    std::string all;
    for (auto& [id, pod] : pods_) {
      pod.process->ReadUntil([] { return false; }, absl::Milliseconds(10));
      absl::StrAppend(&all, "--- pod ", id, "\n", pod.process->err());
    }
    for (const std::string& id : Ended()) {
      absl::StrAppend(&all, "--- pod ", id, " has ended by itself\n");
    }
    std::ifstream in(pdns_.log_path());
    std::string log((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
    if (log.size() > 4000) log = log.substr(log.size() - 4000);
    absl::StrAppend(&all, "--- pdns_server (the end of its log)\n", log);
    return all;
  }

  setpoint::testing::PdnsServer& pdns() { return pdns_; }
  setpoint::testing::RedisServer& redis() { return redis_; }

 private:
  struct Pod {
    std::unique_ptr<setpoint::testing::ChildProcess> process;
    int http_port = 0;
  };
  // Sums the series `name` in the scrape of 127.0.0.1:`port`; -1 when the
  // pod does not answer.
  static double Scrape(int port, const std::string& name) {
    httplib::Client c("127.0.0.1", port);
    c.set_connection_timeout(std::chrono::seconds(1));
    c.set_read_timeout(std::chrono::seconds(5));
    httplib::Result r = c.Get("/metrics");
    if (!r || r->status != 200) return -1;
    double sum = 0;
    for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
      if (line.empty() || line[0] == '#' || !absl::StartsWith(line, name)) {
        continue;
      }
      absl::string_view rest = line.substr(name.size());
      if (!rest.empty() && rest[0] != '{' && rest[0] != ' ') continue;
      double v = 0;
      if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
    }
    return sum;
  }

  std::string program_;
  std::string dir_;
  setpoint::testing::RedisServer redis_;
  setpoint::testing::PdnsServer pdns_;
  ZoneApiOptions api_;
  std::map<std::string, Pod> pods_;
};

}  // namespace powerdns

#endif  // SETPOINT_EXAMPLES_POWERDNS_POWERDNS_FLEET_H_
