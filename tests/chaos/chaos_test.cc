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
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "chaos/analyzer.h"
#include "chaos/chaos_redis.h"
#include "chaos/tcp_proxy.h"
#include "gtest/gtest.h"

#ifndef SETPOINT_CHAOS_DEFAULT_SECONDS
#define SETPOINT_CHAOS_DEFAULT_SECONDS 120
#endif

namespace setpoint::chaos {
namespace {

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
};

ChaosConfig& Config() {
  static ChaosConfig* config = new ChaosConfig();
  return *config;
}

int64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Every child process, for the watchdog.
constexpr int kMaxChildren = 1024;
std::atomic<pid_t> g_children[kMaxChildren];
std::atomic<int> g_child_count{0};

void RegisterChild(pid_t pid) {
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
  std::string id;
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

constexpr KindInfo kKinds[] = {
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

const KindInfo& Info(Kind k) {
  for (const KindInfo& i : kKinds) {
    if (i.kind == k) return i;
  }
  return kKinds[0];
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out;
}

// Min / median / max in ms, or "-" for none.
std::string Mmm(const std::vector<int64_t>& v) {
  if (v.empty()) return "-";
  return absl::StrFormat("%.0f/%.0f/%.0f",
                         static_cast<double>(Quantile(v, 0.0)) / kMs,
                         static_cast<double>(Quantile(v, 0.5)) / kMs,
                         static_cast<double>(Quantile(v, 1.0)) / kMs);
}

std::string JsonMmm(const std::vector<int64_t>& v) {
  if (v.empty()) return "null";
  return absl::StrFormat(
      "{\"min_ms\": %.1f, \"median_ms\": %.1f, \"max_ms\": %.1f, \"n\": %d}",
      static_cast<double>(Quantile(v, 0.0)) / kMs,
      static_cast<double>(Quantile(v, 0.5)) / kMs,
      static_cast<double>(Quantile(v, 1.0)) / kMs, static_cast<int>(v.size()));
}

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
};

PodProcess* ChaosHarness::Launch(int index) {
  Slot& slot = *slots_[index];
  auto p = std::make_unique<PodProcess>();
  p->id = slot.incarnation == 0
              ? absl::StrCat("p", index)
              : absl::StrCat("p", index, "r", slot.incarnation);
  ++slot.incarnation;
  p->slot = index;
  p->log_path = absl::StrCat(dir_, "/", p->id, ".log");
  std::string err = absl::StrCat(dir_, "/", p->id, ".stderr");
  // Everything the child needs is built before fork (the driver has
  // threads: only async-signal-safe calls between fork and exec).
  std::vector<std::string> args = {
      SETPOINT_CHAOS_POD,
      "--redis=" + slot.proxy->address(),
      "--pod=" + p->id,
      "--log=" + p->log_path,
      absl::StrCat("--nodes=", c_.nodes),
      absl::StrCat("--ring=", c_.ring),
      absl::StrCat("--lease_ms=", c_.lease_ms),
      absl::StrCat("--poll_ms=", c_.poll_ms),
      "--ns=chaos",
  };
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t parent = getpid();
  p->launched = Now();
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  p->pid = pid;
  RegisterChild(pid);
  slot.pod = p.get();
  slot.restart_at = kNever;
  slot.proxy->Heal();
  PodProcess* raw = p.get();
  pods_.push_back(std::move(p));
  return raw;
}

// Reaps pods that exited: expected after SIGTERM, a failure otherwise.
void ChaosHarness::Reap() {
  for (auto& p : pods_) {
    if (p->reaped || p->killed) continue;
    int status = 0;
    pid_t r = waitpid(p->pid, &status, WNOHANG);
    if (r != p->pid) {
      if (p->term_sent != kNever && Now() - p->term_sent > 10'000 * kMs) {
        problems_.push_back(absl::StrCat("pod ", p->id,
                                         " did not stop within 10 s of "
                                         "SIGTERM; killed"));
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &status, 0);
        p->killed = true;
      } else {
        continue;
      }
    }
    p->reaped = true;
    p->status = status;
    p->death = Now();
    Slot& slot = *slots_[p->slot];
    if (p->term_sent == kNever) {
      problems_.push_back(absl::StrCat(
          "pod ", p->id, " exited on its own (status ", status, ") at ",
          Rel(p->death), "; see ", dir_, "/", p->id, ".stderr"));
      Say(problems_.back());
    } else if (!p->killed && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      problems_.push_back(absl::StrCat("pod ", p->id,
                                       " did not exit 0 after SIGTERM (status ",
                                       status, ")"));
    }
    if (slot.pod == p.get()) {
      slot.pod = nullptr;
      slot.faulted = false;
      if (slot.restart_at == kNever)
        slot.restart_at = Now() + U(1000, 3000) * kMs;
    }
    // The fault that asked for the exit ends now.
    for (FaultRecord& f : faults_) {
      if (f.kind == "pod_term" && f.target == p->id && f.end == 0) {
        f.end = p->death;
      }
    }
  }
}

std::vector<const PodRecord*> ChaosHarness::LiveRecords(
    std::vector<PodRecord>& storage) {
  storage.clear();
  storage.reserve(pods_.size());
  for (auto& p : pods_) {
    if (p->reaped || p->killed) continue;
    absl::StatusOr<PodLog> log = ReadPodLog(p->log_path);
    PodRecord rec;
    if (log.ok()) rec.log = std::move(*log);
    storage.push_back(std::move(rec));
  }
  std::vector<const PodRecord*> out;
  for (const PodRecord& r : storage) out.push_back(&r);
  return out;
}

bool ChaosHarness::Converged(std::string* why) {
  std::vector<PodRecord> storage;
  std::vector<const PodRecord*> live = LiveRecords(storage);
  if (live.empty()) {
    *why = "no live pod";
    return false;
  }
  for (const PodRecord* r : live) {
    if (r->log.started == kNever) {
      *why = "a pod has not logged its start yet";
      return false;
    }
  }
  return OwnedOnceAt(live, c_.ring, Now(), /*check_validity=*/true, why);
}

bool ChaosHarness::AwaitConverged(absl::Duration timeout, std::string* why) {
  int64_t deadline = Now() + absl::ToInt64Nanoseconds(timeout);
  while (true) {
    Reap();
    if (Converged(why)) return true;
    if (Now() > deadline) return false;
    // Polling the pods' logs with a deadline.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

bool ChaosHarness::AwaitStartLine(const PodProcess& pod) {
  int64_t deadline = Now() + 500 * kMs;
  while (Now() < deadline) {
    absl::StatusOr<PodLog> log = ReadPodLog(pod.log_path);
    if (log.ok() && log->started != kNever) return true;
    // Polling a file another process writes, with a deadline.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

int ChaosHarness::LivePods() const {
  int n = 0;
  for (const auto& s : slots_) {
    if (s->pod != nullptr && s->pod->term_sent == kNever) ++n;
  }
  return n;
}

std::vector<int> ChaosHarness::EligibleSlots() const {
  std::vector<int> out;
  int64_t now = Now();
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = *slots_[i];
    if (s.pod == nullptr || s.faulted || s.pod->term_sent != kNever ||
        s.pod->stopped || now - s.pod->launched < 2'000 * kMs) {
      continue;
    }
    out.push_back(static_cast<int>(i));
  }
  return out;
}

bool ChaosHarness::RedisFaultActive() const {
  for (const Active& a : active_) {
    if (a.redis) return true;
  }
  return !redis_->running();
}

bool ChaosHarness::Allowed(const KindInfo& k) const {
  if (!c_.only_faults.empty()) {
    bool listed = false;
    for (absl::string_view name : absl::StrSplit(c_.only_faults, ',')) {
      listed = listed || name == k.name;
    }
    if (!listed) return false;
  }
  if (k.pod) {
    if (EligibleSlots().empty()) return false;
    if ((k.kind == Kind::kPodKill || k.kind == Kind::kPodTerm ||
         k.kind == Kind::kPodStop) &&
        LivePods() < 2) {
      return false;
    }
    return true;
  }
  if (RedisFaultActive()) return false;
  if (k.kind == Kind::kRedisRestartOldSnapshot) {
    int64_t now = Now();
    for (const auto& [t, path] : snapshots_) {
      if (now - t >= 2'000 * kMs && now - t <= 10'000 * kMs) return true;
    }
    return false;
  }
  return true;
}

size_t ChaosHarness::Record(Kind kind, const std::string& target, int64_t start,
                            const std::string& detail) {
  faults_.push_back({.kind = Info(kind).name,
                     .target = target,
                     .start = start,
                     .end = 0,
                     .detail = detail});
  fault_kinds_.push_back(kind);
  if (!note_.empty()) {
    faults_.back().detail += (detail.empty() ? "" : ", ") + note_;
    note_.clear();
  }
  Say(absl::StrCat("fault ", Info(kind).name, " ", target, " ",
                   faults_.back().detail));
  return faults_.size() - 1;
}

// Brings Redis back `down_ms` after the fault started (it was killed).
void ChaosHarness::RestartRedis(size_t record, int64_t down_ms) {
  int64_t start = faults_[record].start;
  active_.push_back({.record = record,
                     .heal_at = start + down_ms * kMs,
                     .heal =
                         [this, record] {
                           absl::Status s = redis_->Start();
                           if (!s.ok()) {
                             problems_.push_back(absl::StrCat(
                                 "redis did not come back: ", s.ToString()));
                           }
                           faults_[record].end = Now();
                         },
                     .redis = true});
}

bool ChaosHarness::StartFault(bool overlapping, const std::vector<Kind>& only,
                              const std::string& note) {
  std::vector<const KindInfo*> options;
  int total = 0;
  for (const KindInfo& k : kKinds) {
    if (!only.empty() &&
        std::find(only.begin(), only.end(), k.kind) == only.end()) {
      continue;
    }
    if (overlapping && (k.kind == Kind::kPodKill || k.kind == Kind::kPodTerm)) {
      continue;  // Keep takeover measurements clean.
    }
    if (!Allowed(k)) continue;
    options.push_back(&k);
    total += k.weight;
  }
  if (options.empty()) return false;
  note_ = note;
  int pick = static_cast<int>(U(0, total - 1));
  const KindInfo* k = options.back();
  for (const KindInfo* o : options) {
    if (pick < o->weight) {
      k = o;
      break;
    }
    pick -= o->weight;
  }
  const int64_t lease = c_.lease_ms;
  int64_t now = Now();
  if (k->pod) {
    std::vector<int> eligible = EligibleSlots();
    int index = eligible[U(0, static_cast<int64_t>(eligible.size()) - 1)];
    Slot& slot = *slots_[index];
    PodProcess* pod = slot.pod;
    switch (k->kind) {
      case Kind::kPodKill: {
        size_t r = Record(k->kind, pod->id, now, "");
        kill(pod->pid, SIGKILL);
        pod->death = Now();
        pod->killed = true;
        int status = 0;
        waitpid(pod->pid, &status, 0);
        pod->reaped = true;
        pod->status = status;
        faults_[r].start = pod->death;
        faults_[r].end = pod->death;
        slot.pod = nullptr;
        slot.restart_at = pod->death + (KillBoundMs() + U(500, 1500)) * kMs;
        break;
      }
      case Kind::kPodTerm: {
        Record(k->kind, pod->id, now, "");
        pod->term_sent = Now();
        kill(pod->pid, SIGTERM);
        slot.faulted = true;
        break;
      }
      case Kind::kPodStop: {
        int64_t ms = Coin(0.7) ? lease + U(200, 2000) : U(100, lease / 2);
        size_t r = Record(k->kind, pod->id, now, absl::StrCat(ms, "ms"));
        kill(pod->pid, SIGSTOP);
        int64_t t = Now();
        faults_[r].start = t;
        pod->stops.push_back({t, kNever});
        pod->stopped = true;
        slot.faulted = true;
        active_.push_back({.record = r,
                           .heal_at = t + ms * kMs,
                           .heal =
                               [this, pod, r, index] {
                                 int64_t cont = Now();
                                 kill(pod->pid, SIGCONT);
                                 pod->stops.back().second = cont;
                                 pod->stopped = false;
                                 slots_[index]->faulted = false;
                                 faults_[r].end = cont;
                               },
                           .slot = index});
        break;
      }
      case Kind::kPartition: {
        int64_t ms = Coin(0.5) ? U(300, lease) : U(lease, lease * 5 / 2);
        bool refuse = Coin(0.5);
        size_t r = Record(k->kind, pod->id, now,
                          absl::StrCat(ms, "ms", refuse ? " refuse_new" : ""));
        slot.proxy->Partition(true, refuse);
        slot.faulted = true;
        active_.push_back({.record = r,
                           .heal_at = now + ms * kMs,
                           .heal =
                               [this, r, index] {
                                 slots_[index]->proxy->Partition(false);
                                 slots_[index]->faulted = false;
                                 faults_[r].end = Now();
                               },
                           .slot = index});
        break;
      }
      case Kind::kSlowLink: {
        int64_t delay = U(100, 400);
        int64_t ms = U(2000, 6000);
        size_t r = Record(k->kind, pod->id, now,
                          absl::StrCat(delay, "ms/chunk for ", ms, "ms"));
        slot.proxy->SetDelay(absl::Milliseconds(delay));
        slot.faulted = true;
        active_.push_back({.record = r,
                           .heal_at = now + ms * kMs,
                           .heal =
                               [this, r, index] {
                                 slots_[index]->proxy->SetDelay(
                                     absl::ZeroDuration());
                                 slots_[index]->faulted = false;
                                 faults_[r].end = Now();
                               },
                           .slot = index});
        break;
      }
      case Kind::kConnReset: {
        size_t r = Record(k->kind, pod->id, now, "");
        slot.proxy->KillConnections();
        faults_[r].end = now;
        break;
      }
      default:
        break;
    }
  } else {
    switch (k->kind) {
      case Kind::kRedisRestartEmpty: {
        int64_t down = U(0, 1000);
        size_t r =
            Record(k->kind, "redis", now, absl::StrCat("down ", down, "ms"));
        redis_->Kill();
        std::error_code ec;
        std::filesystem::remove(redis_->dump_path(), ec);
        RestartRedis(r, down);
        break;
      }
      case Kind::kRedisRestartSnapshot: {
        int64_t down = U(0, 1000);
        absl::StatusOr<std::string> saved =
            redis_->Command({"SAVE"}, absl::Milliseconds(1000));
        size_t r =
            Record(k->kind, "redis", now,
                   absl::StrCat("down ", down, "ms",
                                saved.ok() ? ""
                                           : " (SAVE failed: last periodic "
                                             "snapshot)"));
        redis_->Kill();
        faults_[r].start = Now();
        RestartRedis(r, down);
        break;
      }
      case Kind::kRedisRestartOldSnapshot: {
        std::vector<std::pair<int64_t, std::string>> old;
        for (const auto& s : snapshots_) {
          if (now - s.first >= 2'000 * kMs && now - s.first <= 10'000 * kMs) {
            old.push_back(s);
          }
        }
        auto [taken, path] = old[U(0, static_cast<int64_t>(old.size()) - 1)];
        int64_t down = U(0, 1000);
        size_t r = Record(k->kind, "redis", now,
                          absl::StrCat("snapshot age ", (now - taken) / kMs,
                                       "ms, down ", down, "ms"));
        redis_->Kill();
        std::error_code ec;
        std::filesystem::copy_file(
            path, redis_->dump_path(),
            std::filesystem::copy_options::overwrite_existing, ec);
        if (ec) problems_.push_back("cannot copy snapshot: " + ec.message());
        RestartRedis(r, down);
        break;
      }
      case Kind::kClientPause: {
        int64_t ms = U(300, 3000);
        size_t r = Record(k->kind, "redis", now, absl::StrCat(ms, "ms"));
        absl::StatusOr<std::string> s =
            redis_->Command({"CLIENT", "PAUSE", absl::StrCat(ms), "ALL"},
                            absl::Milliseconds(1000));
        if (!s.ok()) Say("CLIENT PAUSE failed: " + s.status().ToString());
        active_.push_back({.record = r,
                           .heal_at = now + ms * kMs,
                           .heal = [this, r] { faults_[r].end = Now(); },
                           .redis = true});
        break;
      }
      case Kind::kDebugSleep: {
        int64_t ms = U(300, 3000);
        size_t r = Record(k->kind, "redis", now, absl::StrCat(ms, "ms"));
        int port = redis_->port();
        sleeper_ = std::jthread([port, ms] {
          (void)RedisCommand(
              port, {"DEBUG", "SLEEP", absl::StrFormat("%.3f", ms / 1000.0)},
              absl::Milliseconds(ms + 5000));
        });
        active_.push_back({.record = r,
                           .heal_at = now + ms * kMs,
                           .heal =
                               [this, r] {
                                 if (sleeper_.joinable()) sleeper_.join();
                                 faults_[r].end = Now();
                               },
                           .redis = true});
        break;
      }
      case Kind::kClientKill: {
        size_t r = Record(k->kind, "redis", now, "");
        absl::StatusOr<std::string> s = redis_->Command(
            {"CLIENT", "KILL", "TYPE", "normal"}, absl::Milliseconds(1000));
        faults_[r].detail = s.ok() ? absl::StrCat(*s, " clients") : "failed";
        faults_[r].end = Now();
        break;
      }
      default:
        break;
    }
  }
  return true;
}

void ChaosHarness::HealDue(bool all) {
  int64_t now = Now();
  for (size_t i = 0; i < active_.size();) {
    if (all || active_[i].heal_at <= now) {
      Active a = std::move(active_[i]);
      active_.erase(active_.begin() + static_cast<ptrdiff_t>(i));
      a.heal();
      Say(absl::StrCat("healed ", faults_[a.record].kind, " ",
                       faults_[a.record].target));
    } else {
      ++i;
    }
  }
}

void ChaosHarness::Snapshot() {
  int64_t now = Now();
  if (now < next_snapshot_ || RedisFaultActive()) return;
  next_snapshot_ = now + 1'000 * kMs;
  absl::StatusOr<std::string> s =
      redis_->Command({"SAVE"}, absl::Milliseconds(500));
  if (!s.ok()) return;
  std::string path =
      absl::StrCat(dir_, "/snapshots/snap-", snapshot_seq_++, ".rdb");
  std::error_code ec;
  std::filesystem::copy_file(redis_->dump_path(), path,
                             std::filesystem::copy_options::overwrite_existing,
                             ec);
  if (ec) return;
  snapshots_.push_back({now, path});
  while (!snapshots_.empty() && now - snapshots_.front().first > 20'000 * kMs) {
    std::filesystem::remove(snapshots_.front().second, ec);
    snapshots_.pop_front();
  }
}

void ChaosHarness::StopAll() {
  stopping_at_ = Now();
  for (auto& s : slots_) {
    if (s->pod != nullptr && s->pod->term_sent == kNever) {
      s->pod->term_sent = Now();
      kill(s->pod->pid, SIGTERM);
    }
  }
  int64_t deadline = Now() + 12'000 * kMs;
  while (true) {
    Reap();
    bool running = false;
    for (auto& p : pods_) running = running || !(p->reaped || p->killed);
    if (!running || Now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void ChaosHarness::Run() {
  char tmpl[] = "/tmp/setpoint-chaos-XXXXXX";
  char* d = mkdtemp(tmpl);
  ASSERT_NE(d, nullptr);
  dir_ = d;
  std::filesystem::create_directories(dir_ + "/redis");
  std::filesystem::create_directories(dir_ + "/snapshots");
  fault_log_ = std::make_unique<std::ofstream>(dir_ + "/faults.log");
  t0_ = Now();
  Watchdog watchdog(t0_ + (c_.seconds + 58) * 1'000'000'000);
  std::printf(
      "[chaos] seed=%llu duration=%llds pods=%dx%d ring=%u lease=%lldms "
      "poll=%lldms dir=%s\n"
      "[chaos] replay: SETPOINT_CHAOS_SEED=%llu SETPOINT_CHAOS_SECONDS=%lld\n",
      static_cast<unsigned long long>(c_.seed),
      static_cast<long long>(c_.seconds), c_.pods, c_.nodes, c_.ring,
      static_cast<long long>(c_.lease_ms), static_cast<long long>(c_.poll_ms),
      dir_.c_str(), static_cast<unsigned long long>(c_.seed),
      static_cast<long long>(c_.seconds));
  std::fflush(stdout);
  ::testing::Test::RecordProperty("seed", std::to_string(c_.seed));

  redis_ = std::make_unique<ChaosRedis>(dir_ + "/redis");
  absl::Status started = redis_->Start();
  if (absl::IsNotFound(started)) {
    const char* ci = getenv("CI");
    if (ci == nullptr || *ci == '\0') {
      keep_dir_ = false;
      GTEST_SKIP() << started;
    }
  }
  ASSERT_TRUE(started.ok()) << started;
  RegisterChild(redis_->pid());
  for (int i = 0; i < c_.pods; ++i) {
    auto slot = std::make_unique<Slot>();
    absl::StatusOr<std::unique_ptr<TcpProxy>> proxy =
        TcpProxy::Start(redis_->port());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    slot->proxy = std::move(*proxy);
    slots_.push_back(std::move(slot));
  }
  for (int i = 0; i < c_.pods; ++i) Launch(i);
  std::string why;
  ASSERT_TRUE(AwaitConverged(absl::Seconds(30), &why))
      << "the fleet did not converge at start: " << why;
  Say("converged; faults begin");

  const int64_t begin = Now();
  fault_phase_end_ = begin + c_.seconds * 1'000'000'000;
  int64_t next_fault = begin + 1'000 * kMs;
  int64_t next_overlap = kNever;
  // After any fault starts: the next one only once it is over and the
  // fleet had a quiet gap to converge; sometimes a second one while it
  // lasts.
  auto schedule = [&](size_t before, bool may_overlap) {
    if (faults_.size() == before) return false;
    const FaultRecord& f = faults_.back();
    Kind kind = fault_kinds_.back();
    int64_t planned_end = f.start;
    for (const Active& a : active_) {
      if (a.record == faults_.size() - 1) planned_end = a.heal_at;
    }
    int64_t gap = U(1500, 4000) * kMs;
    if (kind == Kind::kPodKill) {
      gap += KillBoundMs() * kMs;
    } else if (kind == Kind::kPodTerm) {
      gap += 2'000 * kMs;
    } else if (kind == Kind::kRedisRestartEmpty ||
               kind == Kind::kRedisRestartSnapshot ||
               kind == Kind::kRedisRestartOldSnapshot) {
      gap += c_.lease_ms * kMs;
    }
    next_fault = std::max(next_fault, planned_end + gap);
    if (may_overlap && planned_end - f.start > 500 * kMs && Coin(0.25)) {
      next_overlap = f.start + U(0, (planned_end - f.start) / kMs) * kMs;
    }
    return true;
  };
  while (Now() < fault_phase_end_) {
    Reap();
    HealDue(false);
    int64_t now = Now();
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i]->pod == nullptr && slots_[i]->restart_at <= now) {
        PodProcess* p = Launch(static_cast<int>(i));
        Say(absl::StrCat("started ", p->id));
        // A join moves every range, and the whole handoff takes a few ms
        // from the new pod's start: sometimes hang Redis or cut a link
        // while its releases and grants are in flight.
        if (active_.empty() && Coin(0.5) && AwaitStartLine(*p)) {
          std::this_thread::sleep_for(std::chrono::microseconds(U(0, 6000)));
          size_t before = faults_.size();
          StartFault(/*overlapping=*/true,
                     {Kind::kDebugSleep, Kind::kClientPause, Kind::kPartition},
                     "during a handoff");
          schedule(before, false);
        }
      }
    }
    Snapshot();
    now = Now();
    if (now >= next_overlap && active_.size() == 1) {
      next_overlap = kNever;
      size_t before = faults_.size();
      StartFault(/*overlapping=*/true);
      schedule(before, false);
    }
    if (now >= next_fault && active_.empty()) {
      size_t before = faults_.size();
      StartFault(/*overlapping=*/false);
      if (!schedule(before, true)) next_fault = now + 200 * kMs;
    }
    // The scheduler's tick.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  Say("fault phase over; healing everything");
  HealDue(true);
  if (!redis_->running()) {
    absl::Status s = redis_->Start();
    if (!s.ok()) problems_.push_back("redis did not restart: " + s.ToString());
  }
  // Pods being stopped finish first, then every empty slot gets a pod.
  int64_t wait_term = Now() + 12'000 * kMs;
  while (Now() < wait_term) {
    Reap();
    bool terminating = false;
    for (auto& s : slots_) {
      terminating =
          terminating || (s->pod != nullptr && s->pod->term_sent != kNever);
    }
    if (!terminating) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < slots_.size(); ++i) {
    slots_[i]->proxy->Heal();
    if (slots_[i]->pod == nullptr) {
      PodProcess* p = Launch(static_cast<int>(i));
      Say(absl::StrCat("started ", p->id));
    }
  }
  bool converged = AwaitConverged(absl::Seconds(30), &why);
  int64_t converged_at = Now();
  EXPECT_TRUE(converged) << "(e) the ring is not owned exactly once 30 s "
                            "after healing: "
                         << why;
  Say(converged ? "converged after healing" : "NOT converged: " + why);
  (void)converged_at;
  StopAll();
  for (auto& p : pods_) {
    if (!p->reaped && !p->killed) {
      problems_.push_back(absl::StrCat("pod ", p->id, " still running"));
    }
  }
  Analyze();
  for (const std::string& p : problems_) ADD_FAILURE() << p;
  keep_dir_ = c_.keep || ::testing::Test::HasFailure();
  if (keep_dir_) std::printf("[chaos] logs kept in %s\n", dir_.c_str());
}

void ChaosHarness::Analyze() {
  const int64_t lease = c_.lease_ms * kMs;
  const int64_t poll = c_.poll_ms * kMs;
  std::vector<PodRecord> recs;
  std::map<std::string, size_t> by_id;
  for (auto& p : pods_) {
    absl::StatusOr<PodLog> log = ReadPodLog(p->log_path);
    EXPECT_TRUE(log.ok()) << log.status();
    PodRecord rec;
    if (log.ok()) rec.log = std::move(*log);
    rec.death = p->death;
    rec.stops = p->stops;
    if (rec.log.pod.empty()) rec.log.pod = p->id;
    EXPECT_EQ(rec.log.pod, p->id);
    EXPECT_EQ(rec.log.bad_lines, 0) << p->id;
    EXPECT_EQ(rec.log.unmatched, 0) << p->id;
    EXPECT_LT(std::abs(rec.log.clock_offset_ns), 1 * kMs)
        << p->id << ": the manager's clock is not CLOCK_MONOTONIC";
    if (p->death != kNever) {
      EXPECT_LE(rec.log.last_line, p->death)
          << p->id << " logged after its recorded death";
    }
    by_id[p->id] = recs.size();
    recs.push_back(std::move(rec));
  }
  std::vector<Interval> raw, valid, calls;
  std::vector<Grant> grants;
  std::vector<ValidityLapse> lapses;
  for (const PodRecord& r : recs) {
    for (Interval& iv : Intervals(r, Cut::kRaw)) raw.push_back(std::move(iv));
    for (Interval& iv : Intervals(r, Cut::kValidity)) {
      valid.push_back(std::move(iv));
    }
    for (Interval& iv : Intervals(r, Cut::kCalls)) {
      calls.push_back(std::move(iv));
    }
    for (Grant& g : Grants(r)) grants.push_back(std::move(g));
    for (ValidityLapse& l : ValidityLapses(r)) lapses.push_back(std::move(l));
  }
  OwnerCheck by_validity = CheckOneOwner(valid, c_.ring);
  OwnerCheck by_calls = CheckOneOwner(calls, c_.ring);
  std::vector<TokenViolation> tokens = CheckTokens(grants, c_.ring, true);
  std::vector<TokenViolation> tokens_all = CheckTokens(grants, c_.ring, false);
  int64_t effective = 0;
  for (const Grant& g : grants) effective += g.effective ? 1 : 0;
  std::vector<const PodRecord*> rec_ptrs;
  for (const PodRecord& r : recs) rec_ptrs.push_back(&r);
  std::vector<Span> converged = ConvergedSpans(rec_ptrs, raw, c_.ring);
  CallCheck client = CheckClientCalls(rec_ptrs, c_.ring);
  int refusals = 0;
  for (const PodRecord& r : recs) {
    for (const auto& [node, node_calls] : r.log.calls) {
      for (const Call& c : node_calls) refusals += c.refused ? 1 : 0;
    }
  }

  // Per fault: recovery, takeover, cleanliness.
  struct PerFault {
    int64_t recovery = kNever;
    int64_t takeover = -1;  // Max over shards; -1: not measured.
    bool clean = true;
    int untaken = 0;
  };
  std::vector<PerFault> per(faults_.size());
  std::vector<int64_t> graceful_gaps;
  int64_t kill_bound = KillBoundMs() * kMs;
  for (size_t i = 0; i < faults_.size(); ++i) {
    FaultRecord& f = faults_[i];
    if (f.end == 0) f.end = f.start;
    per[i].recovery =
        TimeToConverge(converged, f.end, lease + poll, stopping_at_);
    // Clean: no other fault from a lease before it until its takeover
    // could be measured (a graceful one is fast).
    int64_t tail = fault_kinds_[i] == Kind::kPodTerm
                       ? (kGracefulBoundMs + c_.graceful_slack_ms) * kMs
                       : kill_bound;
    Span window = {f.start - lease - poll, f.end + tail};
    for (size_t j = 0; j < faults_.size(); ++j) {
      if (j == i) continue;
      int64_t end = faults_[j].end == 0 ? faults_[j].start : faults_[j].end;
      if (faults_[j].start < window.second && window.first <= end) {
        per[i].clean = false;
      }
    }
    auto it = by_id.find(f.target);
    if (it == by_id.end()) continue;
    const PodRecord& r = recs[it->second];
    std::vector<Takeover> t;
    if (fault_kinds_[i] == Kind::kPodKill) {
      t = KillTakeovers(raw, f.target, r.death);
    } else if (fault_kinds_[i] == Kind::kPodTerm) {
      int64_t term = pods_[it->second]->term_sent;
      t = GracefulTakeovers(raw, f.target, term);
    } else {
      continue;
    }
    for (const Takeover& x : t) {
      if (x.at == kNever) {
        ++per[i].untaken;
        continue;
      }
      per[i].takeover = std::max(per[i].takeover, x.gap());
      if (fault_kinds_[i] == Kind::kPodTerm && per[i].clean) {
        graceful_gaps.push_back(x.gap());
      }
    }
  }

  // --- the summary -----------------------------------------------------------
  std::string out;
  absl::StrAppendFormat(
      &out,
      "\n==== chaos summary: seed=%llu duration=%llds pods=%dx%d ring=%u "
      "lease=%lldms poll=%lldms\n",
      static_cast<unsigned long long>(c_.seed),
      static_cast<long long>(c_.seconds), c_.pods, c_.nodes, c_.ring,
      static_cast<long long>(c_.lease_ms), static_cast<long long>(c_.poll_ms));
  absl::StrAppendFormat(
      &out,
      "slack: SIGKILL takeover bound (lease+poll)*1.1 + %lldms = %lldms; "
      "graceful bound %lldms + %lldms\n",
      static_cast<long long>(c_.slack_ms),
      static_cast<long long>(KillBoundMs()),
      static_cast<long long>(kGracefulBoundMs),
      static_cast<long long>(c_.graceful_slack_ms));
  absl::StrAppendFormat(&out, "%-28s %5s %7s %24s %24s\n", "fault", "count",
                        "clean", "recovery ms min/med/max",
                        "takeover ms min/med/max");
  std::string json_kinds;
  for (const KindInfo& k : kKinds) {
    int n = 0, clean = 0;
    std::vector<int64_t> rec_v, take_v;
    for (size_t i = 0; i < faults_.size(); ++i) {
      if (fault_kinds_[i] != k.kind) continue;
      ++n;
      clean += per[i].clean ? 1 : 0;
      if (per[i].recovery != kNever) rec_v.push_back(per[i].recovery);
      if (per[i].takeover >= 0) take_v.push_back(per[i].takeover);
    }
    absl::StrAppendFormat(&out, "%-28s %5d %7d %24s %24s\n", k.name, n, clean,
                          Mmm(rec_v), Mmm(take_v));
    absl::StrAppendFormat(&json_kinds,
                          "%s\n    \"%s\": {\"count\": %d, \"clean\": %d, "
                          "\"recovery\": %s, \"takeover\": %s}",
                          json_kinds.empty() ? "" : ",", k.name, n, clean,
                          JsonMmm(rec_v), JsonMmm(take_v));
  }
  absl::StrAppendFormat(&out, "total faults %d, grants %d (%d effective)\n",
                        static_cast<int>(faults_.size()),
                        static_cast<int>(grants.size()),
                        static_cast<int>(effective));
  auto describe = [&](const char* name, const OwnerCheck& check,
                      std::string* json) {
    std::vector<Incident> incidents =
        Incidents(check, faults_, 2 * lease + poll, 200 * kMs);
    absl::StrAppendFormat(
        &out,
        "double ownership (%s): %d overlaps, %.1f shard-ms, %.1f wall-ms, "
        "%d incidents\n",
        name, static_cast<int>(check.overlaps.size()),
        static_cast<double>(check.shard_ns) / kMs,
        static_cast<double>(check.wall_ns) / kMs,
        static_cast<int>(incidents.size()));
    std::string json_inc;
    for (const Incident& inc : incidents) {
      std::vector<std::string> names;
      for (size_t f : inc.faults) {
        names.push_back(absl::StrCat(faults_[f].kind, "(", faults_[f].target,
                                     " at ", Rel(faults_[f].start), ")"));
      }
      absl::StrAppendFormat(
          &out, "  incident %s..%s %.1fms, %d shards, %.1f pair-ms; %s%s\n",
          Rel(inc.from), Rel(inc.to),
          static_cast<double>(inc.to - inc.from) / kMs,
          static_cast<int>(inc.shards.size()),
          static_cast<double>(inc.shard_ns) / kMs,
          inc.faults_are_last_before ? "after (none active) " : "during ",
          names.empty() ? "no fault" : absl::StrJoin(names, ", "));
      for (const Overlap& o : inc.samples) {
        absl::StrAppendFormat(
            &out,
            "    shard %u: %s (token %llu, from %s) and %s (token %llu, from "
            "%s) for %.1fms\n",
            o.shard, o.first.node,
            static_cast<unsigned long long>(o.first.token), Rel(o.first.start),
            o.second.node, static_cast<unsigned long long>(o.second.token),
            Rel(o.second.start), static_cast<double>(o.to - o.from) / kMs);
      }
      absl::StrAppendFormat(
          &json_inc,
          "%s{\"from_s\": %.3f, \"ms\": %.1f, \"shards\": %d, \"faults\": "
          "[%s], \"after_faults\": %s}",
          json_inc.empty() ? "" : ", ",
          static_cast<double>(inc.from - t0_) / 1e9,
          static_cast<double>(inc.to - inc.from) / kMs,
          static_cast<int>(inc.shards.size()),
          absl::StrJoin(names, ", ",
                        [](std::string* o, const std::string& s) {
                          absl::StrAppend(o, "\"", JsonEscape(s), "\"");
                        }),
          inc.faults_are_last_before ? "true" : "false");
    }
    *json = absl::StrFormat(
        "{\"overlaps\": %d, \"shard_ms\": %.1f, \"wall_ms\": %.1f, "
        "\"incidents\": [%s]}",
        static_cast<int>(check.overlaps.size()),
        static_cast<double>(check.shard_ns) / kMs,
        static_cast<double>(check.wall_ns) / kMs, json_inc);
  };
  std::string json_valid, json_calls;
  describe("validity cut", by_validity, &json_valid);
  describe("calls only, SIGSTOP excused", by_calls, &json_calls);
  absl::StrAppendFormat(&out,
                        "token order violations: %d (effective grants), %d "
                        "(all grants)\n",
                        static_cast<int>(tokens.size()),
                        static_cast<int>(tokens_all.size()));
  for (size_t i = 0; i < tokens.size() && i < 5; ++i) {
    const TokenViolation& v = tokens[i];
    absl::StrAppendFormat(
        &out, "  shard %u: %s token %llu at %s, then %s token %llu at %s\n",
        v.shard, v.earlier.node,
        static_cast<unsigned long long>(v.earlier.token), Rel(v.earlier.at),
        v.later.node, static_cast<unsigned long long>(v.later.token),
        Rel(v.later.at));
  }
  int64_t fence_max = 0, fence_max_stopped = 0, gap_max = 0;
  int fences = 0, fences_stopped = 0, gaps = 0;
  for (const ValidityLapse& l : lapses) {
    if (!l.fence()) {
      ++gaps;
      gap_max = std::max(gap_max, l.duration());
    } else if (l.sigstop) {
      ++fences_stopped;
      fence_max_stopped = std::max(fence_max_stopped, l.duration());
    } else {
      ++fences;
      fence_max = std::max(fence_max, l.duration());
    }
  }
  absl::StrAppendFormat(
      &out,
      "fence lateness (last valid_until -> E of the fencing call): max "
      "%.1fms over %d late fences; with SIGSTOP: max %.1fms over %d\n"
      "validity gaps while holding (renewed again without fencing): %d, max "
      "%.1fms\n",
      static_cast<double>(fence_max) / kMs, fences,
      static_cast<double>(fence_max_stopped) / kMs, fences_stopped, gaps,
      static_cast<double>(gap_max) / kMs);
  {
    std::vector<const ValidityLapse*> worst;
    for (const ValidityLapse& l : lapses) {
      if (l.fence() && !l.sigstop) worst.push_back(&l);
    }
    std::sort(worst.begin(), worst.end(),
              [](const ValidityLapse* a, const ValidityLapse* b) {
                return a->duration() > b->duration();
              });
    for (size_t i = 0; i < worst.size() && i < 3; ++i) {
      absl::StrAppendFormat(&out,
                            "  late fence %s: validity lapsed %s, %.1fms\n",
                            worst[i]->node, Rel(worst[i]->lapsed),
                            static_cast<double>(worst[i]->duration()) / kMs);
    }
  }
  {
    std::vector<std::string> codes;
    for (const auto& [code, n] : client.by_code) {
      codes.push_back(absl::StrCat(
          absl::AsciiStrToLower(
              absl::StatusCodeToString(static_cast<absl::StatusCode>(code))),
          " ", n));
    }
    absl::StrAppendFormat(
        &out,
        "client calls: %lld checked (%s), %d violations, %d excused overlaps "
        "(frozen by SIGSTOP, lower token), %lld started inside their grant; "
        "refused handoffs %d\n",
        static_cast<long long>(client.calls), absl::StrJoin(codes, ", "),
        static_cast<int>(client.violations.size()),
        static_cast<int>(client.excused.size()),
        static_cast<long long>(client.started_inside_grant), refusals);
    const char* kind_names[] = {"no assignment", "outside ownership",
                                "foreign token", "overlap"};
    for (size_t i = 0; i < client.violations.size() && i < 5; ++i) {
      const CallViolation& v = client.violations[i];
      absl::StrAppendFormat(&out, "  %s: %s shard %u token %llu %s..%s",
                            kind_names[static_cast<int>(v.kind)], v.call.node,
                            v.call.shard,
                            static_cast<unsigned long long>(v.call.token),
                            Rel(v.call.start), Rel(v.call.end));
      if (v.kind == CallViolation::Kind::kOverlap) {
        absl::StrAppendFormat(&out, " and %s token %llu %s..%s", v.other.node,
                              static_cast<unsigned long long>(v.other.token),
                              Rel(v.other.start), Rel(v.other.end));
      } else if (v.owned.end > v.owned.start) {
        absl::StrAppendFormat(
            &out, " (owned %s..%s)", Rel(v.owned.start),
            v.owned.end == kNever ? std::string("end") : Rel(v.owned.end));
      }
      absl::StrAppendFormat(&out, "\n");
    }
    for (size_t i = 0; i < client.excused.size() && i < 3; ++i) {
      const ExcusedOverlap& e = client.excused[i];
      absl::StrAppendFormat(
          &out,
          "  excused: shard %u, frozen %s token %llu and %s token %llu for "
          "%.1fms at %s\n",
          e.frozen.shard, e.frozen.node,
          static_cast<unsigned long long>(e.frozen.token), e.other.node,
          static_cast<unsigned long long>(e.other.token),
          static_cast<double>(e.to - e.from) / kMs, Rel(e.from));
    }
  }
  absl::StrAppendFormat(
      &out,
      "graceful takeover (clean SIGTERMs, per shard): p50 %.1fms p99 %.1fms "
      "max %.1fms over %d shards\n",
      static_cast<double>(Quantile(graceful_gaps, 0.5)) / kMs,
      static_cast<double>(Quantile(graceful_gaps, 0.99)) / kMs,
      static_cast<double>(Quantile(graceful_gaps, 1.0)) / kMs,
      static_cast<int>(graceful_gaps.size()));
  absl::StrAppendFormat(&out, "faults:\n");
  for (size_t i = 0; i < faults_.size(); ++i) {
    const FaultRecord& f = faults_[i];
    absl::StrAppendFormat(
        &out, "  %s %-26s %-8s %-36s recovery %s takeover %s%s\n", Rel(f.start),
        f.kind, f.target, f.detail,
        per[i].recovery == kNever
            ? std::string("never")
            : absl::StrFormat("%.0fms",
                              static_cast<double>(per[i].recovery) / kMs),
        per[i].takeover < 0
            ? std::string("-")
            : absl::StrFormat("%.0fms",
                              static_cast<double>(per[i].takeover) / kMs),
        per[i].clean ? "" : " (overlapped)");
  }
  std::printf("%s", out.c_str());
  std::fflush(stdout);
  {
    std::ofstream summary(dir_ + "/summary.txt");
    summary << out;
  }

  if (!c_.report.empty()) {
    std::string json_faults;
    for (size_t i = 0; i < faults_.size(); ++i) {
      const FaultRecord& f = faults_[i];
      absl::StrAppendFormat(
          &json_faults,
          "%s\n    {\"kind\": \"%s\", \"target\": \"%s\", \"start_s\": %.3f, "
          "\"end_s\": %.3f, \"detail\": \"%s\", \"clean\": %s, "
          "\"recovery_ms\": %s, \"takeover_ms\": %s}",
          i == 0 ? "" : ",", f.kind, f.target,
          static_cast<double>(f.start - t0_) / 1e9,
          static_cast<double>(f.end - t0_) / 1e9, JsonEscape(f.detail),
          per[i].clean ? "true" : "false",
          per[i].recovery == kNever
              ? std::string("null")
              : absl::StrFormat("%.1f",
                                static_cast<double>(per[i].recovery) / kMs),
          per[i].takeover < 0
              ? std::string("null")
              : absl::StrFormat("%.1f",
                                static_cast<double>(per[i].takeover) / kMs));
    }
    std::ofstream json(c_.report);
    json << absl::StrFormat(
        "{\n  \"seed\": %llu,\n  \"duration_s\": %lld,\n  \"pods\": %d,\n"
        "  \"nodes\": %d,\n  \"ring\": %u,\n  \"lease_ms\": %lld,\n"
        "  \"poll_ms\": %lld,\n  \"slack_ms\": %lld,\n"
        "  \"graceful_slack_ms\": %lld,\n  \"kill_bound_ms\": %lld,\n"
        "  \"faults_by_kind\": {%s\n  },\n  \"grants\": %d,\n"
        "  \"effective_grants\": %d,\n"
        "  \"double_ownership_validity_cut\": %s,\n"
        "  \"double_ownership_calls\": %s,\n"
        "  \"token_violations\": %d,\n  \"token_violations_all\": %d,\n"
        "  \"client_calls\": {\"checked\": %lld, \"violations\": %d, "
        "\"excused\": %d, \"started_inside_grant\": %lld},\n"
        "  \"refused_handoffs\": %d,\n"
        "  \"fence_lateness_max_ms\": %.1f,\n  \"late_fences\": %d,\n"
        "  \"fence_lateness_sigstop_max_ms\": %.1f,\n"
        "  \"validity_gaps\": %d,\n  \"validity_gap_max_ms\": %.1f,\n"
        "  \"graceful_takeover\": {\"p50_ms\": %.1f, \"p99_ms\": %.1f, "
        "\"max_ms\": %.1f, \"shards\": %d},\n"
        "  \"problems\": %d,\n  \"faults\": [%s\n  ]\n}\n",
        static_cast<unsigned long long>(c_.seed),
        static_cast<long long>(c_.seconds), c_.pods, c_.nodes, c_.ring,
        static_cast<long long>(c_.lease_ms), static_cast<long long>(c_.poll_ms),
        static_cast<long long>(c_.slack_ms),
        static_cast<long long>(c_.graceful_slack_ms),
        static_cast<long long>(KillBoundMs()), json_kinds,
        static_cast<int>(grants.size()), static_cast<int>(effective),
        json_valid, json_calls, static_cast<int>(tokens.size()),
        static_cast<int>(tokens_all.size()),
        static_cast<long long>(client.calls),
        static_cast<int>(client.violations.size()),
        static_cast<int>(client.excused.size()),
        static_cast<long long>(client.started_inside_grant), refusals,
        static_cast<double>(fence_max) / kMs, fences,
        static_cast<double>(fence_max_stopped) / kMs, gaps,
        static_cast<double>(gap_max) / kMs,
        static_cast<double>(Quantile(graceful_gaps, 0.5)) / kMs,
        static_cast<double>(Quantile(graceful_gaps, 0.99)) / kMs,
        static_cast<double>(Quantile(graceful_gaps, 1.0)) / kMs,
        static_cast<int>(graceful_gaps.size()),
        static_cast<int>(problems_.size()), json_faults);
  }

  // --- the checks ------------------------------------------------------------
  EXPECT_TRUE(by_validity.overlaps.empty())
      << "(a) double ownership with the validity cut: "
      << by_validity.overlaps.size() << " overlapping interval pairs, "
      << by_validity.shard_ns / kMs << " shard-ms (see the incidents above)";
  EXPECT_TRUE(by_calls.overlaps.empty())
      << "(b) double ownership by the UpdateShardRange calls alone: "
      << by_calls.overlaps.size() << " overlapping interval pairs, "
      << by_calls.shard_ns / kMs << " shard-ms (see the incidents above)";
  EXPECT_TRUE(tokens.empty())
      << "(c) " << tokens.size() << " token order violations";
  EXPECT_GT(client.calls, 0) << "(f) no client call was logged";
  EXPECT_TRUE(client.violations.empty())
      << "(f) " << client.violations.size()
      << " client calls outside their node's ownership or overlapping "
         "another node's (see the summary above)";
  for (size_t i = 0; i < faults_.size(); ++i) {
    if (fault_kinds_[i] == Kind::kPodKill) {
      EXPECT_EQ(per[i].untaken, 0)
          << "(d) shards of " << faults_[i].target << " never taken over";
      if (per[i].clean && per[i].takeover >= 0) {
        EXPECT_LE(per[i].takeover, kill_bound)
            << "(d) takeover after SIGKILL of " << faults_[i].target << " at "
            << Rel(faults_[i].start);
      }
    }
    if (fault_kinds_[i] == Kind::kPodTerm && per[i].clean) {
      EXPECT_EQ(per[i].untaken, 0)
          << "(d) shards of " << faults_[i].target << " never taken over";
    }
  }
  if (!graceful_gaps.empty()) {
    EXPECT_LE(Quantile(graceful_gaps, 1.0),
              (kGracefulBoundMs + c_.graceful_slack_ms) * kMs)
        << "(d) graceful takeover";
  }
  ::testing::Test::RecordProperty("double_owned_shard_ms_validity",
                                  std::to_string(by_validity.shard_ns / kMs));
  ::testing::Test::RecordProperty("double_owned_shard_ms_calls",
                                  std::to_string(by_calls.shard_ns / kMs));
  ::testing::Test::RecordProperty("client_calls_checked",
                                  std::to_string(client.calls));
  ::testing::Test::RecordProperty("client_call_violations",
                                  std::to_string(client.violations.size()));
  ::testing::Test::RecordProperty("client_calls_excused",
                                  std::to_string(client.excused.size()));
}

TEST(ChaosTest, AtMostOneOwnerPerShardUnderFaults) {
  ChaosHarness harness(Config());
  harness.Run();
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
