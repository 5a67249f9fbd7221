#include "setpoint/testing/redis_sentinel_set.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "setpoint/testing/redis_server.h"

namespace setpoint::testing {
namespace {

// Parses one RESP reply from `buf` at `*pos` into its flat text form;
// nullopt when the buffer does not hold all of it yet.
std::optional<std::string> ParseResp(const std::string& buf, size_t* pos) {
  size_t eol = buf.find("\r\n", *pos);
  if (eol == std::string::npos) return std::nullopt;
  char type = buf[*pos];
  std::string line = buf.substr(*pos + 1, eol - *pos - 1);
  size_t next = eol + 2;
  switch (type) {
    case '+':
    case ':':
      *pos = next;
      return line;
    case '-':
      *pos = next;
      return "-" + line;
    case '$': {
      int64_t n = 0;
      if (!absl::SimpleAtoi(line, &n)) return std::string("(bad reply)");
      if (n < 0) {
        *pos = next;
        return std::string("(nil)");
      }
      if (buf.size() < next + n + 2) return std::nullopt;
      *pos = next + n + 2;
      return buf.substr(next, n);
    }
    case '*': {
      int64_t n = 0;
      if (!absl::SimpleAtoi(line, &n)) return std::string("(bad reply)");
      if (n < 0) {
        *pos = next;
        return std::string("(nil)");
      }
      std::vector<std::string> parts;
      size_t at = next;
      for (int64_t i = 0; i < n; ++i) {
        std::optional<std::string> part = ParseResp(buf, &at);
        if (!part.has_value()) return std::nullopt;
        parts.push_back(*part);
      }
      *pos = at;
      return absl::StrJoin(parts, "\n");
    }
    default:
      *pos = buf.size();
      return std::string("(bad reply)");
  }
}

std::string Resp(const std::vector<std::string>& argv) {
  std::string out = absl::StrCat("*", argv.size(), "\r\n");
  for (const std::string& a : argv) {
    absl::StrAppend(&out, "$", a.size(), "\r\n", a, "\r\n");
  }
  return out;
}

bool Exited(pid_t pid) {
  int status = 0;
  return waitpid(pid, &status, WNOHANG) == pid;
}

// The "name=...,status=ok,address=...,slaves=N,sentinels=M" line of a
// sentinel's INFO sentinel for `name`, or "".
std::string MasterLine(const std::string& info, const std::string& name) {
  for (absl::string_view line : absl::StrSplit(info, absl::ByAnyChar("\r\n"))) {
    if (absl::StrContains(line, absl::StrCat("name=", name, ","))) {
      return std::string(line);
    }
  }
  return "";
}

}  // namespace

std::string FindRedisSentinel() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    std::string path = std::string(dir) + "/redis-sentinel";
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

absl::StatusOr<std::string> RedisCommandAt(int port,
                                           const std::vector<std::string>& argv,
                                           const std::string& password,
                                           absl::Duration timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  auto fail = [&](const char* why) {
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("redis command 127.0.0.1:", port, ": ", why));
  };
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail("connect refused");
  }
  std::string out;
  if (!password.empty()) out = Resp({"AUTH", password});
  out += Resp(argv);
  if (send(fd, out.data(), out.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(out.size())) {
    return fail("send failed");
  }
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  std::string buf;
  size_t pos = 0;
  int replies_left = password.empty() ? 1 : 2;
  std::string reply;
  while (replies_left > 0) {
    std::optional<std::string> r = ParseResp(buf, &pos);
    if (r.has_value()) {
      if (--replies_left == 0) reply = *r;
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return fail("no reply in time");
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) {
      return fail("no reply in time");
    }
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) return fail("connection closed");
    buf.append(chunk, static_cast<size_t>(n));
  }
  close(fd);
  return reply;
}

RedisSentinelSet::RedisSentinelSet(RedisSentinelSetOptions options)
    : options_(std::move(options)) {
  char tmpl[] = "/tmp/setpoint-sentinel-XXXXXX";
  char* dir = mkdtemp(tmpl);
  if (dir != nullptr) dir_ = dir;
}

RedisSentinelSet::~RedisSentinelSet() {
  for (Process& p : sentinels_) KillAndReap(p.pid);
  for (Process& p : servers_) KillAndReap(p.pid);
  std::error_code ec;
  if (!dir_.empty() && !options_.keep_dir) {
    std::filesystem::remove_all(dir_, ec);
  }
}

std::string RedisSentinelSet::Address(const Process& p) const {
  return absl::StrCat("127.0.0.1:", p.port);
}

