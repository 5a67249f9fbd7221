#include "chaos/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace setpoint::chaos {

pid_t SpawnChild(std::vector<std::string> argv, const std::string& output) {
  if (argv.empty()) return -1;
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (std::string& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  const char* out = output.empty() ? nullptr : output.c_str();
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid != 0) return pid < 0 ? -1 : pid;
  // The child: async-signal-safe calls only.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(1);  // The parent died before the prctl.
  if (out != nullptr) {
    const int fd = open(out, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      if (fd > 2) close(fd);
    }
  }
  execv(args[0], args.data());
  _exit(127);
}

}  // namespace setpoint::chaos
