// fleet_demo: the sharded example as a fleet of real processes, with faults.
// scripts/fleet-demo builds and runs it.
//
// It starts a redis-server of its own on a free loopback port, the records
// API service (records_api_server), and three pods of `sharded` sharing the
// ring through that Redis and writing to that API with a changing catalog
// (--churn) and a think time between each write's read and its send
// (--api_think). Then, printing one line per step with the elapsed time:
// scrapes the pods' /metrics, prints `setpointctl status`, SIGKILLs pod-a
// and shows the takeover, SIGSTOPs pod-b past its lease and SIGCONTs it
// (the writes it had started send their old token when it thaws: the API
// refuses them), drains pod-c with `setpointctl drain` and shows the
// handover, undrains it, and waits until the API holds the final catalog. It
// ends with
//
//   verdict: converged, stale writes refused N, stale writes accepted 0
//
// and exit code 0 only when the API converged, every step was seen, and no
// stale write was accepted (see Audit). Every process it starts runs in
// its own process group, dies with it (PR_SET_PDEATHSIG), and is killed on
// exit, on SIGINT/SIGTERM/SIGHUP and when the run passes its time bound.
//
//   fleet_demo [--records=300] [--think=600ms] [--keep]
//
// --keep keeps the run directory (the processes' logs) even when it
// passes; it is always kept on failure.
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "json_reader.h"
#include "records_api.h"
#include "setpoint/node/shard.h"
#include "setpoint/testing/redis_server.h"  // FindRedisServer, FreeLoopbackPort

#ifndef FLEET_SHARDED
#error "FLEET_SHARDED must name the sharded program"
#endif
#ifndef FLEET_API_SERVER
#error "FLEET_API_SERVER must name the records_api_server program"
#endif
#ifndef FLEET_SETPOINTCTL
#define FLEET_SETPOINTCTL ""
#endif

namespace fleet {
namespace {

using setpoint::testing::FindRedisServer;
using setpoint::testing::FreeLoopbackPort;
using sharded::JsonValue;
using sharded::ParseJson;

constexpr char kNamespace[] = "fleet";
constexpr uint32_t kRing = 256;
constexpr absl::Duration kLease = absl::Seconds(2);
constexpr absl::Duration kPoll = absl::Milliseconds(250);
// The whole run, start-up to clean-up, stays under this.
constexpr absl::Duration kBound = absl::Seconds(88);
// The catalog keeps changing this long after the start, through every
// fault; then the API must converge on its final state.
constexpr absl::Duration kChurnFor = absl::Seconds(40);
constexpr absl::Duration kChurnPeriod = absl::Seconds(6);

const absl::Time g_start = absl::Now();

// One timeline line: elapsed seconds, then the text.
void Say(const std::string& line) {
  std::printf("[%5.1fs] %s\n", absl::ToDoubleSeconds(absl::Now() - g_start),
              line.c_str());
  std::fflush(stdout);
}
// A detail line under the last timeline line.
void Detail(const std::string& line) {
  std::printf("          %s\n", line.c_str());
  std::fflush(stdout);
}

std::string Seconds(absl::Duration d) {
  return absl::StrFormat("%.1fs", absl::ToDoubleSeconds(d));
}

// Polls `done` every 50 ms until it holds or `limit` passed.
bool WaitFor(absl::Duration limit, const std::function<bool()>& done) {
  absl::Time until = absl::Now() + limit;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

// ---- processes ------------------------------------------------------------

// Every process the demo started. Each leads a process group of its own
// (so a terminal's Ctrl-C reaches only the demo, which then kills them),
// and gets SIGKILL if the demo dies (PR_SET_PDEATHSIG).
class Processes {
 public:
  // Starts `args` with stdout and stderr to `log`. Returns the pid or -1.
  pid_t Start(const std::string& name, const std::vector<std::string>& args,
              const std::string& log) {
    // Everything the child needs is built before fork (the demo has
    // threads: only async-signal-safe calls between fork and exec).
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (std::string& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    sigset_t none;
    sigemptyset(&none);
    pid_t parent = getpid();
    std::lock_guard<std::mutex> l(mu_);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      signal(SIGPIPE, SIG_DFL);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      int in = open("/dev/null", O_RDONLY);
      int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (in >= 0) dup2(in, 0);
      if (out >= 0) {
        dup2(out, 1);
        dup2(out, 2);
      }
      execv(argv[0], argv.data());
      _exit(127);
    }
    setpgid(pid, pid);
    children_[name] = pid;
    return pid;
  }
  pid_t pid(const std::string& name) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = children_.find(name);
    return it == children_.end() ? -1 : it->second;
  }
  // Sends `sig` to the process group of `name`.
  void Signal(const std::string& name, int sig) {
    pid_t p = pid(name);
    if (p > 0) kill(-p, sig);
  }
  // Whether `name` exited (reaping it); its wait status in `status`.
  bool Exited(const std::string& name, int* status) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = children_.find(name);
    if (it == children_.end()) return true;
    if (waitpid(it->second, status, WNOHANG) != it->second) return false;
    children_.erase(it);
    return true;
  }
  // SIGTERM, then SIGKILL if it has not exited within `grace`. Returns its
  // wait status (-1 when it had to be killed).
  int Stop(const std::string& name, absl::Duration grace) {
    int status = 0;
    Signal(name, SIGCONT);
    Signal(name, SIGTERM);
    if (WaitFor(grace, [&] { return Exited(name, &status); })) return status;
    Kill(name);
    return -1;
  }
  // SIGKILL (after SIGCONT, so a stopped process does not keep it pending)
  // and reap.
  void Kill(const std::string& name) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = children_.find(name);
    if (it == children_.end()) return;
    KillLocked(it->second);
    children_.erase(it);
  }
  // Kills and reaps every process still running; returns how many.
  int KillAll() {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    for (auto& [name, p] : children_) {
      KillLocked(p);
      ++n;
    }
    children_.clear();
    return n;
  }

