// A Syncer wired for deterministic tests on one thread: a manual runner
// and manual updates on a SimulatedClock, a FakeClient as the world (its
// changes observed at once through the runner), and optionally a
// FakeBatchClient in front of it. Settle() runs what can run now;
// Advance(d) moves time, stopping wherever something is due.
#ifndef SETPOINT_TESTS_PROCESSOR_SYNCER_RIG_H_
#define SETPOINT_TESTS_PROCESSOR_SYNCER_RIG_H_

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "setpoint/processor/runner.h"
#include "setpoint/processor/syncer.h"
#include "setpoint/testing/fake_batch_client.h"
#include "setpoint/testing/fake_client.h"
#include "setpoint/testing/null_logger.h"
#include "setpoint/testing/simulated_clock.h"

namespace setpoint::testing {

using IntSyncer = Syncer<std::string, int, int>;

struct SyncerRigOptions {
  IntSyncer::Options options = {};
  bool batch = false;  // The syncer calls a FakeBatchClient.
  bool single_writer = false;
  std::shared_ptr<spdlog::logger> logger = nullptr;  // Default: NullLogger.
};

class SyncerRig {
 public:
  explicit SyncerRig(SyncerRigOptions o = {})
      : runner_({.name = "rig", .clock = &clock_, .logger = NullLogger()}),
        world_({.watcher =
                    [this](const std::string& key,
                           const std::optional<int>& value) {
                      Observe(key, value);
                    },
                .clock = &clock_}),
        batch_(&world_, {.single_writer = o.single_writer, .clock = &clock_}) {
    o.options.clock = &clock_;
    o.options.manual_updates = true;
    if (o.options.seed == 0) o.options.seed = 1;
    o.options.logger = o.logger != nullptr ? o.logger : NullLogger();
    if (o.batch) {
      syncer_ =
          std::make_unique<IntSyncer>(&runner_, &batch_, std::move(o.options));
    } else {
      syncer_ = std::make_unique<IntSyncer>(
          &runner_, static_cast<IntSyncer::Client*>(&world_),
          std::move(o.options));
    }
    syncer_->MarkDesiredComplete();
  }
  ~SyncerRig() { syncer_->Stop(); }

  absl::Status Start() {
    absl::Status s = syncer_->Start();
    Settle();
    return s;
  }

  // Runs runner events and queued calls until neither has anything left at
  // the current time.
  void Settle() {
    while (true) {
      const int64_t events = runner_.RunUntilIdle();
      const int calls = syncer_->RunUntilIdle();
      if (events == 0 && calls == 0) return;
    }
  }
  // Moves the clock forward by `d`, stopping at every moment something is
  // due on the way and running it.
  void Advance(absl::Duration d) {
    const absl::Time until = clock_.Now() + d;
    Settle();
    while (true) {
      const absl::Time next = runner_.NextWakeTime();
      if (next > until) break;
      if (next <= clock_.Now()) {
        clock_.AdvanceTime(absl::Nanoseconds(1));
      } else {
        clock_.AdvanceTo(next);
      }
      Settle();
    }
    clock_.AdvanceTo(until);
    Settle();
  }
  // Advances in steps of `step` until `done()` or `limit` passed; returns
  // how long it took, or nullopt.
  template <class Fn>
  std::optional<absl::Duration> AdvanceUntil(
      Fn done, absl::Duration limit,
      absl::Duration step = absl::Milliseconds(10)) {
    const absl::Time start = clock_.Now();
    Settle();
    while (!done()) {
      if (clock_.Now() - start > limit) return std::nullopt;
      Advance(step);
    }
    return clock_.Now() - start;
  }

  void SetDesired(const std::string& key, int value) {
    syncer_->SetDesired(key, value);
  }
  SyncerStatus<std::string> Status() const { return syncer_->StatusSnapshot(); }
  bool Converged(int64_t keys) const {
    SyncerStatus<std::string> s = Status();
    return s.keys == keys && s.converged == keys && s.in_flight == 0;
  }

  SimulatedClock& clock() { return clock_; }
  Runner& runner() { return runner_; }
  FakeClient<std::string, int>& world() { return world_; }
  FakeBatchClient<std::string, int>& batch() { return batch_; }
  IntSyncer& syncer() { return *syncer_; }

 private:
  void Observe(const std::string& key, const std::optional<int>& value) {
    (void)runner_.Post([this, key, value] {
      if (value.has_value()) {
        syncer_->SetObserved(key, *value);
      } else {
        syncer_->DeleteObserved(key);
      }
    });
  }

  SimulatedClock clock_;
  Runner runner_;
  FakeClient<std::string, int> world_;
  FakeBatchClient<std::string, int> batch_;
  std::unique_ptr<IntSyncer> syncer_;
};

}  // namespace setpoint::testing

#endif  // SETPOINT_TESTS_PROCESSOR_SYNCER_RIG_H_
