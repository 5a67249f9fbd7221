// The PowerDNS example against real parts: a real pdns_server (sqlite
// backend), a real redis-server and three real pod processes of the
// example, all on loopback, started here. The zone read back through the
// API must equal the catalog exactly.
#include <httplib.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "catalog.h"
#include "gtest/gtest.h"
#include "setpoint/testing/child_process.h"
#include "setpoint/testing/pdns_server.h"
#include "setpoint/testing/redis_server.h"
#include "zone_api.h"

namespace powerdns {
namespace {

using setpoint::testing::ChildProcess;
using setpoint::testing::FreeLoopbackPort;
using setpoint::testing::PdnsServer;
using setpoint::testing::RedisServer;

constexpr char kZone[] = "example.org.";

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int kSlow = 4;  // Sanitized pods run a few times slower.
#else
constexpr int kSlow = 1;
#endif
#else
constexpr int kSlow = 1;
#endif

// Polls `done` every 50 ms until it holds or `limit` passes.
bool WaitFor(const std::function<bool()>& done, absl::Duration limit) {
  absl::Time until = absl::Now() + limit * kSlow;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

// Sums the values of the series named `name` (every label set) in the
// scrape of 127.0.0.1:`port`; -1 when the pod does not answer.
double Scrape(int port, const std::string& name) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(std::chrono::seconds(1));
  c.set_read_timeout(std::chrono::seconds(5));
  httplib::Result r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(r->body, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    if (!absl::StartsWith(line, name)) continue;
    absl::string_view rest = line.substr(name.size());
    if (!rest.empty() && rest[0] != '{' && rest[0] != ' ') continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
  }
  return sum;
}

class PowerDnsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SETPOINT_START_REDIS_OR_SKIP(redis_);
    SETPOINT_START_PDNS_OR_SKIP(pdns_);
    ASSERT_TRUE(pdns_.CreateZone(kZone).ok());
    char tmpl[] = "/tmp/setpoint-powerdns-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::ofstream(dir_ + "/key") << pdns_.api_key() << "\n";
    api_options_.port = pdns_.api_port();
    api_options_.api_key = pdns_.api_key();
    api_options_.zone = kZone;
  }
  void TearDown() override {
    pods_.clear();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  // Writes the catalog: `count` A rrsets host-NNNN, address prefix.N.
  // Replaced whole (a rename), so a pod never reads half of it.
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
  absl::StatusOr<Rrsets> Catalog() {
    return ReadCatalog(dir_ + "/catalog.yaml", kZone);
  }
  absl::StatusOr<Rrsets> Zone() {
    ZoneApi api(&api_options_);
    return api.List(setpoint::Context().WithTimeout(absl::Seconds(10)));
  }
  bool Converged() {
    auto zone = Zone();
    auto want = Catalog();
    return zone.ok() && want.ok() && *zone == *want;
  }

  struct Pod {
    std::unique_ptr<ChildProcess> process;
    int http_port = 0;
  };
  void StartPod(const std::string& id) {
    Pod pod;
    pod.http_port = FreeLoopbackPort();
    pod.process = std::make_unique<ChildProcess>(std::vector<std::string>{
        POWERDNS_POD, "--pod_id=" + id, "--registry.type=redis",
        "--registry.address=" + redis_.address(),
        "--registry.namespace=powerdns-test", "--api=" + pdns_.api_url(),
        "--api_key_file=" + dir_ + "/key", absl::StrCat("--zone=", kZone),
        "--catalog=" + dir_ + "/catalog.yaml",
        absl::StrCat("--http.address=127.0.0.1:", pod.http_port), "--lease=2s",
        "--poll_interval=250ms", "--log_level=warn"});
    ASSERT_TRUE(pod.process->started());
    pods_[id] = std::move(pod);
  }
  // The sum of a series over the pods that answer.
  double Sum(const std::string& series) {
    double sum = 0;
    for (auto& [id, pod] : pods_) {
      if (pod.process == nullptr) continue;
      double v = Scrape(pod.http_port, series);
      if (v > 0) sum += v;
    }
    return sum;
  }
  bool AllReady() {
    for (auto& [id, pod] : pods_) {
      if (Scrape(pod.http_port, "setpoint_pod_ready") != 1) return false;
    }
    return true;
  }
  std::string Logs() {
    std::string all;
    for (auto& [id, pod] : pods_) {
      if (pod.process == nullptr) continue;
      pod.process->ReadUntil([] { return false; }, absl::Milliseconds(10));
      absl::StrAppend(&all, "--- pod ", id, "\n", pod.process->err());
    }
    return all;
  }

  RedisServer redis_;
  PdnsServer pdns_;
  std::string dir_;
  ZoneApiOptions api_options_;
  std::map<std::string, Pod> pods_;
};

TEST_F(PowerDnsTest,
       ConvergesTwoThousandRecordsFromEmptyThenFiveHundredChanges) {
  WriteCatalog(2000, "10.0");
  for (const char* id : {"a", "b", "c"}) StartPod(id);
  absl::Time start = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return AllReady(); }, absl::Seconds(30))) << Logs();
  absl::Time ready = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return Converged(); }, absl::Seconds(60)))
      << Logs();
  absl::Time done = absl::Now();
  double patches = Sum("setpoint_syncer_batches_total");
  double lists = Sum("setpoint_source_lists_total");
  std::printf(
      "2000 records from an empty zone: %s after the pods started, %s after "
      "all were ready; %.0f PATCH calls (%.3f per record), %.0f lists of "
      "zone and catalog\n",
      absl::FormatDuration(absl::Trunc(done - start, absl::Milliseconds(1)))
          .c_str(),
      absl::FormatDuration(absl::Trunc(done - ready, absl::Milliseconds(1)))
          .c_str(),
      patches, patches / 2000, lists);
  EXPECT_GT(patches, 0);
  EXPECT_LE(patches / 2000, 0.3) << "batches of the Syncer: one PATCH for many";

  WriteCatalog(2000, "10.0", 500, "10.9");
  absl::Time changed = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return Converged(); }, absl::Seconds(30)))
      << Logs();
  double more = Sum("setpoint_syncer_batches_total") - patches;
  std::printf("500 changed: %s, %.0f PATCH calls\n",
              absl::FormatDuration(
                  absl::Trunc(absl::Now() - changed, absl::Milliseconds(1)))
                  .c_str(),
              more);
  EXPECT_LE(more, 500 * 0.3);
  auto zone = Zone();
  auto want = Catalog();
  ASSERT_TRUE(zone.ok() && want.ok());
  EXPECT_EQ(zone->size(), 2000u);
  EXPECT_TRUE(*zone == *want);
}