 private:
  static void KillLocked(pid_t p) {
    kill(-p, SIGCONT);
    kill(-p, SIGKILL);
    waitpid(p, nullptr, 0);
  }

  std::mutex mu_;
  std::map<std::string, pid_t> children_;
};

Processes& Children() {
  static Processes* p = new Processes();
  return *p;
}

// Takes SIGINT, SIGTERM and SIGHUP (blocked in every other thread) and
// watches the time bound; either way it kills every child and exits.
class Guard {
 public:
  Guard()
      : thread_([this] {
          sigset_t set = Signals();
          timespec tick{0, 200'000'000};
          while (!done_.load()) {
            int sig = sigtimedwait(&set, nullptr, &tick);
            if (sig > 0) {
              std::fflush(stdout);
              std::fprintf(stderr,
                           "\nfleet-demo: %s; killing every process it "
                           "started\n",
                           strsignal(sig));
              int n = Children().KillAll();
              std::fprintf(stderr, "fleet-demo: killed %d; exiting\n", n);
              _exit(130);
            }
            if (absl::Now() - g_start > kBound) {
              std::fflush(stdout);
              std::fprintf(stderr,
                           "fleet-demo: ran past its bound of %s; killing "
                           "every process it started\n",
                           Seconds(kBound).c_str());
              Children().KillAll();
              _exit(1);
            }
          }
        }) {}
  ~Guard() {
    done_.store(true);
    thread_.join();
  }
  static sigset_t Signals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    return set;
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// Runs `args` to the end (at most `limit`); its exit code and output.
struct Ran {
  int code = -1;
  std::string output;
};
Ran Run(const std::string& name, const std::vector<std::string>& args,
        const std::string& dir, absl::Duration limit) {
  static std::atomic<int> runs{0};
  std::string log =
      absl::StrCat(dir, "/", name, "-", runs.fetch_add(1), ".out");
  Ran r;
  if (Children().Start(name, args, log) < 0) return r;
  int status = 0;
  if (!WaitFor(limit, [&] { return Children().Exited(name, &status); })) {
    Children().Kill(name);
    r.output = absl::StrCat(name, ": did not finish within ", Seconds(limit));
    return r;
  }
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  r.output = text.str();
  return r;
}

// True once Redis on 127.0.0.1:port answers PING.
bool RedisAnswers(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = false;
  timeval tv{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      write(fd, "PING\r\n", 6) == 6) {
    char buf[8] = {};
    ok = read(fd, buf, sizeof(buf) - 1) > 0 &&
         std::string(buf).rfind("+PONG", 0) == 0;
  }
  close(fd);
  return ok;
}

// GET http://127.0.0.1:port<path> within `timeout`.
std::optional<std::string> Get(int port, const std::string& path,
                               absl::Duration timeout = absl::Seconds(2)) {
  httplib::Client client("127.0.0.1", port);
  auto t = std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout));
  client.set_connection_timeout(t);
  client.set_read_timeout(t);
  auto res = client.Get(path);
  if (!res || res->status != 200) return std::nullopt;
  return res->body;
}

std::optional<JsonValue> GetJson(int port, const std::string& path) {
  std::optional<std::string> body = Get(port, path);
  if (!body.has_value()) return std::nullopt;
  absl::StatusOr<JsonValue> v = ParseJson(*body);
  if (!v.ok()) return std::nullopt;
  return *std::move(v);
}

// ---- the fleet -------------------------------------------------------------

struct Pod {
  std::string id;
  int http_port = 0;  // 0: the pods of this build serve no /metrics.
};

// A node's claim as the API saw it: its last accepted write.
struct Claim {
  std::string node;
  setpoint::ShardSet range;
  uint64_t token = 0;
  absl::Time last_write;
};

