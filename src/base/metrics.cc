#include "setpoint/base/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace setpoint {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_([&] {
        std::sort(upper_bounds.begin(), upper_bounds.end());
        upper_bounds.erase(
            std::unique(upper_bounds.begin(), upper_bounds.end()),
            upper_bounds.end());
        return upper_bounds;
      }()),
      counts_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  for (size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::Observe(double v) {
  size_t i = static_cast<size_t>(
      std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.upper_bounds = bounds_;
  s.counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    s.counts[i] = counts_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

std::vector<double> Histogram::DurationBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

std::vector<double> Histogram::FastDurationBuckets() {
  return {0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
          0.005,   0.01,     0.025,   0.05,   0.1,     0.25,   0.5,   1};
}

struct MetricsRegistry::Cell {
  std::string name;
  std::string help;
  MetricLabels labels;
  // Exactly one is set.
  std::unique_ptr<class Counter> counter;
  std::unique_ptr<class Gauge> gauge;
  std::unique_ptr<class Histogram> histogram;
};

MetricsCollectorHandle& MetricsCollectorHandle::operator=(
    MetricsCollectorHandle&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = std::exchange(other.registry_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

void MetricsCollectorHandle::Reset() {
  if (registry_ == nullptr) return;
  std::exchange(registry_, nullptr)->RemoveCollector(id_);
}

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

namespace {

std::string CellKey(std::string_view name, const MetricLabels& labels) {
  std::string key(name);
  for (const auto& [k, v] : labels) {
    key.push_back('\0');
    absl::StrAppend(&key, k, "=", v);
  }
  return key;
}

}  // namespace

std::unique_ptr<MetricsRegistry::Cell> MetricsRegistry::NewCell(
    std::string_view name, std::string_view help, const MetricLabels& labels) {
  auto cell = std::make_unique<Cell>();
  cell->name = std::string(name);
  cell->help = std::string(help);
  cell->labels = labels;
  return cell;
}

template <class T, class... Args>
T& MetricsRegistry::GetCell(std::unique_ptr<T> Cell::*field,
                            std::string_view name, std::string_view help,
                            const MetricLabels& labels, Args&&... args) {
  MutexLock l(&mu_);
  auto [it, added] = cells_.try_emplace(CellKey(name, labels));
  Cell& cell = *(added ? it->second = NewCell(name, help, labels) : it->second);
  if (added) {
    cell.*field = std::make_unique<T>(std::forward<Args>(args)...);
    order_.push_back(&cell);
  }
  if (cell.*field != nullptr) return *(cell.*field);
  // Another type under this name: a cell of its own that is never written
  // out, so the misuse cannot corrupt the other series.
  orphans_.push_back(std::make_shared<T>(std::forward<Args>(args)...));
  return *static_cast<T*>(orphans_.back().get());
}

class Counter& MetricsRegistry::GetCounter(std::string_view name,
                                           std::string_view help,
                                           const MetricLabels& labels) {
  return GetCell(&Cell::counter, name, help, labels);
}

class Gauge& MetricsRegistry::GetGauge(std::string_view name,
                                       std::string_view help,
                                       const MetricLabels& labels) {
  return GetCell(&Cell::gauge, name, help, labels);
}

class Histogram& MetricsRegistry::GetHistogram(
    std::string_view name, std::string_view help, const MetricLabels& labels,
    std::vector<double> upper_bounds) {
  return GetCell(&Cell::histogram, name, help, labels, std::move(upper_bounds));
}

MetricsCollectorHandle MetricsRegistry::AddCollector(Collector collector) {
  MutexLock l(&mu_);
  int64_t id = next_id_++;
  collectors_.emplace_back(id, std::move(collector));
  return MetricsCollectorHandle(this, id);
}

void MetricsRegistry::RemoveCollector(int64_t id) {
  Collector dead;
  {
    MutexLock l(&mu_);
    auto it = std::find_if(collectors_.begin(), collectors_.end(),
                           [&](const auto& c) { return c.first == id; });
    if (it == collectors_.end()) return;
    dead = std::move(it->second);
    collectors_.erase(it);
  }
  // `dead` (and what it captured) is destroyed here, without the lock.
}

void MetricsRegistry::Collect(MetricWriter& writer) const {
  MutexLock l(&mu_);
  for (const Cell* cell : order_) {
    if (cell->counter != nullptr) {
      writer.Counter(cell->name, cell->help, cell->labels,
                     cell->counter->Value());
    } else if (cell->gauge != nullptr) {
      writer.Gauge(cell->name, cell->help, cell->labels, cell->gauge->Value());
    } else {
      writer.Histogram(cell->name, cell->help, cell->labels,
                       cell->histogram->Read());
    }
  }
  for (const auto& [id, collector] : collectors_) collector(writer);
}

MetricLabels WithLabels(const MetricLabels& base, MetricLabels more) {
  MetricLabels out = base;
  for (auto& l : more) out.push_back(std::move(l));
  return out;
}

}  // namespace setpoint
