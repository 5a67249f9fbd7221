// failover_pod: one "pod" for the multi-process failover test. Runs a
// NodeManager with two nodes against Redis and appends every ownership event
// to a log file, with times on the system-wide monotonic clock:
//   B <node> <begin> <end> <token> <ns>   UpdateShardRange called
//   E <node> <ns>                         ...and returned
//   R <ns> <valid_until_ns>               lease renewed: may work until then
// SIGTERM or SIGINT stop it gracefully (exit 0).
//
//   failover_pod <redis-address> <pod-id> <log-file> <lease-ms> <poll-ms>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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
  void UpdateShardRange(const setpoint::Context&,
                        const setpoint::ShardAssignment& a) override {
    Log(fd_, absl::StrCat("B ", id_, " ", a.range.begin, " ", a.range.end, " ",
                          a.token, " ", MonotonicNanos()));
    Log(fd_, absl::StrCat("E ", id_, " ", MonotonicNanos()));
  }

 private:
  const std::string id_;
  const int fd_;
};

}  // namespace

int main(int argc, char** argv) {
  int lease_ms = 0, poll_ms = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[4], &lease_ms) ||
      !absl::SimpleAtoi(argv[5], &poll_ms)) {
    std::fprintf(stderr,
                 "usage: failover_pod <redis-address> <pod-id> <log-file> "
                 "<lease-ms> <poll-ms>\n");
    return 2;
  }
  int fd = open(argv[3], O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) {
    std::perror("open log");
    return 2;
  }
  // Signals are taken by sigwait below, on this thread only.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto logger = spdlog::stderr_logger_mt(std::string("pod-") + argv[2]);
  logger->set_level(spdlog::level::warn);
  auto registry = setpoint::RedisNodeRegistry::Create(
      {.address = argv[1], .ns = "failover", .logger = logger});
  if (!registry.ok()) {
    std::fprintf(stderr, "%s\n", registry.status().ToString().c_str());
    return 2;
  }
  setpoint::NodeManager manager({
      .pod_id = argv[2],
      .kinds = {{.kind = "work",
                 .count = 2,
                 .ring_size = 64,
                 .factory =
                     [fd](const setpoint::NodeInfo& info) {
                       return std::make_unique<LoggingNode>(info.id, fd);
                     }}},
      .registry = registry->get(),
      .poll_interval = absl::Milliseconds(poll_ms),
      .lease = absl::Milliseconds(lease_ms),
      .on_lease_renewed =
          [fd](absl::Time valid_until) {
            Log(fd, absl::StrCat("R ", MonotonicNanos(), " ",
                                 absl::ToUnixNanos(valid_until)));
          },
      .logger = logger,
  });
  if (absl::Status s = manager.Start(); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  int sig = 0;
  sigwait(&signals, &sig);
  manager.Stop();
  close(fd);
  return 0;
}
