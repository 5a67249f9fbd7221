#include "setpoint/testing/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "setpoint/testing/redis_server.h"  // KillAndReap

namespace setpoint::testing {
namespace {

void ReadSome(const pollfd& p, int* fd, std::string* into) {
  if (*fd < 0 || p.revents == 0) return;
  char buf[4096];
  ssize_t n = read(*fd, buf, sizeof(buf));
  if (n > 0) {
    into->append(buf, static_cast<size_t>(n));
  } else if (n == 0 || errno != EINTR) {
    close(*fd);
    *fd = -1;
  }
}

}  // namespace

ChildProcess::ChildProcess(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2], err[2];
  if (args.empty() || pipe2(out, O_CLOEXEC) != 0) return;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(out[0]);
    close(out[1]);
    return;
  }
  pid_ = fork();
  if (pid_ == 0) {
    // Async-signal-safe calls only until exec.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(out[1], STDOUT_FILENO);
    dup2(err[1], STDERR_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  out_fd_ = out[0];
  err_fd_ = err[0];
}

ChildProcess::~ChildProcess() {
  if (pid_ > 0) KillAndReap(pid_);
  if (out_fd_ >= 0) close(out_fd_);
  if (err_fd_ >= 0) close(err_fd_);
}

void ChildProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

bool ChildProcess::AwaitOut(const std::string& text, int times,
                            absl::Duration timeout) {
  return ReadUntil([&] { return Count(out_, text) >= times; }, timeout);
}

bool ChildProcess::AwaitErr(const std::string& text, int times,
                            absl::Duration timeout) {
  return ReadUntil([&] { return Count(err_, text) >= times; }, timeout);
}

bool ChildProcess::ReadUntil(const std::function<bool()>& done,
                             absl::Duration timeout) {
  auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
  while (!done()) {
    if (out_fd_ < 0 && err_fd_ < 0) return done();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd fds[2] = {{.fd = out_fd_, .events = POLLIN, .revents = 0},
                     {.fd = err_fd_, .events = POLLIN, .revents = 0}};
    int n = poll(fds, 2, static_cast<int>(left.count()));
    if (n < 0 && errno != EINTR) return false;
    ReadSome(fds[0], &out_fd_, &out_);
    ReadSome(fds[1], &err_fd_, &err_);
  }
  return true;
}

bool ChildProcess::Ended() const {
  if (pid_ <= 0) return true;
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pid_), &info,
                WEXITED | WNOHANG | WNOWAIT) == 0 &&
         info.si_pid == pid_;
}

int ChildProcess::AwaitExit(absl::Duration timeout) {
  ReadUntil([] { return false; }, timeout);
  if (out_fd_ >= 0 || err_fd_ >= 0 || pid_ <= 0) return -1;  // Timed out.
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) return -1;
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int ChildProcess::Count(const std::string& s, const std::string& text) {
  int n = 0;
  for (size_t at = s.find(text); at != std::string::npos;
       at = s.find(text, at + 1)) {
    ++n;
  }
  return n;
}

}  // namespace setpoint::testing
