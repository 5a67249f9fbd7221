#include "setpoint/prometheus/prometheus_metrics.h"

#include <cmath>
#include <limits>
#include <map>
#include <string_view>
#include <utility>

#include "prometheus/text_serializer.h"

namespace setpoint {
namespace {

// Turns MetricWriter calls into families, merging equal series.
class FamilyWriter : public MetricWriter {
 public:
  void Counter(std::string_view name, std::string_view help,
               const MetricLabels& labels, double value) override {
    prometheus::ClientMetric* m =
        Find(name, help, prometheus::MetricType::Counter, labels);
    if (m != nullptr) m->counter.value += value;
  }
  void Gauge(std::string_view name, std::string_view help,
             const MetricLabels& labels, double value) override {
    prometheus::ClientMetric* m =
        Find(name, help, prometheus::MetricType::Gauge, labels);
    if (m != nullptr) m->gauge.value += value;
  }
  void Histogram(std::string_view name, std::string_view help,
                 const MetricLabels& labels,
                 const Histogram::Snapshot& value) override {
    prometheus::ClientMetric* m =
        Find(name, help, prometheus::MetricType::Histogram, labels);
    if (m == nullptr) return;
    auto& h = m->histogram;
    if (h.bucket.empty()) {
      for (double b : value.upper_bounds) h.bucket.push_back({0, b});
      h.bucket.push_back({0, std::numeric_limits<double>::infinity()});
    } else if (h.bucket.size() != value.counts.size()) {
      return;  // Other bounds under the same name: dropped.
    }
    uint64_t cumulative = 0;
    for (size_t i = 0; i < value.counts.size(); ++i) {
      cumulative += value.counts[i];
      h.bucket[i].cumulative_count += cumulative;
    }
    h.sample_count += value.count;
    h.sample_sum += value.sum;
  }

  std::vector<prometheus::MetricFamily> Take() {
    std::vector<prometheus::MetricFamily> out;
    out.reserve(families_.size());
    for (auto& [name, f] : families_) {
      for (auto& [labels, metric] : f.series) {
        f.family.metric.push_back(std::move(metric));
      }
      out.push_back(std::move(f.family));
    }
    return out;
  }

 private:
  struct Family {
    prometheus::MetricFamily family;
    std::map<std::vector<prometheus::ClientMetric::Label>,
             prometheus::ClientMetric>
        series;
  };

  prometheus::ClientMetric* Find(std::string_view name, std::string_view help,
                                 prometheus::MetricType type,
                                 const MetricLabels& labels) {
    auto [it, added] = families_.try_emplace(std::string(name));
    Family& f = it->second;
    if (added) {
      f.family.name = std::string(name);
      f.family.help = std::string(help);
      f.family.type = type;
    } else if (f.family.type != type) {
      return nullptr;
    }
    std::vector<prometheus::ClientMetric::Label> key;
    key.reserve(labels.size());
    for (const auto& [k, v] : labels) key.push_back({k, v});
    auto [sit, fresh] = f.series.try_emplace(key);
    if (fresh) sit->second.label = std::move(key);
    return &sit->second;
  }

  std::map<std::string, Family, std::less<>> families_;
};

}  // namespace

std::vector<prometheus::MetricFamily> CollectPrometheusFamilies(
    const MetricsRegistry& registry) {
  FamilyWriter writer;
  registry.Collect(writer);
  return writer.Take();
}

std::vector<prometheus::MetricFamily> PrometheusCollectable::Collect() const {
  return CollectPrometheusFamilies(*registry_);
}

std::string PrometheusText(const MetricsRegistry& registry) {
  return prometheus::TextSerializer().Serialize(
      CollectPrometheusFamilies(registry));
}

}  // namespace setpoint
