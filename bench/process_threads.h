// ProcessThreads: how many threads this process has now, for the benchmarks
// that count a pod's threads.
//
// Thread safety: any thread.
#ifndef SETPOINT_BENCH_PROCESS_THREADS_H_
#define SETPOINT_BENCH_PROCESS_THREADS_H_

#include <dirent.h>

#include <cstdint>

namespace setpoint::bench {

// The entries of /proc/self/task; 0 where it cannot be read.
inline int64_t ProcessThreads() {
  int64_t n = 0;
  if (DIR* dir = opendir("/proc/self/task")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++n;
    }
    closedir(dir);
  }
  return n;
}

}  // namespace setpoint::bench

#endif  // SETPOINT_BENCH_PROCESS_THREADS_H_