std::vector<std::string> RedisSentinelSet::sentinel_addresses() const {
  std::vector<std::string> out;
  for (const Process& p : sentinels_) out.push_back(Address(p));
  return out;
}

std::vector<std::string> RedisSentinelSet::server_addresses() const {
  std::vector<std::string> out;
  for (const Process& p : servers_) out.push_back(Address(p));
  return out;
}

std::string RedisSentinelSet::master_address() const {
  return servers_.empty() ? "" : Address(servers_[master_]);
}

absl::Status RedisSentinelSet::StartProcess(const std::string& binary,
                                            Process& p,
                                            const std::string& config,
                                            const char* what) {
  std::string conf = p.dir + "/redis.conf";
  {
    std::ofstream out(conf);
    out << config;
  }
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    execl(binary.c_str(), binary.c_str(), conf.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  p.pid = pid;
  const std::string& password = std::string(what) == "redis-sentinel"
                                    ? options_.sentinel_password
                                    : options_.requirepass;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    absl::StatusOr<std::string> pong =
        RedisCommandAt(p.port, {"PING"}, password, absl::Milliseconds(500));
    if (pong.ok() && *pong == "PONG") return absl::OkStatus();
    if (Exited(p.pid)) {
      p.pid = -1;
      return absl::InternalError(
          absl::StrCat(what, " exited at start; see ", p.dir, "/redis.log"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not come up; see ", p.dir, "/redis.log"));
    }
    // Polling a condition with a deadline: the process's start-up.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

std::string RedisSentinelSet::ServerConfig(const Process& p,
                                           int master_port) const {
  std::string conf = absl::StrCat(
      "port ", p.port, "\nbind 127.0.0.1\nsave \"\"\nappendonly no\n", "dir ",
      p.dir, "\nlogfile ", p.dir, "/redis.log\ndaemonize no\n",
      "repl-diskless-sync yes\nrepl-diskless-sync-delay 0\n",
      "repl-diskless-load swapdb\n");
  if (!options_.requirepass.empty()) {
    absl::StrAppend(&conf, "requirepass ", options_.requirepass,
                    "\nmasterauth ", options_.requirepass, "\n");
  }
  if (options_.min_replicas_to_write > 0) {
    absl::StrAppend(&conf, "min-replicas-to-write ",
                    options_.min_replicas_to_write,
                    "\nmin-replicas-max-lag 10\n");
  }
  if (master_port != 0) {
    absl::StrAppend(&conf, "replicaof 127.0.0.1 ", master_port, "\n");
  }
  return conf;
}

absl::Status RedisSentinelSet::RestartAsReplica(const std::string& address,
                                                absl::Duration timeout) {
  Process* p = nullptr;
  for (Process& s : servers_) {
    if (Address(s) == address && s.pid <= 0) p = &s;
  }
  if (p == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("restart ", address, ": not a killed server of the set"));
  }
  if (absl::Status s = AwaitAgreedMaster(timeout).status(); !s.ok()) return s;
  const int master_port = servers_[master_].port;
  if (absl::Status s = StartProcess(
          FindRedisServer(), *p, ServerConfig(*p, master_port), "redis-server");
      !s.ok()) {
    return s;
  }
  const std::string online =
      absl::StrCat("ip=127.0.0.1,port=", p->port, ",state=online");
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  std::string last;
  while (true) {
    absl::StatusOr<std::string> info = RedisCommandAt(
        master_port, {"INFO", "replication"}, options_.requirepass);
    last = info.ok() ? *info : info.status().ToString();
    if (absl::StrContains(last, online)) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "restart ", address, ": not an online replica of ", master_address(),
          " within ", absl::FormatDuration(timeout), "; see ", p->dir));
    }
    // Polling a condition with a deadline: the replica's first sync.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::Status RedisSentinelSet::Start() {
  std::string server = FindRedisServer();
  if (server.empty())
    return absl::NotFoundError("redis-server is not installed");
  std::string sentinel = FindRedisSentinel();
  if (sentinel.empty()) {
    return absl::NotFoundError("redis-sentinel is not installed");
  }
  if (dir_.empty()) return absl::InternalError("no temporary directory");
  if (!servers_.empty()) return absl::OkStatus();
  const std::string& name = options_.master_name;
  std::set<int> taken;  // Six ports picked before any binds: all distinct.
  auto make = [&](const std::string& tag) {
    Process p;
    do {
      p.port = FreeLoopbackPort();
    } while (p.port != 0 && !taken.insert(p.port).second);
    p.dir = absl::StrCat(dir_, "/", tag);
    std::filesystem::create_directories(p.dir);
    return p;
  };
  for (int i = 0; i <= options_.replicas; ++i) {
    servers_.push_back(make(absl::StrCat("redis-", i)));
  }
  for (int i = 0; i < options_.sentinels; ++i) {
    sentinels_.push_back(make(absl::StrCat("sentinel-", i)));
  }
  const int master_port = servers_[0].port;
  for (size_t i = 0; i < servers_.size(); ++i) {
    Process& p = servers_[i];
    std::string conf = ServerConfig(p, i == 0 ? 0 : master_port);
    if (absl::Status s = StartProcess(server, p, conf, "redis-server");
        !s.ok()) {
      return s;
    }
  }
  for (Process& p : sentinels_) {
    std::string conf =
        absl::StrCat("port ", p.port, "\nbind 127.0.0.1\ndir ", p.dir,
                     "\nlogfile ", p.dir, "/redis.log\ndaemonize no\n",
                     "sentinel monitor ", name, " 127.0.0.1 ", master_port, " ",
                     options_.quorum, "\n", "sentinel down-after-milliseconds ",
                     name, " ", absl::ToInt64Milliseconds(options_.down_after),
                     "\n", "sentinel failover-timeout ", name, " ",
                     absl::ToInt64Milliseconds(options_.failover_timeout), "\n",
                     "sentinel parallel-syncs ", name, " 1\n");
    if (!options_.requirepass.empty()) {
      absl::StrAppend(&conf, "sentinel auth-pass ", name, " ",
                      options_.requirepass, "\n");
    }
    if (!options_.sentinel_password.empty()) {
      absl::StrAppend(&conf, "requirepass ", options_.sentinel_password,
                      "\nsentinel sentinel-pass ", options_.sentinel_password,
                      "\n");
    }
    if (absl::Status s = StartProcess(sentinel, p, conf, "redis-sentinel");
        !s.ok()) {
      return s;
    }
  }
  // Each sentinel learns the replicas from the master's INFO and the other
  // sentinels from hello messages on the master: wait for both.
  const std::string want = absl::StrCat(
      "status=ok,address=127.0.0.1:", master_port,
      ",slaves=", options_.replicas, ",sentinels=", options_.sentinels);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string last;
  while (true) {
    bool all = true;
    for (const Process& p : sentinels_) {
      absl::StatusOr<std::string> info = RedisCommandAt(
          p.port, {"INFO", "sentinel"}, options_.sentinel_password);
      last = info.ok() ? MasterLine(*info, name) : info.status().ToString();
      if (!absl::StrContains(last, want)) {
        all = false;
        break;
      }
    }
    if (all) return absl::OkStatus();
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("sentinels did not see the set within 60 s (want ", want,
                       "; last: ", last, "); see ", dir_));
    }
    // Polling a condition with a deadline: sentinel discovery.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string RedisSentinelSet::KillMaster() {
  Process& p = servers_[master_];
  KillAndReap(p.pid);
  p.pid = -1;
  return Address(p);
}

