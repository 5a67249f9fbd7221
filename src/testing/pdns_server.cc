#include "setpoint/testing/pdns_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace setpoint::testing {
namespace {

constexpr char kSchema[] =
    "/usr/share/pdns-backend-sqlite3/schema/schema.sqlite3.sql";
constexpr char kBackend[] =
    "/usr/lib/x86_64-linux-gnu/pdns/libgsqlite3backend.so";

std::string FindProgram(const char* name) {
  for (const char* dir :
       {"/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin"}) {
    std::string path = absl::StrCat(dir, "/", name);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// The directory holding the gsqlite3 backend module, or "" if none.
std::string FindBackendDir() {
  if (access(kBackend, R_OK) == 0) {
    return std::filesystem::path(kBackend).parent_path().string();
  }
  std::error_code ec;
  for (const char* lib : {"/usr/lib", "/usr/lib64"}) {
    for (auto it = std::filesystem::recursive_directory_iterator(lib, ec);
         !ec && it != std::filesystem::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->path().filename() == "libgsqlite3backend.so") {
        return it->path().parent_path().string();
      }
    }
  }
  return "";
}

// Runs argv, stdin from `in` (a file path), output to `log`; its exit code.
int Run(const std::vector<std::string>& argv, const std::string& in,
        const std::string& log) {
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd_in = open(in.c_str(), O_RDONLY);
    int fd_out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd_in < 0 || fd_out < 0) _exit(126);
    dup2(fd_in, 0);
    dup2(fd_out, 1);
    dup2(fd_out, 2);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// One HTTP/1.1 request with "Connection: close", the whole answer read
// until the server closes (at most `timeout`).
absl::StatusOr<PdnsServer::Response> HttpRequest(
    int port, const std::string& request, std::chrono::milliseconds timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError("socket failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  // A connect bounded by the deadline: a listener whose queue is full
  // drops the handshake, and a blocking connect would retry for minutes.
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    if (err == EINPROGRESS) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      socklen_t len = sizeof(err);
      if (poll(&p, 1, static_cast<int>(std::max<int64_t>(1, left.count()))) !=
          1) {
        err = ETIMEDOUT;
      } else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
    }
    if (err != 0) {
      close(fd);
      return absl::UnavailableError(absl::StrCat(
          "PowerDNS API on port ", port, ": ",
          err == ETIMEDOUT ? "connect timed out" : "connection refused"));
    }
  }
  fcntl(fd, F_SETFL, flags);  // Connected: the rest blocks, polled below.
  size_t sent = 0;
  while (sent < request.size()) {
    ssize_t n =
        send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError("PowerDNS API: send failed");
    }
    sent += static_cast<size_t>(n);
  }
  std::string answer;
  char buf[65536];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      close(fd);
      return absl::DeadlineExceededError("PowerDNS API: no whole answer");
    }
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      close(fd);
      return absl::UnavailableError("PowerDNS API: read failed");
    }
    if (n == 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  PdnsServer::Response r;
  size_t sp = answer.find(' ');
  size_t head_end = answer.find("\r\n\r\n");
  if (sp == std::string::npos || head_end == std::string::npos ||
      !absl::SimpleAtoi(answer.substr(sp + 1, 3), &r.status)) {
    return absl::InternalError("PowerDNS API: not an HTTP answer");
  }
  std::string head = answer.substr(0, head_end);
  r.body = answer.substr(head_end + 4);
  if (head.find("Transfer-Encoding: chunked") != std::string::npos ||
      head.find("transfer-encoding: chunked") != std::string::npos) {
    std::string body;
    size_t at = 0;
    while (at < r.body.size()) {
      size_t eol = r.body.find("\r\n", at);
      if (eol == std::string::npos) break;
      size_t len = std::stoul(r.body.substr(at, eol - at), nullptr, 16);
      if (len == 0) break;
      body.append(r.body, eol + 2, len);
      at = eol + 2 + len + 2;
    }
    r.body = std::move(body);
  }
  return r;
}

}  // namespace

std::string FindPdnsServer() { return FindProgram("pdns_server"); }

PdnsServer::PdnsServer() {
  char tmpl[] = "/tmp/setpoint-pdns-XXXXXX";
  char* dir = mkdtemp(tmpl);
  if (dir != nullptr) dir_ = dir;
}

