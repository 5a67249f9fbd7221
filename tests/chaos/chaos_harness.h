// The chaos suite's harness (chaos_test.cc runs it): the pod processes
// behind their proxies, one real redis-server, the random faults and their
// records (chaos_harness.cc), and the analysis of the pods' logs with the
// summary and the checks (chaos_report.cc). tests/chaos/README.md has the
// knobs and how to replay a run.
//
// Thread safety: one harness per test, driven by the test's thread.
#ifndef SETPOINT_TESTS_CHAOS_CHAOS_HARNESS_H_
#define SETPOINT_TESTS_CHAOS_CHAOS_HARNESS_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "chaos/analyzer.h"
#include "chaos/chaos_redis.h"
#include "chaos/tcp_proxy.h"

#ifndef SETPOINT_CHAOS_DEFAULT_SECONDS
#define SETPOINT_CHAOS_DEFAULT_SECONDS 120
#endif

namespace setpoint::chaos {

// Room on top of the protocol's own bounds for a loaded 2-core machine;
// sanitizer builds run every process several times slower.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int64_t kDefaultSlackMs = 1500;
constexpr int64_t kDefaultGracefulSlackMs = 1000;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr int64_t kDefaultSlackMs = 1500;
constexpr int64_t kDefaultGracefulSlackMs = 1000;
#else
constexpr int64_t kDefaultSlackMs = 300;
constexpr int64_t kDefaultGracefulSlackMs = 250;
#endif
#else
constexpr int64_t kDefaultSlackMs = 300;
constexpr int64_t kDefaultGracefulSlackMs = 250;
#endif

// The protocol's own bound for a graceful handoff.
constexpr int64_t kGracefulBoundMs = 50;
constexpr int64_t kMs = 1'000'000;

struct ChaosConfig {
  int64_t seconds = SETPOINT_CHAOS_DEFAULT_SECONDS;
  uint64_t seed = 0;
  bool seed_set = false;
  int pods = 4;
  int nodes = 3;
  uint32_t ring = 256;
  int64_t lease_ms = 1500;
  int64_t poll_ms = 250;
  int64_t slack_ms = kDefaultSlackMs;
  int64_t graceful_slack_ms = kDefaultGracefulSlackMs;
  std::string report;       // JSON summary path.
  bool keep = false;        // Keep the run directory even when it passes.
  std::string only_faults;  // Comma-separated kinds; empty: all.
  // The longer mode's scale case (ScaleManyPodProcesses): this many pod
  // processes; 0 skips it.
  int scale_pods = 0;
  // Static membership: every pod runs with --static_membership=1 and is
  // restarted under its slot's own pod id, so a SIGTERM keeps its places
  // for the successor (or until the lease ends) and a successor may find
  // its predecessor's records. Each process is still analysed apart.
  bool static_membership = false;
};

inline ChaosConfig& Config() {
  static ChaosConfig* config = new ChaosConfig();
  return *config;
}

inline int64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Every child process, for the watchdog.
constexpr int kMaxChildren = 1024;
inline std::atomic<pid_t> g_children[kMaxChildren];
inline std::atomic<int> g_child_count{0};

inline void RegisterChild(pid_t pid) {
  int i = g_child_count.fetch_add(1);
  if (i < kMaxChildren) g_children[i].store(pid);
}

// Kills every child and exits if the test outlives its bound (a hang in
// the harness itself); children also die with us (PR_SET_PDEATHSIG).
class Watchdog {
 public:
  explicit Watchdog(int64_t deadline)
      : thread_([deadline](std::stop_token stop) {
          std::mutex m;
          std::condition_variable_any cv;
          std::unique_lock lock(m);
          auto until = std::chrono::steady_clock::now() +
                       std::chrono::nanoseconds(deadline - Now());
          if (cv.wait_until(lock, stop, until, [] { return false; }) ||
              stop.stop_requested()) {
            return;
          }
          std::fprintf(stderr,
                       "[chaos] watchdog: the test ran past its bound; "
                       "killing every child and exiting\n");
          int n = std::min(g_child_count.load(), kMaxChildren);
          for (int i = 0; i < n; ++i) {
            pid_t pid = g_children[i].load();
            if (pid > 0) {
              kill(pid, SIGCONT);
              kill(pid, SIGKILL);
            }
          }
          _exit(3);
        }) {}

 private:
  std::jthread thread_;
};

struct PodProcess {
  // Names this process in the run, the logs and the analysis ("p1r2").
  // With static membership it runs under its slot's pod id ("p1") and the
  // analysis renames its nodes after `id` (NameIncarnation).
  std::string id;
  std::string pod_id;
  std::string log_path;
  pid_t pid = -1;
  int slot = -1;
  int64_t launched = 0;
  int64_t death = kNever;
  bool reaped = false;
  int status = 0;
  bool killed = false;         // SIGKILL by the driver.
  int64_t term_sent = kNever;  // SIGTERM by the driver.
  std::vector<Span> stops;     // [SIGSTOP, SIGCONT).
  bool stopped = false;

