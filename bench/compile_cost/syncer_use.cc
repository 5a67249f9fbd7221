// A translation unit that uses a Syncer as a controller does: one
// Syncer<std::string, int, int> with a per-key client and one with a batch
// client, started, fed, observed, re-scoped and stopped
// (bench/compile_cost.sh compares its compile time with include_only.cc).
#include <span>
#include <string>

#include "setpoint/processor/syncer.h"

namespace {

using setpoint::Context;

class Client final : public setpoint::SyncerClient<std::string, int, int> {
 public:
  absl::Status Create(const Context&, const std::string&, const int&) override {
    return absl::OkStatus();
  }
  absl::Status Update(const Context&, const std::string&, const int&,
                      const int&) override {
    return absl::OkStatus();
  }
  absl::Status Delete(const Context&, const std::string&, const int&) override {
    return absl::OkStatus();
  }
};

class Batch final : public setpoint::BatchSyncerClient<std::string, int, int> {
 public:
  absl::Status Apply(
      const Context&,
      std::span<setpoint::SyncOperation<std::string, int, int>>) override {
    return absl::OkStatus();
  }
};

}  // namespace

int main() {
  setpoint::Runner runner;
  Client client;
  Batch batch;
  setpoint::Syncer<std::string, int, int> a(&runner, &client, {.name = "a"});
  setpoint::Syncer<std::string, int, int> b(&runner, &batch, {.name = "b"});
  for (auto* s : {&a, &b}) {
    (void)s->Start();
    s->SetDesired("k", 1);
    s->SetObserved("k", 0);
    s->Rescope(nullptr);
    (void)s->StatusSnapshot();
    s->Stop();
  }
  return 0;
}
