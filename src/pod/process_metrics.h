// The standard process_* series of a pod, read from /proc at scrape time:
//
//   process_cpu_seconds_total       user + system CPU time
//   process_resident_memory_bytes   resident set size
//   process_virtual_memory_bytes    virtual memory size
//   process_open_fds                open file descriptors
//   process_max_fds                 the soft limit on them
//   process_threads                 threads of the process
//   process_start_time_seconds      start, in seconds since the Unix epoch
//
//   MetricsCollectorHandle h = AddProcessMetrics(registry);
//
// The parsing is a pure function of the files' text (ParseProcStat) and
// tested on its own; a file that cannot be read leaves its series out.
//
// Thread safety: ParseProcStat is pure; the collector reads /proc on the
// scraping thread.
#ifndef SETPOINT_SRC_POD_PROCESS_METRICS_H_
#define SETPOINT_SRC_POD_PROCESS_METRICS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "setpoint/base/metrics.h"

namespace setpoint {

struct ProcessStat {
  double cpu_seconds = 0;
  double resident_bytes = 0;
  double virtual_bytes = 0;
  double threads = 0;
  double start_time_seconds = 0;  // Since the epoch.
};

// Reads /proc/<pid>/stat text (`stat`) with the system's clock ticks per
// second, page size and boot time (btime of /proc/stat, epoch seconds).
// nullopt for text that is not such a line.
std::optional<ProcessStat> ParseProcStat(absl::string_view stat,
                                         int64_t ticks_per_second,
                                         int64_t page_size,
                                         int64_t boot_time_seconds);

// The btime of /proc/stat's text, or nullopt.
std::optional<int64_t> ParseBootTime(absl::string_view proc_stat);

// The "Max open files" soft limit of /proc/<pid>/limits text, or nullopt
// (also for "unlimited").
std::optional<int64_t> ParseMaxFds(absl::string_view limits);

// Publishes the series above for this process into `registry` until the
// handle goes.
[[nodiscard]] MetricsCollectorHandle AddProcessMetrics(
    MetricsRegistry& registry);

}  // namespace setpoint

#endif  // SETPOINT_SRC_POD_PROCESS_METRICS_H_
