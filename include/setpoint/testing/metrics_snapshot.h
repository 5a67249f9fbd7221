// MetricsSnapshot: every sample of a MetricsRegistry at one moment, for
// tests that assert on metrics without a Prometheus adapter.
//
//   setpoint::MetricsRegistry metrics;
//   ...  // parts built with .metrics = &metrics
//   setpoint::testing::MetricsSnapshot snap(metrics);
//   EXPECT_EQ(snap.Value("setpoint_syncer_operations_total",
//                        {{"syncer", "vms"}, {"op", "create"},
//                         {"result", "success"}}), 3);
//
// Samples with the same name and labels add up, as in the Prometheus
// adapter. Thread safety: a value type; build it on any thread.
#ifndef SETPOINT_TESTING_METRICS_SNAPSHOT_H_
#define SETPOINT_TESTING_METRICS_SNAPSHOT_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "setpoint/base/metrics.h"

namespace setpoint::testing {

class MetricsSnapshot final : public MetricWriter {
 public:
  explicit MetricsSnapshot(const MetricsRegistry& registry) {
    registry.Collect(*this);
  }

  // The value of the counter or gauge whose labels include `labels` (all
  // such series added up), or nullopt if none has them.
  std::optional<double> Find(std::string_view name,
                             const MetricLabels& labels = {}) const {
    std::optional<double> sum;
    for (const auto& [key, value] : values_) {
      if (key.first == name && Includes(key.second, labels)) {
        sum = sum.value_or(0) + value;
      }
    }
    return sum;
  }
  // Find(...), or -1 when there is no such series.
  double Value(std::string_view name, const MetricLabels& labels = {}) const {
    return Find(name, labels).value_or(-1);
  }
  // The observation count of the histograms matching as in Find (-1: none).
  double Count(std::string_view name, const MetricLabels& labels = {}) const {
    std::optional<double> sum;
    for (const auto& [key, h] : histograms_) {
      if (key.first == name && Includes(key.second, labels)) {
        sum = sum.value_or(0) + static_cast<double>(h.count);
      }
    }
    return sum.value_or(-1);
  }
  // Every series name seen, once each.
  std::map<std::string, int> Names() const {
    std::map<std::string, int> out;
    for (const auto& [key, v] : values_) ++out[key.first];
    for (const auto& [key, h] : histograms_) ++out[key.first];
    return out;
  }

  void Counter(std::string_view name, std::string_view, const MetricLabels& l,
               double v) override {
    values_[{std::string(name), l}] += v;
  }
  void Gauge(std::string_view name, std::string_view, const MetricLabels& l,
             double v) override {
    values_[{std::string(name), l}] += v;
  }
  void Histogram(std::string_view name, std::string_view, const MetricLabels& l,
                 const ::setpoint::Histogram::Snapshot& h) override {
    auto& into = histograms_[{std::string(name), l}];
    into.count += h.count;
    into.sum += h.sum;
  }

 private:
  static bool Includes(const MetricLabels& have, const MetricLabels& want) {
    for (const auto& w : want) {
      bool found = false;
      for (const auto& h : have) found = found || h == w;
      if (!found) return false;
    }
    return true;
  }
  std::map<std::pair<std::string, MetricLabels>, double> values_;
  std::map<std::pair<std::string, MetricLabels>,
           ::setpoint::Histogram::Snapshot>
      histograms_;
};

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTING_METRICS_SNAPSHOT_H_