// [[begin, end], ...] as the API writes a claim.
setpoint::ShardSet RunsOf(const JsonValue& runs) {
  std::vector<setpoint::ShardRange> out;
  for (const JsonValue& r : runs.items()) {
    if (r.items().size() != 2) continue;
    out.push_back({static_cast<uint32_t>(r.items()[0].AsInt64().value_or(0)),
                   static_cast<uint32_t>(r.items()[1].AsInt64().value_or(0))});
  }
  return setpoint::ShardSet::Of(std::move(out));
}

std::string PodOf(const std::string& node) {
  return node.substr(0, node.find('/'));
}
std::string KindOf(const std::string& node) {
  std::vector<std::string> parts = absl::StrSplit(node, '/');
  return parts.size() == 3 ? parts[1] : "";
}

class Fleet {
 public:
  Fleet(std::string dir, int records, absl::Duration think)
      : dir_(std::move(dir)), records_(records), think_(think) {
    sharded::Fill(want_, 0, records_, "10.0");
    churn_until_ = g_start + kChurnFor;
    want_.SetChurn({.period = kChurnPeriod, .until = churn_until_});
  }

  bool StartRedis() {
    std::string binary = FindRedisServer();
    if (binary.empty()) {
      Say("redis-server is not installed (Debian: redis-server)");
      return false;
    }
    redis_port_ = FreeLoopbackPort();
    Children().Start(
        "redis",
        {binary, "--port", absl::StrCat(redis_port_), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", dir_},
        dir_ + "/redis.log");
    if (!WaitFor(absl::Seconds(10),
                 [&] { return RedisAnswers(redis_port_); })) {
      Say("redis-server did not answer within 10s; see " + dir_ + "/redis.log");
      return false;
    }
    Say(absl::StrCat("redis-server on 127.0.0.1:", redis_port_, " (pid ",
                     Children().pid("redis"), ", no persistence)"));
    return true;
  }

  bool StartApi() {
    api_port_ = FreeLoopbackPort();
    Children().Start(
        "api",
        {FLEET_API_SERVER, absl::StrCat("--listen=127.0.0.1:", api_port_),
         "--unavailable_rate=0.02", "--throttle_rate=0.01"},
        dir_ + "/api.log");
    if (!WaitFor(absl::Seconds(10),
                 [&] { return Get(api_port_, "/healthz").has_value(); })) {
      Say("records_api_server did not answer within 10s; see " + dir_ +
          "/api.log");
      return false;
    }
    Say(absl::StrCat("records API service on http://127.0.0.1:", api_port_,
                     " (pid ", Children().pid("api"),
                     "; fences tokens per shard, injects 2% 503s and 1% "
                     "429s)"));
    return true;
  }

  std::vector<std::string> RegistryFlags() const {
    return {"--registry.type=redis",
            absl::StrCat("--registry.address=127.0.0.1:", redis_port_),
            absl::StrCat("--registry.namespace=", kNamespace)};
  }

  bool StartPods() {
    Ran help =
        Run("sharded-help", {FLEET_SHARDED, "--help"}, dir_, absl::Seconds(10));
    bool http = absl::StrContains(help.output, "--http.address");
    for (const char* id : {"pod-a", "pod-b", "pod-c"}) {
      Pod pod{.id = id, .http_port = http ? FreeLoopbackPort() : 0};
      std::vector<std::string> args = {
          FLEET_SHARDED,
          absl::StrCat("--pod_id=", id),
          absl::StrCat("--lease=", absl::FormatDuration(kLease)),
          absl::StrCat("--poll_interval=", absl::FormatDuration(kPoll)),
          absl::StrCat("--kinds.records.ring_size=", kRing),
          "--log_format=json",
          absl::StrCat("--records=", records_),
          absl::StrCat("--api=http://127.0.0.1:", api_port_),
          absl::StrCat("--api_think=", absl::FormatDuration(think_)),
          absl::StrCat("--churn=", absl::FormatDuration(kChurnPeriod)),
          absl::StrCat("--churn_until=", absl::ToUnixMillis(churn_until_)),
      };
      for (std::string& f : RegistryFlags()) args.push_back(f);
      if (pod.http_port != 0) {
        args.push_back(
            absl::StrCat("--http.address=127.0.0.1:", pod.http_port));
      }
      if (Children().Start(id, args, dir_ + "/" + id + ".log") < 0) {
        Say(absl::StrCat("cannot start ", id));
        return false;
      }
      pods_.push_back(pod);
    }
    Say(absl::StrCat(
        "3 pods of sharded (pod-a, pod-b, pod-c), 2 records nodes + 1 zone "
        "node each, ring of ",
        kRing, " shards, lease ", absl::FormatDuration(kLease), ", poll ",
        absl::FormatDuration(kPoll)));
    Detail(absl::StrCat(records_, " records, each given a new address every ",
                        absl::FormatDuration(kChurnPeriod), " until ",
                        Seconds(kChurnFor), "; a write reads, thinks ",
                        absl::FormatDuration(think_), ", then sends"));
    Detail(http ? "pods serve /metrics on --http.address"
                : "this build's pods have no --http.address: no /metrics");
    return true;
  }

  // ---- what the API says ----

  std::optional<JsonValue> Stats() { return GetJson(api_port_, "/v1/stats"); }

  std::vector<Claim> Claims(const JsonValue& stats) {
    std::vector<Claim> out;
    const JsonValue* writers = stats.Find("writers");
    if (writers == nullptr) return out;
    for (const auto& [node, w] : writers->fields()) {
      const JsonValue* range = w.Find("range");
      if (range == nullptr) continue;
      Claim c{.node = node,
              .range = RunsOf(*range),
              .token = w.Find("token") != nullptr
                           ? w.Find("token")->AsUint64().value_or(0)
                           : 0,
              .last_write = absl::FromUnixMicros(w.IntOr("last_write_us", 0))};
      out.push_back(c);
    }
    return out;
  }

  // The records claims of `pods` written since `since`, when they cover
  // the ring; else empty.
  std::vector<Claim> Covering(const std::set<std::string>& pods,
                              absl::Time since) {
    std::optional<JsonValue> stats = Stats();
    if (!stats.has_value()) return {};
    std::vector<Claim> fresh;
    std::vector<bool> covered(kRing, false);
    for (const Claim& c : Claims(*stats)) {
      if (KindOf(c.node) != "records" || !pods.contains(PodOf(c.node)) ||
          c.last_write < since) {
        continue;
      }
      fresh.push_back(c);
      for (const setpoint::ShardRange& r : c.range.runs()) {
        for (uint32_t s = r.begin; s < r.end && s < kRing; ++s) {
          covered[s] = true;
        }
      }
    }
    for (bool b : covered) {
      if (!b) return {};
    }
    return fresh;
  }

  static void PrintClaims(const std::vector<Claim>& claims) {
    for (const Claim& c : claims) {
      Detail(absl::StrFormat("%-18s %-11s token %d", c.node, c.range.ToString(),
                             c.token));
    }
  }

  // Waits until the records of `pods` written since `since` cover the ring.
  bool AwaitCover(const std::set<std::string>& pods, absl::Time since,
                  absl::Duration limit, std::vector<Claim>* claims) {
    return WaitFor(limit, [&] {
      *claims = Covering(pods, since);
      return !claims->empty();
    });
  }

  bool Converged(std::string* why) {
    std::optional<std::string> body = Get(api_port_, "/v1/records");
    if (!body.has_value()) {
      *why = "the API does not answer";
      return false;
    }
    absl::StatusOr<JsonValue> v = ParseJson(*body);
    const JsonValue* records = v.ok() ? v->Find("records") : nullptr;
    if (records == nullptr) {
      *why = "the API's records do not parse";
      return false;
    }
    sharded::Records want = want_.Get();
    int wrong = 0;
    for (const auto& [name, r] : want) {
      const JsonValue* have = records->Find(name);
      if (have == nullptr || have->StringOr("address") != r.address) ++wrong;
    }
    int extra = 0;
    for (const auto& [name, r] : records->fields()) {
      if (!want.contains(name)) ++extra;
    }
    int64_t serial = v->IntOr("serial", -1);
    *why =
        absl::StrCat(want.size() - static_cast<size_t>(wrong), "/", want.size(),
                     " records as wanted, ", extra, " extra, serial ", serial);
    return wrong == 0 && extra == 0 &&
           serial == static_cast<int64_t>(want.size());
  }

  // Records on the API and serial, whatever their addresses.
  bool Populated(std::string* why) {
    std::optional<JsonValue> stats = Stats();
    if (!stats.has_value()) return false;
    int64_t n = stats->IntOr("records", -1);
    int64_t serial = stats->IntOr("serial", -1);
    *why = absl::StrCat(n, " records, serial ", serial);
    return n == records_ && serial == records_;
  }

  // ---- the pods' own view ----

  // A metric to print: series named `name` whose labels hold `labels`.
  struct Series {
    std::string name;
    std::string labels = "";
  };

  // Prints at most `per_name` series of each of `wanted` from the pod's
  // /metrics.
  void PrintMetrics(const Pod& pod, const std::vector<Series>& wanted,
                    size_t per_name) {
    if (pod.http_port == 0) {
      Detail(pod.id +
             " /metrics: unavailable (no --http.address in this "
             "build)");
      return;
    }
    std::optional<std::string> text = Get(pod.http_port, "/metrics");
    if (!text.has_value()) {
      Detail(pod.id + " /metrics: unavailable (no answer)");
      return;
    }
    for (const Series& w : wanted) {
      std::vector<std::string> found;
      for (absl::string_view line : absl::StrSplit(*text, '\n')) {
        if (absl::StartsWith(line, w.name + "{") &&
            absl::StrContains(line, w.labels)) {
          found.emplace_back(line);
        }
      }
      if (found.empty()) Detail(pod.id + " " + w.name + ": no series");
      for (size_t k = 0; k < found.size() && k < per_name; ++k) {
        Detail(pod.id + " " + found[k]);
      }
    }
  }

  std::string Setpointctl() const {
    std::string path = FLEET_SETPOINTCTL;
    if (!path.empty() && access(path.c_str(), X_OK) == 0) return path;
    return "";
  }

  // Runs setpointctl with the pods' registry flags; prints its output.
  bool Ctl(const std::vector<std::string>& command) {
    std::string ctl = Setpointctl();
    if (ctl.empty()) {
      Detail("setpointctl " + absl::StrJoin(command, " ") +
             ": setpointctl not built");
      return false;
    }
    std::vector<std::string> args = {ctl};
    for (std::string& f : RegistryFlags()) args.push_back(f);
    for (const std::string& c : command) args.push_back(c);
    Ran r = Run("setpointctl", args, dir_, absl::Seconds(10));
    Detail(absl::StrCat("$ setpointctl ", absl::StrJoin(command, " "),
                        "   (exit ", r.code, ")"));
    int n = 0;
    for (absl::string_view line : absl::StrSplit(r.output, '\n')) {
      if (line.empty()) continue;
      if (++n > 40) {
        Detail("  ...");
        break;
      }
      Detail(absl::StrCat("  ", line));
    }
    return r.code == 0;
  }

  const std::vector<Pod>& pods() const { return pods_; }
  const Pod& pod(const std::string& id) const {
    for (const Pod& p : pods_) {
      if (p.id == id) return p;
    }
    return pods_.front();
  }
  absl::Time churn_until() const { return churn_until_; }
  int api_port() const { return api_port_; }
  const std::string& dir() const { return dir_; }

 private:
  const std::string dir_;
  const int records_;
  const absl::Duration think_;
  sharded::Catalog want_;
  absl::Time churn_until_;
  int redis_port_ = 0;
  int api_port_ = 0;
  std::vector<Pod> pods_;
};

// ---- the audit
// ---------------------------------------------------------------

// A grant a pod logged: "shard range granted node=<id> range=[b,e) token=t".
struct Grant {
  absl::Time time;
  std::string node;
  setpoint::ShardSet range;
  uint64_t token = 0;
};

std::vector<Grant> ReadGrants(const std::string& log) {
  std::vector<Grant> out;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StrContains(line, "shard range granted")) continue;
    absl::StatusOr<JsonValue> v = ParseJson(line);
    if (!v.ok()) continue;
    Grant g;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, v->StringOr("time"), &g.time,
                         &err)) {
      continue;
    }
    for (absl::string_view field : absl::StrSplit(v->StringOr("msg"), ' ')) {
      if (absl::ConsumePrefix(&field, "node=")) g.node = std::string(field);
      if (absl::ConsumePrefix(&field, "token=")) {
        if (!absl::SimpleAtoi(field, &g.token)) g.token = 0;
      }
      if (absl::ConsumePrefix(&field, "range=")) {
        // "[b,e)" or "[b,e)+[b,e)...".
        std::vector<setpoint::ShardRange> runs;
        for (absl::string_view run : absl::StrSplit(field, '+')) {
          std::vector<absl::string_view> be = absl::StrSplit(run, ',');
          setpoint::ShardRange r;
          if (be.size() != 2 || !absl::ConsumePrefix(&be[0], "[") ||
              !absl::ConsumeSuffix(&be[1], ")") ||
              !absl::SimpleAtoi(be[0], &r.begin) ||
              !absl::SimpleAtoi(be[1], &r.end)) {
            runs.clear();
            break;
          }
          runs.push_back(r);
        }
        g.range = setpoint::ShardSet::Of(std::move(runs));
      }
    }
    if (!g.node.empty() && g.token != 0) out.push_back(std::move(g));
  }
  return out;
}

