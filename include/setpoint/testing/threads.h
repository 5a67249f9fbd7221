// ThreadsNamed: how many threads of this process carry a name now (from
// /proc/self/task), for tests that check which threads a piece starts:
//
//   EXPECT_EQ(setpoint::testing::ThreadsNamed("sp-runner"), 0);
//
// A thread that was joined may still be listed for a moment; poll with
// AwaitCondition when one just ended. Thread-safe.
#ifndef SETPOINT_TESTING_THREADS_H_
#define SETPOINT_TESTING_THREADS_H_

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace setpoint::testing {

inline int ThreadsNamed(std::string_view name) {
  int n = 0;
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) ++n;
  }
  return n;
}

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_THREADS_H_