TEST_F(PowerDnsTest, AnOutageAndAKilledPodLoseNothingAndEndExact) {
  WriteCatalog(2000, "10.0");
  for (const char* id : {"a", "b", "c"}) StartPod(id);
  ASSERT_TRUE(WaitFor([&] { return Converged(); }, absl::Seconds(60)))
      << Logs();

  // Mid-sync: 500 records change, 300 are added; once some of it is in
  // the zone, pod c dies (SIGKILL) and PowerDNS goes down for 10 s.
  WriteCatalog(2300, "10.0", 500, "10.7");
  ASSERT_TRUE(WaitFor(
      [&] {
        auto zone = Zone();
        return zone.ok() && zone->size() > 2000;
      },
      absl::Seconds(30)))
      << Logs();
  pods_["c"].process->Signal(SIGKILL);
  pods_["c"].process->AwaitExit();
  pods_.erase("c");
  double before = Sum("setpoint_syncer_batches_total");
  pdns_.Stop();
  absl::Time down_until = absl::Now() + absl::Seconds(10);
  bool paused = false;
  while (absl::Now() < down_until) {  // The outage itself: 10 s.
    paused = paused || Sum("setpoint_syncer_paused") > 0;
    absl::SleepFor(absl::Milliseconds(250));
  }
  double during = Sum("setpoint_syncer_batches_total") - before;
  ASSERT_TRUE(pdns_.Start().ok());
  std::printf("PowerDNS down 10 s: %.0f batch calls sent meanwhile by 2 pods\n",
              during);
  EXPECT_TRUE(paused) << "the syncers pause while PowerDNS is down";
  // 4 nodes probing at most every 250 ms for 10 s, plus the first failures.
  EXPECT_LE(during, 4 * (40 + 8 + 2));

  // Back: what the catalog holds and the zone has never goes away again.
  auto want = Catalog();
  ASSERT_TRUE(want.ok());
  std::set<std::string> held;
  bool lost = false;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto zone = Zone();
        if (!zone.ok()) return false;
        for (const std::string& k : held) {
          if (!zone->contains(k)) lost = true;
        }
        for (const auto& [k, v] : *zone) {
          if (want->contains(k)) held.insert(k);
        }
        return *zone == *want;
      },
      absl::Seconds(60)))
      << Logs();
  EXPECT_FALSE(lost) << "a record of the catalog was deleted";
  auto zone = Zone();
  ASSERT_TRUE(zone.ok());
  EXPECT_EQ(zone->size(), 2300u);
  EXPECT_TRUE(*zone == *want);
}

}  // namespace
}  // namespace powerdns
