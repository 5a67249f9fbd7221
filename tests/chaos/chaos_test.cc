// Chaos test: P pods (chaos_pod processes, N nodes each) share a ring
// through one real redis-server, each through its own TcpProxy, while the
// test injects random faults for a bounded time: SIGKILL, SIGSTOP past the
// lease, SIGTERM, Redis restarts (empty, from a fresh snapshot, from an
// older one), CLIENT PAUSE, DEBUG SLEEP, CLIENT KILL, partitions, slow
// links and connection resets. Then it heals everything, waits until the
// ring is owned exactly once, stops the pods, and checks from the pods' own
// logs (analyzer.h) that no shard ever had two owners, that every client
// call of the pods' controllers ran inside its node's ownership and
// overlapped no other node's, that tokens grew, and how fast shards were
// owned again. tests/chaos/README.md has the knobs
// (SETPOINT_CHAOS_SEED, SETPOINT_CHAOS_SECONDS, ...) and how to replay.
#include <signal.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "chaos/chaos_harness.h"
#include "gtest/gtest.h"

namespace setpoint::chaos {
namespace {

// The promise the suite is for, on what a run found (the summary printed
// above names the shards, nodes and times of any breach).
void ExpectOneOwner(const ChaosHarness& harness) {
  if (::testing::Test::IsSkipped()) return;
  const ChaosOutcome& o = harness.outcome();
  ASSERT_TRUE(o.analysed) << "the run stopped before its analysis";
  EXPECT_EQ(o.overlaps_validity, 0)
      << "(a) double ownership with the validity cut (see the incidents)";
  EXPECT_EQ(o.overlaps_calls, 0)
      << "(b) double ownership by the UpdateShardRange calls alone";
  EXPECT_EQ(o.token_violations, 0) << "(c) token order violations";
  EXPECT_GT(o.client_calls, 0) << "(f) no client call was logged";
  EXPECT_EQ(o.client_violations, 0)
      << "(f) client calls outside their node's ownership or overlapping "
         "another node's";
}

TEST(ChaosTest, AtMostOneOwnerPerShardUnderFaults) {
  ChaosHarness harness(Config());
  harness.Run();
  ExpectOneOwner(harness);
}

// The longer mode's scale case: many pod processes of 2 nodes on one ring,
// under the faults that move shards between pods (kills, SIGTERMs and
// restarts, freezes, cut connections), with the same checks.
TEST(ChaosTest, ScaleManyPodProcesses) {
  ChaosConfig c = Config();
  if (c.scale_pods == 0) {
    GTEST_SKIP() << "the longer mode only (SETPOINT_CHAOS_LONG=1 or "
                    "SETPOINT_CHAOS_SCALE_PODS=N)";
  }
  c.pods = c.scale_pods;
  c.nodes = 2;
  c.ring = 1024;
  if (c.only_faults.empty()) {
    c.only_faults = "pod_kill,pod_term,pod_stop,conn_reset,partition";
  }
  ChaosHarness harness(c);
  harness.Run();
  ExpectOneOwner(harness);
}

// Static membership under the same faults: every pod restarts under its
// own pod id, so a successor takes its predecessor's places (after a
// SIGTERM, or finds its records after a SIGKILL) while the others stay;
// each process is still its own owner to the checks. Half the default
// fault phase.
TEST(ChaosTest, StaticMembershipUnderFaults) {
  ChaosConfig c = Config();
  c.static_membership = true;
  c.seconds = std::max<int64_t>(c.seconds / 2, 1);
  ChaosHarness harness(c);
  harness.Run();
  ExpectOneOwner(harness);
}

bool ParseInt(const char* s, int64_t* out) {
  return s != nullptr && absl::SimpleAtoi(s, out);
}

}  // namespace
}  // namespace setpoint::chaos

// Knobs: environment variables, then --key=value arguments after gtest's
// own flags (tests/chaos/README.md).
int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  ::testing::InitGoogleTest(&argc, argv);
  using setpoint::chaos::Config;
  using setpoint::chaos::ParseInt;
  auto& c = Config();
  std::map<std::string, std::string> kv;
  const std::pair<const char*, const char*> env[] = {
      {"SETPOINT_CHAOS_SECONDS", "duration"},
      {"SETPOINT_CHAOS_SEED", "seed"},
      {"SETPOINT_CHAOS_PODS", "pods"},
      {"SETPOINT_CHAOS_NODES", "nodes"},
      {"SETPOINT_CHAOS_RING", "ring"},
      {"SETPOINT_CHAOS_LEASE_MS", "lease_ms"},
      {"SETPOINT_CHAOS_POLL_MS", "poll_ms"},
      {"SETPOINT_CHAOS_SLACK_MS", "slack_ms"},
      {"SETPOINT_CHAOS_GRACEFUL_SLACK_MS", "graceful_slack_ms"},
      {"SETPOINT_CHAOS_REPORT", "report"},
      {"SETPOINT_CHAOS_KEEP", "keep"},
      {"SETPOINT_CHAOS_FAULTS", "faults"},
      {"SETPOINT_CHAOS_LONG", "long"},
      {"SETPOINT_CHAOS_SCALE_PODS", "scale_pods"},
      {"SETPOINT_CHAOS_STATIC_MEMBERSHIP", "static_membership"},
  };
  for (const auto& [var, key] : env) {
    const char* v = getenv(var);
    if (v != nullptr && *v != '\0') kv[key] = v;
  }
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      std::fprintf(stderr, "chaos_test: unknown argument %s\n", argv[i]);
      return 2;
    }
    kv[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  for (const auto& [key, value] : kv) {
    int64_t n = 0;
    bool ok = true;
    if (key == "report") {
      c.report = value;
    } else if (key == "faults") {
      c.only_faults = value;
    } else if (key == "keep") {
      c.keep = value != "0";
    } else if (key == "static_membership") {
      c.static_membership = value != "0";
    } else if (key == "long") {
      if (value != "0" && c.scale_pods == 0) c.scale_pods = 24;
    } else if (key == "seed") {
      ok = absl::SimpleAtoi(value, &c.seed);
      c.seed_set = ok;
    } else if (!(ok = ParseInt(value.c_str(), &n))) {
    } else if (key == "duration") {
      c.seconds = n;
    } else if (key == "pods") {
      c.pods = static_cast<int>(n);
    } else if (key == "scale_pods") {
      c.scale_pods = static_cast<int>(n);
    } else if (key == "nodes") {
      c.nodes = static_cast<int>(n);
    } else if (key == "ring") {
      c.ring = static_cast<uint32_t>(n);
    } else if (key == "lease_ms") {
      c.lease_ms = n;
    } else if (key == "poll_ms") {
      c.poll_ms = n;
    } else if (key == "slack_ms") {
      c.slack_ms = n;
    } else if (key == "graceful_slack_ms") {
      c.graceful_slack_ms = n;
    } else {
      std::fprintf(stderr, "chaos_test: unknown knob --%s\n", key.c_str());
      return 2;
    }
    if (!ok) {
      std::fprintf(stderr, "chaos_test: --%s=%s does not parse\n", key.c_str(),
                   value.c_str());
      return 2;
    }
  }
  if (c.pods < 2 || c.nodes < 1 || c.ring < 1 || c.seconds < 0 ||
      c.lease_ms <= c.poll_ms || c.scale_pods < 0 || c.scale_pods == 1) {
    std::fprintf(stderr, "chaos_test: bad configuration\n");
    return 2;
  }
  if (!c.seed_set) {
    std::random_device rd;
    c.seed = (static_cast<uint64_t>(rd()) << 32) | rd();
  }
  return RUN_ALL_TESTS();
}
