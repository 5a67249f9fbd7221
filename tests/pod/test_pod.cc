// test_pod: the pod program pod_main_test runs as a real process. PodMain
// with one kind, "work", whose nodes wait for their context. Writes one
// line per event to stdout (each one write(), so the test can wait for it):
//   created node=<id> updaters=<pool> threads=<n>
//                                 the factory; the pod's updater pool
//                                 ("none", or its address and size)
//   started pod=<id>              on_started: the manager started
//   range node=<id> <shards>      UpdateShardRange with a non-empty range
//                                 ("[b,e)", or "[b,e)+[b,e)..." for runs)
//   slow update node=<id>         --slow_stop=true: UpdateShardRange with the
//                                 empty range (the graceful stop), which then
//                                 blocks for a minute, so a second signal
//                                 lands during the stop
// --fail_factory=true: the factory returns null (the manager cannot start).
// --series=N: N more gauges in the pod's metrics (a large /metrics).
//
// Uses the current Node interface: UpdateShardRange returns void.
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "setpoint/base/context.h"
#include "setpoint/base/metrics.h"
#include "setpoint/node/node.h"
#include "setpoint/node/node_manager.h"
#include "setpoint/pod/pod_main.h"
#include "setpoint/processor/updater_pool.h"

namespace {

void Line(const std::string& text) {
  std::string out = text + "\n";
  ssize_t n = write(STDOUT_FILENO, out.data(), out.size());
  (void)n;
}

std::function<absl::Status(std::string_view)> BoolFlag(bool* out) {
  return [out](std::string_view v) {
    if (v == "true") {
      *out = true;
    } else if (v == "false") {
      *out = false;
    } else {
      return absl::InvalidArgumentError("must be true or false");
    }
    return absl::OkStatus();
  };
}

class WaitingNode : public setpoint::Node {
 public:
  WaitingNode(std::string id, bool slow_stop)
      : id_(std::move(id)), slow_stop_(slow_stop) {}

  absl::Status Run(const setpoint::Context& ctx) override {
    (void)ctx.Wait(absl::InfiniteDuration());  // Until the pod stops.
    return absl::OkStatus();
  }

  absl::Status UpdateShardRange(const setpoint::Context&,
                                const setpoint::Assignment& a) override {
    if (!a.range.Empty()) {
      had_range_ = true;
      Line(absl::StrCat("range node=", id_, " ", a.range.ToString()));
      return absl::OkStatus();
    }
    if (slow_stop_ && had_range_) {
      Line(absl::StrCat("slow update node=", id_));
      // A node stuck in its update: the test's second signal must end the
      // process long before this returns.
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    return absl::OkStatus();
  }

 private:
  const std::string id_;
  const bool slow_stop_;
  bool had_range_ = false;  // Relay thread only.
};

}  // namespace

int main(int argc, char** argv) {
  bool slow_stop = false;
  bool fail_factory = false;
  int series = 0;
  setpoint::MetricsRegistry metrics;
  return setpoint::PodMain(
      argc, argv,
      {
          .program = "test_pod",
          .description = "A pod for the tests of PodMain.",
          .kinds = {{.kind = "work",
                     .count = 1,
                     .factory = [&](const setpoint::NodeInfo& info)
                         -> std::unique_ptr<setpoint::Node> {
                       if (fail_factory) return nullptr;
                       Line(absl::StrCat(
                           "created node=", info.id, " updaters=",
                           info.updaters == nullptr
                               ? std::string("none")
                               : absl::StrFormat("%p", info.updaters),
                           " threads=",
                           info.updaters == nullptr
                               ? 0
                               : info.updaters->threads()));
                       return std::make_unique<WaitingNode>(info.id, slow_stop);
                     }}},
          .flags = {{.name = "slow_stop",
                     .help = "block in the update of the graceful stop",
                     .set = BoolFlag(&slow_stop)},
                    {.name = "fail_factory",
                     .help = "the factory returns null",
                     .set = BoolFlag(&fail_factory)},
                    {.name = "series",
                     .help = "this many more gauges in /metrics",
                     .set =
                         [&](std::string_view v) {
                           return absl::SimpleAtoi(
                                      absl::string_view(v.data(), v.size()),
                                      &series)
                                      ? absl::OkStatus()
                                      : absl::InvalidArgumentError(
                                            "not a number");
                         }}},
          .on_started =
              [&](setpoint::NodeManager& manager) {
                for (int i = 0; i < series; ++i) {
                  metrics
                      .GetGauge("test_pod_gauge", "A gauge of the test.",
                                {{"i", absl::StrCat(i)}})
                      .Set(i);
                }
                Line("started pod=" + manager.pod_id());
              },
          .metrics = &metrics,
      });
}
