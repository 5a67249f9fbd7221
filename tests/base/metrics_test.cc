#include "setpoint/base/metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "setpoint/testing/metrics_snapshot.h"

namespace setpoint {
namespace {

using ::setpoint::testing::MetricsSnapshot;

TEST(MetricsTest, TheSameNameAndLabelsGiveTheSameCell) {
  MetricsRegistry m;
  Counter& a = m.GetCounter("x_total", "help", {{"k", "1"}});
  Counter& b = m.GetCounter("x_total", "other help", {{"k", "1"}});
  Counter& c = m.GetCounter("x_total", "help", {{"k", "2"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &c);
  a.Increment();
  b.Increment(2);
  c.Increment();
  MetricsSnapshot snap(m);
  EXPECT_EQ(snap.Value("x_total", {{"k", "1"}}), 3);
  EXPECT_EQ(snap.Value("x_total", {{"k", "2"}}), 1);
  EXPECT_EQ(snap.Value("x_total"), 4);  // Labels it includes: all of them.
  EXPECT_EQ(snap.Value("y_total"), -1);
}

TEST(MetricsTest, AnotherTypeUnderANameIsNotWrittenOut) {
  MetricsRegistry m;
  m.GetCounter("same", "a counter").Increment(5);
  Gauge& misuse = m.GetGauge("same", "a gauge");
  misuse.Set(100);
  MetricsSnapshot snap(m);
  EXPECT_EQ(snap.Value("same"), 5);
}

TEST(MetricsTest, HistogramCountsIntoBucketsWithAnInfBucket) {
  Histogram h({0.1, 1, 0.5});  // Sorted by the histogram.
  h.Observe(0.05);
  h.Observe(0.1);  // Upper bounds are inclusive, as in Prometheus.
  h.Observe(0.7);
  h.Observe(30);
  Histogram::Snapshot s = h.Read();
  EXPECT_THAT(s.upper_bounds, ::testing::ElementsAre(0.1, 0.5, 1));
  EXPECT_THAT(s.counts, ::testing::ElementsAre(2, 0, 1, 1));
  EXPECT_EQ(s.count, 4u);
  EXPECT_DOUBLE_EQ(s.sum, 30.85);
}

TEST(MetricsTest, CollectorsRunUntilTheirHandleGoes) {
  MetricsRegistry m;
  int calls = 0;
  {
    MetricsCollectorHandle handle = m.AddCollector([&](MetricWriter& w) {
      ++calls;
      w.Gauge("depth", "queue depth", {{"q", "a"}}, 7);
    });
    MetricsSnapshot snap(m);
    EXPECT_EQ(snap.Value("depth", {{"q", "a"}}), 7);
    MetricsCollectorHandle moved = std::move(handle);
    MetricsSnapshot again(m);
    EXPECT_EQ(again.Value("depth"), 7);
  }
  MetricsSnapshot after(m);
  EXPECT_EQ(after.Value("depth"), -1);
  EXPECT_EQ(calls, 2);
}

TEST(MetricsTest, WithLabelsAppends) {
  EXPECT_EQ(WithLabels({{"a", "1"}}, {{"b", "2"}}),
            (MetricLabels{{"a", "1"}, {"b", "2"}}));
}

}  // namespace
}  // namespace setpoint