  ~PodProcess() {
    if (pid > 0 && !reaped) {
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
};

struct Slot {
  std::unique_ptr<TcpProxy> proxy;
  PodProcess* pod = nullptr;  // The current one; null while awaiting restart.
  int incarnation = 0;
  int64_t restart_at = kNever;
  bool faulted = false;  // A pod or proxy fault is active on it.
};

enum class Kind {
  kPodKill,
  kPodStop,
  kPodTerm,
  kPartition,
  kSlowLink,
  kConnReset,
  kRedisRestartEmpty,
  kRedisRestartSnapshot,
  kRedisRestartOldSnapshot,
  kClientPause,
  kDebugSleep,
  kClientKill,
};

struct KindInfo {
  Kind kind;
  const char* name;
  int weight;
  bool pod;  // Targets one pod (or its link).
};

inline constexpr KindInfo kKinds[] = {
    {Kind::kPodKill, "pod_kill", 2, true},
    {Kind::kPodStop, "pod_stop", 2, true},
    {Kind::kPodTerm, "pod_term", 2, true},
    {Kind::kPartition, "partition", 2, true},
    {Kind::kSlowLink, "slow_link", 1, true},
    {Kind::kConnReset, "conn_reset", 1, true},
    {Kind::kRedisRestartEmpty, "redis_restart_empty", 1, false},
    {Kind::kRedisRestartSnapshot, "redis_restart_snapshot", 1, false},
    {Kind::kRedisRestartOldSnapshot, "redis_restart_old_snapshot", 1, false},
    {Kind::kClientPause, "client_pause", 1, false},
    {Kind::kDebugSleep, "debug_sleep", 1, false},
    {Kind::kClientKill, "client_kill", 1, false},
};

inline const KindInfo& Info(Kind k) {
  for (const KindInfo& i : kKinds) {
    if (i.kind == k) return i;
  }
  return kKinds[0];
}

// JSON string escaping; min / median / max in ms as text ("-" for none) and
// as a JSON object ("null" for none).
std::string JsonEscape(const std::string& s);
std::string Mmm(const std::vector<int64_t>& v);
std::string JsonMmm(const std::vector<int64_t>& v);

// What a run found that the one-owner promise rests on (the tests assert
// it; chaos_report.cc prints the details and checks the bounds).
struct ChaosOutcome {
  bool analysed = false;          // The run got as far as the analysis.
  int64_t overlaps_validity = 0;  // (a) pairs owning a shard at once.
  int64_t overlaps_calls = 0;     // (b) the same by the calls alone.
  int64_t token_violations = 0;   // (c) tokens that went back.
  int64_t client_calls = 0;       // (f) calls checked...
  int64_t client_violations = 0;  // ... and outside ownership.
};

class ChaosHarness {
 public:
  explicit ChaosHarness(const ChaosConfig& config)
      : c_(config), rng_(config.seed) {}

  ~ChaosHarness() {
    if (sleeper_.joinable()) sleeper_.join();
    pods_.clear();  // SIGKILL whatever still runs.
    slots_.clear();
    redis_.reset();
    std::error_code ec;
    if (!dir_.empty() && !keep_dir_) std::filesystem::remove_all(dir_, ec);
  }

  void Run();
  // What Run found (analysed stays false if it stopped before the end).
  const ChaosOutcome& outcome() const { return outcome_; }

 private:
  // --- setup and processes -------------------------------------------------
  std::string Rel(int64_t t) const {
    return absl::StrFormat("%+.3fs", static_cast<double>(t - t0_) / 1e9);
  }
  void Say(const std::string& line) {
    std::printf("[chaos %s] %s\n", Rel(Now()).c_str(), line.c_str());
    std::fflush(stdout);
    if (fault_log_) *fault_log_ << Rel(Now()) << " " << line << std::endl;
  }
  PodProcess* Launch(int slot);
  void Reap();
  std::vector<const PodRecord*> LiveRecords(std::vector<PodRecord>& storage);
  bool Converged(std::string* why);
  bool AwaitConverged(absl::Duration timeout, std::string* why);
  // Waits (at most 500 ms) until the pod logged its S line.
  bool AwaitStartLine(const PodProcess& pod);

  // --- faults ----------------------------------------------------------------
  int64_t U(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool Coin(double p) { return std::bernoulli_distribution(p)(rng_); }
  int64_t KillBoundMs() const {
    return (c_.lease_ms + c_.poll_ms) * 11 / 10 + c_.slack_ms;
  }
  bool Allowed(const KindInfo& k) const;
  std::vector<int> EligibleSlots() const;
  int LivePods() const;
  bool RedisFaultActive() const;
  // Starts a fault; returns when the scheduler may consider the next one.
  // `only`: pick among these kinds; `note` is added to the detail.
  bool StartFault(bool overlapping, const std::vector<Kind>& only = {},
                  const std::string& note = "");
  size_t Record(Kind kind, const std::string& target, int64_t start,
                const std::string& detail);
  void HealDue(bool all);
  void Snapshot();
  void RestartRedis(size_t record, int64_t down_ms);
  void StopAll();

  // --- analysis --------------------------------------------------------------
  void Analyze();

  struct Active {
    size_t record;
    int64_t heal_at;
    std::function<void()> heal;
    int slot = -1;
    bool redis = false;
  };

  const ChaosConfig c_;
  std::mt19937_64 rng_;
  std::string dir_;
  bool keep_dir_ = true;
  int64_t t0_ = 0;
  std::unique_ptr<std::ofstream> fault_log_;
  std::unique_ptr<ChaosRedis> redis_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<std::unique_ptr<PodProcess>> pods_;
  std::vector<FaultRecord> faults_;
  std::vector<Kind> fault_kinds_;
  std::vector<Active> active_;
  std::deque<std::pair<int64_t, std::string>> snapshots_;
  int snapshot_seq_ = 0;
  int64_t next_snapshot_ = 0;
  std::jthread sleeper_;               // DEBUG SLEEP in flight.
  std::vector<std::string> problems_;  // Harness-level failures.
  int64_t fault_phase_end_ = 0;
  int64_t stopping_at_ = kNever;  // When StopAll began.
  std::string note_;              // For the next Record.
  ChaosOutcome outcome_;
};

}  // namespace setpoint::chaos

#endif  // SETPOINT_TESTS_CHAOS_CHAOS_HARNESS_H_