struct AcceptedWrite {
  absl::Time time;
  std::string node;
  std::string kind;
  uint32_t shard = 0;
  uint64_t token = 0;
  setpoint::ShardSet claim;
};

// Every write the API accepted, in the order it accepted them.
std::optional<std::vector<AcceptedWrite>> ReadWrites(int api_port) {
  std::vector<AcceptedWrite> out;
  int64_t from = 0;
  while (true) {
    std::optional<JsonValue> page =
        GetJson(api_port, absl::StrCat("/v1/writes?from=", from));
    if (!page.has_value()) return std::nullopt;
    const JsonValue* writes = page->Find("writes");
    if (writes == nullptr) return std::nullopt;
    for (const JsonValue& w : writes->items()) {
      const auto& f = w.items();
      if (f.size() != 6) return std::nullopt;
      out.push_back({absl::FromUnixMicros(f[0].AsInt64().value_or(0)),
                     f[1].str(), f[2].str(),
                     static_cast<uint32_t>(f[3].AsInt64().value_or(0)),
                     f[4].AsUint64().value_or(0), RunsOf(f[5])});
    }
    int64_t next = page->IntOr("next", from);
    if (writes->items().empty() || next <= from) break;
    from = next;
  }
  return out;
}

// A stale write accepted is one of:
//  (a) by the API's own record: a write accepted for a shard after the API
//      had accepted a write with a newer token claiming that shard (the
//      log is replayed here, independently of the API's check);
//  (b) by the registry's tokens: a write accepted from a node after
//      another node had been granted the write's shard with a newer token,
//      as the pods logged their grants (to within the few milliseconds
//      between a grant and its log line).
struct AuditResult {
  int64_t writes = 0;
  int64_t grants = 0;
  int64_t after_newer_seen = 0;   // (a)
  int64_t after_newer_grant = 0;  // (b)
  int64_t stale_accepted = 0;     // (a) or (b)
  std::vector<std::string> examples;
};