PdnsServer::~PdnsServer() {
  Stop();
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string PdnsServer::api_url() const {
  return absl::StrCat("http://127.0.0.1:", api_port_);
}

absl::Status PdnsServer::MakeDatabase() {
  std::string sqlite = FindProgram("sqlite3");
  if (sqlite.empty()) return absl::NotFoundError("sqlite3 is not installed");
  if (access(kSchema, R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "pdns-backend-sqlite3 is not installed (no ", kSchema, ")"));
  }
  int rc = Run({sqlite, dir_ + "/pdns.sqlite3"}, kSchema, dir_ + "/sqlite.log");
  if (rc != 0) {
    return absl::InternalError(
        absl::StrCat("sqlite3 could not create the database (exit ", rc,
                     "); see ", dir_, "/sqlite.log"));
  }
  database_made_ = true;
  return absl::OkStatus();
}

absl::Status PdnsServer::Start() {
  if (pid_ > 0) return absl::OkStatus();
  std::string binary = FindPdnsServer();
  if (binary.empty())
    return absl::NotFoundError("pdns_server is not installed");
  std::string modules = FindBackendDir();
  if (modules.empty()) {
    return absl::NotFoundError(
        "pdns-backend-sqlite3 is not installed (no gsqlite3 module)");
  }
  if (dir_.empty()) return absl::InternalError("no temporary directory");
  if (!database_made_) {
    if (absl::Status s = MakeDatabase(); !s.ok()) return s;
  }
  if (api_port_ == 0) api_port_ = FreeLoopbackPort();
  if (dns_port_ == 0) dns_port_ = FreeLoopbackPort();
  {
    std::ofstream out(dir_ + "/pdns.conf");
    out << "launch=gsqlite3\n"
        << "gsqlite3-database=" << dir_ << "/pdns.sqlite3\n"
        << "module-dir=" << modules << "\n"
        << "local-address=127.0.0.1\n"
        << "local-port=" << dns_port_ << "\n"
        << "api=yes\n"
        << "api-key=" << api_key_ << "\n"
        << "webserver=yes\n"
        << "webserver-address=127.0.0.1\n"
        << "webserver-port=" << api_port_ << "\n"
        << "webserver-allow-from=127.0.0.0/8\n"
        << "socket-dir=" << dir_ << "\n"
        << "guardian=no\n"
        << "daemon=no\n"
        << "disable-syslog=yes\n"
        // No security poll: it is a DNS query to the internet at start-up,
        // which a test machine without a network answers late or never.
        << "security-poll-suffix=\n"
        << "loglevel=4\n";
  }
  std::string log = log_path();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::string config_dir = "--config-dir=" + dir_;
    execl(binary.c_str(), binary.c_str(), config_dir.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  pid_ = pid;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    auto r = Request("GET", "/api/v1/servers/localhost");
    if (r.ok() && r->status == 200) return absl::OkStatus();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(
          absl::StrCat("pdns_server exited at start; see ", log));
    }
    if (std::chrono::steady_clock::now() > deadline) {
      Stop();
      return absl::DeadlineExceededError(
          absl::StrCat("pdns_server's API did not answer in 20 s; see ", log));
    }
    // Polling a condition with a deadline: the server's start-up.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void PdnsServer::Stop() {
  KillAndReap(pid_);
  pid_ = -1;
}

absl::StatusOr<PdnsServer::Response> PdnsServer::Request(
    const std::string& method, const std::string& path,
    const std::string& body) {
  std::string request =
      absl::StrCat(method, " ", path,
                   " HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: ", api_key_,
                   "\r\nConnection: close\r\n");
  if (!body.empty() || method == "POST" || method == "PATCH") {
    absl::StrAppend(&request, "Content-Type: application/json\r\n",
                    "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&request, "\r\n", body);
  return HttpRequest(api_port_, request, std::chrono::seconds(10));
}

absl::Status PdnsServer::CreateZone(const std::string& zone) {
  std::string body = absl::StrCat(
      R"({"name":")", zone, R"(","kind":"Native","soa_edit_api":"DEFAULT",)",
      R"("nameservers":["ns1.)", zone, R"("]})");
  auto r = Request("POST", "/api/v1/servers/localhost/zones", body);
  if (!r.ok()) return r.status();
  if (r->status != 201) {
    return absl::InternalError(absl::StrCat("creating zone ", zone, ": HTTP ",
                                            r->status, " ", r->body));
  }
  return absl::OkStatus();
}

}  // namespace setpoint::testing
