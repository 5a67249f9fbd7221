// Metrics: the seam between setpoint's parts and a metrics system. Parts
// publish counters, gauges and histograms by name and labels into a
// MetricsRegistry; an adapter (setpoint::prometheus, or your own
// MetricWriter) reads them at scrape time. No registry (nullptr, the default
// everywhere) costs nothing: the parts publish nothing.
//
//   setpoint::MetricsRegistry metrics;
//   setpoint::Counter& sent = metrics.GetCounter(
//       "myapp_mails_sent_total", "Mails sent.", {{"queue", "urgent"}});
//   sent.Increment();
//   setpoint::Histogram& took = metrics.GetHistogram(
//       "myapp_send_seconds", "Time to send a mail.", {},
//       setpoint::Histogram::DurationBuckets());
//   took.Observe(0.012);
//   auto handle = metrics.AddCollector([&](setpoint::MetricWriter& w) {
//     w.Gauge("myapp_queue_depth", "Mails waiting.", {}, queue.size());
//   });
//
// Two ways to publish:
//   - Cells (Counter, Gauge, Histogram) owned by the registry: get one once
//     (GetCounter...), update it from any thread with relaxed atomics. The
//     same name and labels give the same cell, so a part rebuilt after a
//     failure keeps counting where the old one stopped.
//   - Collectors: a function called at scrape time that writes the current
//     values of state the part already keeps (queue depth, keys by state).
//     A collector must be quick and must not block: it runs while the
//     registry's lock is held.
// Names follow Prometheus: [a-zA-Z_:][a-zA-Z0-9_:]*, counters end in
// _total, durations are in seconds; docs/operations.md lists setpoint's.
//
// Thread safety: MetricsRegistry and the cells are thread-safe.
// MetricsCollectorHandle belongs to its owner; destroying it waits until the
// collector is not running and will not run again.
#ifndef SETPOINT_BASE_METRICS_H_
#define SETPOINT_BASE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/node_hash_map.h"
#include "absl/time/time.h"
#include "setpoint/base/mutex.h"

namespace setpoint {

// Label names and values, in the order given.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// A count that only grows. Thread-safe.
class Counter {
 public:
  void Increment(double by = 1) {
    value_.fetch_add(by, std::memory_order_relaxed);
  }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down. Thread-safe.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double by) { value_.fetch_add(by, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Counts observations into fixed buckets. Observe is lock-free.
class Histogram {
 public:
  // `upper_bounds` ascending; a +Inf bucket is implied.
  explicit Histogram(std::vector<double> upper_bounds);

  void Observe(double v);
  void ObserveDuration(absl::Duration d) { Observe(absl::ToDoubleSeconds(d)); }

  struct Snapshot {
    std::vector<double> upper_bounds;  // Without +Inf.
    // Observations per bucket (not cumulative), one more than bounds: the
    // last is the +Inf bucket.
    std::vector<uint64_t> counts;
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

  // 100 us .. 60 s, for durations in seconds.
  static std::vector<double> DurationBuckets();
  // 10 us .. 1 s, for the runner's latencies.
  static std::vector<double> FastDurationBuckets();

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<double> sum_{0};
};

// Where a scrape writes samples. The registry calls it for every cell and
// collector; an adapter turns the calls into its own format. Called from
// the scraping thread only.
class MetricWriter {
 public:
  virtual ~MetricWriter() = default;
  virtual void Counter(std::string_view name, std::string_view help,
                       const MetricLabels& labels, double value) = 0;
  virtual void Gauge(std::string_view name, std::string_view help,
                     const MetricLabels& labels, double value) = 0;
  virtual void Histogram(std::string_view name, std::string_view help,
                         const MetricLabels& labels,
                         const Histogram::Snapshot& value) = 0;
};

class MetricsRegistry;

// Removes its collector when destroyed or reset. Move-only.
class MetricsCollectorHandle {
 public:
  MetricsCollectorHandle() = default;
  MetricsCollectorHandle(MetricsCollectorHandle&& other) noexcept
      : registry_(std::exchange(other.registry_, nullptr)), id_(other.id_) {}
  MetricsCollectorHandle& operator=(MetricsCollectorHandle&& other) noexcept;
  ~MetricsCollectorHandle() { Reset(); }
  // Waits until the collector is not running; it never runs again.
  void Reset();

 private:
  friend class MetricsRegistry;
  MetricsCollectorHandle(MetricsRegistry* registry, int64_t id)
      : registry_(registry), id_(id) {}
  MetricsRegistry* registry_ = nullptr;
  int64_t id_ = 0;
};

class MetricsRegistry {
 public:
  using Collector = std::function<void(MetricWriter&)>;

  MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;
  // Collectors must have been removed (their handles destroyed) first.
  ~MetricsRegistry();

  // The cell with this name and labels, created on first use; it lives as
  // long as the registry. Asking for a name with another type (or another
  // histogram's bounds) returns the existing cell's kind unchanged: use one
  // name for one thing.
  class Counter& GetCounter(std::string_view name, std::string_view help,
                            const MetricLabels& labels = {});
  class Gauge& GetGauge(std::string_view name, std::string_view help,
                        const MetricLabels& labels = {});
  class Histogram& GetHistogram(std::string_view name, std::string_view help,
                                const MetricLabels& labels,
                                std::vector<double> upper_bounds);

  // `collector` runs on every Collect until the handle goes.
  [[nodiscard]] MetricsCollectorHandle AddCollector(Collector collector);

  // Writes every cell, then runs every collector, in the order added.
  void Collect(MetricWriter& writer) const;

 private:
  friend class MetricsCollectorHandle;
  struct Cell;
  static std::unique_ptr<Cell> NewCell(std::string_view name,
                                       std::string_view help,
                                       const MetricLabels& labels);
  void RemoveCollector(int64_t id);
  // The cell of `field`'s type for name and labels, made with `args`.
  template <class T, class... Args>
  T& GetCell(std::unique_ptr<T> Cell::*field, std::string_view name,
             std::string_view help, const MetricLabels& labels, Args&&... args)
      ABSL_LOCKS_EXCLUDED(mu_);

  mutable Mutex mu_;
  // Key: name + '\0' + labels.
  absl::node_hash_map<std::string, std::unique_ptr<Cell>> cells_
      ABSL_GUARDED_BY(mu_);
  std::vector<const Cell*> order_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<int64_t, Collector>> collectors_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // Cells handed out for a name of another type (never written out).
  std::vector<std::shared_ptr<void>> orphans_ ABSL_GUARDED_BY(mu_);
};

// Labels `base` followed by `more`.
MetricLabels WithLabels(const MetricLabels& base, MetricLabels more);

}  // namespace setpoint

#endif  // SETPOINT_BASE_METRICS_H_
