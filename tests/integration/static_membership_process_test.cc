// Static membership with real processes: three pods (the chaos suite's
// pod, with --static_membership=1) share a ring through a real
// redis-server; each in turn gets SIGTERM (or SIGKILL: a crash, its records
// left behind) and a new process with the same pod id takes its place (a
// StatefulSet's rolling restart). From the processes' own logs
// (chaos/analyzer.h) the test checks that no shard ever had two owners,
// that every client call ran inside its node's ownership, that tokens
// grew, and that while a pod restarted no other pod's node was moved: the
// restarting pod's places waited for its successor.
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "chaos/analyzer.h"
#include "chaos/spawn.h"
#include "gtest/gtest.h"
#include "setpoint/testing/await.h"
#include "setpoint/testing/redis_server.h"

namespace setpoint {
namespace {

using ::setpoint::testing::AwaitCondition;
using ::setpoint::testing::RedisServer;

// 3 pods × 2 nodes on 60 shards: 10 each, no odd shards (an odd one may
// go to another node when its holder restarts; see docs/pod.md).
constexpr uint32_t kRing = 60;
constexpr int kNodes = 2;
constexpr int64_t kLeaseMs = 1500;
constexpr int64_t kPollMs = 250;

int64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// One process of the chaos suite's pod.
class PodProcess {
 public:
  PodProcess(const std::string& redis, const std::string& id, int incarnation,
             const std::string& dir)
      : id_(id),
        incarnation_(incarnation),
        log_(absl::StrCat(dir, "/", id, ".", incarnation, ".log")) {
    pid_ = chaos::SpawnChild({
        SETPOINT_CHAOS_POD,
        "--redis=" + redis,
        "--pod=" + id,
        "--log=" + log_,
        absl::StrCat("--nodes=", kNodes),
        absl::StrCat("--ring=", kRing),
        absl::StrCat("--lease_ms=", kLeaseMs),
        absl::StrCat("--poll_ms=", kPollMs),
        "--ns=static",
        "--static_membership=1",
    });
  }
  ~PodProcess() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  PodProcess(const PodProcess&) = delete;
  PodProcess& operator=(const PodProcess&) = delete;

  // Sends `sig`, then returns the exit status once it exited (-1 if it
  // never started).
  int Terminate(int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    death_ = Now();
    return status;
  }
  // The log as the analyzer reads it, with the pod and its nodes named
  // after the incarnation ("a#1", "a#1/work/0"): two processes with one
  // pod id are two owners to the checks.
  chaos::PodRecord Record() const {
    chaos::PodRecord rec;
    absl::StatusOr<chaos::PodLog> log = chaos::ReadPodLog(log_);
    if (!log.ok()) return rec;
    rec.log = *std::move(log);
    chaos::NameIncarnation(&rec.log, id_, absl::StrCat(id_, "#", incarnation_));
    rec.death = death_;
    return rec;
  }