AuditResult Audit(const std::vector<AcceptedWrite>& writes,
                  const std::vector<Grant>& grants) {
  AuditResult r;
  r.writes = static_cast<int64_t>(writes.size());
  r.grants = static_cast<int64_t>(grants.size());
  std::map<std::pair<std::string, uint32_t>, uint64_t> newest;  // (kind, shard)
  for (const AcceptedWrite& w : writes) {
    bool a = false;
    auto it = newest.find({w.kind, w.shard});
    if (it != newest.end() && w.token < it->second) a = true;
    const uint32_t ring = w.kind == "records" ? kRing : 1u;
    for (const setpoint::ShardRange& run : w.claim.runs()) {
      for (uint32_t s = run.begin; s < std::min(run.end, ring); ++s) {
        uint64_t& t = newest[{w.kind, s}];
        t = std::max(t, w.token);
      }
    }
    bool b = false;
    for (const Grant& g : grants) {
      if (g.time < w.time && g.node != w.node && KindOf(g.node) == w.kind &&
          g.range.Contains(w.shard) && g.token > w.token) {
        b = true;
        break;
      }
    }
    r.after_newer_seen += a ? 1 : 0;
    r.after_newer_grant += b ? 1 : 0;
    if (a || b) {
      ++r.stale_accepted;
      if (r.examples.size() < 5) {
        r.examples.push_back(absl::StrFormat(
            "%s wrote shard %d with token %d at %s", w.node, w.shard, w.token,
            absl::FormatTime("%H:%M:%E6S", w.time, absl::UTCTimeZone())));
      }
    }
  }
  return r;
}

