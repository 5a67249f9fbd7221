#include "process_metrics.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace setpoint {
namespace {

// A small /proc file, or "" when it cannot be read.
std::string ReadProcFile(const char* path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0 || text.size() > (64 << 10)) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return text;
}

// Entries of /proc/self/fd, but for the one that lists them.
std::optional<int64_t> CountOpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::nullopt;
  int64_t n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;
}

}  // namespace

std::optional<ProcessStat> ParseProcStat(absl::string_view stat,
                                         int64_t ticks_per_second,
                                         int64_t page_size,
                                         int64_t boot_time_seconds) {
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
  // the fields start after the last ')'.
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos || ticks_per_second <= 0) {
    return std::nullopt;
  }
  std::vector<absl::string_view> f =
      absl::StrSplit(absl::StripAsciiWhitespace(stat.substr(close + 1)), ' ',
                     absl::SkipEmpty());
  // f[0] is field 3 (state): field N is f[N - 3].
  auto field = [&](int n, double* out) {
    const size_t i = static_cast<size_t>(n - 3);
    return i < f.size() && absl::SimpleAtod(f[i], out);
  };
  double utime, stime, threads, start_ticks, vsize, rss;
  if (!field(14, &utime) || !field(15, &stime) || !field(20, &threads) ||
      !field(22, &start_ticks) || !field(23, &vsize) || !field(24, &rss)) {
    return std::nullopt;
  }
  const double hz = static_cast<double>(ticks_per_second);
  return ProcessStat{
      .cpu_seconds = (utime + stime) / hz,
      .resident_bytes = rss * static_cast<double>(page_size),
      .virtual_bytes = vsize,
      .threads = threads,
      .start_time_seconds =
          static_cast<double>(boot_time_seconds) + start_ticks / hz,
  };
}

std::optional<int64_t> ParseBootTime(absl::string_view proc_stat) {
  for (absl::string_view line : absl::StrSplit(proc_stat, '\n')) {
    if (absl::ConsumePrefix(&line, "btime ")) {
      int64_t t;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &t)) return t;
    }
  }
  return std::nullopt;
}

std::optional<int64_t> ParseMaxFds(absl::string_view limits) {
  for (absl::string_view line : absl::StrSplit(limits, '\n')) {
    if (!absl::ConsumePrefix(&line, "Max open files")) continue;
    std::vector<absl::string_view> f =
        absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t n;
    if (!f.empty() && absl::SimpleAtoi(f[0], &n)) return n;
  }
  return std::nullopt;
}

MetricsCollectorHandle AddProcessMetrics(MetricsRegistry& registry) {
  const int64_t hz = sysconf(_SC_CLK_TCK);
  const int64_t page = sysconf(_SC_PAGESIZE);
  const std::optional<int64_t> boot = ParseBootTime(ReadProcFile("/proc/stat"));
  return registry.AddCollector([hz, page, boot](MetricWriter& w) {
    const std::optional<ProcessStat> s = ParseProcStat(
        ReadProcFile("/proc/self/stat"), hz, page, boot.value_or(0));
    if (s.has_value()) {
      w.Counter("process_cpu_seconds_total",
                "Total user and system CPU time spent in seconds.", {},
                s->cpu_seconds);
      w.Gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
              {}, s->resident_bytes);
      w.Gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.",
              {}, s->virtual_bytes);
      w.Gauge("process_threads", "Threads of the process.", {}, s->threads);
      if (boot.has_value()) {
        w.Gauge("process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.", {},
                s->start_time_seconds);
      }
    }
    if (std::optional<int64_t> fds = CountOpenFds(); fds.has_value()) {
      w.Gauge("process_open_fds", "Number of open file descriptors.", {},
              static_cast<double>(*fds));
    }
    if (std::optional<int64_t> max =
            ParseMaxFds(ReadProcFile("/proc/self/limits"));
        max.has_value()) {
      w.Gauge("process_max_fds", "Maximum number of open file descriptors.", {},
              static_cast<double>(*max));
    }
  });
}

}  // namespace setpoint
