// The chaos harness's processes and faults: pods launched behind their
// proxies and reaped, the fault scheduler and each fault's start and heal,
// Redis restarts and snapshots, and the run from start to the analysis.
#include "chaos/chaos_harness.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "chaos/spawn.h"
#include "gtest/gtest.h"

namespace setpoint::chaos {

PodProcess* ChaosHarness::Launch(int index) {
  Slot& slot = *slots_[index];
  auto p = std::make_unique<PodProcess>();
  p->id = slot.incarnation == 0
              ? absl::StrCat("p", index)
              : absl::StrCat("p", index, "r", slot.incarnation);
  ++slot.incarnation;
  p->pod_id = c_.static_membership ? absl::StrCat("p", index) : p->id;
  p->slot = index;
  p->log_path = absl::StrCat(dir_, "/", p->id, ".log");
  std::string err = absl::StrCat(dir_, "/", p->id, ".stderr");
  std::vector<std::string> args = {
      SETPOINT_CHAOS_POD,
      "--redis=" + slot.proxy->address(),
      "--pod=" + p->pod_id,
      "--log=" + p->log_path,
      absl::StrCat("--nodes=", c_.nodes),
      absl::StrCat("--ring=", c_.ring),
      absl::StrCat("--lease_ms=", c_.lease_ms),
      absl::StrCat("--poll_ms=", c_.poll_ms),
      "--ns=chaos",
  };
  if (c_.static_membership) args.emplace_back("--static_membership=1");
  p->launched = Now();
  p->pid = SpawnChild(std::move(args), err);
  if (p->pid < 0) {
    // Never a target (a signal to pid -1 would reach every process): the
    // run fails, and the slot tries again in a second.
    problems_.push_back(absl::StrCat("could not fork ", p->id));
    p->reaped = p->killed = true;
    p->death = Now();
    slot.restart_at = Now() + 1'000 * kMs;
  } else {
    RegisterChild(p->pid);
    slot.pod = p.get();
    slot.restart_at = kNever;
  }
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
        // With static membership the successor comes as often within
        // the lease (it takes the kept places back) as after it.
        slot.restart_at =
            Now() + (c_.static_membership ? U(50, 3000) : U(1000, 3000)) * kMs;
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
      // With static membership the places wait for the successor, or a
      // lease.
      gap += c_.static_membership ? KillBoundMs() * kMs : 2'000 * kMs;
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

}  // namespace setpoint::chaos