int64_t StaleRefusedOf(const JsonValue& stats, const std::string& pod) {
  const JsonValue* by_pod = stats.Find("stale_refused_by_pod");
  return by_pod == nullptr ? 0 : by_pod->IntOr(pod, 0);
}

// ---- the run
// -------------------------------------------------------------------

struct Args {
  int records = 300;
  absl::Duration think = absl::Milliseconds(600);
  bool keep = false;
};

int Main(const Args& args) {
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                  "/fleet-demo-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("fleet-demo: mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  Say("run directory " + dir + " (every process's log)");
  Fleet fleet(dir, args.records, args.think);
  bool ok = fleet.StartRedis() && fleet.StartApi() && fleet.StartPods();
  std::vector<std::string> problems;
  auto fail = [&](const std::string& what) {
    problems.push_back(what);
    Say("FAILED: " + what);
  };
  if (!ok) fail("start-up");
  const std::set<std::string> all = {"pod-a", "pod-b", "pod-c"};
  std::vector<Claim> claims;
  std::string why;

  if (ok) {
    absl::Time t = absl::Now();
    bool synced =
        WaitFor(absl::Seconds(30), [&] { return fleet.Populated(&why); }) &&
        fleet.AwaitCover(all, g_start, absl::Seconds(10), &claims);
    if (synced) {
      Say(absl::StrCat("initial sync in ", Seconds(absl::Now() - t), ": ", why,
                       "; the API saw these nodes write:"));
      Fleet::PrintClaims(claims);
    } else {
      fail("initial sync (" + why + ")");
    }
  }

  if (ok) {
    Say("the pods' /metrics (a few setpoint_ series):");
    for (const Pod& pod : fleet.pods()) {
      fleet.PrintMetrics(pod,
                         {{"setpoint_node_shards_owned", "kind=\"records\""},
                          {"setpoint_syncer_operations_total",
                           "op=\"create\",result=\"success\""}},
                         2);
    }
    Say("the registry, as setpointctl reads it:");
    fleet.Ctl({"status"});
  }

  // A crash: pod-a's shards wait for its lease to expire.
  if (ok) {
    Children().Signal("pod-a", SIGKILL);
    int status = 0;
    WaitFor(absl::Seconds(5),
            [&] { return Children().Exited("pod-a", &status); });
    absl::Time t = absl::Now();
    Say("SIGKILL pod-a (a crash): its shards move once its lease (" +
        absl::FormatDuration(kLease) + ") expires");
    if (fleet.AwaitCover({"pod-b", "pod-c"}, t, absl::Seconds(20), &claims)) {
      Say(absl::StrCat("takeover: pod-b and pod-c write the whole ring ",
                       Seconds(absl::Now() - t), " after the kill:"));
      Fleet::PrintClaims(claims);
    } else {
      fail("takeover after pod-a's crash not seen within 20s");
    }
  }

  // A freeze past the lease: pod-b's started writes carry its old token.
  int64_t refused_before = 0;
  int64_t refused_b = 0;
  if (ok) {
    if (std::optional<JsonValue> s = fleet.Stats()) {
      refused_before = StaleRefusedOf(*s, "pod-b");
    }
    Children().Signal("pod-b", SIGSTOP);
    absl::Time t = absl::Now();
    absl::Duration freeze = kLease + absl::Seconds(3);
    Say("SIGSTOP pod-b for " + absl::FormatDuration(freeze) +
        " (past its lease), with writes between their read and their send");
    if (fleet.AwaitCover({"pod-c"}, t, freeze, &claims)) {
      Say(absl::StrCat("takeover: pod-c writes the whole ring ",
                       Seconds(absl::Now() - t),
                       " after the freeze, with newer tokens:"));
      Fleet::PrintClaims(claims);
    } else {
      fail("takeover of frozen pod-b's shards not seen");
    }
    // The freeze's length is the point of the step, not a wait for an
    // outcome.
    absl::Duration left = freeze - (absl::Now() - t);
    if (left > absl::ZeroDuration()) absl::SleepFor(left);
    Children().Signal("pod-b", SIGCONT);
    absl::Time thawed = absl::Now();
    Say("SIGCONT pod-b: it fences itself, but the writes it had started go "
        "out with its old token");
    bool refused = WaitFor(absl::Seconds(5), [&] {
      std::optional<JsonValue> s = fleet.Stats();
      if (!s.has_value()) return false;
      refused_b = StaleRefusedOf(*s, "pod-b") - refused_before;
      return refused_b > 0;
    });
    if (refused) {
      Say(absl::StrCat("the API refused ", refused_b,
                       " stale writes from pod-b by token, ",
                       Seconds(absl::Now() - thawed), " after the thaw"));
    } else {
      Say("the API refused no write from pod-b: none was in flight when it "
          "froze");
    }
    absl::Duration rejoin_limit = absl::Seconds(15);
    bool rejoined = WaitFor(rejoin_limit, [&] {
      claims = fleet.Covering({"pod-b", "pod-c"}, thawed);
      for (const Claim& c : claims) {
        if (PodOf(c.node) == "pod-b") return true;
      }
      return false;
    });
    if (rejoined) {
      Say(absl::StrCat("pod-b rejoined with new tokens ",
                       Seconds(absl::Now() - thawed),
                       " after the thaw; the ring as written since:"));
      Fleet::PrintClaims(claims);
      Say("pod-b's own view: every refusal is counted as a stale refusal; "
          "those that came back after its node had fenced are also "
          "discarded results (the key had left its range):");
      fleet.PrintMetrics(fleet.pod("pod-b"),
                         {{"setpoint_syncer_stale_refusals_total"},
                          {"setpoint_syncer_results_discarded_total"},
                          {"setpoint_node_self_fences_total"}},
                         2);
    } else {
      fail("pod-b did not write again within " +
           absl::FormatDuration(rejoin_limit) + " of its thaw");
    }
  }

  // A drain: pod-c hands its shards over without waiting for a lease.
  if (ok) {
    if (fleet.Setpointctl().empty()) {
      fail("drain of pod-c: setpointctl not built");
    } else {
      absl::Time t = absl::Now();
      Say("drain pod-c with setpointctl:");
      if (!fleet.Ctl({"drain", "pod-c"})) {
        fail("setpointctl drain pod-c");
      } else if (fleet.AwaitCover({"pod-b"}, t, absl::Seconds(20), &claims)) {
        Say(absl::StrCat("pod-c handed over: pod-b writes the whole ring ",
                         Seconds(absl::Now() - t), " after the drain:"));
        Fleet::PrintClaims(claims);
        fleet.Ctl({"status"});
        t = absl::Now();
        Say("undrain pod-c: it takes its share again");
        if (!fleet.Ctl({"undrain", "pod-c"})) {
          fail("setpointctl undrain pod-c");
        } else if (WaitFor(absl::Seconds(20), [&] {
                     claims = fleet.Covering({"pod-b", "pod-c"}, t);
                     for (const Claim& c : claims) {
                       if (PodOf(c.node) == "pod-c") return true;
                     }
                     return false;
                   })) {
          Say(absl::StrCat("pod-c writes again ", Seconds(absl::Now() - t),
                           " after the undrain:"));
          Fleet::PrintClaims(claims);
        } else {
          fail("pod-c did not write again within 20s of the undrain");
        }
      } else {
        fail("pod-c's handover after the drain not seen within 20s");
      }
    }
  }

  bool converged = false;
  if (ok) {
    absl::Duration churn_left = fleet.churn_until() - absl::Now();
    Say("the catalog stops changing " +
        (churn_left > absl::ZeroDuration()
             ? absl::StrCat("in ", Seconds(churn_left))
             : std::string("now")) +
        "; waiting for the API to hold it");
    converged =
        WaitFor(std::max(churn_left, absl::ZeroDuration()) + absl::Seconds(20),
                [&] { return fleet.Converged(&why); });
    Say(absl::StrCat(converged ? "converged: " : "NOT converged: ", why));
  }

  // The audit, from the API's record of every accepted write and the
  // pods' logged grants.
  std::optional<JsonValue> final_stats = fleet.Stats();
  std::optional<std::vector<AcceptedWrite>> writes =
      ReadWrites(fleet.api_port());
  for (const Pod& pod : fleet.pods()) {
    if (pod.id == "pod-a") continue;
    int status = Children().Stop(pod.id, absl::Seconds(10));
    if (status != 0) {
      fail(absl::StrCat(pod.id, " did not stop cleanly on SIGTERM (status ",
                        status, ")"));
    }
  }
  Children().Stop("api", absl::Seconds(5));
  Children().Kill("redis");
  std::vector<Grant> grants;
  for (const Pod& pod : fleet.pods()) {
    for (Grant& g : ReadGrants(dir + "/" + pod.id + ".log")) {
      grants.push_back(std::move(g));
    }
  }
  int64_t refused = 0;
  AuditResult audit;
  bool audited = writes.has_value() && final_stats.has_value();
  if (audited) {
    refused = final_stats->IntOr("stale_refused", 0);
    audit = Audit(*writes, grants);
    Say(absl::StrCat("audit: ", audit.writes, " accepted writes against ",
                     audit.grants, " logged grants"));
    Detail(absl::StrCat(
        "stale writes refused by the API: ", refused, " (by pod:", " pod-a ",
        StaleRefusedOf(*final_stats, "pod-a"), ", pod-b ",
        StaleRefusedOf(*final_stats, "pod-b"), ", pod-c ",
        StaleRefusedOf(*final_stats, "pod-c"),
        "); not the owner: ", final_stats->IntOr("unowned_refused", 0),
        "; injected 503/429: ", final_stats->IntOr("injected_errors", 0)));
    Detail(absl::StrCat(
        "accepted although the API had seen a newer token for the shard: ",
        audit.after_newer_seen));
    Detail(absl::StrCat(
        "accepted from a node after another was granted the shard with a "
        "newer token: ",
        audit.after_newer_grant));
    for (const std::string& e : audit.examples) Detail("  " + e);
  } else {
    fail("audit: the API's write log or stats could not be read");
  }
  if (grants.empty()) fail("audit: no grant found in the pods' logs");
  int leftover = Children().KillAll();
  if (leftover > 0)
    Say(absl::StrCat("killed ", leftover, " leftover processes"));

  bool pass = ok && problems.empty() && converged && audited &&
              audit.stale_accepted == 0;
  Say(absl::StrCat("done in ", Seconds(absl::Now() - g_start), "; logs in ",
                   pass && !args.keep ? "(removed)" : dir));
  std::string verdict = absl::StrCat(
      converged ? "converged" : "NOT converged", ", stale writes refused ",
      refused, ", stale writes accepted ", audit.stale_accepted);
  if (!problems.empty()) {
    verdict =
        absl::StrCat("FAILED (", problems.front(),
                     problems.size() > 1
                         ? absl::StrCat(", and ", problems.size() - 1, " more")
                         : "",
                     "), ", verdict);
  }
  std::printf("verdict: %s\n", verdict.c_str());
  std::fflush(stdout);
  if (pass && !args.keep) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  return pass ? 0 : 1;
}

}  // namespace
}  // namespace fleet

int main(int argc, char** argv) {
  fleet::Args args;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    bool ok = true;
    if (absl::ConsumePrefix(&arg, "--records=")) {
      ok = absl::SimpleAtoi(arg, &args.records) && args.records > 0 &&
           args.records <= 5000;
    } else if (absl::ConsumePrefix(&arg, "--think=")) {
      ok = absl::ParseDuration(arg, &args.think) &&
           args.think >= absl::ZeroDuration() && args.think <= absl::Seconds(1);
    } else if (arg == "--keep") {
      args.keep = true;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: fleet_demo [--records=1..5000 (300)] "
                   "[--think=0..1s (600ms)] [--keep]\n");
      return 2;
    }
  }
  // Before any thread: the guard takes these signals, the children get
  // them unblocked.
  sigset_t set = fleet::Guard::Signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  fleet::Guard guard;
  int code = fleet::Main(args);
  fleet::Children().KillAll();
  return code;
}
