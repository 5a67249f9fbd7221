// chaos_pod: one "pod" of the chaos test. Runs a NodeManager with --nodes
// nodes of kind "work" on a ring of --ring shards against Redis, and appends
// every ownership event to --log, with times on CLOCK_MONOTONIC (the
// system-wide monotonic clock, so the driver can merge all pods' logs):
//   S <ns> <pod> <pid> <nodes> <ring> <lease_ms> <poll_ms> <clock_offset_ns>
//                                         started (before the manager starts)
//   B <node> <begin> <end> <token> <ns>   UpdateShardRange called
//   E <node> <ns>                         ...and returned
//   R <ns> <valid_until_ns>               lease renewed: may work until then
//   T <ns> <signal>                       stop requested (SIGTERM/SIGINT)
//   X <ns>                                stopped gracefully, about to exit 0
// Each line is one write(), so whole lines survive SIGKILL.
//
// <clock_offset_ns> is ToUnixNanos(Clock::Monotonic()->Now()) minus
// CLOCK_MONOTONIC read just before it: the manager's clock is
// std::chrono::steady_clock shown as UnixEpoch() + time_since_epoch, which
// on Linux/libstdc++ is CLOCK_MONOTONIC itself, so valid_until converts
// with absl::ToUnixNanos and this offset is ~0 (the driver checks it).
//
//   chaos_pod --redis=127.0.0.1:6379 --pod=p0 --log=/tmp/p0.log --nodes=3
//             --ring=256 --lease_ms=1500 --poll_ms=250 --ns=chaos
//             [--command_timeout_ms=N] [--operation_timeout_ms=N]
//
// SIGTERM or SIGINT stop it gracefully (exit 0). Uses only the public API.
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "setpoint/base/clock.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/registry/redis_node_registry.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace {

int64_t MonotonicNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Appends one line with a single write(): whole lines survive SIGKILL.
void Log(int fd, const std::string& line) {
  std::string out = line + "\n";
  ssize_t n = write(fd, out.data(), out.size());
  (void)n;
}

class LoggingNode : public setpoint::Node {
 public:
  LoggingNode(std::string id, int fd) : id_(std::move(id)), fd_(fd) {}
  absl::Status Run(const setpoint::Context& ctx) override {
    (void)ctx.Wait(absl::InfiniteDuration());  // Cancelled at stop.
    return absl::OkStatus();
  }
  absl::Status UpdateShardRange(const setpoint::Context&,
                                const setpoint::ShardAssignment& a) override {
    Log(fd_, absl::StrCat("B ", id_, " ", a.range.begin, " ", a.range.end, " ",
                          a.token, " ", MonotonicNanos()));
    Log(fd_, absl::StrCat("E ", id_, " ", MonotonicNanos()));
    return absl::OkStatus();
  }

 private:
  const std::string id_;
  const int fd_;
};

int Usage(const char* why) {
  std::fprintf(stderr,
               "chaos_pod: %s\nusage: chaos_pod --redis=ADDR --pod=ID "
               "--log=FILE --nodes=N --ring=R --lease_ms=MS --poll_ms=MS "
               "--ns=NAME [--command_timeout_ms=MS] "
               "[--operation_timeout_ms=MS]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
      return Usage(("bad argument: " + arg).c_str());
    }
    flags[arg.substr(2, eq - 2)] = arg.substr(eq + 1);
  }
  for (const char* required :
       {"redis", "pod", "log", "nodes", "ring", "lease_ms", "poll_ms", "ns"}) {
    if (flags.count(required) == 0) {
      return Usage(absl::StrCat("missing --", required).c_str());
    }
  }
  int nodes = 0, lease_ms = 0, poll_ms = 0, command_timeout_ms = 0,
      operation_timeout_ms = 0;
  uint32_t ring = 0;
  if (!absl::SimpleAtoi(flags["nodes"], &nodes) || nodes <= 0 ||
      !absl::SimpleAtoi(flags["ring"], &ring) || ring == 0 ||
      !absl::SimpleAtoi(flags["lease_ms"], &lease_ms) ||
      !absl::SimpleAtoi(flags["poll_ms"], &poll_ms) ||
      (flags.count("command_timeout_ms") != 0 &&
       !absl::SimpleAtoi(flags["command_timeout_ms"], &command_timeout_ms)) ||
      (flags.count("operation_timeout_ms") != 0 &&
       !absl::SimpleAtoi(flags["operation_timeout_ms"],
                         &operation_timeout_ms))) {
    return Usage("a number does not parse");
  }
  const std::string pod = flags["pod"];
  int fd = open(flags["log"].c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) {
    std::perror("open log");
    return 2;
  }
  // Signals are taken by sigwait below, on this thread only (threads
  // started later inherit the mask).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto logger = spdlog::stderr_logger_mt("pod-" + pod);
  logger->set_level(spdlog::level::warn);
  setpoint::RedisNodeRegistryOptions registry_options{
      .address = flags["redis"], .ns = flags["ns"], .logger = logger};
  if (command_timeout_ms > 0) {
    registry_options.command_timeout = absl::Milliseconds(command_timeout_ms);
  }
  auto registry = setpoint::RedisNodeRegistry::Create(registry_options);
  if (!registry.ok()) {
    std::fprintf(stderr, "%s\n", registry.status().ToString().c_str());
    return 2;
  }
  setpoint::NodeManagerOptions options{
      .pod_id = pod,
      .kinds = {{.kind = "work",
                 .count = nodes,
                 .ring_size = ring,
                 .factory =
                     [fd](const setpoint::NodeInfo& info) {
                       return std::make_unique<LoggingNode>(info.id, fd);
                     }}},
      .registry = registry->get(),
      .poll_interval = absl::Milliseconds(poll_ms),
      .lease = absl::Milliseconds(lease_ms),
      // valid_until is on the manager's clock, Clock::Monotonic():
      // steady_clock as UnixEpoch() + time_since_epoch, i.e. CLOCK_MONOTONIC
      // nanoseconds once converted with ToUnixNanos (offset in the S line).
      .on_lease_renewed =
          [fd](absl::Time valid_until) {
            Log(fd, absl::StrCat("R ", MonotonicNanos(), " ",
                                 absl::ToUnixNanos(valid_until)));
          },
      .clock = setpoint::Clock::Monotonic(),
      .logger = logger,
  };
  if (operation_timeout_ms > 0) {
    options.operation_timeout = absl::Milliseconds(operation_timeout_ms);
  }
  setpoint::NodeManager manager(std::move(options));

  int64_t before = MonotonicNanos();
  int64_t manager_now = absl::ToUnixNanos(setpoint::Clock::Monotonic()->Now());
  int64_t after = MonotonicNanos();
  // Between the two reads: the offset is within [after-before] of this.
  int64_t offset = manager_now - (before + (after - before) / 2);
  Log(fd, absl::StrCat("S ", before, " ", pod, " ", getpid(), " ", nodes, " ",
                       ring, " ", lease_ms, " ", poll_ms, " ", offset));
  if (absl::Status s = manager.Start(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  Log(fd, absl::StrCat("T ", MonotonicNanos(), " ", sig));
  manager.Stop();
  Log(fd, absl::StrCat("X ", MonotonicNanos()));
  close(fd);
  return 0;
}
