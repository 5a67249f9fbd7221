#include "setpoint/testing/redis_server.h"

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace setpoint::testing {

std::string FindRedisServer() {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/usr/sbin"}) {
    std::string path = std::string(dir) + "/redis-server";
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

namespace {

// Sends one inline command over the unix socket and returns the start of
// the reply ("" when nothing answered).
std::string InlineCommand(const std::string& socket_path,
                          const std::string& command) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  std::string reply;
  std::string line = command + "\r\n";
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      write(fd, line.data(), line.size()) ==
          static_cast<ssize_t>(line.size())) {
    char buf[16] = {};
    if (read(fd, buf, sizeof(buf) - 1) > 0) reply = buf;
  }
  close(fd);
  return reply;
}

// True once the socket accepts a connection and answers PING (or asks for
// AUTH).
bool Answers(const std::string& socket_path) {
  std::string reply = InlineCommand(socket_path, "PING");
  return reply.rfind("+PONG", 0) == 0 || reply.rfind("-NOAUTH", 0) == 0;
}

}  // namespace

bool RedisRequired() {
  const char* ci = getenv("CI");
  return ci != nullptr && *ci != '\0';
}

RedisServer::RedisServer(RedisServerOptions options)
    : options_(std::move(options)) {
  char tmpl[] = "/tmp/setpoint-redis-XXXXXX";
  char* dir = mkdtemp(tmpl);
  if (dir != nullptr) dir_ = dir;
  socket_ = dir_ + "/redis.sock";
}

RedisServer::~RedisServer() {
  Stop();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

absl::Status RedisServer::Restart() {
  Stop();
  std::error_code ec;
  std::filesystem::remove(dir_ + "/dump.rdb", ec);
  return Start();
}

absl::Status RedisServer::SaveSnapshot(const std::string& name) {
  bool ok = InlineCommand(socket_, "SAVE").rfind("+OK", 0) == 0;
  if (!ok) return absl::InternalError("redis SAVE failed");
  std::error_code ec;
  std::filesystem::copy_file(dir_ + "/dump.rdb", dir_ + "/" + name,
                             std::filesystem::copy_options::overwrite_existing,
                             ec);
  if (ec) return absl::InternalError("copy snapshot: " + ec.message());
  return absl::OkStatus();
}

absl::Status RedisServer::RestartFrom(const std::string& name) {
  Stop();
  std::error_code ec;
  std::filesystem::copy_file(dir_ + "/" + name, dir_ + "/dump.rdb",
                             std::filesystem::copy_options::overwrite_existing,
                             ec);
  if (ec) return absl::InternalError("restore snapshot: " + ec.message());
  return Start();
}

std::string RedisServer::tcp_address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

absl::Status RedisServer::Start() {
  if (pid_ > 0) return absl::OkStatus();
  std::string binary = FindRedisServer();
  if (binary.empty()) {
    return absl::NotFoundError("redis-server is not installed");
  }
  if (dir_.empty()) return absl::InternalError("no temporary directory");
  if (options_.tcp && port_ == 0) port_ = FreeLoopbackPort();
  std::string conf = dir_ + "/redis.conf";
  {
    std::ofstream out(conf);
    out << "port " << (options_.tcp ? port_ : 0) << "\n"
        << "bind 127.0.0.1\n"
        << "unixsocket " << socket_ << "\n"
        << "unixsocketperm 700\n"
        << "save \"\"\n"
        << "appendonly no\n"
        << "dir " << dir_ << "\n"
        << "logfile " << dir_ << "/redis.log\n"
        << "daemonize no\n";
    if (!options_.requirepass.empty()) {
      out << "requirepass " << options_.requirepass << "\n";
    }
    for (const std::string& user : options_.acl_users) out << user << "\n";
  }
  std::remove(socket_.c_str());
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    execl(binary.c_str(), binary.c_str(), conf.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  pid_ = pid;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!Answers(socket_)) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat(
          "redis-server exited at start; see ", dir_, "/redis.log"));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      Stop();
      return absl::DeadlineExceededError("redis-server did not come up");
    }
    // Polling a condition with a deadline: the server's start-up.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return absl::OkStatus();
}

void KillAndReap(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGCONT);  // A paused process must not keep its signal pending.
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

void RedisServer::Stop() {
  KillAndReap(pid_);
  pid_ = -1;
}

void RedisServer::Pause() {
  if (pid_ > 0) kill(pid_, SIGSTOP);
}

void RedisServer::Resume() {
  if (pid_ > 0) kill(pid_, SIGCONT);
}

}  // namespace setpoint::testing
