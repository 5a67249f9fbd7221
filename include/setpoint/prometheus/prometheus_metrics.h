// setpoint::prometheus: a MetricsRegistry read by prometheus-cpp.
//
//   setpoint::MetricsRegistry metrics;            // given to the parts
//   // Serve it yourself (setpoint::pod's HTTP listener does this)...
//   std::string text = setpoint::PrometheusText(metrics);
//   // ...or beside your own series, on prometheus-cpp's pull Exposer:
//   auto collectable =
//       std::make_shared<setpoint::PrometheusCollectable>(&metrics);
//   prometheus::Exposer exposer("127.0.0.1:9464");
//   exposer.RegisterCollectable(collectable);
//
// Samples with the same name and labels (two parts that publish the same
// series, for example a part and its rebuilt successor during a handoff)
// are merged: counters, gauges and histograms add up. The first help text
// and type given for a name win; a later sample of another type under that
// name is dropped.
//
// Thread safety: Collect and PrometheusText are thread-safe; the registry
// must outlive the collectable.
#ifndef SETPOINT_PROMETHEUS_PROMETHEUS_METRICS_H_
#define SETPOINT_PROMETHEUS_PROMETHEUS_METRICS_H_

#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "setpoint/base/metrics.h"

namespace setpoint {

class PrometheusCollectable : public prometheus::Collectable {
 public:
  explicit PrometheusCollectable(const MetricsRegistry* registry)
      : registry_(registry) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const MetricsRegistry* registry_;
};

// Every family of `registry`, sorted by name.
std::vector<prometheus::MetricFamily> CollectPrometheusFamilies(
    const MetricsRegistry& registry);

// The registry in Prometheus' text exposition format (version 0.0.4).
std::string PrometheusText(const MetricsRegistry& registry);

// The Content-Type of PrometheusText.
inline constexpr char kPrometheusTextContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

}  // namespace setpoint

#endif  // SETPOINT_PROMETHEUS_PROMETHEUS_METRICS_H_
