// Child processes for the chaos suite and the multi-process tests: a pod,
// a redis-server, started so that they die with the test. Their output
// goes to a file, not to pipes the test must drain (testing::ChildProcess):
// a chaos run's pods write megabytes while the driver does other things.
//
//   pid_t pid = SpawnChild({SETPOINT_CHAOS_POD, "--pod=a", ...}, dir + "/a.err");
//
// Thread safety: any thread. The test process has threads, so the child
// makes only async-signal-safe calls between fork and exec: everything it
// needs is built before the fork.
#ifndef SETPOINT_TESTS_CHAOS_SPAWN_H_
#define SETPOINT_TESTS_CHAOS_SPAWN_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace setpoint::chaos {

// Starts argv[0] with `argv` as its arguments. The child gets SIGKILL when
// this process dies (PR_SET_PDEATHSIG), and its stdout and stderr are
// appended to `output` (left as they are when `output` is empty). Returns
// the child's pid, or -1 when `argv` is empty or fork failed. An exec that
// fails ends the child with status 127.
pid_t SpawnChild(std::vector<std::string> argv, const std::string& output = "");

}  // namespace setpoint::chaos

#endif  // SETPOINT_TESTS_CHAOS_SPAWN_H_