 private:
  const std::string id_;
  const int incarnation_;
  const std::string log_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int64_t death_ = chaos::kNever;
};

bool OwnedOnce(const std::vector<std::unique_ptr<PodProcess>>& pods,
               std::string* why) {
  std::vector<chaos::PodRecord> recs;
  for (const auto& p : pods) recs.push_back(p->Record());
  std::vector<const chaos::PodRecord*> ptrs;
  for (const auto& r : recs) ptrs.push_back(&r);
  return chaos::OwnedOnceAt(ptrs, kRing, Now(), false, why);
}

// Restarts each pod in turn with `sig` (SIGTERM: graceful, SIGKILL: a
// crash) and a successor under the same pod id, then checks the logs.
void RollingRestart(int sig) {
  RedisServer server;
  SETPOINT_START_REDIS_OR_SKIP(server);
  char tmpl[] = "/tmp/setpoint-static-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const absl::Duration wait = absl::Seconds(30);
  const std::vector<std::string> ids = {"a", "b", "c"};
  std::vector<std::unique_ptr<PodProcess>> live;
  std::vector<std::unique_ptr<PodProcess>> gone;
  for (const std::string& id : ids) {
    live.push_back(std::make_unique<PodProcess>(server.address(), id, 0, dir));
  }
  std::string why;
  ASSERT_TRUE(AwaitCondition([&] { return OwnedOnce(live, &why); }, wait))
      << why;

  struct Step {
    int64_t term = 0;
    int64_t owned = 0;
  };
  std::vector<Step> steps;
  for (size_t i = 0; i < live.size(); ++i) {
    Step step{.term = Now()};
    const int status = live[i]->Terminate(sig);
    if (sig == SIGTERM) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ids[i];
    }
    gone.push_back(std::move(live[i]));
    live[i] = std::make_unique<PodProcess>(server.address(), ids[i], 1, dir);
    ASSERT_TRUE(AwaitCondition([&] { return OwnedOnce(live, &why); }, wait))
        << "after restarting " << ids[i] << ": " << why;
    step.owned = Now();
    steps.push_back(step);
  }
  for (auto& p : live) {
    const int status = p->Terminate();
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    gone.push_back(std::move(p));
  }

  std::vector<chaos::PodRecord> recs;
  for (const auto& p : gone) recs.push_back(p->Record());
  std::vector<const chaos::PodRecord*> ptrs;
  std::vector<chaos::Interval> intervals;
  std::vector<chaos::Grant> grants;
  for (const chaos::PodRecord& r : recs) {
    ptrs.push_back(&r);
    EXPECT_EQ(r.log.bad_lines, 0) << r.log.pod;
    for (const chaos::Interval& iv : chaos::Intervals(r, chaos::Cut::kValidity))
      intervals.push_back(iv);
    for (const chaos::Grant& g : chaos::Grants(r)) grants.push_back(g);
  }
  std::sort(
      grants.begin(), grants.end(),
      [](const chaos::Grant& x, const chaos::Grant& y) { return x.at < y.at; });
  const chaos::OwnerCheck owners = chaos::CheckOneOwner(intervals, kRing);
  EXPECT_TRUE(owners.overlaps.empty())
      << owners.overlaps.size() << " overlaps, the first on shard "
      << owners.overlaps.front().shard << ": "
      << owners.overlaps.front().first.node << " and "
      << owners.overlaps.front().second.node;
  EXPECT_TRUE(chaos::CheckTokens(grants, kRing, true).empty());
  const chaos::CallCheck calls = chaos::CheckClientCalls(ptrs, kRing);
  EXPECT_GT(calls.calls, 0);
  EXPECT_TRUE(calls.violations.empty())
      << calls.violations.size() << " client calls broke the promise";

  // While a pod restarted, no node of another pod was told anything: its
  // places waited for the successor.
  for (size_t i = 0; i < steps.size(); ++i) {
    for (const chaos::PodRecord& r : recs) {
      if (r.log.pod.rfind(ids[i] + "#", 0) == 0) continue;
      for (const auto& [node, list] : r.log.calls) {
        for (const chaos::Call& c : list) {
          EXPECT_FALSE(c.begin >= steps[i].term && c.begin <= steps[i].owned)
              << node << " moved to " << c.to.ToString() << " while " << ids[i]
              << " restarted";
        }
      }
    }
    std::printf("restart of %s: ring owned once again after %.1f ms\n",
                ids[i].c_str(), (steps[i].owned - steps[i].term) / 1e6);
  }
  // The logs stay for a failure to be read.
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

TEST(StaticMembershipProcessTest, AGracefulRollingRestartMovesNoOtherPod) {
  RollingRestart(SIGTERM);
}

// The crashed pod's records stay (its lease has not ended); its successor
// releases them and grants its nodes the shards again, with larger tokens,
// and the others still move nothing.
TEST(StaticMembershipProcessTest, ACrashRestartUnderTheSameIdMovesNoOtherPod) {
  RollingRestart(SIGKILL);
}

}  // namespace
}  // namespace setpoint
