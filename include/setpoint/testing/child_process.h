// ChildProcess: a program run as a real process for tests, with its stdout
// and stderr on pipes that the test reads while it waits for text or for the
// exit. No sleeping: every wait polls the pipes up to a deadline.
//
//   setpoint::testing::ChildProcess pod({"/path/to/pod", "--pod_id=a"});
//   ASSERT_TRUE(pod.AwaitOut("started pod=a\n"));
//   pod.Signal(SIGTERM);
//   EXPECT_EQ(pod.AwaitExit(), 0) << pod.err();
//
// The child starts with no signal blocked. The destructor kills (SIGKILL)
// and reaps a child that is still running.
//
// Thread safety: one owner thread.
#ifndef SETPOINT_TESTING_CHILD_PROCESS_H_
#define SETPOINT_TESTING_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace setpoint::testing {

class ChildProcess {
 public:
  // argv[0] is the program's path.
  explicit ChildProcess(std::vector<std::string> argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // What was read so far.
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  void Signal(int sig);

  // Reads both pipes until stdout (stderr) holds `text` `times` times;
  // false at the end of the output or after `timeout`.
  bool AwaitOut(const std::string& text, int times = 1,
                absl::Duration timeout = absl::Seconds(20));
  bool AwaitErr(const std::string& text, int times = 1,
                absl::Duration timeout = absl::Seconds(20));
  // Reads both pipes until `done()` holds; false at the end of the output
  // (unless done() holds then) or after `timeout`.
  bool ReadUntil(const std::function<bool()>& done,
                 absl::Duration timeout = absl::Seconds(20));
  // True once the process has ended (by itself or by a signal), without
  // reaping it: AwaitExit still returns its exit code.
  bool Ended() const;
  // Reads to the end of both pipes and reaps the process: its exit code, or
  // -1 if it did not end within `timeout` or died of a signal.
  int AwaitExit(absl::Duration timeout = absl::Seconds(20));

  // How many times `text` occurs in `s`.
  static int Count(const std::string& s, const std::string& text);

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::string out_;
  std::string err_;
};

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_CHILD_PROCESS_H_
