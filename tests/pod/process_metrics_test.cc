#include "process_metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/metrics_snapshot.h"

namespace setpoint {
namespace {

// A /proc/<pid>/stat line whose command holds a space and parentheses.
constexpr char kStat[] =
    "4242 (my (pod) x) S 1 4242 4242 0 -1 4194560 500 0 0 0 "
    "250 150 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615 1 1 0 0 "
    "0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";

TEST(ProcessMetricsTest, ParsesTheStatLine) {
  std::optional<ProcessStat> s = ParseProcStat(kStat, 100, 4096, 1'700'000'000);
  ASSERT_TRUE(s.has_value());
  EXPECT_DOUBLE_EQ(s->cpu_seconds, 4.0);  // (250 + 150) / 100.
  EXPECT_DOUBLE_EQ(s->threads, 7);
  EXPECT_DOUBLE_EQ(s->virtual_bytes, 104857600);
  EXPECT_DOUBLE_EQ(s->resident_bytes, 2560.0 * 4096);
  EXPECT_DOUBLE_EQ(s->start_time_seconds, 1'700'000'000 + 123.45);
}

TEST(ProcessMetricsTest, RefusesWhatIsNotAStatLine) {
  EXPECT_FALSE(ParseProcStat("", 100, 4096, 0).has_value());
  EXPECT_FALSE(ParseProcStat("4242 (x) S 1 2", 100, 4096, 0).has_value());
  EXPECT_FALSE(ParseProcStat(kStat, 0, 4096, 0).has_value());
}

TEST(ProcessMetricsTest, ParsesBootTimeAndTheFdLimit) {
  EXPECT_EQ(ParseBootTime("cpu  1 2 3\nbtime 1796181993\nprocesses 9\n"),
            1796181993);
  EXPECT_EQ(ParseBootTime("cpu 1\n"), std::nullopt);
  EXPECT_EQ(ParseMaxFds("Limit                     Soft Limit           Hard "
                        "Limit           Units\nMax open files            "
                        "1024                 524288               files\n"),
            1024);
  EXPECT_EQ(ParseMaxFds("Max open files            unlimited            "
                        "unlimited            files\n"),
            std::nullopt);
}

TEST(ProcessMetricsTest, PublishesThisProcesssSeries) {
  MetricsRegistry metrics;
  MetricsCollectorHandle handle = AddProcessMetrics(metrics);
  testing::MetricsSnapshot snap(metrics);
  EXPECT_GT(snap.Value("process_resident_memory_bytes"), 0);
  EXPECT_GT(snap.Value("process_threads"), 0);
  EXPECT_GT(snap.Value("process_open_fds"), 2);
  EXPECT_GT(snap.Value("process_start_time_seconds"), 1'600'000'000);
}

}  // namespace
}  // namespace setpoint