void RedisSentinelSet::KillSentinel(int i) {
  KillAndReap(sentinels_[i].pid);
  sentinels_[i].pid = -1;
}

absl::StatusOr<std::string> RedisSentinelSet::AwaitFailover(
    const std::string& old_master, absl::Duration timeout) {
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(timeout);
  std::string last;
  while (true) {
    std::string agreed;
    bool all = true;
    for (const Process& p : sentinels_) {
      if (p.pid <= 0) continue;
      absl::StatusOr<std::string> addr = RedisCommandAt(
          p.port, {"SENTINEL", "get-master-addr-by-name", options_.master_name},
          options_.sentinel_password);
      std::string a = addr.ok() ? absl::StrReplaceAll(*addr, {{"\n", ":"}})
                                : addr.status().ToString();
      last = a;
      if (!addr.ok() || a == old_master || (!agreed.empty() && a != agreed)) {
        all = false;
        break;
      }
      agreed = a;
    }
    if (all && !agreed.empty()) {
      for (size_t i = 0; i < servers_.size(); ++i) {
        if (Address(servers_[i]) != agreed) continue;
        absl::StatusOr<std::string> role =
            RedisCommandAt(servers_[i].port, {"ROLE"}, options_.requirepass);
        if (role.ok() && absl::StartsWith(*role, "master\n")) {
          master_ = static_cast<int>(i);
          return agreed;
        }
        last = absl::StrCat(
            agreed, " ROLE: ", role.ok() ? *role : role.status().ToString());
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no failover from ", old_master, " within ",
          absl::FormatDuration(timeout), " (last: ", last, "); see ", dir_));
    }
    // Polling a condition with a deadline: the sentinels' failover.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace setpoint::testing
