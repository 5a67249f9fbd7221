#include "chaos/chaos_redis.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "chaos/spawn.h"
#include "setpoint/testing/redis_server.h"

namespace setpoint::chaos {
namespace {

int64_t NowNanos() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Milliseconds left until `deadline` (CLOCK_MONOTONIC ns), at least 0.
int MsLeft(int64_t deadline) {
  int64_t left = (deadline - NowNanos()) / 1'000'000;
  return left < 0 ? 0 : static_cast<int>(left);
}

// Length of the complete RESP value at the start of `in`, or 0 if more
// bytes are needed. Sets `bad` on a malformed reply.
size_t CompleteValue(const std::string& in, size_t pos, bool& bad) {
  size_t eol = in.find("\r\n", pos);
  if (eol == std::string::npos || pos >= in.size()) return 0;
  char type = in[pos];
  std::string head = in.substr(pos + 1, eol - pos - 1);
  size_t after = eol + 2;
  switch (type) {
    case '+':
    case '-':
    case ':':
      return after - pos;
    case '$': {
      int64_t n = 0;
      if (!absl::SimpleAtoi(head, &n)) {
        bad = true;
        return 0;
      }
      if (n < 0) return after - pos;
      size_t need = after + static_cast<size_t>(n) + 2;
      return in.size() >= need ? need - pos : 0;
    }
    case '*': {
      int64_t n = 0;
      if (!absl::SimpleAtoi(head, &n)) {
        bad = true;
        return 0;
      }
      size_t at = after;
      for (int64_t i = 0; i < n; ++i) {
        size_t len = CompleteValue(in, at, bad);
        if (len == 0) return 0;
        at += len;
      }
      return at - pos;
    }
    default:
      bad = true;
      return 0;
  }
}

}  // namespace

absl::StatusOr<std::string> RedisCommand(int port,
                                         const std::vector<std::string>& args,
                                         absl::Duration timeout) {
  const std::string what = args.empty() ? "redis command" : args[0];
  int64_t deadline = NowNanos() + absl::ToInt64Nanoseconds(timeout);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::InternalError(what + ": socket failed");
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      return absl::UnavailableError(absl::StrCat(what, ": cannot connect"));
    }
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    int err = 0;
    socklen_t len = sizeof(err);
    if (poll(&p, 1, MsLeft(deadline)) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
      return absl::UnavailableError(absl::StrCat(what, ": cannot connect"));
    }
  }
  std::string out = absl::StrCat("*", args.size(), "\r\n");
  for (const std::string& a : args) {
    absl::StrAppend(&out, "$", a.size(), "\r\n", a, "\r\n");
  }
  size_t sent = 0;
  while (sent < out.size()) {
    ssize_t n = send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat(what, ": send failed"));
    }
    pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
    if (poll(&p, 1, MsLeft(deadline)) != 1) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
  }
  std::string in;
  char buf[4096];
  while (true) {
    bool bad = false;
    size_t len = CompleteValue(in, 0, bad);
    if (bad) return absl::InternalError(what + ": malformed reply");
    if (len > 0) break;
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&p, 1, MsLeft(deadline)) != 1) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": timed out"));
    }
    ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      return absl::UnavailableError(absl::StrCat(what, ": connection closed"));
    }
    in.append(buf, static_cast<size_t>(n));
  }
  size_t eol = in.find("\r\n");
  std::string head = in.substr(1, eol - 1);
  switch (in[0]) {
    case '-':
      return absl::InternalError(absl::StrCat(what, ": ", head));
    case '$': {
      int64_t n = 0;
      (void)absl::SimpleAtoi(head, &n);
      if (n < 0) return std::string();
      return in.substr(eol + 2, static_cast<size_t>(n));
    }
    case '*':
      return in;  // Raw; no caller needs arrays parsed.
    default:
      return head;
  }
}

ChaosRedis::ChaosRedis(std::string dir) : dir_(std::move(dir)) {}

ChaosRedis::~ChaosRedis() { Kill(); }

absl::StatusOr<std::string> ChaosRedis::Command(
    const std::vector<std::string>& args, absl::Duration timeout) const {
  return RedisCommand(port_, args, timeout);
}

absl::Status ChaosRedis::Start() {
  if (pid_ > 0) return absl::OkStatus();
  std::string binary = testing::FindRedisServer();
  if (binary.empty()) {
    return absl::NotFoundError("redis-server is not installed");
  }
  if (port_ == 0) port_ = testing::FreeLoopbackPort();
  if (port_ == 0) return absl::InternalError("no free loopback port");
  std::string conf = dir_ + "/redis.conf";
  {
    std::ofstream out(conf);
    out << "port " << port_ << "\n"
        << "bind 127.0.0.1\n"
        << "save \"\"\n"
        << "appendonly no\n"
        << "dir " << dir_ << "\n"
        << "dbfilename dump.rdb\n"
        << "enable-debug-command yes\n"
        << "logfile " << dir_ << "/redis.log\n"
        << "daemonize no\n";
  }
  const pid_t pid = SpawnChild({binary, conf});
  if (pid < 0) return absl::InternalError("fork failed");
  pid_ = pid;
  int64_t deadline = NowNanos() + 10'000'000'000;
  while (true) {
    absl::StatusOr<std::string> pong =
        RedisCommand(port_, {"PING"}, absl::Milliseconds(200));
    if (pong.ok() && *pong == "PONG") return absl::OkStatus();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat(
          "redis-server exited at start; see ", dir_, "/redis.log"));
    }
    if (NowNanos() > deadline) {
      Kill();
      return absl::DeadlineExceededError("redis-server did not come up");
    }
    // Polling a condition with a deadline: the server's start-up.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void ChaosRedis::Kill() {
  testing::KillAndReap(pid_);
  pid_ = -1;
}

}  // namespace setpoint::chaos
